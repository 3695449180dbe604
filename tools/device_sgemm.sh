#!/usr/bin/env bash
# One device run for the SGEMM: set-up, GPU tests, compute-sanitizer, benchmark, optional ncu.
# Run from the project root on the device machine (the `run` tool, carry=[".whl"]):
#   bash tools/device_sgemm.sh [tests] [ahead] [sanitize] [cli] [bench] [ncu]   (default: all but ahead)
# Results land in $OUT (logs, JSON); the last lines printed are the benchmark table.
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
steps=${*:-tests sanitize cli bench ncu}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
# a symlink-free copy of the package layout (pyproject package-dir) instead of an install
rm -rf .gpu_pkg && mkdir -p .gpu_pkg/asmgemm
cp -r asm/. .gpu_pkg/asmgemm/
cp -r grammar .gpu_pkg/asmgemm/grammar
cp -r kernels_ptx .gpu_pkg/asmgemm/kernels_ptx
cp -r scheduler .gpu_pkg/asmgemm/scheduler
export PYTHONPATH=/tmp/site:$PWD/.gpu_pkg
export ASMGEMM_CACHE_DIR=/tmp/asmgemm-cache
export PATH=$PATH:/usr/local/cuda/bin
python3 -c "import asmgemm, cupy; from asmgemm.toolchain import find_tool, tool_version; print('asmgemm ok; ptxas', find_tool('ptxas'), tool_version('ptxas')); print(cupy.cuda.runtime.getDeviceProperties(0)['name'])"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
for s in $steps; do case $s in
cli)
  python3 -m asmgemm.cli run sgemm --m 1000 --n 777 --k 333 --layout tn --alpha 0.5 --beta 2 2>&1 | tail -8
  python3 -m asmgemm.cli run sgemm --m 4096 --n 4096 --k 4096 --json > "$OUT/run_4096.json" 2>&1; echo "asmgemm run --json exit: $?"
  python3 -c "import json; r=json.load(open('$OUT/run_4096.json')); print('run 4096 json: ratio %.3f ok %s err %.1e' % (r['ratio_to_cublas'], r['ok'], r['errors']['rel_norm_err_vs_fp64']))"
  python3 -m asmgemm.cli run sgemm --m 8 --n 8 --k 8 -D BK=12 2>&1 | tail -3 ;;
tests)
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sgemm_gpu.py 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt" ;;
ahead)
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sgemm_load_ahead_gpu.py 2>&1 | tail -15 | tee "$OUT/pytest_ahead.txt" ;;
sanitize)
  compute-sanitizer --tool memcheck --error-exitcode 3 python3 tools/sgemm_sanitize.py > "$OUT/sanitize.txt" 2>&1
  echo "compute-sanitizer exit: $?"; tail -6 "$OUT/sanitize.txt" ;;
bench)
  python3 tools/sgemm_bench.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt" | tail -14 > "$OUT/bench_tail.txt" ;;
ncu)
  ncu --clock-control none -k regex:'sgemm|gemm|Kernel' --launch-skip 4 --launch-count 2 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
      --section InstructionStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
      python3 tools/sgemm_profile.py ${NCU_SHAPE:-4096 4096 4096} "${NCU_PARAMS:-null}" > "$OUT/ncu.txt" 2>&1
  echo "ncu exit: $?"
  python3 tools/ncu_summary.py "$OUT/ncu.txt" ;;
esac; done
[ -f "$OUT/bench_tail.txt" ] && cat "$OUT/bench_tail.txt"
