"""The cost model that ranks a call's candidates (catalog.py): modelled seconds per candidate, with
every term kept so `asmgemm explain` can say why one lost.

For a candidate with blocks of BM x BN x BK, S splits, r blocks resident per SM and P = SMs x r
slots (cluster candidates: the slots the driver says their clusters fill):

    tiles      T = (ceil(M / BM) G + E) ceil(N / BN) S      G: a batched launch's batch (grid z), E: a
                                                          grouped launch's experts (each at most one
                                                          partial tile row more); 1 and 0 otherwise
    steps      s = ceil(ceil(K / S) / BK)                 K steps of one block
    block      t = a + b s v                              one block's time while r share its SM; v the
                                                          factor of the call's load variant (variant_of):
                                                          how the K steps read A and B
    waves      W = T // P full waves, then a last one of T mod P blocks, whose busiest SM holds
               j = ceil((T mod P) / SMs) blocks and takes a (g + (1 - g) j / r) + b s v (f + (1 - f)
               j / r): alone a block runs faster than with r - 1 neighbours, but not r times (f of
               a full wave's time for its K steps, g for its fixed part). Clusters spread over
               fewer SMs than that: in place of SMs, the blocks the driver places one an SM
               (cluster_slots at r = 1; the H100: 105 of clusters of 7, 110 of 5)
    compute    c + W t + last wave                        c: the launch's own fixed time, once a launch
                                                          whatever its blocks (its start and drain)
    memory     (A + B + C bytes) / DRAM bandwidth         a floor: no kernel beats the stream
    load       L / the configuration's load rate          a floor: the bytes all the blocks load,
               L = (ceil(N / BN) M G + (ceil(M / BM) G + E) N) K    hits and misses alike (each tile
               times the element size                     column reads all of A, each tile row all of
                                                          B), at the fastest rate the sweep ever saw
                                                          that configuration load (0: no floor)
    gpu        max(compute, memory, load) + the split's reduce (a launch plus S M N fp32 words read and
               M N written) or the clusters' extra per block (their distributed-shared-memory sums)
               or the in-kernel sum's (below)
    call       gpu + host time of the call (+ the reduce kernel's launch, or the kept scratch of a
               split the kernel sums itself: split_host_s)

The in-kernel sum (reduce "in_kernel", mma_gemm.sasm's SPLIT_FIXUP) has no second launch and no
reduce_fixed_s: the slices are written at the reduce bandwidth as before, and read (with C
written) by the last block of each tile of C alone, one SM a tile, so at the share of the reduce
bandwidth that the tiles' SMs hold, min(1, tiles of C / SMs). The fitted database needs nothing
new for it: a, b, f and r are the partial pass's (the same blocks either way), and the reduce
bandwidth is the one fitted on the reduce kernel's samples; only the reading SMs' share is a
modelled assumption (a sweep with the new mode would fit it).

Why two shares for a lone block: the fixed part a is latency (the first loads of the prologue, the
epilogue's stores), which a block with its SM to itself does not shed, while its K steps share the
SM's issue slots and bandwidth with the neighbours it no longer has. With one share for both (f = g,
the fits before 2026-11-29's twenty-first session) the model ran 1.67x short on few-step calls of the
cp.async build over narrow outputs and 12% long on many-step ones; the fit puts g at 1 for every
configuration of more than one block an SM but the 16-row skinny ones (0.8) (docs/log/dispatch.md,
"A lone block's two shares").

The clusters' in-kernel sum (reduce "cluster+in_kernel": S past 8, clusters of C blocks, catalog.py)
is the two put together from their fitted terms: the clusters' extra per block-wave, then
G = ceil(S / C) slices (one a cluster) written and read as the in-kernel sum's, by C blocks a tile
of C instead of one (share min(1, tiles of C x C / SMs)); its grid is S rounded up to whole
clusters. Both in-kernel sums add a fixed hand-off (fixup_fixed_s: the slices' stores fenced, the
tile's counter, the last block's reads), fitted from a sweep that timed them against the same
configuration's cluster split (fit._fit_fixup_fixed), else PRIOR_FIXUP_FIXED_S: without it the
H200 picked the hybrid on 5 of 31 calls where a cluster split of 8 or fewer ran 7-16% faster.

Why the load floor: a, b and f are fitted mostly where few blocks share the GPU's L2 bandwidth,
so a block's K step there is its own time. Where many blocks each stream the same large operand
(sgemm_skinny's 8-row blocks at 61 rows: B read 8 times, 9106 x 61 x 1639 tt), the blocks contend
and a + b s runs 2.2x short (H200: 134.8 us measured, 60.7 modelled; docs/log/dispatch.md, "The
load floor"). The aggregate rate is measured, not assumed: the largest L / (GPU time) over the
configuration's samples, so no sample it was fitted on runs under its own floor.

a, b, f, r and the load rate are per configuration and per GPU; the sweep (`asmgemm tune --sweep`) fits them
(fit.py) into the GPU's database (dispatch_db.py). Where there is none, a prior from the GPU's
peak rates stands in and `explain` says so. The model's job is ranking, so its errors matter only
where they reorder candidates; the sweep's held-out check measures exactly that."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from ..kernel_spec import get_spec, twins
from .catalog import Candidate, label_parts
from .split_k import grid_splits, slices

# Prior rates for a GPU without a fitted database: per SM and clock, the FMA pipes' flops (fp32:
# 128 FMA a cycle on sm_80/sm_90, H100 whitepaper) and the dense fp16 tensor flops of mma.sync
# (sm_80: 1024 FMA a cycle; wgmma's 2048 on sm_90 is not reachable from mma.sync), at the share a
# tuned kernel reaches; and the part of a wave a lone block takes.
PRIOR_FLOPS_PER_CYCLE = {"float32": 2 * 128 * 0.75, "float16": 2 * 1024 * 0.6, "bfloat16": 2 * 1024 * 0.6}
PRIOR_ALONE = 0.6
PRIOR_BLOCK_FIXED_S = 3e-6          # a block's prologue and epilogue
PRIOR_HOST_S = 12e-6                # one call's host work (Python, argument packing, the launch)
PRIOR_LAUNCH_S = 4e-6               # each further kernel of a call (the reduce)
PRIOR_REDUCE_FIXED_S = 3e-6
# The in-kernel sums' hand-off at the end of a launch (the slices' stores made visible, the tile's
# counter taken, the last block's reads of the slices): a latency the bytes terms do not carry.
# Fitted where a sweep timed "cluster+in_kernel" (fit._fit_fixup_fixed); this prior is that fit on
# the H200's first such sweeps (2026-11-29, 31 hgemm_mma calls, docs/log/dispatch.md "The in-kernel
# sum's hand-off"): the H100's database was swept before the mode existed.
PRIOR_FIXUP_FIXED_S = 1.9e-6
# The host work of a call whose one launch takes the stream's kept scratch (a workspace and tile
# counters: the in-kernel sums): the graph-capture query, the scratch's lock and lookups, all before
# the launch, so the GPU waits for them. Fitted where a sweep timed such calls (fit.fit_model: their
# median host time less the unsplit calls'); this prior is what a call from an idle GPU (the
# benchmark's headline) paid on the H200: 7.0 and 9.1 us more between the call's start and its
# kernel's than one launch without scratch (medians over 21 and 18 sgemm calls timed both ways in one
# process; 4 us in a steady loop), while against the reduce kernel's split (scratch too, its second
# launch queued while the first kernel runs) -1.6 and +0.2 (2026-11-29, twenty-second session;
# docs/log/dispatch.md "sgemm's splits past 8 in one launch").
PRIOR_SCRATCH_S = 8.0e-6


def variant_of(layout: str, call_values: dict) -> str:
    """The load variant of a kernel-level call: its layout and how each operand can be read (the
    128-bit load switches vec_a/vec_b, and the copy widths align_a/align_b where a kernel has them),
    e.g. 'nt:11:16/16'. A 2-byte-aligned operand is '2r': mma_gemm reads it as realigned 16-byte
    granules (REALIGN = 1, the default since 2026-11-27); sweeps before that recorded '2' for one
    2-byte load an element, a variant no call has any more (RETIRED_VARIANT)."""
    def width(align: int) -> str:
        return "2r" if align == 2 else str(align)
    return (f"{layout}:{call_values.get('vec_a', 1)}{call_values.get('vec_b', 1)}:"
            f"{width(call_values.get('align_a', 16))}/{width(call_values.get('align_b', 16))}")


def variant_layout(variant: str) -> str:
    """The layout a load variant (variant_of) is of: 'tn:01:4/16' -> 'tn'."""
    return variant.split(":")[0]


# a variant with a plain '2' width: the 2-byte loads mma_gemm no longer makes (variant_of)
RETIRED_VARIANT = re.compile(r"(?:^|[:/])2(?:/|$)")


@dataclass(frozen=True)
class ConfigFit:
    """One configuration's coefficients on one GPU (seconds)."""
    block_s: float                   # a: per block, whatever its K
    step_s: float                    # b: per K step of a block, with r blocks sharing the SM
    alone: float                     # f: a lone block's share of a full wave's time
    blocks_per_sm: int               # r
    samples: int = 0                 # sweep timings fitted (0: the prior)
    # the block time's factor per load variant (variant_of: how A and B are stored and read; a
    # transposed or unaligned operand loads slower), fitted where the sweep saw the variant
    variants: dict = field(default_factory=dict)
    # blocks per SM of the builds of a load variant where they differ from r: a variant's build
    # may hold more registers (mma_gemm's realigned granules: 96 -> 152 a thread at 64 x 64, so
    # 5 -> 3 blocks an SM), which changes the slots of a wave, not only each block's time
    variant_blocks: dict = field(default_factory=dict)
    # the fastest the configuration's blocks together were seen to load (bytes a second, hits and
    # misses alike: loaded_bytes over the sample's GPU time); 0: no floor (too few samples)
    load_bytes_per_s: float = 0.0
    # g: a lone block's share of a full wave's time for its fixed part a (module docstring). None:
    # a fit of before the two shares (a database's entry without "alone_block"), read as it was
    # fitted: g = f and the variant's factor on the whole block, not on its K steps alone
    alone_block: float | None = None
    # c: a launch's own fixed time, once a launch whatever its blocks (its start, the grid's
    # dispatch and its drain), fitted with a and b (fit._best_fit); 0: a fit of before it. Without
    # it a and b carry the launch for every block and K step: the TMA kernel's estimates ran 1.4x
    # short under 8 us and 1.5x long over 16 us (docs/log/dispatch.md, "A launch's own time")
    launch_fixed_s: float = 0.0

    @property
    def alone_fixed(self) -> float:
        return self.alone if self.alone_block is None else self.alone_block

    def factor(self, variant: str | None) -> float:
        return self.factor_from(variant)[0]

    def factor_from(self, variant: str | None) -> tuple[float, str]:
        """(the block time's factor for operands that load as `variant`, where it comes from):
        "variant" (the sweep timed it), "layout" (it did not: the layout's factor, fit's
        _variant_factors), "none" (neither, or no variant: 1)."""
        if variant:
            if variant in self.variants:
                return self.variants[variant], "variant"
            layout = variant_layout(variant)
            if layout in self.variants:
                return self.variants[layout], "layout"
        return 1.0, "none"

    def blocks(self, variant: str | None) -> int:
        """Blocks per SM of this configuration's build for operands that load as `variant`: as the
        sweep saw that variant, else another layout's variant with the same copy widths (the
        registers follow the widths), else r."""
        if not variant or not self.variant_blocks:
            return self.blocks_per_sm
        got = self.variant_blocks.get(variant)
        if got is None:
            widths = variant.rsplit(":", 1)[-1]
            same = [b for v, b in self.variant_blocks.items() if v.rsplit(":", 1)[-1] == widths]
            got = min(same) if same else self.blocks_per_sm
        return got


