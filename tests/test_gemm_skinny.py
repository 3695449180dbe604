"""The skinny kernels (kernels_ptx/gemm_skinny.sasm: sgemm_skinny, hgemm_skinny, bgemm_skinny) and
the ways calls reach them, on the CPU: every variant builds for sm_90 without spills (but the
16-bit element-by-element path's 4 bytes), with 128-bit loads of B hoisted ahead of the FMAs; the
16-bit tiled kernels' [[NAME.route]] tables parse, refuse what they cannot mean and pick per shape,
layout and dtype; sgemm reaches sgemm_skinny as entries of its catalog ([[sgemm.config]], up to
their max_m rows); asmgemm.gemm (through the stand-in CuPy) launches the skinny kernel on its grid,
with its split, and reports it (runtime.gemm.last_launch), while params=, a transposed B (the
kernel's guard refuses it) or rows past the entries' max_m keep sgemm."""
from __future__ import annotations

import re
import sys
import textwrap

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec, load_spec_file
from asmgemm.pipeline import BuildOptions, assemble, build_file
from asmgemm.toolchain import disassemble, find_tool
from dispatch_helpers import dispatch_dir  # noqa: F401  (the fixture)
from fake_cupy import FakeArray, forget_loaded, interpreting_kernel, make_cupy

needs_tools = pytest.mark.skipif(
    find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
    reason="ptxas/nvdisasm not installed")

CALLS = {"TRANS_A": 0, "TRANS_B": 0, "VEC_A": 1, "VEC_B": 1, "BIAS": 0, "ACT": 0, "BATCHED": 0}


# ---- the kernel ------------------------------------------------------------------------------------
@needs_tools
@pytest.mark.parametrize("defines", [{"MR": "4"}, {"MR": "8"}, {"MR": "16"}, {"MR": "4", "TRANS_A": "1", "VEC_B": "0"},
                                     {"MR": "16", "SPLIT_K": "1"}, {"MR": "8", "BIAS": "1", "ACT": "2"},
                                     {"MR": "4", "BIAS": "2", "ACT": "3"},
                                     {"DTYPE": "1", "MR": "8"}, {"DTYPE": "1", "MR": "4", "BIAS": "2", "ACT": "3"},
                                     {"DTYPE": "2", "MR": "8", "SPLIT_K": "1"}, {"DTYPE": "2", "MR": "4", "TRANS_A": "1"},
                                     {"DTYPE": "1", "MR": "8", "VEC_B": "0", "BIAS": "1", "ACT": "4"}])
