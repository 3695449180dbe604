"""16-bit batched gemm() and asmgemm.grouped_gemm on the CPU (issue 33).

The argument checks of the grouped call (runtime/grouped.py: check_grouped, check_offsets) are pure
functions of array descriptions. Then both calls run to the launch with the stand-in CuPy of
tests/fake_cupy.py, whose "kernel" reads the packed arguments by the build's .param list and its
TRANS/BATCHED/GROUPED defines and computes what the kernel would (fp16 in numpy), with
mma_gemm.sasm built by ptxas for sm_90 (the stand-in device is an H100): a 3-D call hgemm cannot
take as one 2-D GEMM goes to hgemm_mma's batched mode (grid z), a grouped call to its grouped mode
(grid y = ceil(total / BM) + E) with the offsets read on the device only. A wrong stride, pointer
slot, offset or define gives a wrong C. The kernel's own arithmetic is checked on the GPU
(tests/test_grouped_gpu.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.runtime.arrays import Dtype, Matrix
from asmgemm.runtime.grouped import check_grouped, check_offsets
from fake_cupy import FakeArray, install_fakes
from test_epilogue_cpu import TINY, needs_ptxas


def desc(shape, dtype="float16", item=2, strides=None, device=0, ptr=256):
    if strides is None:
        strides, acc = [], item
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= max(n, 1)
    return Matrix(tuple(shape), tuple(strides), Dtype(dtype, item), ptr, device)


# ---- argument checks (pure) ---------------------------------------------------------------------------
def test_a_well_formed_grouped_call_gives_its_sizes():
    assert check_grouped(desc((100, 64)), desc((8, 64, 96)), desc((100, 96)), desc((8,), "int32", 4)) == (8, 100, 64,
                                                                                                          96)
    # a transposed (E, N, K) weight viewed as (E, K, N), and no out
    assert check_grouped(desc((10, 64)), desc((3, 64, 32), strides=(4096, 2, 128)), None,
                         desc((3,), "int32", 4)) == (3, 10, 64, 32)


@pytest.mark.parametrize("args, message", [
    ((desc((4, 10, 64)), desc((8, 64, 96)), None, desc((8,), "int32", 4)), "A must be 2-D"),
    ((desc((100, 64)), desc((64, 96)), None, desc((8,), "int32", 4)), "B must be 3-D"),
    ((desc((100, 64)), desc((8, 64, 96), "bfloat16"), None, desc((8,), "int32", 4)), "share one dtype"),
    ((desc((100, 64), "float32", 4), desc((8, 64, 96), "float32", 4), None, desc((8,), "int32", 4)),
     "the grouped kernels take"),
    ((desc((100, 64)), desc((8, 65, 96)), None, desc((8,), "int32", 4)), "inner dimensions differ"),
    ((desc((100, 64)), desc((8, 64, 96)), None, desc((8,), "int64", 8)), "offs must be a 1-D int32"),
    ((desc((100, 64)), desc((8, 64, 96)), None, desc((7,), "int32", 4)), "offs has 7 end rows, but B has 8"),
    ((desc((100, 64)), desc((8, 64, 96)), desc((100, 95)), desc((8,), "int32", 4)), r"expected \(100, 96\)"),
    ((desc((100, 64)), desc((8, 64, 96)), desc((100, 96), strides=(2, 200)), desc((8,), "int32", 4)),
     "out's rows must be contiguous"),
    ((desc((100, 64)), desc((8, 64, 96)), None, desc((8,), "int32", 4, device=1)), "same GPU"),
])
def test_grouped_argument_errors(args, message):
    with pytest.raises(AsmError, match=message):
        check_grouped(*args)


@pytest.mark.parametrize("offs, message", [
    ([3, 2, 9], r"must not decrease: offs\[1\] = 2 < offs\[0\] = 3"),
    ([3, 5, 11], r"offs\[2\] = 11 passes A's 10 rows"),
    ([-1, 5, 9], r"offs\[0\] = -1 is negative"),
    ([3, 5], "must be 3 integer end rows"),
    ([0.5, 1.0, 2.0], "integer end rows"),
])
def test_host_offsets_are_checked(offs, message):
    with pytest.raises(AsmError, match=message):
        check_offsets(offs, 3, 10)


def test_host_offsets_may_hold_empty_experts_and_stop_short():
    assert check_offsets([0, 0, 4, 4, 7], 5, 10).tolist() == [0, 0, 4, 4, 7]
    assert check_offsets([], 0, 10).tolist() == []


# ---- to the launch with the stand-in CuPy ------------------------------------------------------------------
@pytest.fixture
def fake16(monkeypatch, tmp_path):
    from asmgemm.runtime import build_cache
    cp, torch, launches = install_fakes(monkeypatch, tmp_path, TINY / "tiny_dgemm.toml", np.float16)
    yield cp, torch, launches
    build_cache.clear_memory_cache()


def h16(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float16).view(FakeArray)


def ref(a, b):
    return np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.toolchain
@needs_ptxas
def test_a_batch_hgemm_cannot_take_runs_on_the_portable_kernels_batched_mode(fake16):
    """issue 33's gemm(a[8,128,64], b[8,64,96]), smaller: a B per batch, odd sizes; and q.transpose(1, 2)
    of a (b, s, h, d) tensor against K^T, heads as the batch with a row stride of h * d."""
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    cp, torch, launches = fake16
    a, b = h16(3, 5, 7), h16(3, 7, 6, seed=1)
    c = asmgemm.gemm(a, b)
    assert last_launch()["kernel"] == "hgemm_mma" and launches[-1][0][2] == 3
    for i in range(3):
        close(c[i], ref(a[i], b[i]))
    q, k = h16(5, 2, 3, 4, seed=2), h16(5, 2, 3, 4, seed=3)            # (s, b, h, d): heads of one batch
    qh, kh = q[:, 0].transpose(1, 0, 2).view(FakeArray), k[:, 0].transpose(1, 0, 2).view(FakeArray)  # (h, s, d)
    s = asmgemm.gemm(qh, kh, trans_b=True)                              # Q K^T per head: (h, s, s)
    assert s.shape == (3, 5, 5) and last_launch()["kernel"] == "hgemm_mma"
    for h in range(3):
        close(s[h], ref(qh[h], kh[h].T))


@pytest.mark.toolchain
@needs_ptxas
def test_a_fold_tma_cannot_read_runs_in_place_instead_of_refusing(fake16):
    """issue 33's gemm(a[4,1000,300], b[300,700]), smaller: one 2-D GEMM of 4 * M rows whose rows
    (300 halves, 600 bytes) TMA cannot read; it was "a batched call gets no padded copies"."""
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    cp, torch, launches = fake16
    a, b = h16(2, 6, 30), h16(30, 9, seed=1)
    c = asmgemm.gemm(a, b)
    assert last_launch()["kernel"] == "hgemm_mma" and launches[-1][0][2] == 1     # folded: no grid z
    for i in range(2):
        close(c[i], ref(a[i], b))


@pytest.mark.toolchain
@needs_ptxas
def test_an_odd_batch_stride_narrows_the_copies(fake16):
    """Every batch's matrix must be aligned as the first: a batch stride of an odd number of halves
    makes the batches' copies 2 bytes wide (align_a = 2), though the first batch's rows are aligned."""
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    cp, torch, launches = fake16
    flat = h16(3 * 16 * 8 + 3)
    a = np.lib.stride_tricks.as_strided(flat, (3, 16, 8), (2 * (16 * 8 + 1), 16, 2)).view(FakeArray)
    b = h16(3, 8, 8, seed=1)
    c = asmgemm.gemm(a, b)
    assert last_launch()["params"]["ALIGN_A"] == "2"
    for i in range(3):
        close(c[i], ref(a[i], b[i]))


# K = 20: A's rows are 40 bytes, which TMA cannot step, so these calls run on the portable kernel the
# stand-in computes (a TMA-legal call runs on hgemm's grouped mode: tests/test_hgemm_grouped.py)
def _grouped_case(sizes, k=20, n=20, trans_b=False, seed=0):
    a = h16(sum(sizes), k, seed=seed)
    if trans_b:
        b = h16(len(sizes), n, k, seed=seed + 1).transpose(0, 2, 1).view(FakeArray)
    else:
        b = h16(len(sizes), k, n, seed=seed + 1)
    offs = np.cumsum(sizes).astype(np.int32).view(FakeArray)
    return a, b, offs


def _check_grouped(out, a, b, offs):
    start = 0
    for e, end in enumerate(np.asarray(offs).tolist()):
        close(out[start:end], ref(a[start:end], b[e]))
        start = end


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("trans_b", [False, True], ids=["b_ekn", "b_enk_transposed"])
def test_grouped_gemm_runs_one_launch_over_uneven_experts(fake16, trans_b):
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    cp, torch, launches = fake16
    sizes = [5, 0, 130, 1, 0, 7]                          # empty experts, one of more than a 128-row tile
    a, b, offs = _grouped_case(sizes, trans_b=trans_b)
    before = len(launches)
    out = asmgemm.grouped_gemm(a, b, offs)
    assert len(launches) == before + 1
    grid = launches[-1][0]
    tile_m = last_launch()["tile"][0]
    assert grid[1] == math.ceil(sum(sizes) / tile_m) + len(sizes) and grid[2] == 1
    assert last_launch()["kernel"] == "hgemm_mma" and last_launch()["params"]["GROUPED"] == "1"
    _check_grouped(out, a, b, offs)


@pytest.mark.toolchain
@needs_ptxas
def test_grouped_gemm_one_expert_holding_every_token_and_host_offsets(fake16):
    import asmgemm
    cp, torch, launches = fake16
    a, b, _ = _grouped_case([0, 0, 9, 0], k=12, n=8)
    out = np.full((9, 8), 3.0, np.float16).view(FakeArray)
    asmgemm.grouped_gemm(a, b, [0, 0, 9, 9], out, alpha=2.0, beta=0.5)
    close(out, 2.0 * ref(a, b[2]) + 1.5)
    with pytest.raises(AsmError, match="must not decrease"):
        asmgemm.grouped_gemm(a, b, [0, 5, 3, 9])
    with pytest.raises(AsmError, match="out overlaps A"):
        asmgemm.grouped_gemm(a, b, [0, 0, 9, 9], a[:, :8])


@pytest.mark.toolchain
@needs_ptxas
def test_grouped_gemm_list_form_runs_each_ragged_problem(fake16):
    import asmgemm
    cp, torch, launches = fake16
    a = [h16(3, 8), h16(11, 8, seed=1)[::2]]             # the second a strided view
    b = [h16(8, 5, seed=2), h16(8, 7, seed=3)]
    outs = asmgemm.grouped_gemm(a, b)
    for x, y, c in zip(a, b, outs):
        close(c, ref(x, y))
    with pytest.raises(AsmError, match="2 A matrices, 1 B matrices"):
        asmgemm.grouped_gemm(a, b[:1])


# ---- the cost model sees the whole launch --------------------------------------------------------------
def test_the_cost_model_counts_every_batchs_and_experts_tiles():
    """A batched launch's blocks are the batch's tiles (grid z), a grouped one's its tile rows plus
    one partial row per expert: a 128 x 128 matrix alone is one 128 x 128 tile, 512 of them fill the
    GPU, and the database's exact hits (2-D calls) do not stand for them."""
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime import dispatch
    spec = get_spec("hgemm_mma")

    def ranked(**launch):
        choice = dispatch.choose(spec, "nt", 128, 128, 64, gpu="NVIDIA H100 80GB HBM3", target="sm_90", sms=132,
                                 plain=False, **launch)
        return choice, {e.candidate.label: e for e in choice.ranked}
    _, one = ranked()
    many_choice, many = ranked(batch=512)
    _, grouped = ranked(extra_tile_rows=8)
    assert one and set(one) == set(many) == set(grouped)
    for label, e in one.items():
        bn = e.candidate.tile[1]
        assert many[label].tiles == 512 * e.tiles
        assert grouped[label].tiles == e.tiles + 8 * math.ceil(128 / bn)
        assert many[label].memory_s == pytest.approx(512 * e.memory_s)
    assert many_choice.chosen_by == "model"


