"""The SGEMM kernel on the CPU: every shipped variant builds, ptxas reports no spills and no local
memory, the main loop's FFMAs are fed by LDS.128, the epilogue stores to shared memory with
STS.128, the register plan has no three-source bank conflicts, and invalid parameter
combinations stop the build with the kernel's own message."""
from __future__ import annotations

import functools
import re
from collections import Counter

import pytest

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, assemble, build_file
from asmgemm.toolchain import disassemble, find_tool
from sweeps import sample_every

# (THREADS, RQ, BK): the tuning space of kernels_ptx/sgemm.sasm (`.tune` lines) that builds.
CONFIGS = [(256, 2, 8), (256, 2, 16), (256, 4, 8), (256, 4, 16), (64, 2, 8), (64, 2, 16)]
LAYOUT_FLAGS = [(ta, tb, va, vb) for ta in (0, 1) for tb in (0, 1) for va in (0, 1) for vb in (0, 1)]


def _has_tools() -> bool:
    return find_tool("ptxas", required=False) is not None and find_tool("nvdisasm", required=False) is not None


toolchain = pytest.mark.toolchain
needs_tools = pytest.mark.skipif(not _has_tools(), reason="ptxas/nvdisasm not installed")


@functools.lru_cache(maxsize=None)
def _build(threads=256, rq=2, bk=8, ta=0, tb=0, va=1, vb=1, prefetch=0, schedule=True, async_=0):
    defines = {"THREADS": str(threads), "RQ": str(rq), "BK": str(bk), "TRANS_A": str(ta), "TRANS_B": str(tb),
               "VEC_A": str(va), "VEC_B": str(vb), "PREFETCH": str(prefetch), "ASYNC": str(async_)}
    return build_file("sgemm", BuildOptions(defines=defines, schedule=schedule))


def _sass_instructions(sass: str) -> list[tuple[int, str]]:
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def _opcode(text: str) -> str:
    words = text.split()
    return words[1] if words[0].startswith("@") else words[0]


def _loop_lines(sass: str) -> list[str]:
    """SASS text of the k-loop's instructions, in order (padding left out)."""
    labels, pending = {}, None
    for line in sass.splitlines():
        m = re.match(r"^\.(L_x_\d+):", line)
        if m:
            pending = m.group(1)
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)
        if m and pending:
            labels[pending], pending = int(m.group(1), 16), None
    ins = _sass_instructions(sass)
    best = None
    for addr, text in ins:
        m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", text)
        if m and m.group(1) in labels and labels[m.group(1)] < addr:
            if best is None or addr - labels[m.group(1)] > best[1] - best[0]:
                best = (labels[m.group(1)], addr)
    assert best is not None, "no loop found in the SASS"
    # `@!PT LDS RZ, [RZ]` is padding ptxas puts before LDGSTS: never executed
    return [t for a, t in ins if best[0] <= a <= best[1] and not t.startswith("@!PT ")]


def main_loop(sass: str) -> list[str]:
    """Opcodes of the longest backward branch's body: the k-loop."""
    return [_opcode(t) for t in _loop_lines(sass)]


