"""hgemm's grouped mode (GROUPED=1, issue 33: a mixture of experts' grouped GEMM) on the CPU: the
kernel's builds and guards, the runtime's routing of a grouped call (hgemm where TMA reads A and B in
place, hgemm_mma otherwise), the build it asks for and the launch's arguments (B's 3-D map, offs and
the expert count). tests/test_hgemm_grouped_gpu.py runs the launches on the H100."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, build_file
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime import grouped, launch, tensor_map
from asmgemm.runtime.arrays import Dtype, Matrix
from asmgemm.runtime.gpu import DeviceFacts
from asmgemm.toolchain import find_tool
from ptx_sim import Kernel, Memory, aligned_array
from sweeps import sample_every

H100 = DeviceFacts(0, "NVIDIA H100 80GB HBM3", "sm_90", 132, 1.98e9, 3.35e12)
A100 = DeviceFacts(0, "NVIDIA A100-SXM4-80GB", "sm_80", 108, 1.41e9, 2.0e12)
F16, BF16, I32 = Dtype("float16", 2), Dtype("bfloat16", 2), Dtype("int32", 4)
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")
GROUPED = dict(GROUPED=1, CLUSTER_M=1)        # the source's default clusters pairs: a grouped build has none


def ptx(**defines) -> str:
    """hgemm's PTX for these -D values (expansion and emission: no ptxas)."""
    return build_file("hgemm", BuildOptions(defines={k: str(v) for k, v in defines.items()}, target="sm_90a")).ptx


# ---- the kernel ---------------------------------------------------------------------------------
def test_a_grouped_build_reads_b_per_expert_and_a_in_2d():
    """A through its 2-D map (all experts' rows), B through a 3-D map (the expert its third
    coordinate); offs and the expert count read in block setup (the walk's tile rows) and per tile
    by the producer and the consumers; without WIDE_C no TMA store of C (the pair stores guard the
    expert's rows)."""
    text = ptx(**GROUPED, VEC_C=1)
    assert text.count("cp.async.bulk.tensor.2d.shared::cluster.global") == 1          # A's one load
    assert text.count("cp.async.bulk.tensor.3d.shared::cluster.global") == 4          # B's 4 chunks (BN = 256)
    assert "cp.async.bulk.tensor.2d.global.shared::cta" not in text
    assert text.count("[param_offs]") == 3 and text.count("[param_groups]") == 3
    plain = ptx(CLUSTER_M=1, VEC_C=1)
    assert "[param_offs]" not in plain and "[param_groups]" not in plain and ".3d" not in plain


def test_the_staged_store_is_chosen_per_warpgroup():
    """WIDE_C: a warpgroup whose 64 rows lie inside the tile's expert (m0 + 64 wg + 64 <= its end
    row, M) stores them by TMA boxes; the others branch to the pair stores; no activation warps (their
    handshake expects every tile staged)."""
    text = ptx(**GROUPED, VEC_C=1, WIDE_C=1)
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in text and "st.global.b32" in text
    # to the pairs: beta != 0 (as in 2-D), and a warpgroup whose rows cross the expert's end
    assert text.count("bra epilogue_pairs;") == 2
    assert ptx(CLUSTER_M=1, VEC_C=1, WIDE_C=1).count("bra epilogue_pairs;") == 1
    acted = ptx(**GROUPED, VEC_C=1, WIDE_C=1, ACT=1)
    assert "bra activation_warps;" not in acted
    assert "bra activation_warps;" in ptx(CLUSTER_M=1, VEC_C=1, WIDE_C=1, ACT=1)       # the 2-D build has them


