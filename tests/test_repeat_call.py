"""gemm's repeated call on torch tensors (runtime/gemm.py _repeat_call: key, kept launch, new C,
cuLaunchKernel, in one function), on the CPU: the stand-in CuPy with the driver's launch
(fake_cupy.with_raw_launch, which reads the kept parameter block as the driver would and runs the
interpreting kernel on it) and the stand-in torch. A repeated call must give the C the whole way
gives, launch on torch's current stream, and go the whole way again whenever anything its kept
launch was made under changed."""
from __future__ import annotations

import numpy as np
import pytest

from asmgemm import kernel_spec
from fake_cupy import Device, Tensor, make_torch, with_raw_launch
from test_host_overhead import gpu  # noqa: F401  (the fixture: tiny kernel, stand-in CuPy, counters)
from test_host_overhead import rand


def _counted_gpu(gpu, monkeypatch):
    """`gpu` with the driver's launch, the spec files looked at only when a test asks (the first
    call's build takes longer than SPEC_RECHECK_S), and a count of the calls that went the whole way."""
    import sys

    from asmgemm.runtime import gemm as gemm_module
    gpu.raw = with_raw_launch(sys.modules["cupy"])
    gpu.whole_way = 0
    monkeypatch.setattr(kernel_spec, "SPEC_RECHECK_S", 3600.0)
    real = gemm_module._gemm

    def counted(*args, **kw):
        gpu.whole_way += 1
        return real(*args, **kw)
    monkeypatch.setattr(gemm_module, "_gemm", counted)
    return gpu


@pytest.fixture
def cupy_gpu(gpu, monkeypatch):  # noqa: F811
    return _counted_gpu(gpu, monkeypatch)


@pytest.fixture
def torch_gpu(gpu, monkeypatch):  # noqa: F811
    """_counted_gpu with the stand-in torch (its raw stream query answering 0x5150)."""
    import sys

    from asmgemm.runtime import gemm as gemm_module
    gpu = _counted_gpu(gpu, monkeypatch)
    torch = make_torch()
    torch.stream_ptr[0] = 0x5150
    monkeypatch.setitem(sys.modules, "torch", torch)
    gpu.torch = torch
    # no arming left over from another test's torch module
    monkeypatch.setattr(gemm_module, "_repeat", gemm_module._repeat._replace(tensor=gemm_module._Unarmed))
    return gpu


def tensor(gpu, x):
    return gpu.torch.from_numpy(np.asarray(x))


def product(gpu, a, b, *, alpha=1.0, ta=False, tb=False):
    """gemm(a, b) on torch tensors against numpy."""
    import asmgemm
    out = asmgemm.gemm(tensor(gpu, a), tensor(gpu, b), alpha=alpha, trans_a=ta, trans_b=tb)
    assert type(out) is Tensor
    a_, b_ = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(out.numpy(), alpha * ((a_.T if ta else a_) @ (b_.T if tb else b_)),
                               rtol=1e-12, atol=1e-12)
    return out


def test_a_repeated_call_launches_from_the_one_function(torch_gpu):
    gpu = torch_gpu
    product(gpu, rand(37, 29), rand(29, 45))
    assert gpu.whole_way == 1
    outs = []
    for i in range(4):      # new operands each time (other pointers), alpha per call
        outs.append(product(gpu, rand(37, 29, seed=10 + i), rand(29, 45, seed=20 + i), alpha=0.5 + i))
    assert gpu.whole_way == 1 and gpu.counts["plan_launch"] == 1
    assert len(gpu.raw) == 5 and {r[4] for r in gpu.raw} == {0x5150}    # torch's current stream
    assert len({o.data_ptr() for o in outs}) == 4                         # a new C every call
    gpu.torch.stream_ptr[0] = 0x6160                                       # the stream is asked per call
    product(gpu, rand(37, 29), rand(29, 45))
    assert gpu.raw[-1][4] == 0x6160 and gpu.whole_way == 1


