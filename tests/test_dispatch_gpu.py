"""Every configuration of every catalog (kernels.toml [[NAME.config]]) computes the right C on the
GPU, in all four layouts, at three odd shapes: unsplit, and with the largest split the entry lists
(through the reduce kernel, and in clusters where the device has them). A configuration the
kernel's own guards refuse for a call (a register budget, a mode it lacks) is skipped with the
kernel's reason, as gemm() would skip it; every entry must run at least one of the calls."""
import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import all_specs, get_spec
from asmgemm.runtime.catalog import entry_candidates

pytestmark = pytest.mark.gpu

SHAPES = [(37, 45, 301), (129, 67, 1029), (3, 257, 700)]
LAYOUTS = ["nn", "nt", "tn", "tt"]
FAMILIES = sorted(name for name, spec in all_specs().items() if spec.configs)
ENTRIES = [(fam, e.name) for fam in FAMILIES for e in get_spec(fam).configs]


def _operands(cp, spec, m, n, k, layout, seed):
    rs = np.random.RandomState(seed)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = rs.uniform(-1, 1, (k, m) if ta else (m, k)).astype(np.float32)
    b = rs.uniform(-1, 1, (n, k) if tb else (k, n)).astype(np.float32)
    ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    dtype = spec.dtypes.a
    if dtype == "bfloat16":         # CuPy has no bfloat16: its bit patterns as uint16 (round to nearest even)
        def bits(x):
            u = x.view(np.uint32).astype(np.uint64)
            return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        ga, gb = cp.asarray(bits(a)), cp.asarray(bits(b))
        back = lambda h: (h.astype(np.uint32) << 16).view(np.float32)      # noqa: E731
        ref = back(bits(a)).astype(np.float64)
        ref = ((ref.T if ta else ref) @ (back(bits(b)).T if tb else back(bits(b))).astype(np.float64))
    else:
        ga, gb = cp.asarray(a.astype(dtype)), cp.asarray(b.astype(dtype))
        ref = ((a.astype(dtype).T if ta else a.astype(dtype)).astype(np.float64)
               @ (b.astype(dtype).T if tb else b.astype(dtype)).astype(np.float64))
    return ga, gb, ref, ta, tb


def _as_float(cp, spec, c):
    host = cp.asnumpy(c)
    if spec.dtypes.c == "bfloat16":
        return (host.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return host.astype(np.float64)


def _picked(conf, family, k, clusters, trans_b=0):
    """The unsplit candidate and those of the largest split the entry makes for this K."""
    cands = entry_candidates(conf, family, k, plain=True, clusters=clusters, trans_b=trans_b)
    return [cands[0]] + [c for c in cands[1:] if c.splits == max(x.splits for x in cands)]


@pytest.fixture(scope="module")
def prebuilt(cuda_gpu):
    """Every build the tests below make, made first in parallel (ptxas on every CPU; the builds a
    test makes one at a time would take minutes)."""
    from asmgemm.bench.shapes import Shape
    from asmgemm.isa.arch import arch_for
    from asmgemm.kernel_spec import DTYPE_ITEMSIZE
    from asmgemm.runtime.gpu import device_facts
    from asmgemm.runtime.plan import fresh_plan
    from asmgemm.tuning.sweep import SweepCall, prebuild

    facts = device_facts()
    clusters = "clusters" in arch_for(facts.target).features
    calls = []
    for family in FAMILIES:
        spec = get_spec(family)
        for conf in spec.configs:
            if get_spec(conf.kernel).build_target(facts.target) is None:
                continue
            for layout in LAYOUTS:
                for m, n, k in SHAPES:
                    if conf.max_m is None or (n if conf.swap else m) <= conf.max_m:
                        sizes = (DTYPE_ITEMSIZE[spec.dtypes.a], DTYPE_ITEMSIZE[spec.dtypes.c])
                        plan = fresh_plan(m, n, k, layout, *sizes)
                        plan_ct = fresh_plan(m, n, k, layout, *sizes, c_trans=True) if conf.swap else None
                        trans_b = (plan_ct or plan).call_values["trans_b"]
                        calls.append(SweepCall(Shape(m, n, k), layout, plan,
                                               tuple(_picked(conf, family, k, clusters, trans_b)), plan_ct))
    prebuild(calls, facts)
    return clusters


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family,entry", ENTRIES)
def test_every_catalog_configuration_is_correct(cuda_gpu, prebuilt, family, entry, layout):
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    from asmgemm.runtime.gpu import device_facts

    cp = cuda_gpu
    spec = get_spec(family)
    conf = next(e for e in spec.configs if e.name == entry)
    kernel = get_spec(conf.kernel)
    if kernel.build_target(device_facts().target) is None:
        pytest.skip(f"{conf.kernel} is not built for {device_facts().target}")
    clusters = prebuilt
    ran = refused = 0
    for i, (m, n, k) in enumerate(SHAPES):
        if conf.max_m is not None and (n if conf.swap else m) > conf.max_m:
            continue
        a, b, ref, ta, tb = _operands(cp, kernel, m, n, k, layout, i)
        for cand in _picked(conf, family, k, clusters):
            c = cp.full((m, n), np.nan, dtype=getattr(cp, kernel.dtypes.c) if kernel.dtypes.c != "bfloat16"
                        else cp.uint16)
            try:
                asmgemm.gemm(a, b, c, trans_a=ta, trans_b=tb, params=cand.params(), kernel=cand.kernel)
            except AsmError as exc:          # the kernel's guard refuses this call: what gemm() would skip
                refused += 1
                print(f"{cand.label} {layout} {m}x{n}x{k}: refused: {exc.message.splitlines()[0]}")
                continue
            cp.cuda.Device().synchronize()
            got = _as_float(cp, kernel, c)
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert err <= kernel.rel_err_limit, f"{cand.label} {layout} {m}x{n}x{k}: relative error {err:.2e}"
            launch = last_launch()
            assert launch["kernel"] == cand.kernel and launch["splits"] == cand.splits, (cand.label, launch)
            ran += 1
    if not ran and refused:
        pytest.skip(f"{family}:{entry} {layout}: the kernel refuses every call of this layout")
