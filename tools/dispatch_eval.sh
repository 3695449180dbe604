#!/usr/bin/env bash
# Refit and judge the dispatch on the GPU machine, in one command (device tool: results in $OUT):
#   1. (SWEEP=1) more training sweeps of FAMILY (tools/dispatch_sweep.sh's train set, seed TRAIN_SEED);
#   2. (SWEEP=1) refit FAMILY's cost model on every sweep kept in tools/data/dispatch/ plus the new
#      ones, and install the database into the package copy the benchmarks below import;
#   3. the random benchmark for each KERNEL:SPEC in BENCH (e.g. "sgemm:random:21:60 hgemm:random:23:60:16"),
#      build cache warmed first in parallel (tools/warm_cache.py), call/gpu/loop timings;
#   4. everything under $OUT packed into $OUT/all.tgz (the device tool returns few files).
set -u
: "${OUT:?set OUT}" "${FAMILY:=sgemm}" "${SWEEP:=1}" "${BENCH:=}" "${REPS:=10}" "${LOOP:=50}"
source tools/device_setup.sh >/dev/null || exit 1
if [[ $SWEEP == 1 ]]; then
    SETS=${SETS:-train} bash tools/dispatch_sweep.sh "$FAMILY"
    fits=()
    for f in tools/data/dispatch/sweep_*/sweep_"$FAMILY"_*.json.gz "$OUT"/sweep_"$FAMILY"_*.json; do
        [[ -f $f ]] && fits+=(--fit "$f")
    done
    db=$(python3 -c "from asmgemm.runtime.dispatch_db import shipped_dir; print(shipped_dir())")/nvidia_h100_80gb_hbm3.json
    [[ ${#fits[@]} -gt 0 ]] && timeout 120 python3 -m asmgemm.cli tune "$FAMILY" "${fits[@]}" --out "$OUT/db_joint.json" \
        --json > "$OUT/fit_joint.json" && cp "$OUT/db_joint.json" "$db" && echo "refit: $(python3 -c "
import json; r = json.load(open('$OUT/fit_joint.json')); print({k: (v['share_within_5pct'], v['geomean_pick_over_best'], v['calls']) for k, v in r['held_out'].items()})")"
fi
for item in $BENCH; do
    kernel=${item%%:*}; spec=${item#*:}; name=${kernel}_${spec//:/_}
    timeout 150 python3 tools/warm_cache.py --kernels "$kernel" --shapes "$spec" -j 12 > "$OUT/warm_$name.txt" 2>&1
    timeout 200 python3 -m asmgemm.cli bench "$kernel" --shapes "$spec" --reps "$REPS" --loop-calls "$LOOP" --no-triton \
        --json "$OUT/bench_$name.json" > "$OUT/bench_$name.txt" 2>&1
    echo "$item: exit $?"; grep -A4 '^[0-9]* shapes' "$OUT/bench_$name.txt" | grep -E 'call|gpu |loop'
done
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz"
