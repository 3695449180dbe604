#!/usr/bin/env bash
# Issue 32's device check of split-K in one launch (mma_gemm.sasm's SPLIT_FIXUP), in one device
# command from the repository root (< 6 min on the H100; results also under $OUT when it is set):
#   1. the new GPU tests (tests/test_splitk_fixup_gpu.py: bit-identical C against the reduce
#      kernel, repeated calls, two streams, a torch graph) and tests/test_mma_gemm_gpu.py -k split;
#   2. per-call times against torch.matmul of the two split shapes (tools/host_profile.py):
#      16x314x1725 fp16 (S = 27) and 133x33x4290 bf16 tn (S = 23), ~31-33 us and 30 us a call in a
#      loop before (two launches and a workspace per call), torch 16 and 14 us;
#   3. compute-sanitizer memcheck and racecheck on tools/splitk_fixup_sanitize.py (odd split
#      shapes in both modes, fp16 and bf16).
# Each step prints "== NAME: exit N" and a few lines of its log; the last line sums them up.
set -u
source tools/device_setup.sh >/dev/null || exit 1
export ASMGEMM_NO_TUNE_CACHE=1
LOGS=${OUT:-/tmp/splitk_fixup_check}
mkdir -p "$LOGS"
failed=""
step() {   # name, command...
    local name=$1; shift
    "$@" > "$LOGS/$name.txt" 2>&1
    local rc=$?
    echo "== $name: exit $rc"
    grep -E 'passed|failed|error|us|SANITIZE_RESULTS|ERROR SUMMARY|WRONG' "$LOGS/$name.txt" | tail -12
    [[ $rc == 0 ]] || failed="$failed $name"
}
step gpu_tests timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_splitk_fixup_gpu.py
step mma_split_tests timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mma_gemm_gpu.py -k split
if [[ -f tools/host_profile.py ]]; then
    step host_fp16 timeout 90 python3 tools/host_profile.py 16 314 1725 --torch
    step host_bf16_tn timeout 90 python3 tools/host_profile.py 133 33 4290 --dtype bfloat16 --layout tn
else
    echo "== host_profile: tools/host_profile.py is not in this tree (it is on main): skipped"
fi
step memcheck timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 python3 tools/splitk_fixup_sanitize.py
step racecheck timeout 150 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 3 python3 tools/splitk_fixup_sanitize.py
echo "splitk_fixup_check: ${failed:+FAILED:}${failed:-all passed}"
[[ -z $failed ]]
