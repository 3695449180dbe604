"""mma_gemm.sasm's own PTX run on the CPU by the interpreter of tests/ptx_sim.py, at tiny shapes:
the 2-D GEMM, the batched mode (BATCHED=1: grid z, per-operand batch strides, a shared operand)
and the grouped mode (GROUPED=1: each block's expert and tile row found from offs by the warp scan,
empty experts, an expert of fewer rows than a tile, one of several tiles, blocks past the last
tile row returning, offsets that decrease or overrun clamped, never read or written outside the
arrays). The kernel's cp.async copies, ldmatrix loads, mma.sync products, epilogue and guards all
run as the PTX says (ptx_sim's docstring says what it does not model), against float64 numpy.

The 64 x 64 tiling (four warps of 32 x 32) keeps each block small; the catalog's other tilings are
the same code with other constants (tests/test_mma_gemm_build.py builds them all).

The realigned paths' sweeps over layouts and REALIGN keep one case each in the default run (each
runs the interpreter over a few thousand threads: 2-4 s a case); `-m slow` runs the rest
(tests/sweeps.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asmgemm.pipeline import BuildOptions, build_file
from ptx_sim import Kernel, Memory, SimError, aligned_array as _aligned, matrix_at_end
from sweeps import sample_every

SMALL = dict(BM=64, BN=64, WM=32, WN=32)


def _kernel(**defines):
    result = build_file("mma_gemm", BuildOptions(defines={k: str(v) for k, v in {**SMALL, **defines}.items()},
                                                 target="sm_80"))
    p = result.constants
    return Kernel(result.ptx), int(p["THREADS"]), int(p["SMEM_BYTES"]), int(p["BM"]), int(p["BN"])


def _halves(*shape, seed=0):
    out = _aligned(shape, np.float16)
    out[...] = np.random.default_rng(seed).uniform(-1, 1, shape)
    return out


def _args(a, b, c, m, n, k, lda, ldb, ldc, mem, **extra):
    base = dict(A=mem.add(a), B=mem.add(b), C=mem.add(c), M=m, N=n, K=k, lda=lda, ldb=ldb, ldc=ldc, alpha=1.0,
                beta=0.0, bias=0, batch_stride_a=0, batch_stride_b=0, batch_stride_c=0, offs=0, groups=0, k_chunk=0,
                split_stride=0, workspace=0, tile_counters=0)
    base.update(extra)
    return base


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-2, atol=1e-2)


def test_a_plain_gemm_with_odd_edges():
    kern, threads, smem, bm, bn = _kernel(ALIGN_B=2)     # ldb = 9 halves: 2-byte copies of B
    m, n, k = 70, 9, 40                                  # two tile rows, K past one 32-wide tile
    a, b = _halves(m, k), _halves(k, n, seed=1)
    c = _aligned((m, n), np.float16, np.nan)
    mem = Memory()
    kern.run((math.ceil(n / bn), math.ceil(m / bm), 1), (threads, 1, 1), _args(a, b, c, m, n, k, k, n, n, mem), mem,
             smem)
    _close(c, a.astype(np.float64) @ b)


@pytest.mark.parametrize("trans", [(0, 0), (1, 1)], ids=["nn", "tt"])
def test_batched_mode_steps_each_operand_by_its_stride(trans):
    ta, tb = trans
    # (tt: A stored 16 x 20, rows of 40 bytes: 8-byte copies, as the runtime's align_a says)
    kern, threads, smem, bm, bn = _kernel(BATCHED=1, TRANS_A=ta, TRANS_B=tb, ALIGN_A=8 if ta else 16)
    batch, m, n, k = 3, 20, 24, 16
    a = _halves(batch, *((k, m) if ta else (m, k)))
    b = _halves(*((n, k) if tb else (k, n)), seed=1)     # shared: batch stride 0
    c = _aligned((batch, m, n + 8), np.float16, np.nan)   # rows padded: ldc = n + 8
    mem = Memory()
    args = _args(a, b, c, m, n, k, m if ta else k, k if tb else n, n + 8, mem, batch_stride_a=m * k,
                 batch_stride_c=m * (n + 8))
    kern.run((math.ceil(n / bn), math.ceil(m / bm), batch), (threads, 1, 1), args, mem, smem)
    for z in range(batch):
        op_a = a[z].T if ta else a[z]
        _close(c[z, :, :n], op_a.astype(np.float64) @ (b.T if tb else b))
    assert np.isnan(c[:, :, n:].astype(np.float32)).all()     # the padding untouched



@pytest.mark.parametrize("trans", [(0, 0), (1, 1)], ids=["nn", "tt"])
def test_split_k_partial_pass_writes_each_splits_fp32_sums(trans):
    """SPLIT_K=1: block z multiplies k in [z k_chunk, min(K, (z + 1) k_chunk)) into fp32 slice z of the
    workspace (ld = N); the last split is shorter (K is no multiple of the chunk); the slices add up
    to the product (splitk_reduce.sasm's job, here numpy's)."""
    ta, tb = trans
    kern, threads, smem, bm, bn = _kernel(SPLIT_K=1, TRANS_A=ta, TRANS_B=tb, ALIGN_A=8 if ta else 16)
    m, n, k, chunk = 20, 24, 160, 64                     # three splits: 64, 64, 32
    splits = math.ceil(k / chunk)
    a = _halves(*((k, m) if ta else (m, k)))
    b = _halves(*((n, k) if tb else (k, n)), seed=1)
    ws = _aligned((splits, m, n), np.float32, np.nan)
    mem = Memory()
    args = _args(a, b, ws, m, n, k, m if ta else k, k if tb else n, n, mem, k_chunk=chunk, split_stride=m * n)
    kern.run((math.ceil(n / bn), math.ceil(m / bm), splits), (threads, 1, 1), args, mem, smem)
    op_a = (a.T if ta else a).astype(np.float64)
    op_b = (b.T if tb else b).astype(np.float64)
    for s in range(splits):
        lo, hi = s * chunk, min(k, (s + 1) * chunk)
        np.testing.assert_allclose(ws[s], op_a[:, lo:hi] @ op_b[lo:hi], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ws.astype(np.float64).sum(axis=0), op_a @ op_b, rtol=1e-5, atol=1e-5)



def _check_experts(a, b, c, ends, trans_b=False):
    """Each expert's rows of C (rows ends[e - 1] .. ends[e]) against its rows of A times its B."""
    start = 0
    for e, end in enumerate(ends):
        _close(c[start:end], a[start:end].astype(np.float64) @ (b[e].T if trans_b else b[e]))
        start = end

