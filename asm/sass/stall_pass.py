"""The stall and yield pass (issue 35, point 3, second of three): lower stall counts to what the
measured latencies need, and place yield hints on the hot arithmetic of loops as DeepGEMM's FFMA
interleave did. Opt-in only (`asmgemm patch CUBIN --stall-pass [--yield-every N] -o OUT`, or
`plan_patch(..., stall_pass=True, yield_every=N)`, a table's `sass_patch`). On the H100
(2026-11-27) it won nothing: sgemm 8192³ 52.4 against ptxas's 52.8 TFLOP/s, hgemm and mma_gemm
unchanged; yields on every 2nd/4th/8th FFMA cost 13/5/0.5% (the reuse hits they void). A plan's
summary still says `"measured": false`: its own cubin was not timed (docs/design/sass-patching.md).

Pure: `plan_stall_yield(kernel, words, table, ...)` takes one kernel's current instruction words and
returns new words and a summary; nothing is read from or written to disk.

Stall tightening
----------------
A stall count is the minimum number of cycles before the warp's next instruction issues (maxas
wiki "Control-Codes"; Jia et al. 2018, isa/control_bits.py STALL). The distance from a producer P
to a consumer X on a path is the sum of max(stall, 1) over P and every instruction before X, as
the checker counts it (sass/hazards.py). For every fixed-latency producer (no write scoreboard)
the checker requires, on every path to every reader of its result, a distance of at least
min(latency, ptxas's distance on that path); the latency is the measured table's
(hazards.fixed_latencies), or, for an opcode the table does not know, ptxas's own spacing within
hazards.FIXED_HORIZON cycles. The pass enumerates those paths (a path cannot matter once it holds
`need` instructions: every instruction adds at least one cycle), keeps each path's slack (its
distance minus what it needs), and then, greedily in program order, lowers each candidate's stall
by the smallest slack of the paths through it, and takes what it lowered off those paths' slack.
A stall is never raised and never brought below 1 (stall 0 was dual issue on Maxwell; there is no
dual issue since Volta, so 0 gains nothing in the model and its meaning is not documented).
The result is then checked by the checker like any patch (plan_patch); a hazard there is a bug in
this pass (tests/test_sass_stall_pass.py holds it to that on every shipped kernel).

The pass is stricter than the checker in two places, both held to ptxas's own distance:
  - a pair the table does not cover (`_table_covers`): a predicate read as a guard or by a branch,
    a memory or barrier consumer, a warpgroup instruction. ptxas puts 13 cycles between an ISETP
    and the `@P0 EXIT` reading its predicate; the table's ISETP latency (4) was measured into SEL.
  - a write after write that the latencies cannot order: a later writer of shorter or unknown
    latency could land before the earlier result and be overwritten by it.

What is left alone, and why (the first reason that applies is what the summary counts):
  - branches, barriers and other control (BRA, EXIT, BAR, BSSY, BSYNC, WARPSYNC, DEPBAR, ...):
    maxas wiki "Control-Codes", Stall Counts: "Some instructions with no pipeline require a minimum
    stall count to operate correctly ... BAR, BRA, CAL, RET, and EXIT which require a stall count of
    at least 5"; which minimum sm_90 needs is not in any table we have.
  - memory instructions (LD*, ST*, ATOM*, RED*, LDGSTS, LDSM, ...): the same wiki: "Memory
    operations have delayed access to their operands", a timing the latency table does not hold;
    they are variable-latency and scoreboard-tracked as well.
  - S2R / CS2R / S2UR: nvdisasm decodes S2R's stall/yield bits through a table of allowed values
    (docs/design/sass-patching.md, "Not every control value is legal everywhere"), and the table's
    CS2R latency is an ESTIMATE, not a measurement.
  - the uniform datapath (U* opcodes): no uniform opcode has a latency in the table; the checker
    holds them to ptxas's spacing, so lowering one would only be refused (or be a guess).
  - any opcode without a fixed latency in the table (LEA, VIADD, PLOP3, F2F, MUFU, ...), for the
    same reason; measuring them (tools/sched_latency_ubench.py) is what would widen the pass.
  - an instruction that sets a write or read scoreboard, or waits on one: its timing is the
    scoreboard's, not the table's.
  - the instruction right before one that waits on a scoreboard: maxas wiki "Control-Codes", Write
    Dependency Barriers: "Barriers take one additional clock cycle to become active on top of the
    clock consumed by the instruction doing the setting. So you may need to also use a stall count
    of 2 if you intend to wait with the subsequent instruction" (and the same for read barriers).
    ptxas's stall of 2 before a wait is often exactly that; Jia et al. 2018 (ch. 2) describe the
    barrier fields but give no set-up delay, so the one measured statement is kept.
  - NOP: it writes nothing, so its stall is only there for timing ptxas wanted; the table's NOP
    latency is an ESTIMATE.
Throughput is not modelled: an opcode slower than one warp instruction per cycle (IMAD, DFMA on
some parts) is held back by the hardware itself (maxas wiki, Stall Counts: "though if you forget,
the hardware seems to do this for you automatically"), which costs cycles, never correctness.

Yield placement (`yield_every=N`, DeepGEMM's interleave)
---------------------------------------------------------
DeepGEMM (README "FFMA SASS interleaving"; deep_gemm/jit/interleave_ffma.py, removed in 2025 once
NVCC 12.9 did the interleave itself) flipped the yield bit of FFMAs in its FP8 kernels' promotion
loops on an interleaved pattern, and cleared their reuse flag with it, "registers cannot be reused
if the warp is yielded", for 10%+ in some cases. Here, inside each loop (the innermost one that
holds it), the FFMA and HMMA instructions are counted in program order and the N-th, 2N-th, ...
get the yield hint on; the others get it off. Instructions of other opcodes keep theirs.
  - Where the hint goes on, the instruction's reuse flags are cleared: a yield voids the reuse
    cache (isa/control_bits.py REUSE_NEEDS_YIELD_OFF; nvdisasm does not even print the flag). This
    is never a correctness issue: a reuse flag on I only lets I+1 read a source from the operand
    cache instead of the register file, which still holds the same value (no instruction between
    them writes it: the checker's rule 3), so clearing it can cost I+1 a register-bank read (the
    bank model counts it), never give it a wrong value.
  - A hint is not taken off an instruction with a stall of 12 or more: maxas wiki, Stall Counts,
    "For stalls 12-15 the yield hint is required to be set in addition to the stall count".
  - Every loop that had a yield keeps one (the checker's rule 4): where the pattern would leave a
    loop with none (fewer than N hot instructions), its last hot instruction gets the hint.
"""
from __future__ import annotations

