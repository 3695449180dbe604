"""Split-K inside a cluster (hgemm.sasm CLUSTER_K): the cluster's blocks compute one tile over
their K slices and sum the partial rows through distributed shared memory (st.async into the
block that stores them). CPU only: the kernel's constants and refusals, the builds (ptxas: no
spills or warnings; the SASS sends by STAS and adds what it received), the launch geometry
(cluster_rows) and the untuned choices that pick it. The GPU side is tests/test_hgemm_gpu.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.launch import grid, untuned_size_rule
from asmgemm.runtime.split_k import untuned_split
from asmgemm.toolchain import disassemble, find_tool
from sweeps import sample_every

HGEMM = get_spec("hgemm")
needs_tools = pytest.mark.skipif(find_tool("ptxas", required=False) is None
                                 or find_tool("nvdisasm", required=False) is None,
                                 reason="ptxas/nvdisasm not installed")


def _build(defines: dict):
    from asmgemm.pipeline import BuildOptions, build_file
    return build_file("hgemm", BuildOptions(defines={k: str(v) for k, v in defines.items()}, target="sm_90a"))


SPLIT = {"CLUSTER_M": 1, "BN": 128, "STAGES": 6}


# ---- the kernel's layout and refusals -----------------------------------------------------------------
@pytest.mark.parametrize("ck", [2, 4, 8])
def test_each_block_receives_one_slot_per_other_block_of_the_rows_it_owns(ck):
    c = _build({**SPLIT, "CLUSTER_K": ck}).constants
    assert c["CLUSTER"] == ck and c["OWNER_WARPS"] == 8 // ck
    # a slot: the owner warps' threads x 64 fp32 accumulators; one per other block
    assert c["RED_SLOT"] == 32 * (8 // ck) * 64 * 4 and c["RED_BYTES"] == (ck - 1) * c["RED_SLOT"]
    assert c["RED_OFF"] >= c["BAR_OFF"] + 16 * c["RING"] + 16           # after the ring's and its own barriers
    assert c["RED_OFF"] % 16 == 0 and c["SMEM_BYTES"] <= 232448
    assert c["STAGED_C"] == 0                                          # owners store pairs


def test_the_plain_kernel_keeps_no_receive_area():
    c = _build({}).constants
    assert c["CLUSTER_K"] == 1 and c["RED_BYTES"] == 0 and c["CLUSTER"] == c["CLUSTER_M"] == 2


@pytest.mark.parametrize("defines,message", [
    ({**SPLIT, "CLUSTER_K": 3}, "CLUSTER_K must be 1, 2, 4 or 8"),
    ({**SPLIT, "CLUSTER_K": 16}, "CLUSTER_K must be 1, 2, 4 or 8"),
    ({**SPLIT, "CLUSTER_K": 2, "CLUSTER_M": 2}, "not with CLUSTER_M > 1"),
    ({**SPLIT, "CLUSTER_K": 2, "SPLIT_K": 1}, "nor with SPLIT_K"),
])
def test_impossible_cluster_splits_are_refused(defines, message):
    with pytest.raises(AsmError, match=message):
        _build(defines)


# ---- the builds -------------------------------------------------------------------------------------
def _ops(cubin: bytes) -> list[str]:
    """The opcodes of the disassembly, guard predicates (@P0) left out."""
    ops = []
    for line in disassemble(cubin).splitlines():
        words = line.split()
        if line.strip().startswith("/*") and len(words) > 1:
            ops.append(words[2] if words[1].startswith("@") and len(words) > 2 else words[1])
    return ops


@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("defines", sample_every(6, [
    {**SPLIT, "CLUSTER_K": 2}, {**SPLIT, "CLUSTER_K": 4, "BIAS": 1, "ACT": 2},
    {**SPLIT, "CLUSTER_K": 8, "TRANS_A": 1, "TRANS_B": 1}, {**SPLIT, "CLUSTER_K": 2, "BN": 256, "STAGES": 4},
    {"CLUSTER_M": 1, "BN": 16, "STAGES": 10, "C_T": 1, "TRANS_B": 1, "CLUSTER_K": 4},
    {**SPLIT, "CLUSTER_K": 4, "C_F32": 1, "BF16": 1},
]), ids=["ck2", "ck4-gelu", "ck8-tt", "ck2-bn256", "ck4-swapped-bn16", "ck4-bf16-f32c"])
def test_cluster_split_builds_send_by_st_async_without_spills(defines):
    from asmgemm.pipeline import assemble
    result = _build(defines)
    c = result.constants
    assert f".reqnctapercluster {c['CLUSTER_K']}, 1, 1" in result.ptx
    asm = assemble(result)
    assert not asm.warnings, asm.warnings          # no setmaxnreg ignored, no wgmma serialized
    (k,) = asm.kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == k.stack_frame == 0
    ops = _ops(asm.cubin)
    acc = c["BN"] // 2
    # a sender: its accumulators 16 bytes a st.async; an owner: one 16-byte load per slot and piece
    assert sum(op.startswith("STAS.128") for op in ops) == acc // 4
    assert sum(op.startswith("LDS.128") for op in ops) >= (c["CLUSTER_K"] - 1) * acc // 4
    assert any(op.startswith("HGMMA") for op in ops) and any(op.startswith("UTMALDG") for op in ops)
    assert not any(op.startswith("UTMASTG") for op in ops)
    assert any(op.startswith("UCGABAR") for op in ops)               # the set-up's cluster barrier


# ---- the launch ---------------------------------------------------------------------------------------
def test_a_cluster_split_unit_is_one_tile_of_the_whole_cluster():
    plain = SimpleNamespace(tile_m=128, tile_n=128, cluster=1, cluster_rows=1, cluster_cols=1)
    split = SimpleNamespace(tile_m=128, tile_n=128, cluster=4, cluster_rows=1, cluster_cols=1)
    plan = SimpleNamespace(m=128, n=768, groups=0, batch=1)
    assert grid(HGEMM, plain, plan, 132) == (6, 1, 1)
    assert grid(HGEMM, split, plan, 132) == (24, 1, 1)                   # 6 tiles x 4 K slices
    # more tiles than clusters fit: 33 clusters walk them (persistent)
    assert grid(HGEMM, split, SimpleNamespace(m=4096, n=4096, groups=0, batch=1), 132) == (132, 1, 1)


@needs_tools
def test_the_build_reports_cluster_rows_apart_from_the_cluster():
    from asmgemm.runtime.build_cache import launch_geometry
    geo = launch_geometry(HGEMM, _build({**SPLIT, "CLUSTER_K": 4}))
    assert geo["cluster"] == 4 and geo["cluster_rows"] == 1
    geo = launch_geometry(HGEMM, _build({"CLUSTER_M": 2}))
    assert geo["cluster"] == 2 and geo["cluster_rows"] == 2


def test_cluster_rows_must_divide_the_cluster(tmp_path):
    from asmgemm.runtime.build_cache import launch_geometry
    spec = SimpleNamespace(spec_file="k.toml", name="k", source=SimpleNamespace(name="k.sasm"),
                           launch=SimpleNamespace(threads="T", tile_m="T", tile_n="T", smem_bytes="S",
                                                  box_rows_a=None, box_rows_b=None, box_rows_c=None,
                                                  cluster="C", cluster_rows="R", cluster_cols="N"))
    result = SimpleNamespace(constants={"T": 128, "S": 0, "C": 4, "R": 3, "N": 1})
    with pytest.raises(AsmError, match="does not divide"):
        launch_geometry(spec, result)
    result = SimpleNamespace(constants={"T": 128, "S": 0, "C": 2, "R": 2, "N": 2})   # 2 x 2 tiles: 4 blocks
    with pytest.raises(AsmError, match="does not divide"):
        launch_geometry(spec, result)
    result = SimpleNamespace(constants={"T": 128, "S": 0, "C": 4, "R": 2, "N": 2})
    assert launch_geometry(spec, result)["cluster_cols"] == 2


def test_a_unit_of_tiles_sharing_a_spans_tile_columns():
    """CLUSTER_N: a unit is cluster_rows x cluster_cols tiles, so an odd tile-column count rounds up."""
    pairs = SimpleNamespace(tile_m=128, tile_n=64, cluster=2, cluster_rows=1, cluster_cols=2)
    quads = SimpleNamespace(tile_m=128, tile_n=128, cluster=4, cluster_rows=2, cluster_cols=2)
    assert grid(HGEMM, pairs, SimpleNamespace(m=1000, n=1000, groups=0, batch=1), 132) == (128, 1, 1)    # 8 x 16 tiles: 64 units
    assert grid(HGEMM, pairs, SimpleNamespace(m=300, n=330, groups=0, batch=1), 132) == (18, 1, 1)       # 3 x 6 tiles: 9 units
    assert grid(HGEMM, quads, SimpleNamespace(m=300, n=330, groups=0, batch=1), 132) == (16, 1, 1)       # 3 x 3 tiles: 4 units of 2 x 2
    assert grid(HGEMM, quads, SimpleNamespace(m=4096, n=4096, groups=0, batch=1), 132) == (132, 1, 1)    # 33 clusters of 4, persistent


@needs_tools
def test_the_build_reports_the_unit_of_tiles_sharing_a():
    from asmgemm.runtime.build_cache import launch_geometry
    geo = launch_geometry(HGEMM, _build({"CLUSTER_M": 1, "CLUSTER_N": 2, "BN": 64}))
    assert (geo["cluster"], geo["cluster_rows"], geo["cluster_cols"], geo["box_rows_a"]) == (2, 1, 2, 64)
    geo = launch_geometry(HGEMM, _build({"CLUSTER_M": 2, "CLUSTER_N": 2, "BN": 128}))
    assert (geo["cluster"], geo["cluster_rows"], geo["cluster_cols"]) == (4, 2, 2)


# ---- the untuned choice -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,layout,ck", [
    ((128, 768, 3072), "nn", 4), ((128, 3584, 3584), "nn", 2),
    ((512, 768, 3072), "nn", None),          # 96 tiles of 64 x 64 over the whole K (size rule 1r)
    ((128, 4096, 4096), "nn", 2),            # 32 tiles: 32 clusters of 4 would not all fit at once
    ((256, 4096, 4096), "nn", 2), ((128, 4096, 11008), "nn", 2),
    ((256, 1024, 4096), "nn", 4),            # about 1K columns: 128-wide tiles in clusters of 4
    ((1024, 512, 4096), "nn", None),         # 128 tiles of 64 x 64 in pairs sharing B (size rule 1r)
    ((128, 11008, 4096), "nn", None),        # 86 tiles: 2 a cluster would be more blocks than SMs
    ((128, 768, 768), "nn", None),           # short K: the exchange costs more than it saves
    ((16, 768, 3072), "nn", 4),              # swapped (C_T), BN = 16
    ((16, 4096, 4096), "nn", None),          # swapped, 32 units
    ((4096, 4096, 4096), "nn", None),
])
@pytest.mark.parametrize("name", ["hgemm", "bgemm", "hgemm_f32c"])
def test_untuned_calls_split_k_in_clusters_where_they_fit(name, shape, layout, ck):
    spec = get_spec(name)
    chosen = untuned_size_rule(spec, *shape, layout, 132)
    assert chosen.get("CLUSTER_K") == ck
    if ck:
        assert chosen["CLUSTER_M"] == 1
    if ck and not chosen.get("C_T"):
        # size rule 1k: 64-wide tiles in pairs where twice their count fits one wave, K < 8192
        m, n, k = shape
        pairs = 2 * -(-m // 128) * -(-n // 64) <= 132 and 2048 <= k < 8192 and (
            n >= 1536 or 4 * -(-m // 128) * -(-n // 128) > 120)
        assert (chosen["BN"], ck) == ((64, 2) if pairs else (128, ck)), chosen
        assert untuned_split(spec, *shape, 132, layout) is None        # never both ways at once


@pytest.mark.parametrize("shape,stages,cluster_m", [
    ((512, 768, 3072), 13, 4), ((512, 768, 1536), 8, 1),      # 96 tiles of 64 x 64: 73% of the SMs
    ((384, 768, 3072), 8, 1), ((320, 1024, 2048), 8, 1),      # 72 and 80 tiles: more than half
    ((512, 1024, 4096), 10, 2), ((1024, 512, 2048), 10, 2),   # 128 tiles: pairs of tile rows share B
])
@pytest.mark.parametrize("name", ["hgemm", "bgemm", "hgemm_f32c"])
def test_512_row_gemms_into_narrow_layers_run_64_row_tiles(name, shape, stages, cluster_m):
    """Size rule 1r: N <= 1024, 1536 <= K < 8192, and 64 x 64 tiles filling 50-100% of the SMs, one
    wgmma group in flight; rule 1q before it where four tile rows share B in clusters that all fit
    (512x768x3072: 24 clusters of 4; not at 128 tiles, 32 clusters, nor K < 2048)."""
    chosen = untuned_size_rule(get_spec(name), *shape, "nn", 132)
    assert {k: chosen.get(k) for k in ("CONSUMERS", "BN", "STAGES", "CLUSTER_M", "CLUSTER_K", "C_T", "MMA_IN_FLIGHT")} == \
        {"CONSUMERS": 1, "BN": 64, "STAGES": stages, "CLUSTER_M": cluster_m, "CLUSTER_K": None, "C_T": None,
         "MMA_IN_FLIGHT": 1}, chosen


@pytest.mark.parametrize("shape", [(256, 1024, 4096),     # 64 tiles: too few (K split in clusters)
                                   (512, 3072, 768),      # wider N: 128 tiles of 64 x 192 (rule 1w) too many
                                   (384, 2304, 768),      # and 72 too few
                                   (512, 2304, 1536),     # K past 1024
                                   (512, 768, 8192),      # deeper K than measured
                                   (448, 1024, 3072)])    # 112 tiles in an odd count of tile rows: no pairs
def test_64_row_tiles_stay_where_they_were_measured(shape):
    assert "CONSUMERS" not in untuned_size_rule(HGEMM, *shape, "nn", 132)


@pytest.mark.parametrize("name", ["hgemm", "bgemm", "hgemm_f32c", "bgemm_f32c"])
@pytest.mark.parametrize("shape,pairs", [((512, 2304, 768), 2), ((512, 2304, 1024), 2), ((480, 2304, 512), 2),
                                         ((448, 2560, 768), 1)])
@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_64x192_tiles_where_they_fill_70_to_80_percent(name, shape, pairs, layout):
    """Size rule 1w: 64 x 192 tiles, one wgmma group in flight, for 512 <= K <= 1024 and N >= 2048
    where 8 x 12 = 96 of them fill 70-80% of 132 SMs; in pairs of tile rows sharing B where their
    count is even (7 x 14 = 98 at 448x2560: unpaired)."""
    chosen = untuned_size_rule(get_spec(name), *shape, layout, 132)
    assert {k: chosen.get(k) for k in ("CONSUMERS", "BN", "STAGES", "CLUSTER_M", "MMA_IN_FLIGHT")} == \
        {"CONSUMERS": 1, "BN": 192, "STAGES": 5, "CLUSTER_M": pairs, "MMA_IN_FLIGHT": 1}, chosen


def test_split_k_pass_is_left_to_the_deep_256_wide_shapes():
    assert untuned_split(HGEMM, 384, 4096, 11008, 132).splits == 2
    assert "CLUSTER_K" not in untuned_size_rule(HGEMM, 384, 4096, 11008, "nn", 132)
    # an even number of tile rows runs 128-wide tiles in clusters instead (size rule 0m), unsplit
    assert untuned_split(HGEMM, 512, 4096, 11008, 132) is None
    assert "CLUSTER_K" not in untuned_size_rule(HGEMM, 512, 4096, 11008, "nn", 132)


@pytest.mark.parametrize("shape,expect", [
    ((128, 768, 3072), {"C_T": 1, "BN": 32}),        # 24 units of 32 x 4 blocks
    ((256, 768, 3072), {"C_T": 1, "BN": 64}),        # 48 units of 32 would not fit; 24 of 64 do
    ((128, 1024, 8192), {"C_T": 1, "BN": 64}),
])
def test_deep_k_into_short_n_swaps_and_splits_in_clusters_of_4(shape, expect):
    chosen = untuned_size_rule(HGEMM, *shape, "nn", 132)
    assert chosen["CLUSTER_K"] == 4 and {k: chosen.get(k) for k in expect} == expect, chosen
    assert untuned_split(HGEMM, *shape, 132, "nn") is None


@pytest.mark.parametrize("shape,bn,ck", [
    ((256, 1024, 4096), 128, 4),      # 4-block clusters would not fit swapped; about 1K columns: rule 1a
    ((200, 1000, 3000), 128, 4),
    ((128, 3584, 3584), 64, 2),       # wide N (every kernel tile row would re-read A swapped): rule 1k
    ((256, 1536, 3072), 64, 2),
])
def test_deep_k_that_does_not_swap_runs_pairs_of_64_or_fours_of_128(shape, bn, ck):
    """Unswapped deep K: size rule 1k (64-wide tiles in pairs: twice their count fits one wave,
    2048 <= K < 8192, N >= 1536) or rule 1a (128-wide tiles in clusters of 4)."""
    chosen = untuned_size_rule(HGEMM, *shape, "nn", 132)
    assert {k: chosen.get(k) for k in ("C_T", "BN", "CLUSTER_M", "CLUSTER_K")} == \
        {"C_T": None, "BN": bn, "CLUSTER_M": 1, "CLUSTER_K": ck}, chosen
    assert untuned_split(HGEMM, *shape, 132, "nn") is None


# ---- size rule 1n: the pitch of A's rows picks the pairs sharing A ----------------------------------------
def _matrix(rows, cols, ld, item=2):
    return SimpleNamespace(shape=(rows, cols), ndim=2, strides=(ld * item, item), dtype=SimpleNamespace(itemsize=item))


@pytest.mark.parametrize("name", ["hgemm", "bgemm", "hgemm_f32c", "bgemm_f32c"])
def test_rows_off_128_byte_lines_share_a_in_pairs(name):
    """1000^3: A's rows 2000 bytes apart -> 128 x 64 tiles in pairs sharing A (size rule 1n); 1024^3
    and 960^3 (2048 and 1920 bytes: whole 128-byte lines) do not share A: 1024^3 runs rule 1p's
    64 x 128 tiles in pairs sharing B, 960^3 (15 rows of 64-row tiles, no pairs) rule 1b's single
    blocks."""
    spec = get_spec(name)
    assert untuned_size_rule(spec, 1000, 1000, 1000, "nn", 132).get("CLUSTER_N") == 2
    assert untuned_size_rule(spec, 1000, 1000, 1000, "tn", 132).get("CLUSTER_N") == 2
    chosen = untuned_size_rule(spec, 1024, 1024, 1024, "nn", 132)
    assert chosen.get("CLUSTER_N") is None and (chosen["CONSUMERS"], chosen["BN"], chosen["CLUSTER_M"]) == (1, 128, 2)
    chosen = untuned_size_rule(spec, 960, 960, 960, "nn", 132)
    assert chosen.get("CLUSTER_N") is None and chosen["BN"] == 64 and "CONSUMERS" not in chosen, chosen


def test_the_rule_sees_the_pitch_the_launch_reads():
    """PITCH_A is the stored rows' distance of the operand the kernel reads: a view with rows 1024
    halves apart of a 1000 x 1000 A is aligned (no pairs); a row TMA cannot address (1019 halves)
    is read from a copy padded to 1024 (untuned_size_rule knows it); a caller's pitches override."""
    from asmgemm.runtime.launch import choose_params, operand_pitches
    from asmgemm.runtime.plan import plan_launch
    plan = plan_launch(_matrix(1000, 1000, 1024), _matrix(1000, 1000, 1000), _matrix(1000, 1000, 1000),
                       trans_a=False, trans_b=False, ptr_of=lambda x: 256)
    assert operand_pitches(HGEMM, plan) == {"PITCH_A": 2048, "PITCH_B": 2000}
    assert choose_params(HGEMM, plan, None, None, 132).get("CLUSTER_N", 1) == 1
    dense = plan_launch(_matrix(1000, 1000, 1000), _matrix(1000, 1000, 1000), _matrix(1000, 1000, 1000, 4),
                        trans_a=False, trans_b=False, ptr_of=lambda x: 256)
    assert operand_pitches(get_spec("hgemm_f32c"), dense)["PITCH_A"] == 2000     # A's bytes, not C's
    assert choose_params(HGEMM, dense, None, None, 132)["CLUSTER_N"] == 2
    assert untuned_size_rule(HGEMM, 1009, 1013, 1019, "nn", 132).get("CLUSTER_N") is None
    from asmgemm.runtime.tensor_map import padded_pitch
    assert (padded_pitch(2038), padded_pitch(2048), padded_pitch(14)) == (2048, 2048, 16)
    assert HGEMM.size_rule(1000, 1000, 1000, 132, {}, {"PITCH_A": 2048, "PITCH_B": 2000}).get("CLUSTER_N") is None
    assert HGEMM.size_rule(1000, 1000, 1000, 132, {}).get("CLUSTER_N") == 2     # fresh operands by default
    assert HGEMM.fresh_pitches(100, 300, 200, {"TRANS_A": 1, "TRANS_B": 1}) == {"PITCH_A": 200, "PITCH_B": 400}


