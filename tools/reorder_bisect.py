#!/usr/bin/env python3
"""Find the move of the SASS reorder pass that makes a kernel wrong on the GPU (issue 35).

The reorder pass (asmgemm.sass.reorder_pass, EXPERIMENTAL) gives a wrong sgemm on the H100 at the
configuration the dispatch picks for 4096^3 (BK=16 RQ=4 LOAD_AHEAD=1), although its check accepts
it. This script narrows that down to one instruction, with the pass's own partial application
(plan_patch's reorder_blocks / reorder_moves, sass_patch keys of the same names; ReorderLimit):

  1. the dispatch's configuration for --shape (as tools/variant_ab.py --from-dispatch takes it);
  2. ptxas's code must be right and the whole pass wrong at every --check-shape (else: not
     reproduced, exit 3);
  3. bisect N = the number of candidate blocks reordered (the blocks the pass's model says gain, in
     block-index order): the smallest N that is wrong is the guilty block;
  4. bisect M = the positions of that block's new order kept from its first change (the rest in
     ptxas's order): the smallest M that is wrong puts one instruction, the guilty move, ahead of
     the ptxas instructions it jumped over; one of those pairs is the missing dependency.

Each probe is a copy of the kernel's table with a sass_patch (variant_ab.variant_kernel), built by
the runtime (ptxas's cubin comes from the build memo, the pass's graph and schedules are derived
once per process: reorder_pass.prepare_reorder) and launched by asmgemm.gemm with the dispatch's
parameters at every check shape, C poisoned with NaN first, against cupy.matmul in fp32
(rel err < --tol is right). A probe whose limited block the check put back (or that otherwise did
not get the asked order) is marked "applied": false in the JSON.

Output: the probes, the guilty block and move, the instructions it jumped over, and the SASS
around it (ptxas's, the last right probe's, the first wrong probe's), printed and with --json.

Usage (GPU, one device command, from the project root):
    source tools/device_setup.sh >/dev/null || exit 1
    python3 tools/reorder_bisect.py sgemm --shape 4096,4096,4096 --json $OUT/bisect.json

Exit status: 0 guilty move found; 1 usage, build or GPU error; 3 not reproduced (the whole pass
gives the right result, or ptxas's code does not); 4 stopped by --budget-s or a fault before the
end (the interval found so far is reported).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

from asmgemm.errors import AsmError
from asmgemm.files import write_atomic
from asmgemm.isa import control_bits as cb

# --- the CPU parts (tests/test_reorder_bisect.py) ------------------------------------------------


class OutOfBudget(Exception):
    """The time budget ran out before the next probe."""


class Bisection:
    """The search for the smallest wrong n: is_bad(good) was false, is_bad(bad) true. (Plain
    classes here, not dataclasses: tests load this script by path, outside sys.modules.)"""

    def __init__(self, good: int, bad: int):
        self.good, self.bad = good, bad
        self.probes: list[tuple[int, bool]] = []
        self.finished = False
        self.stopped: str | None = None         # why the search ended early


def bisect_boundary(good: int, bad: int, is_bad: Callable[[int], bool]) -> Bisection:
    """Given is_bad(good) false and is_bad(bad) true (good < bad; neither is probed again), the n
    with is_bad(n) true and is_bad(n - 1) false that binary search reaches: the smallest wrong n
    where is_bad is monotone, and an observed good/bad boundary where it is not. is_bad may raise
    OutOfBudget: the interval so far comes back with finished false."""
    if good >= bad:
        raise ValueError(f"bisect_boundary: good ({good}) must be below bad ({bad})")
    out = Bisection(good, bad)
    while out.bad - out.good > 1:
        mid = (out.good + out.bad) // 2
        try:
            wrong = is_bad(mid)
        except OutOfBudget as exc:
            out.stopped = str(exc)
            return out
        out.probes.append((mid, wrong))
        if wrong:
            out.bad = mid
        else:
            out.good = mid
    out.finished = True
    return out


def jumped_over(start: int, end: int, order: list[int], kept: int) -> list[int]:
    """The ptxas indices of block [start, end) that the instruction at position kept - 1 of `order`
    (the limited order with `kept` positions of the new order) now precedes but followed in ptxas's
    code: the partners of the pairs a guilty move reordered."""
    head = order[:kept]
    moved = head[-1]
    taken = set(head)
    return [k for k in range(start, moved) if k not in taken]


_CONTROL_MASK = 0
for _f in cb.CONTROL_FIELDS:
    _CONTROL_MASK |= _f.mask << _f.lo


def instruction_bits(word: int) -> int:
    """A 128-bit word without its control fields (stall, yield, scoreboards, wait mask, reuse):
    what stays the same when the pass moves an instruction and recomputes its codes."""
    return word & ~_CONTROL_MASK


def order_applied(input_words: list[int], probe_words: list[int], start: int, end: int,
                  expected: list[int]) -> bool:
    """Whether block [start, end) of the probe's words holds the input's instructions in `expected`
    order (control fields aside: stalls and reuse flags are recomputed)."""
    return [instruction_bits(probe_words[i]) for i in range(start, end)] == \
        [instruction_bits(input_words[k]) for k in expected]


def sass_line(ins) -> str:
    """One instruction as nvdisasm prints it, with its control fields spelled out."""
    wait = "".join(str(i) if ins.wait_mask >> i & 1 else "-" for i in range(cb.NUM_SCOREBOARDS))
    sb = (f"W{ins.write_sb if ins.write_sb is not None else '-'} "
          f"R{ins.read_sb if ins.read_sb is not None else '-'}")
    return f"{ins.address:#07x}  S{ins.stall:02d}{'Y' if ins.yield_ else ' '} {sb} B{wait}  {ins.text}"


def window(instructions, center: int, lo: int, hi: int, radius: int) -> list[str]:
    """sass_line of instructions[max(lo, center - radius) : min(hi, center + radius + 1)], the
    center marked."""
    out = []
    for k in range(max(lo, center - radius), min(hi, center + radius + 1)):
        out.append(("=> " if k == center else "   ") + sass_line(instructions[k]))
    return out


# --- the GPU run ---------------------------------------------------------------------------------


class Probe:
    """One variant's run: its relative error per check shape, and the cubin the runtime built."""

    def __init__(self, name: str, patch: dict, errors: dict[str, float], bad: bool, seconds: float, cubin: str):
        self.name, self.patch, self.errors, self.bad = name, patch, errors, bad
        self.seconds, self.cubin = seconds, cubin
        self.applied: bool | None = None    # the limited block holds the asked order (None: not checked)

    def to_json(self) -> dict:
        return {"name": self.name, "sass_patch": self.patch, "rel_err": self.errors, "bad": self.bad,
                "seconds": round(self.seconds, 1), "applied": self.applied, "cubin": self.cubin}