import itertools

from dataclasses import dataclass, field

from ..isa import control_bits as cb
from ..isa.arch import arch_for
from ..isa.sass_registers import UNMODELLED_OPCODES
from .analysis import analyse_banks
from .hazards import CONTROL_OPCODES as _CONTROL, FIXED_HORIZON, MEMORY_OPCODE as _MEMORY, CodeFacts, \
    _variable_opcodes, fixed_latencies, late_read_paths, next_steps, table_covers as _table_covers
from .inspect import SassKernel

# The hot arithmetic of a GEMM loop: what DeepGEMM interleaved (FFMA) and its tensor-core twin.
HOT_OPCODES = frozenset({"FFMA", "HMMA"})
# maxas wiki, Stall Counts: stalls 12-15 need the yield hint set.
YIELD_REQUIRED_FROM_STALL = 12
MIN_STALL = 1

_SPECIAL_REGISTERS = frozenset({"S2R", "CS2R", "S2UR"})
_LEFT_ALONE = frozenset({"NOP"})

# Why a stall above 1 was kept (the summary's `left_alone` keys): the exclusions above, in the order
# `exclusion` tests them, and "needed by a latency" (a candidate with no slack on some path).
LEFT_ALONE_REASONS = ("control", "memory", "special register", "nop", "uniform datapath", "no table latency",
                      "sets a scoreboard", "waits on a scoreboard", "before a scoreboard wait",
                      "needed by a latency")