@dataclass
class DeviceModel:
    """The model of one GPU: its size and rates, and a ConfigFit per (kernel, configuration)."""
    gpu: str
    sms: int
    clock_hz: float
    dram_bytes_per_s: float
    host_s: float = PRIOR_HOST_S
    launch_s: float = PRIOR_LAUNCH_S
    reduce_fixed_s: float = PRIOR_REDUCE_FIXED_S
    reduce_bytes_per_s: float = 0.0          # 0: the DRAM bandwidth
    cluster_block_s: float = 0.0             # the clusters' extra per block
    fixup_fixed_s: float = PRIOR_FIXUP_FIXED_S   # an in-kernel sum's hand-off, once a launch
    scratch_s: float = PRIOR_SCRATCH_S       # an in-kernel sum's host work for its kept scratch
    configs: dict[str, ConfigFit] = field(default_factory=dict)    # "kernel:config" -> fit
    cluster_slots: dict[str, int] = field(default_factory=dict)    # cluster_key(S, r) -> blocks at once
    source: str = "prior"                    # where the coefficients come from, for explain
    # the sweep's calls: what the model got wrong there, per candidate ("neighbours" below)
    residuals: list = field(default_factory=list)

    def fit_of(self, cand: Candidate, dtype: str, threads_hint: int | None = None) -> ConfigFit:
        """The fitted coefficients of the candidate's configuration, or the prior's."""
        found = self.configs.get(f"{cand.kernel}:{cand.config}")
        if found is None:
            found = self._twin_fit(cand)
        return found if found is not None else self.prior(cand, dtype)

    def _twin_fit(self, cand: Candidate) -> ConfigFit | None:
        """The fit of the same configuration of a twin kernel: the same source and entry built for
        operands of the same width (bgemm_mma is hgemm_mma with BF16=1: the same loads, the same
        mma.sync rate), where the sweep timed the twin and not this one."""
        spec = get_spec(cand.kernel)
        for key, fit in self.configs.items():
            kernel, _, config = key.partition(":")
            if config == cand.config and kernel != cand.kernel and twins(get_spec(kernel), spec):
                return fit
        return None

    def prior(self, cand: Candidate, dtype: str) -> ConfigFit:
        """Peak-rate coefficients: a K step of BM x BN x BK FMAs at the prior share of the SM's
        rate, one block a SM."""
        bm, bn, bk = cand.tile
        rate = PRIOR_FLOPS_PER_CYCLE.get(dtype, PRIOR_FLOPS_PER_CYCLE["float32"]) * self.clock_hz
        step = 2.0 * bm * bn * bk / rate
        # a block that streams B (a few rows of C) waits on memory, not on FMAs: its step reads
        # BN x BK elements at the SM's share of the DRAM bandwidth
        stream = bn * bk * 4 / (self.dram_bytes_per_s / self.sms)
        return ConfigFit(PRIOR_BLOCK_FIXED_S, max(step, stream), PRIOR_ALONE, 1)


