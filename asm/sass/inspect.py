"""The SASS inspector's entry points: what ptxas really produced for a build or a cubin.

    inspect_cubin(cubin, target)  -> SassReport    (a cubin from anywhere; sm_90/sm_90a)
    inspect_build(traced_build)   -> SassReport    (a build the pipeline assembled with line info)

Steps: check the ELF (sass/cubin.py), nvdisasm listing (sass/listing.py), decode each instruction
and its control bits (sass/decode.py, isa/control_bits.py), basic blocks and loops (sass/cfg.py),
banks / reuse / summaries (sass/analysis.py).

For a build, `asmgemm.pipeline.assemble_traced` hands over the PTX emitted with trace mode
"ptx-lines" (a `.loc` per instruction pointing at its own PTX line) and the cubin ptxas made of it
with -lineinfo, so every SASS instruction carries the PTX line it came from, that instruction's
position in its function (the register planner's position) and the .sasm location.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import AsmError
from ..isa import control_bits as cb
from ..isa.arch import ARCHS, arch_for
from .. import toolchain
from .analysis import Summary, analyse_banks, summarise
from .cfg import BasicBlock, Loop, build_blocks, find_loops, resolve_branch_targets
from .cubin import CubinFunction, CubinInfo, read_cubin
from .decode import SassInstruction, decode
from .listing import disassemble_listing

# The targets whose cubins the decoder knows (Arch.sass_decodable): sm_90 and sm_90a.
DECODABLE_TARGETS = tuple(a.name for a in ARCHS.values() if a.sass_decodable)
_DECODABLE = "/".join(DECODABLE_TARGETS)

YIELD_NOTE = ("yield: shown `Y` (and yield=true in JSON) when the yield hint is on, i.e. bit 109 of "
              "the instruction is 0 (CuAssembler/maxas convention); yield_bit is the raw bit")


@dataclass
class SassKernel:
    name: str
    target: str
    instructions: list[SassInstruction]
    blocks: list[BasicBlock]
    loops: list[Loop]
    summary: Summary
    loop_summaries: list[Summary]
    resources: CubinFunction | None = None
    indirect_branches: bool = False
    labels: dict[str, int] = field(default_factory=dict)   # nvdisasm label -> address

    def loop_instructions(self, loop: Loop) -> list[SassInstruction]:
        return [self.instructions[i] for i in loop.instruction_indices(self.blocks)]

    def main_loop(self) -> int | None:
        """The index (into loops and loop_summaries) of the kernel's largest loop by instruction
        count, its main loop: a GEMM's K loop, beside which a loop its epilogue runs twice weighs
        nothing; None without loops."""
        if not self.loops:
            return None
        return max(range(len(self.loops)), key=lambda j: self.loop_summaries[j].instructions)

    def to_json(self, only_loops: bool = False) -> dict:
        loops = []
        for lp, s in zip(self.loops, self.loop_summaries):
            d = {"index": lp.index, "depth": lp.depth, "parent": lp.parent,
                 "header_address": f"{self.instructions[self.blocks[lp.header].start].address:#06x}",
                 "blocks": lp.blocks, "summary": s.to_json()}
            if only_loops:
                d["instructions"] = [i.to_json() for i in self.loop_instructions(lp)]
            loops.append(d)
        out = {"name": self.name, "target": self.target, "summary": self.summary.to_json(),
               "loops": loops, "indirect_branches": self.indirect_branches}
        if not only_loops:
            out["blocks"] = [b.to_json(self.instructions) for b in self.blocks]
            out["instructions"] = [i.to_json() for i in self.instructions]
        return out


@dataclass
class SassReport:
    target: str
    kernels: dict[str, SassKernel]
    bank_model: str
    nvdisasm: str
    source: str | None = None
    ptx: str | None = None                # the PTX that was assembled (builds only)
    ptxas_kernels: list = field(default_factory=list)

    def to_json(self, only_loops: bool = False) -> dict:
        return {"source": self.source, "target": self.target, "bank_model": self.bank_model,
                "nvdisasm": self.nvdisasm, "notes": [YIELD_NOTE, ISSUE_NOTE],
                "control_bits": cb.layout_table(),
                "kernels": [k.to_json(only_loops) for k in self.kernels.values()]}


ISSUE_NOTE = ("issue_cycles: sum over instructions of max(stall, 1) plus one per bank conflict; "
              "no dual issue, no scoreboard waits (variable latencies are not modelled)")


def check_cubin(info: CubinInfo, source: str) -> None:
    if not any(ARCHS[t].number == info.sm for t in DECODABLE_TARGETS):
        raise AsmError(f"{source}: this cubin is for sm_{info.sm}; the SASS inspector decodes {_DECODABLE} only",
                       hint=f"rebuild it with ptxas -arch={' (or '.join(DECODABLE_TARGETS)}), or give the .ptx / .sasm")


def check_target(target: str) -> None:
    arch = ARCHS.get(target)
    if arch is None or not arch.sass_decodable:
        raise AsmError(f"the SASS inspector decodes {_DECODABLE} only, not {target}",
                       hint=f"use --target {' or '.join(DECODABLE_TARGETS)}")


def inspect_cubin(cubin: bytes, target: str | None = None, *, source: str = "<cubin>",
                  line_info: bool | None = None) -> SassReport:
    """Decode a sm_90/sm_90a cubin. `target` (if given) must name the cubin's architecture."""
    info = read_cubin(cubin, source)
    check_cubin(info, source)
    if target is not None:
        check_target(target)
        if arch_for(target).number != info.sm:
            raise AsmError(f"{source}: cubin is for sm_{info.sm}, not {target}")
    toolchain.find_tool("nvdisasm")          # a missing nvdisasm is named before any other work
    listing = disassemble_listing(cubin, info.has_line_info if line_info is None else line_info)
    real_target = listing.target or target or f"sm_{info.sm}"
    model = arch_for(real_target).bank_model
    kernels: dict[str, SassKernel] = {}
    for name, raw in listing.functions.items():
        instrs = []
        for r in raw.instructions:
            try:
                ins = decode(r.address, r.text, r.lo, r.hi)
            except ValueError as exc:
                raise AsmError(f"{source}: {name} {r.address:#06x}: {exc}") from None
            ins.live_registers = r.live.get("GPR")
            ins.live_predicates = r.live.get("PRED")
            ins.live_uniform = r.live.get("UGPR")
            if r.line is not None:
                ins.debug_line = f"{r.line_file}:{r.line}"
                if (r.line_file or "").endswith(".ptx"):
                    ins.ptx_line = r.line
            instrs.append(ins)
        indirect = resolve_branch_targets(instrs, raw.labels)
        blocks = build_blocks(instrs)
        loops = find_loops(blocks)
        for lp in loops:
            for k in lp.instruction_indices(blocks):
                instrs[k].loops.append(lp.index)
        analyse_banks(instrs, blocks, model)
        fn = info.functions.get(name)
        summary = summarise(instrs)
        if fn is not None:
            summary.extra = {"registers": fn.registers, "shared_bytes": fn.shared_bytes,
                             "reserved_shared_bytes": fn.reserved_shared_bytes,
                             "stack_frame_bytes": fn.frame_bytes, "entry": fn.entry}
        summary.extra["loops"] = len(loops)
        loop_summaries = [summarise([instrs[k] for k in lp.instruction_indices(blocks)]) for lp in loops]
        kernels[name] = SassKernel(name, real_target, instrs, blocks, loops, summary, loop_summaries, fn, indirect,
                                   dict(raw.labels))
    return SassReport(real_target, kernels, model.name, toolchain.tool_version("nvdisasm"), source)


