"""The launch through cuLaunchKernel (runtime/launch.py ParamBlock and launch_block, runtime/gemm.py
kept_launch.raw_launcher): the argument bytes a kept parameter block holds must be, call after call, those of
the argument tuple CuPy's RawKernel call would have packed (ArgPacker.pack), and the driver must be
handed an array of pointers to them in .param order. Decoded here from memory on the CPU; the GPU
tests run every launch through this path (tests/test_raw_launch_gpu.py compares it with CuPy's)."""
from __future__ import annotations

import types
from types import SimpleNamespace

import numpy as np
import pytest

from asmgemm.runtime import arrays, kept_launch
from asmgemm.runtime import tensor_map
from asmgemm.runtime.build_cache import BuiltKernel
from asmgemm.runtime.launch import ArgPacker, ParamBlock, launch_block
from asmgemm.runtime.plan import plan_launch
from fake_cupy import kernel_params         # what the driver reads from a kernelParams array

SGEMM_PARAMS = (("A", ".u64"), ("B", ".u64"), ("C", ".u64"), ("M", ".u32"), ("N", ".u32"), ("K", ".u32"),
                ("lda", ".u32"), ("ldb", ".u32"), ("ldc", ".u32"), ("alpha", ".f32"), ("beta", ".f32"),
                ("bias", ".u64"), ("batch_stride_a", ".u64"), ("batch_stride_b", ".u64"),
                ("batch_stride_c", ".u64"), ("k_chunk", ".u32"), ("split_stride", ".u64"))
HGEMM_PARAMS = (("tmap_a", ".b8"), ("tmap_b", ".b8"), ("tmap_c", ".b8"), ("C", ".u64"), ("M", ".u32"),
                ("N", ".u32"), ("K", ".u32"), ("ldc", ".u32"), ("alpha", ".f32"), ("beta", ".f32"),
                ("bias", ".u64"))


def _matrix(rows, cols, ptr, item):
    return SimpleNamespace(shape=(rows, cols), ndim=2, strides=(cols * item, item),
                           dtype=SimpleNamespace(itemsize=item), ptr=ptr)


def _plan(m, n, k, item, base=0x10000):
    return plan_launch(_matrix(m, k, base, item), _matrix(k, n, base + 0x100000, item),
                       _matrix(m, n, base + 0x200000, item), trans_a=False, trans_b=False, ptr_of=lambda x: x.ptr)


def _packed(args) -> list[bytes]:
    return [np.asarray(v).tobytes() for v in args]


def test_sgemm_arguments_match_the_packed_tuple_call_after_call():
    built = BuiltKernel("k", "sgemm", 256, 128, 128, 0, SGEMM_PARAMS, "x.cubin", "x.ptx", "sm_90")
    plan = _plan(300, 200, 1000, 4)
    packer = ArgPacker(built, plan, "float32", "float32", {"k_chunk": 96, "split_stride": 60000})
    block = ParamBlock(packer, SGEMM_PARAMS)
    for a, b, c, alpha, beta, bias in ((0x1000, 0x2000, 0x3000, 1.0, 0.0, 0),
                                       (0x1000, 0x2000, 0x3000, 1.0, 0.0, 0),        # the same again
                                       (0x9000, 0xa000, 0xb000, 0.5, -2.25, 0xc000),
                                       (0x1000, 0x2000, 0x3000, 1.0, 0.0, 0),        # alpha, beta back
                                       (2 ** 47 + 16, 2 ** 40, 2 ** 63 + 32, 1 / 3, float("inf"), 0)):
        block.write(a, b, c, alpha, beta, bias)
        want = _packed(packer.pack(a, b, c, alpha, beta, bias))
        assert block.arguments() == want
        assert kernel_params(block.address, SGEMM_PARAMS) == want
    # the fixed arguments are the plan's: M, N, K and the split's values
    got = dict(zip([n for n, _ in SGEMM_PARAMS], block.arguments()))
    assert [int.from_bytes(got[n], "little") for n in ("M", "N", "K", "k_chunk", "split_stride")] == \
        [300, 200, 1000, 96, 60000]


