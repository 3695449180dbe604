"""The interpreter's runs of split-K builds (tests/ptx_sim.py), shared by the kernels' split tests:
a partial pass into a workspace of S slices, and a one-launch split whose clusters' sums the
kernel adds itself (CLUSTER_K with SPLIT_FIXUP), run on one workspace and one set of counters as
the runtime keeps them (split_k.fixup_workspace_elems, fixup_counters)."""
from __future__ import annotations

import math

import numpy as np

from asmgemm.runtime import split_k
from ptx_sim import Kernel, Memory, aligned_array


def partial_pass(built, tile: tuple[int, int], m: int, n: int, splits: int, args_with):
    """The S = `splits` slices a partial pass (SPLIT_K=1) writes into a fresh workspace (NaN where
    unwritten), and the interpreter's memory; args_with(memory, workspace) makes the arguments."""
    p = built.constants
    mem = Memory()
    ws = aligned_array((splits, m, n), np.float32, np.nan)
    Kernel(built.ptx).run((math.ceil(n / tile[1]), math.ceil(m / tile[0]), splits), (p["THREADS"], 1, 1),
                          args_with(mem, ws), mem, p["SMEM_BYTES"])
    return ws, mem


def hybrid_runs(built, tile: tuple[int, int], m: int, n: int, splits: int, cluster: int, c, args_with,
                order=None, runs: int = 1):
    """C (the array `c` the arguments point at) after each of `runs` launches of a clusters-then-slices
    split on one workspace and counters, and the grid; after every launch the counters must be back
    at 0 (the last arrivals reset them for the next launch). args_with(memory, workspace pointer,
    counters pointer) makes the arguments; order: the clusters' order (ptx_sim's run)."""
    p = built.constants
    z = split_k.grid_splits(splits, cluster)
    gx, gy = math.ceil(n / tile[1]), math.ceil(m / tile[0])
    mem = Memory()
    # the slices and a tile's width more (the last block's unguarded loads past N)
    ws = aligned_array((split_k.slices(splits, cluster) * m * n + tile[1],), np.float32, np.nan)
    counters = aligned_array((split_k.fixup_counters((gx, gy, z), cluster),), np.int32, 0)
    args = args_with(mem, mem.add(ws), mem.add(counters))
    out = []
    for _ in range(runs):
        Kernel(built.ptx).run((gx, gy, z), (p["THREADS"], 1, 1), args, mem, p["SMEM_BYTES"], cluster=(1, 1, cluster),
                              order=order)
        out.append(c.copy())
        assert not counters.any(), "the last arrivals leave every counter at 0 for the next launch"
    return out, (gx, gy, z)