def test_the_batched_sets_report_is_one_document_for_the_command_and_the_tool():
    """asm/bench/batched.report: the summary per mode and each row's ratios and times, what both
    `asmgemm bench --shapes moe --json` and tools/batched_bench.py write; a failed row is named."""
    from asmgemm.bench.batched import BatchedRow, report, summary_lines
    from asmgemm.bench.timing import TimingStats

    def stats(ms):
        return TimingStats(ms, ms, ms, ms, 1)
    fast = BatchedRow("moe a", 10, "torch._grouped_mm", rel_err=1e-3,
                      timings={"call": {"asmgemm": stats(1.0), "torch._grouped_mm": stats(2.0)}})
    failed = BatchedRow("moe b", 10, "torch._grouped_mm", error="AsmError: no")
    doc = report("moe", [fast, failed])
    assert doc["set"] == "moe" and doc["anchor"] == "torch._grouped_mm"
    assert doc["summary"]["call"]["geomean"] == pytest.approx(2.0) and doc["summary"]["call"]["failed"] == ["moe b"]
    assert doc["summary"]["gpu"] == {"mode": "gpu", "rows": 0}
    assert doc["rows"][0]["ratio"] == {"call": 2.0, "gpu": None, "loop": None}
    assert doc["rows"][0]["ms"] == {"call": {"asmgemm": 1.0, "torch._grouped_mm": 2.0}}
    assert doc["rows"][1]["error"] == "AsmError: no"
    assert summary_lines(doc) == ["call: geomean 2.000x torch._grouped_mm over 1 rows, lowest 2.000x (moe a), "
                                  "0 under 0.85x, 1 failed"]