class Prober:
    """Builds and runs one sass_patch variant of the configuration at every check shape."""

    def __init__(self, cp, spec, params: dict, defines: dict, target: str, shapes, layout: str, tol: float,
                 deadline: float):
        from variant_ab import _operands        # the same operands as the A/B tool
        self.cp, self.spec, self.params, self.defines, self.target = cp, spec, params, defines, target
        self.tol, self.deadline = tol, deadline
        self.cases = []
        for s in shapes:
            a, b, ta, tb = _operands(cp, spec, s.m, s.n, s.k, layout, seed=s.m * 7 + s.n * 3 + s.k)
            op_a, op_b = (a.T if ta else a), (b.T if tb else b)
            ref = cp.matmul(op_a.astype(cp.float32), op_b.astype(cp.float32))
            self.cases.append((f"{s.m}x{s.n}x{s.k}", a, b, ta, tb, ref))
        self.probes: list[Probe] = []

    def run(self, name: str, patch: dict) -> Probe:
        from variant_ab import variant_kernel
        from asmgemm.kernel_spec import get_spec
        from asmgemm.runtime.build_cache import build_kernel
        from asmgemm.runtime.gemm import gemm, last_launch

        if time.monotonic() > self.deadline:
            raise OutOfBudget(f"the time budget ran out before probe {name}")
        cp = self.cp
        t0 = time.monotonic()
        kernel = variant_kernel(self.spec, name, patch)
        errors = {}
        for label, a, b, ta, tb, ref in self.cases:
            c = cp.full(ref.shape, cp.nan, dtype=cp.dtype(self.spec.dtypes.c))
            gemm(a, b, c, trans_a=ta, trans_b=tb, params=self.params, kernel=kernel)
            ran = last_launch()
            if ran["params"] != self.defines or (ran["sass_patch"] or {}) != patch:
                raise AsmError(f"probe {name} ran {ran['params']} with sass_patch {ran['sass_patch']}, "
                               f"not the configuration {self.defines} with {patch}")
            cp.cuda.get_current_stream().synchronize()
            errors[label] = float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref))
        built = build_kernel(get_spec(kernel), self.defines, self.target)    # the build gemm just ran
        bad = any(not e < self.tol for e in errors.values())     # NaN is wrong too
        probe = Probe(name, patch, errors, bad, time.monotonic() - t0, built.cubin_path)
        self.probes.append(probe)
        shown = "  ".join(f"{k} {v:.1e}" for k, v in errors.items())
        print(f"probe {name:<16} {'WRONG' if bad else 'right'}  {shown}  ({probe.seconds:.1f} s)", flush=True)
        return probe


