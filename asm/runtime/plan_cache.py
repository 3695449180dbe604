"""The kept launches of `asmgemm.gemm`, by call key, and what they were made under.

A call's key holds everything its launch depends on (shapes, strides, dtypes, 16-byte alignment
of each pointer, device, flags, params, kernel); a repeated call finds its KeptLaunch here and only
fills in pointers and scalars. Every kept launch was made under one set of kernel specs
(kernel_spec.specs_version) and one CuPy module: when either changes, all of them go. The array
adapters of that CuPy module (and of torch, once a torch tensor comes) live here too, so that the
repeated call path makes none.
"""
from __future__ import annotations

from ..kernel_spec import specs_version
from .arrays import CupyArrays, TorchArrays
from .kept_launch import KeptLaunch

MAX_PLANS = 4096                 # launches kept; the oldest goes first


class PlanCache:
    """Kept launches by call key, valid for one specs version and one CuPy module."""

    __slots__ = ("specs_token", "cupy", "cupy_arrays", "torch_arrays", "plans")

    def __init__(self):
        self.specs_token = None                       # kernel_spec.specs_version() the plans were made under
        self.cupy = None                              # the CuPy module they were loaded with
        self.cupy_arrays: CupyArrays | None = None
        self.torch_arrays: TorchArrays | None = None  # made on the first torch call
        self.plans: dict[tuple, KeptLaunch] = {}

    def current(self, cupy) -> "PlanCache":
        """This cache, emptied first when the kernel specs or the CuPy module changed since the
        plans were made (a test's stand-in CuPy is another module)."""
        token = specs_version()
        if token is not self.specs_token or cupy is not self.cupy:
            self.plans.clear()
            self.specs_token, self.cupy = token, cupy
            self.cupy_arrays, self.torch_arrays = CupyArrays(cupy), None
        return self

    def torch(self, cupy, torch) -> TorchArrays:
        """The adapter for this torch module (made on first use)."""
        if self.torch_arrays is None or self.torch_arrays.torch is not torch:
            self.torch_arrays = TorchArrays(cupy, torch)
        return self.torch_arrays

    def get(self, key) -> KeptLaunch | None:
        return self.plans.get(key)

    def keep(self, key, kept: KeptLaunch) -> None:
        if len(self.plans) >= MAX_PLANS:
            del self.plans[next(iter(self.plans))]
        self.plans[key] = kept

    def clear(self) -> None:
        self.plans.clear()

    def __len__(self) -> int:
        return len(self.plans)
