"""hgemm's batched mode (BATCHED=1, issue 33) on the CPU: the kernel's builds and guards, its 3-D
tensor maps, and the runtime's routing of a batched 16-bit call (launch_config.configure on an
H100's facts, no GPU): hgemm itself where TMA reads every matrix in place, the in-place kernel
(hgemm_mma, grid z) otherwise. tests/test_hgemm_batched_gpu.py runs the launches on the H100."""
from __future__ import annotations

import pytest

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, build_file
from asmgemm.runtime import launch, launch_config, tensor_map
from asmgemm.runtime.arrays import Dtype, Matrix
from asmgemm.runtime.gpu import DeviceFacts
from asmgemm.runtime.launch_config import Problem, configure, pick_spec
from asmgemm.toolchain import find_tool
from sweeps import sample_every

H100 = DeviceFacts(0, "NVIDIA H100 80GB HBM3", "sm_90", 132, 1.98e9, 3.35e12)
F16, BF16, F32 = Dtype("float16", 2), Dtype("bfloat16", 2), Dtype("float32", 4)
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")


def ptx(**defines) -> str:
    """hgemm's PTX for these -D values (expansion and emission: no ptxas)."""
    return build_file("hgemm", BuildOptions(defines={k: str(v) for k, v in defines.items()}, target="sm_90a")).ptx


# ---- the kernel ---------------------------------------------------------------------------------
UNCLUSTERED = dict(CLUSTER_M=1)


def test_a_batched_build_loads_and_stores_through_3d_maps():
    """BATCHED=1: every TMA load of A and B is .3d (the batch the third coordinate), the staged
    store of C too; the 2-D build has none, and reads none of the batch arguments."""
    batched = ptx(BATCHED=1, WIDE_C=1, VEC_C=1, BN=128, **UNCLUSTERED)
    assert "cp.async.bulk.tensor.3d.shared::cluster.global" in batched
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" not in batched
    assert "cp.async.bulk.tensor.3d.global.shared::cta" in batched          # C's TMA store
    assert "cp.async.bulk.tensor.2d.global.shared::cta" not in batched
    for param in ("param_batch_stride_a", "param_batch_stride_b", "param_batch_stride_c", "param_batch"):
        assert f"[{param}]" in batched
    plain = ptx(WIDE_C=1, VEC_C=1, BN=128, **UNCLUSTERED)
    assert ".3d" not in plain and "[param_batch" not in plain
    # the count of matrices: the walk's length (block setup) and each tile's matrix (the producer's
    # and the consumers' TILE_COORDS)
    assert batched.count("[param_batch]") == 3


def test_streamed_loads_are_3d_too():
    """STREAM (evict-first per launch) keeps its hinted and plain loads, both 3-D in a batch."""
    text = ptx(BATCHED=1, STREAM=1, BN=128, **UNCLUSTERED)
    assert "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint" in text
    assert "cp.async.bulk.tensor.2d" not in text


@pytest.mark.parametrize("defines, message", [
    (dict(BATCHED=2), "BATCHED is 0 or 1"),
    (dict(BATCHED=1), "CLUSTER_M and CLUSTER_N must be 1"),                # the source default: pairs
    (dict(BATCHED=1, CLUSTER_M=1, CLUSTER_N=2, BN=128), "CLUSTER_M and CLUSTER_N must be 1"),
    (dict(BATCHED=1, CLUSTER_M=1, SPLIT_K=1), "not with split-K"),
    (dict(BATCHED=1, CLUSTER_M=1, CLUSTER_K=2, BN=128), "not with split-K"),
    (dict(BATCHED=1, CLUSTER_M=1, A_LDG=1), "not with A_LDG"),
    (dict(BATCHED=1, CLUSTER_M=1, C_T=1, BN=16, TRANS_B=1), "nor C_T"),
], ids=["value", "clusters_by_default", "cluster_n", "split_k", "cluster_k", "a_ldg", "c_t"])
def test_the_guards_refuse_what_a_batch_does_not_run_with(defines, message):
    with pytest.raises(AsmError) as e:
        ptx(**defines)
    assert message in str(e.value) and "guards.inc" in str(e.value.span.path)