def _grouped(ends, total, k=16, n=24, trans_b=False, defines=None):
    kern, threads, smem, bm, bn = _kernel(GROUPED=1, TRANS_B=int(trans_b), **(defines or {}))
    experts = len(ends)
    a = _halves(total, k)
    b = _halves(experts, *((n, k) if trans_b else (k, n)), seed=1)
    c = _aligned((total, n), np.float16, np.nan)
    offs = np.asarray(ends, np.int32)
    mem = Memory()
    args = _args(a, b, c, total, n, k, k, k if trans_b else n, n, mem, batch_stride_b=k * n, offs=mem.add(offs),
                 groups=experts)
    grid = (math.ceil(n / bn), math.ceil(total / bm) + experts, 1)
    kern.run(grid, (threads, 1, 1), args, mem, smem)
    return a, b, c


@pytest.mark.parametrize("trans_b", [False, True], ids=["b_kn", "b_nk"])
def test_grouped_mode_finds_each_blocks_expert_from_the_offsets(trans_b):
    sizes = [3, 0, 70, 1, 0, 5]                          # empty experts; one of two tile rows
    ends = np.cumsum(sizes).tolist()
    a, b, c = _grouped(ends, sum(sizes), trans_b=trans_b)
    _check_experts(a, b, c, ends, trans_b)