def test_every_layout_gets_its_own_kept_launch_and_the_right_c(torch_gpu):
    gpu = torch_gpu
    m, n, k = 23, 17, 11
    big = rand(40, 40, seed=9)
    cases = [
        (rand(m, k), rand(k, n), False, False),
        (rand(k, m), rand(n, k), True, True),
        (rand(m, k, order="F"), rand(k, n, order="F"), False, False),
        (big[:m, :k], rand(k, n), False, False),
        (big[1:m + 1, 1:k + 1], rand(k, n), False, False),             # an 8-byte offset
        (rand(m, k), rand(n, k).T, False, False),
        (rand(m, k), rand(n, k), False, True),
    ]
    for _ in range(3):
        for a, b, ta, tb in cases:
            product(gpu, a, b, alpha=0.75, ta=ta, tb=tb)
    assert gpu.whole_way == len(cases) and gpu.counts["plan_launch"] == len(cases)


def test_a_changed_environment_or_spec_goes_the_whole_way(torch_gpu, monkeypatch):
    gpu = torch_gpu
    a, b = rand(20, 10), rand(10, 30)
    product(gpu, a, b)
    product(gpu, a, b)
    assert gpu.whole_way == 1
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "0")         # the tuning cache's switch: another key
    product(gpu, a, b)
    assert gpu.whole_way == 2 and gpu.counts["plan_launch"] == 2
    product(gpu, a, b)
    assert gpu.whole_way == 2
    monkeypatch.setenv(kernel_spec.SPECS_ENV, str(gpu.specs / "tiny_dgemm.toml"))   # the same value, set again
    product(gpu, a, b)
    assert gpu.whole_way == 3
    kernel_spec.refresh_specs()                               # the spec files looked at on the next call
    product(gpu, a, b)
    assert gpu.whole_way == 4
    monkeypatch.setattr(kernel_spec, "SPEC_RECHECK_S", 0.0)   # looked at on every call
    product(gpu, a, b)
    product(gpu, a, b)
    assert gpu.whole_way == 6 and gpu.counts["plan_launch"] == 2


def test_registered_specs_and_forgotten_plans_go_the_whole_way(torch_gpu):
    from asmgemm.runtime import gemm as gemm_module
    gpu = torch_gpu
    a, b = rand(20, 10), rand(10, 30)
    product(gpu, a, b)
    (spec,) = kernel_spec.load_spec_file(gpu.specs / "tiny_dgemm.toml")
    kernel_spec.register(spec.__class__(**{**spec.__dict__, "name": "tiny_again"}))
    try:
        product(gpu, a, b)
        assert gpu.whole_way == 2 and gpu.counts["plan_launch"] == 2
    finally:
        kernel_spec.unregister("tiny_again")
    product(gpu, a, b)
    gemm_module.forget_tuned_choices()
    product(gpu, a, b)
    product(gpu, a, b)
    assert gpu.whole_way == 4 and gpu.counts["plan_launch"] == 4


def test_a_rebuilt_kernel_goes_the_whole_way(torch_gpu):
    from asmgemm.runtime import build_cache
    gpu = torch_gpu
    a, b = rand(20, 10), rand(10, 30)
    product(gpu, a, b)
    source = gpu.specs / "tiny_dgemm.sasm"
    source.write_text(source.read_text() + "\n// edited: another kernel-cache key\n")
    build_cache.clear_memory_cache()
    product(gpu, a, b)
    product(gpu, a, b)
    assert gpu.whole_way == 2 and gpu.counts["build_kernel"] == 2 and len(gpu.loads) == 2


def test_a_new_c_aligned_otherwise_than_planned_goes_the_whole_way(torch_gpu, monkeypatch):
    gpu = torch_gpu
    a, b = rand(20, 10), rand(10, 30)
    product(gpu, a, b)
    real = Tensor.new_empty_strided
    shifted = []

    def once_shifted(self, size, stride, dtype=None):
        if shifted:
            return real(self, size, stride, dtype)
        shifted.append(1)
        flat = np.full(int(np.prod(size)) + 1, np.nan)
        return Tensor(flat[1:].reshape(size), self.dtype, 0)      # 8 bytes past an aligned start
    monkeypatch.setattr(Tensor, "new_empty_strided", once_shifted)
    product(gpu, a, b)
    assert shifted and gpu.whole_way == 2