def _words(path: str, kernel: str) -> list[int]:
    from asmgemm.sass.elf import ElfCubin
    return ElfCubin(Path(path).read_bytes(), path).words(kernel)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", nargs="?", default="sgemm", help="kernel spec name (default sgemm)")
    ap.add_argument("--shape", default="4096,4096,4096", help="M,N,K whose dispatch picks the configuration")
    ap.add_argument("--check-shape", action="append",
                    help="M,N,K run by every probe with that configuration (repeatable; default 512,512,512 "
                         "and --shape)")
    ap.add_argument("--layout", choices=("nn", "nt", "tn", "tt"), default="nn")
    ap.add_argument("--tol", type=float, default=1e-4, help="relative error below which a result is right")
    ap.add_argument("--budget-s", type=float, default=270.0,
                    help="stop probing after this many seconds and report the interval so far (default 270)")
    ap.add_argument("--block", type=int, metavar="N",
                    help="skip the block search: the guilty block is candidate N (1-based), as an earlier run "
                         "that ran out of budget found it")
    ap.add_argument("--radius", type=int, default=12, help="instructions shown each side of the guilty one")
    ap.add_argument("--json", metavar="OUT", help="write the result as JSON to OUT")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))     # variant_ab.py, beside this script
    from asmgemm.bench.shapes import parse_shape
    try:
        shape = parse_shape(args.shape.replace(",", "x"))
        checks = [parse_shape(s.replace(",", "x")) for s in (args.check_shape or ["512,512,512", args.shape])]
    except (ValueError, AsmError) as exc:
        ap.error(str(exc))
    deadline = time.monotonic() + args.budget_s
    result: dict = {"kernel": args.kernel, "tol": args.tol, "finished": False}
    try:
        code = _bisect(args, shape, checks, deadline, result)
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        result["error"] = exc.message
        code = 1
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=1) + "\n")
    return code