def test_grouped_mode_past_32_experts():
    """More experts than a warp has lanes: the scan walks them 32 at a time (its chunk loop)."""
    sizes = [0] * 30 + [2, 0, 1, 66, 0, 0, 3, 0, 0, 1]  # 40 experts: the block of 66 rows is in the second chunk
    ends = np.cumsum(sizes).tolist()
    a, b, c = _grouped(ends, sum(sizes), k=8, n=8)
    _check_experts(a, b, c, ends)


def test_grouped_mode_rows_past_the_last_offset_are_not_written():
    a, b, c = _grouped([0, 5, 5], 9)                     # rows 5..8 belong to no expert
    _close(c[:5], a[:5].astype(np.float64) @ b[1])
    assert np.isnan(c[5:].astype(np.float32)).all()


def test_grouped_mode_clamps_bad_offsets_inside_the_arrays():
    """offs the host never reads: a decrease is an empty expert, an overrun stops at M; nothing is
    read or written outside A, B and C (the interpreter would raise SimError)."""
    a, b, c = _grouped([6, 2, 40], 10)        # expert 1 ends below its start: empty; expert 2 overruns
    # expert 0: rows 0 .. 6; expert 2: rows offs[1] = 2 .. min(40, M) = 10 (rows 2 .. 5 are both's)
    _close(c[:2], a[:2].astype(np.float64) @ b[0])
    _close(c[6:10], a[6:10].astype(np.float64) @ b[2])


def test_the_interpreter_catches_an_access_outside_the_arrays():
    """The check above can fail: a B too short for its expert stride is read out of bounds."""
    kern, threads, smem, bm, bn = _kernel(GROUPED=1)
    a, b, c = _halves(4, 16), _halves(1, 16, 24), np.zeros((4, 24), np.float16)
    offs = np.asarray([0, 4], np.int32)
    mem = Memory()
    args = _args(a, b, c, 4, 24, 16, 16, 24, 24, mem, batch_stride_b=16 * 24, offs=mem.add(offs), groups=2)
    with pytest.raises(SimError, match="outside every array"):
        kern.run((1, 3, 1), (threads, 1, 1), args, mem, smem)


def _bf16(*shape, seed=0):
    """bf16 bit patterns (uint16) of uniform(-1, 1) values, and the values they hold (float64)."""
    x = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    bits = _aligned(shape, np.uint16)
    bits[...] = (x.view(np.uint32) >> 16).astype(np.uint16)          # truncated: exact values below
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("realign", sample_every(2, [1, 2]))
def test_grouped_mode_with_an_mn_major_a_bf16_fp32_c_and_the_epilogue(realign):
    """A stored K x tokens (TRANS_A = 1: each expert starts at a column, copies 2 bytes wide, as the
    runtime sets align_a; realigned in registers or through the cp.async ring), bf16, an fp32 C in
    16-byte pieces (WIDE_C) with a bias per column, relu, alpha and beta."""
    kern, threads, smem, bm, bn = _kernel(GROUPED=1, TRANS_A=1, ALIGN_A=2, BF16=1, C_F32=1, WIDE_C=1, BIAS=1, ACT=1,
                                          REALIGN=realign)
    sizes, k, n = [9, 0, 66, 2], 24, 16
    total = sum(sizes)
    a_bits, a = _bf16(k, total)
    b_bits, b = _bf16(len(sizes), k, n, seed=1)
    bias = _aligned((n,), np.float32)
    bias[...] = np.linspace(-0.5, 0.5, n)
    c = _aligned((total, n), np.float32, 1.0)
    offs = np.cumsum(sizes).astype(np.int32)
    mem = Memory()
    args = _args(a_bits, b_bits, c, total, n, k, total, n, n, mem, alpha=0.5, beta=2.0, bias=mem.add(bias),
                 batch_stride_b=k * n, offs=mem.add(offs), groups=len(sizes))
    kern.run((math.ceil(n / bn), math.ceil(total / bm) + len(sizes), 1), (threads, 1, 1), args, mem, smem)
    start = 0
    for e, end in enumerate(offs.tolist()):
        want = np.maximum(0.5 * (a[:, start:end].T @ b[e]) + 2.0 + bias, 0.0)
        np.testing.assert_allclose(c[start:end], want, rtol=1e-4, atol=1e-4)
        start = end


