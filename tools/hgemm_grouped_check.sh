#!/usr/bin/env bash
# Issue 33, hgemm's grouped mode (GROUPED=1: asmgemm.grouped_gemm on wgmma, A a 2-D map over all
# tokens, B a 3-D map with the expert outermost, the persistent walk counted from offs on the device)
# on the H100 in one device command, in this order (each part under its own timeout, 470 s in all):
#   0. the moe preset's builds, by ptxas in parallel (a cold machine builds them one at a time);
#   1. the grouped GPU tests: tests/test_hgemm_grouped_gpu.py (hgemm/bgemm GROUPED=1 against
#      torch.matmul per expert in float64; last_launch() names the kernel) and tests/test_grouped_gpu.py;
#   2. issue 33's moe preset against torch._grouped_mm (tools/batched_bench.py; each row names the
#      kernel that ran it; goal: >= 1.0x by call time);
#   3. compute-sanitizer memcheck on tools/batched_sanitize.py (its grouped cases include a
#      TMA-legal ragged call with an empty expert, which must run on hgemm's grouped mode).
# Results under $OUT: tests.txt, moe.txt, moe.json, memcheck.txt.
#   PARTS: which of "tests bench sanitize" to run (default all); BENCH_ARGS: more batched_bench.py
#   arguments (default "--reps 10 --loop-calls 20": the E = 64, K x N = 4096 x 14336 cases read
#   7.5 GB of weights a call).
set -u
: "${OUT:?set OUT}" "${PARTS:=tests bench sanitize}" "${BENCH_ARGS:=--reps 10 --loop-calls 20}"
source tools/device_setup.sh >/dev/null || exit 1
export ASMGEMM_NO_TUNE_CACHE=1
status=0
# the builds the moe preset's calls configure (grouped_config on Matrix descriptions: no GPU work),
# by ptxas in parallel into the disk cache
timeout 80 python3 - <<'PY'
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
    timeout 130 python3 -m pytest -q -m gpu tests/test_hgemm_grouped_gpu.py tests/test_grouped_gpu.py \
        -p no:cacheprovider > "$OUT/tests.txt" 2>&1
    rc=$?; echo "== gpu tests: exit $rc"; tail -n 15 "$OUT/tests.txt"; (( rc )) && status=1
fi
if [[ " $PARTS " == *" bench "* ]]; then
    timeout 180 python3 tools/batched_bench.py --shapes moe --json "$OUT/moe.json" $BENCH_ARGS \
        > "$OUT/moe.txt" 2>&1
    rc=$?; echo "== moe preset: exit $rc"; grep -E '^(moe anchor|call|gpu|loop):|GROUPED|err' "$OUT/moe.txt" | head -30
    grep -E 'Error|error' "$OUT/moe.txt" | head -5; (( rc )) && status=1
fi
if [[ " $PARTS " == *" sanitize "* ]]; then
    timeout 80 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 python3 tools/batched_sanitize.py \
        > "$OUT/memcheck.txt" 2>&1
    rc=$?; echo "== memcheck: exit $rc $(grep -E 'ERROR SUMMARY|SANITIZE_RESULTS' "$OUT/memcheck.txt" | tr '\n' ' ')"
    grep -E '^(batched|grouped)' "$OUT/memcheck.txt"; (( rc )) && status=1
fi
exit $status