def test_builds_clean_with_b_loads_ahead_of_the_fmas(defines):
    result = build_file("gemm_skinny", BuildOptions(defines=defines, target="sm_90"))
    asm = assemble(result)
    assert not asm.warnings, asm.warnings
    (k,) = asm.kernels
    half_scalar = defines.get("DTYPE", "0") != "0" and defines.get("VEC_B") == "0"
    if half_scalar:         # MIN_BLOCKS = 1: up to 255 registers, 4 bytes of spill (outside the B loop)
        assert k.spill_stores <= 16 and k.local_bytes == 0
    else:
        assert k.spill_stores == k.local_bytes == 0 and k.registers <= 128     # .minnctapersm 2 x 256 threads
    sass = disassemble(asm.cubin)
    ops = re.findall(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", sass, re.M)
    vec = defines.get("VEC_B", "1") == "1"
    loads = [i for i, op in enumerate(ops) if op.startswith("LDG") and (".128" in op) == vec]
    first_fma = next(i for i, op in enumerate(ops) if op.startswith("FFMA"))
    mr, half = int(defines["MR"]), defines.get("DTYPE", "0") != "0"
    # whole rows of B (16 bytes a lane) in flight before the first FMA: a group of 8 rows at fp32
    # MR = 4 and 8 (ptxas hoists them above the staging of A); at MR = 16 (64 accumulators) it
    # keeps 6, with 16-bit B and MR = 8 (64 accumulators, 8 conversions a row) 6 as well
    ahead = len([i for i in loads if i < first_fma])
    assert ahead >= (16 if not vec else 8 if mr <= 8 and not (half and mr == 8) else 4), ahead
    v = 8 if half else 4
    assert sum(op.startswith("FFMA") for op in ops) >= 32 * v * mr       # a round: 32 rows x MR x V columns
    split = defines.get("SPLIT_K") == "1"
    assert ("st.global.f32" in result.ptx) == (not half or split) and "bar.sync" in result.ptx
    if half and not split:
        assert f"cvt.rn.{'f16' if defines['DTYPE'] == '1' else 'bf16'}.f32" in result.ptx


@pytest.mark.parametrize("defines, message", [({"MR": "2"}, "MR must be 4, 8 or 16"),
                                              ({"MR": "16", "DTYPE": "1"}, "MR = 16 is for fp32 only"),
                                              ({"TRANS_B": "1"}, "reads B row-major"),
                                              ({"SPLIT_K": "1", "ACT": "1"}, "raw partial sums"),
                                              ({"UNROLL": "12"}, "UNROLL must divide KW"),
                                              ({"B_STREAM": "2"}, "B_STREAM is 0"),
                                              ({"CLUSTER_K": "9"}, "the portable cluster size"),
                                              ({"CLUSTER_K": "2", "SPLIT_K": "1"}, "one or the other")])
def test_refuses_what_it_does_not_do(defines, message):
    with pytest.raises(AsmError, match=message):
        build_file("gemm_skinny", BuildOptions(defines=defines, target="sm_90"))


@pytest.mark.parametrize("b_stream, load", [("1", "ld.global.cs.nc.v4.b32"), ("0", "ld.global.nc.v4.b32")])
def test_b_streams_through_l2_evict_first_by_default(b_stream, load):
    """B's 16-byte loads are ld.global.cs by default (evict-first: the stream does not push other
    kernels' dirty lines out of L2 to DRAM during this kernel; 1x4096x4096 0.86 -> 0.97 of cuBLAS)."""
    ptx = build_file("gemm_skinny", BuildOptions(defines={"B_STREAM": b_stream, "MR": "4"}, target="sm_90")).ptx
    loads = re.findall(r"ld\.global\S*\.v4\.b32", ptx)
    assert loads and set(loads) == {load}
    default = build_file("gemm_skinny", BuildOptions(defines={"MR": "4"}, target="sm_75")).ptx
    assert set(re.findall(r"ld\.global\S*\.v4\.b32", default)) == {"ld.global.cs.nc.v4.b32"}


@pytest.mark.toolchain
@needs_tools
def test_cluster_k_builds_a_cluster_of_grid_z_and_only_then():
    """CLUSTER_K = S: .reqnctapercluster 1, 1, S, the block sums read across the cluster in rank
    order, two cluster barriers; CLUSTER_K = 1 has no cluster directive at all (left out by the
    pipeline), so the same source builds for sm_80."""
    ptx = build_file("gemm_skinny", BuildOptions(defines={"CLUSTER_K": "6", "MR": "4"}, target="sm_90")).ptx
    assert ".reqnctapercluster 1, 1, 6" in ptx and ptx.count("barrier.cluster.wait.acquire") == 2
    assert [int(r) for r in re.findall(r"mapa\.shared::cluster\.u32 \S+, \S+, (\d+);", ptx)] == list(range(6))
    assert ptx.count("ld.shared::cluster.v4.f32") == 6
    plain = build_file("gemm_skinny", BuildOptions(defines={"MR": "4"}, target="sm_80")).ptx
    assert "reqnctapercluster" not in plain and "cluster" not in plain.split(".entry", 1)[1]
    with pytest.raises(AsmError, match="clusters"):
        build_file("gemm_skinny", BuildOptions(defines={"CLUSTER_K": "2"}, target="sm_80"))


# ---- the route -------------------------------------------------------------------------------------
def test_sgemm_reaches_the_skinny_kernel_through_its_catalog():
    """The skinny kernel is sgemm's catalog entries skinny_r4/r8/r16 (MR = 4, 8, 16: the tile's rows),
    candidates up to their max_m rows; sgemm itself routes nowhere. Named with kernel=, the skinny
    kernel keeps its own size rule (MR from the rows)."""
    spec = get_spec("sgemm")
    assert spec.routes == () and spec.route_for(1, 4096, 4096, 132, CALLS) is None
    assert spec.to_json()["routes"] == []
    entries = [e for e in spec.configs if e.kernel == "sgemm_skinny"]
    assert sorted(dict(e.set)["MR"] for e in entries) == [4, 8, 16]
    assert all(e.tile[0] == dict(e.set)["MR"] and e.max_m is not None and 1 in e.splits for e in entries)
    skinny = get_spec("sgemm_skinny")
    assert skinny.dtypes == spec.dtypes and not skinny.routes and not skinny.configs
    assert skinny.size_rule(1, 4096, 4096, 132) == {"MR": 4} and skinny.size_rule(9, 64, 64, 132) == {"MR": 16}
    assert skinny.size_rule(8, 64, 64, 132) == {}      # the source's default, MR = 8


def test_each_16_bit_kernel_routes_to_its_own_dtype_and_the_fp32_c_ones_nowhere():
    # (TRANS_A = 1: with a K-contiguous A the swap rule's tensor-core launch runs instead)
    calls = {"TRANS_A": 1, "TRANS_B": 0, "VEC_C": 1, "WIDE_C": 1, "BIAS": 0, "ACT": 0}
    for tiled, skinny in (("hgemm", "hgemm_skinny"), ("bgemm", "bgemm_skinny")):
        spec = get_spec(tiled)
        assert spec.route_for(4, 4096, 4096, 132, calls) == skinny
        assert spec.route_for(4, 4096, 4096, 132, {**calls, "TRANS_A": 0}) is None
        assert get_spec(skinny).dtypes == spec.dtypes
        assert spec.route_for(4, 4096, 4096, 132, {**calls, "TRANS_B": 1}) is None
        assert spec.route_for(5, 4096, 4096, 132, calls) is None        # the tensor cores win from here
        assert spec.route_for(1, 3072, 768, 132, calls) is None         # small B: the split tiled kernel
    for name in ("hgemm_f32c", "bgemm_f32c"):
        assert get_spec(name).routes == ()
    h = get_spec("hgemm_skinny")
    assert dict(h.defines) == {"DTYPE": 1} and h.size_rule(3, 64, 64, 132) == {"MR": 4} and h.size_rule(9, 64, 64, 132) == {}
    assert h.split_k.splits(1, 4096, 4096, 132) == 16       # 16 blocks of 256 columns: ceil(264 / 16) = 17, K // 256 = 16


def _spec_text(route: str) -> str:
    return textwrap.dedent('''
        [k]
        source = "sgemm.sasm"
        dtypes = { a = "float32", b = "float32", acc = "float32", c = "float32" }
        targets = ["sm_90"]
        abi = ["A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "alpha", "beta"]
        call_params = { TRANS_B = "trans_b" }
        rel_err_limit = 1e-4
        [k.launch]
        threads = "THREADS"
        tile_m = "TM"
        tile_n = "TN"
        smem_bytes = "SMEM_BYTES"
        ''') + route


@pytest.mark.parametrize("route, message", [
    ('[[k.route]]\nwhen = "M <= 4 and TRANS_A == 0"\nkernel = "other"\n', "undefined name 'TRANS_A' in a route"),
    ('[[k.route]]\nwhen = "M <= 4"\nkernel = "k"\n', "is not another kernel's name"),
    ('[[k.route]]\nwhen = "M <= 4"\n', "exactly 'when' and 'kernel'"),
    ('[k.route]\nwhen = "M <= 4"\nkernel = "x"\n', "route: an array of tables"),
])
def test_bad_routes_are_refused_at_load_with_the_file(tmp_path, route, message):
    (tmp_path / "sgemm.sasm").write_text("")
    f = tmp_path / "kernels.toml"
    f.write_text(_spec_text(route))
    with pytest.raises(AsmError, match=message) as info:
        load_spec_file(f)
    assert str(f) in info.value.format()


def test_a_route_sees_sizes_and_the_call_parameters(tmp_path):
    (tmp_path / "sgemm.sasm").write_text("")
    f = tmp_path / "kernels.toml"
    f.write_text(_spec_text('[[k.route]]\nwhen = "M * N <= 64 and TRANS_B == 1"\nkernel = "small"\n'))
    (spec,) = load_spec_file(f)
    assert spec.route_for(8, 8, 100, 132, {"TRANS_B": 1}) == "small"
    assert spec.route_for(8, 9, 100, 132, {"TRANS_B": 1}) is None
    assert spec.route_for(8, 8, 100, 132, {"TRANS_B": 0}) is None


# ---- asmgemm.gemm through a stand-in CuPy --------------------------------------------------------




def _rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32).view(FakeArray)