def test_grouped_mode_deep_k_runs_the_interior_loop_on_the_experts_rows():
    """K of 5 tiles (more than STAGES): the main loop proper runs, unguarded (k_loop_whole) in a block
    whose tile lies inside its expert's rows, guarded in the expert's partial tile row: the interior
    test reads the expert's rows, not all of A's."""
    sizes = [64, 10, 70]                                 # a whole tile row; a partial one; one of each
    ends = np.cumsum(sizes).tolist()
    a, b, c = _grouped(ends, sum(sizes), k=160, n=64)
    _check_experts(a, b, c, ends)


# ---- ALIGN = 2 (odd leading dimensions): the realigned 16-byte path (REALIGN = 1) ------------------

def _stored_operand(rows, cols, ld, keep, lead=0, seed=0):
    """An fp16 matrix at the end of its buffer (ptx_sim.matrix_at_end): the buffer and its values."""
    return matrix_at_end(rows, cols, ld, np.float16, keep, lead, seed)


def _odd_call(layout, m, n, k, extra_a, extra_b, realign, lead_a=0, lead_b=0, defines=None):
    """C = op(A) op(B) with A's and B's leading dimensions their stored rows' lengths + extra (odd:
    the runtime's align 2), each matrix at the end of its buffer; C (fp32) and numpy's product."""
    ta, tb = layout[0] == "t", layout[1] == "t"
    kern, threads, smem, bm, bn = _kernel(TRANS_A=int(ta), TRANS_B=int(tb), ALIGN_A=2, ALIGN_B=2, C_F32=1,
                                          REALIGN=realign, **(defines or {}))
    keep = []
    ra, ca = (k, m) if ta else (m, k)
    rb, cb = (n, k) if tb else (k, n)
    lda, ldb = ca + extra_a, cb + extra_b
    a_buf, a = _stored_operand(ra, ca, lda, keep, lead_a)
    b_buf, b = _stored_operand(rb, cb, ldb, keep, lead_b, seed=1)
    c = _aligned((m, n), np.float32, np.nan)
    mem = Memory()
    mem.add(a_buf)
    mem.add(b_buf)
    args = _args(a_buf[lead_a:], b_buf[lead_b:], c, m, n, k, lda, ldb, n, mem)
    kern.run((math.ceil(n / bn), math.ceil(m / bm), 1), (threads, 1, 1), args, mem, smem)
    want = (a.T if ta else a) @ (b.T if tb else b)
    return c, want


@pytest.mark.parametrize("layout", sample_every(4, ["nn", "nt", "tn", "tt"]))
def test_odd_leading_dimensions_realigned_match_the_2_byte_path_bit_for_bit(layout):
    """ALIGN 2, both operands: lda, ldb odd (rows start at every even offset mod 16 over 8 rows), K
    = 45 (the K edge inside a chunk: tile 1 has 13 elements), M = 70 and N = 67 (edge tiles, rows
    past M/N), each matrix ending at its buffer's end mid-granule (a read past its last element
    fails). REALIGN = 1 gives the staged path's bits (the same products in the same order) and
    numpy's values."""
    m, n, k = 70, 67, 45
    got, want = _odd_call(layout, m, n, k, 2, 4, realign=1)   # extra 2 and 4 on odd rows: odd lds
    ref, _ = _odd_call(layout, m, n, k, 2, 4, realign=0)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("layout", sample_every(4, ["nn", "nt", "tn", "tt"]))
def test_odd_rows_through_the_cp_async_ring_match_bit_for_bit(layout):
    """REALIGN = 2: the granules copied into the raw ring by cp.async (src-size: nothing past the
    matrix's last byte), realigned in shared memory; the same bits as the 2-byte path, each matrix
    at the end of its buffer."""
    m, n, k = 70, 67, 45
    got, want = _odd_call(layout, m, n, k, 2, 4, realign=2)
    ref, _ = _odd_call(layout, m, n, k, 2, 4, realign=0)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("layout", sample_every(2, ["nn", "tt"]))
