"""Runtime launch planning without a GPU: storage orders, leading dimensions, the operand swap for
column-major C, the 128-bit-load decision, the copy widths of the in-place kernels (copy_alignment),
parameter precedence, and the build cache key."""
from __future__ import annotations

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.launch import choose_params, default_params
from asmgemm.runtime.plan import Operand, call_values_for, copy_alignment, plan_launch, storage_of

SGEMM = get_spec("sgemm")


def ptr(x):
    return x.ctypes.data


def _plan(a, b, c, ta=False, tb=False):
    return plan_launch(a, b, c, trans_a=ta, trans_b=tb, ptr_of=ptr)




@pytest.mark.parametrize("order", ["C", "F"])
def test_storage_orders(order):
    x = np.zeros((6, 10), np.float32, order=order)
    rows, cols, ld, transposed = storage_of(x, "A")
    if order == "C":
        assert (rows, cols, ld, transposed) == (6, 10, 10, False)
    else:
        assert (rows, cols, ld, transposed) == (10, 6, 6, True)


def test_leading_dimension_of_a_view():
    big = np.zeros((20, 33), np.float32)
    assert storage_of(big[2:8, 3:13], "A") == (6, 10, 33, False)
    assert storage_of(big[2:8, 3:13].T, "A") == (6, 10, 33, True)


def test_unit_extents_accept_any_stride():
    big = np.zeros((20, 33), np.float32)
    assert storage_of(big[:, 4:5], "A")[:2] == (20, 1)
    # one row read every 3rd element: the transpose of an 11 x 1 matrix with leading dimension 3
    assert storage_of(big[3:4, ::3], "A") == (11, 1, 3, True)


def test_non_contiguous_last_dim_is_rejected_with_reason():
    x = np.zeros((8, 10), np.float32)[:, ::2]
    with pytest.raises(AsmError, match="last dimension is not contiguous"):
        storage_of(x, "B")


def test_not_two_dimensional():
    with pytest.raises(AsmError, match="2-D"):
        storage_of(np.zeros(5, np.float32), "A")


