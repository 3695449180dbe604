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

_cache: dict[tuple[str, int, int], int | None] = {}


def max_active_clusters(fn, built, device: int, along_z: int = 0) -> int | None:
    """Clusters of `built`'s size (`built.cluster` blocks along x, `built.threads` threads,
    `built.smem_bytes` of dynamic shared memory) that device `device` runs at once, for CuPy's loaded
    function `fn` (its max dynamic shared memory already set); None for an unclustered kernel or
    where the driver cannot answer. along_z = S > 1: clusters of S blocks along z instead (split-K's
    CLUSTER_K, whose `.reqnctapercluster` is 1, 1, S)."""
    if built.cluster <= 1 and along_z <= 1:
        return None
    key = (built.key, device, along_z)
    if key not in _cache:
        _cache[key] = _query(fn, built, along_z)
    return _cache[key]


def _query(fn, built, along_z: int = 0) -> int | None:
    handle = function_handle(fn)
    if handle is None:
        return None
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    try:
        config = driver.CUlaunchConfig()
        dims = (1, 1, along_z) if along_z > 1 else (built.cluster, 1, 1)
        config.gridDimX, config.gridDimY, config.gridDimZ = dims
        config.blockDimX, config.blockDimY, config.blockDimZ = built.threads, 1, 1
        config.sharedMemBytes = built.smem_bytes
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = dims
        config.attrs = [attr]
        config.numAttrs = 1
        err, count = driver.cuOccupancyMaxActiveClusters(driver.CUfunction(handle), config)
    except Exception:  # an older cuda-bindings without these names: keep the SMs / cluster bound
        return None
    if err != driver.CUresult.CUDA_SUCCESS or int(count) <= 0:
        return None
    return int(count)


_blocks: dict[tuple[str, int], int | None] = {}


def blocks_per_sm(fn, built, device: int) -> int | None:
    """Blocks of `built` one SM holds at once, the driver's answer
    (cuOccupancyMaxActiveBlocksPerMultiprocessor with its threads and dynamic shared memory: the
    cost model's r, measured by the sweep); None where the driver cannot say."""
    key = (built.key, device)
    if key not in _blocks:
        _blocks[key] = _query_blocks(fn, built)
    return _blocks[key]


def _query_blocks(fn, built) -> int | None:
    handle = function_handle(fn)
    if handle is None:
        return None
    try:
        from cuda.bindings import driver
        err, count = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(driver.CUfunction(handle), built.threads,
                                                                         built.smem_bytes)
    except Exception:
        return None
    if err != driver.CUresult.CUDA_SUCCESS or int(count) <= 0:
        return None
    return int(count)
