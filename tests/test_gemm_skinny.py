"""The skinny kernels (kernels_ptx/gemm_skinny.sasm: sgemm_skinny, hgemm_skinny, bgemm_skinny) and
the ways calls reach them, on the CPU: every variant builds for sm_90 without spills (but the
16-bit element-by-element path's 4 bytes), with 128-bit loads of B hoisted ahead of the FMAs; the
16-bit tiled kernels' [[NAME.route]] tables parse, refuse what they cannot mean and pick per shape,
layout and dtype; sgemm reaches sgemm_skinny as entries of its catalog ([[sgemm.config]], up to
their max_m rows); asmgemm.gemm (through the stand-in CuPy) launches the skinny kernel on its grid,
with its split, and reports it (runtime.gemm.last_launch), while params= or rows past the entries'
max_m keep sgemm.

The K-major path (TRANS_B=1: B stored N x K, nn.Linear's weight) builds in every mode for sm_90
and sm_80 without spills, one 16-byte evict-first load of B per row and step, and computes C in
the PTX interpreter (tests/ptx_sim.py: the built PTX itself, run on numpy arrays) at odd shapes,
K tails, unaligned B, transposed A, split-K, clusters and every epilogue, directly and through
asmgemm.gemm; the interpreter is first checked against the row-major path."""
from __future__ import annotations

import functools
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
from fake_cupy import FakeArray, forget_loaded, interpreting_kernel, make_cupy, registering_empty, simulating_kernel
from ptx_sim import Kernel, Memory, SimError
from sweeps import sample_every

needs_tools = pytest.mark.skipif(
    find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
    reason="ptxas/nvdisasm not installed")

CALLS = {"TRANS_A": 0, "TRANS_B": 0, "VEC_A": 1, "VEC_B": 1, "BIAS": 0, "ACT": 0, "BATCHED": 0}


# ---- the kernel ------------------------------------------------------------------------------------
@needs_tools
@pytest.mark.parametrize("defines", sample_every(12, [{"MR": "4"}, {"MR": "8"}, {"MR": "16"}, {"MR": "4", "TRANS_A": "1", "VEC_B": "0"},
                                     {"MR": "16", "SPLIT_K": "1"}, {"MR": "8", "BIAS": "1", "ACT": "2"},
                                     {"MR": "4", "BIAS": "2", "ACT": "3"},
                                     {"DTYPE": "1", "MR": "8"}, {"DTYPE": "1", "MR": "4", "BIAS": "2", "ACT": "3"},
                                     {"DTYPE": "2", "MR": "8", "SPLIT_K": "1"}, {"DTYPE": "2", "MR": "4", "TRANS_A": "1"},
                                     {"DTYPE": "1", "MR": "8", "VEC_B": "0", "BIAS": "1", "ACT": "4"}]))
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
                                              ({"TRANS_B": "2"}, "TRANS_B is 0"),
                                              ({"MR": "1"}, "MR must be 4, 8 or 16"),
                                              ({"TRANS_B": "1", "MR": "3"}, "MR must be 1, 2, 4, 8 or 16 with TRANS_B"),
                                              ({"TRANS_B": "1", "MR": "16", "DTYPE": "2"}, "MR = 16 is for fp32 only"),
                                              ({"TRANS_B": "1", "NR": "3"}, "NR .rows of B per warp"),
                                              ({"TRANS_B": "1", "KU": "3"}, "KU .TRANS_B=1. must divide"),
                                              ({"TRANS_B": "1", "KB": "768"}, "KB .TRANS_B=1. is a power of two"),
                                              ({"TRANS_B": "1", "KB": "64"}, "KB .TRANS_B=1. is a power of two"),
                                              ({"TRANS_B": "1", "SPLIT_K": "1", "BIAS": "1"}, "raw partial sums"),
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
    """The skinny kernel is sgemm's catalog entries skinny_r* (MR = 4, 8, 16 and more: the tile's
    rows, for either layout of B), candidates up to their max_m rows, and the skinny_ct_* entries
    that run few columns as C^T; sgemm itself routes nowhere. Named with kernel=, the skinny kernel
    keeps its own size rule (MR from the rows)."""
    spec = get_spec("sgemm")
    assert spec.routes == () and spec.route_for(1, 4096, 4096, 132, CALLS) is None
    assert spec.to_json()["routes"] == []
    entries = [e for e in spec.configs if e.kernel == "sgemm_skinny"]
    assert {4, 8, 16} <= {dict(e.set)["MR"] for e in entries if not e.swap}
    assert all(e.tile_for(tb)[0] == dict(e.set)["MR"] for e in entries for tb in (0, 1))
    assert all(e.max_m is not None and 1 in e.splits for e in entries)
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
    assert {k: v for k, v in ran.items() if k not in ("target", "params", "rerun_params")} == {
        "kernel": "sgemm_skinny", "entry": "gemm_skinny", "grid": (3, 1, 1), "block": (256, 1, 1), "tile": (4, 128),
        "cluster": 1, "splits": 1, "reduce": None, "c_trans": False, "copies": (), "a_ldg": False, "c_shifted": False,
        "config": None, "chosen_by": "size rules", "sass_patch": None, "ptxas_options": None, "blocks_per_sm": None,
        "clusters_at_once": None}
    assert ran["target"] == "sm_90" and ran["params"]["MR"] == "4", ran
    # params= that run this configuration again: the build's defines as integers, without the
    # split switch (params= name a split by its count; absent means none, as here)
    assert ran["rerun_params"] == {k: int(v) for k, v in ran["params"].items() if k != "SPLIT_K"}
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
@pytest.mark.parametrize("case", ["params", "past max_m"])
def test_what_keeps_sgemm(fake_fp32_gemm, dispatch_dir, case):
    from asmgemm.runtime.gemm import last_launch
    dispatch_dir("Fake GPU")
    if case == "params":
        _gemm(3, 300, 200, params={"THREADS": 64, "BK": 16})
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