@pytest.mark.parametrize("defines, message", [
    (dict(GROUPED=2), "GROUPED is 0 or 1"),
    (dict(GROUPED=1), "CLUSTER_M must be 1"),               # the source default: pairs down a tile column
    (dict(GROUPED=1, CLUSTER_M=2, CLUSTER_N=2), "CLUSTER_M must be 1"),
    (dict(**GROUPED, BATCHED=1), "two launch modes"),
    (dict(**GROUPED, SPLIT_K=1), "never split"),
    (dict(**GROUPED, CLUSTER_K=2, BN=128), "never split"),
    (dict(**GROUPED, A_LDG=1), "not with A_LDG"),
    (dict(**GROUPED, C_T=1, BN=16, TRANS_B=1), "nor STREAM"),
    (dict(**GROUPED, STREAM=1), "nor STREAM"),
    (dict(**GROUPED, BIAS=2), "per-row bias"),
], ids=["value", "clusters_by_default", "clusters_of_four", "batched", "split_k", "cluster_k", "a_ldg", "c_t", "stream", "row_bias"])
def test_the_guards_refuse_what_a_grouped_call_does_not_run_with(defines, message):
    with pytest.raises(AsmError) as e:
        ptx(**defines)
    assert message in str(e.value) and "guards.inc" in str(e.value.span.path)


# the builds grouped_config asks for at the shapes: the default 128 x 256 tile in bf16 with the
# staged C; 64-row tiles (experts of 64 rows on average) with a transposed B and silu on the pairs.
# (gelu_tanh at BN = 256 spills with or without GROUPED: the 2-D pair build 324 bytes, an fp32 C at
# CONSUMERS = 1 208 bytes; not a grouped build's doing.)
BUILDS = {
    "bf16_128x256_staged": ("-D", "BF16=1", "-D", "VEC_C=1", "-D", "WIDE_C=1"),
    "bf16_64x256_silu": ("-D", "CONSUMERS=1", "-D", "BF16=1", "-D", "TRANS_B=1", "-D", "ACT=4"),
    # grouped_config's default where the tile columns pair up (grouped.a_multicast): A multicast
    "bf16_128x256_pairs_n": ("-D", "BF16=1", "-D", "TRANS_B=1", "-D", "CLUSTER_N=2", "-D", "VEC_C=1", "-D", "WIDE_C=1"),
    "bf16_64x256_pairs_n": ("-D", "CONSUMERS=1", "-D", "BF16=1", "-D", "TRANS_B=1", "-D", "CLUSTER_N=2"),
}


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("build", sample_every(len(BUILDS), list(BUILDS)))
def test_grouped_builds_have_no_spills(run_cli, build):
    limit = "232" if "CONSUMERS=1" in BUILDS[build] else "168"        # 256 threads: 65536 / 256, less 24
    code, out, err = run_cli("check", "hgemm", "--no-spills", "--max-registers", limit, "-D", "GROUPED=1",
                             "-D", "CLUSTER_M=1", *BUILDS[build])
    assert code == 0, out + err


# ---- the walk over offs (expert_rows.inc) in the CPU interpreter ------------------------------------
PROBE = Path(__file__).parent / "data" / "hopper" / "expert_rows_probe.sasm"


def run_probe(defines: dict, offs: list[int], m: int, tiles_n: int, threads: int) -> list[tuple]:
    """The probe built with `defines`, run in the interpreter by one block of `threads` threads over
    these offsets: each thread's four words."""
    ptx = build_file(PROBE, BuildOptions(defines={k: str(v) for k, v in defines.items()}, target="sm_90a")).ptx
    mem = Memory()
    offs_dev = aligned_array((max(len(offs), 1),), np.int32)
    offs_dev[:len(offs)] = offs
    out = aligned_array((threads, 4), np.uint32)
    Kernel(ptx).run((1, 1, 1), (threads, 1, 1), {"offs": mem.add(offs_dev), "groups": len(offs), "M": m,
                                                 "tiles_n": tiles_n, "out": mem.add(out)}, mem)
    return [tuple(int(x) for x in row) for row in out]