def test_another_current_device_launches_on_the_plans(torch_gpu, monkeypatch):
    gpu = torch_gpu
    a, b = rand(20, 10), rand(10, 30)
    product(gpu, a, b)
    seen = []
    real_enter = Device.__enter__

    def entered(self):
        seen.append(self.id)
        return real_enter(self)
    monkeypatch.setattr(Device, "__enter__", entered)
    monkeypatch.setattr(Device, "current", [1])
    product(gpu, a, b)
    assert seen == [0] and gpu.whole_way == 1 and Device.current[0] == 1


def test_a_kept_launch_with_copies_repeats_without_planning(torch_gpu, monkeypatch):
    """A plan whose operand is copied to padded rows first (the tiny kernel standing in for a TMA
    kernel) is not one cuLaunchKernel: the repeated call copies through the stream's kept scratch,
    as the whole way does, without planning again."""
    from asmgemm.runtime import launch_config
    monkeypatch.setattr(launch_config, "takes_tensor_maps", lambda spec: True)
    gpu = torch_gpu
    for i in range(3):
        product(gpu, rand(9, 3, seed=i), rand(3, 6, seed=5 + i))     # rows of 3 doubles: A copied
    assert gpu.whole_way == 1 and gpu.counts["plan_launch"] == 2
    assert [r[0] for r in gpu.raw].count("tiny_dgemm") == 3


def test_cupy_arrays_with_a_given_c_repeat_from_the_one_function(cupy_gpu):
    from test_host_overhead import check
    gpu = cupy_gpu
    check(rand(37, 29), rand(29, 45), rand(37, 45), alpha=0.5, beta=-2.0)
    for i in range(3):          # new operands and C, alpha and beta per call
        check(rand(37, 29, seed=i), rand(29, 45, seed=5 + i), rand(37, 45, seed=9 + i), alpha=1.5 + i, beta=0.25 * i)
    assert gpu.whole_way == 1 and len(gpu.raw) == 4 and {r[4] for r in gpu.raw} == {0}   # CuPy's current stream
    check(rand(29, 37, order="F").T, rand(29, 45), rand(37, 45, order="F"), alpha=0.75, beta=0.5)   # the swap
    check(rand(29, 37, order="F").T, rand(29, 45, seed=3), rand(37, 45, order="F", seed=4), alpha=0.75, beta=0.5)
    assert gpu.whole_way == 2


def test_a_given_c_that_overlaps_an_operand_goes_the_whole_way(cupy_gpu):
    import asmgemm
    from asmgemm.errors import AsmError
    gpu = cupy_gpu
    a, b = rand(30, 30), rand(30, 30, seed=1)
    asmgemm.gemm(a, b, rand(30, 30, seed=2))
    asmgemm.gemm(a, b, rand(30, 30, seed=3))
    assert gpu.whole_way == 1
    with pytest.raises(AsmError, match="overlap|share"):
        asmgemm.gemm(a, b, a)
    with pytest.raises(AsmError, match="needs a C to scale"):
        asmgemm.gemm(a, b, beta=0.5)


def test_torch_tensors_with_a_given_c(torch_gpu):
    import asmgemm
    gpu = torch_gpu
    for i in range(3):
        a, b, c = (tensor(gpu, rand(20, 10, seed=i)), tensor(gpu, rand(10, 30, seed=4 + i)),
                   tensor(gpu, rand(20, 30, seed=8 + i)))
        c0 = c.numpy().copy()
        out = asmgemm.gemm(a, b, c, alpha=2.0, beta=0.5)
        assert out is c
        np.testing.assert_allclose(c.numpy(), 2.0 * a.numpy() @ b.numpy() + 0.5 * c0, rtol=1e-12)
    assert gpu.whole_way == 1


