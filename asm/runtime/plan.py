"""From user arrays to one kernel launch: shapes, storage orders, leading dimensions, the operand
swap for column-major C, and the values of the call-derived -D parameters (transposes, 128-bit
loads) that a kernel spec's `call_params` maps onto its own parameter names.

Pure Python on anything with `.shape`, `.strides`, `.dtype.itemsize` and a data pointer, so it is
tested without a GPU. Every spec'd kernel computes (kernels_ptx/kernels.toml, "launch contract"),
for row-major storage,

    C[M x N, ldc] = alpha * op(A) * op(B) + beta * C,
    A stored M x K (lda) or K x M when TRANS_A=1, B stored K x N (ldb) or N x K when TRANS_B=1.

Any 2-D operand whose last dimension is contiguous is a row-major matrix with ld = stride[0]; one
whose first dimension is contiguous (a Fortran-order array, a `.T` view) is the transpose of a
row-major matrix, so it flips its operand's TRANS flag. Column-major C uses C^T = op(B)^T op(A)^T
(CUTLASS's swap): the kernel then runs on (B, A) with M and N exchanged. A row-major C may take the
same swap when the kernel stores its result transposed (c_trans=True: the call value c_trans, for a
spec's [[NAME.swap_rule]]; the kernel's (i, j) lands at C + j * ldc + i).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import AsmError
from ..kernel_spec import ACTIVATIONS, BIAS_MODES
from .arrays import FRESH_ALLOCATION, Dtype, Matrix, ptr_of, row_major_strides
from .tensor_map import addressable

U32_LIMIT = (1 << 31) - 1          # the kernel takes sizes and leading dimensions as 32-bit
VECTOR_BYTES = 16                  # one 128-bit global load (ld.global.v4.f32, .v2.f64, .v8 halves as .v4.b32)
# The deepest K whose misaligned K-major A (rows TMA cannot address) a kernel mapping the call
# value a_ldg reads by its own loads: one 64-wide K tile of the Hopper kernels, loaded once per
# tile; deeper, a padded copy (one pass over A) read by TMA costs less than such loads per K tile.
LDG_A_MAX_K = 64
# the activation code of gelu_tanh (kernel_spec.ACTIVATIONS, codes from 1)
GELU_TANH = ACTIVATIONS.index("gelu_tanh") + 1


@dataclass(frozen=True)
class Operand:
    """A matrix as the kernel sees it: row-major storage `rows x cols` with leading dimension ld."""

    ptr: int
    rows: int
    cols: int
    ld: int
    trans: bool        # op(X) = stored^T


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one launch needs besides the compiled kernel."""

    a: Operand         # the kernel's A (the user's B after a swap)
    b: Operand
    c_ptr: int
    m: int
    n: int
    k: int
    ldc: int
    swapped: bool      # column-major C, or c_trans: kernel A/B are the user's B/A
    itemsize: int
    call_values: dict  # trans_a, trans_b, vec_a, vec_b, ..., bias, activation (kernel_spec.CALL_VALUES)
    bias_ptr: int = 0  # the fused epilogue's bias vector (0: none)
    batch: int = 1     # matrices in the batch (grid z of a batched kernel)
    batch_strides: tuple = (0, 0, 0)   # elements between batches of kernel A, kernel B, C (0: shared)
    groups: int = 0    # grouped problems along M (asmgemm.grouped_gemm; 0: not a grouped launch)

    @property
    def layout(self) -> str:
        """'nn', 'nt', 'tn' or 'tt' of the launch (after the swap), as the tuning cache keys it."""
        return ("t" if self.a.trans else "n") + ("t" if self.b.trans else "n")

    @property
    def c_trans(self) -> bool:
        """The kernel stores its M x N result transposed (into a row-major N x M C)."""
        return bool(self.call_values.get("c_trans"))


def _elem_strides(arr, name: str) -> tuple[int, int]:
    item = arr.dtype.itemsize
    s0, s1 = arr.strides
    if s0 % item or s1 % item:
        raise AsmError(f"{name}: strides {arr.strides} are not whole elements of {item} bytes")
    return s0 // item, s1 // item