@pytest.mark.parametrize("realign", sample_every(2, [1, 2]))
def test_realigned_whole_tiles_of_an_interior_block_and_an_unaligned_start(layout, realign):
    """K = 203 (7 tiles: the interior blocks' unguarded loop runs, then the guarded last two),
    M = N = 128 (whole tiles) plus an edge, and each operand starting 1 and 3 elements into its
    buffer (the first granule begins before the matrix, inside its allocation)."""
    m, n, k = 129, 128, 203
    got, want = _odd_call(layout, m, n, k, 2, 2, realign=realign, lead_a=1, lead_b=3)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("layout", sample_every(2, ["nt", "tn"]))
def test_realigned_on_the_catalogs_narrow_tiling(layout):
    """The tiling the catalog runs odd operands with (128 x 128, eight warps of 64 x 32: 256
    threads, chunk rows 64 (K-major) or 16 (MN-major) apart), an odd K and both edges."""
    m, n, k = 131, 133, 37
    got, want = _odd_call(layout, m, n, k, 2, 2, realign=1, defines=dict(BM=128, BN=128, WM=64, WN=32))
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("layout", sample_every(2, ["nn", "tt"]))
@pytest.mark.parametrize("realign", sample_every(2, [1, 2]))
def test_realigned_split_k_partial_pass(layout, realign):
    """SPLIT_K = 1 moves A and B by k0 = s k_chunk (a multiple of 64 elements: each chunk row's
    granule offset stays); each split's fp32 sums from odd-strided operands at the ends of their
    buffers, the last split short (K = 150: 64, 64, 22)."""
    ta, tb = layout[0] == "t", layout[1] == "t"
    kern, threads, smem, bm, bn = _kernel(SPLIT_K=1, TRANS_A=int(ta), TRANS_B=int(tb), ALIGN_A=2, ALIGN_B=2,
                                          REALIGN=realign)
    m, n, k, chunk = 21, 19, 150, 64
    splits = math.ceil(k / chunk)
    keep = []
    ra, ca = (k, m) if ta else (m, k)
    rb, cb = (n, k) if tb else (k, n)
    lda, ldb = ca + 1 + ca % 2, cb + 1 + cb % 2                # odd
    a_buf, a = _stored_operand(ra, ca, lda, keep)
    b_buf, b = _stored_operand(rb, cb, ldb, keep, seed=1)
    ws = _aligned((splits, m, n), np.float32, np.nan)
    mem = Memory()
    args = _args(a_buf, b_buf, ws, m, n, k, lda, ldb, n, mem, k_chunk=chunk, split_stride=m * n)
    kern.run((math.ceil(n / bn), math.ceil(m / bm), splits), (threads, 1, 1), args, mem, smem)
    op_a, op_b = (a.T if ta else a), (b.T if tb else b)
    for z in range(splits):
        lo, hi = z * chunk, min(k, (z + 1) * chunk)
        np.testing.assert_allclose(ws[z], op_a[:, lo:hi] @ op_b[lo:hi], rtol=1e-5, atol=1e-5)


def test_array_at_end_catches_a_read_one_past_the_matrix():
    """The check above can fail: the staged path reading one element past B's last (a K one too
    large for the stored matrix) is an access outside every array."""
    kern, threads, smem, bm, bn = _kernel(ALIGN_A=2, ALIGN_B=2, REALIGN=0, C_F32=1)
    keep = []
    m, n, k = 8, 9, 7
    a_buf, _ = _stored_operand(m, k, k + 2, keep)
    b_buf, _ = _stored_operand(k - 1, n, n + 2, keep)          # one K-row short
    c = _aligned((m, n), np.float32)
    mem = Memory()
    args = _args(a_buf, b_buf, c, m, n, k, k + 2, n + 2, n, mem)
    with pytest.raises(SimError, match="outside every array"):
        kern.run((1, 1, 1), (threads, 1, 1), args, mem, smem)