@pytest.mark.parametrize("layout", ["address_in_every_word", "address_in_word_0"])
def test_tensor_maps_are_written_when_their_pointer_changes(monkeypatch, layout):
    """A moved operand's map is written again: by the driver's encode where the map's layout is not
    the one tensor_map.mover checks for (the address elsewhere than word 0 alone), by rewriting word 0
    of the first map where it is (then no encode at all for the new address)."""
    encoded = []

    def fake_encode(tm):
        encoded.append(tm.ptr)
        if layout == "address_in_every_word":
            return np.frombuffer(tm.ptr.to_bytes(8, "little") * 16, dtype="V128")[0]
        rest = b"".join((tm.rows * 1000 + i).to_bytes(8, "little") for i in range(15))
        return np.frombuffer(tm.ptr.to_bytes(8, "little") + rest, dtype="V128")[0]
    monkeypatch.setattr(tensor_map, "encode", fake_encode)
    built = BuiltKernel("k", "hgemm", 384, 128, 256, 0, HGEMM_PARAMS, "x.cubin", "x.ptx", "sm_90a", (128, 64, 64), 2)
    plan = _plan(300, 256, 512, 2)
    packer = ArgPacker(built, plan, "float16", "float16")
    block = ParamBlock(packer, HGEMM_PARAMS)
    block.write(0x10000, 0x20000, 0x30000, 1.0, 0.0)
    assert block.arguments()[0][:8] == (0x10000).to_bytes(8, "little")
    n_encoded = len(encoded)
    block.write(0x10000, 0x20000, 0x30000, 2.0, 1.0)             # same pointers: no map written again
    assert len(encoded) == n_encoded
    block.write(0x10000, 0x50000, 0x30000, 2.0, 1.0)             # B moved: its map only
    assert encoded[n_encoded:] == ([0x50000] if layout == "address_in_every_word" else [])
    block.write(0x10000, 0x50000, 0x30000, 2.0, 1.0)
    assert encoded[n_encoded:] == ([0x50000] if layout == "address_in_every_word" else [])
    want = _packed(packer.pack(0x10000, 0x50000, 0x30000, 2.0, 1.0))
    assert block.arguments() == want and kernel_params(block.address, HGEMM_PARAMS) == want


def test_launch_block_hands_the_driver_the_block():
    built = BuiltKernel("k", "sgemm", 256, 128, 128, 0, SGEMM_PARAMS, "x.cubin", "x.ptx", "sm_90")
    packer = ArgPacker(built, _plan(128, 128, 128, 4), "float32", "float32")
    block = ParamBlock(packer, SGEMM_PARAMS)
    calls = []

    def driver_launch(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        calls.append(((fn, gx, gy, gz, bx, by, bz, smem, stream, extra), kernel_params(params, SGEMM_PARAMS)))
    launch_block((driver_launch, 0xf00d, block), (2, 3, 4), (256, 1, 1), 4096, 0x77, 0x1000, 0x2000, 0x3000, 1.5, 0.5)
    (head, args), = calls
    assert head == (0xf00d, 2, 3, 4, 256, 1, 1, 4096, 0x77, 0)
    assert args == _packed(packer.pack(0x1000, 0x2000, 0x3000, 1.5, 0.5))


def test_a_block_of_the_wrong_size_is_refused():
    from asmgemm.errors import AsmError
    built = BuiltKernel("k", "sgemm", 256, 128, 128, 0, SGEMM_PARAMS, "x.cubin", "x.ptx", "sm_90")
    packer = ArgPacker(built, _plan(128, 128, 128, 4), "float32", "float32")
    with pytest.raises(AsmError, match="parameter block"):
        ParamBlock(packer, SGEMM_PARAMS[:-1])


def test_theraw_launcher_needs_the_driver_and_a_handle(monkeypatch):
    fn = SimpleNamespace(kernel=SimpleNamespace(ptr=0xabc))
    launch = object()
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(driver=types.SimpleNamespace(launchKernel=launch)))
    assert kept_launch.raw_launcher(cupy, fn) == (launch, 0xabc)
    assert kept_launch.raw_launcher(types.SimpleNamespace(cuda=types.SimpleNamespace()), fn) is None
    assert kept_launch.raw_launcher(cupy, lambda *a, **k: None) is None          # a stand-in's function
    monkeypatch.setenv("ASMGEMM_RAW_LAUNCH", "0")
    assert kept_launch.raw_launcher(cupy, fn) is None


def test_torch_stream_by_its_raw_handle_where_torch_offers_it():
    """arrays.TorchArrays.stream asks torch._C._cuda_getCurrentRawStream(device) when it exists (no
    torch.cuda.Stream object a call), else torch.cuda.current_stream(device).cuda_stream."""
    from fake_cupy import ExternalStream
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(ExternalStream=ExternalStream))
    asked = []
    public = types.SimpleNamespace(cuda=types.SimpleNamespace(
        current_stream=lambda device=None: asked.append(("public", device)) or SimpleNamespace(cuda_stream=0x50)))
    assert arrays.TorchArrays(cupy, public).stream(1).ptr == 0x50 and asked == [("public", 1)]
    fast = types.SimpleNamespace(cuda=public.cuda, _C=types.SimpleNamespace(
        _cuda_getCurrentRawStream=lambda device: asked.append(("raw", device)) or 0x70))
    adapter = arrays.TorchArrays(cupy, fast)
    first = adapter.stream(0)
    assert first.ptr == 0x70 and adapter.stream(0) is first and asked[1:] == [("raw", 0), ("raw", 0)]


