"""The scheduler on hand-made regions: dependency edges (registers, vector pieces, predicates, memory,
barriers, cp.async groups, fences, pins), known best orders, the control-code model, errors."""
import pytest

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, build_source
from asmgemm.scheduler.control_codes import ControlCode
from asmgemm.scheduler.latencies_sm90 import TABLE

DECLS = """
    .reg .b32 %r<16>; .reg .f32 %f<32>; .reg .pred %p<4>; .reg .b64 %rd<8>;
    .shared .align 16 .b8 sm[4096];
    .shared .align 8 .b64 bar0;
"""


def region(body: str, *, schedule=True, annotate=False, target=None):
    """Build a kernel whose only region holds `body`; return (report of that region, build)."""
    text = f".visible .entry k(.param .u64 p)\n{{{DECLS}\n.schedule\n{body}\n.endschedule\n    ret;\n}}\n"
    result = build_source(text, "r.sasm", BuildOptions(schedule=schedule, annotate=annotate, target=target))
    regs = result.schedule_report.regions
    assert len(regs) == 1
    return regs[0], result


def texts(rep, order):
    return [rep.graph.nodes[n].text() for n in order]


def edge_kinds(rep, src, dst):
    return {e.kind for e in rep.graph.edges if (e.src, e.dst) == (src, dst)}


def has_path(rep, src, dst):
    seen, todo = set(), [src]
    while todo:
        n = todo.pop()
        if n == dst:
            return True
        for e in rep.graph.succs[n]:
            if e.dst not in seen:
                seen.add(e.dst)
                todo.append(e.dst)
    return False


# ---- known best orders ----------------------------------------------------------------------------
def test_long_load_is_hoisted_over_independent_work():
    rep, _ = region("""
        fma.rn.f32 %f1, %f2, %f3, %f1;
        fma.rn.f32 %f4, %f2, %f3, %f4;
        fma.rn.f32 %f5, %f2, %f3, %f5;
        ld.shared.f32 %f10, [%r1];
        fma.rn.f32 %f11, %f10, %f10, %f11;
    """)
    order = texts(rep, rep.scheduled_order)
    assert order[0].startswith("ld.shared.f32")
    assert order[-1].startswith("fma.rn.f32 %f11")
    # The load's 29-cycle latency is the critical path: nothing can beat issuing it first.
    lds = TABLE["LDS32"].latency
    assert rep.cycles_scheduled == lds + 1 == rep.critical_path
    assert rep.cycles_source == 3 + lds + 1


def test_global_loads_first_then_shared_then_math():
    rep, _ = region("""
        fma.rn.f32 %f1, %f2, %f3, %f1;
        ld.shared.f32 %f10, [%r1];
        ld.global.f32 %f12, [%rd1];
        add.f32 %f13, %f10, %f12;
    """)
    order = texts(rep, rep.scheduled_order)
    assert order[0].startswith("ld.global")
    # Both loads share the LD/ST issue port: the shared load waits its turn, the FMA fills the gap.
    assert order[1].startswith("fma") and order[2].startswith("ld.shared") and order[3].startswith("add.f32")
    port = TABLE["LDG"].issue
    assert rep.issue_scheduled[1] == port                       # node 1 is the ld.shared


def test_dependent_chain_stays_in_order_and_costs_its_latency():
    rep, _ = region("""
        fma.rn.f32 %f1, %f2, %f3, %f1;
        fma.rn.f32 %f1, %f2, %f3, %f1;
        fma.rn.f32 %f1, %f2, %f3, %f1;
    """)
    assert rep.scheduled_order == [0, 1, 2]
    ffma = TABLE["FFMA"].latency
    assert rep.cycles_scheduled == 2 * ffma + 1 == rep.critical_path
    # Fixed latency: enforced by stall counts, not scoreboards.
    codes = [rep.control_scheduled[n] for n in rep.scheduled_order]
    assert [c.stall for c in codes[:2]] == [ffma, ffma]
    assert all(c.write_sb is None and c.wait_mask == 0 for c in codes)


def test_independent_chains_interleave():
    rep, _ = region("""
        fma.rn.f32 %f1, %f2, %f3, %f1;
        fma.rn.f32 %f1, %f2, %f3, %f1;
        fma.rn.f32 %f4, %f2, %f3, %f4;
        fma.rn.f32 %f4, %f2, %f3, %f4;
    """)
    assert rep.cycles_source > rep.cycles_scheduled
    assert rep.scheduled_order[:2] in ([0, 2], [2, 0])