# what a batched call's size rules pick (test_attention_p_v_* below): the 64-wide tiles of
# attention's P.V with a fused epilogue, staged and stored by 3-D TMA; the 256-wide default with
# gelu_tanh on the pair stores (the consumers' tightest: 168 registers, none to spare)
BUILDS = {
    "p_v_bn64_staged": ("-D", "BN=64", "-D", "STAGES=8", "-D", "GROUP_M=4", "-D", "WIDE_C=1", "-D", "VEC_C=1",
                        "-D", "BIAS=1", "-D", "ACT=4"),
    "bn256_gelu_tanh_pairs": ("-D", "BN=256", "-D", "BIAS=1", "-D", "ACT=3", "-D", "TRANS_A=1", "-D", "TRANS_B=1"),
}


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("build", sample_every(len(BUILDS), list(BUILDS)))
def test_batched_builds_have_no_spills(run_cli, build):
    code, out, err = run_cli("check", "hgemm", "--no-spills", "--max-registers", "168", "-D", "BATCHED=1",
                             "-D", "CLUSTER_M=1", *BUILDS[build])
    assert code == 0, out + err


# ---- tensor maps --------------------------------------------------------------------------------
def test_a_batch_map_is_3d_with_the_batch_outermost():
    tm = tensor_map.tile_map("A", 1 << 20, "float16", 77, 72, 72, 128, batches=12, batch_stride=77 * 72 + 8)
    assert tm.dims == (72, 77, 12) and tm.strides == (144, (77 * 72 + 8) * 2) and tm.box == (64, 128, 1)
    flat = tensor_map.tile_map("A", 1 << 20, "float16", 77, 72, 72, 128)
    assert flat.dims == (72, 77) and flat.strides == (144,) and flat.box == (64, 128)


def test_a_shared_operand_is_a_batch_of_one():
    """Batch stride 0 (every batch reads it): one matrix, which the kernel reads at matrix 0."""
    tm = tensor_map.tile_map("B", 1 << 20, "bfloat16", 64, 96, 96, 64, batches=8, batch_stride=0)
    assert tm.dims == (96, 64, 1) and tm.strides == (192, 64 * 192)


def test_a_batch_stride_tma_cannot_step_is_refused_in_words():
    with pytest.raises(AsmError, match="matrices are 130 bytes apart, not a multiple of 16"):
        tensor_map.tile_map("A", 1 << 20, "float16", 8, 64, 64, 128, batches=3, batch_stride=65)


# ---- routing ------------------------------------------------------------------------------------
def batch(b, rows, cols, dtype=F16, ld=None, stride=None, ptr=1 << 20):
    """A (b, rows, cols) batch: rows ld elements apart, matrices `stride` apart (default packed)."""
    ld = ld or cols
    stride = rows * ld if stride is None else stride
    return Matrix((b, rows, cols), (stride * dtype.itemsize, ld * dtype.itemsize, dtype.itemsize), dtype, ptr, 0)


def matrix(rows, cols, dtype=F16, ld=None, ptr=1 << 22):
    return Matrix((rows, cols), ((ld or cols) * dtype.itemsize, dtype.itemsize), dtype, ptr, 0)


@pytest.fixture
def builds(recorded_builds):
    return recorded_builds


def configured(a, b, c, dtype="float16", **kw):
    return configure(pick_spec(None, dtype, None, H100), Problem(a, b, c, **kw), H100)


def test_a_batch_tma_reads_runs_on_hgemm_itself(builds):
    """8 x (128 x 64 . 64 x 96): B per batch, so no fold; every row and matrix 16-byte aligned."""
    cfg = configured(batch(8, 128, 64), batch(8, 64, 96), batch(8, 128, 96))
    assert cfg.spec.name == "hgemm" and cfg.kernel_batch == 8
    assert cfg.plan.batch_strides == (128 * 64, 64 * 96, 128 * 96) and cfg.copied == (0, 0)
    kernel, defines = builds[-1]
    assert kernel == "hgemm" and defines["BATCHED"] == 1
    # unclustered (the multicast loads are 2-D), K unsplit
    assert defines["CLUSTER_M"] == 1 and defines["CLUSTER_N"] == 1 and defines.get("CLUSTER_K", 1) == 1
    assert cfg.split is None and not cfg.in_cluster


