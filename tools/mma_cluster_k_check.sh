#!/usr/bin/env bash
# Issue 32's device check of split-K in clusters for the portable kernel (mma_gemm.sasm's CLUSTER_K:
# the S blocks of a tile one cluster, their sums added over distributed shared memory, one launch),
# from the repository root on the GPU machine (sm_90; ~6 min on the H100; results under $OUT):
#   1. tests: tests/test_mma_cluster_k_gpu.py (C bit for bit the reduce kernel's at the same S, and
#      close to float64: fp16/bf16/fp32 C, four layouts, odd and aligned leading dimensions), then
#      the split tests whose params= rules moved (test_mma_gemm_gpu.py -k split, test_splitk_fixup_gpu.py);
#   2. bench: tools/variant_ab.py hgemm_mma --from-dispatch (d: the dispatch's own pick) on the small
#      deep-K fp16 shapes with odd leading dimensions (contiguous rows of odd length), on 64 x 64 tiles:
#      u unsplit, kS the partial pass + reduce kernel, cS clusters of S, S = 2, 4, 8 (CUDA events,
#      GPU time with the host hidden), then the same calls timed back to back on the host
#      (us a call, what a loop of small calls pays: the reduce kernel's second launch);
#   3. sanitize: compute-sanitizer memcheck and racecheck (shared memory, the cluster's included)
#      on two cluster calls.
# Each step prints "== NAME: exit N" and a few lines of its log; the last line sums them up.
#   PARTS: which of "tests bench sanitize" to run (default all); REPS: variant_ab repetitions (15).
set -u
: "${PARTS:=tests bench sanitize}" "${REPS:=15}"
source tools/device_setup.sh >/dev/null || exit 1
export ASMGEMM_NO_TUNE_CACHE=1
LOGS=${OUT:-/tmp/mma_cluster_k_check}
mkdir -p "$LOGS"
failed=""
step() {   # name, command...
    local name=$1; shift
    "$@" > "$LOGS/$name.txt" 2>&1
    local rc=$?
    echo "== $name: exit $rc"
    grep -E 'passed|failed|error|Error| us|TFLOP|x[0-9]|SANITIZE_RESULTS|ERROR SUMMARY|WRONG' "$LOGS/$name.txt" | tail -n 40
    [[ $rc == 0 ]] || failed="$failed $name"
}
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 14 --dist load"
if [[ " $PARTS " == *" tests "* ]]; then
    step cluster_tests timeout 300 python3 -m pytest -q -m gpu $XDIST -o addopts="" -p no:cacheprovider \
        tests/test_mma_cluster_k_gpu.py
    step split_tests timeout 240 python3 -m pytest -q -m gpu $XDIST -o addopts="" -p no:cacheprovider \
        tests/test_splitk_fixup_gpu.py tests/test_mma_gemm_gpu.py -k "split or one_launch or counters or streams or graph"
fi
SHAPES=(40,469,825 197,38,1310 6,152,2910 67,5,941 127,129,1000)
T64="BM=64,BN=64,WM=32,WN=32"
if [[ " $PARTS " == *" bench "* ]]; then
    args=()
    for s in "${SHAPES[@]}"; do args+=(--shape "$s"); done
    step ab timeout 300 python3 tools/variant_ab.py hgemm_mma --from-dispatch --layout nn "${args[@]}" \
        --variant d: --variant "u:$T64,SPLIT_K=1,CLUSTER_K=1" \
        --variant "k2:$T64,SPLIT_K=2,CLUSTER_K=1,SPLIT_FIXUP=0" --variant "c2:$T64,SPLIT_K=2,CLUSTER_K=2" \
        --variant "k4:$T64,SPLIT_K=4,CLUSTER_K=1,SPLIT_FIXUP=0" --variant "c4:$T64,SPLIT_K=4,CLUSTER_K=4" \
        --variant "k8:$T64,SPLIT_K=8,CLUSTER_K=1,SPLIT_FIXUP=0" --variant "c8:$T64,SPLIT_K=8,CLUSTER_K=8" \
        --reps "$REPS" --no-torch --json "$LOGS/ab.json"
    step host timeout 150 python3 - "${SHAPES[@]}" <<'EOF'
# Each mode's calls back to back (no sync between them), as a loop of small GEMMs runs: the host's
# work and the launches a call makes are its cost there. Median of 7 runs of 200 calls, us a call.
import sys
import time

