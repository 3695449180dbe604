#!/usr/bin/env bash
# Issue 31, odd leading dimensions read at full width in place: mma_gemm.sasm's REALIGN = 1 (an
# ALIGN = 2 operand read in aligned 16-byte granules and realigned in registers) against REALIGN = 0
# (2-byte loads staged through registers), on the H100 in one device command, in this order (each
# part under its own timeout; PARTS=tests alone takes up to ~9.5 minutes, the others ~5):
#   1. tests: the realigned path's GPU tests first (odd rows in every layout, fp16/bf16, fp32 C,
#      REALIGN 0 and 1 bit for bit; the other odd-leading-dimension and copy-width tests), then
#      the whole of tests/test_mma_gemm_gpu.py (-n 8, ALL_TESTS_SECONDS, default 420: run PARTS=tests
#      alone in a device command);
#   2. bench: tools/variant_ab.py hgemm_mma --from-dispatch (the configuration gemm's dispatch runs
#      for the plain kernel) with r1: REALIGN=1, r2: REALIGN=2 (the granules through a cp.async
#      ring) and r0: REALIGN=0 laid over it, interleaved in one
#      process with cuBLAS, on issue 31's odd shapes; then the default path (asmgemm bench hgemm:
#      whatever gemm picks by dtype) at 4095^3 beside 4096^3 (issue 31: >= 0.95x);
#   3. sanitize: compute-sanitizer memcheck, one process a case (tools/mma_memcheck_ends.py), each
#      operand at the end of its own cudaMalloc (CuPy's pool off, so memcheck knows each
#      allocation's exact end): three odd shapes with REALIGN = 1 and 2, and the cp.async paths
#      (16-, 8-, 4-byte copies) with the stored matrices' last rows ending inside a chunk.
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
    # (the whole file: ~305 tests whose builds dominate; -n 8 ran 60% of it in 240 s on a cold H200)
    timeout "${ALL_TESTS_SECONDS:-420}" python3 -m pytest -q -n 8 -m gpu tests/test_mma_gemm_gpu.py -p no:cacheprovider \
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
    # one process a case (tools/mma_memcheck_ends.py: after a first invalid access the context is
    # gone and later calls in the process fail for that reason alone)
    : > "$OUT/memcheck.txt"
    cases=()
    for r in 1 2; do for c in 127x129x65:tt 1000x1000x999:nn 75x1147x1025:tn; do cases+=("odd $c $r"); done; done
    for c in 70x66x65:nn:16:8 70x66x65:tt:4:16 70x66x41:nt:8:4 70x66x9:tn:4:8; do cases+=("cut $c"); done
    for c in "${cases[@]}"; do
        out=$(timeout 60 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
              python3 tools/mma_memcheck_ends.py $c 2>&1)
        rc=$?
        echo "$out" >> "$OUT/memcheck.txt"
        echo "== memcheck $c: exit $rc $(echo "$out" | grep -E '^ran|ERROR SUMMARY' | tr '\n' ' ')"
        (( rc )) && status=1
    done
fi
exit $status
