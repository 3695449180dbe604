#!/usr/bin/env bash
# Issue 31, odd leading dimensions read at full width in place: mma_gemm.sasm's REALIGN = 1 (an
# ALIGN = 2 operand read in aligned 16-byte granules and realigned in registers) against REALIGN = 0
# (2-byte loads staged through registers), on the H100 in one device command, in this order (each
# part under its own timeout, ~7.5 minutes in all):
#   1. tests: the realigned path's GPU tests first (odd rows in every layout, fp16/bf16, fp32 C,
#      REALIGN 0 and 1 bit for bit; the other odd-leading-dimension and copy-width tests), then
#      the whole of tests/test_mma_gemm_gpu.py (-x; what a cold machine builds in its time);
#   2. bench: tools/variant_ab.py hgemm_mma --from-dispatch (the configuration gemm's dispatch runs
#      for the plain kernel) with r1: REALIGN=1, r2: REALIGN=2 (the granules through a cp.async
#      ring) and r0: REALIGN=0 laid over it, interleaved in one
#      process with cuBLAS, on issue 31's odd shapes; then the default path (asmgemm bench hgemm:
#      whatever gemm picks by dtype) at 4095^3 beside 4096^3 (issue 31: >= 0.95x);
#   3. sanitize: compute-sanitizer memcheck on three odd shapes with REALIGN = 1 and 2, each operand at the
#      end of its own cudaMalloc (CuPy's pool off, so memcheck knows each allocation's exact end)
#      and one starting an element into it.
#   deep (not in the default PARTS): REALIGN = 1's loads have one K tile of MMAs to land in (they
#      are registers, not the cp.async ring's STAGES - 1 tiles): r1 against r1 with BK=64 (twice
#      the cover), r2 (the ring) and r2 on the four-warp 128 x 128 tiling (which REALIGN = 1 cannot
#      build) on 4095^3, 2048x2047x2049, 75x1147x1025 tn, 75x2936x1920 tt.
# Results under $OUT: tests.txt, tests_all.txt, ab_*.txt/json, default.txt/json, memcheck.txt, deep_*.
#   PARTS: which of "tests bench sanitize deep" to run (default the first three); REPS: variant_ab
#   repetitions (15).
set -u
: "${OUT:?set OUT}" "${PARTS:=tests bench sanitize}" "${REPS:=15}"
source tools/device_setup.sh >/dev/null || exit 1
export ASMGEMM_NO_TUNE_CACHE=1
status=0
if [[ " $PARTS " == *" tests "* ]]; then
    timeout 150 python3 -m pytest -q -m gpu tests/test_mma_gemm_gpu.py -x -p no:cacheprovider \
        -k 'realigned or odd_leading or each_copy_width or in_place_on_hopper' > "$OUT/tests.txt" 2>&1
    rc=$?; echo "== realign gpu tests: exit $rc"; tail -n 8 "$OUT/tests.txt"; (( rc )) && status=1
    timeout 150 python3 -m pytest -q -m gpu tests/test_mma_gemm_gpu.py -x -p no:cacheprovider \
        > "$OUT/tests_all.txt" 2>&1
    rc=$?; echo "== all of test_mma_gemm_gpu.py: exit $rc (124: out of time, see the count)"
    tail -n 4 "$OUT/tests_all.txt"; (( rc && rc != 124 )) && status=1
fi
if [[ " $PARTS " == *" bench "* ]]; then
    # (layout: shapes) as issue 31 names them; each operand's alignment is its contiguous rows'
    run_ab() {
        local layout=$1; shift
        local shapes=()
        for s in "$@"; do shapes+=(--shape "$s"); done
        timeout 100 python3 tools/variant_ab.py hgemm_mma --from-dispatch --layout "$layout" "${shapes[@]}" \
            --variant r1:REALIGN=1 --variant r2:REALIGN=2 --variant r0:REALIGN=0 --reps "$REPS" \
            --json "$OUT/ab_$layout.json" \
            > "$OUT/ab_$layout.txt" 2>&1
        local rc=$?; echo "== variant_ab $layout: exit $rc"; cat "$OUT/ab_$layout.txt"; (( rc )) && status=1
    }
    run_ab nn 4095,4095,4095 3827,16146,61 1000,1000,999 2048,2047,2049
    run_ab tn 75,1147,1025
    run_ab tt 7025,5,1654 75,2936,1920
    timeout 90 python3 -m asmgemm.cli bench hgemm --shapes 4095x4095x4095,4096x4096x4096 --reps 10 \
        --json "$OUT/default.json" > "$OUT/default.txt" 2>&1
    rc=$?; echo "== default path 4095^3 and 4096^3: exit $rc"; cat "$OUT/default.txt"
    timeout 30 python3 - >> "$OUT/default.txt" 2>&1 <<'EOF'
