"""Issue 33's benchmark: attention's batched GEMMs (Q.K^T, P.V) and a mixture of experts' grouped
GEMM against torch, in one process, by `asmgemm bench`'s timing (call / gpu / loop columns,
interleaved, L2 flushed). The sets and their anchors are asm/bench/batched.py's docstring; the
goal is issue 33's: attention geomean >= 1.0x torch.matmul and none under 0.85x, moe >= 1.0x
torch._grouped_mm (or >= 1.5x a loop of torch.matmul where torch has no _grouped_mm), by call time.

    python3 tools/batched_bench.py --shapes attention --json $OUT/attention.json
    python3 tools/batched_bench.py --shapes moe --json $OUT/moe.json
    python3 tools/batched_bench.py --shapes attention --quick     # 8 cases, for a smoke run

GPU machine, torch with CUDA and CuPy (`source tools/device_setup.sh`)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", choices=("attention", "moe"), required=True, help="the set to run")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per mode (default 20)")
    parser.add_argument("--quick", action="store_true", help="a few cases of the set only (smoke run)")
    parser.add_argument("--no-flush", action="store_true", help="do not flush L2 between repetitions")
    parser.add_argument("--loop-calls", type=int, default=200, help="calls per loop measurement (0: no loop column)")
    parser.add_argument("--json", type=Path, help="write the rows and the summary here")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only the cases whose label holds TEXT (repeatable: any of them), e.g. "
                             "--only 'PV bh=32 s=512 d=128' to time a row again")
    args = parser.parse_args()
    from asmgemm.bench import batched
    cases = batched.attention_cases() if args.shapes == "attention" else batched.moe_cases()
    if args.quick:
        cases = cases[::max(1, len(cases) // 8)][:8]
    if args.only:
        cases = [c for c in cases if any(t in c.label for t in args.only)]
        if not cases:
            parser.error(f"--only: no {args.shapes} case's label holds {' or '.join(map(repr, args.only))}")
    rows = batched.run_set(args.shapes, args.reps, not args.no_flush, cases, loop_calls=args.loop_calls)
    out = batched.report(args.shapes, rows)
    for line in batched.summary_lines(out):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r.error is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