def test_maxas_pattern_on_the_kstep_example():
    from pathlib import Path
    from asmgemm.pipeline import build_file
    res = build_file(Path(__file__).parent / "data" / "sched" / "kstep.sasm")
    rep = res.schedule_report.regions[0]
    order = texts(rep, rep.scheduled_order)
    # Global loads (written last in the source) lead: the first instruction, the second soon after.
    assert order[0].startswith("ld.global")
    assert [i for i, t in enumerate(order) if t.startswith("ld.global")][1] < 8
    # The shared loads for step 1 are spread among the FMAs of step 0, one memory instruction per
    # LD/ST issue slot (maxas's pattern, and what ptxas does on sm_90) ...
    mem_pos = [i for i, t in enumerate(order) if t.startswith("ld.")]
    fma_pos = [i for i, t in enumerate(order) if t.startswith("fma")]
    assert mem_pos[2] < fma_pos[10] and mem_pos[5] < fma_pos[63]
    port = TABLE["LDS128"].issue
    issue = [rep.issue_scheduled[n] for n in rep.scheduled_order]
    assert all(issue[b] - issue[a] >= port for a, b in zip(mem_pos, mem_pos[1:]))
    assert all(b - a >= 2 for a, b in zip(mem_pos[:6], mem_pos[1:6])), "memory instructions should not be bunched"
    # ... so that the model reaches its lower bound: one instruction per cycle, no stall.
    assert rep.cycles_scheduled == rep.lower_bound < rep.cycles_source


# ---- dependency edges ---------------------------------------------------------------------------
def test_register_edges_raw_war_waw():
    rep, _ = region("""
        ld.shared.f32 %f1, [%r1];
        fma.rn.f32 %f2, %f1, %f1, %f2;
        mov.f32 %f1, 0f00000000;
        mov.f32 %f2, 0f3F800000;
    """)
    assert "raw" in edge_kinds(rep, 0, 1)
    assert "war" in edge_kinds(rep, 1, 2)
    assert "waw" in edge_kinds(rep, 0, 2)
    assert "waw" in edge_kinds(rep, 1, 3)
    raw = next(e for e in rep.graph.edges if (e.src, e.dst, e.kind) == (0, 1, "raw"))
    assert raw.enforce == "scoreboard-w" and raw.latency == TABLE["LDS32"].latency


def test_vector_pieces_are_separate_registers():
    rep, _ = region("""
        ld.shared.v4.f32 {%f1, %f2, %f3, %f4}, [%r1];
        fma.rn.f32 %f10, %f3, %f3, %f10;
        fma.rn.f32 %f11, %f9, %f9, %f11;
        st.shared.v2.f32 [%r2+64], {%f5, %f6};
        mov.f32 %f6, 0f00000000;
    """)
    assert "raw" in edge_kinds(rep, 0, 1)          # %f3 is the third piece of the v4
    assert not has_path(rep, 0, 2)                 # %f9 is not
    war = [e for e in rep.graph.edges if (e.src, e.dst) == (3, 4)]
    assert war and war[0].enforce == "scoreboard-r"   # the store reads %f6 after issue


def test_predicates_and_guards():
    rep, _ = region("""
        setp.lt.u32 %p1, %r1, %r2;
        @%p1 mov.f32 %f1, %f2;
        @!%p1 mov.f32 %f1, %f3;
        add.f32 %f4, %f1, %f1;
    """)
    assert "raw" in edge_kinds(rep, 0, 1) and "raw" in edge_kinds(rep, 0, 2)
    # A guarded write may not happen: the reader depends on both guarded writers.
    assert "raw" in edge_kinds(rep, 1, 3) and "raw" in edge_kinds(rep, 2, 3)


def test_shared_memory_order_and_provably_disjoint_addresses():
    rep, _ = region("""
        st.shared.f32 [%r1], %f1;
        ld.shared.f32 %f2, [%r1];
        ld.shared.f32 %f3, [%r1+4];
        st.shared.f32 [%r1+8], %f4;
        ld.shared.f32 %f5, [%r2];
        ld.global.f32 %f6, [%rd1];
    """)
    assert "mem" in edge_kinds(rep, 0, 1)        # same address
    assert not has_path(rep, 0, 2)               # [%r1] and [%r1+4] cannot overlap
    assert not has_path(rep, 2, 3)
    assert "mem" in edge_kinds(rep, 0, 4)        # another base register may alias
    assert not has_path(rep, 0, 5)               # different state spaces


