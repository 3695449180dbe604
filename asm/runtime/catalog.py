"""The candidates of one GEMM call: a kernel family's catalog ([[NAME.config]] in kernels.toml)
crossed with its split-K choices, less what cannot run this call.

A candidate is one configuration (its -D set) on one kernel, with S splits of K summed by the
reduce kernel, inside clusters of S blocks (S <= 8), or, past 8 and where the kernel has a fixup
switch, inside clusters of C blocks whose sums the last block of each rank adds from a workspace
("cluster+in_kernel": one launch, no serial sum of all S slices; the sum by the last block of each
tile alone is params= only: runtime/split_k.in_kernel_fixup). Pure data, no
GPU: the cost model
(cost_model.py) ranks the list, gemm() builds the best one, and a build that one of the kernel's
own `.error` guards refuses is skipped for the next (legality comes from the kernel source itself,
found when it is built and remembered: dispatch.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ..isa.arch import arch_for
from ..kernel_spec import ConfigEntry, KernelSpec, get_spec
from .split_k import MAX_CLUSTER_SPLITS, hybrid_cluster, split_for

# A split runs in clusters for any S of 2..MAX_CLUSTER_SPLITS it lands on (each S a build of its
# own: CLUSTER_K is a -D parameter, built when first picked). Offering powers of two only lost the
# 8-way cluster for most K: split_for rounds each split's K to whole chunks, so 8 asked at K = 3089
# (chunks of 64) is 7 splits, and 21x54x3089 fp16 then ran s4c (25.4 us of GPU) where s7c took 16.7
# (H100, docs/log/dispatch.md "The skinny deep-K 16-bit calls").


@dataclass(frozen=True)
class Candidate:
    family: str                      # the spec whose catalog this is (sgemm)
    config: str                      # the catalog entry's name (t128x128_k16)
    kernel: str                      # the spec it builds (sgemm, sgemm_skinny)
    set: tuple[tuple[str, int], ...]
    tile: tuple[int, int, int]       # rows, columns, k step of one block
    splits: int = 1                  # S: K split S ways (1: unsplit)
    reduce: str | None = None        # S > 1: "kernel" (workspace + splitk_reduce), "cluster",
                                     # "in_kernel" (workspace summed by each tile's last block) or
                                     # "cluster+in_kernel" (clusters' sums, summed by each rank's last)
    swap: bool = False               # runs as C^T with the kernel's transposed store (ConfigEntry.swap)
    cluster: int = 0                 # "cluster+in_kernel": blocks of a cluster (split_k.hybrid_cluster)
    # the entry's own clusters (ConfigEntry.cluster): blocks along C's rows and columns sharing
    # their tiles' loads, and along K splitting one tile's K in the kernel
    tile_cluster: tuple[int, int, int] = (1, 1, 1)

    @property
    def cluster_size(self) -> int:
        """Blocks of the candidate's clusters (0: none): a split's along z, else the entry's own."""
        if self.reduce == "cluster":
            return self.splits
        if self.cluster:
            return self.cluster
        rows, cols, ks = self.tile_cluster
        return rows * cols * ks if rows * cols * ks > 1 else 0

    @property
    def label(self) -> str:
        """The configuration's name as explain, last_launch() and the sweep database write it:
        t128x128_k16, t128x128_k16/s4 (S = 4 summed by the reduce kernel; "in_kernel", the
        one-launch sum, where a caller's candidate asks for it), t128x128_k16/s4c (clusters of 4),
        t64x64_w32x32/s53c8 (clusters of 8 summed into slices, "cluster+in_kernel")."""
        if self.splits == 1:
            return self.config
        tail = "c" if self.reduce == "cluster" else f"c{self.cluster}" if self.reduce == "cluster+in_kernel" else ""
        return f"{self.config}/s{self.splits}{tail}"

    def params(self) -> dict:
        """The params= of gemm() that run exactly this candidate (the split-K switch carries S, the
        cluster switch 1 for the reduce kernel, S for clusters, the fixup switch 1 for the sum in
        the kernel, 0 for the reduce kernel, as runtime/split_k.py reads them)."""
        out = dict(self.set)
        spec = get_spec(self.kernel)
        if self.swap:
            out[spec.call_value_param("c_trans")] = 1
        sk = spec.split_k
        if sk is not None:
            out[sk.switch] = self.splits
            if sk.cluster_switch is not None:
                out[sk.cluster_switch] = self.cluster_size or 1
            if sk.fixup_switch is not None:
                out[sk.fixup_switch] = int(self.reduce in ("in_kernel", "cluster+in_kernel"))
        return out