def test_shape_mismatch_messages():
    a, b = np.zeros((4, 5), np.float32), np.zeros((6, 3), np.float32)
    with pytest.raises(AsmError, match="inner dimensions"):
        _plan(a, b, np.zeros((4, 3), np.float32))
    with pytest.raises(AsmError, match="C has shape"):
        _plan(a, np.zeros((5, 3), np.float32), np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_row_major_c_keeps_operands(ta, tb):
    m, n, k = 12, 20, 8
    a = np.zeros((k, m) if ta else (m, k), np.float32)
    b = np.zeros((n, k) if tb else (k, n), np.float32)
    c = np.zeros((m, n), np.float32)
    p = _plan(a, b, c, ta, tb)
    assert (p.m, p.n, p.k, p.ldc, p.swapped) == (m, n, k, n, False)
    assert (p.a.ptr, p.b.ptr) == (ptr(a), ptr(b))
    assert p.call_values["trans_a"] == int(ta) and p.call_values["trans_b"] == int(tb)
    assert p.layout == ("t" if ta else "n") + ("t" if tb else "n")


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_column_major_c_swaps_operands(ta, tb):
    """C^T = op(B)^T op(A)^T: kernel A is the user's B with its flag flipped, M and N exchange."""
    m, n, k = 12, 20, 8
    a = np.zeros((k, m) if ta else (m, k), np.float32)
    b = np.zeros((n, k) if tb else (k, n), np.float32)
    c = np.zeros((m, n), np.float32, order="F")
    p = _plan(a, b, c, ta, tb)
    assert (p.m, p.n, p.k, p.ldc, p.swapped) == (n, m, k, m, True)
    assert (p.a.ptr, p.b.ptr) == (ptr(b), ptr(a))
    assert p.call_values["trans_a"] == int(not tb) and p.call_values["trans_b"] == int(not ta)


def _kernel_result(p, a_store, b_store):
    """op(A) op(B) as the kernel would form it from the plan's row-major storage."""
    A = a_store.T if p.a.trans else a_store
    B = b_store.T if p.b.trans else b_store
    return A @ B


@pytest.mark.parametrize("c_order", ["C", "F"])
@pytest.mark.parametrize("a_order", ["C", "F"])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_plan_computes_the_right_product(c_order, a_order, ta, tb):
    """Re-read each operand from memory the way the kernel would (row-major rows x cols with ld)
    and check that the planned product equals the user's product (transposed for column-major C)."""
    rng = np.random.default_rng(1)
    m, n, k = 5, 7, 3
    a = np.asarray(rng.standard_normal((k, m) if ta else (m, k)), np.float32, order=a_order)
    b = np.asarray(rng.standard_normal((n, k) if tb else (k, n)), np.float32)
    c = np.zeros((m, n), np.float32, order=c_order)
    p = _plan(a, b, c, ta, tb)
    stores = {ptr(a): a, ptr(b): b}

    def reread(op):
        base = stores[op.ptr]
        flat = np.ravel(base, order="K")
        return np.lib.stride_tricks.as_strided(flat, shape=(op.rows, op.cols), strides=(op.ld * 4, 4))

    got = _kernel_result(p, reread(p.a), reread(p.b))
    want = (a.T if ta else a) @ (b.T if tb else b)
    np.testing.assert_allclose(got.T if p.swapped else got, want, rtol=1e-5, atol=1e-5)


def test_vector_loads_need_alignment():
    big = np.zeros((64, 64), np.float32)
    assert big.ctypes.data % 16 == 0
    b = np.zeros((8, 16), np.float32)
    c = np.zeros((16, 16), np.float32)
    assert _plan(big[:16, :8], b, c).call_values["vec_a"] == 1          # ld 64, aligned start
    assert _plan(big[:16, 1:9], b, c).call_values["vec_a"] == 0         # start 4 bytes off
    odd = np.zeros((16, 9), np.float32)[:, :8]                       # ld 9
    assert _plan(odd, b, c).call_values["vec_a"] == 0
    # B along N needs N % 4 == 0 as well: a vector is entirely in or entirely out of the matrix
    assert _plan(big[:6, :8], np.zeros((8, 6), np.float32)[:, :6], np.zeros((6, 6), np.float32)).call_values["vec_b"] == 0


def test_choose_params_precedence():
    """params= over a tuning entry over the size rule over the source's defaults. sgemm has no size
    rules (its catalog's pick arrives as params): untuned, the source's defaults at any size;
    sgemm_skinny keeps its rule (MR from the rows)."""
    big = np.zeros((4096, 4096), np.float32)
    p_big = _plan(big, big, big)
    small = np.zeros((100, 100), np.float32)
    p_small = _plan(small, small, small)
    assert choose_params(SGEMM, p_big, None, None, 132)["THREADS"] == 256
    assert choose_params(SGEMM, p_small, None, None, 132)["THREADS"] == 256
    assert choose_params(SGEMM, p_small, {"THREADS": 64}, None, 132)["THREADS"] == 64
    assert choose_params(SGEMM, p_big, None, {"BK": 16}, 132)["BK"] == 16
    assert choose_params(SGEMM, p_big, {"BK": 8}, {"BK": 16}, 132)["BK"] == 8
    skinny = get_spec("sgemm_skinny")
    one = _plan(np.zeros((1, 64), np.float32), np.zeros((64, 256), np.float32), np.zeros((1, 256), np.float32))
    rows16 = _plan(np.zeros((16, 64), np.float32), np.zeros((64, 256), np.float32), np.zeros((16, 256), np.float32))
    assert choose_params(skinny, one, None, None, 132)["MR"] == 4                   # the size rule
    assert choose_params(skinny, rows16, None, None, 132)["MR"] == 16
    assert choose_params(skinny, one, None, {"MR": 8}, 132)["MR"] == 8              # a tuning entry over it
    assert choose_params(skinny, one, {"MR": 16}, {"MR": 8}, 132)["MR"] == 16       # params= over both
    # a caller can switch 128-bit loads off but never on where they would be misaligned
    odd = np.zeros((16, 9), np.float32)[:, :8]
    p_odd = _plan(odd, np.zeros((8, 16), np.float32), np.zeros((16, 16), np.float32))
    assert choose_params(SGEMM, p_odd, {"VEC_A": 1}, None, 132)["VEC_A"] == 0
    assert choose_params(SGEMM, p_big, {"VEC_B": 0}, None, 132)["VEC_B"] == 0
    assert choose_params(SGEMM, p_big, {"TRANS_A": 1}, None, 132)["TRANS_A"] == 0


@pytest.mark.parametrize("mnk", [(1024, 1024, 1024), (1, 4096, 4096), (4096, 4096, 4095), (128, 4096, 4096)])
def test_a_catalog_family_has_no_size_rule(mnk):
    """sgemm is dispatched by its catalog (tests/test_dispatch.py): its size rule is empty for any
    call, so nothing can run a retired rule's tiling behind the cost model's back."""
    assert SGEMM.configs and not SGEMM.size_rules
    assert SGEMM.size_rule(*mnk, 132) == {} == SGEMM.size_rule(*mnk, 132, {"ACT": 2, "BIAS": 1})


def test_default_params_are_the_tunables():
    d = default_params(SGEMM)
    assert {k: d[k] for k in ("THREADS", "BK", "RQ")} == {"THREADS": 256, "BK": 8, "RQ": 2}
    assert not set(d) & {"TRANS_A", "TRANS_B", "VEC_A", "VEC_B"}, "call-dependent parameters are not tunables"


def test_untuned_size_rule_is_the_runtimes_choice():
    """The size rule with the call values the runtime computes (what launch_config.untuned_defines
    falls back to where params= cannot name the untuned launch), for a kernel dispatched by rules
    (sgemm_skinny: MR = 4 to 4 rows, 16 past 8); a family with a catalog (sgemm, hgemm) has no rule to lay over
    the defaults, its cost model decides (runtime/dispatch.py)."""
    from asmgemm.runtime.launch import untuned_size_rule
    spec = get_spec("sgemm_skinny")
    assert untuned_size_rule(spec, 3, 4096, 4096, "nn", 132) == {"MR": 4}
    assert untuned_size_rule(spec, 12, 4096, 4096, "nn", 132) == {"MR": 16}
    a, b, c = np.zeros((12, 4096), np.float32), np.zeros((4096, 4096), np.float32), np.zeros((12, 4096), np.float32)
    plan = plan_launch(a, b, c, trans_a=False, trans_b=False, ptr_of=lambda x: 256)
    assert choose_params(spec, plan, None, None, 132)["MR"] == 16
    assert untuned_size_rule(SGEMM, 4096, 4096, 4096, "nn", 132) == {}
    assert untuned_size_rule(get_spec("hgemm"), 512, 3072, 768, "nn", 132) == {}


# ---- copy_alignment: the copy widths of the in-place kernels (call values align_a, align_b) ---------
def _op(ptr, rows, cols, ld, trans=False):
    return Operand(ptr, rows, cols, ld, trans)


@pytest.mark.parametrize("offset, want", [(0, 16), (16, 16), (8, 8), (24, 8), (4, 4), (12, 4), (2, 2), (6, 2)])
def test_copy_alignment_follows_the_base_address(offset, want):
    """A base address 256 + offset bytes with 16-byte rows: the widest of 16, 8, 4, 2 dividing it."""
    assert copy_alignment(_op(256 + offset, 64, 64, 64), 2) == want


@pytest.mark.parametrize("ld, want", [(4096, 16), (4088, 16), (4092, 8), (4094, 4), (4095, 2), (1001, 2), (1002, 4)])
def test_copy_alignment_follows_the_row_pitch(ld, want):
    """fp16 rows ld * 2 bytes apart: every row starts as aligned as the pitch allows."""
    assert copy_alignment(_op(256, 100, 64, ld), 2) == want
    assert copy_alignment(_op(256 + 8, 100, 64, ld), 2) == min(want, 8)     # and never more than the base


def test_copy_alignment_of_one_row_ignores_the_pitch():
    """A single row is never stepped over: its leading dimension does not matter."""
    assert copy_alignment(_op(256, 1, 4095, 4095), 2) == 16
    assert copy_alignment(_op(256 + 4, 1, 4095, 4097), 2) == 4
    assert copy_alignment(_op(256, 2, 4095, 4095), 2) == 2


@pytest.mark.parametrize("ptr, ld, want", [(256, 1024, 16), (256, 1002, 8), (256, 1001, 4), (260, 1024, 4),
                                           (264, 1024, 8), (256, 1, 4)])
def test_copy_alignment_of_fp32_operands_is_at_least_an_element(ptr, ld, want):
    """4-byte elements: 16, 8 or 4, never 2 (a copy is at least one element)."""
    assert copy_alignment(_op(ptr, 8, 1, ld), 4) == want


def test_plan_launch_reports_the_copy_alignments():
    """call_values align_a / align_b of the kernel's operands: views that start off a 16-byte
    boundary or have odd leading dimensions, transposed storage, and after the operand swap."""
    big = np.zeros((64, 72), np.float16)
    assert big.ctypes.data % 16 == 0
    b = np.zeros((16, 24), np.float16)
    c = np.zeros((8, 24), np.float16)
    v = _plan(big[:8, :16], b, c).call_values
    assert (v["align_a"], v["align_b"]) == (16, 16)                    # ld 72: 144-byte rows
    assert _plan(big[:8, 1:17], b, c).call_values["align_a"] == 2     # starts 2 bytes in
    assert _plan(big[:8, 4:20], b, c).call_values["align_a"] == 8
    odd = np.zeros((8, 17), np.float16)[:, :16]                        # 34-byte rows
    assert _plan(odd, b, c).call_values["align_a"] == 2
    assert _plan(big[:8, :16], np.zeros((16, 26), np.float16)[:, :24], c).call_values["align_b"] == 4
    # A stored transposed (column-major): its rows are the columns of the user's matrix
    at = np.asfortranarray(np.zeros((8, 16), np.float16))
    p = _plan(at, b, c)
    assert p.a.trans and p.a.ld == 8 and p.call_values["align_a"] == 16
    # column-major C swaps the operands: align_a is then the user's B's
    p = _plan(big[:8, :16], np.zeros((16, 25), np.float16)[:, :24], np.zeros((8, 24), np.float16, order="F"))
    assert p.swapped and (p.call_values["align_a"], p.call_values["align_b"]) == (2, 16)


def test_fresh_operands_copy_by_16_bytes_unless_their_rows_say_otherwise():
    """call_values_for (what `tune` builds): contiguous operands from 256-byte aligned allocations."""
    v = call_values_for(4096, 4096, 4096, "nn", 2)
    assert (v["align_a"], v["align_b"]) == (16, 16)
    v = call_values_for(1000, 1000, 1001, "nn", 2)                     # A's rows 2002 bytes
    assert (v["align_a"], v["align_b"]) == (2, 16)
    v = call_values_for(1000, 1001, 1000, "tn", 2)                     # B's rows 2002 bytes, A's 2000
    assert (v["align_a"], v["align_b"]) == (16, 2)
    v = call_values_for(1, 1001, 1001, "nn", 2)                        # A: one row
    assert (v["align_a"], v["align_b"]) == (16, 2)
    assert call_values_for(4096, 4096, 4095, "nn", 4)["align_a"] == 4
