#!/usr/bin/env bash
# Issue 33, hgemm's grouped mode (GROUPED=1: asmgemm.grouped_gemm on wgmma, A a 2-D map over all
# tokens, B a 3-D map with the expert outermost, the persistent walk counted from offs on the device)
# on the H100 in one device command, in this order (each part under its own timeout, 470 s in all; about 3 minutes run):
#   0. the moe preset's builds, by ptxas in parallel (a cold machine builds them one at a time);
#   1. the grouped GPU tests: tests/test_hgemm_grouped_gpu.py (hgemm/bgemm GROUPED=1 against
#      torch.matmul per expert in float64; last_launch() names the kernel) and tests/test_grouped_gpu.py;
#   2. issue 33's moe preset against torch._grouped_mm (tools/batched_bench.py; each row names the
#      kernel that ran it; goal: >= 1.0x by call time);
#   3. diag: one expert holding 32768 tokens (grouped, E = 1) against the same GEMM as a 2-D hgemm
#      call and torch.matmul, TFLOP/s (where the large moe rows lose: the grouped machinery or the
#      kernel at that shape);
#   4. compute-sanitizer memcheck on tools/batched_sanitize.py (its grouped cases include a
#      TMA-legal ragged call with an empty expert, which must run on hgemm's grouped mode).
# Results under $OUT: tests.txt, moe.txt, moe.json, diag.txt, memcheck.txt.
#   PARTS: which of "tests bench diag sanitize" to run (default all); BENCH_ARGS: more batched_bench.py
#   arguments (default "--reps 10 --loop-calls 20": the E = 64, K x N = 4096 x 14336 cases read
#   7.5 GB of weights a call).
set -u
: "${OUT:?set OUT}" "${PARTS:=tests bench diag sanitize}" "${BENCH_ARGS:=--reps 10 --loop-calls 20}"
source tools/device_setup.sh >/dev/null || exit 1
export ASMGEMM_NO_TUNE_CACHE=1
status=0
# the builds the moe preset's calls configure (grouped_config on Matrix descriptions: no GPU work),
# by ptxas in parallel into the disk cache
timeout 40 python3 - <<'PY'
import multiprocessing, time
def build(case):
    from asmgemm.runtime import grouped
    from asmgemm.runtime.arrays import Dtype, Matrix
    from asmgemm.runtime.gpu import device_facts
    from asmgemm.runtime.launch_config import pick_spec
    e, k, n, total = case
    t = Dtype("bfloat16", 2)
    facts = device_facts()
    a = Matrix((total, k), (k * 2, 2), t, 1 << 20, 0)
    b = Matrix((e, k, n), (k * n * 2, 2, k * 2), t, 1 << 40, 0)           # (E, N, K) weights viewed as (E, K, N)
    c = Matrix((total, n), (n * 2, 2), t, 1 << 44, 0)
    spec = grouped.grouped_kernel(pick_spec(None, "bfloat16", None, facts), facts, 0, a, b)
    grouped.grouped_config(spec, grouped.grouped_plan(a, b, c, e, 0), facts, None)
if __name__ == "__main__":
    from asmgemm.bench.batched import moe_cases
    start = time.time()
    cases = sorted({(c.experts, c.k, c.n, c.total) for c in moe_cases()})
    with multiprocessing.get_context("fork").Pool(12) as pool:
        pool.map(build, cases)
    print(f"== warm: {len(cases)} moe cases configured (their builds made) in {time.time() - start:.0f} s")
PY
if [[ " $PARTS " == *" tests "* ]]; then
    timeout 100 python3 -m pytest -q -m gpu tests/test_hgemm_grouped_gpu.py tests/test_grouped_gpu.py \
        -p no:cacheprovider > "$OUT/tests.txt" 2>&1
    rc=$?; echo "== gpu tests: exit $rc"; tail -n 15 "$OUT/tests.txt"; (( rc )) && status=1
fi
if [[ " $PARTS " == *" bench "* ]]; then
    timeout 160 python3 tools/batched_bench.py --shapes moe --json "$OUT/moe.json" $BENCH_ARGS \
        > "$OUT/moe.txt" 2>&1
    rc=$?; echo "== moe preset: exit $rc"; grep -E '^(moe anchor|call|gpu|loop):|GROUPED|err' "$OUT/moe.txt" | head -30
    grep -E 'Error|error' "$OUT/moe.txt" | head -5; (( rc )) && status=1
fi
if [[ " $PARTS " == *" diag "* ]]; then
    # where the large moe rows' time goes: one expert holding all 32768 tokens (grouped, E = 1)
    # against the same GEMM as a 2-D call of hgemm (its clusters and size rule) and torch.matmul
    timeout 90 python3 - > "$OUT/diag.txt" 2>&1 <<'PY'
import torch
import asmgemm
from asmgemm.runtime.gemm import last_launch
def rate(fn, flops, reps=5):
    fn(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record(); torch.cuda.synchronize()
    return flops * reps / (start.elapsed_time(end) * 1e-3) / 1e12
keep = ("BN", "CONSUMERS", "STAGES", "GROUP_M", "CLUSTER_M", "WIDE_C", "GROUPED")
for k, n in ((14336, 4096), (4096, 14336), (7168, 2048)):
    t = 32768
    a = torch.randn(t, k, device="cuda").to(torch.bfloat16)
    w = torch.randn(1, n, k, device="cuda").to(torch.bfloat16)
    offs = torch.tensor([t], device="cuda", dtype=torch.int32)
    flops = 2 * t * k * n
    for name, fn in (("grouped E=1", lambda: asmgemm.grouped_gemm(a, w.transpose(1, 2), offs)),
                     ("gemm 2-D", lambda: asmgemm.gemm(a, w[0].t())),
                     ("torch.matmul", lambda: torch.matmul(a, w[0].t()))):
        r = rate(fn, flops)
        ran = last_launch() if name != "torch.matmul" else {"kernel": "torch", "params": {}}
        print(f"{t}x{n}x{k} {name:13s} {r:6.0f} TFLOP/s  {ran['kernel']} "
              + " ".join(f"{x}={ran['params'].get(x)}" for x in keep if x in ran["params"]))
    del a, w
PY
    echo "== diag: exit $?"; cat "$OUT/diag.txt"
fi
if [[ " $PARTS " == *" sanitize "* ]]; then
    timeout 80 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 python3 tools/batched_sanitize.py \
        > "$OUT/memcheck.txt" 2>&1
    rc=$?; echo "== memcheck: exit $rc $(grep -E 'ERROR SUMMARY|SANITIZE_RESULTS' "$OUT/memcheck.txt" | tr '\n' ' ')"
    grep -E '^(batched|grouped)' "$OUT/memcheck.txt"; (( rc )) && status=1
fi
exit $status