# ---- TRANS_B = 1: B stored N x K (torch.nn.Linear's weight), the K-major path -------------------
KMAJOR_BUILDS = [("sm_90", {"MR": "1"}), ("sm_90", {"MR": "2", "BIAS": "2", "ACT": "3"}), ("sm_90", {"MR": "4"}),
                 ("sm_90", {"MR": "8", "BIAS": "1", "ACT": "2"}), ("sm_90", {"MR": "16"}),
                 ("sm_90", {"MR": "16", "SPLIT_K": "1"}), ("sm_90", {"MR": "16", "TRANS_A": "1"}),
                 ("sm_90", {"MR": "1", "SPLIT_K": "1"}), ("sm_90", {"MR": "4", "CLUSTER_K": "4"}),
                 ("sm_90", {"MR": "4", "VEC_B": "0"}), ("sm_90", {"MR": "8", "TRANS_A": "1", "VEC_B": "0"}),
                 ("sm_90", {"DTYPE": "1", "MR": "1"}), ("sm_90", {"DTYPE": "1", "MR": "8"}),
                 ("sm_90", {"DTYPE": "1", "MR": "4", "VEC_B": "0"}),
                 ("sm_90", {"DTYPE": "1", "MR": "8", "CLUSTER_K": "8", "BIAS": "1", "ACT": "4"}),
                 ("sm_90", {"DTYPE": "2", "MR": "2", "SPLIT_K": "1"}),
                 ("sm_90", {"DTYPE": "2", "MR": "8", "TRANS_A": "1"}),
                 ("sm_80", {"MR": "1"}), ("sm_80", {"MR": "16"}), ("sm_80", {"DTYPE": "1", "MR": "8", "SPLIT_K": "1"}),
                 ("sm_80", {"DTYPE": "2", "MR": "4", "BIAS": "1", "ACT": "1"})]