def _check_variant(threads, rq, bk, ta, tb, va, vb, prefetch=0, async_=0):
    result = _build(threads, rq, bk, ta, tb, va, vb, prefetch, async_=async_)
    asm = assemble(result, ["-v"])
    (k,) = [k for k in asm.kernels if k.name == "sgemm"]
    where = f"THREADS={threads} RQ={rq} BK={bk} TRANS={ta}{tb} VEC={va}{vb} PREFETCH={prefetch} ASYNC={async_}"
    assert k.spill_stores == 0 and k.spill_loads == 0, f"{where}: spills {k}"
    assert k.stack_frame == 0 and k.local_bytes == 0, f"{where}: local memory {k}"
    sass = disassemble(asm.cubin, ["-c"])
    ops = [_opcode(t) for _, t in _sass_instructions(sass)]
    assert not any(op.startswith(("LDL", "STL")) for op in ops), f"{where}: local-memory access in SASS"
    loop = Counter(op.split(".")[0] + (".128" if ".128" in op else "") for op in main_loop(sass))
    # Each thread does (4*RQ) x 8 FMAs per k; the whole tile of BK k-steps is unrolled in the loop.
    assert loop["FFMA"] == 32 * rq * bk, f"{where}: {loop['FFMA']} FFMAs in the loop"
    # Fragments: RQ + 2 LDS.128 per k, no narrower shared loads in the loop.
    assert loop["LDS.128"] == (rq + 2) * bk, f"{where}: {loop['LDS.128']} LDS.128 in the loop"
    assert loop["LDS"] == 0, f"{where}: scalar LDS in the loop"
    assert loop["BAR"] == 1, f"{where}: one barrier per tile expected, got {loop['BAR']}"
    wide = "LDGSTS.128" if async_ else "LDG.128"
    if va and ta or vb and not tb:
        assert loop[wide] > 0, f"{where}: 128-bit global loads expected ({wide})"
    if va and not ta and not async_:
        assert loop[wide] > 0, f"{where}: 128-bit global loads of A expected"
    if not va and not vb:
        assert loop[wide] == 0, f"{where}: 128-bit global loads without alignment checks"
    if async_:
        # global -> shared without registers: cp.async, no LDG/STS pair in the loop
        assert loop["LDGSTS"] + loop["LDGSTS.128"] > 0 and loop["LDG"] + loop["LDG.128"] == 0, f"{where}: {loop}"
    # Epilogue: the maxas transpose writes each row of the 4x4 sub-tiles with 128-bit stores.
    sts128 = sum(1 for op in ops if op.startswith("STS.128"))
    assert sts128 >= 2 * 4 * rq, f"{where}: {sts128} STS.128 (epilogue transpose needs {2 * 4 * rq} per C pass set)"
    return result


@toolchain
@needs_tools
@pytest.mark.parametrize("ta,tb,va,vb", sample_every(16, LAYOUT_FLAGS, unpack=True), ids=lambda *a: None)
def test_default_config_every_layout(ta, tb, va, vb):
    _check_variant(256, 2, 8, ta, tb, va, vb)


@toolchain
@needs_tools
@pytest.mark.parametrize("threads,rq,bk", sample_every(5, CONFIGS[1:], unpack=True), ids=[f"t{t}-rq{r}-bk{b}" for t, r, b in CONFIGS[1:]])
@pytest.mark.parametrize("ta,tb,va,vb", sample_every(2, [(0, 0, 1, 1), (1, 1, 0, 0)], unpack=True), ids=["nn-vec", "tt-scalar"])
def test_tuning_space(threads, rq, bk, ta, tb, va, vb):
    _check_variant(threads, rq, bk, ta, tb, va, vb)


@toolchain
@needs_tools
def test_prefetch_variant():
    """PREFETCH=1: all of the next tile's loads at the start of the tile."""
    _check_variant(256, 4, 8, 0, 0, 1, 1, prefetch=1)


@toolchain
@needs_tools
@pytest.mark.parametrize("rq,bk", sample_every(2, [(2, 8), (4, 16)], unpack=True))
def test_async_copy_variant(rq, bk):
    """ASYNC=1: cp.async (LDGSTS) from global straight to shared memory."""
    _check_variant(256, rq, bk, 0, 0, 1, 1, async_=1)
    _check_variant(256, rq, bk, 1, 1, 0, 0, async_=1)


@pytest.mark.parametrize("threads,rq,bk", sample_every(6, CONFIGS, unpack=True), ids=[f"t{t}-rq{r}-bk{b}" for t, r, b in CONFIGS])
def test_register_plan_has_no_bank_conflicts(threads, rq, bk):
    result = _build(threads, rq, bk)
    plan = result.allocation.functions["sgemm"]
    assert plan.three_source_checked >= 32 * rq * bk, "the FMAs were not checked"
    assert plan.conflicts == [], f"t{threads} rq{rq} bk{bk}: {plan.conflicts[0].text}"


def test_schedule_regions_and_no_schedule_build():
    scheduled = _build()
    plain = _build(schedule=False)
    assert "sgemm" in plain.kernel_names
    assert plain.ptx.count("fma.rn.f32") == scheduled.ptx.count("fma.rn.f32")
    assert ".schedule region" in scheduled.ptx or scheduled.schedule_report is not None


