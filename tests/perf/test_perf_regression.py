"""Performance regression tests: rerun the bench for every entry of this GPU's baseline
(tests/perf/baselines/<GPU>.json, written by `asmgemm bench --save-baseline`) and fail when a kernel's
ratio to cuBLAS dropped more than the tolerance below the stored one.

Tolerance: the baseline file's "tolerance" (0.05 = a 5 % relative drop), an entry's own
"tolerance", or $ASMGEMM_PERF_TOLERANCE over both. A first measurement under the line is repeated
once and the better ratio kept, so a single noisy run does not fail the suite; two do.
$ASMGEMM_BASELINE_DIR points at another folder of baselines; $ASMGEMM_PERF_REPS sets repetitions.
Marked `perf` (and `gpu`): skipped without a GPU, and for baselines of other GPU models.
"""
import os
from pathlib import Path

import pytest

from asmgemm.bench import baseline as bl

pytestmark = [pytest.mark.perf, pytest.mark.gpu]


def _baseline_dir() -> Path:
    """$ASMGEMM_BASELINE_DIR, else the baselines beside this file (wherever the package is installed)."""
    env = os.environ.get("ASMGEMM_BASELINE_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "baselines"


def _baseline_cases():
    folder = _baseline_dir()
    cases = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = bl.load_baseline(path)
        except Exception:  # a broken baseline file is a failing test, not a collection error
            cases.append(pytest.param(str(path), None, None, id=f"{path.stem}-unreadable"))
            continue
        for key in data["entries"]:
            cases.append(pytest.param(str(path), data["gpu"], key, id=f"{path.stem}-{key}"))
    return cases or [pytest.param(None, None, None, id="no-baselines")]


@pytest.fixture(scope="module")
def gpu(cuda_gpu):
    from asmgemm.runtime.gpu import gpu_name
    from asmgemm.bench.timing import L2Flusher
    return cuda_gpu, gpu_name(), L2Flusher()


@pytest.mark.parametrize("path, gpu_model, key", _baseline_cases())
def test_ratio_to_cublas_did_not_regress(gpu, path, gpu_model, key):
    cp, name, flush = gpu
    if path is None:
        pytest.skip(f"no baseline files in {_baseline_dir()}")
    data = bl.load_baseline(path)   # raises (fails) for a broken file
    if data["gpu"] != name:
        pytest.skip(f"baseline for {data['gpu']}, this GPU is {name}")
    from asmgemm.kernel_spec import get_spec
    from asmgemm.bench.runner import bench_one
    from asmgemm.runtime.tune_cache import lookups_off
    from asmgemm.bench.shapes import Shape

    e = data["entries"][key]
    kernel = get_spec(e["kernel"])
    shape = Shape(e["m"], e["n"], e["k"])
    reps = int(os.environ.get("ASMGEMM_PERF_REPS", "20"))
    tol_env = os.environ.get("ASMGEMM_PERF_TOLERANCE")
    tolerance = float(tol_env) if tol_env else None

    def measure(seed):
        # like `asmgemm bench --save-baseline`: gemm() as users get it untuned (no tuning cache)
        with lookups_off():
            row = bench_one(cp, kernel, shape, e["layout"], reps=reps, warmup=3, params=None,
                            params_source="defaults", flush=flush, seed=seed)
        assert row.error is None, f"{key}: {row.error}"
        assert row.ratio() is not None, f"{key}: no ratio to cuBLAS ({'; '.join(row.notes)})"
        return row.ratio()

    ratio = measure(0)
    comp = bl.compare({**data, "entries": {key: e}}, {key: ratio}, tolerance)[0]
    if comp.status == "regressed":
        ratio = max(ratio, measure(1))
        comp = bl.compare({**data, "entries": {key: e}}, {key: ratio}, tolerance)[0]
    print(comp.message())
    assert comp.status != "regressed", "performance regression: " + comp.message()
