"""A stand-in CuPy for driving `asmgemm.gemm` to the launch on a machine without a GPU: arrays are
numpy arrays with a device and a real data pointer, and RawModule's functions are whatever the
test supplies (a recorder, or an interpreter of the kernel's packed arguments)."""
from __future__ import annotations

import types
from pathlib import Path
from typing import Callable

import numpy as np


class Device:
    def __init__(self, id=0):
        self.id = 0
        self.compute_capability = "90"
        self.attributes = {"MultiProcessorCount": 132}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeArray(np.ndarray):
    @property
    def device(self):
        return Device()

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


def make_cupy(function: Callable[[str, str], Callable], name: str = "Fake GPU") -> types.ModuleType:
    """A cupy module whose RawModule(path).get_function(entry) returns function(path, entry)."""
    cp = types.ModuleType("cupy")
    cp.ndarray = FakeArray
    cp.empty = lambda shape, dtype=np.float64: np.zeros(shape, dtype).view(FakeArray)

    class RawModule:
        def __init__(self, path):
            self.path = path

        def get_function(self, entry):
            return function(self.path, entry)
    cp.RawModule = RawModule
    cp.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda d: {"name": name.encode()}),
        Device=Device)
    return cp


def forget_loaded(monkeypatch) -> None:
    """Functions loaded through another test's stand-in must not be reused."""
    from asmgemm.runtime import gemm
    monkeypatch.setattr(gemm, "_functions", {})
    monkeypatch.setattr(gemm, "_modules", {})


def read_bytes(path) -> bytes:
    return Path(path).read_bytes()
