"""GPU arrays of several libraries, as the runtime reads them: CuPy arrays (and whatever was
viewed as one through DLPack or __cuda_array_interface__) and PyTorch CUDA tensors. Each library
has one adapter with the same methods (the plan-cache key of an array, its pointer, its Matrix,
a new array, the stream a launch goes on, a padded copy for TMA, zeroing), so that the call path
in gemm.py is written once for both; `Matrix` is what planning reads of an operand (shape,
strides in bytes, dtype, pointer, device), whichever library holds it.
"""
from __future__ import annotations

from typing import NamedTuple

from ..errors import AsmError
from .tensor_map import padded_pitch


class Dtype(NamedTuple):
    name: str
    itemsize: int


class Matrix(NamedTuple):
    """What plan_launch reads of an operand, whichever library holds it (strides in bytes)."""

    shape: tuple
    strides: tuple
    dtype: Dtype
    ptr: int
    device: int

    @property
    def ndim(self) -> int:
        return len(self.shape)


def ptr_of(x: Matrix) -> int:
    return x.ptr


class CupyArrays:
    """CuPy arrays (and what was viewed as one): launched on CuPy's current stream."""

    def __init__(self, cupy):
        self.cupy = cupy

    @staticmethod
    def key_ptr(x) -> tuple[tuple, int]:
        """(key(x), ptr(x)), the pointer read once (the repeated call's path needs both). The key:
        everything the launch plan depends on; of the pointer only its 16-byte alignment (the
        128-bit load and paired-store flags, TMA's rule), so new arrays of a shape reuse the plan."""
        d = x.data
        p = d.ptr
        return (x.shape, x.strides, x.dtype.char, p & 15, d.device_id), p

    @classmethod
    def key(cls, x) -> tuple:
        return cls.key_ptr(x)[0]

    @staticmethod
    def ptr(x) -> int:
        return x.data.ptr

    @staticmethod
    def matrix(x, name: str) -> Matrix:
        return Matrix(tuple(x.shape), tuple(x.strides), Dtype(str(x.dtype), int(x.dtype.itemsize)), int(x.data.ptr),
                       int(x.data.device_id))

    @staticmethod
    def layout(x) -> tuple[int, tuple, tuple]:
        """(pointer, shape, strides in bytes) of a 2-D array."""
        return x.data.ptr, x.shape, x.strides

    def empty(self, like, shape, dtype: str | None = None):
        return self.cupy.empty(shape, dtype=dtype or like.dtype)

    @staticmethod
    def stream(device: int):
        return None                     # CuPy's current stream: the launch leaves stream= out

    def padded_copy(self, x, pitch: int):
        # (rows that are runs of adjacent elements never get here: pad_copy.copy_padded_into copies them)
        rows, cols = x.shape
        y = self.cupy.empty((rows, pitch), dtype=x.dtype)[:, :cols]
        y[...] = x
        return y

    @staticmethod
    def zero(c) -> None:
        c.fill(0)


class _StreamHandle:
    """A raw cudaStream_t as an object of the CUDA stream protocol (`__cuda_stream__`: (version 0,
    the handle)), which CuPy's Stream.from_external takes."""
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.ptr


def external_stream(cupy, ptr: int, device: int):
    """A CuPy stream object for a stream CuPy did not make (torch's): Stream.from_external where
    CuPy has it (cupy.cuda.ExternalStream, which older CuPy offers alone, is deprecated there and
    warned on every new stream), else ExternalStream(ptr, device)."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None) if hasattr(cupy.cuda, "Stream") else None
    if from_external is not None:
        try:
            return from_external(_StreamHandle(ptr))
        except TypeError:       # a CuPy whose from_external takes another form: the old wrapper still works
            pass
    return cupy.cuda.ExternalStream(ptr, device)


def row_major_strides(shape: tuple) -> tuple:
    """The strides, in elements, of a row-major (C-ordered) array of `shape` (extents of 0 count as
    1, as torch and NumPy lay such arrays out)."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(int(extent), 1)
    return tuple(strides[::-1])


