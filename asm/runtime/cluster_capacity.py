"""How many clusters of a kernel's size the GPU runs at once: the driver's answer
(cuOccupancyMaxActiveClusters, through NVIDIA's cuda-bindings), which caps a persistent grid.

A persistent kernel's grid is min(units, SMs / cluster) clusters, each walking units until none are
left. Clusters of 4 or 8 blocks do not pack the SMs fully: the H100's GPCs hold 30 clusters of 4 of
hgemm (120 of its 132 SMs), so a grid of 33 would run its last three only after three others had
walked their whole share. Asked once per (kernel build, device) when a launch plan is made; None
where the driver cannot say (no cuda-bindings, a stand-in CuPy, an unclustered kernel), and the
grid keeps its SMs / cluster bound."""
from __future__ import annotations

from .gpu import function_handle

_cache: dict[tuple[str, int], int | None] = {}


def max_active_clusters(fn, built, device: int) -> int | None:
    """Clusters of `built`'s size (`built.cluster` blocks along x, `built.threads` threads,
    `built.smem_bytes` of dynamic shared memory) that device `device` runs at once, for CuPy's loaded
    function `fn` (its max dynamic shared memory already set); None for an unclustered kernel or
    where the driver cannot answer."""
    if built.cluster <= 1:
        return None
    key = (built.key, device)
    if key not in _cache:
        _cache[key] = _query(fn, built)
    return _cache[key]


def _query(fn, built) -> int | None:
    handle = function_handle(fn)
    if handle is None:
        return None
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    try:
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = built.cluster, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = built.threads, 1, 1
        config.sharedMemBytes = built.smem_bytes
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = built.cluster, 1, 1
        config.attrs = [attr]
        config.numAttrs = 1
        err, count = driver.cuOccupancyMaxActiveClusters(driver.CUfunction(handle), config)
    except Exception:  # an older cuda-bindings without these names: keep the SMs / cluster bound
        return None
    if err != driver.CUresult.CUDA_SUCCESS or int(count) <= 0:
        return None
    return int(count)