def storage_of(arr, name: str) -> tuple[int, int, int, bool]:
    """(rows, cols, ld, transposed) of the row-major matrix that holds `arr`.

    transposed=True: arr is the transpose of that matrix (arr is column-major)."""
    if arr.ndim != 2:
        raise AsmError(f"{name} must be a 2-D matrix, got {arr.ndim} dimension(s) (shape {tuple(arr.shape)})")
    r, c = (int(x) for x in arr.shape)
    s0, s1 = _elem_strides(arr, name)
    if r == 0 or c == 0:
        # no element is read, so no stride matters (numpy and CuPy give an empty slice strides of 0,
        # which the tests below would refuse as overlapping rows); torch.matmul takes such operands
        return r, c, max(c, 1), False
    # A dimension of extent 1 is never stepped over, so its stride does not matter.
    row_major = (s1 == 1 or c == 1) and (r == 1 or s0 >= max(c, 1))
    if row_major:
        return r, c, (s0 if r > 1 else max(c, 1)), False
    col_major = (s0 == 1 or r == 1) and (c == 1 or s1 >= max(r, 1))
    if col_major:
        return c, r, (s1 if c > 1 else max(r, 1)), True
    if s1 != 1 and s0 != 1:
        why = "its last dimension is not contiguous (stride %d elements, and the first is %d)" % (s1, s0)
    else:
        why = "its rows overlap (leading dimension smaller than the row)"
    raise AsmError(f"{name}: shape {tuple(arr.shape)} with strides {tuple(arr.strides)} bytes is not supported: {why}",
                   hint="the kernel reads row-major (or column-major) matrices with a leading dimension; "
                        "pass cupy.ascontiguousarray(x)")


def _check_u32(what: str, value: int):
    if value > U32_LIMIT:
        raise AsmError(f"{what} = {value} exceeds the kernel's 32-bit limit ({U32_LIMIT})")


def _aligned(ptr: int, ld: int, elems: int) -> bool:
    return ptr % VECTOR_BYTES == 0 and ld % elems == 0


def bias_layout(bias, m: int, n: int, c_dtype: str, ptr_of) -> int:
    """How the fused epilogue's bias vector lines up with the user's M x N C: BIAS_MODES["column"]
    (shape (N,) or (1, N): one value per column, broadcast over the rows, as torch.nn.Linear) or
    BIAS_MODES["row"] (shape (M, 1): one per row). Its elements must be contiguous and of C's dtype."""
    shape = tuple(int(x) for x in bias.shape)
    dtype = getattr(bias.dtype, "name", str(bias.dtype))
    item = int(bias.dtype.itemsize)
    if dtype != c_dtype:
        raise AsmError(f"bias has dtype {dtype}; the epilogue adds it in C's dtype {c_dtype}",
                       hint=f"pass bias.astype('{c_dtype}') (torch: bias.to(C's dtype))")
    if shape in ((n,), (1, n)):
        mode, count, step = BIAS_MODES["column"], n, bias.strides[-1]
    elif shape == (m, 1):
        mode, count, step = BIAS_MODES["row"], m, bias.strides[0]
    else:
        raise AsmError(f"bias has shape {shape}; C is {m} x {n}, so bias must be ({n},) or (1, {n}) (one value "
                       f"per column) or ({m}, 1) (one value per row)",
                       hint="reshape it, e.g. bias.reshape(1, -1) for columns or bias.reshape(-1, 1) for rows")
    if count > 1 and step != item:
        raise AsmError(f"bias: its {count} values are not contiguous (stride {step} bytes, elements of {item})",
                       hint="pass a contiguous copy (cupy.ascontiguousarray(bias), or bias.contiguous())")
    if ptr_of(bias) % item:
        raise AsmError(f"bias: address 0x{ptr_of(bias):x} is not aligned to its {item}-byte elements",
                       hint="pass a fresh copy (allocators align every array)")
    return mode


def transposed_bias_mode(mode: int) -> int:
    """The bias call value of the swapped launch (C^T): the user's columns are the kernel's rows
    and the other way round; no bias stays none."""
    turned = {BIAS_MODES["column"]: BIAS_MODES["row"], BIAS_MODES["row"]: BIAS_MODES["column"]}
    return turned.get(mode, mode)