def test_torch_empty_asks_for_row_major_strides_worked_out_once_per_shape():
    """arrays.TorchArrays.empty: like.new_empty_strided with the row-major strides of the shape (an
    extent of 0 counting as 1), kept per shape, so a repeated call's new C costs no strides loop;
    the dtype named only where it is not like's (the keyword's parsing costs host time); the memo
    stays bounded."""
    asked = []
    torch = types.SimpleNamespace(float16="f16", float32="f32")

    class Like:
        dtype = "f32"

        def new_empty_strided(self, size, stride, **kw):
            asked.append((size, stride, kw))
            return "tensor"
    like = Like()
    adapter = arrays.TorchArrays(types.SimpleNamespace(), torch)
    assert adapter.empty(like, (3, 128, 64)) == "tensor"
    assert adapter.empty(like, [3, 128, 64], "float16") == "tensor"
    assert adapter.empty(like, (3, 128, 64), "float32") == "tensor"
    assert adapter.empty(like, (5, 0)) == "tensor"
    assert asked == [((3, 128, 64), (8192, 64, 1), {}), ((3, 128, 64), (8192, 64, 1), {"dtype": "f16"}),
                     ((3, 128, 64), (8192, 64, 1), {}), ((5, 0), (1, 1), {})]
    assert list(adapter._row_major) == [(3, 128, 64), (5, 0)]
    for rows in range(300):
        adapter.empty(like, (rows + 1, 7))
    assert len(adapter._row_major) <= 256 and asked[-1][:2] == ((300, 7), (7, 1))
    assert arrays.row_major_strides((2, 3, 4)) == (12, 4, 1) and arrays.row_major_strides(()) == ()


def test_a_moved_map_is_rewritten_by_its_address_word_alone_after_its_first_write(monkeypatch):
    """Where tensor_map.mover moves a map by its address word (the driver's layout checked), the
    block writes a map whole once, then only those 8 bytes for each new address: the bytes stay
    exactly packer.pack's, the map is not asked for again, and an address TMA cannot start at is
    refused as by the mover."""
    from asmgemm.errors import AsmError

    def driver(tm):
        words = np.array([tm.rows * 1000 + i for i in range(16)], dtype=np.uint64)
        words[0] = tm.ptr
        return np.frombuffer(words.tobytes(), dtype="V128")[0]
    tensor_map.clear_cache()
    monkeypatch.setattr(tensor_map, "_encode", driver)
    built = BuiltKernel("k", "hgemm", 384, 128, 256, 0, HGEMM_PARAMS, "x.cubin", "x.ptx", "sm_90a", (128, 64, 64), 2)
    packer = ArgPacker(built, _plan(300, 256, 512, 2), "float16", "float16")
    block = ParamBlock(packer, HGEMM_PARAMS)
    moves = []
    real_mover = tensor_map.mover

    def counting_mover(tm):
        move = real_mover(tm)

        def counted(ptr):
            moves.append(ptr)
            return move(ptr)
        counted.address_word = getattr(move, "address_word", None)
        return counted
    monkeypatch.setattr(tensor_map, "mover", counting_mover)
    block.write(0x10000, 0x20000, 0x30000, 1.0, 0.0)
    assert moves == [0x10000, 0x20000, 0x30000]                 # each map written whole once
    for a, b, c, alpha, beta in ((0x10000, 0x20000, 0x70000, 1.0, 0.0), (0x10000, 0x20000, 0x30000, 1.0, 0.0),
                                 (0x10000, 0x20000, 0x70000, 1.0, 0.0), (0x10000, 0x20000, 2 ** 47 + 0x100, 1.0, 0.0),
                                 (0x90000, 0xa0000, 0x30000, 0.5, 2.0)):
        asked = len(moves)
        block.write(a, b, c, alpha, beta)
        assert len(moves) == asked                               # the block asked for no map
        want = _packed(packer.pack(a, b, c, alpha, beta))       # (pack itself moves maps through encode)
        assert block.arguments() == want and kernel_params(block.address, HGEMM_PARAMS) == want
    with pytest.raises(AsmError, match="16 bytes"):
        block.write(0x90008, 0xa0000, 0x30000, 0.5, 2.0)
