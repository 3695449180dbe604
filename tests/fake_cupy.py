"""A stand-in CuPy for driving `asmgemm.gemm` to the launch on a machine without a GPU: arrays are
numpy arrays with a device and a real data pointer, and RawModule's functions are whatever the
test supplies (a recorder, or an interpreter of the kernel's packed arguments).

Also a stand-in PyTorch (`make_torch`: tensors over numpy memory, a settable current stream) and a
foreign GPU array exposing only __cuda_array_interface__ (`CudaArrayInterface`), so the paths for
other libraries' arrays run on the CPU too."""
from __future__ import annotations

import ctypes
import types
from pathlib import Path
from typing import Callable

import numpy as np


class Device:
    current = [0]

    def __init__(self, id=None):
        self.id = Device.current[0] if id is None else int(id)
        self.compute_capability = "90"
        self.attributes = {"MultiProcessorCount": 132}

    def __enter__(self):
        self._prev = Device.current[0]
        Device.current[0] = self.id
        return self

    def __exit__(self, *exc):
        Device.current[0] = self._prev
        return False

    def synchronize(self):
        pass


class FakeArray(np.ndarray):
    @property
    def device(self):
        return Device(0)

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data, device_id=0)


class ExternalStream:
    def __init__(self, ptr, device_id=-1):
        self.ptr, self.device_id = int(ptr), device_id

    def __repr__(self):
        return f"ExternalStream(0x{self.ptr:x})"


def view_of(ptr: int, shape, strides, dtype) -> np.ndarray:
    """A numpy view of memory at `ptr` (strides in bytes, non-negative), writes going to that memory."""
    dtype = np.dtype(dtype)
    if 0 in shape:
        return np.empty(shape, dtype)
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + dtype.itemsize
    flat = np.frombuffer((ctypes.c_char * span).from_address(ptr), dtype=dtype)
    return np.lib.stride_tricks.as_strided(flat, shape, strides)


def _from_interface(obj) -> FakeArray:
    cai = obj.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    if strides is None:        # C-contiguous
        strides, step = [], dtype.itemsize
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    return view_of(cai["data"][0], shape, tuple(strides), dtype).view(FakeArray)


def make_cupy(function: Callable[[str, str], Callable], name: str = "Fake GPU") -> types.ModuleType:
    """A cupy module whose RawModule(path).get_function(entry) returns function(path, entry)."""
    cp = types.ModuleType("cupy")
    cp.ndarray = FakeArray
    cp.empty = lambda shape, dtype=np.float64: np.zeros(shape, dtype).view(FakeArray)
    # (a host numpy array is copied to the "device", as cupy.asarray copies it)
    cp.asarray = lambda x: (np.array(x).view(FakeArray) if type(x) is np.ndarray else _from_interface(x))

    def from_dlpack(x):
        return np.from_dlpack(_Capsule(x.__dlpack__(stream=None))).view(FakeArray)
    cp.from_dlpack = from_dlpack

    class RawModule:
        def __init__(self, path):
            self.path = path

        def get_function(self, entry):
            return function(self.path, entry)
    cp.RawModule = RawModule
    # what the benchmark's problem set-up and cuBLAS reference use
    cp.dtype, cp.float32, cp.float64 = np.dtype, np.float32, np.float64
    cp.matmul = lambda a, b, out=None: np.matmul(a, b, out=out)

    class RandomState:
        def __init__(self, seed):
            self._rs = np.random.RandomState(seed)

        def uniform(self, low, high, size, dtype=float):
            return self._rs.uniform(low, high, size).astype(dtype).view(FakeArray)
    cp.random = types.SimpleNamespace(RandomState=RandomState)
    cp.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda d: {"name": name.encode()},
                                      getDevice=lambda: Device.current[0]),
        Device=Device, ExternalStream=ExternalStream,
        get_current_stream=lambda: types.SimpleNamespace(ptr=0))
    return cp