def test_redefined_base_register_is_a_new_address():
    rep, _ = region("""
        st.shared.f32 [%r1], %f1;
        add.u32 %r1, %r1, 4;
        ld.shared.f32 %f2, [%r1+4];
    """)
    assert "mem" in edge_kinds(rep, 0, 2)


def test_global_reads_only_and_read_only_loads():
    rep, _ = region("""
        ld.global.f32 %f1, [%rd1];
        ld.global.f32 %f2, [%rd2];
        st.global.f32 [%rd3], %f3;
        ld.global.nc.f32 %f4, [%rd4];
        ld.global.f32 %f5, [%rd5];
    """)
    assert not has_path(rep, 0, 1)               # two reads never conflict
    assert "mem" in edge_kinds(rep, 0, 2) and "mem" in edge_kinds(rep, 2, 4)
    assert not has_path(rep, 2, 3)               # .nc: nothing in the kernel writes it


def test_barrier_is_a_wall():
    rep, _ = region("""
        fma.rn.f32 %f1, %f2, %f3, %f1;
        st.shared.f32 [%r1], %f4;
        bar.sync 0;
        ld.shared.f32 %f5, [%r2];
        fma.rn.f32 %f6, %f2, %f3, %f6;
    """)
    pos = {n: i for i, n in enumerate(rep.scheduled_order)}
    assert pos[0] < pos[2] and pos[1] < pos[2] < pos[3] and pos[2] < pos[4]


def test_fence_orders_memory_but_not_arithmetic():
    rep, _ = region("""
        st.global.f32 [%rd1], %f1;
        fence.acq_rel.gpu;
        ld.global.f32 %f2, [%rd2];
        fma.rn.f32 %f3, %f4, %f5, %f3;
    """)
    assert has_path(rep, 0, 1) and has_path(rep, 1, 2)
    assert not has_path(rep, 1, 3) and not has_path(rep, 3, 1)


def test_cp_async_groups():
    rep, _ = region("""
        cp.async.ca.shared.global [%r1], [%rd1], 16;
        cp.async.ca.shared.global [%r1+16], [%rd2], 16;
        cp.async.commit_group;
        cp.async.ca.shared.global [%r1+32], [%rd3], 16;
        cp.async.commit_group;
        cp.async.wait_group 1;
        ld.shared.f32 %f1, [%r4];
    """)
    # Copies stay inside their group but may swap within it (their destinations are disjoint).
    assert has_path(rep, 0, 2) and has_path(rep, 1, 2) and has_path(rep, 2, 3) and has_path(rep, 3, 4)
    assert not has_path(rep, 0, 1)
    # wait_group 1 waits for the first group only: its copies' latency is an edge to the wait.
    waited = {e.src for e in rep.graph.edges if e.dst == 5 and e.kind == "async"}
    assert waited == {0, 1}
    assert has_path(rep, 5, 6)                   # shared reads stay after the wait


def test_mbarrier_keeps_order_with_memory():
    rep, _ = region("""
        st.shared.f32 [%r1], %f1;
        mbarrier.arrive.shared.b64 %rd1, [bar0];
        ld.shared.f32 %f2, [%r2];
        add.f32 %f3, %f4, %f4;
    """)
    assert has_path(rep, 0, 1) and has_path(rep, 1, 2)
    assert not has_path(rep, 1, 3)


def test_pinned_instruction_never_moves():
    rep, _ = region("""
        fma.rn.f32 %f1, %f2, %f3, %f1;
        .pin add.f32 %f10, %f11, %f11;
        ld.global.f32 %f5, [%rd1];
    """)
    assert rep.scheduled_order == [0, 1, 2]      # the load may not cross the pinned add


# ---- control codes ------------------------------------------------------------------------------
def test_variable_latency_uses_scoreboards_and_only_the_first_consumer_waits():
    rep, _ = region("""
        ld.shared.v2.f32 {%f1, %f2}, [%r1];
        fma.rn.f32 %f3, %f1, %f1, %f3;
        fma.rn.f32 %f4, %f2, %f2, %f4;
    """)
    ld, f1, f2 = (rep.control_scheduled[n] for n in (0, 1, 2))
    assert ld.write_sb is not None
    assert f1.wait_mask == 1 << ld.write_sb
    assert f2.wait_mask == 0                     # already waited for by the first FMA


