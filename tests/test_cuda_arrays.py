"""asmgemm.gemm on arrays of other libraries: PyTorch tensors (read in place, launched on torch's
current stream, a torch tensor back) and any object with __cuda_array_interface__ or DLPack
(viewed as a CuPy array without a copy).

On the CPU with stand-ins (tests/fake_cupy.py: a CuPy whose kernel computes what its packed
arguments say, a torch whose tensors are numpy memory with a settable current stream, foreign
arrays over numpy memory): the result is checked and lands in the caller's memory, the launch's
stream is recorded. On the GPU (marked gpu; skipped without a GPU or torch): the same with real
tensors, and a launch that must follow work still running on a side stream."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.toolchain import find_tool
from fake_cupy import CudaArrayInterface, CudaDLPack, FakeArray, install_fakes

TINY = Path(__file__).parent / "data" / "tiny_gemm"
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """Stand-in CuPy and torch; the float64 kernel is tests/data/tiny_gemm."""
    from asmgemm.runtime import build_cache
    cp, torch, launches = install_fakes(monkeypatch, tmp_path, TINY / "tiny_dgemm.toml")
    yield cp, torch, launches
    build_cache.clear_memory_cache()


def rand(*shape, seed=0):
    return np.random.default_rng(seed + 7 * sum(shape)).standard_normal(shape)


# ---- PyTorch ---------------------------------------------------------------------------------
@pytest.mark.toolchain
@needs_ptxas
def test_torch_tensors_in_torch_tensor_out_on_torchs_stream(fake):
    import asmgemm
    cp, torch, launches = fake
    a, b = rand(30, 20), rand(20, 25)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    torch.stream_ptr[0] = 0xABC0
    out = asmgemm.gemm(ta, tb)
    assert isinstance(out, torch.Tensor) and out.shape == (30, 25)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-12)
    assert launches[-1][4].ptr == 0xABC0                  # torch's current stream, not CuPy's
    # the repeated call (a kept launch plan) asks torch for its stream again
    torch.stream_ptr[0] = 0xDEF0
    out2 = asmgemm.gemm(ta, tb)
    assert out2 is not out and launches[-1][4].ptr == 0xDEF0
    np.testing.assert_allclose(out2.numpy(), a @ b, rtol=1e-12)


@pytest.mark.toolchain
@needs_ptxas
def test_torch_c_is_written_in_place_with_views_and_flags(fake):
    import asmgemm
    cp, torch, launches = fake
    a, b = rand(12, 30), rand(40, 30)                      # C = A (12x30) @ B^T (30x40)
    c_host = rand(12, 40)
    c0 = c_host.copy()
    tc = torch.from_numpy(c_host)
    for _ in range(2):
        out = asmgemm.gemm(torch.from_numpy(a), torch.from_numpy(b), tc, alpha=2.0, beta=0.5, trans_b=True)
        assert out is tc
        np.testing.assert_allclose(c_host, 2.0 * a @ b.T + 0.5 * c0, rtol=1e-12)
        c0 = c_host.copy()
    big = rand(50, 50)
    view = torch.from_numpy(big)[3:33, 5:25]               # a strided view (leading dimension 50), no copy
    b2 = rand(30, 8)
    out = asmgemm.gemm(view.T, torch.from_numpy(b2))       # its transpose: a column-major operand
    np.testing.assert_allclose(out.numpy(), big[3:33, 5:25].T @ b2, rtol=1e-12)


@pytest.mark.toolchain
@needs_ptxas
def test_torch_tensors_do_not_mix_and_must_be_on_the_gpu(fake):
    import asmgemm
    cp, torch, _ = fake
    ta = torch.from_numpy(rand(4, 4))
    with pytest.raises(AsmError, match="cannot be mixed") as exc:
        asmgemm.gemm(ta, np.ones((4, 4)).view(FakeArray))
    assert "B is a" in exc.value.message
    on_cpu = torch.Tensor(rand(4, 4), torch.float64, device_index=-1)
    with pytest.raises(AsmError, match="torch tensor on 'cpu'"):
        asmgemm.gemm(ta, on_cpu)


# ---- __cuda_array_interface__ and DLPack ---------------------------------------------------------
@pytest.mark.toolchain
@needs_ptxas
def test_cuda_array_interface_objects_are_read_and_written_in_place(fake):
    import asmgemm
    cp, _, launches = fake
    a, b, c = rand(17, 9), rand(9, 21), rand(17, 21)
    c0 = c.copy()
    ca, cb, cc = CudaArrayInterface(a), CudaArrayInterface(b), CudaArrayInterface(c)
    for _ in range(2):
        out = asmgemm.gemm(ca, cb, cc, beta=1.0)
        assert out is cc                                  # the caller's object back
        np.testing.assert_allclose(c, a @ b + c0, rtol=1e-12)   # written into its memory: no copy
        c0 = c.copy()
    new = asmgemm.gemm(ca, cb)                            # a new C: a CuPy array
    assert isinstance(new, cp.ndarray)
    np.testing.assert_allclose(np.asarray(new), a @ b, rtol=1e-12)
    assert all(launch[4] is None for launch in launches)  # CuPy's current stream
    fortran = np.asfortranarray(rand(17, 9, seed=3))     # strides given in the interface
    np.testing.assert_allclose(np.asarray(asmgemm.gemm(CudaArrayInterface(fortran), cb)), fortran @ b, rtol=1e-12)


@pytest.mark.toolchain
@needs_ptxas
def test_dlpack_objects_on_a_cuda_device(fake):
    import asmgemm
    a, b = rand(8, 5), rand(5, 6)
    out = asmgemm.gemm(CudaDLPack(a), CudaDLPack(b))
    np.testing.assert_allclose(np.asarray(out), a @ b, rtol=1e-12)


@pytest.mark.parametrize("operand, message", [
    (np.ones((4, 4)), "lives in host memory"),           # numpy: DLPack device type 1 (CPU)
    ([[1.0]], "must be a GPU array"),
    (object(), "must be a GPU array"),
])
def test_what_is_not_a_gpu_array_is_a_clear_error(fake, operand, message):
    import asmgemm
    b = np.ones((4, 4)).view(FakeArray)
    with pytest.raises(AsmError, match=message):
        asmgemm.gemm(operand, b)


def test_a_failing_view_is_a_clear_error(fake, monkeypatch):
    import asmgemm
    cp, _, _ = fake

    def refuses(x):
        raise ValueError("strides not supported")
    monkeypatch.setattr(cp, "asarray", refuses)
    with pytest.raises(AsmError, match=r"A \(CudaArrayInterface\) could not be viewed as a CuPy array: ValueError"):
        asmgemm.gemm(CudaArrayInterface(rand(4, 4)), np.ones((4, 4)).view(FakeArray))


# ---- on the GPU ----------------------------------------------------------------------------------
def test_torchs_stream_is_wrapped_by_cupys_from_external_where_cupy_has_it():
    """CuPy 14 deprecates ExternalStream (a warning on each new stream): Stream.from_external gets
    the stream through the CUDA stream protocol; a CuPy without it, or whose from_external takes
    another form, gets ExternalStream(ptr, device)."""
    import types

    from asmgemm.runtime.arrays import external_stream

    got = []

    class Stream:
        @classmethod
        def from_external(cls, obj):
            got.append(obj.__cuda_stream__())
            return "from_external"

    class OtherForm:
        @classmethod
        def from_external(cls, obj, device_id):
            raise AssertionError("not reached: a TypeError is raised before the call")

    def old(ptr, device):
        return ("ExternalStream", ptr, device)

    assert external_stream(types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=Stream, ExternalStream=old)),
                           0x1234, 1) == "from_external"
    assert got == [(0, 0x1234)]
    for cuda in (types.SimpleNamespace(ExternalStream=old), types.SimpleNamespace(Stream=OtherForm, ExternalStream=old)):
        assert external_stream(types.SimpleNamespace(cuda=cuda), 0x1234, 1) == ("ExternalStream", 0x1234, 1)


@pytest.fixture
def torch_gpu(cuda_gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


@pytest.mark.gpu
def test_torch_on_the_gpu_no_copies(torch_gpu):
    import asmgemm
    torch = torch_gpu
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(300, 200, device="cuda", generator=g)
    b = torch.randn(200, 150, device="cuda", generator=g)
    c = torch.full((300, 150), float("nan"), device="cuda")
    ptr = c.data_ptr()
    for _ in range(3):                                    # the first call plans, the others reuse the plan
        out = asmgemm.gemm(a, b, c)
        assert out is c and c.data_ptr() == ptr
        torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-3)
    new = asmgemm.gemm(a.t().contiguous().t(), b)          # a column-major operand
    assert isinstance(new, torch.Tensor) and new.device == a.device
    torch.testing.assert_close(new, a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("reuse", [False, True], ids=["first call", "kept plan"])
def test_torch_launch_follows_work_on_a_side_stream(torch_gpu, reuse):
    """The inputs are written on a non-blocking side stream behind a long sleep, with no
    synchronization: a launch on any other stream (the default one) would read the zeros."""
    import asmgemm
    torch = torch_gpu
    g = torch.Generator(device="cuda").manual_seed(1)
    src_a = torch.randn(256, 128, device="cuda", generator=g)
    src_b = torch.randn(128, 192, device="cuda", generator=g)
    a, b = torch.zeros_like(src_a), torch.zeros_like(src_b)
    if reuse:
        asmgemm.gemm(a, b)                                 # plan this key first
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)                     # ~0.1 s of GPU time before the inputs are written
        a.copy_(src_a)
        b.copy_(src_b)
        c = asmgemm.gemm(a, b)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    torch.testing.assert_close(c, src_a @ src_b, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_cupy_launch_follows_work_on_its_current_stream(cuda_gpu):
    import asmgemm
    from asmgemm.bench.timing import GpuPreRoll
    cp = cuda_gpu
    rs = cp.random.RandomState(2)
    src_a = rs.standard_normal((256, 128), dtype=cp.float32)
    src_b = rs.standard_normal((128, 192), dtype=cp.float32)
    a, b = cp.zeros_like(src_a), cp.zeros_like(src_b)
    asmgemm.gemm(a, b)
    spin = GpuPreRoll()
    cp.cuda.Device().synchronize()
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        spin(100_000.0)                                    # 0.1 s
        a[...] = src_a
        b[...] = src_b
        c = asmgemm.gemm(a, b)
    side.synchronize()
    assert float(cp.abs(c - src_a @ src_b).max()) < 1e-3


@pytest.mark.gpu
def test_a_cuda_array_interface_object_on_the_gpu(cuda_gpu):
    import asmgemm
    cp = cuda_gpu

    from conftest import InterfaceOnly as Foreign    # only the interface, as numba's device arrays
    rs = cp.random.RandomState(3)
    a, b = rs.standard_normal((64, 32), dtype=cp.float32), rs.standard_normal((32, 48), dtype=cp.float32)
    c = cp.full((64, 48), cp.nan, dtype=cp.float32)
    fc = Foreign(c)
    assert asmgemm.gemm(Foreign(a), Foreign(b), fc) is fc
    assert float(cp.abs(c - a @ b).max()) < 1e-3
