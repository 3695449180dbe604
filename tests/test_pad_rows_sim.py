"""kernels_ptx/pad_rows.sasm (the padded copy of an operand TMA cannot read in place) run on the CPU
by tests/ptx_sim.py: every row's bytes land at the start of its 16-byte aligned row of the copy,
whatever the rows' alignment (odd leading dimensions, a matrix starting off 16 bytes), in groups of
rows or one at a time, and nothing
past the matrix is read (its buffer ends at its last byte: ptx_sim fails a read past it), including
the pieces of the last row that the funnel-shifted path would read past the end."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asmgemm.pipeline import BuildOptions, build_file
from asmgemm.runtime.tensor_map import padded_pitch
from ptx_sim import Kernel, Memory, aligned_array, matrix_at_end


@pytest.fixture(scope="module")
def pad_rows():
    result = build_file("pad_rows", BuildOptions(target="sm_90"))
    return result


@pytest.mark.parametrize("rows,cols,ld,lead", [
    (5, 37, 37, 0), (4, 37, 39, 3), (3, 8, 8, 0), (6, 1, 1, 1), (2, 300, 301, 7), (7, 9, 16, 5), (1, 64, 64, 2),
    (12, 37, 37, 1), (33, 20, 21, 0), (16, 8, 8, 0),
])
@pytest.mark.parametrize("grid_rows", ["runtime", "fewer"])
def test_rows_land_aligned_and_nothing_past_the_matrix_is_read(pad_rows, rows, cols, ld, lead, grid_rows):
    c = pad_rows.constants
    keep = []
    buf, _ = matrix_at_end(rows, cols, ld, np.float16, keep, lead=lead, seed=rows + cols)
    bits = buf.view(np.uint16)
    pitch = padded_pitch(2 * cols)
    out = aligned_array((rows * pitch // 2,), np.uint16, 0)
    mem = Memory()
    src = mem.add(buf) + 2 * lead
    args = dict(src=src, dst=mem.add(out), src_end=src + 2 * ((rows - 1) * ld + cols), src_pitch=2 * ld,
                dst_pitch=pitch, rows=rows, row_bytes=2 * cols)
    pieces = -(-2 * cols // 16)
    # the runtime's grid (pad_copy.py: a group of GROUP rows a block row), or fewer block rows: the
    # kernel walks the rest in groups nctaid.y rows apart, the matrix's last rows one at a time
    y = math.ceil(rows / c["GROUP"])
    grid = (math.ceil(pieces / c["THREADS"]), y if grid_rows == "runtime" else max(1, y // 2), 1)
    Kernel(pad_rows.ptx).run(grid, (c["THREADS"], 1, 1), args, mem, 0)
    got = out.reshape(rows, pitch // 2)[:, :cols]
    want = bits[lead + np.arange(rows)[:, None] * ld + np.arange(cols)[None, :]]
    np.testing.assert_array_equal(got, want)