@dataclass(frozen=True)
class LabelParts:
    """Candidate.label read back (sweep samples and the database name candidates by label)."""
    config: str                      # the catalog entry's name
    splits: int                      # S (1: unsplit)
    clustered: bool                  # a 'c' after S: clusters ("cluster", or "cluster+in_kernel")
    cluster: int | None              # the size after the 'c' ("cluster+in_kernel"); None: none named


def label_parts(label: str) -> LabelParts:
    """'t128x128_k16' -> (t128x128_k16, 1, False, None); '.../s4' -> (..., 4, False, None);
    '.../s4c' -> (..., 4, True, None); 't64x64_w32x32/s53c8' -> (t64x64_w32x32, 53, True, 8): the
    inverse of Candidate.label, the one reader of its form."""
    config, _, split = label.partition("/s")
    if not split:
        return LabelParts(config, 1, False, None)
    count, c, size = split.partition("c")
    return LabelParts(config, int(count) if count.isdigit() else 1, bool(c), int(size) if size.isdigit() else None)


def entry_candidates(entry: ConfigEntry, family: str, k: int, *, plain: bool, clusters: bool,
                     trans_b: int = 0) -> list[Candidate]:
    """One catalog entry's candidates for a K-deep call: unsplit, and each listed S that still
    splits K (split_for: whole chunks of the kernel's k multiple; S is the splits that result, so
    two asks that land on the same split are one candidate)."""
    tile = entry.tile_for(trans_b)
    base = Candidate(family, entry.name, entry.kernel, entry.set, tile, swap=entry.swap, tile_cluster=entry.cluster)
    out = [base]
    sk = get_spec(entry.kernel).split_k
    if not plain or sk is None:
        return out
    seen = {1}
    for asked in entry.splits:
        split = split_for(k, asked, sk.k_multiple)
        if split is None or split.splits in seen:
            continue
        seen.add(split.splits)
        s = split.splits
        # the reduce kernel: the one-launch sum (a fixup switch) is params= only until a sweep fits
        # it (split_k.in_kernel_fixup says why)
        out.append(Candidate(family, entry.name, entry.kernel, entry.set, tile, s, "kernel", entry.swap,
                             tile_cluster=entry.cluster))
        if clusters and sk.cluster_switch is not None and s <= MAX_CLUSTER_SPLITS:
            out.append(Candidate(family, entry.name, entry.kernel, entry.set, tile, s, "cluster", entry.swap))
        elif clusters and sk.cluster_switch is not None and sk.fixup_switch is not None:
            out.append(Candidate(family, entry.name, entry.kernel, entry.set, tile, s, "cluster+in_kernel",
                                 entry.swap, hybrid_cluster(s)))
    return out


def candidates(family: KernelSpec, m: int, k: int, target: str, *, plain: bool,
               usable=lambda kernel: True, swapped_m: int | None = None, trans_b: tuple[int, int] = (0, 0),
               two_d: bool = True) -> list[Candidate]:
    """Every candidate of `family`'s catalog for a kernel-level M x (any N) x K call on `target`:
    entries whose kernel builds for the target and can take the call (`usable(kernel name)`: the
    caller's check of the fused epilogue), within their `max_m`; split only for plain calls (no
    fused epilogue, no batch: the partial pass stores raw sums), in clusters only where the target
    has them. Entries that swap the operands (`swap`) only where the call may run as C^T
    (`swapped_m`: its M then, the call's N; None: it may not), within max_m of that M. trans_b:
    whether the kernel's B is K-major in the launch as called and as C^T (the entry's tile).
    two_d: a plain 2-D launch; a batch or a grouped launch (False) takes no entry with clusters of
    its own (ConfigEntry.cluster: its tiles' shared loads are 2-D, its K split a split; the TMA
    kernel's guards refuse both with BATCHED and GROUPED)."""
    clusters = "clusters" in arch_for(target).features
    out: list[Candidate] = []
    for entry in family.configs:
        if entry.swap and swapped_m is None:
            continue
        if not two_d and entry.cluster != (1, 1, 1):
            continue
        rows = swapped_m if entry.swap else m
        if entry.max_m is not None and rows > entry.max_m:
            continue
        spec = get_spec(entry.kernel)
        if spec.build_target(target) is None or not usable(entry.kernel):
            continue
        out.extend(entry_candidates(entry, family.name, k, plain=plain, clusters=clusters,
                                    trans_b=trans_b[1] if entry.swap else trans_b[0]))
    return out
