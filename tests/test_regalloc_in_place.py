"""The register plan renames the build's instructions in place (one IR per build, issue 36), and
keeps its bank conflicts compactly (regalloc.BankConflicts): what each says must not change."""
from __future__ import annotations

from asmgemm import ir
from asmgemm.pipeline import build_source

KERNEL = """\
.visible .entry k(.param .u64 p)
{
    .regs .f32 x : bank(0)
    .regs .f32 y : bank(0)
    .regs .f32 z : bank(0)
    .regs .u64 ptr
    .regs .pred q
    ld.param.u64 ptr, [p];
    ld.global.f32 x, [ptr];
    fma.rn.f32 z, x, y, z;
    setp.ne.f32 q, x, 0f00000000;
    @q fma.rn.f32 z, x, y, z;
    fma.rn.f32 x, x, y, z;
    st.global.f32 [ptr], z;
    ret;
}
"""


def test_conflicts_read_as_written_after_the_plan_renamed_the_instructions():
    r = build_source(KERNEL, "k.sasm")
    plan = r.allocation.functions["k"]
    conflicts = plan.conflicts
    assert len(conflicts) == 3 and bool(conflicts)
    assert [c.text for c in conflicts] == ["fma.rn.f32 z, x, y, z;", "@q fma.rn.f32 z, x, y, z;",
                                           "fma.rn.f32 x, x, y, z;"]
    assert [c.position for c in conflicts] == [2, 4, 5]
    assert [c.location.split(":", 1)[1] for c in conflicts] == ["10:5", "12:5", "13:5"]
    assert conflicts[-1].text == conflicts[2].text and [c.text for c in conflicts[1:]] == \
        [c.text for c in list(conflicts)[1:]]
    assert [(s["name"], s["bank"]) for s in conflicts[0].sources] == [("x", 0), ("y", 0), ("z", 0)]
    assert conflicts != [] and plan.to_json()["conflicts"][1]["text"] == "@q fma.rn.f32 z, x, y, z;"
    # the build's instructions carry the planned registers; the expanded module, asked for, the names
    planned = [i.render() for i in next(r.scheduled.functions()).instructions()]
    fmas = [t for t in planned if "fma" in t]
    assert len(fmas) == 3 and all(" x," not in t and " z," not in t and "%R" in t for t in fmas)
    written = [i.render() for i in next(r.expanded.functions()).instructions()]
    assert written[2] == "fma.rn.f32 z, x, y, z;" and written[4] == "@q fma.rn.f32 z, x, y, z;"
    assert next(r.expanded.functions()).named_regs[0].name == "x"
    assert all(isinstance(i, ir.Instruction) for i in next(r.expanded.functions()).instructions())