import cupy as cp

from asmgemm.runtime.gemm import gemm, last_launch

T64 = {"BM": 64, "BN": 64, "WM": 32, "WN": 32}
MODES = {"u": {**T64, "SPLIT_K": 1, "CLUSTER_K": 1}}
for s in (2, 4, 8):
    MODES[f"k{s}"] = {**T64, "SPLIT_K": s, "CLUSTER_K": 1, "SPLIT_FIXUP": 0}
    MODES[f"c{s}"] = {**T64, "SPLIT_K": s, "CLUSTER_K": s}
for shape in sys.argv[1:]:
    m, n, k = map(int, shape.split(","))
    a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(cp.float16)
    b = cp.random.standard_normal((k, n), dtype=cp.float32).astype(cp.float16)
    c = cp.empty((m, n), cp.float16)
    out = []
    gemm(a, b, c, kernel="hgemm_mma")
    d = last_launch()
    modes = {"d": d["rerun_params"], **MODES}
    for name, params in modes.items():
        for _ in range(20):
            gemm(a, b, c, kernel="hgemm_mma", params=params)
        ran = last_launch()
        cp.cuda.Device().synchronize()
        runs = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(200):
                gemm(a, b, c, kernel="hgemm_mma", params=params)
            cp.cuda.Device().synchronize()
            runs.append((time.perf_counter() - t) / 200 * 1e6)
        runs.sort()
        out.append(f"{name} {runs[3]:.1f} us ({ran['reduce'] or '-'} S={ran['splits']})")
    print(f"{m}x{n}x{k} fp16 nn (pick {d['config']}): " + "; ".join(out))
EOF
fi
if [[ " $PARTS " == *" sanitize "* ]]; then
    cat > "$LOGS/sanitize.py" <<'EOF'
# Two cluster calls (odd leading dimensions, beta != 0) checked against the reduce kernel's bits.
import cupy as cp
import numpy as np

from asmgemm.runtime.gemm import gemm, last_launch

cp.cuda.set_allocator(None)          # one cudaMalloc an array: memcheck sees each one's exact size
ok = True
rng = np.random.default_rng(0)
for (m, n, k, s, dtype, tiling) in ((40, 469, 825, 4, "hgemm_mma", {"BM": 64, "BN": 64, "WM": 32, "WN": 32}),
                                    (67, 5, 941, 8, "bgemm_mma", {"WN": 32})):
    a = cp.asarray(rng.uniform(-1, 1, (m, k)).astype(np.float16))
    b = cp.asarray(rng.uniform(-1, 1, (k, n)).astype(np.float16))
    if dtype == "bgemm_mma":
        a, b = (cp.asarray((cp.asnumpy(x).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)) for x in (a, b))
    c0 = cp.asarray(rng.uniform(-1, 1, (m, n)).astype(np.float16 if dtype == "hgemm_mma" else np.float32))
    if dtype == "bgemm_mma":
        c0 = cp.asarray((cp.asnumpy(c0).view(np.uint32) >> 16).astype(np.uint16))
    outs = {}
    for mode, cluster in (("kernel", 1), ("cluster", s)):
        c = c0.copy()
        gemm(a, b, c, alpha=0.75, beta=-0.5, kernel=dtype, params={**tiling, "SPLIT_K": s, "CLUSTER_K": cluster})
        outs[mode] = (c, last_launch()["reduce"])
    same = bool((outs["kernel"][0].view(cp.uint16) == outs["cluster"][0].view(cp.uint16)).all())
    print(f"cluster {m}x{n}x{k} {dtype} S={s}: {outs['cluster'][1]}, bits {'equal' if same else 'DIFFER (WRONG)'}")
    ok &= same and outs["cluster"][1] == "cluster"
cp.cuda.runtime.deviceSynchronize()
print("SANITIZE_RESULTS", "OK" if ok else "WRONG")
raise SystemExit(0 if ok else 1)
EOF
    step memcheck timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
        python3 "$LOGS/sanitize.py"
    step racecheck timeout 200 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 3 \
        python3 "$LOGS/sanitize.py"
fi
echo "mma_cluster_k_check: ${failed:+FAILED:}${failed:-all passed}"
[[ -z $failed ]]