@pytest.mark.parametrize("library", ["torch", "cupy"])
def test_host_profiles_pieces_are_the_one_functions_steps(torch_gpu, library):
    """tools/host_profile.py --pieces times the steps of _repeat_call (the path a loop's call takes),
    each alone, with the kept launch's own key: a key this tool built wrong would raise."""
    import importlib.util
    import sys
    from pathlib import Path
    tool = Path(__file__).resolve().parent.parent / "tools" / "host_profile.py"
    spec = importlib.util.spec_from_file_location("host_profile", tool)
    host_profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_profile)
    a, b = rand(20, 10), rand(10, 30)
    if library == "torch":
        a, b = tensor(torch_gpu, a), tensor(torch_gpu, b)
    rows = host_profile.pieces(sys.modules["cupy"], a, b, False, False, 5, lambda: None)
    names = [name for name, _ in rows]
    assert names[:2] == ["the checks (environment, specs token, CuPy)", "A's and B's keys"]
    assert "driver launch" in names and names[-1] == "the whole call" and rows[-1][1] > 0


@pytest.mark.parametrize("library", ["torch", "cupy"])
def test_the_repeated_call_makes_few_python_calls_of_its_own(torch_gpu, library):
    """The point of the one function: a repeated call runs gemm, _repeat_call and what the launch
    itself needs (the plan's currency check, the parameter block's write), not the whole way's ~25
    Python calls. Counted with sys.setprofile over asmgemm's own code (the stand-ins' calls left
    out): a regression that routes the loop's call the long way again fails here, on the CPU."""
    import sys
    from pathlib import Path

    import asmgemm
    package = str(Path(asmgemm.__file__).parent)
    a, b = rand(20, 10), rand(10, 30)
    if library == "torch":
        a, b = tensor(torch_gpu, a), tensor(torch_gpu, b)
    asmgemm.gemm(a, b)
    asmgemm.gemm(a, b)
    seen = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            seen.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        asmgemm.gemm(a, b)
    finally:
        sys.setprofile(None)
    assert seen[:2] == ["gemm", "_repeat_call"] and "_gemm" not in seen, seen
    assert len(seen) <= 6, seen         # now 5: gemm, _repeat_call, current, write, _same_scalars


@pytest.mark.parametrize("raw", [True, False], ids=["driver launch", "cupy call"])
@pytest.mark.parametrize("kw,names", [
    (dict(kernel=["tiny_dgemm"]), "kernel takes a kernel spec's name"), (dict(kernel=5), "kernel takes"),
    (dict(trans_a=[1]), "trans_a takes True or False"), (dict(trans_b="yes"), "trans_b takes True or False"),
    (dict(alpha="x"), "alpha takes a real number"), (dict(beta=1 + 2j), "beta takes a real number"),
    (dict(alpha=2.0, beta="y"), "beta takes a real number"),     # alpha converted, then beta fails
    (dict(params="BK=16"), "params takes a dict"),
])
def test_options_of_the_wrong_kind_are_asm_errors_and_leave_the_kept_launch_right(gpu, monkeypatch, raw, kw,  # noqa: F811
                                                                                    names):
    """An option of the wrong kind, on a call whose plan is kept (the repeated call's path armed),
    is an AsmError naming the argument, not Python's TypeError / ValueError from deep in the
    runtime; the next good call on that plan gives the right C (a scalar that failed to convert
    left no stale alpha or beta in the parameter block)."""
    import asmgemm
    from asmgemm.errors import AsmError
    from test_host_overhead import check
    g = _counted_gpu(gpu, monkeypatch) if raw else gpu
    a, b = rand(30, 30), rand(30, 30, seed=1)
    check(a, b, rand(30, 30, seed=2), alpha=0.5, beta=0.25)
    check(a, b, rand(30, 30, seed=3), alpha=0.5, beta=0.25)
    with pytest.raises(AsmError, match=names):
        asmgemm.gemm(a, b, rand(30, 30, seed=4), **{"alpha": 0.5, "beta": 0.25, **kw})
    check(a, b, rand(30, 30, seed=5), alpha=0.5, beta=0.25)
    check(a, b, rand(30, 30, seed=6), alpha=-3.0, beta=2.0)
    if raw:
        assert g.whole_way <= 3        # the first call, the bad one, and at most one more