@pytest.mark.parametrize("dtype, kernel", [(F16, "hgemm"), (BF16, "bgemm")])
def test_heads_as_the_batch_of_a_transposed_view(builds, dtype, kernel):
    """q.transpose(1, 2) of a (1, s, h, d) tensor, as (h, s, d): matrices d elements apart, rows h x d
    apart (overlapping, interleaved): TMA steps both, so the kernel reads the view in place."""
    s, h, d = 200, 12, 64
    q = batch(h, s, d, dtype, ld=h * d, stride=d)
    k = batch(h, s, d, dtype, ld=h * d, stride=d, ptr=1 << 24)
    cfg = configured(q, k, batch(h, s, s, dtype, ptr=1 << 26), dtype.name, trans_b=True)
    assert cfg.spec.name == kernel and cfg.kernel_batch == h and cfg.plan.batch_strides[:2] == (d, d)
    assert cfg.plan.a.ld == h * d and builds[-1][1]["BATCHED"] == 1 and builds[-1][1]["TRANS_B"] == 1


def test_a_shared_b_with_a_transposed_a_is_a_batch_with_stride_zero(builds):
    """B 2-D (shared), A transposed: its batches do not stack as rows, so no fold: hgemm reads B's
    one matrix for every batch (batch stride 0)."""
    cfg = configured(batch(3, 64, 128), matrix(64, 96), batch(3, 128, 96), trans_a=True)
    assert cfg.spec.name == "hgemm" and cfg.kernel_batch == 3 and cfg.plan.batch_strides[1] == 0


@pytest.mark.parametrize("case", ["odd_rows", "odd_batch_stride", "unaligned_base"])
def test_a_batch_tma_cannot_read_runs_in_place(builds, case):
    """Rows or matrices TMA cannot step: the in-place kernel (grid z), as the issue's odd shapes
    (12 x 77 x 65 . 65 x 33) must run; no padded copies."""
    if case == "odd_rows":
        a, b, c = batch(12, 77, 65), batch(12, 65, 33), batch(12, 77, 33)
    elif case == "odd_batch_stride":
        a, b, c = batch(4, 64, 64, stride=64 * 64 + 4), batch(4, 64, 64), batch(4, 64, 64)
    else:
        a, b, c = batch(4, 64, 64, ptr=(1 << 20) + 2), batch(4, 64, 64), batch(4, 64, 64)
    cfg = configured(a, b, c)
    assert cfg.spec.name == "hgemm_mma" and cfg.kernel_batch == a.shape[0] and cfg.copied == (0, 0)
    assert all(name == "hgemm_mma" for name, _ in builds)


def test_params_pinning_hgemm_on_a_batch_tma_cannot_read_say_why(builds):
    a, b, c = batch(3, 16, 20), batch(3, 20, 8), batch(3, 16, 8)
    with pytest.raises(AsmError) as e:
        configure(pick_spec("hgemm", "float16", None, H100), Problem(a, b, c, params={"BN": 128}), H100)
    assert "3-D TMA maps" in e.value.message and "those of A are not" in e.value.message and e.value.hint
    assert "kernel='hgemm_mma'" not in e.value.hint         # params= pin the kernel: no other to name


def test_the_size_rules_see_the_batch_as_rows():
    """A batch on the persistent grid: its rules see batch x M rounded to 128-row tiles (a 2-D call,
    or a batch on grid z, its own M)."""
    hgemm, mma = pick_spec("hgemm", "float16", None, H100), pick_spec("hgemm_mma", "float16", None, H100)
    plan = configured(batch(32, 77, 64), batch(32, 64, 77), batch(32, 77, 77)).plan
    assert launch.rules_rows(hgemm, plan) == 32 * 128 and launch.rules_rows(mma, plan) == 77
    flat = configured(matrix(77, 64), matrix(64, 77), matrix(77, 77)).plan
    assert launch.rules_rows(hgemm, flat) == 77


def test_attention_p_v_gets_tiles_no_wider_than_its_columns(builds):
    """32 x (2048 x 2048 . 2048 x 64): 512 tiles over the batch. The catalog ranked for the batch
    (its tiles counted over all 32 matrices, no clusters: the loads they share are 2-D) gives tiles
    no wider than the 64 or 128 columns; wider ones would compute zeros."""
    configured(batch(32, 2048, 2048), batch(32, 2048, 64), batch(32, 2048, 64))
    defines = builds[-1][1]
    assert defines["BN"] <= 64 and defines["BATCHED"] == 1 and defines.get("CLUSTER_K", 1) == 1
    assert defines["CLUSTER_M"] == 1 and defines.get("CLUSTER_N", 1) == 1
    configured(batch(32, 2048, 2048), batch(32, 2048, 128), batch(32, 2048, 128))
    assert builds[-1][1]["BN"] <= 128