@dataclass
class StallYieldSummary:
    kernel: str
    stall_tightening: bool
    yield_every: int
    stalls_lowered: int = 0               # instructions whose stall went down
    cycles_removed: int = 0               # sum of those reductions (static, over reachable code)
    yields_set: int = 0
    yields_cleared: int = 0
    reuse_flags_cleared: int = 0
    loops: list[dict] = field(default_factory=list)     # {loop, instructions, issue_cycles: [before, after]}
    left_alone: dict[str, int] = field(default_factory=dict)   # reason -> instructions with stall > 1 kept

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "stall_tightening": self.stall_tightening,
                "yield_every": self.yield_every, "stalls_lowered": self.stalls_lowered,
                "cycles_removed": self.cycles_removed, "yields_set": self.yields_set,
                "yields_cleared": self.yields_cleared, "reuse_flags_cleared": self.reuse_flags_cleared,
                "loops": self.loops, "left_alone": self.left_alone, "measured": False}

    def line(self) -> str:
        loops = "; ".join(f"loop {lp['loop']} {lp['issue_cycles'][0]} -> {lp['issue_cycles'][1]}"
                          for lp in self.loops) or "no loops"
        return (f"stall/yield pass, {self.kernel}: {self.stalls_lowered} stall(s) lowered "
                f"({self.cycles_removed} cycle(s)), yield every {self.yield_every or '-'}: "
                f"{self.yields_set} set, {self.yields_cleared} cleared, {self.reuse_flags_cleared} reuse "
                f"flag(s) cleared; modelled issue cycles {loops}; not measured on a GPU")


def exclusion(kernel: SassKernel, code: CodeFacts, k: int, fixed: dict, variable: frozenset) -> str | None:
    """Why instruction k's stall is left alone (None: it may be lowered). `code.new` holds the
    current fields (the words the pass starts from)."""
    i = kernel.instructions[k]
    now = code.new[k]
    if i.opcode in _CONTROL:
        return "control"
    if _MEMORY.match(i.opcode):
        return "memory"
    if i.opcode in _SPECIAL_REGISTERS:
        return "special register"
    if i.opcode in _LEFT_ALONE:
        return "nop"
    if i.opcode.startswith("U") and i.opcode not in fixed:
        return "uniform datapath"
    if i.opcode not in fixed or i.opcode in variable:
        return "no table latency"
    if now["write_barrier"] != cb.NO_BARRIER or now["read_barrier"] != cb.NO_BARRIER:
        return "sets a scoreboard"
    if now["wait_mask"]:
        return "waits on a scoreboard"
    if any(code.new[s]["wait_mask"] for s in code.succ[k]):
        return "before a scoreboard wait"
    return None


def _completes_no_sooner(opcode: str, known, fixed: dict) -> bool:
    """Whether a later fixed-latency writer of `opcode` lands no sooner than a producer of latency
    `known`: same or longer latency, issued later, so it cannot be overtaken whatever the gap."""
    later = fixed.get(opcode)
    return bool(known and later and later[0] >= known[0])


