"""The Hopper HGEMM on the CPU: every shipped variant builds for sm_90a without a ptxas warning
(setmaxnreg ignored, wgmma serialized), its SASS runs on HGMMA and UTMALDG with no
WARPGROUP.DEPBAR after every HGMMA, no spills and no local memory; the include library's macros
produce the descriptor bits and instructions they document; the spec, the tensor-map arguments and
the TMA rules (runtime/tensor_map.py) hold without a GPU."""
from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, assemble, build_file
from asmgemm.toolchain import disassemble, find_tool
from sweeps import sample_every

HERE = Path(__file__).parent
KERNELS = HERE.parent / "kernels_ptx"

needs_tools = pytest.mark.skipif(
    find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
    reason="ptxas/nvdisasm not installed")

# The tuning space that fits in shared memory: BN=256 is 48 KB a stage (3-4 stages), BN=192 40 KB
# (3-5), BN=128 32 KB (3-6).
TILES = [(256, 3), (256, 4), (192, 4), (192, 5), (128, 4), (128, 6)]
LAYOUTS = [(ta, tb) for ta in (0, 1) for tb in (0, 1)]


@functools.lru_cache(maxsize=None)
def _assembled(bn=256, stages=4, ta=0, tb=0, bf16=0, vec_c=1, cluster=2, wide=0, cluster_n=1):
    defines = {"BN": str(bn), "STAGES": str(stages), "TRANS_A": str(ta), "TRANS_B": str(tb), "BF16": str(bf16),
               "VEC_C": str(vec_c), "CLUSTER_M": str(cluster), "WIDE_C": str(wide), "CLUSTER_N": str(cluster_n)}
    result = build_file("hgemm", BuildOptions(defines=defines, target="sm_90a"))
    asm = assemble(result)
    return result, asm, disassemble(asm.cubin)


def _opcodes(sass: str) -> list[str]:
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", line)
        if m:
            out.append(m.group(1))
    return out