_FUNC_HEADER = re.compile(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$]*)")
_LOC = re.compile(r"^\s*\.loc\s+1\s+(\d+)\s+\d+")


def ptx_positions(ptx: str) -> dict[int, tuple[str, int]]:
    """For PTX emitted in "ptx-lines" mode: PTX line -> (function, position of the instruction in
    the function, in program order). Each instruction is preceded by `.loc 1 <its line> 1`."""
    out: dict[int, tuple[str, int]] = {}
    fn, pos = None, 0
    for line in ptx.splitlines():
        m = _FUNC_HEADER.search(line)
        if m and not line.lstrip().startswith("//"):
            fn, pos = m.group(1), 0
            continue
        m = _LOC.match(line)
        if m and fn is not None:
            out[int(m.group(1))] = (fn, pos)
            pos += 1
    return out


def inspect_build(traced) -> SassReport:
    """Decode a build that the pipeline assembled with line information
    (`asmgemm.pipeline.assemble_traced`): every instruction gets its PTX line, the PTX
    instruction's position in its function and its .sasm location. The inspector inspects; the
    pipeline builds."""
    result, asm = traced.build, traced.assembled
    if result.options.trace != "ptx-lines":
        raise ValueError("inspect_build needs a build traced with 'ptx-lines' (pipeline.assemble_traced)")
    check_target(result.target)
    toolchain.find_tool("nvdisasm")
    report = inspect_cubin(asm.cubin, result.target, source=result.source.path, line_info=True)
    report.ptx = result.ptx
    report.ptxas_kernels = asm.kernels
    positions = ptx_positions(result.ptx)
    by_name = {k.name: k for k in asm.kernels}
    for kernel in report.kernels.values():
        for ins in kernel.instructions:
            if ins.ptx_line is None:
                continue
            where = positions.get(ins.ptx_line)
            if where is not None and where[0] == kernel.name:
                ins.ptx_index = where[1]
            span = result.emitted.span_for_line(ins.ptx_line)
            if span is not None:
                ins.source = span.location()
        res = by_name.get(kernel.name)
        if res is not None:
            kernel.summary.extra.update({"spill_stores_bytes": res.spill_stores, "spill_loads_bytes": res.spill_loads,
                                         "local_bytes": res.local_bytes, "barriers": res.barriers})
    return report
