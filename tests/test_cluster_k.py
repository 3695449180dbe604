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
from asmgemm.runtime.launch import grid
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
# ---- size rule 1n: the pitch of A's rows picks the pairs sharing A ----------------------------------------
def _matrix(rows, cols, ld, item=2):
    return SimpleNamespace(shape=(rows, cols), ndim=2, strides=(ld * item, item), dtype=SimpleNamespace(itemsize=item))


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
