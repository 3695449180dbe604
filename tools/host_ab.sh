#!/usr/bin/env bash
# Host time per call, an older tree against this one, on the GPU machine: tools/host_profile.py's
# loop (asmgemm against torch.matmul / cupy.matmul on the same operands) for each shape, the two
# trees interleaved REPS times, pinned to one CPU core (taskset) because the host's per-call times
# drift by 20-50% between runs; the summary takes the minimum and the median of each.
#
# Prepare the old tree here first (it travels as untracked files; delete it afterwards):
#     git archive <rev> | (mkdir -p ab_old && tar -x -C ab_old)
# then on the device:  OLD=ab_old REPS=5 bash tools/host_ab.sh   (writes $OUT/host_ab.txt after every
# rep: each runs 2 x the shapes' processes, ~140 s for the 7 default shapes on the H200's host, so
# give a command REPS x that, or fewer shapes)
# SHAPES: ';'-separated host_profile.py arguments (default below); CALLS per run (default 2000).
set -uo pipefail
OLD=${OLD:-ab_old}
REPS=${REPS:-5}
CALLS=${CALLS:-2000}
SHAPES=${SHAPES:-"128 128 128 --dtype float16 --torch;652 415 148 --dtype float16 --torch;652 415 148 --dtype float16;305 923 6 --dtype float16 --torch;128 128 128 --dtype float32 --torch;128 128 128 --dtype float16 --torch --hold -1;652 415 148 --dtype float16 --torch --hold -1"}
OUT=${OUT:-/tmp}
[[ -d "$OLD/asm" ]] || { echo "host_ab: no old tree at $OLD (see the header)" >&2; exit 2; }
cp tools/host_profile.py "$OLD/tools/host_profile.py"      # the same probe in both trees
source tools/device_setup.sh >/dev/null || exit 1
( cd "$OLD" && source tools/device_setup.sh >/dev/null 2>&1 ) || { echo "host_ab: the old tree does not set up" >&2; exit 1; }
PIN="taskset -c 3"
command -v taskset >/dev/null || PIN=""
raw="$OUT/host_ab_raw.txt"
: > "$raw"
IFS=';' read -ra LIST <<< "$SHAPES"
# the table of the reps done so far, rewritten after every rep: a run its timeout cuts short still
# leaves the reps it finished in $OUT/host_ab.txt
summarize() {
python3 - "$raw" > "$OUT/host_ab.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    tree, shape, text = line.rstrip("\n").split("|", 2)
    m = re.search(r"asmgemm ([\d.]+) us, (\S+) ([\d.]+) us", text)
    if not m:
        print(f"{tree} {shape}: {text}"); continue
    r = rows.setdefault(shape, {"old": [], "new": [], "ref": [], "name": m.group(2)})
    r[tree].append(float(m.group(1))); r["ref"].append(float(m.group(3)))
print("| shape | old min / median (us) | new min / median | %s min / median |" % "reference")
print("| --- | ---: | ---: | ---: |")
for shape, r in rows.items():
    f = lambda v: f"{min(v):.1f} / {statistics.median(v):.1f}" if v else "-"
    print(f"| {shape} | {f(r['old'])} | {f(r['new'])} | {r['name']} {f(r['ref'])} |")
PY
}
for rep in $(seq "$REPS"); do
    for s in "${LIST[@]}"; do
        for tree in old new; do
            dir=.
            [[ $tree == old ]] && dir=$OLD
            line=$(cd "$dir" && PYTHONPATH=/tmp/site:.gpu_pkg $PIN python3 tools/host_profile.py $s --calls "$CALLS" --top 0 2>&1 | grep -E "per call|Error|error")
            echo "$tree|$s|$line" >> "$raw"
        done
    done
    echo "host_ab: rep $rep of $REPS done" >&2
    summarize
done
cat "$OUT/host_ab.txt"
