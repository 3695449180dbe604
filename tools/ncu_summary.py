#!/usr/bin/env python3
"""Condense an Nsight Compute text report: per profiled kernel, its duration, clock, issue rate,
eligible warps, occupancy, registers and the top stall reasons
(smsp__average_warps_issue_stalled_*_per_issue_active, warps stalled per issued instruction).

The report is ncu's plain stdout with --section SpeedOfLight/WarpStateStats/SchedulerStats/
LaunchStats/Occupancy/InstructionStats and --metrics regex:smsp__average_warps_issue_stalled_.*,
as the `ncu` part of tools/device_verify.sh writes it. Reads a file; needs no GPU.

Usage:
    python3 tools/ncu_summary.py $OUT/ncu.txt
    python3 tools/ncu_summary.py ncu.txt --top 12
"""
from __future__ import annotations

import argparse
import re
import sys

# Lines of ncu's sections worth keeping (substrings of the metric name column).
KEEP = ("Duration", "SM Frequency", "Elapsed Cycles", "Issued Warp Per Scheduler", "No Eligible",
        "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction", "Executed Instructions ",
        "Registers Per Thread", "Achieved Occupancy", "Compute (SM) Throughput")
KERNEL_RE = re.compile(r"^  (\S+) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)")
STALL_RE = re.compile(r"^\s+smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio\s+\S*\s+([\d.,]+)")


def summarize(lines, top: int = 8) -> list[str]:
    """The condensed report, one string per output line."""
    out: list[str] = []
    stalls: dict[str, float] = {}

    def flush():
        if stalls:
            best = sorted(stalls.items(), key=lambda kv: -kv[1])[:top]
            out.append("    stalls (warps per issue): " + ", ".join(f"{k}={v:.2f}" for k, v in best))

    for line in lines:
        m = KERNEL_RE.match(line)
        if m:
            flush()
            stalls = {}
            out.append(m.group(1)[:90])
            continue
        m = STALL_RE.match(line)
        if m:
            stalls[m.group(1)] = float(m.group(2).replace(",", ""))
            continue
        if any(k in line for k in KEEP):
            out.append("    " + re.sub(r"\s{2,}", "  ", line.strip()))
    flush()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="ncu's text output (its stdout, redirected to a file)")
    ap.add_argument("--top", type=int, default=8, help="stall reasons shown per kernel (default 8)")
    args = ap.parse_args(argv)
    try:
        with open(args.report, errors="replace") as fh:
            lines = summarize(fh, args.top)
    except OSError as exc:
        print(f"ncu_summary: cannot read {args.report}: {exc.strerror}", file=sys.stderr)
        return 2
    if not lines:
        print(f"ncu_summary: no profiled kernel in {args.report} (did ncu run? see the file)", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
