#!/usr/bin/env bash
# THE device script: the release check on the GPU machine, and the other GPU runs a maintainer
# repeats, as parts named on the command line. Run from the repository root of the GPU machine
# (the `run` tool) with carry [".whl"] (made here by ../shared/gpu/fetch-wheels.sh); the set-up is
# tools/device_setup.sh. One call has 10 minutes: name the parts per call, e.g.
#     bash tools/device_verify.sh tests sanitize      # then, in a second call:
#     bash tools/device_verify.sh sched bench
#
# Parts (default: tests sched sanitize bench, the release check; `all`: every part):
#   tests     every test marked gpu or perf (~9 min on the H100: alone in its call)
#   sched     tools/sched_ab.py: scheduled vs source order of sgemm, 8x8 defaults and the 16x8
#             load-ahead variant gemm() runs at 4096^3 (~3 min)
#   sanitize  compute-sanitizer memcheck over tools/sgemm_sanitize.py, sgemm and hgemm, and memcheck
#             plus racecheck over hgemm_mma at three odd shapes (odd leading dimensions: the
#             2-byte path; 4 layouts x 2 tilings and a strided view each), and both over
#             tools/batched_sanitize.py (one odd batched shape, one ragged grouped one) (~4 min)
#   bench     asmgemm bench sgemm against cuBLAS, square + 3000x5000x700 (~1 min)
#   cli       asmgemm run: odd shape with alpha/beta (tn), 4096^3 as JSON, a tiny 8^3 (~1 min)
#   ncu       Nsight Compute over tools/sgemm_profile.py, condensed by tools/ncu_summary.py
#             (NCU_SHAPE="M N K", default 4096^3; NCU_PARAMS='{"BK": 16}' JSON, default gemm's choice)
#   baseline  asmgemm bench --save-baseline (sgemm, then hgemm) over a copy of tests/perf/baselines in
#             $OUT/baselines (~2.5 min); copy $OUT/baselines/<GPU>.json to tests/perf/baselines/ to adopt it
# Logs and JSON land in $OUT (default /tmp/verify-out); a summary comes last. Exit status 1 when
# a step failed (each step's status is in $OUT/exits.txt), 2 for an unknown part.
set -u
KNOWN="tests sched sanitize bench cli ncu baseline"
PARTS=" ${*:-tests sched sanitize bench} "
[[ "$PARTS" == *" all "* ]] && PARTS=" $KNOWN "
for p in $PARTS; do
  [[ " $KNOWN " == *" $p "* ]] || { echo "device_verify: unknown part '$p' (known: $KNOWN, all)" >&2; exit 2; }
done
want() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${OUT:-/tmp/verify-out}; mkdir -p "$OUT"; export OUT
: > "$OUT/exits.txt"

# shellcheck source=tools/device_setup.sh
source tools/device_setup.sh || exit 1

failed=0
step() {  # step NAME CMD...: output to $OUT/NAME.txt, exit status to $OUT/exits.txt
  local name=$1; shift
  echo "+ $*" >&2
  "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc" | tee -a "$OUT/exits.txt"
  [[ $rc -eq 0 ]] || failed=1
}

if want tests; then
  step pytest_gpu timeout 580 python3 -m pytest -q -p no:cacheprovider -rfEs -m "gpu or perf" tests
fi
if want sched; then
  step sched_ab timeout 120 python3 tools/sched_ab.py sgemm --shape 4096,4096,4096 --shape 3000,5000,700 \
      --reps 15 --json "$OUT/sched_ab.json"
  # ... and the variant asmgemm.gemm runs at 4096^3 (16x8 per thread, load-ahead, BK=16)
  step sched_ab_large timeout 150 python3 tools/sched_ab.py sgemm -D RQ=4 -D LOAD_AHEAD=1 -D LDG_NC=0 -D BK=16 \
      --shape 4096,4096,4096 --shape 8192,8192,8192 --reps 15 --json "$OUT/sched_ab_large.json"
