#!/usr/bin/env bash
# The release check on the GPU machine: every test marked gpu or perf (~6.5 minutes on the H100),
# the scheduled-vs-source-order A/B of the SGEMM (issue 4, ~3 minutes), compute-sanitizer on odd
# shapes and the benchmark table against cuBLAS (~1 minute each). All of it is more than one device
# call's 10 minutes: name the parts per call. Run from the project root with carry=[".whl"] (lark,
# from ../shared/gpu/fetch-wheels.sh):
#     bash tools/device_verify.sh tests sanitize      # then, in a second call:
#     bash tools/device_verify.sh sched bench
# Logs and JSON land in $OUT (more than the device tool brings back one by one: tar them up
# afterwards); the summary lines come last.
set -u
PARTS=" ${*:-tests sched sanitize bench} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${OUT:-/tmp/verify-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
# A copy laid out as the installed package (pyproject's package-dir), instead of an install.
rm -rf .gpu_pkg && mkdir -p .gpu_pkg && cp -r asm .gpu_pkg/asmgemm
for sub in grammar kernels_ptx scheduler; do cp -r "$sub" ".gpu_pkg/asmgemm/$sub"; done
export PYTHONPATH=/tmp/site:$PWD/.gpu_pkg ASMGEMM_CACHE_DIR=/tmp/asmgemm-cache PYTHONUNBUFFERED=1
python3 -c "import asmgemm, cupy; from asmgemm.toolchain import tool_version; print('asmgemm', asmgemm.__file__, 'cupy', cupy.__version__, 'ptxas', tool_version('ptxas'))" || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
step() { local name=$1; shift; echo "+ $*" >&2; "$@" > "$OUT/$name.txt" 2>&1; echo "$name: exit $?" | tee -a "$OUT/exits.txt"; }

if want tests; then
  step pytest_gpu timeout 450 python3 -m pytest -q -p no:cacheprovider -rfEs -m "gpu or perf" tests
fi
if want sched; then
  step sched_ab timeout 120 python3 tools/sched_ab.py sgemm --shape 4096,4096,4096 --shape 3000,5000,700 --reps 15 --json "$OUT/sched_ab.json"
  # ... and the variant asmgemm.gemm runs at 4096^3 (16x8 per thread, load-ahead, BK=16)
  step sched_ab_large timeout 150 python3 tools/sched_ab.py sgemm -D RQ=4 -D LOAD_AHEAD=1 -D LDG_NC=0 -D BK=16 --shape 4096,4096,4096 --shape 8192,8192,8192 --reps 15 --json "$OUT/sched_ab_large.json"
fi
if want sanitize; then
  step sanitize timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 python3 tools/sgemm_sanitize.py
fi
if want bench; then
  step bench timeout 200 python3 -m asmgemm.cli bench sgemm --shapes square,3000x5000x700 --reps 15 --json "$OUT/bench.json"
fi

echo "===== summary"; cat "$OUT/exits.txt"
for f in pytest_gpu sanitize sched_ab sched_ab_large bench; do
  [ -f "$OUT/$f.txt" ] || continue
  case $f in
    pytest_gpu) grep -E "passed|failed" "$OUT/$f.txt" | tail -3 ;;
    sanitize) tail -n 4 "$OUT/$f.txt" ;;
    bench) tail -n 20 "$OUT/$f.txt" ;;
    *) tail -n 14 "$OUT/$f.txt" ;;
  esac
done