def _gemm(m, n, k, trans_b=False, **kw):
    import asmgemm
    a = _rand(m, k)
    b = _rand(*((n, k) if trans_b else (k, n)), seed=1)
    c = np.zeros((m, n), np.float32).view(FakeArray)
    asmgemm.gemm(a, b, c, trans_b=trans_b, **kw)
    want = np.asarray(a, np.float64) @ (np.asarray(b, np.float64).T if trans_b else np.asarray(b, np.float64))
    np.testing.assert_allclose(np.asarray(c), want, rtol=1e-4, atol=1e-3)


@pytest.mark.toolchain
@needs_tools
def test_gemm_launches_the_named_kernel_and_says_so(fake_fp32_gemm):
    """kernel="sgemm_skinny" without params=: its own size and split rules decide ("size rules")."""
    from asmgemm.runtime.gemm import last_launch
    _, launches = fake_fp32_gemm
    _gemm(3, 300, 200, kernel="sgemm_skinny")  # K < 512: no split; 3 column blocks of 128, one of MR = 4 rows
    ran = last_launch()
    assert {k: v for k, v in ran.items() if k not in ("target", "params")} == {
        "kernel": "sgemm_skinny", "entry": "gemm_skinny", "grid": (3, 1, 1), "block": (256, 1, 1), "tile": (4, 128),
        "cluster": 1, "splits": 1, "reduce": None, "c_trans": False, "copies": (), "a_ldg": False,
        "config": None, "chosen_by": "size rules", "blocks_per_sm": None, "clusters_at_once": None}
    assert ran["target"] == "sm_90" and ran["params"]["MR"] == "4", ran
    assert launches[-1][0] == (3, 1, 1)
    # 16 column blocks: S = min(8, ceil(264 / 16)) = 8 of 256; on sm_90 (the stand-in's) the 8 blocks
    # of a column block are one cluster adding their sums: one launch, no reduce kernel
    n_before = len(launches)
    _gemm(1, 2048, 2048, kernel="sgemm_skinny")
    assert last_launch()["kernel"] == "sgemm_skinny" and last_launch()["splits"] == 8
    assert last_launch()["reduce"] == "cluster" and last_launch()["cluster"] == 8
    assert len(launches) == n_before + 1 and launches[-1][0] == (16, 1, 8)
    # up to 8 rows, as many splits as fit in clusters at once: 32 column blocks, 240 // 32 = 7 asked,
    # 6 of 768 k (whole 256-k rounds)
    _gemm(1, 4096, 4096, kernel="sgemm_skinny")
    assert last_launch()["splits"] == 6 and last_launch()["reduce"] == "cluster"
    # 16 rows: 64 column blocks, S = min(16, ceil(264 / 64)) = 5 asked, 4 of 1024 k: 256 blocks, more
    # than the clusters that fit at once (cluster_when: 2 (SMS - 12) = 240), so the partial pass and
    # the reduce
    n_before = len(launches)
    _gemm(16, 8192, 4096, kernel="sgemm_skinny")
    assert last_launch()["splits"] == 4 and last_launch()["reduce"] == "kernel"
    assert len(launches) == n_before + 2 and launches[-2][0] == (64, 1, 4)
    # S > 8 (the portable cluster size) keeps the partial pass and the reduce
    n_before = len(launches)
    _gemm(1, 256, 8192, kernel="sgemm_skinny", params={"SPLIT_K": 16})
    assert last_launch()["splits"] == 16 and last_launch()["reduce"] == "kernel"
    assert last_launch()["chosen_by"] == "params"
    assert len(launches) == n_before + 2 and launches[-2][0] == (2, 1, 16)