def _constraint_paths(code: CodeFacts, fixed: dict, variable: frozenset):
    """Every path the latency rule constrains: (needed distance, path) where path is the tuple of
    instructions whose gaps make up the distance (the producer first, the consumer left out).
    Mirrors hazards._check_latency: producers that write registers with no write scoreboard, paths
    that stop at the producer itself and where an unpredicated write kills the last live register.
    The need is min(latency, ptxas's distance) where the table covers the pair (_table_covers),
    else ptxas's distance within FIXED_HORIZON: stricter than the checker, never looser. A later
    overwrite of the result that could land first (write after write) keeps ptxas's distance too."""
    ins = code.ins
    for p, i in enumerate(ins):
        if not i.reachable or not code.writes[p]:
            continue
        if code.old[p]["write_barrier"] != cb.NO_BARRIER:
            continue
        # scoreboard-less variable-latency results (HMMA, LDS) keep ptxas's spacing, as in the check
        known = None if i.opcode in variable else fixed.get(i.opcode)
        stack = [(s, (p,), frozenset(code.writes[p])) for s in code.succ[p]]
        while stack:
            x, path, live = stack.pop()
            if len(path) >= FIXED_HORIZON:
                continue            # every gap is at least 1: no lowering brings this path below need
            # A warpgroup instruction's registers are not modelled (isa/sass_registers.py
            # UNMODELLED_OPCODES: HGMMA reads its accumulators and fragments, which the text does not
            # spell out): count it as reading every live register, so it keeps ptxas's distance.
            hit = live if code.ins[x].opcode in UNMODELLED_OPCODES else code.reads[x] & live
            if hit:
                d0 = sum(code.gap_old[k] for k in path)
                if known and _table_covers(code, p, x, hit, fixed):
                    if len(path) < known[0]:
                        yield min(known[0], d0), path
                else:
                    yield min(FIXED_HORIZON, d0), path
            elif code.writes[x] & live and not _completes_no_sooner(ins[x].opcode, known, fixed):
                # Write after write, which the checker does not look at: a later writer with a
                # shorter (or unknown) latency could land first and leave the older value behind
                # if brought closer, so it keeps ptxas's distance.
                yield min(FIXED_HORIZON, sum(code.gap_old[k] for k in path)), path
            stack.extend(next_steps(code, p, x, path, live))


def _late_read_constraints(code: CodeFacts, variable: frozenset):
    """(ptxas's distance, path) for every overwrite of a late-read register (hazards.late_read_paths)."""
    for _p, _x, path in late_read_paths(code, variable):
        yield min(FIXED_HORIZON, sum(code.gap_old[k] for k in path)), path