def test_no_pairs_sharing_a_where_the_consumers_load_a():
    """A_LDG (K <= 64, rows TMA cannot address) has no TMA loads of A to share."""
    assert HGEMM.size_rule(1000, 1000, 40, 132, {"A_LDG": 1}, {"PITCH_A": 80, "PITCH_B": 2000}).get("CLUSTER_N") is None
    assert HGEMM.size_rule(1000, 1000, 40, 132, {"A_LDG": 0}, {"PITCH_A": 80, "PITCH_B": 2000}).get("CLUSTER_N") == 2


@pytest.mark.parametrize("shape,f32c", [((4099, 4093, 509), True), ((8191, 4093, 509), True),
                                        ((4096, 4096, 512), False),      # rows of whole 16-byte pieces: staged
                                        ((3001, 2001, 509), False),      # under 6 waves of 64 x 256
                                        ((4099, 4093, 1000), False)])    # deeper K
def test_fp32_c_pair_stores_at_short_k_run_64x256_tiles(shape, f32c):
    """Size rule 1f sees C's element size (C_BYTES) and the pair-store path (WIDE_C = 0): only the
    fp32-C kernels take 64 x 256 tiles there, never hgemm or bgemm on the same shape."""
    want = {"CONSUMERS": 1, "BN": 256, "MMA_IN_FLIGHT": 1}
    for name, c32 in (("hgemm", False), ("bgemm", False), ("hgemm_f32c", True), ("bgemm_f32c", True)):
        chosen = untuned_size_rule(get_spec(name), *shape, "nn", 132)
        got = {k: chosen.get(k) for k in want}
        assert (got == want) == (f32c and c32), (name, shape, chosen)


def test_size_rules_see_c_bytes(tmp_path):
    """C_BYTES is the bytes of the spec's C dtype: one source, two C types, one rule."""
    from asmgemm.kernel_spec import load_spec_file
    rows = []
    for name, c in (("k16", "float16"), ("k32", "float32")):
        rows.append(f'[{name}]\nsource = "{get_spec("sgemm").source}"\n'
                    f'dtypes = {{ a = "float32", b = "float32", acc = "float32", c = "{c}" }}\n'
                    'targets = ["sm_90"]\nabi = ["A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "alpha", "beta"]\n'
                    'rel_err_limit = 1e-4\n'
                    'launch = { threads = "THREADS", tile_m = "TM", tile_n = "TN", smem_bytes = "SMEM_BYTES" }\n'
                    f'[[{name}.size_rule]]\nwhen = "C_BYTES == 4"\nset = {{ BK = 16 }}\n')
    spec_file = tmp_path / "k.toml"
    spec_file.write_text("\n".join(rows))
    specs = {s.name: s for s in load_spec_file(spec_file)}
    assert specs["k16"].size_rule(64, 64, 64, 132) == {} and specs["k32"].size_rule(64, 64, 64, 132) == {"BK": 16}
