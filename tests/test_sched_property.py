"""Property tests over random straight-line regions (random register names, shared/global loads and
stores incl. vectors, FMAs, integer adds, predicates and guarded moves, bar.sync):

- the scheduled order is a permutation that respects every edge of the dependency graph;
- an independent oracle agrees: a small interpreter runs the region in source order and in the
  scheduled order, and the final registers and memory are identical (so no edge was missing);
- nothing crosses a bar.sync;
- scheduling is deterministic: a second build gives the same order and byte-identical PTX.
"""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asmgemm import ir
from asmgemm.pipeline import BuildOptions, build_source

F = [f"%f{i}" for i in range(8)]            # float registers: a small pool, so many dependencies
R = [f"%r{i}" for i in range(4)]            # integer registers the region writes
ADDR = {"%r10": 0, "%r11": 16, "%r12": 0}   # shared address registers, never written; %r10 == %r12
GADDR = {"%rd1": 0, "%rd2": 8}              # global address registers, never written
P = ["%p1", "%p2"]
MASK = 0xFFFFFFFF

HEAD = """.visible .entry k(.param .u64 p)
{
    .reg .b32 %r<16>; .reg .f32 %f<8>; .reg .pred %p<4>; .reg .b64 %rd<4>;
.schedule
"""


def _instr():
    f, r, a, g, p = (st.sampled_from(x) for x in (F, R, sorted(ADDR), sorted(GADDR), P))
    off4 = st.sampled_from([0, 4, 8, 12, 16, 20])
    off8 = st.sampled_from([0, 8, 16])
    pairs = st.lists(st.sampled_from(F), min_size=2, max_size=2, unique=True)
    quads = st.lists(st.sampled_from(F), min_size=4, max_size=4, unique=True)
    return st.one_of(
        st.builds(lambda d, x, y, z: f"fma.rn.f32 {d}, {x}, {y}, {z};", f, f, f, f),
        st.builds(lambda d, x, y: f"add.u32 {d}, {x}, {y};", r, r, r),
        st.builds(lambda d, b, o: f"ld.shared.f32 {d}, [{b}+{o}];", f, a, off4),
        st.builds(lambda b, o, s: f"st.shared.f32 [{b}+{o}], {s};", a, off4, f),
        st.builds(lambda ds, b, o: f"ld.shared.v2.f32 {{{ds[0]}, {ds[1]}}}, [{b}+{o}];", pairs, a, off8),
        st.builds(lambda b, s: f"st.shared.v4.f32 [{b}], {{{', '.join(s)}}};", a, quads),
        st.builds(lambda d, b, o: f"ld.global.f32 {d}, [{b}+{o}];", f, g, off4),
        st.builds(lambda b, o, s: f"st.global.f32 [{b}+{o}], {s};", g, off4, f),
        st.builds(lambda q, x, y: f"setp.lt.u32 {q}, {x}, {y};", p, r, r),
        st.builds(lambda q, neg, d, s: f"@{'!' if neg else ''}{q} mov.f32 {d}, {s};", p, st.booleans(), f, f),
        st.builds(lambda d, s: f"cvt.rzi.u32.f32 {d}, {s};", r, f),
        st.just("bar.sync 0;"),
    )


programs = st.lists(_instr(), min_size=1, max_size=24)


def _build(lines):
    text = HEAD + "\n".join("    " + ln for ln in lines) + "\n.endschedule\n    ret;\n}\n"
    return build_source(text, "prop.sasm", BuildOptions())


def _initial(name: str) -> int:
    if name in ADDR:
        return ADDR[name]
    if name in GADDR:
        return GADDR[name]
    return (sum(ord(c) * 131 ** i for i, c in enumerate(name)) * 2654435761) & MASK


def _run(instrs: list[ir.Instruction]):
    """Execute one thread's view of the region; values are 32-bit integers mixed nonlinearly so that
    any reordering that changes which value an instruction sees changes the final state."""
    regs: dict[str, int] = {}
    mem: dict[tuple[str, int], int] = {}

    def get(name):
        return regs.get(name, _initial(name))

    def addr(m: ir.Mem):
        return get(m.base.name) + m.offset

    def load(space, a):
        return mem.get((space, a), (a * 40503 + (7 if space == "global" else 3)) & MASK)

    for ins in instrs:
        op, ops = ins.opcode, ins.operands
        if ins.guard is not None:
            taken = bool(get(ins.guard.reg.name) & 1) != ins.guard.negated
            if not taken:
                continue
        base = ins.base
        if base == "fma":
            b, c, d = (get(o.name) for o in ops[1:])
            regs[ops[0].name] = (b * c + d * 3 + 0x9E37) & MASK
        elif base == "add":
            regs[ops[0].name] = (get(ops[1].name) + 5 * get(ops[2].name) + 1) & MASK
        elif base == "cvt":
            regs[ops[0].name] = ((get(ops[1].name) ^ 0x5BD1) * 7) & MASK
        elif base == "setp":
            regs[ops[0].name] = int(get(ops[1].name) < get(ops[2].name))
        elif base == "mov":
            regs[ops[0].name] = get(ops[1].name)
        elif base == "ld":
            space = "shared" if "shared" in op else "global"
            dst = ops[0].elems if isinstance(ops[0], ir.Vector) else (ops[0],)
            a = addr(ops[1])
            for k, d in enumerate(dst):
                regs[d.name] = load(space, a + 4 * k)
        elif base == "st":
            space = "shared" if "shared" in op else "global"
            src = ops[1].elems if isinstance(ops[1], ir.Vector) else (ops[1],)
            a = addr(ops[0])
            for k, s in enumerate(src):
                mem[(space, a + 4 * k)] = get(s.name)
        elif base in ("bar", "ret"):
            pass
        else:
            raise AssertionError(f"interpreter does not know {op}")
    return regs, mem


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_scheduled_order_respects_dependencies_and_semantics(lines):
    result = _build(lines)
    rep = result.schedule_report.regions[0]
    order = rep.scheduled_order
    assert sorted(order) == list(range(len(rep.instructions)))
    assert rep.graph.respects(order) == []
    source = rep.instructions
    scheduled = [source[n] for n in order]
    assert _run(scheduled) == _run(source)
    # Nothing crosses a barrier: the set of instructions before each bar.sync is unchanged.
    pos = {n: k for k, n in enumerate(order)}
    for b, ins in enumerate(source):
        if ins.base == "bar":
            assert {n for n in range(len(source)) if pos[n] < pos[b]} == set(range(b))
    # The emitted region holds exactly the scheduled instructions, in that order.
    fn = next(result.scheduled.functions())
    region = next(it for it in fn.body if isinstance(it, ir.ScheduleRegion))
    assert [i.render() for i in region.items] == [i.render() for i in scheduled]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_scheduling_is_deterministic(lines):
    a, b = _build(lines), _build(lines)
    assert a.schedule_report.regions[0].scheduled_order == b.schedule_report.regions[0].scheduled_order
    assert a.ptx == b.ptx


def test_interpreter_detects_a_broken_dependency():
    """The oracle must be able to fail: swapping a store and a load of the same address changes
    the final state."""
    result = _build(["st.shared.f32 [%r10+4], %f1;", "ld.shared.f32 %f2, [%r12+4];"])
    src = result.schedule_report.regions[0].instructions
    assert _run(src) != _run(list(reversed(src)))
