set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
rm -rf .gpu_pkg && mkdir -p .gpu_pkg && cp -r asm .gpu_pkg/asmgemm
for s in grammar kernels_ptx scheduler; do cp -r $s .gpu_pkg/asmgemm/$s; done
export PYTHONPATH=/tmp/site:$PWD/.gpu_pkg ASMGEMM_CACHE_DIR=/tmp/c PYTHONUNBUFFERED=1
R=/tmp/rc; mkdir -p $R
i=0
for cfg in "--defaults" "-D THREADS=64 -D BK=16" "-D THREADS=64 -D BK=16 -D ASYNC=1" "-D THREADS=256 -D BK=16" "-D RQ=4 -D LOAD_AHEAD=1 -D LDG_NC=0" "-D RQ=4 -D LOAD_AHEAD=1 -D LDG_NC=0 -D BK=16"; do
  timeout 90 python3 -m asmgemm.cli bench sgemm --shapes tools/data/mid_problem_shapes.txt --reps 10 --no-triton --no-torch $cfg --json $R/mid_$i.json > $R/mid_$i.txt 2>&1; echo "mid_$i [$cfg] $?" | tee -a $R/exits.txt; i=$((i+1))
done
tar czf $OUT/rC.tar.gz -C $R .
