#!/usr/bin/env python3
"""How much of the DRAM bandwidth a launch draws when only some SMs are busy: a streaming copy
(16-byte loads and stores, grid-stride) of 1 GiB with G blocks of 1024 threads, one block an SM
(and two), timed between CUDA events (median of 5). The cost model's memory floor
(runtime/cost_model.py, DRAM_SM_SHARE) reads the curve: a launch with fewer busy SMs than the
share that saturates DRAM streams its operands no faster than those SMs can pull. Needs a GPU.

    python3 tools/dram_share_probe.py --json dram_share.json

The H100's curve: tools/data/dram_share_h100.json (docs/log/dispatch.md, "How many SMs fill DRAM").
"""
from __future__ import annotations

import argparse
import json

try:
    import cupy as cp
except ImportError:     # `--help` works without it; main() says what is missing
    cp = None

SOURCE = r"""
extern "C" __global__ void copy16(const float4* __restrict__ src, float4* __restrict__ dst, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--json")
    args = ap.parse_args()
    if cp is None:
        raise SystemExit("tools/dram_share_probe.py: needs CuPy and a CUDA GPU (the device machine: source tools/device_setup.sh)")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    kernel = cp.RawKernel(SOURCE, "copy16")
    n = args.bytes // 16
    src, dst = cp.ones(n * 4, dtype=cp.float32), cp.empty(n * 4, dtype=cp.float32)
    rows = []
    for per_sm in (1, 2):
        for busy in sorted({1, 2, 4, 8, 16, sms // 8, sms // 4, sms * 3 // 8, sms // 2, sms * 5 // 8, sms * 3 // 4,
                            sms * 7 // 8, sms}):
            grid = busy * per_sm
            times = []
            for _ in range(6):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                kernel((grid,), (1024,), (src, dst, cp.int64(n)))
                end.record()
                end.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, end))
            ms = sorted(times[1:])[2]
            gbs = 2 * args.bytes / ms / 1e6
            rows.append({"busy_sms": busy, "blocks_per_sm": per_sm, "ms": round(ms, 4), "GB_s": round(gbs, 1)})
            print(f"{busy:4d} SMs x {per_sm} blocks: {gbs:8.1f} GB/s (read + write)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sms": sms, "bytes": args.bytes, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
