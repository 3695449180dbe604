"""Which of a build's ptxas runs ships: ptxas's defaults, or one of the source's
`.ptxas_alternative "OPTIONS"` sets (pipeline.assemble runs each).

Why: ptxas allocates registers for the whole kernel at once, so code far from the main loop moves
the loop's registers. In sgemm.sasm the cluster sum after the loop (CLUSTER_K > 1) left 54 of the
t128x128 nt loop's FFMAs with all three sources in one register bank (1 without it), and the build
ran ~10% slower per block on the H200 than the same loop built for the reduce kernel. With
--register-usage-level=0 that build's loop has none; but on other builds the same option adds
conflicts or issue slots (sgemm's cp.async 64x64 nn loop: 0 -> 37). No one setting is right for
every build, so each build is assembled both ways and judged by what the SASS inspector models.

The judgement, per trial: every kernel's main loop (SassKernel.main_loop: its largest by
instruction count, a GEMM's K loop), the issue cycles the
inspector models for it (sass.analysis.summarise: stall counts plus one per register-bank conflict)
summed over the kernels. A trial replaces the defaults only if it models at least MARGIN fewer
cycles, spills no more, and needs no more registers per thread at the allocation's granule
(REGISTER_GRANULE: the same or more blocks an SM). Timed both ways on the H200 (20 sgemm builds),
the choice took the faster or one within 1% on 19, and missed a 3% gain on one whose two loops
modelled 0.2% apart (docs/log/sgemm.md, "ptxas's register allocation, chosen per build").

Where the inspector cannot decode the target (it reads sm_90/sm_90a) or cannot run (no nvdisasm),
the defaults ship and the choice says why."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import AsmError
from .sass.inspect import DECODABLE_TARGETS, inspect_cubin

MARGIN = 0.01               # an alternative must model at least 1% fewer main-loop issue cycles
REGISTER_GRANULE = 8        # registers a thread is given in steps of this many (a warp's 256)


@dataclass(frozen=True)
class Trial:
    """One ptxas run of the build: its options ((): ptxas's defaults) and what the inspector
    modelled of its main loops."""
    options: tuple[str, ...]
    loop_issue_cycles: int | None       # None: not modelled (a target the inspector cannot decode)
    loop_bank_conflicts: int | None
    registers: int                      # the most any kernel of the module uses
    spills: int                         # spill stores and loads, all kernels
    unmodelled: str = ""                # why loop_issue_cycles is None

    def to_json(self) -> dict:
        return {"options": list(self.options), "loop_issue_cycles": self.loop_issue_cycles,
                "loop_bank_conflicts": self.loop_bank_conflicts, "registers": self.registers,
                "spills": self.spills, **({"unmodelled": self.unmodelled} if self.unmodelled else {})}


@dataclass(frozen=True)
class PtxasChoice:
    trials: tuple[Trial, ...]           # the defaults first, then each alternative in source order
    chosen: int                         # index into trials
    why: str

    @property
    def options(self) -> tuple[str, ...]:
        return self.trials[self.chosen].options

    def to_json(self) -> dict:
        return {"chosen": list(self.options), "why": self.why, "trials": [t.to_json() for t in self.trials]}

    def describe(self) -> str:
        shown = " ".join(self.options) or "ptxas's defaults"
        return f"ptxas options: {shown} ({self.why})"


def trial(options: tuple[str, ...], cubin: bytes, target: str, kernels: list) -> Trial:
    """The Trial of one ptxas run: `kernels` are its KernelResources (ptxas -v)."""
    registers = max((k.registers for k in kernels), default=0)
    spills = sum(k.spill_stores + k.spill_loads for k in kernels)
    if target not in DECODABLE_TARGETS:
        return Trial(options, None, None, registers, spills,
                     f"the SASS inspector reads {'/'.join(DECODABLE_TARGETS)} cubins, not {target}'s")
    try:
        report = inspect_cubin(cubin, target)
    except AsmError as exc:             # nvdisasm missing or failing: ptxas's defaults ship, and say why
        return Trial(options, None, None, registers, spills, f"the SASS inspector failed: {exc.message}")
    cycles = conflicts = 0
    for kernel in report.kernels.values():
        i = kernel.main_loop()
        if i is not None:
            cycles += kernel.loop_summaries[i].issue_cycles
            conflicts += kernel.loop_summaries[i].bank_conflicts
    return Trial(options, cycles, conflicts, registers, spills)


def granule(registers: int) -> int:
    return -(-registers // REGISTER_GRANULE) * REGISTER_GRANULE


def choose(trials: list[Trial]) -> PtxasChoice:
    """The trial that ships (module docstring): the defaults (trials[0]) unless an alternative
    models MARGIN fewer main-loop issue cycles than the best so far without more spills or a
    larger register granule than the defaults'."""
    base = trials[0]
    if base.loop_issue_cycles is None:
        return PtxasChoice(tuple(trials), 0, f"not modelled ({base.unmodelled or 'no loop cycles'}): "
                           "ptxas's defaults")
    best, notes = 0, []
    for i, t in enumerate(trials[1:], 1):
        name = " ".join(t.options)
        if t.loop_issue_cycles is None:
            notes.append(f"{name}: not modelled")
        elif t.spills > base.spills:
            notes.append(f"{name}: {t.spills} spills against {base.spills}")
        elif granule(t.registers) > granule(base.registers):
            notes.append(f"{name}: {t.registers} registers against {base.registers}")
        elif t.loop_issue_cycles <= trials[best].loop_issue_cycles * (1 - MARGIN):
            best = i
    chosen = trials[best]
    if best == 0:
        others = ", ".join(f"{' '.join(t.options)} {t.loop_issue_cycles}" for t in trials[1:]
                           if t.loop_issue_cycles is not None)
        why = f"main loop {base.loop_issue_cycles} issue cycles modelled, no alternative 1% fewer" + (
            f": {others}" if others else "")
    else:
        why = (f"main loop {chosen.loop_issue_cycles} issue cycles modelled against {base.loop_issue_cycles} "
               f"with ptxas's defaults ({chosen.loop_bank_conflicts} bank conflicts against "
               f"{base.loop_bank_conflicts})")
    if notes:
        why += "; refused: " + "; ".join(notes)
    return PtxasChoice(tuple(trials), best, why)