def walk(offs: list[int], m: int, tm: int) -> list[tuple[int, int, int]]:
    """The grouped walk's tile rows by the documented rule (mma_gemm.sasm's): expert e's rows are
    first = offs[e - 1] clamped to 0..M (offs[-1] = 0) to end = offs[e] clamped to first..M; each
    tile row is (expert, its first row, the expert's end row)."""
    rows, prev = [], 0
    for e, end in enumerate(offs):
        first = min(max(prev, 0), m)
        last = min(max(end, first), m)
        rows += [(e, first + r * tm, last) for r in range(-(-(last - first) // tm))]
        prev = end
    return rows


@pytest.mark.parametrize("tm", [64, 128])
@pytest.mark.parametrize("offs, m", [
    ([37, 37, 337, 338, 338, 467, 531], 531),          # empty experts, one of one row, one of 3 tile rows
    ([0, 0, 411, 411], 411),                            # one expert holding every token
    ([6, 2, 40], 10),                                   # an end below its start (empty), one past M (clamped)
    ([-5, 3, 3, 200], 150),                             # a negative end (empty), the last cut at M
    (list(range(3, 3 * 38, 3)), 120),                  # 37 experts: chunks of four and a remainder
    ([], 50),                                           # no experts: no tile rows
], ids=["skewed", "one_expert", "end_below_start", "negative_and_overrun", "e37", "none"])
def test_the_walk_finds_each_tile_rows_expert_as_the_rule_says(offs, m, tm):
    """Thread t asks for tile row t: within the walk it gets (expert, first row, end row), past it
    the walk's length (what block_setup.inc counts the persistent walk with)."""
    want = walk(offs, m, tm)
    got = run_probe({"TM": tm}, offs, m, 0, len(want) + 3)
    assert got[:len(want)] == [(e, first, end, 1) for e, first, end in want]
    assert got[len(want):] == [(0xFFFFFFFF, len(want), 0, 0)] * 3


def unit_walk(offs: list[int], m: int, tm: int, tn: int, tiles_n: int, group_m: int) -> list[tuple]:
    """The expert-major walk of units by its documented rule (tile_scheduler.inc, EXPERT_TILE): the
    experts one after another, all of an expert's units before the next, and inside an expert
    Triton's grouped order over its own tile rows (groups of group_m rows; inside a group the row
    changes fastest). Each unit: (expert, first row, first column, the expert's end row)."""
    out = []
    rows = walk(offs, m, tm)
    for e in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == e]
        for u in range(len(mine) * tiles_n):
            g, i = divmod(u, tiles_n * group_m)
            in_group = min(group_m, len(mine) - g * group_m)
            row, col = g * group_m + i % in_group, i // in_group
            out.append((e, mine[row][1], col * tn, mine[row][2]))
    return out


@pytest.mark.parametrize("tiles_n, group_m", [(3, 8), (1, 2), (5, 2)])
@pytest.mark.parametrize("offs, m", [
    ([37, 37, 337, 338, 338, 467, 1531], 1531),       # empty experts, one of one row, one of 8 tile rows
    ([0, 0, 411, 411], 411),
    ([-5, 3, 3, 200], 150),
], ids=["skewed", "one_expert", "negative_and_overrun"])
def test_the_walk_takes_an_experts_units_together_in_grouped_order(offs, m, tiles_n, group_m):
    """Thread t asks for unit t of the expert-major walk: (expert, m0, n0, end row); past it, the
    walk's units. No group of tile rows straddles two experts."""
    want = unit_walk(offs, m, 128, 256, tiles_n, group_m)
    got = run_probe({"UNITS": 1, "GROUP_M": group_m}, offs, m, tiles_n, len(want) + 2)
    assert got[:len(want)] == want
    assert got[len(want):] == [(0xFFFFFFFF, len(want), 0, 0)] * 2


# ---- routing ------------------------------------------------------------------------------------
def tokens(total, k, dtype=F16, ld=None, ptr=1 << 20):
    ld = ld or k
    return Matrix((total, k), (ld * dtype.itemsize, dtype.itemsize), dtype, ptr, 0)


def experts(e, k, n, dtype=F16, transposed=False, stride=None, ptr=1 << 24):
    """(E, K, N) weights, or a transposed (E, N, K) tensor viewed as (E, K, N); experts `stride` apart."""
    item = dtype.itemsize
    stride = (k * n if stride is None else stride) * item
    strides = (stride, item, k * item) if transposed else (stride, n * item, item)
    return Matrix((e, k, n), strides, dtype, ptr, 0)


def offs(e, ptr=1 << 28):
    return Matrix((e,), (4,), I32, ptr, 0)


@pytest.mark.parametrize("transposed", [False, True], ids=["b_ekn", "b_enk"])
@pytest.mark.parametrize("name, dtype", [("hgemm", F16), ("bgemm", BF16)])
def test_a_call_tma_reads_runs_on_the_hopper_kernel(name, dtype, transposed):
    a, b = tokens(4096, 4096, dtype), experts(8, 4096, 14336, dtype, transposed)
    assert grouped.tma_reads(a, b)
    assert grouped.grouped_kernel(get_spec(name), H100, 0, a, b).name == name


@pytest.mark.parametrize("case", ["k_odd_bytes", "a_unaligned", "b_rows", "expert_stride", "shared_b"])
def test_a_call_tma_cannot_read_runs_on_the_portable_kernel(case):
    """Rows not whole 16-byte pieces (K * 2 % 16 != 0), a base off 16 bytes, experts an odd number
    of elements apart, or all sharing one matrix (stride 0: B's map would hold one): hgemm_mma reads
    them in place (a grouped call gets no padded copies)."""
    a, b = tokens(300, 64), experts(8, 64, 96)
    if case == "k_odd_bytes":
        a, b = tokens(300, 60), experts(8, 60, 96)
    elif case == "a_unaligned":
        a = tokens(300, 64, ptr=(1 << 20) + 2)
    elif case == "b_rows":
        b = experts(8, 64, 100)
    elif case == "expert_stride":
        b = experts(8, 64, 96, stride=64 * 96 + 4)
    else:
        b = experts(8, 64, 96, stride=0)                  # one weight expand()ed over the experts
    assert not grouped.tma_reads(a, b)
    assert grouped.grouped_kernel(get_spec("hgemm"), H100, 0, a, b).name == "hgemm_mma"
    with pytest.raises(AsmError, match="16-byte aligned rows and experts") as e:
        grouped._named_grouped(get_spec("hgemm"), a, b)
    assert "hgemm_mma" in e.value.hint


def test_a_device_without_wgmma_runs_the_portable_kernel():
    a, b = tokens(256, 64), experts(4, 64, 64)
    assert grouped.grouped_kernel(get_spec("hgemm"), A100, 0, a, b).name == "hgemm_mma"


def test_one_expert_is_a_batch_of_one():
    """E = 1: B's expert stride does not matter (0 in the plan), TMA reads it."""
    a, b = tokens(100, 64), experts(1, 64, 64, stride=64 * 64 + 3)
    assert grouped.tma_reads(a, b)


# ---- the build a grouped call asks for and its launch ----------------------------------------------
def plan_of(a, b, e, n, dtype=F16):
    c = Matrix((a.shape[0], n), (n * dtype.itemsize, dtype.itemsize), dtype, 1 << 30, 0)
    return grouped.grouped_plan(a, b, c, e, 0)


def test_the_plan_walks_every_expert_and_keeps_the_staged_c():
    plan = plan_of(tokens(4096, 4096, BF16), experts(64, 4096, 2048, BF16), 64, 2048, BF16)
    assert plan.call_values["grouped"] == 1 and plan.groups == 64
    assert plan.call_values["wide_c"] == 1 and plan.call_values["a_ldg"] == 0 and plan.call_values["c_trans"] == 0
    assert plan.batch_strides == (0, 4096 * 2048, 0) and (plan.m, plan.n, plan.k) == (4096, 2048, 4096)


@pytest.mark.parametrize("total, e, consumers", [(4096, 64, 1), (32768, 64, 2), (4096, 8, 2), (4095, 64, 1)])
def test_the_tile_height_follows_the_experts_average_rows(total, e, consumers):
    """64-row tiles where the experts average 64 rows or fewer (E = 64 over 4096 tokens); no
    clusters down a tile column, no split, no streaming for any grouped build; 14336 columns pair
    up (56 tiles of 256)."""
    spec = get_spec("bgemm")
    plan = plan_of(tokens(total, 4096, BF16), experts(e, 4096, 14336, BF16), e, 14336, BF16)
    defines = grouped.grouped_params(spec, plan, None, 132)
    assert defines["GROUPED"] == 1 and defines["WIDE_C"] == 1 and defines.get("CONSUMERS", 2) == consumers
    assert defines["CLUSTER_M"] == 1 and defines["CLUSTER_N"] == 2 and defines["CLUSTER_K"] == 1
    assert defines["SPLIT_K"] == 0 and defines["STREAM"] == 0
    assert grouped.grouped_defines(get_spec("bgemm_mma"), plan) == {}


@pytest.mark.parametrize("n, tile_n, pairs", [
    (4096, 256, 2), (2048, 256, 2), (1792, 256, 2),     # 16, 8 tiles; 7: one empty in 8 (the limit)
    (768, 256, 1), (1280, 256, 1),                      # 3 and 5 tiles: one empty in 4 and in 6
    (256, 256, 1), (100, 128, 1),                       # one tile column: nothing to pair
])
def test_tile_columns_pair_where_at_most_one_in_eight_runs_empty(n, tile_n, pairs):
    assert grouped.a_multicast(n, tile_n) == pairs


def test_params_given_are_the_build():
    spec = get_spec("bgemm")
    plan = plan_of(tokens(4096, 4096, BF16), experts(8, 4096, 14336, BF16), 8, 14336, BF16)
    assert grouped.grouped_params(spec, plan, {"CLUSTER_N": 1}, 132)["CLUSTER_N"] == 1


@pytest.fixture(scope="module")
def built_grouped():
    """A grouped call of 5 experts over 300 tokens, built by ptxas as grouped_gemm() would."""
    from asmgemm.runtime.build_cache import build_kernel
    spec = get_spec("hgemm")
    plan = plan_of(tokens(300, 64), experts(5, 64, 96, stride=64 * 96 + 8), 5, 96)
    built = build_kernel(spec, grouped.grouped_params(spec, plan, None, 132), "sm_90a")
    return spec, plan, built


@pytest.mark.toolchain
@needs_ptxas
def test_the_launch_passes_offs_the_experts_and_bs_3d_map(built_grouped, monkeypatch):
    spec, plan, built = built_grouped
    monkeypatch.setattr(tensor_map, "encode", lambda tm: tm)   # the TileMap instead of the driver's bytes
    args = launch.ArgPacker(built, plan, "float16", "float16").pack(1 << 20, 1 << 24, 1 << 26, 1.0, 0.0, 0, 1 << 28)
    named = dict(zip((name for name, _ in built.params), args))
    assert int(named["groups"]) == 5 and int(named["offs"]) == 1 << 28
    assert int(named["batch_stride_b"]) == 64 * 96 + 8
    assert named["tmap_a"].dims == (64, 300) and named["tmap_b"].dims == (96, 64, 5)
    assert named["tmap_b"].strides == (192, (64 * 96 + 8) * 2)
    assert named["tmap_c"].dims == (96, 300)                    # the staged C: a 2-D map over all rows
    # the persistent grid: at most the SMs, at least the tiles of the bound ceil(300 / TM) + E tile rows
    tiles = -(-96 // built.tile_n) * (-(-300 // built.tile_m) + 5)
    assert launch.grid(spec, built, plan, 132) == (min(tiles, 132), 1, 1)
