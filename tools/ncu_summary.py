"""Condense an ncu text report: per kernel, duration, issue rate, eligibility and the top stall
reasons (smsp__average_warps_issue_stalled_*_per_issue_active). Usage: ncu_summary.py ncu.txt"""
import re
import sys

KEEP = ("Duration", "SM Frequency", "Elapsed Cycles", "Issued Warp Per Scheduler", "No Eligible",
        "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction", "Executed Instructions ",
        "Registers Per Thread", "Achieved Occupancy", "Compute (SM) Throughput")
kernel = None
stalls = {}


def flush():
    if stalls:
        top = sorted(stalls.items(), key=lambda kv: -kv[1])[:8]
        print("    stalls (warps per issue): " + ", ".join(f"{k}={v:.2f}" for k, v in top))


for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^  (\S+) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
    if m:
        flush()
        stalls = {}
        kernel = m.group(1)
        print(kernel[:90])
        continue
    m = re.match(r"^\s+smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio\s+\S*\s+([\d.,]+)", line)
    if m:
        stalls[m.group(1)] = float(m.group(2).replace(",", ""))
        continue
    if any(k in line for k in KEEP):
        print("   ", re.sub(r"\s{2,}", "  ", line.strip()))
flush()