@dataclass(frozen=True)
class Estimate:
    candidate: Candidate
    tiles: int
    slots: int
    full_waves: int
    last_wave_blocks: int
    steps: int
    block_s: float
    compute_s: float
    memory_s: float
    split_s: float
    host_s: float
    fitted: bool
    correction: float = 1.0          # the neighbours' factor on the blocks' time (neighbour_factors)
    load_s: float = 0.0              # the load floor (loaded_bytes at the configuration's load rate)
    launch_s: float = 0.0            # c, the launch's own fixed time (in compute_s)
    variant_factor: float = 1.0      # the K steps' factor for the call's load variant (ConfigFit.factor_from)
    factor_from: str = "none"        # "variant", "layout" (the variant was never swept) or "none"
    floor_correction: float = 1.0    # the neighbours' factor on the floors (memory and load)

    @property
    def gpu_s(self) -> float:
        return max(self.compute_s, self.memory_s, self.load_s) + self.split_s

    def _corrected_terms(self) -> tuple[float, float]:
        """(the blocks' time, the floors') as the neighbours correct them."""
        return self.compute_s * self.correction, max(self.memory_s, self.load_s) * self.floor_correction

    @property
    def floor_binds(self) -> bool:
        """Whether a floor, not the blocks, sets the corrected GPU time."""
        blocks, floor = self._corrected_terms()
        return floor > blocks

    @property
    def corrected_gpu_s(self) -> float:
        """The GPU time as the neighbours correct it (NEIGHBOURS below: each factor scales the term it
        was measured against, and the split with whichever binds); what the path model weighs
        kernels of two families by, since raw estimates can be 1.5x off where the sweep measured
        nearby."""
        blocks, floor = self._corrected_terms()
        return max(blocks, floor) + self.split_s * (self.floor_correction if floor > blocks else self.correction)

    @property
    def call_s(self) -> float:
        return self.corrected_gpu_s + self.host_s

    @property
    def waves(self) -> float:
        return self.tiles / self.slots

    def to_json(self) -> dict:
        c = self.candidate
        return {"config": c.label, "kernel": c.kernel, "params": c.params(), "tile": list(c.tile),
                "splits": c.splits, "reduce": c.reduce, "tiles": self.tiles, "slots": self.slots,
                "waves": round(self.waves, 3), "last_wave_blocks": self.last_wave_blocks, "k_steps": self.steps,
                "block_us": round(self.block_s * 1e6, 3), "compute_us": round(self.compute_s * 1e6, 3),
                "memory_us": round(self.memory_s * 1e6, 3), "load_us": round(self.load_s * 1e6, 3),
                "launch_us": round(self.launch_s * 1e6, 3),
                "split_us": round(self.split_s * 1e6, 3),
                "host_us": round(self.host_s * 1e6, 3), "gpu_us": round(self.gpu_s * 1e6, 3),
                "call_us": round(self.call_s * 1e6, 3), "fitted": self.fitted,
                "neighbours": round(self.correction, 4), "floor_neighbours": round(self.floor_correction, 4),
                "floor_binds": self.floor_binds, "variant_factor": round(self.variant_factor, 4),
                "factor_from": self.factor_from}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def loaded_bytes(cand: Candidate, m: int, n: int, k: int, ab_bytes: int, batch: int = 1,
                 extra_tile_rows: int = 0) -> int:
    """The bytes every block of the launch loads together, L2 hits and misses alike: each tile
    column reads all of A's rows, each tile row all of B's columns, over all of K (a split reads
    its share of K, so the sum is the same). The module docstring's L."""
    bm, bn, _ = cand.tile
    tile_rows = ceil_div(m, bm) * batch + extra_tile_rows
    return (ceil_div(n, bn) * m * batch + tile_rows * n) * k * ab_bytes