def test_tunables_and_defaults():
    result = _build()
    assert set(result.tunables) >= {"THREADS", "BK", "RQ", "ASYNC"}
    assert result.parameters["THREADS"] == 256 and result.parameters["BK"] == 8


@pytest.mark.parametrize("threads,rq,bk", sample_every(3, CONFIGS, unpack=True), ids=[f"t{t}-rq{r}-bk{b}" for t, r, b in CONFIGS])
def test_launch_geometry_from_the_build(threads, rq, bk):
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.build_cache import abi_params, launch_geometry
    spec = get_spec("sgemm")
    result = _build(threads, rq, bk)
    geo = launch_geometry(spec, result)
    tile_n = 128 if threads == 256 else 64
    assert geo["threads"] == threads
    assert geo["tile_n"] == tile_n and geo["tile_m"] == tile_n // 2 * rq
    # two buffers of A (BK x (TM+4)) and B (BK x (TN+4)) floats
    assert geo["smem_bytes"] >= 2 * bk * (geo["tile_m"] + 4 + geo["tile_n"] + 4) * 4
    # the kernel's own record of its geometry (its *_meta_* symbols) agrees with the spec's constants
    for what, key in (("threads", "threads"), ("tilem", "tile_m"), ("tilen", "tile_n"), ("smem", "smem_bytes")):
        assert f".u32 sgemm_meta_{what}_{geo[key]};" in result.ptx
    assert [n for n, _ in abi_params(spec, result)] == list(spec.abi)


@pytest.mark.parametrize("defines,message", [
    ({"THREADS": "128"}, "THREADS must be 256"),
    ({"BK": "12"}, "BK must be a power of two"),
    ({"BK": "32"}, "BK > 16"),
    ({"THREADS": "256", "BK": "4"}, "needs BK >= 8"),
    ({"THREADS": "64", "RQ": "4"}, "RQ=4"),
    ({"RQ": "3"}, "RQ must be 2"),
    ({"TRANS_A": "2"}, "are 0 or 1"),
])
def test_invalid_combinations_are_rejected(defines, message):
    with pytest.raises(AsmError, match=message):
        build_file("sgemm", BuildOptions(defines=defines))


@functools.lru_cache(maxsize=None)
def _build_defines(**defines):
    return build_file("sgemm", BuildOptions(defines={k: str(v) for k, v in defines.items()}))


@toolchain
@needs_tools
@pytest.mark.parametrize("rq,bk,ta,tb,va,vb", sample_every(5, [(4, 8, 0, 0, 1, 1), (4, 8, 1, 1, 0, 0), (2, 8, 0, 0, 1, 1),
                                                                (2, 8, 0, 1, 0, 1), (4, 16, 0, 0, 1, 1)], unpack=True),
                         ids=["rq4-nn-vec", "rq4-tt-scalar", "rq2-nn-vec", "rq2-nt-scalar", "rq4-bk16-nn-vec"])
def test_load_ahead_pins_global_loads_before_the_barrier(rq, bk, ta, tb, va, vb):
    """LOAD_AHEAD=1 with coherent loads (LDG_NC=0): every global load of the loop is issued before
    the barrier and every shared store of the staged tile after the loop's top, so a load and the
    store of its data are a barrier apart (ptxas sinks loads toward their stores otherwise)."""
    result = _build_defines(THREADS=256, RQ=rq, BK=bk, TRANS_A=ta, TRANS_B=tb, VEC_A=va, VEC_B=vb,
                            LOAD_AHEAD=1, LDG_NC=0)
    asm = assemble(result, ["-v"])
    (k,) = [k for k in asm.kernels if k.name == "sgemm"]
    assert k.spill_stores == 0 and k.spill_loads == 0 and k.local_bytes == 0, f"spills: {k}"
    loop = _loop_lines(disassemble(asm.cubin, ["-c"]))
    ops = [_opcode(t) for t in loop]
    mix = Counter(op.split(".")[0] + (".128" if ".128" in op else "") for op in ops)
    assert mix["FFMA"] == 32 * rq * bk and mix["LDS.128"] == (rq + 2) * bk and mix["BAR"] == 1, mix
    bar = next(i for i, op in enumerate(ops) if op.startswith("BAR"))
    ldg = [i for i, op in enumerate(ops) if op.startswith("LDG")]
    sts = [i for i, op in enumerate(ops) if op.startswith("STS")]
    assert ldg and all(i < bar for i in ldg), f"global loads after the barrier: {ldg} (BAR at {bar})"
    assert all(op.startswith("LDG.E") and "CONSTANT" not in op for op in (ops[i] for i in ldg)), \
        "LDG_NC=0 must emit coherent loads"
    # the staged tile is stored in the same barrier interval (its buffer is free since the last one)
    assert sts and all(i < bar for i in sts), f"shared stores after the barrier: {sts} (BAR at {bar})"