def _check_variant(bn, stages, ta, tb, bf16, vec_c, cluster=2, wide=0, cluster_n=1):
    result, asm, sass = _assembled(bn, stages, ta, tb, bf16, vec_c, cluster, wide, cluster_n)
    assert not asm.warnings, asm.warnings          # C7508 (setmaxnreg ignored), C7510/C7515 (wgmma serialized)
    (k,) = asm.kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == k.stack_frame == 0
    assert k.registers <= 168                      # 384 threads, one block per SM: 65536 / 384, rounded to 8
    ops = _opcodes(sass)
    counts = Counter(op.split(".")[0] for op in ops)
    hgmma = [op for op in ops if op.startswith("HGMMA")]
    assert len(hgmma) == 4 and all(op.startswith(f"HGMMA.64x{bn}x16.F32") for op in hgmma), hgmma
    assert ("BF16" in hgmma[0]) == bool(bf16)
    # one UTMALDG per K-major tile, one per 64-wide chunk of an MN-major tile; with a cluster of 2
    # each block loads half of B (one K-major box of BN / 2 rows, or half of the chunks; BN = 192's
    # three chunks do not halve, so each block loads the half of every chunk's k-rows), multicast
    chunks = -(-bn // 64)                          # BN = 96: two chunks, the second half used
    b_loads = 1 if tb else (chunks if cluster > 1 and chunks % cluster else chunks // cluster)
    # CLUSTER_N = 2: each block loads one 64-row half of A (a box of 64 rows, or one M-major chunk), multicast
    a_loads = 1 if cluster_n > 1 or not ta else 2
    assert counts["UTMALDG"] == a_loads + b_loads
    multicast = (b_loads if cluster > 1 else 0) + (a_loads if cluster_n > 1 else 0)
    assert sum(".MULTICAST" in op for op in ops if op.startswith("UTMALDG")) == multicast
    assert not any("UTMALDG" in line and "desc[" in line for line in sass.splitlines())   # STREAM=0: no L2 hints
    # one wait_group per K tile in the loop (MMA_IN_FLIGHT=0, the default, waits for all; nothing
    # after the loop): ptxas did not serialize the wgmmas with a wait after each
    assert counts["WARPGROUP"] <= 3 and sum(op.startswith("WARPGROUP.DEPBAR") for op in ops) == 1
    assert counts["USETMAXREG"] == 2
    assert not any(op.startswith(("LDL", "STL")) for op in ops)
    # WIDE_C: the tile through shared memory, stmatrix x4 per two 8-column blocks, then (TMA_C, the
    # default) one bulk tensor store per 64-column box
    # (16-bit C in whole 64-column boxes only: BN = 96 stores pairs)
    staged = wide and bn % 64 == 0
    assert counts["STSM"] == (bn // 16 if staged else 0)
    assert sum(op.startswith("UTMASTG") for op in ops) == (bn // 64 if staged else 0)
    # the accumulators are never zeroed by moves: a tile's first HGMMA overwrites them (scale-d)
    # (zeroing them took 64 CS2R: 70-73 zero moves in all before, 8-9 since)
    zero_moves = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?(?:MOV R\d+, RZ|CS2R R\d+, SRZ)", sass, re.M)
    assert len(zero_moves) < 32, len(zero_moves)
    return ops


@needs_tools
@pytest.mark.parametrize("ta,tb", sample_every(4, LAYOUTS, unpack=True))
def test_layouts_build_clean(ta, tb):
    _check_variant(256, 4, ta, tb, 0, 1)


@needs_tools
@pytest.mark.parametrize("bn,stages", sample_every(6, TILES, unpack=True))
def test_tiles_build_clean(bn, stages):
    _check_variant(bn, stages, 0, 0, 0, 1)


@needs_tools
def test_bf16_and_scalar_stores_build_clean():
    _check_variant(256, 4, 1, 1, 1, 0)
    _check_variant(128, 4, 0, 1, 1, 1)


@needs_tools
@pytest.mark.parametrize("ta,tb", sample_every(4, LAYOUTS, unpack=True))
def test_three_chunk_tiles_build_clean(ta, tb):
    """BN=192 (a size rule's choice where 256-wide tiles leave a wave short) in every layout, with
    and without a cluster, staged C included."""
    _check_variant(192, 4, ta, tb, 0, 1)
    _check_variant(192, 4, ta, tb, 1, 1, cluster=1, wide=1)


@needs_tools
@pytest.mark.parametrize("ta,tb", sample_every(4, LAYOUTS, unpack=True))
@pytest.mark.parametrize("bn,cluster", sample_every(4, [(64, 1), (128, 2), (192, 2), (256, 2)], unpack=True))
def test_tiles_sharing_a_build_clean(ta, tb, bn, cluster):
    """CLUSTER_N=2 (blocks of a tile row share A by multicast), alone and in 2 x 2 units; staged C."""
    _check_variant(bn, 4, ta, tb, 0, 1, cluster=cluster, wide=1, cluster_n=2)


@needs_tools
@pytest.mark.parametrize("ta,tb", sample_every(4, LAYOUTS, unpack=True))
@pytest.mark.parametrize("cluster", sample_every(2, [1, 2]))
def test_96_wide_tiles_build_clean(ta, tb, cluster):
    """BN=96 (size rule 1h): m64n96k16; N-major B in two 64-column chunks (a cluster's blocks one
    each), K-major B one box of 96 rows (48 a block in pairs); a 16-bit C by pairs."""
    _check_variant(96, 6, ta, tb, 0, 1, cluster=cluster, wide=1)
    c = _assembled(96, 6, ta, tb, 0, 1, cluster, 1, 1)[0].constants     # the build just checked (cached)
    assert c["B_BYTES"] == (96 * 128 if tb else 2 * 64 * 128) and c["STAGED_C"] == 0
    assert c["BOX_B_ROWS"] == (96 // cluster if tb else 64)


@needs_tools
@pytest.mark.parametrize("ta,tb", sample_every(4, LAYOUTS, unpack=True))
def test_96_wide_tiles_stage_an_fp32_c_in_three_boxes(ta, tb):
    """An fp32 C at BN = 96 is three 64 x 32 boxes of floats a consumer, staged one box a round
    (C_BOXES_ASKED = 2 does not divide 3) and stored by TMA: the 6-stage ring still fits."""
    r = build_file("hgemm", BuildOptions(defines={"BN": "96", "STAGES": "6", "TRANS_A": str(ta), "TRANS_B": str(tb),
                                                  "CLUSTER_M": "2", "WIDE_C": "1", "C_F32": "1"}, target="sm_90a"))
    c = r.constants
    assert (c["STAGED_C"], c["C_BOXES_TILE"], c["C_BOXES"], c["C_ROUNDS"], c["RING"]) == (1, 3, 1, 3, 6)
    asm = assemble(r)
    assert not asm.warnings, asm.warnings
    (k,) = asm.kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == 0 and k.registers <= 168
    ops = _opcodes(disassemble(asm.cubin))
    assert sum(op.startswith("HGMMA.64x96x16.F32") for op in ops) == 4
    assert sum(op.startswith("UTMASTG") for op in ops) == 3
    assert sum(op.startswith("STS.64") for op in ops) == 2 * 12      # 12 blocks of 8 columns, rows r and r + 8


@pytest.mark.parametrize("defines,message", [
    ({"CLUSTER_N": "3"}, "CLUSTER_N must be 1 or 2"),
    ({"CLUSTER_N": "2", "CLUSTER_M": "1", "CLUSTER_K": "2", "BN": "128"}, "not with CLUSTER_K"),
    ({"CLUSTER_N": "2", "A_LDG": "1"}, "nor A_LDG"),
])
def test_tiles_sharing_a_refuse_what_they_cannot_share(defines, message):
    with pytest.raises(AsmError, match=message):
        build_file("hgemm", BuildOptions(defines=defines, target="sm_90a"))


@needs_tools
@pytest.mark.parametrize("defines", sample_every(6, [
    {"BN": "64", "STAGES": "8", "CLUSTER_M": "1"}, {"BN": "64", "STAGES": "10", "CLUSTER_M": "2", "TRANS_A": "1"},
    {"BN": "256", "STAGES": "4", "WIDE_C": "1", "BIAS": "1", "ACT": "3", "TRANS_B": "1"},
    {"BN": "128", "CLUSTER_M": "1", "CLUSTER_K": "4"}, {"BN": "128", "C_F32": "1", "WIDE_C": "1", "CLUSTER_M": "1"},
]))
def test_64_row_tiles_build_clean(defines):
    """CONSUMERS=1 (size rule 1r): 64 x BN tiles, 256 threads, one consumer's wgmmas; no spills with
    the registers setmaxnreg gives it, one TMA box of A (64 rows, or one M-major chunk) a K tile."""
    r = build_file("hgemm", BuildOptions(defines={**defines, "CONSUMERS": "1"}, target="sm_90a"))
    c = r.constants
    assert (c["TM"], c["THREADS"], c["A_BYTES"]) == (64, 256, 8192)
    assert c["BOX_A_ROWS"] == 64                   # K-major: the tile's 64 rows; M-major: BK k-rows of one chunk
    asm = assemble(r)
    assert not asm.warnings, asm.warnings
    (k,) = asm.kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == k.stack_frame == 0
    assert k.registers <= 232
    ops = _opcodes(disassemble(asm.cubin))
    bn = int(defines["BN"])
    assert sum(op.startswith("HGMMA") for op in ops) == 4     # one m64nBNk16 a k16 step of the K tile
    tb = defines.get("TRANS_B") == "1"
    b_loads = 1 if tb else max(1, bn // 64 // int(defines.get("CLUSTER_M", "2")))
    assert sum(op.startswith("UTMALDG") for op in ops) == 1 + b_loads


@pytest.mark.parametrize("defines,message", [
    ({"CONSUMERS": "3"}, "CONSUMERS must be 1 or 2"),
    ({"CONSUMERS": "1", "CLUSTER_K": "8", "CLUSTER_M": "1", "BN": "128"}, "not with CLUSTER_K = 8"),
    ({"CLUSTER_M": "3"}, "CLUSTER_M must be 1, 2 or 4"),
    ({"CLUSTER_M": "4", "BN": "16", "TRANS_B": "1", "CONSUMERS": "1"}, "multiple of 8 rows"),
])
def test_64_row_tiles_refuse_what_they_cannot_split(defines, message):
    with pytest.raises(AsmError, match=message):
        build_file("hgemm", BuildOptions(defines=defines, target="sm_90a"))


@needs_tools
@pytest.mark.parametrize("ta,tb", sample_every(4, LAYOUTS, unpack=True))
@pytest.mark.parametrize("cluster_m,cluster_n", sample_every(4, [(4, 1), (1, 2), (2, 2), (4, 2)], unpack=True))
def test_64_row_tiles_share_a_and_b_in_clusters_of_up_to_eight(ta, tb, cluster_m, cluster_n):
    """64 x 64 tiles in units of CLUSTER_M x CLUSTER_N: each block multicasts its share of B (a
    quarter with CLUSTER_M = 4: 16 k-rows of N-major B or 16 rows of K-major B, 2 KB at 2 KB steps)
    and of A (half: 32 rows of K-major A, or 32 k-rows of M-major A's one 64-wide chunk), whole
    1024-byte swizzle atoms; the empty barriers count every block of the unit. Clean in ptxas."""
    defines = {"CONSUMERS": "1", "BN": "64", "STAGES": "13", "MMA_IN_FLIGHT": "1", "CLUSTER_M": str(cluster_m),
               "CLUSTER_N": str(cluster_n), "TRANS_A": str(ta), "TRANS_B": str(tb), "C_F32": "1", "WIDE_C": "1"}
    r = build_file("hgemm", BuildOptions(defines=defines, target="sm_90a"))
    c = r.constants
    assert c["CLUSTER"] == cluster_m * cluster_n and c["RING"] == 13
    assert c["BOX_A_ROWS"] == (32 if cluster_n == 2 else 64) and c["A_BY_K"] == int(bool(ta) and cluster_n == 2)
    assert c["BOX_B_ROWS"] == 64 // cluster_m and c["B_BY_K"] == int(not tb and cluster_m > 1)
    assert f".reqnctapercluster {cluster_m * cluster_n}, 1, 1" in r.ptx
    # one load of each operand a K tile, multicast where a cluster shares it
    assert r.ptx.count(".multicast::cluster") == (cluster_m > 1) + (cluster_n > 1)
    assert r.ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global") == 2
    counts = re.findall(r"mbarrier\.init\.shared::cta\.b64 \[[^\]]+\], (\d+);", r.ptx)
    assert counts.count(str(cluster_m * cluster_n)) == 13          # empty[s]: one consumer a block
    asm = assemble(r)
    assert not asm.warnings, asm.warnings
    (k,) = asm.kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == 0


def test_three_chunk_tile_splits_b_by_k_rows_in_a_cluster():
    """Two blocks cannot share three 64-column chunks evenly: each loads BK / 2 k-rows of all three
    (a box of 32 rows, 4 KB: whole 1024-byte swizzle atoms at 4096-byte offsets)."""
    r = build_file("hgemm", BuildOptions(defines={"BN": "192"}, target="sm_90a"))
    assert r.constants["B_BY_K"] == 1 and r.constants["BOX_B_ROWS"] == 32 and r.constants["RING"] == 4
    assert r.ptx.count(".multicast::cluster") == 3
    for defines in ({"BN": "192", "CLUSTER_M": "1"}, {"BN": "192", "TRANS_B": "1"}, {"BN": "256"}):
        r = build_file("hgemm", BuildOptions(defines=defines, target="sm_90a"))
        assert r.constants["B_BY_K"] == 0
    assert build_file("hgemm", BuildOptions(defines={"BN": "192", "TRANS_B": "1"},
                                            target="sm_90a")).constants["BOX_B_ROWS"] == 96


@pytest.mark.parametrize("defines,clustered", [
    ({}, True), ({"CLUSTER_N": "2", "CLUSTER_M": "1", "BN": "64"}, True),
    ({"CONSUMERS": "1", "BN": "64", "CLUSTER_M": "2", "MMA_IN_FLIGHT": "1"}, True),
    ({"ACT": "3", "WIDE_C": "1"}, True), ({"C_F32": "1", "WIDE_C": "1", "BN": "128", "STAGES": "6"}, True),
    ({"CONSUMERS": "1", "BN": "64", "CLUSTER_M": "4", "CLUSTER_N": "2", "MMA_IN_FLIGHT": "1", "STAGES": "13"}, True),
    ({"CLUSTER_M": "1"}, False), ({"CLUSTER_M": "1", "CLUSTER_K": "2", "BN": "128"}, False),
], ids=["pairs", "sharing-a", "64-row-pairs", "pairs-act", "pairs-f32c", "64-row-4x2", "unclustered", "cluster-k"])
def test_a_cluster_leaves_without_a_cluster_barrier(defines, clustered):
    """The only cluster barrier is the set-up's (every block's mbarriers exist before any block
    multicasts into them), with a .relaxed arrive: no block waits for the others at the exit.
    Blocks sharing tiles by multicast leave through the producer's tail instead: one more mbarrier
    (exit_bar, after the ring's 2 x RING), on which warps 1-3 of the producer warpgroup sleep until
    the tail has seen every stage's last fill released by the consumers of all blocks of the unit
    (RING more waits on the empty barriers). CLUSTER_K's senders wait for the owners' arrives on
    their red_empty instead."""
    r = build_file("hgemm", BuildOptions(defines=defines, target="sm_90a"))
    c = r.constants
    cluster = c["CLUSTER"] > 1
    assert r.ptx.count("barrier.cluster.arrive") == r.ptx.count("barrier.cluster.arrive.relaxed") == int(cluster)
    assert r.ptx.count("barrier.cluster.wait") == int(cluster)
    assert c["EXIT_WAIT"] == int(clustered)
    inits = r.ptx.count("mbarrier.init.shared::cta.b64")
    assert inits == 2 * c["RING"] + int(clustered) + (2 if c["CLUSTER_K"] > 1 else 0)
    assert ("producer_tail:" in r.ptx) == clustered and ("producer_idle:" in r.ptx) == (clustered and not c["ACT_WARPS"])
    if c["CLUSTER_K"] > 1:
        assert "red_drained:" in r.ptx
    assert c["SMEM_BYTES"] <= 232448


@needs_tools
@pytest.mark.parametrize("bn,stages,bf16", sample_every(3, [(256, 3, 0), (192, 4, 1), (128, 5, 1)], unpack=True))
def test_staged_wide_stores_build_clean(bn, stages, bf16):
    _check_variant(bn, stages, 0, 0, bf16, 1, wide=1)


def test_wide_stores_take_the_fourth_stage():
    """BN=256 with a staged C tile fits a ring of 3 stages: STAGES=4 (the default, which the runtime
    passes) builds with RING = 3; without WIDE_C the ring is STAGES deep."""
    wide = build_file("hgemm", BuildOptions(defines={"WIDE_C": "1", "STAGES": "4"}, target="sm_90a"))
    assert wide.constants["RING"] == 3 and wide.constants["SMEM_BYTES"] <= 232448
    assert build_file("hgemm", BuildOptions(target="sm_90a")).constants["RING"] == 4
    assert build_file("hgemm", BuildOptions(defines={"WIDE_C": "1", "BN": "128", "STAGES": "6"},
                                            target="sm_90a")).constants["RING"] == 6
    # staging half the tile at a time (two rounds of TMA stores) makes room for the fourth stage
    half = build_file("hgemm", BuildOptions(defines={"WIDE_C": "1", "C_BOXES_ASKED": "2"}, target="sm_90a"))
    assert half.constants["RING"] == 4 and half.constants["C_ROUNDS"] == 2 and half.constants["SMEM_BYTES"] <= 232448


@needs_tools
def test_c_stored_in_rounds_issues_every_box_once():
    result = build_file("hgemm", BuildOptions(defines={"WIDE_C": "1", "C_BOXES_ASKED": "1"}, target="sm_90a"))
    asm = assemble(result)
    assert not asm.warnings and asm.kernels[0].spill_stores == 0
    ops = _opcodes(disassemble(asm.cubin))
    assert sum(op.startswith("UTMASTG") for op in ops) == 4 and sum(op.startswith("STSM") for op in ops) == 16
    assert result.ptx.count("cp.async.bulk.wait_group.read 0") == 4       # one per round, before reuse


@needs_tools
@pytest.mark.parametrize("ta,tb", sample_every(2, [(0, 0), (1, 1)], unpack=True))
def test_without_clusters_builds_clean(ta, tb):
    _check_variant(256, 4, ta, tb, 0, 1, cluster=1)


def test_too_many_stages_stop_the_build_with_the_kernels_message():
    with pytest.raises(AsmError) as exc:
        build_file("hgemm", BuildOptions(defines={"STAGES": "5"}, target="sm_90a"))
    assert "227 KB" in exc.value.message and exc.value.span.path.endswith("hgemm/guards.inc")


def test_geometry_and_abi_from_the_build():
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.build_cache import abi_params, launch_geometry
    spec = get_spec("hgemm")
    for ta, tb in LAYOUTS:
        result = build_file("hgemm", BuildOptions(defines={"TRANS_A": str(ta), "TRANS_B": str(tb)}, target="sm_90a"))
        geo = launch_geometry(spec, result)
        assert (geo["threads"], geo["tile_m"], geo["tile_n"]) == (384, 128, 256)
        # the ring, its barriers (rounded up to 1024 for the staged C tile's swizzle), no C tile
        assert geo["smem_bytes"] == 1024 + -(-(4 * (128 + 256) * 64 * 2 + 16 * 4) // 1024) * 1024
        assert geo["box_rows_a"] == (64 if ta else 128) and geo["box_rows_b"] == (128 if tb else 64)
        assert geo["cluster"] == 2 and ".reqnctapercluster 2, 1, 1" in result.ptx
        assert abi_params(spec, result)[:3] == (("tmap_a", ".b8"), ("tmap_b", ".b8"), ("tmap_c", ".b8"))
        assert geo["box_rows_c"] == 64


def test_fp32_c_kernels_are_picked_by_c_dtype():
    from asmgemm.kernel_spec import get_spec, spec_for_dtype
    assert spec_for_dtype("float16", "sm_90", "float32") is get_spec("hgemm_f32c")
    assert spec_for_dtype("bfloat16", "sm_90", "float32") is get_spec("bgemm_f32c")
    assert dict(get_spec("bgemm_f32c").defines) == {"BF16": 1, "C_F32": 1}
    with pytest.raises(AsmError, match="no GEMM kernel takes float32 -> float16"):
        spec_for_dtype("float32", "sm_90", "float16")


@needs_tools
def test_fp32_c_builds_clean_without_the_staged_tile():
    """C_F32 with TMA_C=0: pairs stored as v2.f32 (8 bytes); WIDE_C is ignored (the 16-byte store
    path moves 16-bit elements), so no staging buffer and the ring keeps its fourth stage."""
    result = build_file("hgemm", BuildOptions(defines={"C_F32": "1", "WIDE_C": "1", "VEC_C": "1", "TMA_C": "0"},
                                              target="sm_90a"))
    asm = assemble(result)
    assert not asm.warnings and asm.kernels[0].spill_stores == 0
    ops = _opcodes(disassemble(asm.cubin))
    assert "STSM" not in {op.split(".")[0] for op in ops} and any(op.startswith("STG.E.64") for op in ops)
    assert result.constants["RING"] == 4 and "st.shared.v2.f32" not in result.ptx


def test_bgemm_is_the_same_source_with_bf16():
    from asmgemm.kernel_spec import get_spec, spec_for_dtype
    h, b = get_spec("hgemm"), get_spec("bgemm")
    assert h.source == b.source and b.entry == "hgemm" and dict(b.defines) == {"BF16": 1}
    assert spec_for_dtype("float16", "sm_90") is h and spec_for_dtype("bfloat16", "sm_90") is b
    assert h.build_target("sm_90") == "sm_90a" and h.build_target("sm_80") is None
    # without wgmma the portable mma.sync kernel takes 16-bit calls (kernels_ptx/mma_gemm.sasm)
    assert spec_for_dtype("float16", "sm_80") is get_spec("hgemm_mma")
    assert spec_for_dtype("bfloat16", "sm_86") is get_spec("bgemm_mma")
    with pytest.raises(AsmError, match="no float16 GEMM kernel supports sm_75"):
        spec_for_dtype("float16", "sm_75")


# ---- hopper.inc, macro by macro -----------------------------------------------------------------
def _macro_kernel(body: str, decls: str = "") -> str:
    return f""".include "hopper.inc"
.extern .shared .align 1024 .b8 smem[];
.visible .entry probe(.param .align 64 .b8 param_tmap[128], .param .u64 param_out)
.maxntid 128, 1, 1
{{
    .regs .u64 desc, tmap
    .regs .u32 addr, bar, t
{decls}
    mov.u32 addr, smem;
    add.u32 bar, addr, 8192;
    mov.b64 tmap, param_tmap;
    cvta.param.u64 tmap, tmap;
{body}
    ret;
}}
"""


def _build_text(tmp_path, text: str):
    src = tmp_path / "probe.sasm"
    src.write_text(text)
    return build_file(src, BuildOptions(target="sm_90a", include_dirs=[str(KERNELS)]))


def test_smem_desc_bits(tmp_path):
    """Bits 16-29 LBO >> 4, 32-45 SBO >> 4, 62-63 swizzle mode 1 (128 B), address bits 4-17 at 0-13."""
    result = _build_text(tmp_path, _macro_kernel("    SMEM_DESC_128B(desc, addr, 8192, 1024, t)\n"))
    ptx = result.ptx
    assert re.search(r"bfe\.u32 \S+, \S+, 4, 14;", ptx)
    assert "or.b32 %R" in ptx and f", {(8192 >> 4) << 16};" in ptx
    assert f", {((1024 >> 4) | (1 << 30)) << 32};" in ptx


@needs_tools
def test_tma_load_and_mbar_wait_become_utmaldg_and_a_trywait_loop(tmp_path):
    body = """    mbarrier.init.shared::cta.b64 [bar], 1;
    mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], 8192;
    TMA_LOAD_2D(addr, tmap, 0, 0, bar)
    MBAR_WAIT(bar, 0)
    MBAR_WAIT(bar, 1)
"""
    result = _build_text(tmp_path, _macro_kernel(body))
    ops = _opcodes(disassemble(assemble(result).cubin))
    assert "UTMALDG.2D" in ops
    assert sum(op.startswith("SYNCS.PHASECHK") for op in ops) >= 2     # two waits, two distinct loops
    assert result.ptx.count("mbarrier.try_wait.parity") == 2


@needs_tools
def test_wgmma_ss_covers_n_over_2_accumulators(tmp_path):
    body = """    SMEM_DESC_128B(desc, addr, 16, 1024, t)
.for i in range(32)
    mov.f32 acc{i}, 0f00000000;
.endfor
    wgmma.fence.sync.aligned;
    WGMMA_SS(64, f16, acc, 0, desc, desc, 0, 1, 1)
    wgmma.commit_group.sync.aligned;
    wgmma.wait_group.sync.aligned 0;
    ld.param.u64 tmap, [param_out];
.for i in range(32)
    st.global.f32 [tmap+{4 * i}], acc{i};
.endfor
"""
    result = _build_text(tmp_path, _macro_kernel(body, "    .regs .f32 acc<0-31>"))
    line = next(ln for ln in result.ptx.splitlines() if "wgmma.mma_async" in ln)
    assert "m64n64k16.f32.f16.f16" in line and line.count("%R") == 32 + 2
    assert line.rstrip().endswith("1, 1, 1, 0, 1;")
    ops = _opcodes(disassemble(assemble(result).cubin))
    assert any(op.startswith("HGMMA.64x64x16.F32") for op in ops)


# ---- tensor maps: what the runtime encodes -------------------------------------------------------
def test_tile_map_follows_the_stored_matrix():
    from asmgemm.runtime.tensor_map import tile_map
    tm = tile_map("A", 0x1000, "float16", 300, 200, 208, 128)
    assert tm.dims == (200, 300) and tm.row_bytes == 416 and tm.box == (64, 128)
    one = tile_map("B", 0x1000, "bfloat16", 1, 7, 7, 64)       # one row: its stride is never used
    assert one.row_bytes == 16 and one.box == (64, 64)


@pytest.mark.parametrize("ld,promotion", [(1024, 256), (4096, 256), (128, 256), (1000, 128), (2000, 128),
                                          (1088, 128), (8, 128)])
def test_l2_promotion_is_256_bytes_only_for_rows_on_256_byte_lines(ld, promotion):
    """Rows that do not start on 256-byte lines fetch by 128 (2000³: 473 -> 536 TFLOP/s on the H100)."""
    from asmgemm.runtime.tensor_map import tile_map
    assert tile_map("A", 0x1000, "float16", 300, 8, ld, 128).l2_promotion == promotion
    assert tile_map("A", 0x1000, "float16", 1, 8, ld, 128).l2_promotion == 256       # one row: no stride


@pytest.mark.parametrize("ptr,rows,ld,box,message", [
    (0x1008, 10, 64, 64, "not a multiple of 16 bytes as TMA requires"),
    (0x1000, 10, 100, 64, "rows are 200 bytes apart"),
    (0x1000, 10, 64, 300, "outside 1..256"),
    (0x1000, 0, 64, 64, "0 rows"),
])
def test_tile_map_refuses_what_tma_cannot_read(ptr, rows, ld, box, message):
    from asmgemm.runtime.tensor_map import tile_map
    with pytest.raises(AsmError, match=message):
        tile_map("A", ptr, "float16", rows, 64, ld, box)


def test_pack_args_puts_each_tensor_map_in_its_slot(monkeypatch):
    """The A and B maps go to tmap_a and tmap_b with the kernel's box heights, as 128-byte values."""
    from types import SimpleNamespace

    from asmgemm.runtime import tensor_map
    from asmgemm.runtime.build_cache import BuiltKernel
    from asmgemm.runtime.launch import pack_args
    from asmgemm.runtime.plan import plan_launch

    seen = []

    def fake_encode(tm):
        seen.append(tm)
        return np.frombuffer(bytes([len(seen)]) * 128, dtype="V128")[0]
    monkeypatch.setattr(tensor_map, "encode", fake_encode)

    def matrix(rows, cols, ptr):
        return SimpleNamespace(shape=(rows, cols), ndim=2, strides=(cols * 2, 2), dtype=SimpleNamespace(itemsize=2),
                               ptr=ptr)
    a, b, c = matrix(300, 64, 0x10000), matrix(64, 200, 0x20000), matrix(300, 200, 0x30000)
    plan = plan_launch(a, b, c, trans_a=False, trans_b=False, ptr_of=lambda x: x.ptr)
    built = BuiltKernel("k", "hgemm", 384, 128, 256, 0,
                        (("tmap_a", ".b8"), ("tmap_b", ".b8"), ("C", ".u64"), ("M", ".u32"), ("N", ".u32"),
                         ("K", ".u32"), ("ldc", ".u32"), ("alpha", ".f32"), ("beta", ".f32")),
                        "x.cubin", "x.ptx", "sm_90a", (128, 64))
    args = pack_args(built, plan, 1.0, 0.0, "float16")
    assert [x.dtype.itemsize for x in args[:2]] == [128, 128]
    assert seen[0].ptr == 0x10000 and seen[0].dims == (64, 300) and seen[0].box == (64, 128)
    assert seen[1].ptr == 0x20000 and seen[1].dims == (200, 64) and seen[1].box == (64, 64)
    assert int(args[2]) == 0x30000 and [int(x) for x in args[3:7]] == [300, 200, 64, 200]
    assert plan.call_values["vec_c"] == 1


def test_vec_c_needs_even_n_ldc_and_pair_alignment():
    from types import SimpleNamespace

    from asmgemm.runtime.plan import plan_launch

    def matrix(rows, cols, ld, ptr=0x1000):
        return SimpleNamespace(shape=(rows, cols), ndim=2, strides=(ld * 2, 2), dtype=SimpleNamespace(itemsize=2),
                               ptr=ptr)
    for n, ldc, ptr, want, wide in ((200, 200, 0x1000, 1, 1), (201, 201, 0x1000, 0, 0), (200, 202, 0x1000, 1, 0),
                                    (200, 201, 0x1000, 0, 0), (200, 200, 0x1002, 0, 0), (200, 200, 0x1008, 1, 0),
                                    (204, 208, 0x1000, 1, 0)):
        plan = plan_launch(matrix(8, 16, 16), matrix(16, n, n), matrix(8, n, ldc, ptr),
                           trans_a=False, trans_b=False, ptr_of=lambda x: x.ptr)
        assert (plan.call_values["vec_c"], plan.call_values["wide_c"]) == (want, wide), (n, ldc, ptr)


def test_persistent_grid_walks_units_of_the_cluster():
    """grid = min(units, SMs // cluster) * cluster blocks; a unit is `cluster` tile rows of one column."""
    from types import SimpleNamespace

    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.launch import grid
    spec = get_spec("hgemm")

    def built(cluster, rows=None):
        return SimpleNamespace(tile_m=128, tile_n=256, cluster=cluster, cluster_rows=cluster if rows is None else rows, cluster_cols=1)

    def plan(m, n, batch=1):
        return SimpleNamespace(m=m, n=n, groups=0, batch=batch)
    assert grid(spec, built(2), plan(4096, 4096), 132) == (132, 1, 1)      # 256 units, 66 clusters
    assert grid(spec, built(1), plan(300, 300, batch=5), 132) == (30, 1, 1)    # BATCHED: 5 matrices of 6 units
    assert grid(spec, built(2), plan(300, 300), 132) == (8, 1, 1)          # 3 tile rows -> 2 units, x 2 columns
    assert grid(spec, built(1), plan(300, 300), 132) == (6, 1, 1)
    assert grid(spec, built(2), plan(1, 1), 133) == (2, 1, 1)
    assert grid(spec, built(2), plan(100000, 256), 133)[0] == 132            # never an odd block count
    # CLUSTER_K: 4 blocks a cluster split one tile's K (a unit is one tile row): 6 tiles -> 24 blocks
    assert grid(spec, built(4, 1), plan(128, 1536), 132) == (24, 1, 1)
    assert grid(spec, built(8, 1), plan(4096, 4096), 132) == (128, 1, 1)     # 16 clusters walk 512 tiles
    # no more clusters than the device runs at once (cluster_capacity.max_active_clusters)
    assert grid(spec, built(4), plan(4096, 4096), 132, cluster_capacity=30) == (120, 1, 1)
    assert grid(spec, built(4), plan(512, 4096), 132, cluster_capacity=30) == (64, 1, 1)    # 16 units: fewer anyway
    assert grid(spec, built(4), plan(4096, 4096), 132, cluster_capacity=None) == (132, 1, 1)
    assert grid(spec, built(2), plan(4096, 4096), 132, cluster_capacity=80) == (132, 1, 1)  # the SMs bound first


def test_cluster_capacity_is_asked_once_and_only_where_the_driver_can_answer(monkeypatch):
    """max_active_clusters: None for an unclustered kernel and for a function without CuPy's
    CUfunction handle (a stand-in), without asking the driver; one answer per (build, device, and
    split-K's clusters along z: along_z = S for an x-unclustered build)."""
    from types import SimpleNamespace

    from asmgemm.runtime import cluster_capacity
    monkeypatch.setattr(cluster_capacity, "_cache", {})
    asked = []
    monkeypatch.setattr(cluster_capacity, "_query",
                        lambda fn, built, along_z=0: asked.append((built.key, along_z)) or 30 + along_z)
    four = SimpleNamespace(key="k4", cluster=4, threads=256, smem_bytes=200000)
    one = SimpleNamespace(key="k1", cluster=1, threads=256, smem_bytes=1000)
    assert cluster_capacity.max_active_clusters(object(), one, 0) is None
    assert cluster_capacity.max_active_clusters(object(), one, 0, 1) is None        # S = 1: no cluster
    assert cluster_capacity.max_active_clusters(object(), four, 0) == 30
    assert cluster_capacity.max_active_clusters(object(), four, 0) == 30
    assert cluster_capacity.max_active_clusters(object(), four, 1) == 30
    assert cluster_capacity.max_active_clusters(object(), one, 0, 8) == 38          # CLUSTER_K = 8 along z
    assert cluster_capacity.max_active_clusters(object(), one, 0, 8) == 38
    assert asked == [("k4", 0), ("k4", 0), ("k1", 8)]        # once per device and cluster shape
    monkeypatch.undo()
    assert cluster_capacity._query(SimpleNamespace(kernel=None), four) is None
    assert cluster_capacity._query(SimpleNamespace(kernel=SimpleNamespace(ptr=0)), four) is None
    assert cluster_capacity._query(SimpleNamespace(kernel=None), one, 8) is None


def test_blocks_per_sm_is_asked_once_and_only_where_the_driver_can_answer(monkeypatch):
    """blocks_per_sm (last_launch()'s, the cost model's r): one answer per (build, device); None
    for a function without CuPy's CUfunction handle."""
    from types import SimpleNamespace

    from asmgemm.runtime import cluster_capacity
    monkeypatch.setattr(cluster_capacity, "_blocks", {})
    asked = []
    monkeypatch.setattr(cluster_capacity, "_query_blocks", lambda fn, built: asked.append(built.key) or 2)
    b = SimpleNamespace(key="kb", cluster=1, threads=256, smem_bytes=67584)
    assert cluster_capacity.blocks_per_sm(object(), b, 0) == 2 == cluster_capacity.blocks_per_sm(object(), b, 0)
    assert cluster_capacity.blocks_per_sm(object(), b, 1) == 2
    assert asked == ["kb", "kb"]
    monkeypatch.undo()
    assert cluster_capacity._query_blocks(SimpleNamespace(kernel=None), b) is None


def test_tmap_c_is_encoded_only_for_whole_16_byte_rows_of_c(monkeypatch):
    """WIDE_C (rows of C whole 16-byte pieces, C 16-byte aligned) stores C by TMA: tmap_c is C's map
    (M x N, ldc, boxes of 64 rows x 128 bytes: 64 halves, or 32 floats for an fp32 C); otherwise,
    and for split-K's partial pass (c_map=False: a workspace new each call), the kernel never reads
    it: 128 zero bytes."""
    from types import SimpleNamespace

    from asmgemm.runtime import tensor_map
    from asmgemm.runtime.build_cache import BuiltKernel
    from asmgemm.runtime.launch import ArgPacker
    from asmgemm.runtime.plan import plan_launch

    seen = []

    def fake_encode(tm):
        seen.append(tm)
        return np.frombuffer(bytes([7]) * 128, dtype="V128")[0]
    monkeypatch.setattr(tensor_map, "encode", fake_encode)

    def matrix(rows, cols, ptr, item=2):
        return SimpleNamespace(shape=(rows, cols), ndim=2, strides=(cols * item, item),
                               dtype=SimpleNamespace(itemsize=item), ptr=ptr)
    params = (("tmap_a", ".b8"), ("tmap_b", ".b8"), ("tmap_c", ".b8"), ("C", ".u64"), ("M", ".u32"),
              ("N", ".u32"), ("K", ".u32"), ("ldc", ".u32"), ("alpha", ".f32"), ("beta", ".f32"))
    built = BuiltKernel("k", "hgemm", 384, 128, 256, 0, params, "x.cubin", "x.ptx", "sm_90a", (128, 64, 64), 2)
    for n, item, c_dtype, c_map, box in ((200, 2, "float16", True, (64, 64)), (201, 2, "float16", True, None),
                                         (200, 4, "float32", True, (32, 64)), (202, 4, "float32", True, None),
                                         (200, 4, "float32", False, None)):
        seen.clear()
        b = matrix(64, n, 0x20000)
        b.strides = (208 * 2, 2)                   # B's rows 16-byte aligned whatever N is
        plan = plan_launch(matrix(300, 64, 0x10000), b, matrix(300, n, 0x30000, item),
                           trans_a=False, trans_b=False, ptr_of=lambda x: x.ptr)
        args = ArgPacker(built, plan, "float16", c_dtype, c_map=c_map).pack(plan.a.ptr, plan.b.ptr, plan.c_ptr,
                                                                          1.0, 0.0)
        if box:
            assert seen[2].ptr == 0x30000 and seen[2].dims == (n, 300) and seen[2].box == box
            assert seen[2].dtype == c_dtype and bytes(args[2]) == bytes([7]) * 128
        else:
            assert len(seen) == 2 and bytes(args[2]) == bytes(128)


@needs_tools
@pytest.mark.parametrize("wg_n,in_flight,depbars", sample_every(4, [(256, 1, 2), (256, 2, 2), (128, 0, 1), (128, 2, 2)], unpack=True))
def test_wgmma_width_and_waits_build_as_asked(wg_n, in_flight, depbars):
    """WG_N=128 issues two m64n128k16 per k16 step on the two accumulator halves; MMA_IN_FLIGHT=1
    waits for the K tile before (plus a wait after the loop), 2 commits half a K tile before it waits."""
    defines = {"WIDE_C": "1", "WG_N": str(wg_n), "MMA_IN_FLIGHT": str(in_flight)}
    result = build_file("hgemm", BuildOptions(defines=defines, target="sm_90a"))
    asm = assemble(result)
    assert not asm.warnings and asm.kernels[0].spill_stores == 0
    sass = disassemble(asm.cubin)
    ops = _opcodes(sass)
    hgmma = [op for op in ops if op.startswith("HGMMA")]
    assert len(hgmma) == 4 * 256 // wg_n and all(op.startswith(f"HGMMA.64x{wg_n}x16.F32") for op in hgmma)
    assert sum(op.startswith("WARPGROUP.DEPBAR") for op in ops) == depbars
    if in_flight == 2:      # the first half's group stays in flight: wait for at most one pending
        assert re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1", sass)
    assert result.ptx.count("wgmma.commit_group") == (2 if in_flight == 2 else 1)


# ---- issue 12 in the HGEMM: the fused epilogue and split-K's partial pass -------------------------
def _sass_addresses(sass: str, prefix: str) -> list[int]:
    return [int(m.group(1), 16) for m in re.finditer(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?" + prefix, sass,
                                                      re.M)]


def _k_loop(sass: str) -> tuple[int, int]:
    """(first, last) address of the consumers' K loop: the backward branch nearest after the last
    HGMMA whose target lies before the first one."""
    labels, pending, branches = {}, [], []
    for line in sass.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"^\s*/\*([0-9a-f]{4,})\*/", line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for label in pending:
            labels[label] = addr
        pending = []
        t = re.search(r"BRA\S*\s+`\((\.L_x_\d+)\)", line)
        if t:
            branches.append((addr, t.group(1)))
    mmas = _sass_addresses(sass, "HGMMA")
    loops = [(labels[t], a) for a, t in branches if a > max(mmas) and labels.get(t, 1 << 62) < min(mmas)]
    assert loops, "no K loop found around the HGMMAs"
    return min(loops, key=lambda se: se[1] - se[0])


@needs_tools
@pytest.mark.parametrize("act", sample_every(3, [0, 1, 2, 3, 4]))
@pytest.mark.parametrize("bias", sample_every(3, [0, 1, 2]))
def test_fused_epilogue_builds_keep_the_main_loop_clean(act, bias):
    """Every BIAS x ACT of the default (staged, TMA-stored) build: no ptxas warning, the main loop as
    without an epilogue (4 HGMMA, one wait per K tile), no spills. (With the activation applied by
    the consumers over the whole tile, gelu spilled 12 bytes and gelu_tanh 224-320; the activation
    warps took it out of the consumers, docs/log/hgemm.md.)"""
    if act == bias == 0:
        pytest.skip("the plain build: test_staged_wide_stores_build_clean")
    defines = {"WIDE_C": "1", "VEC_C": "1", "BIAS": str(bias), "ACT": str(act)}
    result = build_file("hgemm", BuildOptions(defines=defines, target="sm_90a"))
    asm = assemble(result)
    assert not asm.warnings, asm.warnings
    sass = disassemble(asm.cubin)
    ops = _opcodes(sass)
    assert sum(op.startswith("HGMMA") for op in ops) == 4
    assert sum(op.startswith("WARPGROUP.DEPBAR") for op in ops) == 1
    start, end = _k_loop(sass)
    assert not [a for a in _sass_addresses(sass, "(?:LDL|STL)") if start <= a <= end], "local memory in the K loop"
    k = asm.kernels[0]
    assert k.spill_stores == k.spill_loads == k.local_bytes == 0, (k.spill_stores, k.spill_loads)
    assert ("ld.global.nc" in result.ptx) == bool(bias)


@needs_tools
@pytest.mark.parametrize("defines", sample_every(4, [{}, {"BN": "128", "STAGES": "6", "CLUSTER_M": "1"},
                                                  {"TRANS_A": "1", "TRANS_B": "1", "BF16": "1"}, {"C_F32": "1"}]))
def test_split_k_partial_pass_builds_clean(defines):
    """SPLIT_K=1 (the size rule's decode variant among them): fp32 pair stores only (no staged C,
    no TMA store), the tile walk over S copies, no spills."""
    d = {"WIDE_C": "1", "VEC_C": "1", "SPLIT_K": "1", **defines}
    result = build_file("hgemm", BuildOptions(defines=d, target="sm_90a"))
    asm = assemble(result)
    assert not asm.warnings and asm.kernels[0].spill_stores == asm.kernels[0].local_bytes == 0
    ops = _opcodes(disassemble(asm.cubin))
    assert not any(op.startswith(("STSM", "UTMASTG")) for op in ops)
    assert "ld.param.u32" in result.ptx and "param_k_chunk" in result.ptx and "param_split_stride" in result.ptx
    assert "st.global.v2.f32" in result.ptx


def test_split_k_and_a_fused_epilogue_do_not_build_together():
    with pytest.raises(AsmError, match="split-K's partial pass stores raw partial sums"):
        build_file("hgemm", BuildOptions(defines={"SPLIT_K": "1", "ACT": "2"}, target="sm_90a"))


@pytest.mark.parametrize("defines,expected", sample_every(4, [
    ({"WIDE_C": "1", "ACT": "2"}, 1), ({"WIDE_C": "1", "ACT": "3", "BIAS": "2", "BN": "192"}, 1),
    ({"WIDE_C": "1", "BIAS": "1"}, 0),                       # nothing to apply
    ({"WIDE_C": "1", "ACT": "2", "ACT_WARPS_ASKED": "0"}, 0),
    ({"WIDE_C": "1", "ACT": "2", "C_BOXES_ASKED": "2"}, 0),  # the tile staged in two rounds
    ({"WIDE_C": "1", "ACT": "2", "TMA_C": "0"}, 0), ({"ACT": "2"}, 0), ({"WIDE_C": "1", "ACT": "2", "C_F32": "1"}, 0)],
    unpack=True))
def test_activation_warps_where_the_tile_is_staged_once(defines, expected):
    r = build_file("hgemm", BuildOptions(defines=defines, target="sm_90a"))
    assert r.constants["ACT_WARPS"] == expected
    assert ("activation_warps:" in r.ptx) == bool(expected)


@needs_tools
@pytest.mark.parametrize("act", sample_every(3, [2, 3, 4]))
def test_activation_warps_fit_the_producers_registers(act):
    """The activation warps run after setmaxnreg.dec 40: their loop (from the wait for a staged tile
    to the wait among themselves) may name registers R0..R39 only, and applies the activation
    (MUFU: ex2, rcp) to 8 elements per 16-byte chunk read and written back (LDS.128, STS.128)."""
    result = build_file("hgemm", BuildOptions(defines={"WIDE_C": "1", "VEC_C": "1", "BIAS": "1", "ACT": str(act)},
                                              target="sm_90a"))
    asm = assemble(result)
    assert not asm.warnings and asm.kernels[0].spill_stores == asm.kernels[0].local_bytes == 0
    lines = [ln for ln in disassemble(asm.cubin).splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    first = next(i for i, ln in enumerate(lines) if "LDS.128" in ln)
    start = max(i for i in range(first) if "BAR.SYNC" in lines[i])
    end = next(i for i in range(first + 1, len(lines)) if "BAR.SYNC" in lines[i])
    loop = lines[start:end + 1]
    used = {int(x) for ln in loop for x in re.findall(r"\bR(\d+)\b", ln)}
    assert max(used) < result.constants["PRODUCER_REGS"], max(used)
    assert sum("MUFU" in ln for ln in loop) >= 8 and sum("STS.128" in ln for ln in loop) == 1


@pytest.mark.parametrize("ta,tb", sample_every(2, [(0, 0), (1, 1)], unpack=True))
def test_stream_loads_each_operand_hinted_or_plain(ta, tb):
    """STREAM=1 (kernels.toml's small-M rules): every load that is not a multicast is a branch
    between an evict-first one (a desc[] cache-policy operand) and a plain one, taken from the
    launch's tile counts (one tile column: A streams; one tile row: B)."""
    defines = {"STREAM": "1", "CLUSTER_M": "1", "BN": "128", "STAGES": "6", "TRANS_A": str(ta), "TRANS_B": str(tb)}
    result = build_file("hgemm", BuildOptions(defines=defines))
    assert "createpolicy.fractional.L2::evict_first.b64" in result.ptx
    assert result.ptx.count("setp.eq.u32") >= 2
    asm = assemble(result)
    sass = disassemble(asm.cubin)
    loads = [line for line in sass.splitlines() if "UTMALDG" in line]
    per_tile = (2 if ta else 1) + (1 if tb else 2)          # A boxes + B boxes (BN = 128: two 64-wide chunks)
    assert len(loads) == 2 * per_tile and sum("desc[" in line for line in loads) == per_tile


@needs_tools
@pytest.mark.parametrize("defines", sample_every(5, [{}, {"BN": "128", "CLUSTER_M": "2"}, {"C_F32": "1", "BIAS": "1", "ACT": "1"},
                                                  {"BN": "64", "CLUSTER_M": "1", "CLUSTER_K": "2", "BF16": "1"},
                                                  {"WIDE_C": "1", "ACT": "3", "BIAS": "2"}]))
def test_a_loaded_by_the_consumers_builds_clean(defines):
    """A_LDG=1 (call value a_ldg: A's rows unaligned for TMA, K <= 64): no A tensor-map load in the
    producer, only B's; each consumer thread's 32 2-byte loads of A in two rounds of 16, four
    16-byte shared stores, the proxy fence and its warpgroup's barrier before the wgmmas; no spills."""
    d = {"A_LDG": "1", "TRANS_B": "0", **defines}
    result = build_file("hgemm", BuildOptions(defines=d, target="sm_90a"))
    asm = assemble(result)
    (k,) = asm.kernels
    assert not asm.warnings and k.spill_stores == k.spill_loads == k.local_bytes == 0
    assert k.registers <= 168
    sass = disassemble(asm.cubin)
    plain_build = build_file("hgemm", BuildOptions(defines={**d, "A_LDG": "0"}, target="sm_90a"))
    plain = assemble(plain_build)
    tma = [line for line in sass.splitlines() if "UTMALDG" in line]
    tma_plain = [line for line in disassemble(plain.cubin).splitlines() if "UTMALDG" in line]
    assert len(tma) == len(tma_plain) - 1                     # A's box is gone, B's loads stay
    # (a per-row bias is read by 2-byte loads too: count what A_LDG adds)
    assert result.ptx.count("ld.global.nc.b16") - plain_build.ptx.count("ld.global.nc.b16") == 32
    assert result.ptx.count("st.shared.v4.b32") - plain_build.ptx.count("st.shared.v4.b32") == 4
    assert "fence.proxy.async.shared::cta" in result.ptx and "param_lda" in result.ptx
    loads = Counter(op for op in _opcodes(sass) if op.startswith("LDG"))
    loads_plain = Counter(op for op in _opcodes(disassemble(plain.cubin)) if op.startswith("LDG"))
    assert sum(loads.values()) - sum(loads_plain.values()) == 32, (loads, loads_plain)


def test_a_loaded_by_the_consumers_needs_k_major_a():
    with pytest.raises(AsmError, match="A_LDG is 0 or 1, and 1 only with K-major A"):
        build_file("hgemm", BuildOptions(defines={"A_LDG": "1", "TRANS_A": "1"}, target="sm_90a"))


@needs_tools
@pytest.mark.parametrize("defines,stores", sample_every(5, [({}, 64), ({"BN": "192", "CLUSTER_M": "1"}, 48), ({"BN": "128"}, 32),
                                                         ({"BN": "64", "STAGES": "8"}, 16), ({"BIAS": "2", "BF16": "1"}, 64)],
                                                     unpack=True))
def test_fp32_c_is_staged_for_tma_stores(defines, stores):
    """C_F32 with whole 16-byte rows (WIDE_C): each consumer thread writes its accumulator pairs
    into 64 x 32 boxes of floats (st.shared.v2.f32, one a pair: BN / 4 of them) and one thread
    stores the boxes by TMA, in rounds of at most 4 (BN = 256: 8 boxes, two rounds); no global
    stores of C from the consumers, no spills. With an activation the pair path stays (below)."""
    d = {"C_F32": "1", "WIDE_C": "1", **defines}
    result = build_file("hgemm", BuildOptions(defines=d, target="sm_90a"))
    asm = assemble(result)
    (k,) = asm.kernels
    assert not asm.warnings and k.spill_stores == k.spill_loads == k.local_bytes == 0
    assert result.ptx.count("st.shared.v2.f32") == stores
    ops = _opcodes(disassemble(asm.cubin))
    assert any(op.startswith("UTMASTG") for op in ops)
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in result.ptx


def test_fp32_c_with_an_activation_keeps_the_pair_stores():
    d = {"C_F32": "1", "WIDE_C": "1", "ACT": "3"}
    result = build_file("hgemm", BuildOptions(defines=d, target="sm_90a"))
    assert "st.shared.v2.f32" not in result.ptx and "cp.async.bulk.tensor.2d.global.shared" not in result.ptx


@needs_tools
@pytest.mark.parametrize("defines", sample_every(3, [
    {}, {"BN": "128", "CONSUMERS": "1"}, {"BN": "192", "BF16": "1"}, {"BIAS": "1", "ACT": "2"},
    {"BN": "128", "CLUSTER_N": "2", "CLUSTER_M": "1"}, {"BATCHED": "1", "CLUSTER_M": "1"},
]))
def test_shifted_c_builds_clean(defines):
    """SHIFTED_C (a C whose rows are not whole 16-byte pieces, staged with each row shifted): no
    spills; the tile leaves by 16-byte global stores (STG.E.128) of whole pieces and 2-byte ones at
    the rows' ends, none by TMA (its boxes start on 16 bytes of a row), and the staging is st.shared,
    not stmatrix (a shifted pair may straddle a word)."""
    r = build_file("hgemm", BuildOptions(defines={**defines, "SHIFTED_C": "1"}, target="sm_90a"))
    c = r.constants
    assert (c["SHIFTED"], c["C_BY_TMA"], c["STAGED_C"]) == (1, 0, 1)
    assert c["C_STAGE"] == 64 * c["C_ROW"] and c["SMEM_BYTES"] <= 232448
    asm = assemble(r)
    assert not asm.warnings, asm.warnings
    (k,) = asm.kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == k.stack_frame == 0
    ops = _opcodes(disassemble(asm.cubin))
    assert not any(op.startswith("UTMASTG") for op in ops) and not any(op.startswith("STSM") for op in ops)
    assert any(op.startswith("STG") and ".128" in op for op in ops)
    assert any(op.startswith("STG") and ".U16" in op for op in ops)


def test_shifted_c_leaves_other_builds_alone():
    """SHIFTED_C stores shifted only 16-bit rows of an unswapped C that are not whole pieces: off with
    WIDE_C (TMA stores as before), C_F32, C_T, and gelu_tanh at BN = 256 (its temporaries spilled
    beside the shifted staging; BN = 128 builds it): the pair stores there, as before."""
    def constants(**defines):
        return build_file("hgemm", BuildOptions(defines={"SHIFTED_C": "1", **defines}, target="sm_90a")).constants
    wide = constants(WIDE_C="1")
    assert (wide["SHIFTED"], wide["C_BY_TMA"]) == (0, 1)
    for off in ({"C_F32": "1"}, {"C_T": "1", "BN": "64", "TRANS_B": "1"}, {"ACT": "3", "BIAS": "1"}):
        c = constants(**off)
        assert (c["SHIFTED"], c["STAGED_C"]) == (0, 0), off
    assert constants(ACT="3", BN="128")["SHIFTED"] == 1


def test_shifted_c_is_asked_for_a_16_bit_c_whose_rows_are_not_whole_pieces():
    """The call value shifted_c (plan.py): odd N or ldc, or a base off 16 bytes, for a 16-bit,
    unswapped C; not an fp32 C, not whole pieces (wide_c), not under gelu_tanh."""
    from types import SimpleNamespace

    from asmgemm.runtime.plan import GELU_TANH, plan_launch

    def matrix(rows, cols, ptr, item=2, ld=None):
        return SimpleNamespace(shape=(rows, cols), ndim=2, strides=((ld or cols) * item, item),
                               dtype=SimpleNamespace(itemsize=item), ptr=ptr)

    def values(n, ldc=None, ptr=0x30000, item=2, activation=0):
        b = matrix(64, n, 0x20000, ld=208)                # B's rows 16-byte aligned whatever N is
        return plan_launch(matrix(300, 64, 0x10000), b, matrix(300, n, ptr, item, ldc),
                           trans_a=False, trans_b=False, ptr_of=lambda x: x.ptr, activation=activation).call_values
    assert values(201)["shifted_c"] == 1 and values(201)["wide_c"] == 0
    assert values(200, ldc=203)["shifted_c"] == 1
    assert values(200, ptr=0x30002)["shifted_c"] == 1
    assert values(200)["shifted_c"] == 0 and values(200)["wide_c"] == 1
    assert values(201, item=4)["shifted_c"] == 0
    assert values(201, activation=GELU_TANH)["shifted_c"] == 0 and values(201, activation=1)["shifted_c"] == 1
