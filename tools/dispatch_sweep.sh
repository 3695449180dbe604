#!/usr/bin/env bash
# The sweeps the shipped dispatch database was fitted on (run on the GPU machine from the repository
# root, e.g. through the device tool: `bash tools/dispatch_sweep.sh FAMILY`; samples land in
# $OUT). Sets, each its own samples file, which `tune --sweep` checkpoints as it times the calls: a set
# that runs out of time keeps the calls it finished (calls_timed < calls in the file):
#   presets   bench's square, odd and transformer presets, nn, every candidate timed (their exact
#             hits keep the tuned shapes where the measured best is);
#   linear    nn.Linear layers of a Llama block (QKV 4096->6144, O 4096->4096, gate+up 4096->28672,
#             down 14336->4096) at T = 1, 8, 64, 256, 1024, 4096 tokens, B transposed (nt), every
#             candidate timed;
#   train     training shapes: per layout, TRAIN_COUNT shapes with M, N, K log-uniform in [1, 16384]
#             and 2^18 <= M N K <= 2^36, the first half unrounded (the TMA family: rounded up to 8),
#             the second rounded up to 16
#             (seed TRAIN_SEED; never the seeds the random benchmark is judged on), each
#             configuration unsplit plus its best splits by the prior model;
#   large_odd large shapes with odd leading dimensions: per layout, LARGE_COUNT shapes with M, N, K
#             log-uniform in [256, 16384], 2^33 <= M N K <= 2^38 and none rounded (most operands
#             then load 2 bytes at a time), seed LARGE_SEED, as train; the train set has almost
#             none of them, and the in-place kernel's time there is what decides copy or in place.
#   rows      sgemm's skinny class with many tile rows: per layout, ROWS_COUNT calls with M in
#             [17, 128] (2-16 tile rows of the skinny blocks), N in [2048, 16384], K in [512, 8192],
#             log-uniform, seed ROWS_SEED, every candidate timed: the blocks of one call contend for
#             L2 there, the regime the cost model's load floor (cost_model.py) is fitted on and the
#             train set almost never draws (docs/log/dispatch.md, "The load floor").
#   wide_b    a few tile rows over a large B (the TMA family's 16-bit calls): per layout, WIDE_COUNT
#             calls with M in [129, 512] (2-4 tile rows of 128), N in [4096, 16384], K in [2048, 16384],
#             log-uniform, seed WIDE_SEED: there unclustered tile rows read B from DRAM again (ncu: up
#             to 2.5x its bytes) and the C^T entries read it once, a regime the train set seldom
#             draws (docs/log/dispatch.md, "A few tile rows over a large B").
#   clusters  calls where the catalog's cluster splits of every size 2-8 are candidates (K picked so
#             split_for lands on 5 and 7 too; skinny M for sgemm_skinny), nn and tn, every candidate
#             timed: the driver's clusters at once for each size (cost_model.cluster_slots; sizes
#             3, 5, 6 and 7 pack the GPCs differently from 2, 4 and 8) and their times.
# The drawn sets' shapes come from tools/sweep_shapes.py (the same seed, the same shapes).
# Fit afterwards, on any machine: asmgemm tune FAMILY --fit $OUT/sweep_*.json --out DB.json
set -u
family=${1:-sgemm}
: "${OUT:?set OUT}" "${TRAIN_SEED:=9001}" "${TRAIN_COUNT:=10}" "${SETS:=presets linear train}"
: "${LARGE_SEED:=9003}" "${LARGE_COUNT:=8}" "${ROWS_SEED:=9005}" "${ROWS_COUNT:=3}"
: "${WIDE_SEED:=9406}" "${WIDE_COUNT:=12}"
source tools/device_setup.sh >/dev/null || exit 1
sweep() {   # name, seconds, args...
    local name=$1 secs=$2; shift 2
    timeout "$secs" python3 -m asmgemm.cli tune "$family" --sweep "$@" -j 16 --reps 5 --samples "$OUT/sweep_${family}_$name.json" \
        --out "$OUT/db_${family}_$name.json" --json > "$OUT/fit_${family}_$name.json" 2> "$OUT/err_${family}_$name.txt"
    echo "$name: exit $? ($(date +%T))"
}
for set_name in $SETS; do
    case $set_name in
    presets) sweep presets 240 square,odd,transformer --layout nn --exhaustive ;;
    linear)
        shapes=$(python3 -c "print(','.join(f'{t}x{o}x{i}' for t in (1,8,64,256,1024,4096) for o,i in ((6144,4096),(4096,4096),(28672,4096),(4096,14336))))")
        sweep linear 150 "$shapes" --layout nt ${LINEAR_FLAGS---exhaustive} ;;
    clusters)
        for layout in nn tn; do
            if [[ $family == sgemm ]]; then shapes=24x3001x1451,40x1500x2900,439x593x1451,439x593x700,977x701x1000
            else shapes=439x593x1451,439x593x1700,439x593x620,211x307x2100,977x701x610,448x592x1456; fi
            sweep "clusters_$layout" "${SET_SECONDS:-100}" "$shapes" --layout "$layout" --exhaustive
        done ;;
    rows|wide_b)
        for layout in nn nt tn tt; do
            # rows: sgemm's skinny class, unrounded; wide_b: the TMA family's, rounded up to 8
            if [[ $set_name == rows ]]; then args=(rows "$ROWS_SEED" "$ROWS_COUNT" "$layout")
            else args=(wide_b "$WIDE_SEED" "$WIDE_COUNT" "$layout" --align 8); fi
            shapes=$(python3 tools/sweep_shapes.py "${args[@]}") || exit 1
            sweep "${set_name}_$layout" "${SET_SECONDS:-100}" "$shapes" --layout "$layout" --exhaustive
        done ;;
    train|large_odd)
        for layout in nn nt tn tt; do
            # the TMA family's sets round every size up to 8 (rows TMA reads in place: the padded
            # copies of odd rows are the path model's, not the catalog's)
            odd=1; [[ $family =~ ^[hb]gemm(_f32c)?$ ]] && odd=8
            if [[ $set_name == train ]]; then args=(train "$TRAIN_SEED" "$TRAIN_COUNT")
            else args=(large_odd "$LARGE_SEED" "$LARGE_COUNT"); fi
            python3 tools/sweep_shapes.py "${args[@]}" "$layout" --align "$odd" > "/tmp/${set_name}_$layout.txt" || exit 1
            sweep "${set_name}_$layout" "${SET_SECONDS:-100}" "/tmp/${set_name}_$layout.txt" --layout "$layout"
        done ;;
    esac
done