@pytest.mark.parametrize("extra", sample_every(4, [{"ASYNC": 1}, {"PREFETCH": 1, "RQ": 4}, {"BK": 16}, {"BK": 16, "THREADS": 64}]),
                         ids=["async", "prefetch-rq4", "bk16", "bk16-t64"])
def test_load_ahead_applies_only_where_it_fits(extra):
    """LOAD_AHEAD=1 builds the plain kernel with ASYNC=1, PREFETCH=1 or BK=16 with RQ=2 (see AHEAD in the
    kernel), so any combination of the other parameters still builds whatever its default is."""
    plain = _build_defines(**extra)
    ahead = _build_defines(LOAD_AHEAD=1, **extra)
    assert ahead.ptx.count("bar.sync") == plain.ptx.count("bar.sync")
    assert "drain_tile" not in ahead.ptx and len(ahead.ptx.splitlines()) == len(plain.ptx.splitlines()), extra


def test_load_ahead_builds_its_drain_where_it_applies():
    """The plain kernel with LOAD_AHEAD=1 drains its last tile; a value other than 0 or 1 is refused."""
    assert "drain_tile" in _build_defines(LOAD_AHEAD=1).ptx
    with pytest.raises(AsmError, match="LOAD_AHEAD and LDG_NC are 0 or 1"):
        build_file("sgemm", BuildOptions(defines={"LOAD_AHEAD": "2"}))


def test_a_catalog_candidate_builds_its_entry():
    """gemm() without params or a tuned entry runs a catalog candidate (tests/test_dispatch.py),
    handing its params to the build as a tuning entry: each sgemm entry's -D set lands whole on the
    source's defaults, whatever the size (sgemm has no size rule left to overrule it), with the
    split switches off for an unsplit candidate; params= bypass the catalog."""
    np = pytest.importorskip("numpy")
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.catalog import Candidate
    from asmgemm.runtime.launch import choose_params
    from asmgemm.runtime.plan import plan_launch
    spec = get_spec("sgemm")

    def _plan(m, n, k):
        a, b, c = np.zeros((m, k), np.float32), np.zeros((k, n), np.float32), np.zeros((m, n), np.float32)
        return plan_launch(a, b, c, trans_a=False, trans_b=False, ptr_of=lambda x: 256)

    entries = [e for e in spec.configs if e.kernel == "sgemm"]
    assert {"LOAD_AHEAD": 1, "RQ": 4, "BK": 16, "LDG_NC": 0} in [dict(e.set) for e in entries]
    for e in entries:
        cand = Candidate("sgemm", e.name, e.kernel, e.set, e.tile)
        for m, n, k in ((4096, 4096, 4096), (128, 768, 768), (3000, 5000, 700)):
            chosen = choose_params(spec, _plan(m, n, k), None, cand.params(), 132, {"SPLIT_K": 0})
            assert {p: chosen[p] for p in dict(e.set)} == dict(e.set), (e.name, m, n, k)
            assert chosen["SPLIT_K"] == 0 and chosen.get("LOAD_AHEAD", 0) == dict(e.set).get("LOAD_AHEAD", 0)
    explicit = _plan(4096, 4096, 64)
    assert choose_params(spec, explicit, {"RQ": 2}, None, 132).get("LOAD_AHEAD", 0) == 0, "params= bypass the catalog"