def test_war_on_late_read_sets_a_read_scoreboard():
    rep, _ = region("""
        st.shared.f32 [%r1], %f1;
        mov.f32 %f1, 0f00000000;
    """)
    st, mov = rep.control_scheduled[0], rep.control_scheduled[1]
    assert st.read_sb is not None and st.write_sb is None
    assert mov.wait_mask == 1 << st.read_sb


def test_more_than_six_loads_share_scoreboards():
    loads = "\n".join(f"ld.shared.f32 %f{i}, [%r1+{4 * i}];" for i in range(8))
    uses = "\n".join(f"add.f32 %f{20 + i}, %f{i}, %f{i};" for i in range(8))
    rep, _ = region(loads + "\n" + uses)
    sbs = [rep.control_scheduled[n].write_sb for n in range(8)]
    assert all(sb is not None and 0 <= sb < 6 for sb in sbs)
    assert len(set(sbs)) == 6


def test_control_code_rendering():
    assert ControlCode(2, True, 2, None, 0).render() == "[B------:R-:W2:Y:S02]"
    assert ControlCode(15, False, None, 1, 0b100101).render() == "[B0-2--5:R1:W-:-:S15]"


def test_annotate_and_no_schedule_on_one_region():
    rep, res = region("""
        fma.rn.f32 %f1, %f2, %f3, %f1;
        ld.shared.f32 %f10, [%r1];
    """, schedule=False, annotate=True)
    lines = [ln for ln in res.ptx.splitlines() if "fma.rn.f32" in ln or "ld.shared" in ln]
    assert lines[0].lstrip().startswith("fma") and lines[1].lstrip().startswith("ld.shared")
    assert all("// [B" in ln and " t=" in ln for ln in lines)
    assert rep.emitted_order == [0, 1] and rep.scheduled_order == [1, 0]


# ---- errors -------------------------------------------------------------------------------------
def test_branch_in_region_is_an_error_at_its_line():
    with pytest.raises(AsmError) as info:
        region("""
        fma.rn.f32 %f1, %f2, %f3, %f1;
        @%p1 bra done;
        """)
    err = info.value
    assert "control transfer 'bra'" in err.message and err.span is not None
    assert err.format().startswith("r.sasm:") and ":" in err.format().split(":")[2] + ":"
    assert err.span.source.line_text(err.span.line).strip().startswith("@%p1 bra")


def test_label_in_region_is_an_error_at_its_line():
    with pytest.raises(AsmError) as info:
        region("""
        fma.rn.f32 %f1, %f2, %f3, %f1;
    here:
        fma.rn.f32 %f1, %f2, %f3, %f1;
        """)
    assert info.value.span is not None and info.value.format().startswith("r.sasm:")


def test_pre_volta_target_refuses_to_schedule():
    with pytest.raises(AsmError, match="cannot schedule for sm_61"):
        region("fma.rn.f32 %f1, %f2, %f3, %f1;", target="sm_61")
    # Without scheduling or annotations the region is emitted as written.
    kept = build_source(f".visible .entry k()\n{{{DECLS}\n.schedule\nfma.rn.f32 %f1, %f2, %f3, %f1;\n"
                        ".endschedule\nret;\n}\n", "r.sasm", BuildOptions(schedule=False, target="sm_61"))
    assert "fma.rn.f32 %f1" in kept.ptx and kept.schedule_report.regions == []


# ---- the latency table ------------------------------------------------------------------------
def test_every_figure_names_a_known_source():
    from asmgemm.scheduler.latencies_sm90 import SOURCES, estimated_figures
    for name, t in TABLE.items():
        assert t.latency >= 1 and t.issue >= 1, name
        for fld, src in t.sources().items():
            assert src in SOURCES, f"{name}.{fld}: unknown source {src!r}"
    # The classes of the SGEMM main loop are measured, not estimated.
    estimated = set(estimated_figures())
    for cls in ("FFMA", "LDS128", "LDG", "IMAD"):
        assert (cls, "latency") not in estimated and (cls, "issue") not in estimated, cls


def test_every_classified_opcode_has_a_row():
    from asmgemm.scheduler.classify import classify
    from asmgemm import ir
    for op in ("fma.rn.f32", "ld.shared.v4.f32", "ld.global.nc.f32", "st.shared.v2.f32", "mma.sync.aligned.m16n8k16",
               "cp.async.ca.shared.global", "shfl.sync.idx.b32", "ex2.approx.f32", "cvt.rn.f32.s32", "bar.sync",
               "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "setp.lt.u32", "frobnicate.b32"):
        assert classify(ir.Instruction(op, [])).cls in TABLE, op