class RawFunction:
    """A loaded function as real CuPy's: callable (CuPy's RawKernel call) and with a CUfunction
    handle (`.kernel.ptr`), which cuLaunchKernel (with_raw_launch) takes instead."""

    def __init__(self, fn, handle: int):
        self._fn, self.kernel = fn, types.SimpleNamespace(ptr=handle)

    def __call__(self, *args, **kw):
        return self._fn(*args, **kw)


def kernel_params(address: int, params) -> list[bytes]:
    """What cuLaunchKernel reads from a `kernelParams` array at `address`: argument i's bytes at
    pointer i, as many as its .param type holds (a tensor map's 128), for the (name, PTX type)
    list `params` of the build."""
    from asmgemm.kernel_spec import ARRAY_ARGUMENTS
    from asmgemm.runtime.launch import _SCALAR
    pointers = (ctypes.c_void_p * len(params)).from_address(address)
    return [ctypes.string_at(pointers[i], ARRAY_ARGUMENTS.get(name) or np.dtype(_SCALAR[ptype]).itemsize)
            for i, (name, ptype) in enumerate(params)]


def with_raw_launch(cp) -> list:
    """Give a stand-in CuPy the driver's cuLaunchKernel (cupy.cuda.driver.launchKernel), as real
    CuPy has, so that asmgemm launches through its kept parameter blocks: the launch reads the
    kernelParams array by the build's .param list (a pointer per argument, to its bytes) and calls
    the loaded function with those values, as CuPy's own call would have passed them. Returns the
    list each raw launch is recorded in: (entry, grid, block, shared memory, stream handle)."""
    from asmgemm.kernel_spec import ARRAY_ARGUMENTS
    from asmgemm.runtime import build_cache
    from asmgemm.runtime.launch import _SCALAR
    loaded: dict[int, tuple] = {}
    raw_launches: list = []
    plain = cp.RawModule

    class RawModule(plain):
        def get_function(self, entry):
            found = [b for b in build_cache._by_config.values() if b.cubin_path == str(self.path)]
            assert found, f"no build of {self.path} in this process"
            handle = 0x1000 + len(loaded)
            loaded[handle] = (super().get_function(entry), found[0].params, entry)
            return RawFunction(loaded[handle][0], handle)

    def launch_kernel(handle, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        fn, names, entry = loaded[handle]
        args = [raw if name in ARRAY_ARGUMENTS else np.frombuffer(raw, _SCALAR[ptype])[0]
                for (name, ptype), raw in zip(names, kernel_params(params, names))]
        raw_launches.append((entry, (gx, gy, gz), (bx, by, bz), smem, stream))
        fn((gx, gy, gz), (bx, by, bz), tuple(args), shared_mem=smem, stream=ExternalStream(stream) if stream else None)

    cp.RawModule = RawModule
    cp.cuda.driver = types.SimpleNamespace(launchKernel=launch_kernel)
    return raw_launches


class _Capsule:
    """What numpy's from_dlpack reads: a DLPack capsule of host memory."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None, **kw):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


class CudaArrayInterface:
    """A foreign "GPU" array that offers only __cuda_array_interface__ (version 3) over a numpy
    array's memory: what a gemm() writes through it lands in `.host`."""

    def __init__(self, host: np.ndarray):
        self.host = host

    @property
    def __cuda_array_interface__(self):
        h = self.host
        return {"shape": h.shape, "typestr": h.dtype.str, "data": (h.ctypes.data, False), "version": 3,
                "strides": None if h.flags.c_contiguous else h.strides, "stream": None}


class CudaDLPack:
    """A foreign "GPU" array that offers only DLPack, with a CUDA device type (the memory is a numpy
    array's)."""

    def __init__(self, host: np.ndarray):
        self.host = host

    def __dlpack__(self, stream=None, **kw):
        return self.host.__dlpack__()

    def __dlpack_device__(self):
        return (2, 0)


# ---- a stand-in PyTorch ------------------------------------------------------------------------
class TorchDtype:
    def __init__(self, name: str, np_dtype):
        self.name, self.np, self.itemsize = name, np.dtype(np_dtype), np.dtype(np_dtype).itemsize

    def __repr__(self):
        return f"torch.{self.name}"


class TorchDevice:
    def __init__(self, type: str, index):
        self.type, self.index = type, index

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


class Tensor:
    """A torch.Tensor stand-in over a numpy array (which it shares: no copies)."""

    def __init__(self, array: np.ndarray, dtype: TorchDtype, device_index: int = 0):
        self._a, self.dtype, self._dev = array, dtype, device_index

    @property
    def shape(self):
        return tuple(self._a.shape)

    def stride(self):
        return tuple(s // self._a.itemsize for s in self._a.strides)

    def dim(self):
        return self._a.ndim

    def data_ptr(self):
        return self._a.ctypes.data

    def element_size(self):
        return self._a.itemsize

    def get_device(self):
        return self._dev

    def new_empty_strided(self, size, stride, dtype=None):
        """Through the stand-in torch module's empty_strided (a test's tracker of it sees it), with
        this tensor's dtype unless another is asked."""
        return _made_torch[0].empty_strided(size, stride, dtype=dtype or self.dtype, device=self.device)

    @property
    def device(self):
        return TorchDevice("cuda" if self._dev >= 0 else "cpu", self._dev if self._dev >= 0 else None)

    @property
    def T(self):
        return Tensor(self._a.T, self.dtype, self._dev)

    def t(self):
        return self.T

    def __getitem__(self, idx):
        return Tensor(self._a[idx], self.dtype, self._dev)

    def copy_(self, other):
        self._a[...] = other._a
        return self

    def zero_(self):
        self._a[...] = 0
        return self

    def __imul__(self, x):
        self._a *= x
        return self

    def numpy(self):
        return self._a


_made_torch: list = [None]      # the latest make_torch() module (Tensor.new_empty_strided allocates through it)


def make_torch() -> types.ModuleType:
    """A torch module: float32/float64/float16, empty() (NaN-filled), tensor(), and
    torch.cuda.current_stream(device).cuda_stream read from `torch.stream_ptr[0]`."""
    torch = types.ModuleType("torch")
    torch.Tensor = Tensor
    torch.float32, torch.float64, torch.float16 = (TorchDtype("float32", np.float32), TorchDtype("float64", np.float64),
                                                   TorchDtype("float16", np.float16))
    torch.stream_ptr = [0]
    torch.uint8 = TorchDtype("uint8", np.uint8)      # (the bytes of split_scratch's kept buffers)
    by_np = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
             np.dtype(np.float16): torch.float16, np.dtype(np.uint8): torch.uint8}

    def empty(shape, dtype=None, device=None):
        dtype = dtype or torch.float32
        return Tensor(np.full(shape, np.nan, dtype.np), dtype, 0)
    torch.empty = empty

    def empty_strided(shape, stride, dtype=None, device=None):
        out = torch.empty(shape, dtype=dtype, device=device)     # (a test's tracker of torch.empty sees it)
        if tuple(stride) != out.stride() and 0 not in tuple(shape):     # (an empty tensor has no layout)
            raise NotImplementedError(f"the stand-in makes row-major tensors only, not strides {tuple(stride)}")
        return out
    torch.empty_strided = empty_strided
    _made_torch[0] = torch
    torch.from_numpy = lambda a, device_index=0: Tensor(a, by_np[a.dtype], device_index)
    torch.cuda = types.SimpleNamespace(
        current_stream=lambda device=None: types.SimpleNamespace(cuda_stream=torch.stream_ptr[0]))
    # the raw handle query asmgemm launches with where torch has it (as torch 2.x does)
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: torch.stream_ptr[0])
    return torch


