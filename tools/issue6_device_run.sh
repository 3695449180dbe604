#!/usr/bin/env bash
# The issue-6 device run, in one call (about 3-5 minutes on the H100): `asmgemm bench` for sgemm on
# the square preset plus one odd shape with --save-baseline, two small tunes, and the GPU/perf tests
# of bench and tune against the baseline just saved. Everything lands under $OUT:
#   bench.json, bench.txt, baselines/<GPU>.json, tune_*.txt, cache/tune.json, pytest_*.txt
# Run from the repository root on the device machine (carry .whl):  bash tools/issue6_device_run.sh
set -u
OUT=${OUT:-/tmp/issue6-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.gpu_pkg
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1; then
  # no editable install there: a plain copy laid out as the installed package would be
  rm -rf .gpu_pkg && mkdir -p .gpu_pkg && cp -r asm .gpu_pkg/asmgemm
  for sub in grammar kernels_ptx scheduler; do cp -r "$sub" ".gpu_pkg/asmgemm/$sub"; done
fi
python3 -c "import asmgemm, cupy; from asmgemm.toolchain import tool_version; print('asmgemm', asmgemm.__file__, 'cupy', cupy.__version__, 'ptxas', tool_version('ptxas'))" || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
export ASMGEMM_CACHE_DIR="$OUT/cache" PYTHONUNBUFFERED=1
run() { echo "+ $*" >&2; "$@"; echo "exit $?" >&2; }

# most important first: a step cut short by the call's time limit still leaves the earlier ones' files
run timeout 200 python3 -m asmgemm.cli bench sgemm --shapes square,3000x5000x700 --reps 20 --save-baseline \
    --baseline-dir "$OUT/baselines" --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
run env ASMGEMM_BASELINE_DIR="$OUT/baselines" timeout 120 python3 -m pytest -q -p no:cacheprovider -rA -s tests/perf \
    > "$OUT/pytest_perf.txt" 2>&1
run timeout 120 python3 -m asmgemm.cli tune sgemm --shape 4096,4096,4096 -j 16 --reps 20 > "$OUT/tune_4096.txt" 2>&1
run timeout 150 python3 -m pytest -q -p no:cacheprovider -rA \
    tests/test_bench_gpu.py tests/test_tune_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
run timeout 90 python3 -m asmgemm.cli tune sgemm --shape 1024,1024,1024 -j 16 --reps 30 > "$OUT/tune_1024.txt" 2>&1

# short summaries last (the reply carries the tail; everything is under $OUT)
cat "$OUT/tune_4096.txt"
tail -n 8 "$OUT/tune_1024.txt"
tail -n 4 "$OUT/pytest_gpu.txt"
grep -E "ratio to cuBLAS|passed|failed|skipped" "$OUT/pytest_perf.txt" | tail -n 12
cat "$OUT/bench.txt"