def estimate(cand: Candidate, m: int, n: int, k: int, dm: DeviceModel, dtype: str, c_bytes: int,
             ab_bytes: int, variant: str | None = None, batch: int = 1, extra_tile_rows: int = 0) -> Estimate:
    """The modelled time of one candidate for a kernel-level M x N x K call (the module docstring)
    whose operands load as `variant` (variant_of); batch: the matrices of a batched launch (each
    M x N x K; the memory floor counts every batch's operands, shared ones too: a floor kept low
    only by L2); extra_tile_rows: a grouped launch's experts (M is all of them)."""
    fit = dm.fit_of(cand, dtype)
    bm, bn, bk = cand.tile
    s = cand.splits
    tile_rows, tile_cols = ceil_div(m, bm) * batch + extra_tile_rows, ceil_div(n, bn)
    c_tiles = tile_rows * tile_cols
    # the entry's own clusters are walked as units (tile rows and columns round up to whole
    # clusters) and each tile is ks blocks, each a ks-th of K; a cluster+in_kernel grid rounds S up
    # to whole clusters (its extra blocks have no k range)
    rows, cols, ks = cand.tile_cluster
    tiles = (ceil_div(tile_rows, rows) * rows * ceil_div(tile_cols, cols) * cols * ks
             * grid_splits(s, cand.cluster))
    r = max(1, fit.blocks(variant))
    slots = dm.sms * r
    if cand.cluster_size > 1:
        slots = max(1, min(slots, cluster_slots(dm, cand, r, slots)))
    steps = max(1, ceil_div(ceil_div(k, s * ks), bk))
    factor, factor_from = fit.factor_from(variant)
    # (a fit of before the lone block's two shares scales its whole block by the variant's factor)
    fixed, stepping = fit.block_s * (factor if fit.alone_block is None else 1.0), fit.step_s * steps * factor
    block = fixed + stepping
    full, rest = divmod(tiles, slots)
    compute = fit.launch_fixed_s + full * block
    if rest:
        # the busiest SM of the last wave: its blocks, at most r. Clusters spread a block an SM
        # only as far as the driver places them so (cluster_slots at r = 1: on the H100 105 blocks
        # of clusters of 7, not 132), past that SMs take two
        spread = min(dm.sms, slots)
        if cand.cluster_size > 1:
            spread = max(1, min(spread, cluster_slots(dm, cand, 1, spread)))
        share = min(r, ceil_div(rest, spread)) / r
        g, f = fit.alone_fixed, fit.alone
        compute += fixed * (g + (1.0 - g) * share) + stepping * (f + (1.0 - f) * share)
    memory = ((m * k + k * n) * ab_bytes + m * n * c_bytes) * batch / dm.dram_bytes_per_s
    load = (loaded_bytes(cand, m, n, k, ab_bytes, batch, extra_tile_rows) / fit.load_bytes_per_s
            if fit.load_bytes_per_s > 0 else 0.0)
    split = 0.0
    host = dm.host_s + split_host_s(dm, cand.reduce)
    if cand.reduce == "kernel":
        bw = dm.reduce_bytes_per_s or dm.dram_bytes_per_s
        split = dm.reduce_fixed_s + (s * m * n * 4 * 2 + m * n * c_bytes) / bw
    elif cand.reduce == "in_kernel":
        bw = dm.reduce_bytes_per_s or dm.dram_bytes_per_s
        share = min(1.0, max(1, tiles // s) / dm.sms)
        split = dm.fixup_fixed_s + s * m * n * 4 / bw + (s * m * n * 4 + m * n * c_bytes) / (bw * share)
    elif cand.reduce == "cluster":
        split = dm.cluster_block_s * math.ceil(tiles / slots)
    elif cand.reduce == "cluster+in_kernel":
        # the clusters' sums (as "cluster"), then G slices written by the clusters and read (C
        # written) by the last block of each rank: cluster blocks a tile of C, not one
        bw = dm.reduce_bytes_per_s or dm.dram_bytes_per_s
        g = slices(s, cand.cluster)
        share = min(1.0, c_tiles * cand.cluster / dm.sms)
        split = (dm.cluster_block_s * math.ceil(tiles / slots) + dm.fixup_fixed_s + g * m * n * 4 / bw
                 + (g * m * n * 4 + m * n * c_bytes) / (bw * share))
    return Estimate(cand, tiles, slots, full, rest, steps, block, compute, memory, split, host,
                    fit.samples > 0, load_s=load, variant_factor=factor, factor_from=factor_from,
                    launch_s=fit.launch_fixed_s)


# A split's host work beyond an unsplit call's, by where it is summed: (the DeviceModel term, what
# explain calls it). Clusters alone add none (one launch, no scratch).
SPLIT_HOST = {"kernel": ("launch_s", "the reduce kernel's launch and workspace"),
              "in_kernel": ("scratch_s", "its kept scratch"), "cluster+in_kernel": ("scratch_s", "its kept scratch")}


def split_host_s(dm: DeviceModel, reduce: str | None) -> float:
    """A split's host time beyond an unsplit call's (SPLIT_HOST): launch_s for the reduce kernel,
    scratch_s for a split the kernel sums itself, 0 otherwise."""
    term = SPLIT_HOST.get(reduce)
    return getattr(dm, term[0]) if term else 0.0


def cluster_key(splits: int, blocks_per_sm: int) -> str:
    """dm.cluster_slots' key: clusters of `splits` blocks at `blocks_per_sm` blocks an SM."""
    return f"{splits}x{blocks_per_sm}"


def cluster_slots(dm: DeviceModel, cand: Candidate, r: int, slots: int) -> int:
    """Blocks of `cand`'s clusters the GPU runs at once at r blocks an SM, as the sweep's driver
    queries recorded them (dm.cluster_slots, cluster_key). The driver's answer depends on the
    cluster's size and the blocks an SM holds, not on the kernel: on the H100 (2026-11-28) hgemm_mma
    and sgemm builds of equal r got the same counts, and sizes 3, 5, 6 and 7 pack the GPCs worse
    than 4 and 8 (r = 1: 117, 110, 102, 105 against 120, 120; docs/log/dispatch.md). For a pair the
    sweep did not time: the same size at the nearest other r, scaled by r; else the nearest larger
    size at r; `slots` where none."""
    s = cand.cluster_size
    got = dm.cluster_slots.get(cluster_key(s, r))
    if got is not None:
        return got
    timed = [(int(m[1]), int(m[2])) for m in map(_CLUSTER_KEY.fullmatch, dm.cluster_slots) if m]
    same_size = sorted((abs(b - r), b) for a, b in timed if a == s)
    if same_size:
        other = same_size[0][1]
        return dm.cluster_slots[cluster_key(s, other)] * r // other
    larger = sorted(a for a, b in timed if b == r and a > s)
    return dm.cluster_slots[cluster_key(larger[0], r)] if larger else slots


_CLUSTER_KEY = re.compile(r"(\d+)x(\d+)")     # cluster_key's form (a database of another form: none match)


# Neighbours: the model's error on a measured call is mostly shared by calls near it (the same
# layout and load variant, sizes within a few factors of two), so a candidate's estimate is scaled
# by its measured/modelled GPU time on the nearest sweep calls, weighted by closeness and shrunk
# toward 1 (NEIGHBOUR_PRIOR: as if that much more weight had no error). Distance: the sum over M, N,
# K of |log2 ratio|, plus 1 for another load variant of the same layout; calls farther than
# NEIGHBOUR_RADIUS, or of another family, layout or plain/fused kind, do not count. (Another layout's
# calls at distance 1 gained the TMA family 6 of 283 held-out calls but moved presets to 1.5x slower:
# docs/log/dispatch.md, "The neighbours' factor on its own term";
# git show 6eb016e:tools/data/neighbours_2026-11-30/)
#
# Each ratio scales the term it was measured against: where the model's blocks bound the sample
# (compute over both floors), the call's blocks; where a floor bound it, the call's floors; the
# split goes with whichever binds (Estimate.corrected_gpu_s); the host time with neither (the sweep
# does not measure it per call: fit._call_ms). Until 2026-11-30 one ratio of call times scaled the
# whole call, floors and host included. On the GPU that measured it the two agree wherever one term
# binds on both sides; on another GPU (the model alone: the H200's TMA sweep priced on the H100's
# DRAM, 3.35 TB/s against 4.8) the floors are not the ones the ratio was measured against, and a
# blocks' ratio on a call at the DRAM floor ranked the candidates by how far the H200's model was off
# for each: 8 x 28672 x 4096 nt went from ct_t128x64_st_k4 (69.6 us on the H200) to t128x128_st_k2
# (84.0) on a difference of 1% (docs/log/dispatch.md, "The neighbours' factor on its own term").
NEIGHBOURS = 4
NEIGHBOUR_RADIUS = 4.0
NEIGHBOUR_PRIOR = 0.5
ANY_CONFIG = "*"        # the DRAM floor's factor pooled over every configuration measured at it


@dataclass(frozen=True)
class NeighbourFactors:
    """label -> the factor the nearest sweep calls give that candidate's blocks, and its floors."""
    blocks: dict = field(default_factory=dict)
    floor: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.blocks or self.floor)

    def applied(self, e: Estimate) -> Estimate:
        """`e` with its factors (factor_for: its label's, else its split kind's, else its
        configuration's); a floor the sweep never saw this configuration held to near here takes
        the DRAM floor's factor of every configuration it did (ANY_CONFIG): how far the GPU streams
        under its nominal rate is mostly the GPU's, and a candidate left at 1 there would win every
        tie at the floor against the ones measured at it."""
        label = e.candidate.label
        return replace(e, correction=factor_for(self.blocks, label),
                       floor_correction=factor_for(self.floor, label, self.floor.get(ANY_CONFIG, 1.0)))


def residual_entry(e: Estimate, measured_gpu_s: float) -> tuple[float, str | None]:
    """(log of measured / modelled GPU time, the floor that bound the model: "dram", "load" or None
    where the blocks did) of one timed candidate: what a sweep's call stores for its neighbours
    (fit._residuals)."""
    ratio = math.log(measured_gpu_s / e.gpu_s)
    if max(e.memory_s, e.load_s) <= e.compute_s:
        return ratio, None
    return ratio, "dram" if e.memory_s >= e.load_s else "load"


def neighbour_factors(dm: DeviceModel, family: str, variant: str | None, m: int, n: int, k: int,
                      plain: bool) -> NeighbourFactors:
    """The factors the nearest sweep calls give each candidate's blocks and floors."""
    if not dm.residuals or variant is None or min(m, n, k) < 1:
        return NeighbourFactors()
    layout = variant_layout(variant)
    near = []
    lm, ln, lk = math.log2(m), math.log2(n), math.log2(k)
    for r in dm.residuals:
        if r["family"] != family or r["plain"] != plain or variant_layout(r["variant"]) != layout:
            continue
        d = (abs(lm - math.log2(r["m"])) + abs(ln - math.log2(r["n"])) + abs(lk - math.log2(r["k"]))
             + (r["variant"] != variant))
        if d <= NEIGHBOUR_RADIUS:
            near.append((d, r))
    near.sort(key=lambda t: t[0])
    sums: dict[str, dict[str, list[float]]] = {"blocks": {}, "floor": {}}
    for d, r in near[:NEIGHBOURS]:
        w = 1.0 / (1.0 + d) ** 2
        floors = r.get("floor", {})
        for label, res in r["gpu_res"].items():
            term = sums["floor" if label in floors else "blocks"]
            # the label itself, its kind (the configuration with any split of the same
            # reduction), which a split count the sweep did not time near here falls back on, and
            # the configuration at any split, for a kind it did not time near here either; a DRAM
            # floor's also pooled over the configurations (ANY_CONFIG; a load floor is the
            # configuration's own rate)
            keys = {label, split_kind(label), config_kind(label)}
            for key in keys | {ANY_CONFIG} if floors.get(label) == "dram" else keys:
                acc = term.setdefault(key, [0.0, 0.0])
                acc[0] += w * res
                acc[1] += w
    return NeighbourFactors(*({label: math.exp(s / (wt + NEIGHBOUR_PRIOR)) for label, (s, wt) in sums[t].items()}
                              for t in ("blocks", "floor")))


def split_kind(label: str) -> str:
    """'t64x64_k16/s12' -> 't64x64_k16/s*', '.../s4c' -> '.../s*c', '.../s53c8' -> '.../s*c*'; an
    unsplit label is its own kind."""
    parts = label_parts(label)
    if parts.splits == 1 and not parts.clustered:
        return label
    return f"{parts.config}/s*{'c' if parts.clustered else ''}{'*' if parts.cluster is not None else ''}"


def config_kind(label: str) -> str:
    """'t64x64_k16/s12', 't64x64_k16/s4c', 't64x64_k16' -> 't64x64_k16/*': the configuration at any
    split, the neighbours' last fallback before none."""
    return label.partition("/")[0] + "/*"


def factor_for(factors: dict[str, float], label: str, default: float = 1.0) -> float:
    """A candidate's neighbour factor: its own, else its split kind's, else its configuration's at
    any split (the sweep timed it near here only in another split kind), else `default`."""
    return factors.get(label, factors.get(split_kind(label), factors.get(config_kind(label), default)))


def rank(cands: list[Candidate], m: int, n: int, k: int, dm: DeviceModel, dtype: str, c_bytes: int,
         ab_bytes: int, variant: str | None = None, family: str | None = None,
         plain: bool = True, neighbours_of: tuple | None = None, batch: int = 1,
         extra_tile_rows: int = 0) -> list[Estimate]:
    """The candidates' estimates, fastest call first (a tie, e.g. at the DRAM floor, goes to the one
    whose blocks take least: the floor leaves it the most slack; then catalog order), each scaled by
    its neighbours' factor where the sweep measured calls near this one (neighbours_of: (variant,
    m, n) of the call as the sweep keys it, where these sizes are a swapped launch's); batch,
    extra_tile_rows: a batched or grouped launch's (estimate)."""
    nv, nm, nn = neighbours_of or (variant, m, n)
    factors = neighbour_factors(dm, family or (cands[0].family if cands else ""), nv, nm, nn, k, plain)
    ests = [estimate(c, m, n, k, dm, dtype, c_bytes, ab_bytes, variant, batch, extra_tile_rows) for c in cands]
    if factors:
        ests = [factors.applied(e) for e in ests]
    return sorted(ests, key=rank_key)


def rank_key(e: Estimate) -> tuple[bool, float, float]:
    """The order rank sorts by: a configuration the GPU's sweep timed before one it never did (a
    catalog entry added after the sweep, e.g. the 128 x 256 in-place tiles, fitted on the H200 and
    not on the H100: their prior's peak rates, beside fits that no kernel reaches, moved 45 of 240
    random calls on the H100's facts, 10 of them off the TMA kernel; a GPU with no sweep at all has
    every candidate on the prior, and this changes nothing there); then the call's modelled time,
    then (a tie at the DRAM floor: 32 x (2048 x 2048 . 2048 x 64), every tile shape the same 85 us)
    the blocks' own time, so the floor's tie does not go to whichever entry the catalog lists first
    (there a 192-wide tile over 64 columns)."""
    return not e.fitted, e.call_s, e.compute_s * e.correction


def why_slower(e: Estimate, best: Estimate) -> str:
    """The main reason `e` lost to `best`, in the model's own terms."""
    if e is best:
        return "the pick"
    if best.fitted and not e.fitted:
        return "never swept on this GPU (`asmgemm tune --sweep` times it): ranked after every configuration it fitted"
    reasons = []
    host = e.host_s - best.host_s
    if host > 0.25 * (e.call_s - best.call_s):
        term = SPLIT_HOST.get(e.candidate.reduce)
        reasons.append(f"{host * 1e6:.1f} us more host work" + (f" ({term[1]})" if term else ""))
    if e.split_s - best.split_s > 0.25 * (e.call_s - best.call_s):
        reasons.append(f"its split costs {e.split_s * 1e6:.1f} us" if e.candidate.splits > 1
                       else "no split")
    if e.waves > 1 and e.last_wave_blocks and e.last_wave_blocks < 0.5 * e.slots:
        reasons.append(f"{e.waves:.2f} waves: the last holds {e.last_wave_blocks} of {e.slots} slots")
    elif e.tiles < 0.5 * e.slots:
        reasons.append(f"{e.tiles} blocks fill {e.tiles / e.slots:.0%} of {e.slots} slots")
    if e.block_s > 1.5 * best.block_s and e.tiles <= best.tiles:
        reasons.append(f"{e.steps} K steps of {e.block_s * 1e6 / max(1, e.steps):.2f} us a block")
    if e.load_s > max(e.compute_s, e.memory_s):
        reasons.append(f"its blocks load {e.load_s * 1e6:.1f} us of L2 traffic at its best rate")
    elif e.memory_s > e.compute_s:
        reasons.append("bound by DRAM")
    if not reasons:
        reasons.append(f"{e.compute_s * 1e6:.1f} us of blocks against {best.compute_s * 1e6:.1f}")
    return "; ".join(reasons)
