#!/usr/bin/env bash
# ncu's DRAM and L2 view of attention's batched GEMMs on the GPU machine, asmgemm's launch beside
# torch.matmul's, one row per case and kernel: time, DRAM bytes read and written, L2 sectors the
# loads looked up and their hit rate. Written for the open lead of docs/log/hgemm.md ("Open: the
# largest batch of scores reads its operands five times from DRAM": Q.K^T at b.h = 512, s = 4096
# read 5.36 GB from DRAM on the H200 against cuBLAS's 1.10).
#
#   CASES: space-separated qk|pv:BH:S:D:DTYPE (default: Q.K^T d 128 fp16 at b.h 128, 256 and 512);
#   PARAMS: -D overrides laid over asmgemm's own choice, NAME=V[,NAME=V] (default: none).
# ncu replays the whole driver per metric pass (--replay-mode application: a kernel replay would
# save and restore the 17 GB C), clocks as they run (--clock-control none), and profiles only the
# NVTX range of each case. Needs ncu (the device image's /usr/local/cuda/bin) and torch.
# Writes $OUT/attention_l2.csv (ncu's) and $OUT/attention_l2.txt (the table).
set -uo pipefail
: "${OUT:?set OUT}" "${CASES:=qk:128:4096:128:float16 qk:256:4096:128:float16 qk:512:4096:128:float16}"
: "${PARAMS:=}"
source tools/device_setup.sh >/dev/null || exit 1
export ASMGEMM_NO_TUNE_CACHE=1
mkdir -p "$OUT"
# the cases' calls: tools/attention_diag.py --nvtx (each case once in an NVTX range named after it,
# ':' as '_'; PARAMS as one of its variants, laid over asmgemm's own build)
driver=(python3 tools/attention_diag.py --nvtx)
for c in $CASES; do driver+=(--case "$c"); done
[[ -n "$PARAMS" ]] && driver+=(--variant "$PARAMS")
include=()
for c in $CASES; do include+=(--nvtx-include "${c//:/_}/"); done
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum
"${driver[@]}" >/dev/null || { echo "attention_l2: the driver fails without ncu" >&2; exit 1; }
ncu --replay-mode application --clock-control none --nvtx "${include[@]}" --metrics "$metrics" --csv \
    "${driver[@]}" > "$OUT/attention_l2.csv" 2> "$OUT/attention_l2.err"
rc=$?
python3 - "$OUT/attention_l2.csv" <<'PY' | tee "$OUT/attention_l2.txt"
import csv, re, sys
rows = list(csv.reader(line for line in open(sys.argv[1]) if line.startswith('"')))
if not rows:
    sys.exit("attention_l2: ncu wrote no rows (see attention_l2.err)")
col = {h: i for i, h in enumerate(rows[0])}
nvtx = next(i for h, i in col.items() if "Push/Pop_Range" in h)
kernels: dict = {}
for r in rows[1:]:
    case = re.search(r"<default domain>:([^:]+):", r[nvtx])
    key = (case.group(1).replace("_", ":") if case else "?", r[col["ID"]], r[col["Kernel Name"]][:40])
    kernels.setdefault(key, {})[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
print("| case | kernel | time us | DRAM read GB | DRAM write GB | L2 load lookups (M sectors) | L2 load hit rate |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for (case, _, name), m in kernels.items():
    hit = m.get("lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum", 0.0)
    miss = m.get("lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum", 0.0)
    print(f"| {case} | {name} | {m.get('gpu__time_duration.sum', 0) / 1e3:.0f} | {m.get('dram__bytes_read.sum', 0) / 1e9:.2f} | "
          f"{m.get('dram__bytes_write.sum', 0) / 1e9:.2f} | {(hit + miss) / 1e6:.1f} | "
          f"{100 * hit / (hit + miss) if hit + miss else 0:.1f}% |")
PY
exit $rc