fi
if want sanitize; then
  step sanitize timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 python3 tools/sgemm_sanitize.py sgemm
  # the Hopper HGEMM on an odd shape; cuda-bindings probes driver entry points the driver does not
  # have (34 cuGetProcAddress "invalid argument" API errors, no memory error): count memory errors only
  step sanitize_hgemm timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
      python3 tools/sgemm_sanitize.py hgemm
  # the portable mma.sync kernel: shared-memory races matter as much as addresses (cp.async ring)
  for shape in 131,67,45 257,300,129 77,1030,64; do
    for tool in memcheck racecheck; do
      step "sanitize_mma_${tool}_${shape//,/x}" timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 3 \
          python3 tools/sgemm_sanitize.py hgemm_mma --params null --params '{"BM":128,"BN":128,"WM":64,"WN":32}' \
          --shape "$shape"
    done
  done
  # issue 33: the batched (grid z, heads of a strided view) and grouped (experts from offs) launches
  for tool in memcheck racecheck; do
    step "sanitize_batched_${tool}" timeout 120 compute-sanitizer --tool "$tool" --report-api-errors no \
        --error-exitcode 3 python3 tools/batched_sanitize.py
  done
fi
if want bench; then
  step bench timeout 200 python3 -m asmgemm.cli bench sgemm --shapes square,3000x5000x700 --reps 15 \
      --json "$OUT/bench.json"
fi
if want cli; then
  step run_odd timeout 120 python3 -m asmgemm.cli run sgemm --m 1000 --n 777 --k 333 --layout tn --alpha 0.5 --beta 2
  step run_4096 timeout 120 bash -c 'python3 -m asmgemm.cli run sgemm --m 4096 --n 4096 --k 4096 --json > "$OUT/run_4096.json"'
  step run_tiny timeout 60 python3 -m asmgemm.cli run sgemm --m 8 --n 8 --k 8
fi
if want ncu; then
  # 3 rounds of (asmgemm, cuBLAS): skip 4 matching launches, profile round 3's two
  # shellcheck disable=SC2086  # NCU_SHAPE is three words on purpose
  step ncu timeout 300 ncu --clock-control none -k regex:'sgemm|gemm|Kernel' --launch-skip 4 --launch-count 2 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --section Occupancy --section InstructionStats \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
      python3 tools/sgemm_profile.py ${NCU_SHAPE:-4096 4096 4096} "${NCU_PARAMS:-null}"
  step ncu_summary python3 tools/ncu_summary.py "$OUT/ncu.txt"
fi
if want baseline; then
  # Merged into a copy of the committed baselines, so entries of other shapes are kept.
  mkdir -p "$OUT/baselines" && cp tests/perf/baselines/*.json "$OUT/baselines/" 2>/dev/null
  step baseline timeout 240 python3 -m asmgemm.cli bench sgemm --shapes square,3000x5000x700 --reps 20 \
      --save-baseline --baseline-dir "$OUT/baselines" --json "$OUT/baseline_bench.json"
  step baseline_hgemm timeout 240 python3 -m asmgemm.cli bench hgemm --reps 20 --no-triton \
      --shapes 2048x2048x2048,4096x4096x4096,8192x8192x8192,8192x1024x8192,4096x4096x1024 \
      --save-baseline --baseline-dir "$OUT/baselines" --json "$OUT/baseline_hgemm.json"
fi

echo "===== summary"; cat "$OUT/exits.txt"
for f in pytest_gpu sanitize sanitize_hgemm $(cd "$OUT" && ls sanitize_mma_*.txt 2>/dev/null | sed 's/\.txt$//') sched_ab sched_ab_large run_odd run_4096 run_tiny ncu_summary bench baseline baseline_hgemm; do
  [ -f "$OUT/$f.txt" ] || continue
  echo "----- $f"
  case $f in
    pytest_gpu) grep -E "passed|failed|error" "$OUT/$f.txt" | tail -3 ;;
    sanitize|sanitize_hgemm) tail -n 4 "$OUT/$f.txt" ;;
    sanitize_mma_*) grep -E "SUMMARY|SANITIZE_RESULTS" "$OUT/$f.txt" ;;
    run_4096) python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('run 4096 json: ratio %.3f ok %s err %.1e' % (r['ratio_to_cublas'], r['ok'], r['errors']['rel_norm_err_vs_fp64']))" \
                "$OUT/run_4096.json" 2>&1 || tail -n 5 "$OUT/$f.txt" ;;
    run_odd|run_tiny) tail -n 8 "$OUT/$f.txt" ;;
    ncu_summary) cat "$OUT/$f.txt" ;;
    bench|baseline|baseline_hgemm) tail -n 20 "$OUT/$f.txt" ;;
    *) tail -n 14 "$OUT/$f.txt" ;;
  esac
done
exit $failed
