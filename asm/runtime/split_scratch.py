"""Scratch memory kept between calls, per (device, stream): split-K's fp32 workspace of the slices
and the int32 arrival counters of a one-launch split (split_k.in_kernel_fixup), and the padded
storage an operand TMA cannot read is copied into (gemm's copy path: `buffer`, one per operand).

Allocating the workspace per call from the arrays' pool cost ~3 us of host time a split call on
the H100 (issue 32); kept, a repeated call allocates nothing. What is kept:
  * per (device, stream): a stream's launches run one after another, so they may share one
    workspace and one counter array. Two streams never share them: two launches counting on the
    same tile's counter at once would race (a block could count another launch's arrivals and
    sum slices that are not yet written), and two partial passes would write the same slices.
  * grown, never shrunk, when a call needs more (to twice the old size at least, so a run of
    growing shapes allocates a few times, not once a shape); the old memory goes back to the
    arrays' pool once the call that replaced it is queued (the pools reuse it in stream order).
  * the counters zeroed once, by a fill on the stream when they are allocated; from then on
    the kernel's last block of each tile resets its tile's counter (mma_gemm.sasm's atom.inc).
  * a workspace over WORKSPACE_CAP_BYTES is not kept: such a call takes one from the pool and
    gives it back, as every split did before (a few microseconds beside a multi-megabyte reduce).
  * while the stream is capturing a CUDA graph nothing kept is used, made or grown: the graph
    bakes in its pointers, which must stay valid for every replay, while the kept memory may be
    grown (and the old given back) by a later call; so the captured call takes its workspace and
    counters from the arrays' pool during the capture (the graph's pool under torch), the
    counters' zeroing captured as a node before the launch, as every split did before.

A padded copy's storage follows the same rules (kept per stream and grown, per call while the
stream captures a graph). Kept, its address stays the same from call to call, so the kernel's
tensor map for it is encoded once (runtime/launch.py keeps the map of the last address), and a
repeated call's copy is one launch (pad_copy.py; a cudaMemcpy2DAsync before) with no allocation
(issue 31: "no per-call allocation or host work beyond the copy launch itself"). On the H100, before (2026-11-28, `tools/host_profile.py
5546 2800 14 --dtype bfloat16 --layout nt`: B copied), a loop ran 65.7 us a call, host-bound (the
copy and the kernel take 21 us of GPU), against torch.matmul's 21.0: a third of it the allocation
and torch's copy_ of the padded operand.

Threads: two threads launching on one stream share its scratch, and their copies and launches
could interleave (one thread's copy overwriting the storage the other's kernel is about to read;
a partial pass between another's partial pass and reduce): `lock(...)` is held from a call's first
use of the stream's scratch until its last launch is queued."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

WORKSPACE_CAP_BYTES = 256 << 20     # the most workspace kept per (device, stream)
FLOAT_BYTES = 4


WORKSPACE = "workspace"             # split-K's fp32 slices, among the kept arrays' slots


@dataclass
class _Kept:
    # the arrays (of the library of the call that made them: the stream's calls may mix CuPy and
    # torch, so their pointers are kept as numbers) and their sizes
    # by slot (WORKSPACE; "A", "B": padded operand copies): (array, pointer, elements)
    buffers: dict = field(default_factory=dict)
    counters: object = None          # an int32 array, all zero between launches
    counters_ptr: int = 0
    counter_count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Scratch(NamedTuple):
    """One call's scratch: the pointers, and what the caller holds until the launch is queued
    (per-call arrays; empty where everything was kept). A tuple: made on every split call, where a
    frozen dataclass was slower to make; with take's repeated-call branch, take went from 2.2 to 0.6
    us a call on the H200's host (a loop of 20,000, one core)."""
    workspace_ptr: int
    counters_ptr: int
    held: tuple = ()


