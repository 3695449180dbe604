"""Stage 3: bank-aware register planning for registers declared with `.regs` / `.temp`.

Every named register gets a planned physical index (R0..R254) and is renamed in the PTX to a
register that carries that index: acc3 -> %R37_f32 (planned R37, bank 37 mod 2 on sm_90).

What this plan is: a model. ptxas re-allocates all PTX registers itself, so the plan is what the
user can reason about (which values share a bank, which FMAs would conflict) and compare with
the final SASS (`asmgemm regs --sass`). What it is not: a guarantee about the SASS.

Rules, in order:
- `.regs` registers each get their own index for the whole function, in declaration order,
  lowest index first that satisfies alignment (64-bit: even; vec2/vec4 groups: consecutive and
  aligned to the group size) and the bank constraint.
- `.temp` registers share indices with other temps whose live ranges do not overlap (liveness
  over the control-flow graph, so loops are respected), never with `.regs` registers.
- Registers PTX declares itself (`.reg .b32 %r<10>;`) are left exactly as written.
- A target without a bank model (one only ptxas knows, such as sm_120: isa/arch.py) is planned
  the same way without banks; a bank constraint there is an error at its declaration.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field, asdict, replace

from . import ir
from .errors import AsmError
from .isa.ptx_operands import defs_and_uses, is_three_source
from .isa.arch import arch_for
from .isa.register_banks import BankModel
from .list_view import ListView

MAX_PREDICATES = 7  # P0..P6; PT is the constant true predicate


@dataclass
class PlannedReg:
    name: str
    ptx_type: str
    ptx_name: str
    index: int                 # planned physical index (low half for 64-bit values)
    width: int                 # 32-bit registers it occupies
    bank: int | None           # None for predicates
    temp: bool
    constraint: int | None
    first_use: int | None      # instruction positions in program order
    last_use: int | None
    uses: int
    location: str

    def to_json(self) -> dict:
        return asdict(self)


class BankConflict:
    """A three-source instruction whose sources the bank model says conflict: where it is
    (`position` among the function's instructions, `span`), the instruction as written, with its
    named registers (the plan renames the build's instructions in place afterwards), and what
    conflicts. Its text and location are worked out when asked for."""

    __slots__ = ("position", "written", "span", "sources", "banks")

    def __init__(self, position: int, written: ir.Instruction, span, sources: list[dict],
                 banks: dict[int, list[str]]):
        self.position = position
        self.written = written      # opcode, guard and operands as written (no span: shared)
        self.span = span
        self.sources = sources      # [{name, ptx_name, index, bank}]
        self.banks = banks

    @property
    def instruction(self) -> ir.Instruction:
        w = self.written
        return ir.Instruction(w.opcode, w.operands, w.guard, self.span)

    @property
    def text(self) -> str:
        return self.written.render()

    @property
    def location(self) -> str:
        return self.span.location() if self.span else ""

    def to_json(self) -> dict:
        return {"position": self.position, "text": self.text, "location": self.location,
                "sources": [dict(s) for s in self.sources], "banks": {b: list(n) for b, n in self.banks.items()}}

    def __repr__(self) -> str:
        return f"BankConflict({self.position}, {self.text!r}, {self.location!r})"


class BankConflicts(ListView):
    """A function's bank conflicts in program order, read as a list of BankConflict, each made
    when read. A large kernel can have hundreds of thousands (the benchmark of issue 36 has one
    in a third of its FMAs), which a build never shows (`asmgemm regs` does): kept as a position,
    the instruction (for its span) and a record shared by the conflicts of the same written
    instruction, 24 bytes a conflict where an object each was 130."""

    __slots__ = ("positions", "instructions", "records")

    def __init__(self):
        self.positions = array("q")
        self.instructions: list[ir.Instruction] = []
        self.records: list[tuple] = []   # (written instruction, sources, banks)

    def append(self, position: int, instruction: ir.Instruction, record: tuple) -> None:
        self.positions.append(position)
        self.instructions.append(instruction)
        self.records.append(record)

    def _at(self, i: int) -> BankConflict:
        return BankConflict(self.positions[i], self.records[i][0], self.instructions[i].span, *self.records[i][1:])

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._at(k) for k in range(len(self))[i]]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("bank conflict index out of range")
        return self._at(i)

    def __iter__(self):
        for i in range(len(self.positions)):
            yield self._at(i)


@dataclass
class FunctionPlan:
    name: str
    regs: list[PlannedReg]
    conflicts: BankConflicts | list[BankConflict]
    three_source_checked: int
    registers_used: int        # highest planned index + width

    def to_json(self) -> dict:
        return {"name": self.name, "registers_used": self.registers_used,
                "three_source_instructions": self.three_source_checked,
                "regs": [r.to_json() for r in self.regs],
                "conflicts": [c.to_json() for c in self.conflicts]}


@dataclass
class Allocation:
    target: str
    model: str                 # the bank model's name, or 'none' for an unmodelled target
    functions: dict[str, FunctionPlan] = field(default_factory=dict)
    note: str = ""             # what the plan cannot say for this target ('' when it is modelled)

    def to_json(self) -> dict:
        return {"target": self.target, "bank_model": self.model, "note": self.note,
                "functions": [f.to_json() for f in self.functions.values()]}


def _type_suffix(t: str) -> str:
    return t.lstrip(".")


def _width(t: str) -> int:
    return 2 if t in (".b64", ".u64", ".s64", ".f64") else 1


def ptx_name_for(reg: ir.NamedReg, index: int) -> str:
    if reg.ptx_type == ".pred":
        return f"%P{index}"
    return f"%R{index}_{_type_suffix(reg.ptx_type)}"


def allocate(module: ir.Module, target: str) -> tuple[ir.Module, Allocation]:
    """The module with its named registers renamed to the plan's, and the plan. The module's
    instructions are rewritten in place (a function's body gets the plan's declarations in front),
    so the module passed in is the one returned: a second copy of a large kernel's instructions
    was a third of its build's memory. The pipeline hands its expanded module over; a caller that
    wants the expanded module as well expands again (pipeline.BuildResult.expanded)."""
    arch = arch_for(target)
    model = arch.banks                 # None: no register-bank data for this target
    alloc = Allocation(target, model.name if model is not None else "none", note=arch.unmodelled_note)
    for item in module.items:
        if isinstance(item, ir.Function) and item.body is not None:
            alloc.functions[item.name] = (_allocate_function(item, model, arch.max_registers_per_thread, target)
                                          if item.named_regs else _plan_without_named(item, model))
    return module, alloc


def _program(fn: ir.Function) -> list:
    return list(ir.iter_body(fn.body or []))


def _plan_without_named(fn: ir.Function, model: BankModel | None) -> FunctionPlan:
    n = sum(1 for i in _program(fn) if isinstance(i, ir.Instruction) and is_three_source(i))
    return FunctionPlan(fn.name, [], [], n, 0)


def _allocate_function(fn: ir.Function, model: BankModel | None, max_registers: int,
                       target: str = "") -> FunctionPlan:
    """The plan of one function's named registers; its body renamed to it in place."""
    program = _program(fn)
    named = {r.name: r for r in fn.named_regs}
    if model is None:
        asked = next((r for r in fn.named_regs if r.bank is not None), None)
        if asked is not None:
            raise AsmError(f"register '{asked.name}' asks for bank {asked.bank}, but asmgemm has no register-bank "
                           f"model for {target}", asked.span,
                           hint="drop the bank()/banks() attributes for this target, or build for one of "
                                "sm_50 ... sm_90a, whose banks are modelled")
    first, last, count = _use_positions(program, named)
    occupied: dict[int, str] = {}      # 32-bit index -> owner (permanent registers)
    index_of: dict[str, int] = {}
    pred_next = 0

    def fail(reg: ir.NamedReg, why: str):
        raise AsmError(f"cannot place register '{reg.name}': {why}", reg.span)

    def place(reg: ir.NamedReg, taken) -> int:
        width = _width(reg.ptx_type)
        span_len = width * max(1, len(reg.group)) if reg.group and reg.group[0] == reg.name else width
        for idx in range(0, max_registers - span_len + 1):
            if idx % reg.align:
                continue
            if reg.bank is not None and model.bank_of(idx) != reg.bank % model.banks:
                continue
            if any(taken(idx + k) for k in range(span_len)):
                continue
            return idx
        fail(reg, f"no free index in R0..R{max_registers - 1} satisfies "
                  + (f"bank {reg.bank} " if reg.bank is not None else "")
                  + (f"and alignment {reg.align}" if reg.align > 1 else "the constraints"))
        return -1

    # Permanent registers, in declaration order; vector groups as units.
    for reg in fn.named_regs:
        if reg.temp or reg.name in index_of:
            continue
        if reg.ptx_type == ".pred":
            if pred_next >= MAX_PREDICATES:
                fail(reg, f"more than {MAX_PREDICATES} predicate registers declared (P0..P6)")
            index_of[reg.name] = pred_next
            pred_next += 1
            continue
        if reg.group:
            base = place(named[reg.group[0]], lambda i: i in occupied)
            width = _width(reg.ptx_type)
            for k, member in enumerate(reg.group):
                m = named[member]
                idx = base + k * width
                if m.bank is not None and model.bank_of(idx) != m.bank % model.banks:
                    fail(m, f"it is element {k} of an aligned vec{len(reg.group)} group, which puts it in bank "
                            f"{model.bank_of(idx)}, not the requested bank {m.bank}")
                index_of[member] = idx
                for w in range(width):
                    occupied[idx + w] = member
            continue
        idx = place(reg, lambda i: i in occupied)
        index_of[reg.name] = idx
        for w in range(_width(reg.ptx_type)):
            occupied[idx + w] = reg.name

    # Temporaries: colour the interference graph greedily in order of first definition.
    temps = [r for r in fn.named_regs if r.temp and r.ptx_type != ".pred"]
    temp_preds = [r for r in fn.named_regs if r.temp and r.ptx_type == ".pred"]
    if temps or temp_preds:
        interfere = _interference(program, {r.name for r in temps + temp_preds})
        order = sorted(temps, key=lambda r: (first.get(r.name, 1 << 30), fn.named_regs.index(r)))
        temp_slots: dict[int, list[str]] = {}
        for reg in order:
            def taken(i, reg=reg):
                if i in occupied:
                    return True
                return any(other in interfere.get(reg.name, ()) for other in temp_slots.get(i, ()))
            if reg.group and reg.group[0] != reg.name and reg.name in index_of:
                continue
            idx = place(reg, taken)
            members = reg.group if reg.group else (reg.name,)
            for k, member in enumerate(members):
                index_of[member] = idx + k * _width(reg.ptx_type)
                for w in range(_width(reg.ptx_type)):
                    temp_slots.setdefault(idx + k * _width(reg.ptx_type) + w, []).append(member)
        pred_slots: dict[int, list[str]] = {}
        for reg in sorted(temp_preds, key=lambda r: first.get(r.name, 1 << 30)):
            for p in range(pred_next, MAX_PREDICATES):
                if not any(o in interfere.get(reg.name, ()) for o in pred_slots.get(p, ())):
                    index_of[reg.name] = p
                    pred_slots.setdefault(p, []).append(reg.name)
                    break
            else:
                fail(reg, "no free predicate register (P0..P6) at its live range")

    rename = {name: ptx_name_for(named[name], idx) for name, idx in index_of.items()}

    renamed: dict[ir.Reg, ir.Reg] = {}

    def rn(r: ir.Reg) -> ir.Reg:
        if r.named:
            out = renamed.get(r)
            if out is None:
                out = renamed[r] = replace(r, name=rename[r.name], named=False)
            return out
        return r

    # the conflicts keep the instructions' operands as written: found before the renaming
    conflicts, checked = _bank_conflicts(program, index_of, named, rename, model)
    del program
    _rewrite(fn.body, rn)
    fn.body[:0] = _declarations(named, index_of, rename)

    planned = []
    for reg in fn.named_regs:
        idx = index_of[reg.name]
        is_pred = reg.ptx_type == ".pred"
        planned.append(PlannedReg(reg.name, reg.ptx_type, rename[reg.name], idx, _width(reg.ptx_type),
                                  None if is_pred or model is None else model.bank_of(idx), reg.temp, reg.bank,
                                  first.get(reg.name), last.get(reg.name), count.get(reg.name, 0),
                                  reg.span.location() if reg.span else ""))
    used = max((p.index + p.width for p in planned if p.ptx_type != ".pred"), default=0)
    return FunctionPlan(fn.name, planned, conflicts, checked, used)


def _use_positions(program, named):
    """Per named register: the position of its first and last use (instructions in program
    order) and how many uses. Worked out per operand list, then per register: expansion shares
    one list among the instructions that read the same operands, so a large kernel has far
    fewer lists than instructions (a list's position range and count, then its registers')."""
    # per operand list (by id: every list lives in the module meanwhile) and per guard register
    seen: dict[int, list] = {}          # id -> [first position, last position, uses, the list]
    guards: dict[str, list] = {}        # name -> [first, last, uses]
    pos = 0
    for item in program:
        if type(item) is not ir.Instruction:
            continue
        ops = item.operands
        at = seen.get(id(ops))
        if at is None:
            seen[id(ops)] = [pos, pos, 1, ops]
        else:
            at[1] = pos
            at[2] += 1
        if item.guard is not None:
            g = item.guard.reg
            if g.named and g.name in named:
                at = guards.get(g.name)
                if at is None:
                    guards[g.name] = [pos, pos, 1]
                else:
                    at[1] = pos
                    at[2] += 1
        pos += 1
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    count: dict[str, int] = {}

    def used(name: str, lo: int, hi: int, n: int) -> None:
        if name not in first or lo < first[name]:
            first[name] = lo
        if name not in last or hi > last[name]:
            last[name] = hi
        count[name] = count.get(name, 0) + n

    # the named registers of each operand object, once per object: expansion shares the operands
    # of a name among all its uses
    regs_of: dict[int, tuple[str, ...]] = {}
    for lo, hi, n, ops in seen.values():
        for op in ops:
            names = regs_of.get(id(op))
            if names is None:
                names = regs_of[id(op)] = tuple(r.name for r in ir.operand_regs(op) if r.named and r.name in named)
            for name in names:
                used(name, lo, hi, n)
    for name, (lo, hi, n) in guards.items():
        used(name, lo, hi, n)
    return first, last, count


def _successors(instrs: list, labels: dict[str, int]) -> list[list[int]]:
    succ = []
    n = len(instrs)
    for i, ins in enumerate(instrs):
        nxt = [i + 1] if i + 1 < n else []
        if isinstance(ins, ir.Instruction):
            if ins.base in ("bra", "brx") and ins.operands and isinstance(ins.operands[0], ir.Sym):
                target = labels.get(ins.operands[0].name)
                tgt = [target] if target is not None else []
                succ.append(tgt + (nxt if ins.guard is not None else []))
                continue
            if ins.base in ("ret", "exit", "trap") and ins.guard is None:
                succ.append([])
                continue
        succ.append(nxt)
    return succ


def _interference(program, tracked: set[str]) -> dict[str, set[str]]:
    """Live-variable analysis (backward, to a fixed point) over the instruction-level CFG; two
    tracked registers interfere when one is written where the other is live afterwards."""
    instrs = [i for i in program if isinstance(i, (ir.Instruction, ir.Label))]
    labels = {it.name: k for k, it in enumerate(instrs) if isinstance(it, ir.Label)}
    bit = {name: 1 << k for k, name in enumerate(sorted(tracked))}
    names = sorted(tracked)
    defs = []
    uses = []
    kills = []
    for it in instrs:
        d = u = 0
        if isinstance(it, ir.Instruction):
            dl, ul = defs_and_uses(it)
            for r in dl:
                if r.named and r.name in bit:
                    d |= bit[r.name]
            for r in ul:
                if r.named and r.name in bit:
                    u |= bit[r.name]
            # A predicated write may not happen, so it does not end the old value's life.
            kills.append(0 if it.guard is not None else d)
        else:
            kills.append(0)
        defs.append(d)
        uses.append(u)
    succ = _successors(instrs, labels)
    live_out = [0] * len(instrs)
    live_in = [0] * len(instrs)
    changed = True
    while changed:
        changed = False
        for i in range(len(instrs) - 1, -1, -1):
            out = 0
            for s in succ[i]:
                out |= live_in[s]
            inn = uses[i] | (out & ~kills[i])
            if out != live_out[i] or inn != live_in[i]:
                live_out[i], live_in[i] = out, inn
                changed = True
    graph: dict[str, set[str]] = {n: set() for n in names}
    for i in range(len(instrs)):
        d = defs[i]
        if not d:
            continue
        # The written registers interfere with everything live after the write, and with each other.
        live = live_out[i] | d
        for a in names:
            if d & bit[a]:
                for b in names:
                    if b != a and live & bit[b]:
                        graph[a].add(b)
                        graph[b].add(a)
    # A value that is never written but read (live-in at entry) interferes with everything live there.
    entry = live_in[0] if instrs else 0
    for a in names:
        if entry & bit[a]:
            for b in names:
                if b != a and entry & bit[b]:
                    graph[a].add(b)
    return graph


def _rewrite(items, rn, done: dict | None = None, lists: dict | None = None) -> None:
    """Every instruction's guard and operands renamed by `rn`, in place. An instruction gets a
    new operand list, never its list changed: lists may be shared (by instructions that read the
    same operands, and by a BankConflict that keeps them as written)."""
    # `done`: each operand object rewritten once (id -> rewritten), shared as expansion shares it;
    # `lists`: each operand list once (id -> (list, rewritten)), the list kept so its id stays its own
    done = {} if done is None else done
    lists = {} if lists is None else lists
    for item in items:
        if type(item) is ir.Instruction:
            if item.guard is not None:
                item.guard = ir.Guard(rn(item.guard.reg), item.guard.negated)
            old = item.operands
            seen = lists.get(id(old))
            if seen is not None:
                item.operands = seen[1]
                continue
            ops = []
            for o in old:
                new = done.get(id(o))
                if new is None:
                    new = done[id(o)] = ir.map_regs(o, rn)
                ops.append(new)
            lists[id(old)] = (old, ops)
            item.operands = ops
        elif isinstance(item, ir.ScheduleRegion):
            _rewrite(item.items, rn, done, lists)


def _declarations(named, index_of, rename) -> list[ir.Directive]:
    by_type: dict[str, list[tuple[int, str]]] = {}
    for name, idx in index_of.items():
        by_type.setdefault(named[name].ptx_type, []).append((idx, rename[name]))
    out = []
    for t in sorted(by_type):
        regs = sorted(set(by_type[t]))
        names = [n for _, n in regs]
        for k in range(0, len(names), 8):
            out.append(ir.Directive(f".reg {t} {', '.join(names[k:k + 8])};", None, kind="reg"))
    return out


def _bank_conflicts(program, index_of, named, rename, model: BankModel | None):
    conflicts = BankConflicts()
    checked = 0
    if model is None:                   # no banks, no conflicts to name
        return conflicts, checked
    pos = -1
    # what a large program repeats, worked out once: per opcode and operand list (expansion shares
    # a list among the instructions that read the same operands) whether it is checked and what
    # conflicts; per operand object its (name, index) as a banked source, per index tuple the
    # model's verdict, per source tuple the conflict's description; per written instruction
    # (opcode, operand list, guard) the record its conflicts share
    per_opcode: dict[str, dict[int, tuple] | None] = {}
    records: dict[tuple, tuple] = {}
    source: dict[int, tuple | None] = {}
    verdicts: dict[tuple, dict] = {}
    descriptions: dict[tuple, tuple] = {}
    for item in program:
        if type(item) is not ir.Instruction:
            continue
        pos += 1
        ops = item.operands
        known = per_opcode.get(item.opcode, False)
        if known is False:
            known = per_opcode[item.opcode] = {} if is_three_source(item) else None
        if known is None:               # not a three-source instruction
            continue
        found = known.get(id(ops))
        if found is None:
            found = known[id(ops)] = _conflict_of(ops, index_of, named, rename, model, source, verdicts,
                                                  descriptions)
        if found is _UNCHECKED:
            continue
        checked += 1
        if found is not _NO_CONFLICT:
            key = (item.opcode, id(ops), item.guard)
            record = records.get(key)
            if record is None:
                record = records[key] = (ir.Instruction(item.opcode, ops, item.guard), *found)
            conflicts.append(pos, item, record)
    return conflicts, checked


_UNCHECKED, _NO_CONFLICT = ("unchecked",), ("no conflict",)


def _conflict_of(ops, index_of, named, rename, model, source, verdicts, descriptions):
    """What a three-source instruction with these operands is to the bank model: _UNCHECKED
    (fewer than four operands), _NO_CONFLICT, or the conflict's (sources, banks)."""
    if len(ops) < 4:
        return _UNCHECKED
    srcs = []
    for op in ops[1:4]:
        src = source.get(id(op), False)
        if src is False:
            src = source[id(op)] = ((op.name, index_of[op.name]) if type(op) is ir.Reg and op.named
                                    and op.name in index_of and named[op.name].ptx_type != ".pred" else None)
        if src is not None:
            srcs.append(src)
    if len(srcs) < 2:
        return _NO_CONFLICT
    key = tuple(i for _, i in srcs)
    bad = verdicts.get(key)
    if bad is None:
        bad = verdicts[key] = model.conflicts(list(key))
    if not bad:
        return _NO_CONFLICT
    # the same sources conflict the same way: one description shared by every such instruction
    described = descriptions.get(tuple(srcs))
    if described is None:
        described = descriptions[tuple(srcs)] = (
            [{"name": n, "ptx_name": rename[n], "index": i, "bank": model.bank_of(i)} for n, i in srcs],
            {b: [n for n, i in srcs if i in regs] for b, regs in bad.items()})
    return described