def plan_launch(a, b, c, *, trans_a: bool, trans_b: bool, ptr_of=lambda x: x.data.ptr, bias=None,
                activation: int = 0, batch: int = 1, batch_strides: tuple = (0, 0, 0),
                c_trans: bool = False) -> LaunchPlan:
    """Validate shapes and strides and build the launch. `c` must already exist (M x N).
    c_trans: a row-major C through the operand swap, the kernel storing transposed (ignored for a
    column-major C, which takes the swap anyway, and for a batch).
    bias (optional): the fused epilogue's vector (bias_layout); activation: kernel_spec's code
    (0 none). Both become call values, bias's after the operand swap.
    batch > 1: a batched kernel's launch; a, b, c are the first batch's matrices and batch_strides
    the elements between the user's A, B and C batches (0: shared), swapped with the operands."""
    ra, ca, lda, ta = storage_of(a, "A")
    rb, cb, ldb, tb = storage_of(b, "B")
    eff_ta = bool(trans_a) != ta
    eff_tb = bool(trans_b) != tb
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    k2, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    if k != k2:
        raise AsmError(f"inner dimensions differ: op(A) is {m} x {k}, op(B) is {k2} x {n} "
                       f"(A {tuple(a.shape)}{'^T' if trans_a else ''}, B {tuple(b.shape)}{'^T' if trans_b else ''})")
    if tuple(c.shape) != (m, n):
        raise AsmError(f"C has shape {tuple(c.shape)}, expected ({m}, {n}) = op(A) x op(B)")
    rc, cc, ldc, tc = storage_of(c, "C")
    c_trans = bool(c_trans) and not tc and batch == 1
    swap = tc or c_trans
    bias_mode = bias_layout(bias, m, n, getattr(c.dtype, "name", str(c.dtype)), ptr_of) if bias is not None else 0
    if swap:
        bias_mode = transposed_bias_mode(bias_mode)
    sa, sb, sc = (int(x) for x in batch_strides)
    if swap:
        sa, sb = sb, sa
    A = Operand(ptr_of(a), ra, ca, lda, eff_ta)
    B = Operand(ptr_of(b), rb, cb, ldb, eff_tb)
    if swap:
        # C^T (N x M, row-major, ldc) = op(B)^T op(A)^T: kernel A := user B with the flag flipped.
        A, B = Operand(B.ptr, B.rows, B.cols, B.ld, not B.trans), Operand(A.ptr, A.rows, A.cols, A.ld, not A.trans)
        m, n = n, m
    for what, v in (("M", m), ("N", n), ("K", k), ("lda", A.ld), ("ldb", B.ld), ("ldc", ldc)):
        _check_u32(what, v)
    itemsize = int(c.dtype.itemsize)
    # ldc * itemsize and row offsets are formed in 32 bits inside the epilogue's row stepping.
    if ldc * itemsize > 0xFFFFFFFF:
        raise AsmError(f"ldc = {ldc} is too large for the kernel (ldc * {itemsize} bytes must fit 32 bits)")
    ab_elems = max(1, VECTOR_BYTES // int(a.dtype.itemsize))     # A and B may be narrower than C
    # (every batch's matrix must be aligned as the first one is: a batch stride counts as a pitch)
    piece = c_piece(n, ldc, ptr_of(c), sc, itemsize) if not c_trans else itemsize
    wide_c = int(piece == VECTOR_BYTES)
    values = {
        "trans_a": int(A.trans),
        "trans_b": int(B.trans),
        # A is K-contiguous unless transposed; B is K-contiguous only when transposed.
        "vec_a": int(_aligned(A.ptr, A.ld, ab_elems) and (not A.trans or m % ab_elems == 0) and sa % ab_elems == 0),
        "vec_b": int(_aligned(B.ptr, B.ld, ab_elems) and (B.trans or n % ab_elems == 0) and sb % ab_elems == 0),
        # C written in pairs of elements (one 2-element store): every row of C whole aligned pairs,
        # i.e. pieces of at least two elements (an even N and ldc, a pair-aligned base and batch
        # stride). (c_trans: a pair's two elements lie in two rows of C, so no piece applies)
        "vec_c": int(piece >= 2 * itemsize),
        # C written in 16-byte pieces: every row of C a whole number of them, all aligned
        "wide_c": wide_c,
        # ... or in the widest pieces (8 or 4 bytes) that still divide every row of C
        "c_piece": piece,
        "bias": bias_mode,
        "activation": int(activation),
        "batched": int(batch > 1),
        "grouped": 0,         # (grouped.py plans a grouped launch on this plan)
        "c_trans": int(c_trans),
        "a_ldg": int(not A.trans and not addressable(A.ptr, A.rows, A.ld, int(a.dtype.itemsize)) and k <= LDG_A_MAX_K),
        "align_a": copy_alignment(A, int(a.dtype.itemsize), sa),
        "align_b": copy_alignment(B, int(b.dtype.itemsize), sb),
        # C's rows in 16-byte pieces after all, each staged row shifted to C's 16-byte boundaries
        # (hgemm SHIFTED_C): a 16-bit, unswapped C whose rows are not whole pieces; not under
        # gelu_tanh, whose temporaries spilled beside it (hgemm/guards.inc)
        "shifted_c": shifted_c(itemsize, c_trans, wide_c, activation) if ptr_of(c) % 2 == 0 else 0,
    }
    return LaunchPlan(A, B, ptr_of(c), m, n, k, ldc, swap, itemsize, values,
                      ptr_of(bias) if bias is not None else 0, int(batch), (sa, sb, sc))


def c_piece(n: int, ldc: int, ptr: int, batch_stride: int, itemsize: int) -> int:
    """The call value c_piece: the widest aligned piece, 16, 8 or 4 bytes, that every row of an
    n-column C of pitch ldc at ptr (and every batch's C, batch_stride elements on) is a whole number
    of; the element size where none is wider than one element."""
    for piece in (VECTOR_BYTES, 8, 4):
        if piece > itemsize and not (n * itemsize % piece or ldc * itemsize % piece or ptr % piece
                                     or batch_stride * itemsize % piece):
            return piece
    return itemsize


def shifted_c(c_itemsize: int, c_trans: bool, wide_c: int, activation: int) -> int:
    """The call value shifted_c: a 16-bit, unswapped C whose rows are not whole 16-byte pieces, staged
    with each row shifted to C's 16-byte boundaries (hgemm SHIFTED_C); not under gelu_tanh, whose
    temporaries spilled beside it (hgemm/guards.inc)."""
    return int(c_itemsize == 2 and not c_trans and not wide_c and activation != GELU_TANH)


def copy_alignment(op: Operand, itemsize: int, batch_stride: int = 0) -> int:
    """The widest copy, 16, 8, 4 or 2 bytes (at least one element), that every row of `op` can be
    read by from a multiple of that many bytes into the row: the largest that divides the base
    address, for more than one row the row pitch, and the elements between batches (call values
    align_a, align_b; a grouped launch's problems start at rows only its device knows)."""
    pitch = op.ld * itemsize if op.rows > 1 else 0
    step = batch_stride * itemsize
    for width in (16, 8, 4, 2):
        if width >= itemsize and op.ptr % width == 0 and pitch % width == 0 and step % width == 0:
            return width
    return itemsize


def call_values_for(m: int, n: int, k: int, layout: str, itemsize: int, c_trans: bool = False,
                    activation: int = 0) -> dict[str, int]:
    """The call values the runtime computes for freshly allocated, contiguous operands of this
    shape and layout (CuPy allocations are 256-byte aligned), so that `tune` builds exactly the
    variant that then runs (c_trans: those of the swapped launch, whose M and N are n and m)."""
    return fresh_plan(m, n, k, layout, itemsize, c_trans=c_trans, activation=activation).call_values


def fresh_operands(m: int, n: int, k: int, layout: str, dtype: Dtype, c_dtype: Dtype | None = None,
                   batch: int = 1) -> tuple[Matrix, Matrix, Matrix, bool, bool]:
    """(A, B, C, trans_a, trans_b): descriptions of freshly allocated, contiguous operands of a call
    of this shape and layout (FRESH_ALLOCATION-aligned, as CuPy allocates; device 0), A and B as
    stored (a transposed one as its K-major storage): what fresh_plan plans and explain configures.
    batch > 1: 3-D operands of that many matrices each, one after the other (a per-matrix B: no fold)."""
    trans_a, trans_b = layout[0] == "t", layout[1] == "t"

    def matrix(rows: int, cols: int, d: Dtype = dtype) -> Matrix:
        shape = (batch, rows, cols) if batch > 1 else (rows, cols)
        return Matrix(shape, tuple(s * d.itemsize for s in row_major_strides(shape)), d, FRESH_ALLOCATION, 0)
    return (matrix(k, m) if trans_a else matrix(m, k), matrix(n, k) if trans_b else matrix(k, n),
            matrix(m, n, c_dtype or dtype), trans_a, trans_b)


def fresh_plan(m: int, n: int, k: int, layout: str, itemsize: int, c_itemsize: int | None = None,
               c_trans: bool = False, activation: int = 0) -> LaunchPlan:
    """The launch plan of a call on freshly allocated, contiguous operands of this shape and layout
    (fresh_operands), with no GPU: what `tune`, the sweep and `explain` plan with."""
    a, b, c, trans_a, trans_b = fresh_operands(m, n, k, layout, Dtype("", itemsize),
                                               Dtype("", c_itemsize or itemsize))
    return plan_launch(a, b, c, trans_a=trans_a, trans_b=trans_b, ptr_of=ptr_of, c_trans=c_trans, activation=activation)