def test_the_interpreters_prmt_selects_and_sign_replicates_bytes():
    """prmt.b32's default mode on b:a = 0x8877665544332211: selectors 0x5432 (a 2-byte funnel
    shift), 0x3210 (a), 0x7654 (b), 0x5410 (the low halves joined) and 0x321F (bit 3 of nibble 0: byte 7 0x88 replaced by its sign, 0xff)."""
    ptx = """.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 param_out)
{
    .reg .b32 %a, %b, %d0, %d1, %d2, %d3, %d4;
    .reg .u64 %p;
    ld.param.u64 %p, [param_out];
    mov.b32 %a, 0x44332211;
    mov.b32 %b, 0x88776655;
    prmt.b32 %d0, %a, %b, 0x5432;
    prmt.b32 %d1, %a, %b, 0x3210;
    prmt.b32 %d2, %a, %b, 0x7654;
    prmt.b32 %d3, %a, %b, 0x5410;
    prmt.b32 %d4, %a, %b, 0x321F;
    st.global.v4.b32 [%p], {%d0, %d1, %d2, %d3};
    st.global.b32 [%p+16], %d4;
    ret;
}
"""
    out = np.zeros(5, np.uint32)
    mem = Memory()
    Kernel(ptx).run((1, 1, 1), (1, 1, 1), dict(out=mem.add(out)), mem, 0)
    assert [hex(v) for v in out] == ["0x66554433", "0x44332211", "0x88776655", "0x66552211", "0x443322ff"]


# ---- the copies at the end of the matrix --------------------------------------------------------

@pytest.mark.parametrize("layout,align_a,align_b", [("nn", 16, 8), ("tt", 4, 16), ("nt", 8, 4), ("tn", 4, 8)])
@pytest.mark.parametrize("k", [65, 41, 9], ids=["k65-main-loop", "k41-prologue-second", "k9-one-tile"])
def test_a_chunk_cut_by_the_matrix_end_is_not_read_past_it(layout, align_a, align_b, k):
    """An odd K (a K-major row ends inside a chunk) and M, N not multiples of 8 (an MN-major row
    too), leading dimensions padded up to the copy width, each matrix ending at the last byte of its
    buffer: the chunk of the stored matrix's last row that the row's end cuts would read past the
    matrix by cp.async (a src-size below the copy's size still reads the whole copy: ptx_sim models
    it so, as compute-sanitizer reports it on the H200), so the last K tile's copies load it 2 bytes
    at a time (COPY_TILE's `last`, TAIL_CHUNK): the last tile copied by k_last (K = 65: 3 tiles after
    the prologue's), by the prologue's second copy (K = 41) or its first (K = 9)."""
    ta, tb = layout[0] == "t", layout[1] == "t"
    m, n = 70, 66
    kern, threads, smem, bm, bn = _kernel(TRANS_A=int(ta), TRANS_B=int(tb), ALIGN_A=align_a, ALIGN_B=align_b,
                                          C_F32=1)
    keep = []
    ra, ca = (k, m) if ta else (m, k)
    rb, cb = (n, k) if tb else (k, n)
    lda, ldb = -(-ca // (align_a // 2)) * (align_a // 2), -(-cb // (align_b // 2)) * (align_b // 2)
    a_buf, a = _stored_operand(ra, ca, lda, keep)
    b_buf, b = _stored_operand(rb, cb, ldb, keep, seed=1)
    c = _aligned((m, n), np.float32, np.nan)
    mem = Memory()
    mem.add(a_buf)
    mem.add(b_buf)
    kern.run((math.ceil(n / bn), math.ceil(m / bm), 1), (threads, 1, 1),
             _args(a_buf, b_buf, c, m, n, k, lda, ldb, n, mem), mem, smem)
    _close(c, (a.T if ta else a) @ (b.T if tb else b))
