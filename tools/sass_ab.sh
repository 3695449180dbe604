#!/usr/bin/env bash
# Issue 35's GPU A/B in one device command: ptxas's control codes against the project's passes,
# interleaved in one process per kernel (tools/variant_ab.py; each variant is a copy of the kernel's
# table with a sass_patch), then the patched kernels' correctness on odd shapes in every layout, and
# compute-sanitizer memcheck on them. Results under $OUT (packed into $OUT/all.tgz).
#   VARIANTS_SGEMM / VARIANTS_HGEMM / VARIANTS_MMA: the --variant lists (defaults below)
#   SHAPES_BIG: the timed shapes; REPS: timed repetitions; PARTS: which of "big odd sanitize ncu" to run
#   NCU_PATCHES: the sgemm variants profiled by the ncu part ("-" is ptxas's code), NCU_SHAPE its shape
set -u
: "${OUT:?set OUT}" "${REPS:=15}" "${PARTS:=big odd sanitize}" "${SHAPES_BIG:=--shape 4096,4096,4096 --shape 8192,8192,8192}"
source tools/device_setup.sh >/dev/null || exit 1
export ASMGEMM_NO_TUNE_CACHE=1
: "${VARIANTS_SGEMM:=ptxas: reuse:@reuse stall:@stall y2:@yield_every=2 y4:@yield_every=4 y8:@yield_every=8 stall_y8:@stall,yield_every=8 ptxas2:}"
: "${VARIANTS_HGEMM:=ptxas: reuse:@reuse stall:@stall reuse_stall:@reuse,stall ptxas2:}"
: "${VARIANTS_MMA:=ptxas: reuse:@reuse stall:@stall y2:@yield_every=2 y4:@yield_every=4 y8:@yield_every=8 ptxas2:}"
ab() {   # kernel name, variants, extra args...
    local kernel=$1 variants=$2; shift 2
    local args=(); for v in $variants; do args+=(--variant "$v"); done
    timeout 500 python3 tools/variant_ab.py "$kernel" "${args[@]}" "$@" > "$OUT/ab_${kernel}_$TAG.txt" 2>&1
    echo "== $kernel $TAG: exit $?"; grep -E '^[0-9]+x|refused|WRONG|error' "$OUT/ab_${kernel}_$TAG.txt" | head -20
}
if [[ " $PARTS " == *" big "* ]]; then
TAG=big ab sgemm "$VARIANTS_SGEMM" --from-dispatch $SHAPES_BIG --reps "$REPS" --json "$OUT/ab_sgemm_big.json"
TAG=big ab hgemm "$VARIANTS_HGEMM" --from-dispatch $SHAPES_BIG --reps "$REPS" --no-torch --json "$OUT/ab_hgemm_big.json"
TAG=big ab hgemm_mma "$VARIANTS_MMA" --from-dispatch $SHAPES_BIG --reps "$REPS" --no-torch --json "$OUT/ab_hgemm_mma_big.json"
fi
# correctness of every variant on odd shapes, all four layouts (few reps: the check is the point)
[[ " $PARTS " == *" odd "* ]] && for layout in nn nt tn tt; do
    for k in sgemm hgemm hgemm_mma; do
        v=VARIANTS_${k^^}; [[ $k == hgemm_mma ]] && v=VARIANTS_MMA
        TAG=odd_$layout ab "$k" "${!v}" --from-dispatch --layout "$layout" --shape 127,129,65 \
            --shape 7,13,5 --reps 2 --no-torch
    done
done
# compute-sanitizer memcheck on the patched kernels (odd shape, every layout, a strided view)
[[ " $PARTS " == *" sanitize "* ]] && for item in "sgemm stall,yield_every=8" "sgemm reuse,stall" "hgemm_mma stall,yield_every=4" "hgemm reuse,stall"; do
    set -- $item
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 python3 tools/sgemm_sanitize.py "$1" \
        --sass-patch "$2" --params null > "$OUT/sanitize_$1_$2.txt" 2>&1
    echo "== memcheck $1 @$2: exit $? $(grep -E 'ERROR SUMMARY|SANITIZE_RESULTS' "$OUT/sanitize_$1_$2.txt" | tr '\n' ' ')"
done
# Nsight Compute's stall reasons of sgemm's dispatch configuration, ptxas's codes against each patch:
# 3 rounds of (asmgemm, cuBLAS) launches, the asmgemm kernel of round 3 profiled
[[ " $PARTS " == *" ncu "* ]] && for patch in ${NCU_PATCHES:-- stall yield_every=8}; do
    args=(); [[ $patch != - ]] && args=(--sass-patch "$patch")
    # shellcheck disable=SC2086  # NCU_SHAPE is three words on purpose
    timeout 300 ncu --clock-control none -k regex:'^sgemm' --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
        --section InstructionStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
        python3 tools/sgemm_profile.py ${NCU_SHAPE:-4096 4096 4096} "${args[@]}" > "$OUT/ncu_sgemm_${patch//=/_}.txt" 2>&1
    echo "== ncu sgemm @$patch: exit $?"; python3 tools/ncu_summary.py "$OUT/ncu_sgemm_${patch//=/_}.txt" --top 10
done
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz"