@needs_tools
@pytest.mark.parametrize("target, defines", sample_every(len(KMAJOR_BUILDS), KMAJOR_BUILDS, unpack=True))
def test_kmajor_builds_clean_one_16_byte_load_of_b_per_row_and_step(target, defines):
    """Every element of B read once by a 16-byte evict-first load: NR rows x (KU steps ahead +
    STEPS a round) LDG.128 in the SASS, MR x V FMAs per 16 bytes (MR LDS.128 of A a step, two
    with 16-bit A), and the lane sum's SHFL count of a halving butterfly; no spills (within 128
    registers where MIN_BLOCKS = 2)."""
    defines = {"TRANS_B": "1", **defines}
    result = build_file("gemm_skinny", BuildOptions(defines=defines, target=target))
    asm = assemble(result)
    assert not asm.warnings, asm.warnings
    (k,) = asm.kernels
    c = result.constants
    assert k.spill_stores == k.local_bytes == 0, (k.spill_stores, k.local_bytes)
    if c["MIN_BLOCKS"] == 2:
        assert k.registers <= 128
    ops = re.findall(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", disassemble(asm.cubin), re.M)
    count = lambda prefix: sum(op.startswith(prefix) for op in ops)       # noqa: E731
    nr, steps, ku, mr, v, nv, halvings = (int(c[x]) for x in ("NR", "STEPS", "KU", "MR", "V", "NV", "HALVINGS"))
    half = defines.get("DTYPE", "0") != "0"
    if defines.get("VEC_B", "1") == "1":
        assert count("LDG.E.EF.128") == nr * (steps + ku)
        assert result.ptx.count("ld.global.cs.nc.v4.b32") == nr * (steps + ku)
    else:
        assert count("LDG.E.EF") == 0 and "ld.global.cs" not in result.ptx
    assert count("FFMA") >= steps * mr * nr * v                         # a round: MR x NR x V per lane and step
    assert count("LDS.128") == steps * mr * (2 if half else 1)
    assert count("SHFL.BFLY") == nv - nv // 2 ** halvings + 5 - halvings
    assert c["TN"] == 8 * nr and c["TM"] == mr
    assert c["SMEM_BYTES"] == 4 * mr * (int(c["KB"]) + c["TN"])        # A's fp32 slice, then the block's sums


@functools.lru_cache(maxsize=None)
def _kmajor_build(defines: tuple) -> tuple[Kernel, dict]:
    """The interpreter's kernel and the build's constants for these -D values (sorted pairs)."""
    result = build_file("gemm_skinny", BuildOptions(defines=dict(defines), target="sm_90"))
    return Kernel(result.ptx), dict(result.constants)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _values(x: np.ndarray, dtype: str) -> np.ndarray:
    """The float64 values of an array of the kernel's type (bf16: uint16 patterns)."""
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def _simulate(m, n, k, dtype="float32", *, mr=None, trans_a=False, ldb_pad=0, b_offset=0, alpha=1.0, beta=0.0,
              splits=1, cluster=1, bias=0, act=0, defines=None, seed=0):
    """C of the K-major kernel (TRANS_B=1), built as the runtime would and run in the PTX
    interpreter, against float64: the relative Frobenius error. B is N x K inside an N x (K +
    ldb_pad) array, b_offset elements into its rows (an unaligned view: VEC_B=0). splits > 1: the
    partial pass into a workspace (k_chunk whole 256s, as split_k.py's) summed in split order;
    cluster > 1: CLUSTER_K blocks along z summing through distributed shared memory."""
    from epilogue_reference import BY_CODE
    dt = {"float32": 0, "float16": 1, "bfloat16": 2}[dtype]
    np_type = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[dtype]
    rng = np.random.default_rng(seed + 7 * m + 13 * n + k)

    def make(*shape):
        x = rng.standard_normal(shape).astype(np.float32)
        return _bf16_bits(x) if dtype == "bfloat16" else x.astype(np_type)
    a = make(*((k, m) if trans_a else (m, k)))
    b_store = make(n, k + ldb_pad + b_offset)
    b = b_store[:, b_offset:b_offset + k]
    c = make(m, n)
    c0 = c.copy()
    vec = int(b.ctypes.data % 16 == 0 and b_store.shape[1] % (16 // a.itemsize) == 0)
    d = {"TRANS_B": "1", "DTYPE": str(dt), "TRANS_A": str(int(trans_a)), "VEC_B": str(vec), "BIAS": str(bias),
         "ACT": str(act), "SPLIT_K": str(int(splits > 1)), "CLUSTER_K": str(cluster), **(defines or {})}
    if mr is not None:
        d["MR"] = str(mr)
    kernel, const = _kmajor_build(tuple(sorted(d.items())))
    mem = Memory()
    for x in (a, b_store, c):
        mem.add(x)
    bvec = make(n if bias == 1 else m) if bias else np.zeros(1, np_type)
    mem.add(bvec)
    grid = (-(-n // const["TN"]), -(-m // const["TM"]), 1)
    args = dict(A=a.ctypes.data, B=b.ctypes.data, C=c.ctypes.data, M=m, N=n, K=k, lda=a.shape[1], ldb=b_store.shape[1],
                ldc=n, alpha=alpha, beta=beta, bias=bvec.ctypes.data if bias else 0, k_chunk=0, split_stride=0)
    if splits > 1:
        chunk = -(-(-(-k // splits)) // 256) * 256
        s = -(-k // chunk)
        ws = np.zeros((s, m, n), np.float32)
        mem.add(ws)
        args.update(C=ws.ctypes.data, k_chunk=chunk, split_stride=m * n, alpha=1.0, beta=0.0)
        kernel.run((grid[0], grid[1], s), (const["THREADS"], 1, 1), args, mem, const["SMEM_BYTES"])
        acc = ws[0].copy()
        for i in range(1, s):
            acc += ws[i]
        got = (np.float32(alpha) * acc + (np.float32(beta) * _values(c0, dtype).astype(np.float32) if beta else 0))
        got = got.astype(np.float64)
    else:
        kernel.run((grid[0], grid[1], cluster), (const["THREADS"], 1, 1), args, mem, const["SMEM_BYTES"],
                   cluster=(1, 1, cluster))
        got = _values(c, dtype)
    av, bv = _values(a, dtype), _values(b, dtype)
    want = alpha * ((av.T if trans_a else av) @ bv.T) + (beta * _values(c0, dtype) if beta else 0)
    if bias:
        bb = _values(bvec, dtype)
        want = want + (bb[None, :] if bias == 1 else bb[:, None])
    want = BY_CODE[act](want)
    assert np.isfinite(got).all()
    return float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))


LIMITS = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def test_the_interpreter_reproduces_the_row_major_path():
    """The interpreter itself, on the path the GPU tests measured: gemm_skinny's row-major build."""
    for m, n, k, d in ((3, 130, 300, {"MR": "4", "VEC_B": "0"}), (16, 256, 600, {"MR": "16"})):
        rng = np.random.default_rng(m)
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        c = np.full((m, n), np.nan, np.float32)         # beta = 0: never read
        result = build_file("gemm_skinny", BuildOptions(defines=d, target="sm_90"))
        mem = Memory()
        for x in (a, b, c):
            mem.add(x)
        tn, tm = result.constants["TN"], result.constants["TM"]
        Kernel(result.ptx).run((-(-n // tn), -(-m // tm), 1), (256, 1, 1),
                               dict(A=a.ctypes.data, B=b.ctypes.data, C=c.ctypes.data, M=m, N=n, K=k, lda=k, ldb=n,
                                    ldc=n, alpha=1.0, beta=0.0, bias=0, k_chunk=0, split_stride=0), mem,
                               result.constants["SMEM_BYTES"])
        want = a.astype(np.float64) @ b.astype(np.float64)
        assert np.linalg.norm(c - want) / np.linalg.norm(want) < 1e-6


@pytest.mark.parametrize("dtype", sample_every(2, ["float32", "float16"]))
@pytest.mark.parametrize("m, mr", sample_every(2, [(1, 1), (3, 4), (16, 16)], unpack=True))
@pytest.mark.parametrize("k", sample_every(4, [1, 7, 300, 1029]))
def test_kmajor_odd_shapes_in_the_interpreter(dtype, m, mr, k):
    """M = 1, 3, 16 (a block of MR rows, M < MR), N = 1, 5, 130 (one row of B, a warp's partial rows,
    a block and 2 more), K = 1, 7, 300, 1029 (less than a vector, tails, one and more rounds at MR =
    16); B rows of K elements (VEC_B only where K is a multiple of V). 16-bit MR at most 8."""
    if dtype != "float32" and mr == 16:
        m, mr = 8, 8
    for n in (1, 5, 130):
        err = _simulate(m, n, k, dtype, mr=mr)
        assert err < LIMITS[dtype], (m, n, k, dtype, err)


@pytest.mark.parametrize("case", sample_every(10, [
    dict(m=1, n=5, k=7, ldb_pad=5),                                    # 16-byte rows, K = 4 + 3: the lane tail
    dict(m=3, n=130, k=1029, ldb_pad=7),
    dict(m=16, n=37, k=301, mr=16, ldb_pad=7, trans_a=True),
    dict(m=2, n=64, k=4099, mr=2, ldb_pad=5, alpha=0.5, beta=-1.5),
    dict(m=5, n=33, k=600, b_offset=1),                                # B not 16-byte aligned: element by element
    dict(m=1, n=33, k=5000, mr=1, splits=7),
    dict(m=5, n=70, k=2100, mr=8, splits=3, ldb_pad=4, alpha=2.0, beta=0.5),
    dict(m=1, n=33, k=5000, mr=1, cluster=3, alpha=1.5, beta=0.25),
    dict(m=13, n=70, k=1500, mr=16, cluster=4, ldb_pad=1),
    dict(m=5, n=33, k=300, mr=8, cluster=2, ldb_pad=4),                # rank 1 past K: zeros, still in the barriers
    dict(m=5, n=70, k=600, mr=8, bias=1, act=2, beta=0.5),
    dict(m=2, n=70, k=600, mr=2, bias=2, act=4),
    dict(m=7, n=40, k=3000, mr=8, defines={"KB": "512", "NR": "2", "KU": "1"}, ldb_pad=3),
    dict(m=3, n=70, k=600, mr=4, dtype="float16", bias=1, act=3),
    dict(m=6, n=70, k=2100, mr=8, dtype="float16", splits=2, ldb_pad=4),
    dict(m=6, n=70, k=2100, mr=8, dtype="float16", cluster=2, ldb_pad=5, trans_a=True),
    dict(m=1, n=9, k=1029, mr=1, dtype="bfloat16", ldb_pad=3),
    dict(m=4, n=40, k=700, mr=4, dtype="bfloat16", b_offset=3, bias=1, act=1, beta=2.0),
    dict(m=8, n=33, k=2000, mr=8, dtype="bfloat16", splits=4, trans_a=True),
]), ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_kmajor_tails_layouts_splits_clusters_epilogues_in_the_interpreter(case):
    case = dict(case)
    dtype = case.pop("dtype", "float32")
    m, n, k = case.pop("m"), case.pop("n"), case.pop("k")
    err = _simulate(m, n, k, dtype, **case)
    assert err < LIMITS[dtype], err


def test_kmajor_sums_in_a_fixed_order():
    """Two runs of one launch give the same bits (the lane butterfly and the ranks in fixed order);
    the interpreter would also refuse a barrier or a shuffle that not every thread reaches."""
    outs = []
    for _ in range(2):
        m, n, k = 3, 40, 700
        rng = np.random.default_rng(5)
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
        c = np.zeros((m, n), np.float32)
        result = build_file("gemm_skinny", BuildOptions(defines={"TRANS_B": "1", "MR": "4", "CLUSTER_K": "2",
                                                                 "VEC_B": "0"}, target="sm_90"))
        mem = Memory()
        for x in (a, b, c):
            mem.add(x)
        Kernel(result.ptx).run((2, 1, 2), (256, 1, 1), dict(A=a.ctypes.data, B=b.ctypes.data, C=c.ctypes.data, M=m, N=n,
                                                            K=k, lda=k, ldb=k, ldc=n, alpha=1.0, beta=0.0, bias=0,
                                                            k_chunk=0, split_stride=0),
                               mem, result.constants["SMEM_BYTES"], cluster=(1, 1, 2))
        outs.append(c.copy())
    assert outs[0].tobytes() == outs[1].tobytes()


def test_the_interpreter_catches_an_out_of_bounds_load():
    """A B pointer one row short: the last row's loads fall outside the array and are refused."""
    m, n, k = 1, 5, 64
    a, b = np.ones((m, k), np.float32), np.ones((n - 1, k), np.float32)
    c = np.zeros((m, n), np.float32)
    result = build_file("gemm_skinny", BuildOptions(defines={"TRANS_B": "1", "MR": "1"}, target="sm_90"))
    mem = Memory()
    for x in (a, b, c):
        mem.add(x)
    args = dict(A=a.ctypes.data, B=b.ctypes.data, C=c.ctypes.data, M=m, N=n, K=k, lda=k, ldb=k, ldc=n, alpha=1.0,
                beta=0.0, bias=0, k_chunk=0, split_stride=0)
    with pytest.raises(SimError, match="outside every array"):
        Kernel(result.ptx).run((1, 1, 1), (256, 1, 1), args, mem, result.constants["SMEM_BYTES"])


@pytest.fixture
def simulated_gemm(monkeypatch, private_cache):
    """(memory, launches): asmgemm.gemm through a stand-in CuPy whose kernels run their PTX in the
    interpreter (fake_cupy.simulating_kernel), the split-K workspace registered with the memory."""
    mem, launches = Memory(), []
    cp = make_cupy(simulating_kernel(launches, mem))
    cp.empty = registering_empty(mem)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    forget_loaded(monkeypatch)
    from asmgemm.runtime import gemm
    gemm.clear_plan_cache()
    yield mem, launches
    gemm.clear_plan_cache()


@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("case", sample_every(4, [
    dict(m=3, n=130, k=300, tile=(4, 32), splits=1),
    dict(m=1, n=70, k=2048, params={"MR": 1, "SPLIT_K": 4}, tile=(1, 32), splits=4, reduce="cluster"),
    dict(m=1, n=70, k=2048, params={"MR": 1, "SPLIT_K": 4, "CLUSTER_K": 1}, tile=(1, 32), splits=4, reduce="kernel"),
    dict(m=9, n=33, k=1029, params={"MR": 16}, tile=(16, 32), splits=1, bias=True, activation="silu"),
    dict(m=3, n=40, k=1029, dtype="float16", kernel="hgemm_skinny", tile=(4, 32), splits=3, reduce="cluster"),
    dict(m=3, n=40, k=2000, dtype="float16", kernel="hgemm_skinny", params={"SPLIT_K": 3, "CLUSTER_K": 1},
         tile=(8, 32), splits=3, reduce="kernel", alpha=0.5, beta=2.0),
]), ids=lambda c: f"{c['m']}x{c['n']}x{c['k']}-{c.get('kernel', 'sgemm_skinny')}-{c.get('params', {})}")
def test_gemm_runs_the_kmajor_path_through_the_runtime(simulated_gemm, case):
    """asmgemm.gemm(..., trans_b=True, kernel=...skinny) builds TRANS_B=1, launches ceil(N / 32) x
    ceil(M / MR) blocks (x S for a split: in clusters, or the partial pass and the reduce kernel,
    both run from their PTX) and returns C; the untuned route is unchanged (test_what_keeps_sgemm)."""
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    mem, _ = simulated_gemm
    case = dict(case)
    m, n, k = case["m"], case["n"], case["k"]
    dtype = np.dtype(case.get("dtype", "float32"))
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(dtype).view(FakeArray)
    b = rng.standard_normal((n, k)).astype(dtype).view(FakeArray)
    c = rng.standard_normal((m, n)).astype(dtype).view(FakeArray)
    c0 = np.asarray(c, np.float64).copy()
    bias = rng.standard_normal(n).astype(dtype).view(FakeArray) if case.get("bias") else None
    for x in (a, b, c) + ((bias,) if bias is not None else ()):
        mem.add(x)
    alpha, beta = case.get("alpha", 1.0), case.get("beta", 0.0)
    asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_b=True, kernel=case.get("kernel", "sgemm_skinny"),
                 params=case.get("params"), bias=bias, activation=case.get("activation"))
    want = alpha * (np.asarray(a, np.float64) @ np.asarray(b, np.float64).T) + beta * c0
    if bias is not None:
        want = want + np.asarray(bias, np.float64)[None, :]
    if case.get("activation") == "silu":
        want = want / (1 + np.exp(-want))
    err = np.linalg.norm(np.asarray(c, np.float64) - want) / np.linalg.norm(want)
    assert err < (1e-5 if dtype == np.float32 else 2e-3), err
    ran = last_launch()
    assert ran["params"]["TRANS_B"] == "1" and ran["tile"] == case["tile"] and ran["splits"] == case["splits"], ran
    assert ran["grid"][:2] == (-(-n // 32), -(-m // case["tile"][0]))
    if case["splits"] > 1:
        assert ran["reduce"] == case["reduce"] and ran["grid"][2] == case["splits"]