import cupy as cp
from asmgemm.runtime.gemm import gemm, last_launch
for n in (4095, 4096):
    a = cp.ones((n, n), cp.float16)
    gemm(a, a)
    ran = last_launch()
    print(f"{n}^3: {ran['kernel']} copies {ran['copies']} config {ran['config']} params {ran['params']}")
EOF
    tail -n 2 "$OUT/default.txt"
fi
if [[ " $PARTS " == *" deep "* ]]; then
    for spec in "nn 4095,4095,4095 2048,2047,2049" "tn 75,1147,1025" "tt 75,2936,1920"; do
        set -- $spec
        layout=$1; shift
        shapes=()
        for s in "$@"; do shapes+=(--shape "$s"); done
        timeout 120 python3 tools/variant_ab.py hgemm_mma --from-dispatch --layout "$layout" "${shapes[@]}" \
            --variant r1:REALIGN=1 --variant r1bk64:REALIGN=1,BK=64 --variant r2:REALIGN=2 \
            --variant r2wide:REALIGN=2,BM=128,BN=128,WM=64,WN=64 --reps "$REPS" \
            --json "$OUT/deep_$layout.json" > "$OUT/deep_$layout.txt" 2>&1
        rc=$?; echo "== deep $layout: exit $rc"; cat "$OUT/deep_$layout.txt"; (( rc )) && status=1
    done
fi
if [[ " $PARTS " == *" sanitize "* ]]; then
    timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 python3 - \
        > "$OUT/memcheck.txt" 2>&1 <<'EOF'
import cupy as cp
import numpy as np
from asmgemm.runtime.gemm import gemm, last_launch

cp.cuda.set_allocator(None)          # one cudaMalloc an array: memcheck sees each one's exact size

def at_end(rows, cols, ld, lead, rng):
    """A rows x cols fp16 matrix (leading dimension ld) ending at the last byte of its allocation."""
    store = cp.asarray(rng.uniform(-1, 1, lead + (rows - 1) * ld + cols).astype(np.float16))
    return cp.ndarray((rows, cols), cp.float16, store.data + 2 * lead, strides=(2 * ld, 2)), store

ok = True
rng = np.random.default_rng(0)
for (m, n, k, layout, lead) in ((127, 129, 65, "tt", 0), (1000, 1000, 999, "nn", 1), (75, 1147, 1025, "tn", 3)):
    ta, tb = layout[0] == "t", layout[1] == "t"
    ar, ac = (k, m) if ta else (m, k)
    br, bc = (n, k) if tb else (k, n)
    a, sa = at_end(ar, ac, ac + (2 if ac % 2 else 1), lead, rng)
    b, sb = at_end(br, bc, bc + (2 if bc % 2 else 3), 0, rng)
    c = gemm(a.T if ta else a, b.T if tb else b, kernel="hgemm_mma")
    ran = last_launch()
    ref = (a.T if ta else a).astype(cp.float64) @ (b.T if tb else b).astype(cp.float64)
    err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    realigned = ran["params"].get("ALIGN_A") == "2" and ran["params"].get("REALIGN", "1") == "1"
    print(f"realign {m}x{n}x{k} {layout} lead {lead}: {ran['kernel']} {ran['params']} rel err {err:.2e}"
          + ("" if realigned else " (WRONG: not the realigned path)"))
    ok &= err < 2e-3 and realigned
    # the same through the cp.async ring (REALIGN = 2)
    c2 = gemm(a.T if ta else a, b.T if tb else b, kernel="hgemm_mma", params={**ran["rerun_params"], "REALIGN": 2})
    err2 = float(cp.linalg.norm(c2.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    ring = last_launch()["params"].get("REALIGN") == "2"
    print(f"realign {m}x{n}x{k} {layout} lead {lead} REALIGN=2: rel err {err2:.2e}" + ("" if ring else " (WRONG)"))
    ok &= err2 < 2e-3 and ring
cp.cuda.runtime.deviceSynchronize()
print("SANITIZE_RESULTS", "OK" if ok else "WRONG")
raise SystemExit(0 if ok else 1)
EOF
    rc=$?; echo "== memcheck: exit $rc $(grep -E 'ERROR SUMMARY|SANITIZE_RESULTS' "$OUT/memcheck.txt" | tr '\n' ' ')"
    grep -E '^realign' "$OUT/memcheck.txt"; (( rc )) && status=1
fi
exit $status