# ---- a "kernel" that computes what the packed arguments say --------------------------------------
def interpreting_kernel(launches: list, dtype=np.float64) -> Callable[[str, str], Callable]:
    """function(path, entry) for make_cupy: the loaded kernel reads its packed arguments by the
    build's .param list (names from the spec's abi) and its TRANS_A/TRANS_B defines, and computes
    C = alpha * op(A) * op(B) + beta * C in the memory the pointers address; each launch is
    recorded as (grid, block, args, shared_mem, stream)."""
    def function(path, entry):
        from asmgemm.runtime import build_cache
        found = [(dict(cfg[2]), b) for cfg, b in build_cache._by_config.items() if b.cubin_path == str(path)]
        assert found, f"no build of {path} in this process"
        defines, built = found[0]
        names = [n for n, _ in built.params]
        ta, tb = defines.get("TRANS_A", "0") == "1", defines.get("TRANS_B", "0") == "1"
        if entry == "splitk_reduce":
            return _reduce_kernel(launches, names, defines)
        if entry == "pad_rows":
            return _pad_rows_kernel(names)
        split = defines.get("SPLIT_K", "0") == "1"

        def fn(grid, block, args, shared_mem=0, stream=None):
            launches.append((grid, block, args, shared_mem, stream))
            v = dict(zip(names, args))
            m, n, k = int(v["M"]), int(v["N"]), int(v["K"])
            item = np.dtype(dtype).itemsize

            def matrix(ptr, rows, cols, ld):
                return view_of(int(ptr), (rows, cols), (int(ld) * item, item), dtype)
            if split:
                assert defines.get("BATCHED", "0") != "1", "split-K and a batch share grid z"
                # split-K's partial pass, as sgemm.sasm's SPLIT_K_CHUNK / SPLIT_K_SLICE set it up: block
                # z = s moves A and B by k0 = s * k_chunk along K and writes slice s of the workspace
                chunk, stride, lda, ldb = int(v["k_chunk"]), int(v["split_stride"]), int(v["lda"]), int(v["ldb"])
                assert chunk % 16 == 0 and 0 < chunk and (grid[2] - 1) * chunk < k, "an empty split"
                for s in range(grid[2]):
                    k0 = s * chunk
                    kk = min(k, k0 + chunk) - k0
                    a_ptr = int(v["A"]) + (k0 * lda if ta else k0) * item
                    b_ptr = int(v["B"]) + (k0 if tb else k0 * ldb) * item
                    a = matrix(a_ptr, *((kk, m) if ta else (m, kk)), lda)
                    b = matrix(b_ptr, *((n, kk) if tb else (kk, n)), ldb)
                    c = matrix(int(v["C"]) + s * stride * item, m, n, v["ldc"])
                    prod = (a.T if ta else a) @ (b.T if tb else b)
                    c[...] = float(v["alpha"]) * prod + (float(v["beta"]) * c if float(v["beta"]) != 0 else 0.0)
                return
            cluster_k = int(defines.get("CLUSTER_K", "1"))
            if cluster_k > 1:
                # a split summed inside clusters (gemm_skinny.sasm's CLUSTER_K): grid z is the
                # cluster's S blocks of a tile, which together compute the whole of C
                assert grid[2] == cluster_k and defines.get("BATCHED", "0") != "1", "a cluster split's grid z is S"
            else:
                assert grid[2] == 1 or defines.get("BATCHED", "0") == "1", "grid z > 1 without a batch or split"
            # a batched build (BATCHED=1) runs grid z batches, each pointer stepped by its batch stride;
            # a grouped one (GROUPED=1, mma_gemm.sasm) the problems whose end rows offs holds, each
            # clamped to 0 .. M as the kernel's EXPERT_TILE clamps them
            batches = int(grid[2]) if defines.get("BATCHED", "0") == "1" else 1
            grouped = defines.get("GROUPED", "0") == "1"
            problems = []
            if grouped:
                ends = view_of(int(v["offs"]), (int(v["groups"]),), (4,), np.int32).astype(np.int64)
                for e in range(int(v["groups"])):
                    start = min(max(int(ends[e - 1]) if e else 0, 0), m)
                    end = max(min(max(int(ends[e]), 0), m), start)
                    problems.append((e, start, end))
            for z, row0, row1 in problems if grouped else [(z, 0, m) for z in range(batches)]:
                def at(name):
                    if grouped:         # rows row0.. of A (columns, transposed) and C; B of problem z
                        step = {"A": 1 if ta else int(v["lda"]), "B": 0, "C": int(v["ldc"])}[name] * row0
                        return int(v[name]) + (step + (z * int(v["batch_stride_b"]) if name == "B" else 0)) * item
                    return int(v[name]) + z * int(v.get("batch_stride_" + name.lower(), 0)) * item
                m = row1 - row0
                a = matrix(at("A"), *((k, m) if ta else (m, k)), v["lda"])
                b = matrix(at("B"), *((n, k) if tb else (k, n)), v["ldb"])
                # C_T=1 (the c_trans launch): element (i, j) at C + j * ldc + i
                c = matrix(at("C"), n, m, v["ldc"]).T if defines.get("C_T", "0") == "1" else matrix(at("C"), m, n, v["ldc"])
                prod = (a.T if ta else a) @ (b.T if tb else b)
                out = float(v["alpha"]) * prod + (float(v["beta"]) * c if float(v["beta"]) != 0 else 0.0)
                # the fused epilogue (kernel_spec call values bias/activation as BIAS/ACT): bias per
                # kernel column (1) or row (2), read at the packed pointer; PyTorch's activations
                bias_mode, act = int(defines.get("BIAS", "0")), int(defines.get("ACT", "0"))
                if bias_mode:
                    assert int(v["bias"]) != 0, "BIAS set but the bias argument is 0"
                    vec = view_of(int(v["bias"]), (n if bias_mode == 1 else m,), (item,), dtype)
                    out = out + (vec.reshape(1, -1) if bias_mode == 1 else vec.reshape(-1, 1))
                elif "bias" in v:
                    assert int(v["bias"]) == 0, "a bias pointer without BIAS"
                from epilogue_reference import BY_CODE
                c[...] = BY_CODE[act](np.asarray(out, np.float64))
        return fn
    return function