@pytest.mark.toolchain
@needs_tools
def test_an_untuned_sgemm_call_runs_a_skinny_entry(fake_fp32_gemm, dispatch_dir):
    """sgemm untuned, the database's hit skinny_r4/s8c for 1 x 2048 x 2048: sgemm_skinny with MR = 4,
    8 splits in clusters of 8 on (16, 1, 8), one launch; and skinny_r16/s4 for 16 x 8192 x 4096:
    the partial pass on (64, 1, 4) and the reduce."""
    from asmgemm.runtime.gemm import last_launch
    _, launches = fake_fp32_gemm
    dispatch_dir("Fake GPU", best={"sgemm|nn|1x2048x2048|plain": "skinny_r4/s8c",
                                   "sgemm|nn|16x8192x4096|plain": "skinny_r16/s4"})
    _gemm(1, 2048, 2048)
    ran = last_launch()
    assert (ran["kernel"], ran["config"], ran["chosen_by"]) == ("sgemm_skinny", "skinny_r4/s8c", "database")
    assert (ran["splits"], ran["reduce"], ran["cluster"], ran["params"]["MR"]) == (8, "cluster", 8, "4")
    assert len(launches) == 1 and launches[-1][0] == (16, 1, 8)
    _gemm(16, 8192, 4096)
    ran = last_launch()
    assert (ran["kernel"], ran["config"], ran["splits"], ran["reduce"]) == ("sgemm_skinny", "skinny_r16/s4", 4, "kernel")
    assert len(launches) == 3 and launches[-2][0] == (64, 1, 4)