def tighten_stalls(kernel: SassKernel, code: CodeFacts, table) -> tuple[dict[int, int], dict[str, int]]:
    """instruction index -> lowered stall, and reason -> count of instructions (stall > 1) left
    alone. `code.old` is ptxas's input (what the checker compares with), `code.new` the words the
    pass starts from."""
    fixed = fixed_latencies(table)
    variable = _variable_opcodes(table)
    gaps = list(code.gap_new)
    slack: list[int] = []
    through: dict[int, list[tuple[int, int]]] = {}      # instruction -> [(path id, times on it)]
    for need, path in itertools.chain(_constraint_paths(code, fixed, variable),
                                      _late_read_constraints(code, variable)):
        pid = len(slack)
        slack.append(sum(gaps[k] for k in path) - need)
        counts: dict[int, int] = {}
        for k in path:
            counts[k] = counts.get(k, 0) + 1
        for k, n in counts.items():
            through.setdefault(k, []).append((pid, n))
    lowered: dict[int, int] = {}
    left: dict[str, int] = {}
    for k, i in enumerate(kernel.instructions):
        stall = code.new[k]["stall"]
        if not i.reachable or stall <= MIN_STALL:
            continue
        why = exclusion(kernel, code, k, fixed, variable)
        if why:
            left[why] = left.get(why, 0) + 1
            continue
        room = stall - MIN_STALL
        for pid, n in through.get(k, ()):
            room = min(room, max(slack[pid], 0) // n)
        if room <= 0:
            left["needed by a latency"] = left.get("needed by a latency", 0) + 1
            continue
        for pid, n in through.get(k, ()):
            slack[pid] -= room * n
        lowered[k] = stall - room
        gaps[k] = max(stall - room, 1)
    return lowered, left


def place_yields(kernel: SassKernel, code: CodeFacts, every: int) -> dict[int, tuple[int, int]]:
    """instruction index -> (yield bit, reuse field) for every hot instruction whose hint or reuse
    changes. The yield bit is inverted: 0 = hint on (isa/control_bits.py YIELD)."""
    ins = kernel.instructions
    by_loop: dict[int, list[int]] = {}
    for k, i in enumerate(ins):
        if i.reachable and i.loops and i.opcode in HOT_OPCODES and i.predicate != "!PT":
            by_loop.setdefault(i.loops[-1], []).append(k)       # innermost loop
    out: dict[int, tuple[int, int]] = {}
    for hot in by_loop.values():
        for j, k in enumerate(hot):
            now = code.new[k]
            on = (j + 1) % every == 0
            if on:
                out[k] = (0, 0)
            elif now["yield"] == 0 and now["stall"] < YIELD_REQUIRED_FROM_STALL:
                out[k] = (1, now["reuse"])
    # every loop that had a yield in ptxas's code keeps one (checker rule 4)
    for lp in kernel.loops:
        body = lp.instruction_indices(kernel.blocks)
        if not any(code.old[k]["yield"] == 0 for k in body):
            continue
        if any(out.get(k, (code.new[k]["yield"],))[0] == 0 for k in body):
            continue
        hot = [k for k in body if ins[k].reachable and ins[k].opcode in HOT_OPCODES and ins[k].predicate != "!PT"]
        if hot:
            out[hot[-1]] = (0, 0)
    return {k: v for k, v in out.items() if v != (code.new[k]["yield"], code.new[k]["reuse"])}


def loop_issue_cycles(kernel: SassKernel, words: list[int], target: str) -> list[dict]:
    """Per loop, the inspector's issue-cycle estimate (sass/analysis.py: max(stall, 1) summed, plus
    one per modelled bank conflict) with the control fields of `words`; the kernel's own fields are
    restored after."""
    ins = kernel.instructions
    model = arch_for(target).bank_model
    saved = [(i.stall, i.yield_, i.reuse) for i in ins]
    try:
        for i, w in zip(ins, words):
            f = cb.decode_control(w)
            i.stall, i.yield_, i.reuse = f["stall"], f["yield"] == 0, f["reuse"]
        analyse_banks(ins, kernel.blocks, model)
        out = []
        for lp in kernel.loops:
            body = [ins[k] for k in lp.instruction_indices(kernel.blocks) if ins[k].reachable]
            out.append({"loop": lp.index, "instructions": len(body),
                        "issue_cycles": sum(max(i.stall, 1) for i in body) + sum(1 for i in body if i.bank_conflict)})
        return out
    finally:
        for i, (stall, yield_, reuse) in zip(ins, saved):
            i.stall, i.yield_, i.reuse = stall, yield_, reuse
        analyse_banks(ins, kernel.blocks, model)


def plan_stall_yield(kernel: SassKernel, words: list[int], table, target: str, *,
                     stall_pass: bool, yield_every: int) -> tuple[list[int], StallYieldSummary]:
    """The new words of one kernel (one per listed instruction) and what changed. `words` are the
    words the pass starts from (after any rules and the reuse pass); `kernel` is ptxas's input."""
    if yield_every < 0:
        raise ValueError(f"yield_every must be 0 (off) or at least 1, not {yield_every}")
    summary = StallYieldSummary(kernel.name, stall_pass, yield_every)
    new = list(words)
    if kernel.indirect_branches:
        return new, summary           # the checker refuses any patch to such a kernel: leave it as is
    code = CodeFacts(kernel.instructions, kernel.blocks, words)
    if stall_pass:
        lowered, summary.left_alone = tighten_stalls(kernel, code, table)
        for k, stall in lowered.items():
            summary.stalls_lowered += 1
            summary.cycles_removed += code.new[k]["stall"] - stall
            new[k] = cb.STALL.insert(new[k], stall)
    if yield_every:
        for k, (bit, reuse) in place_yields(kernel, code, yield_every).items():
            was = code.new[k]
            if bit == 0 and was["yield"] == 1:
                summary.yields_set += 1
            elif bit == 1 and was["yield"] == 0:
                summary.yields_cleared += 1
            summary.reuse_flags_cleared += bin(was["reuse"] & ~reuse).count("1")
            new[k] = cb.REUSE.insert(cb.YIELD.insert(new[k], bit), reuse)
    before, after = loop_issue_cycles(kernel, words, target), loop_issue_cycles(kernel, new, target)
    summary.loops = [{"loop": b["loop"], "instructions": b["instructions"],
                      "issue_cycles": [b["issue_cycles"], a["issue_cycles"]]} for b, a in zip(before, after)]
    return new, summary