def simulating_kernel(launches: list, memory) -> Callable[[str, str], Callable]:
    """function(path, entry) for make_cupy: the loaded kernel's own PTX (the build beside the cubin
    the runtime loads) runs in the PTX interpreter (tests/ptx_sim.py) on its packed arguments, over
    the arrays registered in `memory` (a ptx_sim.Memory; add the caller's arrays and wrap cp.empty
    with `registering_empty`); a kernel built with CLUSTER_K = S runs in clusters of S blocks along
    grid z (gemm_skinny.sasm's). Each launch is recorded as (grid, block, args, shared_mem, stream)."""
    from ptx_sim import Kernel

    def function(path, entry):
        from asmgemm.runtime import build_cache
        found = [(dict(cfg[2]), b) for cfg, b in build_cache._by_config.items() if b.cubin_path == str(path)]
        assert found, f"no build of {path} in this process"
        defines, built = found[0]
        kernel = Kernel(Path(built.ptx_path).read_text(), entry)
        names = [n for n, _ in built.params]
        cluster = (1, 1, int(defines.get("CLUSTER_K", "1")))

        def fn(grid, block, args, shared_mem=0, stream=None):
            launches.append((grid, block, args, shared_mem, stream))
            kernel.run(tuple(grid), tuple(block), dict(zip(names, args)), memory, int(shared_mem), cluster=cluster)
        return fn
    return function