def test_a_batch_with_few_tiles_never_splits_k(builds):
    """2 x (128 x 4096 . 4096 x 64): a 2-D call of this shape may split K; a batch never does."""
    configured(batch(2, 128, 4096), batch(2, 4096, 64), batch(2, 128, 64))
    assert builds[-1][1].get("CLUSTER_K", 1) == 1 and builds[-1][1]["BATCHED"] == 1
    assert builds[-1][1].get("SPLIT_K", 0) == 0


def test_a_column_major_c_swaps_the_batch_onto_hgemm(builds):
    c = Matrix((4, 64, 96), (64 * 96 * 2, 2, 64 * 2), F16, 1 << 26, 0)      # each matrix column-major
    cfg = configured(batch(4, 64, 32), batch(4, 32, 96), c)
    assert cfg.spec.name == "hgemm" and cfg.plan.swapped and (cfg.plan.m, cfg.plan.n) == (96, 64)
    assert cfg.plan.batch_strides == (32 * 96, 64 * 32, 64 * 96)             # kernel A = the user's B


def test_an_fp32_c_batch_runs_on_hgemm_f32c(builds):
    cfg = configure(pick_spec(None, "float16", "float32", H100),
                    Problem(batch(3, 64, 64), batch(3, 64, 64), batch(3, 64, 64, F32)), H100)
    assert cfg.spec.name == "hgemm_f32c" and builds[-1][1]["BATCHED"] == 1


# ---- the launch: arguments, maps, grid ----------------------------------------------------------
@pytest.fixture(scope="module")
def built_batched():
    """A batch of 6 A's whose matrices lie 64 elements further apart than packed (so they do not
    stack as rows: no fold) by one shared B, built by ptxas as gemm() would."""
    cfg = configured(batch(6, 200, 64, stride=200 * 64 + 64), matrix(64, 136), batch(6, 200, 136))
    return cfg.spec, cfg.plan, cfg.built


@pytest.mark.toolchain
@needs_ptxas
def test_the_launch_passes_the_batch_and_3d_maps(built_batched, monkeypatch):
    spec, plan, built = built_batched
    assert spec.name == "hgemm" and plan.batch == 6 and plan.batch_strides[:2] == (200 * 64 + 64, 0)
    monkeypatch.setattr(tensor_map, "encode", lambda tm: tm)   # the TileMap instead of the driver's bytes
    args = launch.ArgPacker(built, plan, "float16", "float16").pack(1 << 20, 1 << 22, 1 << 26, 1.0, 0.0)
    named = dict(zip((name for name, _ in built.params), args))
    assert int(named["batch"]) == 6
    assert (int(named["batch_stride_a"]), int(named["batch_stride_b"])) == plan.batch_strides[:2]
    assert named["tmap_a"].dims == (64, 200, 6) and named["tmap_b"].dims == (136, 64, 1)
    assert named["tmap_c"].dims == (136, 200, 6) and named["tmap_c"].strides == (272, 200 * 136 * 2)
    # a persistent grid over batch x tiles, at most one block a multiprocessor
    units = 6 * -(-200 // built.tile_m) * -(-136 // built.tile_n)
    assert launch.grid(spec, built, plan, 132) == (min(units, 132), 1, 1)


def test_a_folded_batch_tma_cannot_read_runs_in_place(builds):
    """gemm(a[4, 1000, 300], b[300, 700]), the issue's third call: one 2-D GEMM of 4000 rows, whose
    600-byte rows TMA cannot step and whose 3-D storage gets no padded copy: the in-place kernel,
    2-D (hgemm's own batched mode does not take it from there)."""
    cfg = configured(batch(4, 1000, 300), matrix(300, 700), batch(4, 1000, 700))
    assert cfg.spec.name == "hgemm_mma" and cfg.kernel_batch == 1 and cfg.plan.m == 4000
    with pytest.raises(AsmError, match="a batched call gets no padded copies"):
        configure(pick_spec("hgemm", "float16", None, H100),
                  Problem(batch(4, 1000, 300), matrix(300, 700), batch(4, 1000, 700), params={"BN": 128}), H100)
