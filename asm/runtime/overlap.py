"""Whether gemm's output shares memory with one of its inputs.

A kernel that writes C while it still reads A, B or the bias (C is A, C a view into B) returns
garbage without a word, so gemm refuses such a call. The test is on byte ranges: the smallest
range [lo, hi) that holds every element an array's shape and strides reach. Two ranges that
intersect are refused even where the arrays' elements interleave without meeting (C = x[:, ::2],
A = x[:, 1::2]): sound, cheap, and the case where the elements really do not meet is rare enough
to ask for a copy.

Everything here is a pure function of (pointer, shape, strides in bytes, itemsize), so the CPU
tests check it without a GPU. A kept launch plan keys on the shapes and strides (runtime/gemm.py),
so the parts of the ranges that do not depend on the pointers are worked out once per plan
(`kept_bounds`); a repeated call then only compares pointer differences with them.
"""
from __future__ import annotations

from ..errors import AsmError


def offsets(shape, strides, itemsize: int) -> tuple[int, int] | None:
    """The byte range an array covers, relative to its data pointer: (lo, hi), lo <= 0 < hi;
    None when it has no element (it reads or writes nothing, so it overlaps nothing)."""
    lo = hi = 0
    for n, s in zip(shape, strides):
        if n == 0:
            return None
        reach = (n - 1) * s
        if reach < 0:                       # a negative stride reaches below the pointer
            lo += reach
        else:
            hi += reach
    return lo, hi + itemsize


def extent(ptr: int, shape, strides, itemsize: int) -> tuple[int, int] | None:
    """The absolute byte range [lo, hi) of an array at `ptr`; None when it has no element."""
    off = offsets(shape, strides, itemsize)
    return None if off is None else (ptr + off[0], ptr + off[1])


def overlap(x: tuple[int, int] | None, y: tuple[int, int] | None) -> bool:
    return x is not None and y is not None and x[0] < y[1] and y[0] < x[1]


def described(name: str, x) -> tuple | None:
    """(name, ptr, shape, strides, itemsize) of an array description (runtime/arrays.Matrix: ptr,
    shape, strides in bytes, dtype), as check_output takes them; None for None (no bias)."""
    return None if x is None else (name, x.ptr, x.shape, x.strides, x.dtype.itemsize)


def check_output(c, inputs) -> None:
    """AsmError when the output's range meets an input's. `c` and each input are (name, ptr,
    shape, strides, itemsize); an input may be None (no bias)."""
    name_c, *array_c = c
    range_c = extent(*array_c)
    for x in inputs:
        if x is None:
            continue
        name_x, *array_x = x
        range_x = extent(*array_x)
        if overlap(range_c, range_x):
            raise AsmError(
                f"{name_c} overlaps {name_x} in memory ({name_c}: bytes {_hex(range_c)}, {name_x}: bytes "
                f"{_hex(range_x)}): the kernel would overwrite {name_x} while reading it",
                hint=f"pass a {name_c} that shares no memory with {name_x}, or leave c out to get a new one")


def kept_bounds(c, inputs) -> tuple[int, ...]:
    """For a kept launch plan: per input (in order), the open interval (lo, hi) of
    `c_ptr - x_ptr` in which the two ranges meet, flattened: (lo_0, hi_0, lo_1, hi_1, ...). A
    repeated call's test of input i is then `lo_i < c_ptr - x_ptr < hi_i`. `c` and each input
    are (shape, strides, itemsize); an input that is None or empty (and an empty C) gets (0, 0),
    which no difference lies strictly inside."""
    off_c = offsets(*c)
    out: list[int] = []
    for x in inputs:
        off_x = offsets(*x) if x is not None else None
        if off_c is None or off_x is None:
            out += (0, 0)
        else:
            # c_ptr + c_lo < x_ptr + x_hi and x_ptr + x_lo < c_ptr + c_hi, with d = c_ptr - x_ptr
            out += (off_x[0] - off_c[1], off_x[1] - off_c[0])
    return tuple(out)


def _hex(r: tuple[int, int]) -> str:
    return f"[{r[0]:#x}, {r[1]:#x})"