class SplitScratch:
    """The kept workspaces and counters of this process, per (CuPy module, device, stream pointer)
    (the module: a process has one, but a test's stand-in CuPy has memory of its own)."""

    def __init__(self, cap_bytes: int = WORKSPACE_CAP_BYTES):
        self.cap_bytes = cap_bytes
        self._kept: dict[tuple[object, int, int], _Kept] = {}

    def kept(self, arrays, device: int, stream_ptr: int) -> tuple[int, int]:
        """(workspace elements, counters) kept for this stream (0, 0 when none): for tests and reports."""
        k = self._kept.get((arrays.cupy, device, stream_ptr))
        return (k.buffers.get(WORKSPACE, (None, 0, 0))[2], k.counter_count) if k is not None else (0, 0)

    def lock(self, arrays, device: int, stream_ptr: int) -> threading.Lock:
        """The stream's lock (module docstring: "Threads")."""
        return self._entry(arrays, device, stream_ptr).lock

    def _entry(self, arrays, device: int, stream_ptr: int) -> _Kept:
        key = (arrays.cupy, device, stream_ptr)
        k = self._kept.get(key)
        if k is None:
            k = self._kept.setdefault(key, _Kept())
        return k

    def buffer(self, arrays, like, device: int, stream_ptr: int, slot: str, nbytes: int,
               capturing: bool = False) -> tuple[int, tuple]:
        """(pointer, held) of at least `nbytes` of storage for `slot` (e.g. a padded copy of "A")
        on this stream, 16-byte aligned: kept and grown (at least twofold) like the workspace; a
        fresh allocation held by the caller until its launch is queued while the stream captures a
        graph or above the cap."""
        if capturing:
            fresh = arrays.empty(like, (max(nbytes, 1),), "uint8")
            return arrays.ptr(fresh), (fresh,)
        return self._grown(arrays, like, self._entry(arrays, device, stream_ptr), slot, nbytes, "uint8", 1)

    def _grown(self, arrays, like, k: _Kept, slot: str, count: int, dtype: str, itemsize: int) -> tuple[int, tuple]:
        """(pointer, held) of at least `count` elements of `dtype` kept in k under `slot`: grown at
        least twofold, up to the cap (the old array is dropped here: the pool reuses it in stream
        order); past the cap a fresh array, held by the caller until its launch is queued."""
        if count * itemsize > self.cap_bytes:
            fresh = arrays.empty(like, (count,), dtype)
            return arrays.ptr(fresh), (fresh,)
        have = k.buffers.get(slot)
        if have is None or have[2] < count:
            grown = min(max(count, 2 * have[2] if have else 0), self.cap_bytes // itemsize)
            fresh = arrays.empty(like, (grown,), dtype)
            have = k.buffers[slot] = (fresh, arrays.ptr(fresh), grown)
        return have[1], ()

    def forget(self) -> None:
        """Drop everything kept (the arrays go back to their pools)."""
        self._kept.clear()

    def take(self, arrays, like, device: int, stream_ptr: int, workspace_elems: int, counters: int,
             capturing: bool = False) -> Scratch:
        """The scratch of one split call on `stream_ptr`: a workspace of at least workspace_elems
        floats (16-byte aligned: the pools' alignment) and, where counters > 0, that many int32
        counters that are zero (those kept: zeroed when allocated, reset by every launch since).
        `like`: an array of the call (its device and library); `capturing`: the stream is
        capturing a CUDA graph (the module docstring)."""
        if capturing:
            return self._per_call(arrays, like, workspace_elems, counters)
        k = self._entry(arrays, device, stream_ptr)
        have = k.buffers.get(WORKSPACE)
        if have is not None and have[2] >= workspace_elems and k.counter_count >= counters:
            # the repeated call: everything kept is large enough
            return Scratch(have[1], k.counters_ptr if counters > 0 else 0)
        ws_ptr, held = self._grown(arrays, like, k, WORKSPACE, workspace_elems, "float32", FLOAT_BYTES)
        ctr_ptr = 0
        if counters > 0:
            if k.counter_count < counters:
                grown = max(counters, 2 * k.counter_count)
                fresh = arrays.empty(like, (grown,), "int32")
                arrays.zero(fresh)          # on the call's stream, before the launch that counts on it
                k.counters, k.counters_ptr, k.counter_count = fresh, arrays.ptr(fresh), grown
            ctr_ptr = k.counters_ptr
        return Scratch(ws_ptr, ctr_ptr, held)

    @staticmethod
    def _per_call(arrays, like, workspace_elems: int, counters: int) -> Scratch:
        ws = arrays.empty(like, (workspace_elems,), "float32")
        held = [ws]
        ctr_ptr = 0
        if counters > 0:
            ctr = arrays.empty(like, (counters,), "int32")
            arrays.zero(ctr)
            held.append(ctr)
            ctr_ptr = arrays.ptr(ctr)
        return Scratch(arrays.ptr(ws), ctr_ptr, tuple(held))


# the process's kept scratch (gemm.py's split calls)
SCRATCH = SplitScratch()


def stream_capturing(cupy, stream_ptr: int) -> bool:
    """Whether the stream is capturing a CUDA graph (cudaStreamIsCapturing; a CuPy without the
    call, or a stand-in: no)."""
    query = getattr(getattr(getattr(cupy, "cuda", None), "runtime", None), "streamIsCapturing", None)
    if query is None:
        return False
    try:
        return int(query(stream_ptr)) != 0
    except Exception:   # CUDARuntimeError: a stream the runtime does not know is not capturing one of ours
        return False