def registering_empty(memory):
    """cp.empty for make_cupy's module whose arrays (the split-K workspace) `memory` knows."""
    def empty(shape, dtype=np.float64):
        x = np.zeros(shape, dtype).view(FakeArray)
        memory.add(x)
        return x
    return empty


_C_TYPES = {"0": np.float32, "1": np.float16}


def _reduce_kernel(launches: list, names: list, defines: dict) -> Callable:
    """splitk_reduce.sasm: C = alpha * sum_s W[s] + beta * C, slices added in order s = 0..S-1 in
    fp32, beta == 0 never reading C (bf16 C is not interpreted here)."""
    c_type = _C_TYPES[defines.get("C_TYPE", "0")]

    def fn(grid, block, args, shared_mem=0, stream=None):
        launches.append((grid, block, args, shared_mem, stream))
        v = dict(zip(names, args))
        m, n, ldc, splits, stride = (int(v[x]) for x in ("M", "N", "ldc", "splits", "split_stride"))
        assert grid[0] * block[0] * (4 if defines.get("VEC") == "1" else 1) >= n and grid[1] == min(m, 65535)
        w = view_of(int(v["W"]), (splits, m, n), (stride * 4, n * 4, 4), np.float32)
        acc = np.array(w[0], dtype=np.float32)
        for s in range(1, splits):
            acc += w[s]
        acc *= np.float32(v["alpha"])
        item = np.dtype(c_type).itemsize
        # C_T=1: the reduce stores C transposed (element (i, j) at C + j * ldc + i)
        c = (view_of(int(v["C"]), (n, m), (ldc * item, item), c_type).T if defines.get("C_T", "0") == "1"
             else view_of(int(v["C"]), (m, n), (ldc * item, item), c_type))
        if float(v["beta"]) != 0:
            acc += c.astype(np.float32) * np.float32(v["beta"])
        c[...] = acc.astype(c_type)
    return fn


