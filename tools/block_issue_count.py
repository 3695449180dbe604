#!/usr/bin/env python3
"""What one block of mma_gemm issues, per warp and per region of its code, on the CPU.

The interpreter of tests/ptx_sim.py runs the block (one of the grid's, --block) and counts, for each
PTX instruction, the warps that issue it (predicated off or not: what ncu's inst_executed counts).
With ptxas and nvdisasm, `asmgemm sass --json`'s ptx_index attributes each SASS instruction to the
PTX instruction it came from, and the product estimates the SASS instructions a warp issues (ptxas
moves and merges code, so a region's figure is an attribution, not a measurement; the total is
close: fa28926's kernel at 4543x4546x3 nn, t64x64_w32x32, block 5,5, estimated 1342 SASS a warp
where ncu measured 1347 (27.5 M warp instructions over 20448 warps; docs/log/mma.md step 13). A region is the
code from one label to the next (numbered macro labels are summed: realign_fast_59_1 and _0 count
as realign_fast).

Why: a kernel of small blocks and few K tiles is issue-bound (the tiny-K, large-C calls: ALU pipe
72%), and the question is then which code a block spends its instructions on -- step 13 found 420
of 1169 a warp copying ring tiles past K, step 14 the divisions by constants.

Operands: A is M x K (K x M with -D TRANS_A=1), B is K x N (N x K with TRANS_B=1), C is M x N, 16-bit
(fp32 C with -D C_F32=1); leading dimensions by --ld (default: the rows' lengths). The -D values
are the build's (ALIGN_A, ALIGN_B, C_PIECE, WIDE_C, the tiling...): they must agree with --ld as
the runtime's call values would (plan.copy_alignment, plan.c_piece), or the block reads as the
build assumes, not as the operands lie.

Usage (CPU):
    python3 tools/block_issue_count.py --mnk 256,258,3 -D BM=64 -D BN=64 -D WM=32 -D WN=32 \\
        -D ALIGN_A=2 -D ALIGN_B=4 -D C_PIECE=4
    python3 tools/block_issue_count.py --mnk 256,256,40 -D ALIGN_A=16 -D ALIGN_B=16 -D WIDE_C=1 --no-sass --json -
Exit status: 0 done; 2 usage error (bad -D, shapes); 1 the build or the interpreter failed.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _region(labels: list[tuple[int, str]], pc: int) -> str:
    name = "entry"
    for start, label in labels:
        if start > pc:
            break
        name = label
    return re.sub(r"(_\d+)+$", "", name)       # a macro's numbered labels as one region


def count(kernel: str, defines: dict, m: int, n: int, k: int, lds: tuple | None, block: tuple, sass: bool) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    import numpy as np
    from ptx_sim import Kernel, Memory, _Run, aligned_array
    from asmgemm.pipeline import BuildOptions, build_file

    result = build_file(kernel, BuildOptions(defines={a: str(b) for a, b in defines.items()}, target="sm_90"))
    const = result.constants
    ta, tb = int(const.get("TRANS_A", 0)), int(const.get("TRANS_B", 0))
    a_shape, b_shape = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    lda, ldb, ldc = lds or (a_shape[1], b_shape[1], n)
    if lda < a_shape[1] or ldb < b_shape[1] or ldc < n:
        raise SystemExit(f"block_issue_count: a leading dimension below its rows' length ({lda}, {ldb}, {ldc})")
    mem = Memory()
    a = aligned_array((a_shape[0], lda), np.float16)
    a[...] = 0.5
    b = aligned_array((b_shape[0], ldb), np.float16)
    b[...] = 0.25
    c = aligned_array((m, ldc), np.float32 if int(const.get("C_F32", 0)) else np.float16)
    values = dict(A=mem.add(a), B=mem.add(b), C=mem.add(c), M=m, N=n, K=k, lda=lda, ldb=ldb, ldc=ldc, alpha=1.0,
                  beta=0.0)
    ptx = Kernel(result.ptx)
    args = {name.removeprefix("param_"): values.get(name.removeprefix("param_"), 0) for _, name in ptx.params}
    threads, smem = int(const["THREADS"]), int(const["SMEM_BYTES"])
    grid = (math.ceil(n / int(const["BN"])), math.ceil(m / int(const["BM"])), 1)
    if not (0 <= block[0] < grid[0] and 0 <= block[1] < grid[1]):
        raise SystemExit(f"block_issue_count: block {block} outside the grid {grid[:2]}")
    per_pc = collections.Counter()       # warps that issue each instruction (ptx_sim's `issued`)
    _Run(ptx, (block[0], block[1], 0), 1, threads, args, mem, smem, 20_000_000, grid, per_pc).go()
    warps = threads // 32
    labels = sorted((pc, name) for name, pc in ptx.labels.items())
    regions: dict[str, dict] = collections.defaultdict(lambda: {"ptx": 0.0, "sass": 0.0})
    for pc, c_ in per_pc.items():
        regions[_region(labels, pc)]["ptx"] += c_ / warps
    out = {"kernel": kernel, "defines": defines, "mnk": [m, n, k], "ld": [lda, ldb, ldc], "block": list(block),
           "warps": warps, "ptx_per_warp": round(sum(per_pc.values()) / warps, 1)}
    if sass:
        from asmgemm.pipeline import assemble_traced
        from asmgemm.sass.inspect import inspect_build
        traced = assemble_traced(build_file(kernel, BuildOptions(
            defines={a: str(b) for a, b in defines.items()}, target="sm_90", trace="ptx-lines")))
        (decoded,) = [kk for kk in inspect_build(traced).kernels.values() if kk.name == ptx.name]
        ops = collections.Counter()
        for ins in decoded.instructions:
            if ins.ptx_index is None:
                continue
            c_ = per_pc.get(ins.ptx_index, 0) / warps
            regions[_region(labels, ins.ptx_index)]["sass"] += c_
            ops[ins.opcode] += c_
        out["sass_per_warp_estimate"] = round(sum(r["sass"] for r in regions.values()), 1)
        out["sass_opcodes"] = {o: round(v, 1) for o, v in ops.most_common()}
    out["regions"] = {name: {key: round(v, 1) for key, v in r.items()}
                      for name, r in sorted(regions.items(), key=lambda x: -max(x[1]["sass"], x[1]["ptx"]))
                      if r["ptx"] or r["sass"]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", default="mma_gemm", help="a shipped kernel the interpreter runs (mma_gemm)")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                    help="a build parameter (repeatable)")
    ap.add_argument("--mnk", required=True, help="M,N,K of the problem")
    ap.add_argument("--ld", help="lda,ldb,ldc (default: each stored matrix's row length)")
    ap.add_argument("--block", default="0,0", help="x,y of the block to run (default 0,0)")
    ap.add_argument("--no-sass", action="store_true", help="PTX counts only (no ptxas, no nvdisasm)")
    ap.add_argument("--top", type=int, default=16, help="regions listed (default 16)")
    ap.add_argument("--json", help="write the figures as JSON to this file ('-': standard output)")
    args = ap.parse_args(argv)
    try:
        defines = dict(d.split("=", 1) for d in args.defines)
        m, n, k = (int(x) for x in args.mnk.split(","))
        lds = tuple(int(x) for x in args.ld.split(",")) if args.ld else None
        block = tuple(int(x) for x in args.block.split(","))
        if min(m, n, k) < 1 or (lds and len(lds) != 3) or len(block) != 2:
            raise ValueError
    except ValueError:
        print("block_issue_count: -D NAME=VALUE, --mnk M,N,K (each >= 1), --ld lda,ldb,ldc, --block x,y",
              file=sys.stderr)
        return 2
    from asmgemm.errors import AsmError
    try:
        out = count(args.kernel, defines, m, n, k, lds, block, not args.no_sass)
    except AsmError as e:
        print(e.format(), file=sys.stderr)
        return 1
    if args.json == "-":
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    est = out.get("sass_per_warp_estimate")
    print(f"{args.kernel} {out['mnk']} ld {out['ld']} block {out['block']}: {out['ptx_per_warp']} PTX instructions a warp"
          + (f", ~{est} SASS (estimate)" if est is not None else ""))
    for name, r in list(out["regions"].items())[:args.top]:
        print(f"  {name:32s} PTX {r['ptx']:8.1f}" + (f"   SASS {r['sass']:8.1f}" if est is not None else ""))
    if est is not None:
        print("  SASS opcodes:", ", ".join(f"{o} {v:.0f}" for o, v in list(out["sass_opcodes"].items())[:20]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