def _bisect(args, shape, checks, deadline: float, result: dict) -> int:
    from variant_ab import _operands, dispatch_params
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.build_cache import build_kernel
    from asmgemm.runtime.gemm import last_launch
    from asmgemm.runtime.gpu import require_gpu
    from asmgemm.sass.code_references import code_references
    from asmgemm.sass.inspect import inspect_cubin
    from asmgemm.sass.patch import load_kernels
    from asmgemm.sass.reorder_pass import changed_span, limited_order, prepare_reorder
    from asmgemm.scheduler.latencies_sm90 import timing_table
    from asmgemm.isa.arch import arch_for

    cp = require_gpu("reorder_bisect.py")
    spec = get_spec(args.kernel)
    a, b, ta, tb = _operands(cp, spec, shape.m, shape.n, shape.k, args.layout, seed=1)
    params = dispatch_params(spec, a, b, cp.empty((shape.m, shape.n), dtype=cp.dtype(spec.dtypes.c)), ta, tb)
    if params is None:
        raise AsmError(f"the dispatch sends {shape.m}x{shape.n}x{shape.k} to another kernel than {spec.name}")
    ran = last_launch()
    defines, target = ran["params"], ran["target"]
    result["config"] = {"shape": [shape.m, shape.n, shape.k], "layout": args.layout, "params": params,
                        "defines": defines, "target": target, "config": ran["config"],
                        "check_shapes": [[s.m, s.n, s.k] for s in checks]}
    print(f"{spec.name} at {shape.m}x{shape.n}x{shape.k} {args.layout}: {ran['config']} {params} ({target})")

    # the pass's candidates and their orders, from ptxas's cubin (the runtime's plan_patch calls
    # of the probes find the same graph and schedules: prepare_reorder keeps them per process)
    plain = build_kernel(spec, defines, target)
    data = Path(plain.cubin_path).read_bytes()
    elf, kernels, cubin_target = load_kernels(data, plain.cubin_path)
    name = spec.entry
    kernel = kernels[name]
    table, _note = timing_table(arch_for(cubin_target))
    prepared = prepare_reorder(kernel, code_references(elf, name), table, cubin_target)
    candidates = prepared.candidates(kernel)
    blocks = kernel.blocks
    result["candidates"] = [{"block": bi, "start": f"{16 * blocks[bi].start:#06x}",
                             "end": f"{16 * blocks[bi].end:#06x}",
                             "first_change": changed_span(blocks[bi], prepared.schedules[bi][0])[0],
                             "span": changed_span(blocks[bi], prepared.schedules[bi][0])[1]} for bi in candidates]
    print(f"{len(candidates)} candidate block(s): " +
          ", ".join(f"{c['block']}@{c['start']} span {c['span']}" for c in result["candidates"]))
    input_words = [i.word for i in kernel.instructions]

    prober = Prober(cp, spec, params, defines, target, checks, args.layout, args.tol, deadline)
    result["probes"] = [p.to_json() for p in prober.probes]

    def record():
        result["probes"] = [p.to_json() for p in prober.probes]

    try:
        base = prober.run("ptxas", {})
        full = prober.run("ro_all", {"experimental_reorder": True})
    except OutOfBudget as exc:
        record()
        result["stopped"] = str(exc)
        return 4
    record()
    if base.bad or not full.bad or not candidates:
        result["note"] = ("ptxas's code is wrong here: the harness, not the pass" if base.bad else
                          "the whole reorder pass gives the right result: not reproduced" if full.bad is False
                          else "no candidate block")
        print(result["note"])
        return 3

    def probe_blocks(n: int) -> bool:
        if n == len(candidates):
            return full.bad
        return prober.run(f"ro_b{n}", {"experimental_reorder": True, "reorder_blocks": n}).bad

    if args.block is not None:
        if not 1 <= args.block <= len(candidates):
            raise AsmError(f"--block {args.block}: there are {len(candidates)} candidate blocks (1..{len(candidates)})")
        blocks_search = Bisection(args.block - 1, args.block)
        blocks_search.finished = True           # given, not searched (result["block_search"] says so)
    else:
        blocks_search = bisect_boundary(0, len(candidates), probe_blocks)
    record()
    result["block_search"] = {"good": blocks_search.good, "bad": blocks_search.bad, "probes": blocks_search.probes,
                              "finished": blocks_search.finished, "given": args.block is not None}
    if not blocks_search.finished:
        result["stopped"] = blocks_search.stopped
        print(f"stopped: {blocks_search.stopped}; the guilty block is among candidates "
              f"{blocks_search.good + 1}..{blocks_search.bad}")
        return 4
    n_blocks = blocks_search.bad
    bi = candidates[n_blocks - 1]
    blk = blocks[bi]
    order = prepared.schedules[bi][0]
    first, span = changed_span(blk, order)
    result["guilty_block"] = {**result["candidates"][n_blocks - 1], "reorder_blocks": n_blocks}
    print(f"guilty block: candidate {n_blocks}, block {bi} at {16 * blk.start:#06x}..{16 * blk.end:#06x} "
          f"({span} positions from its first change)")

    def limited(m: int) -> dict:
        return {"experimental_reorder": True, "reorder_blocks": n_blocks, "reorder_moves": m}

    def probe_moves(m: int) -> bool:
        p = prober.run(f"ro_b{n_blocks}_m{m}", limited(m))
        p.applied = order_applied(input_words, _words(p.cubin, name), blk.start, blk.end,
                                  limited_order(blk, order, m))
        return p.bad

    try:
        whole_block_bad = probe_moves(span)
    except OutOfBudget as exc:
        record()
        result["stopped"] = str(exc)
        return 4
    if not whole_block_bad:
        record()
        result["note"] = (f"block {bi}'s whole new order as the last limited block is right, though "
                          f"reorder_blocks={n_blocks} is wrong: the gain test or the check changed it there")
        print(result["note"])
        return 3
    moves_search = bisect_boundary(0, span, probe_moves)
    record()
    result["move_search"] = {"good": moves_search.good, "bad": moves_search.bad, "probes": moves_search.probes,
                             "finished": moves_search.finished}
    if not moves_search.finished:
        result["stopped"] = moves_search.stopped
        print(f"stopped: {moves_search.stopped}; the guilty move is among moves "
              f"{moves_search.good + 1}..{moves_search.bad} of block {bi}")
        return 4
    m = moves_search.bad
    kept = first + m
    bad_order = limited_order(blk, order, m)
    moved = bad_order[kept - 1]
    partners = jumped_over(blk.start, blk.end, bad_order, kept)
    ins = kernel.instructions
    result["guilty_move"] = {
        "reorder_moves": m, "instruction": ins[moved].text, "ptxas_address": f"{ins[moved].address:#06x}",
        "new_address": f"{16 * (blk.start + kept - 1):#06x}",
        "jumped_over": [{"address": f"{ins[k].address:#06x}", "instruction": ins[k].text} for k in partners]}
    print(f"guilty move: {ins[moved].address:#06x} {ins[moved].text} -> {16 * (blk.start + kept - 1):#06x}, "
          f"now ahead of {len(partners)} instruction(s) it followed:")
    for k in partners:
        print(f"    {ins[k].address:#06x} {ins[k].text}")
    good_cubin = next((p.cubin for p in prober.probes if p.patch == limited(m - 1)), None) if m > 1 else None
    if good_cubin is None:      # m - 1 = 0 moves: the block as the previous limit left it
        good_cubin = next((p.cubin for p in prober.probes
                           if p.patch == {"experimental_reorder": True, "reorder_blocks": n_blocks - 1}),
                          base.cubin if n_blocks == 1 else None)
    bad_cubin = next(p.cubin for p in prober.probes if p.patch == limited(m))
    sass = {"ptxas": window(ins, moved, blk.start, blk.end, args.radius)}
    for label, path in (("last_right", good_cubin), ("first_wrong", bad_cubin)):
        if path is None:
            continue
        probe_ins = inspect_cubin(Path(path).read_bytes(), source=path, line_info=False).kernels[name].instructions
        sass[label] = window(probe_ins, blk.start + kept - 1, blk.start, blk.end, args.radius)
    result["sass"] = sass
    for label, lines in sass.items():
        print(f"-- {label}:")
        print("\n".join(lines))
    result["finished"] = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