def _pad_rows_kernel(names: list) -> Callable:
    """pad_rows.sasm (the runtime's padded copy of an operand TMA cannot read): `rows` rows of
    `row_bytes` bytes, src_pitch apart from src, to dst_pitch apart from dst (not recorded as a
    launch: the list holds the GEMMs)."""
    def fn(grid, block, args, shared_mem=0, stream=None):
        v = {k: int(x) for k, x in zip(names, args)}
        assert v["src_end"] == v["src"] + (v["rows"] - 1) * v["src_pitch"] + v["row_bytes"], "src_end"
        assert v["dst"] % 16 == 0 and v["dst_pitch"] % 16 == 0 and v["dst_pitch"] >= v["row_bytes"]
        assert grid[0] * block[0] * 16 >= v["row_bytes"] and 1 <= grid[1] <= min(v["rows"], 65535)
        for row in range(v["rows"]):
            ctypes.memmove(v["dst"] + row * v["dst_pitch"], v["src"] + row * v["src_pitch"], v["row_bytes"])
    return fn


def forget_loaded(monkeypatch) -> None:
    """Functions loaded through another test's stand-in must not be reused."""
    from asmgemm.runtime import kept_launch, pad_copy
    monkeypatch.setattr(kept_launch, "_functions", {})
    monkeypatch.setattr(kept_launch, "_modules", {})
    monkeypatch.setattr(pad_copy, "_kept", {})


def install_fakes(monkeypatch, tmp_path, specs, dtype=np.float64):
    """The stand-ins in place for one test: the spec file(s) `specs` registered through the
    environment, a private build cache, no tuning cache, a CuPy whose kernels interpret their packed
    arguments in `dtype` and a torch; returns (cupy, torch, launches). The caller clears the build
    cache's memory after the test (build_cache.clear_memory_cache())."""
    from asmgemm import kernel_spec
    from asmgemm.runtime import build_cache
    monkeypatch.setenv(kernel_spec.SPECS_ENV, str(specs))
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(Path(tmp_path) / "cache"))
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "1")
    build_cache.clear_memory_cache()
    launches: list = []
    cp = make_cupy(interpreting_kernel(launches, dtype))
    torch = make_torch()
    import sys
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "torch", torch)
    forget_loaded(monkeypatch)
    return cp, torch, launches


def read_bytes(path) -> bytes:
    return Path(path).read_bytes()