class TorchArrays:
    """PyTorch CUDA tensors: read in place, launched on torch's current stream of their device (so
    the kernel is ordered after the work that wrote the inputs), a new C allocated by torch."""

    def __init__(self, cupy, torch):
        self.cupy, self.torch = cupy, torch
        self._streams: dict[tuple[int, int], object] = {}
        self._row_major: dict[tuple, tuple] = {}       # shape -> its row-major strides (in elements)
        # the current stream's handle without building a torch.cuda.Stream object on every call
        # (the handle query Triton and Inductor launch with); absent: the public call below
        self.raw_stream = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)

    @staticmethod
    def key_ptr(x) -> tuple[tuple, int]:
        """(key(x), ptr(x)), data_ptr() asked once (~0.75 us a query on the H100's host)."""
        p = x.data_ptr()
        return (x.shape, x.stride(), x.dtype, p & 15, x.get_device()), p

    @classmethod
    def key(cls, x) -> tuple:
        return cls.key_ptr(x)[0]

    @staticmethod
    def ptr(x) -> int:
        return x.data_ptr()

    @staticmethod
    def matrix(x, name: str) -> Matrix:
        device = x.get_device()
        if device < 0:
            raise AsmError(f"{name} is a torch tensor on '{x.device}'; asmgemm.gemm runs on CUDA tensors",
                           hint="move it with x.cuda() (or x.to('cuda'))")
        item = int(x.element_size())
        return Matrix(tuple(x.shape), tuple(int(s) * item for s in x.stride()),
                       Dtype(str(x.dtype).removeprefix("torch."), item), int(x.data_ptr()), int(device))

    @staticmethod
    def layout(x) -> tuple[int, tuple, tuple]:
        """(pointer, shape, strides in bytes) of a 2-D tensor."""
        item = x.element_size()
        rows, cols = x.shape
        row_stride, col_stride = x.stride()
        return x.data_ptr(), (rows, cols), (row_stride * item, col_stride * item)

    def empty(self, like, shape, dtype: str | None = None):
        # like.new_empty_strided with the row-major strides: `like`'s device (and dtype, unless
        # another is asked) without passing them as keywords to parse: 1.83-2.01 us a call against
        # torch.empty_strided's 2.01-2.08 in one process on the H200's host (one core; torch.empty
        # took 3.1 on the H100's: docs/log/mma.md "Host time"). The strides of a shape kept from
        # its first call (working them out took 0.7 us a call on CI's host).
        key = shape if type(shape) is tuple else tuple(shape)
        strides = self._row_major.get(key)
        if strides is None:
            if len(self._row_major) >= 256:       # shapes come and go: keep the memo bounded
                self._row_major.clear()
            strides = self._row_major[key] = row_major_strides(key)
        if dtype is not None:
            wanted = getattr(self.torch, dtype)
            if wanted is not like.dtype:
                return like.new_empty_strided(key, strides, dtype=wanted)
        return like.new_empty_strided(key, strides)

    def stream(self, device: int):
        """torch's current stream on `device`, as the CuPy stream object the launch takes."""
        raw = self.raw_stream
        ptr = int(raw(device)) if raw is not None else int(self.torch.cuda.current_stream(device).cuda_stream)
        hit = self._streams.get((ptr, device))
        if hit is None:
            if len(self._streams) >= 64:      # streams come and go: keep the wrappers bounded
                self._streams.clear()
            hit = self._streams[(ptr, device)] = external_stream(self.cupy, ptr, device)
        return hit

    def padded_copy(self, x, pitch: int):
        rows, cols = x.shape
        y = self.torch.empty((rows, pitch), dtype=x.dtype, device=x.device)[:, :cols]
        y.copy_(x)
        return y

    @staticmethod
    def zero(c) -> None:
        c.zero_()


DLPACK_CUDA = (2, 13)          # DLDeviceType kDLCUDA, kDLCUDAManaged


def as_cupy(cupy, x, name: str):
    """A CuPy view (no copy) of a GPU array of another library, through DLPack (which lets the
    producer order its stream before CuPy's current one) or __cuda_array_interface__."""
    if isinstance(x, cupy.ndarray):
        return x
    kind = type(x).__name__
    try:
        if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
            device_type = int(x.__dlpack_device__()[0])
            if device_type not in DLPACK_CUDA:
                raise AsmError(f"{name} ({kind}) lives in host memory (DLPack device type {device_type}); "
                               "asmgemm.gemm takes GPU arrays", hint="copy it to the GPU first, e.g. cupy.asarray(x)")
            return cupy.from_dlpack(x)
        if hasattr(x, "__cuda_array_interface__"):
            return cupy.asarray(x)
    except AsmError:
        raise
    except Exception as exc:
        raise AsmError(f"{name} ({kind}) could not be viewed as a CuPy array: {type(exc).__name__}: {exc}") from None
    raise AsmError(f"{name} must be a GPU array (cupy.ndarray, a CUDA torch.Tensor, or an object with "
                   f"__cuda_array_interface__ or __dlpack__), got {kind}")


def padded(arrays, x, itemsize: int):
    """x copied elementwise into new row-major storage whose rows start at multiples of 16 bytes
    (TMA's rule; its pitch in elements: tensor_map.padded_pitch, as padded_matrix plans it): for an
    x whose rows are not runs of adjacent elements (pad_copy.copy_padded_into copies the others)."""
    return arrays.padded_copy(x, padded_pitch(x.shape[1] * itemsize) // itemsize)


def padded_bytes(x, itemsize: int) -> int:
    """The bytes of x's padded copy (rows padded_pitch apart)."""
    return x.shape[0] * padded_pitch(x.shape[1] * itemsize)


def padded_matrix(x: Matrix) -> Matrix:
    """The Matrix a padded copy of x will have (row-major rows at ALIGN-byte multiples, a fresh
    allocation's alignment): what a launch is planned on before the copy is made."""
    rows, cols = x.shape
    item = x.dtype.itemsize
    return Matrix((rows, cols), (padded_pitch(cols * item), item), x.dtype, FRESH_ALLOCATION, x.device)


FRESH_ALLOCATION = 256     # the address planning assumes for an array not allocated yet: any multiple of 16