@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("case", ["params", "trans_b", "past max_m"])
def test_what_keeps_sgemm(fake_fp32_gemm, dispatch_dir, case):
    from asmgemm.runtime.gemm import last_launch
    dispatch_dir("Fake GPU")
    if case == "params":
        _gemm(3, 300, 200, params={"THREADS": 64, "BK": 16})
    elif case == "trans_b":
        _gemm(3, 300, 200, trans_b=True)           # gemm_skinny's TRANS_B guard refuses every skinny build
    else:
        rows = max(e.max_m for e in get_spec("sgemm").configs if e.kernel == "sgemm_skinny") + 1
        _gemm(rows, 300, 200)
    assert last_launch()["kernel"] == "sgemm"


def test_bench_names_the_routed_kernel_and_its_split(monkeypatch):
    from asmgemm.bench import runner
    from asmgemm.bench.shapes import Shape
    from asmgemm.runtime import gemm
    row = runner.BenchRow("sgemm", "float32", "nn", Shape(1, 4096, 4096), 1e-4, {"SPLIT_K": 9}, "defaults")
    monkeypatch.setattr(gemm, "last_launch", lambda: {"kernel": "sgemm", "splits": 9})
    runner._note_route(row, get_spec("sgemm"))
    assert row.ran is None and row.params == {"SPLIT_K": 9}
    monkeypatch.setattr(gemm, "last_launch", lambda: {"kernel": "sgemm_skinny", "splits": 8})
    runner._note_route(row, get_spec("sgemm"))
    assert row.ran == "sgemm_skinny" and row.params == {"SPLIT_K": 8}
    assert row.to_json()["ran"] == "sgemm_skinny" and row.to_json()["kernel"] == "sgemm"


@pytest.mark.toolchain
@needs_tools
def test_params_naming_the_cluster_switch_as_1_take_the_reduce(fake_fp32_gemm):
    """params={'CLUSTER_K': 1} keeps a split of <= 8 on the workspace and the reduce kernel (what
    tools/variant_ab.py compares the cluster's sums against)."""
    from asmgemm.runtime.gemm import last_launch
    _, launches = fake_fp32_gemm
    n_before = len(launches)
    _gemm(2, 512, 2048, kernel="sgemm_skinny", params={"SPLIT_K": 4, "CLUSTER_K": 1})
    assert last_launch()["reduce"] == "kernel" and last_launch()["splits"] == 4
    assert len(launches) == n_before + 2
    _gemm(2, 512, 2048, kernel="sgemm_skinny", params={"SPLIT_K": 4})
    assert last_launch()["reduce"] == "cluster" and len(launches) == n_before + 3
