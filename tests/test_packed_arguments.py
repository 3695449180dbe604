"""cuLaunchKernel's argument array over one packed buffer (launch.packed_arguments), as the padded
copy's launch uses it (pad_copy._KeptCopy): each kernelParams pointer must point at its own
argument's bytes after one struct.pack_into, in the kernel's .param order, with the widths of the
entry's .param types; a layout with a misaligned field is refused."""
from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.runtime import pad_copy
from asmgemm.runtime.launch import packed_arguments

_READ = {8: ctypes.c_uint64, 4: ctypes.c_uint32}


def _decode(array, sizes):
    return [_READ[size].from_address(array[i]).value for i, size in enumerate(sizes)]


def test_each_pointer_reads_its_own_field():
    block, array = packed_arguments("<QQIII")
    values = (2**64 - 3, 0x1234_5678_9ABC, 7, 2**32 - 1, 0)
    struct.pack_into("<QQIII", block, 0, *values)
    assert _decode(array, (8, 8, 4, 4, 4)) == list(values)
    struct.pack_into("<QQIII", block, 0, 1, 2, 3, 4, 5)      # rewritten in place: the same pointers
    assert _decode(array, (8, 8, 4, 4, 4)) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("fmt", ["<IQ", "QQ", "<QIIQ I", "<", "<Q8s"])
def test_misaligned_or_native_layouts_are_refused(fmt):
    with pytest.raises(AsmError):
        packed_arguments(fmt)


def test_the_pad_copy_layout_is_its_entry_s_params():
    """The packed layout against pad_rows.sasm's own .params: names (PAD_ABI) and widths."""
    from asmgemm.pipeline import BuildOptions, build_file
    from ptx_sim import Kernel
    params = Kernel(build_file("pad_rows", BuildOptions(target="sm_90")).ptx).params
    fields = pad_copy._LAYOUT[1:]
    assert [name.removeprefix("param_") for _, name in params] == list(pad_copy.PAD_ABI)
    assert [struct.calcsize("<" + f) for f in fields] == [int(t[1:]) // 8 for t, _ in params]
    assert [np.dtype(t).itemsize for t in pad_copy._TYPES] == [int(t[1:]) // 8 for t, _ in params]


def test_the_pad_copy_launch_passes_its_arguments_in_order():
    kept = object.__new__(pad_copy._KeptCopy)
    seen = []

    def fake_launch(handle, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        array = (ctypes.c_void_p * len(pad_copy.PAD_ABI)).from_address(params)
        sizes = [np.dtype(t).itemsize for t in pad_copy._TYPES]
        seen.append((handle, (gx, gy, gz), bx, stream, _decode(array, sizes)))

    kept.raw = (fake_launch, "handle")
    kept.lock = threading.Lock()
    kept.threads = 128
    kept._block, kept._array = packed_arguments(pad_copy._LAYOUT)
    kept._array_address = ctypes.addressof(kept._array)
    args = (0x7F00_0000_0002, 0x7F10_0000_0000, 0x7F00_0001_0000, 9086, 9088, 4543, 6)
    kept.launch(args, (3, 71, 1), 0xABC, cupy=None)
    kept.launch((1, 2, 3, 4, 5, 6, 7), (1, 1, 1), 0, cupy=None)
    assert seen[0] == ("handle", (3, 71, 1), 128, 0xABC, list(args))
    assert seen[1][4] == [1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(struct.error):      # a negative pitch is refused, not wrapped
        kept.launch((1, 2, 3, -4, 5, 6, 7), (1, 1, 1), 0, cupy=None)
