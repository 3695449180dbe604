"""Which configuration of a kernel family runs a call: an exact hit in the GPU's dispatch database
wins, else the cost model's ranking of the catalog (catalog.py, cost_model.py, dispatch_db.py).

gemm() asks `choose` for the order to try and builds down it: a candidate whose build one of the
kernel's own `.error` guards refuses (a register budget, a mode the kernel lacks) is remembered as
refused for that build and the next one is tried, so legality is the kernel source's word, found
once per build. `explain` (commands/explain.py) prints the same Choice."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import AsmError
from ..kernel_spec import DTYPE_ITEMSIZE, KernelSpec, get_spec
from . import split_k
from .build_cache import BuiltKernel, build_kernel
from .catalog import Candidate, candidates
from .cost_model import DeviceModel, Estimate, rank, rank_key, variant_of
from .dispatch_db import device_model, exact_key
from .launch import choose_params


@dataclass
class Choice:
    family: str
    key: str                             # the exact-hit key of this call
    ranked: list[Estimate]               # every candidate, fastest modelled call first
    order: list[Candidate]               # what to try, in order (an exact hit first)
    chosen_by: str                       # "database" (an exact hit) or "model"
    model_source: str                    # where the model's coefficients came from
    refused: dict[str, str] = field(default_factory=dict)   # label -> why a build refused it

    @property
    def pick(self) -> Candidate | None:
        return self.order[0] if self.order else None


_models: dict[tuple, tuple[DeviceModel, dict]] = {}


def model_for(gpu: str, target: str, sms: int, clock_hz: float = 0.0, dram_bytes_per_s: float = 0.0,
              family: str | None = None):
    """(DeviceModel, exact hits) of a GPU for a kernel family, read once per process (forget()
    drops them)."""
    key = (gpu, target, sms, clock_hz, dram_bytes_per_s, family)
    if key not in _models:
        _models[key] = device_model(gpu, target, sms, clock_hz, dram_bytes_per_s, family)
    return _models[key]


def forget() -> None:
    """Drop the models read (after a sweep wrote a database) and the refusals remembered."""
    _models.clear()
    _refused.clear()


# builds a kernel's guards refused: (kernel, target, defines) -> the first line of the error
_refused: dict[tuple, str] = {}


def refusal(key: tuple) -> str | None:
    return _refused.get(key)


def refuse(key: tuple, why: str) -> None:
    _refused[key] = why


def choose(family: KernelSpec, layout: str, m: int, n: int, k: int, *, gpu: str, target: str, sms: int,
           plain: bool, usable=lambda kernel: True, clock_hz: float = 0.0, dram_bytes_per_s: float = 0.0,
           exact: bool = True, call_values: dict | None = None, swapped=None, batch: int = 1,
           extra_tile_rows: int = 0) -> Choice:
    """The candidates of a kernel-level M x N x K call of `family` in the order to try them.
    call_values: the plan's (they give the load variant the model prices); swapped: where the call
    may run as C^T, (layout, call values) of that launch, whose M and N are n and m (the catalog's
    swap entries run so); exact=False leaves the database's exact hits out (the model alone: the
    held-out check); batch, extra_tile_rows: a batched launch's batch, a grouped launch's experts
    (the model counts their tiles; the database's exact hits are 2-D calls, so they are left out)."""
    exact = exact and batch == 1 and extra_tile_rows == 0
    dm, best = model_for(gpu, target, sms, clock_hz, dram_bytes_per_s, family.name)
    cands = candidates(family, m, k, target, plain=plain, usable=usable,
                       swapped_m=n if swapped is not None else None,
                       trans_b=(int((call_values or {}).get("trans_b", 0)),
                                int(swapped[1].get("trans_b", 0)) if swapped is not None else 0),
                       two_d=batch == 1 and extra_tile_rows == 0)
    sizes = (DTYPE_ITEMSIZE[family.dtypes.c], DTYPE_ITEMSIZE[family.dtypes.a])
    variant = variant_of(layout, call_values or {})
    ranked = rank([c for c in cands if not c.swap], m, n, k, dm, family.dtypes.a, *sizes, variant, family.name, plain,
                  batch=batch, extra_tile_rows=extra_tile_rows)
    if swapped is not None:
        # priced at the launch's own sizes and loads; corrected by the call's neighbours (the sweep
        # keeps what it measured under the call, whichever way a candidate ran it)
        ranked += rank([c for c in cands if c.swap], n, m, k, dm, family.dtypes.a, *sizes,
                       variant_of(swapped[0], swapped[1]), family.name, plain, neighbours_of=(variant, m, n))
        ranked.sort(key=rank_key)
    key = exact_key(family.name, layout, m, n, k, plain)
    order = [e.candidate for e in ranked]
    chosen_by = "model"
    hit = best.get(key) if exact else None
    if hit is not None:
        found = [c for c in order if c.label == hit]
        if found:           # (a hit naming a configuration the catalog no longer has is ignored)
            order.remove(found[0])
            order.insert(0, found[0])
            chosen_by = "database"
    return Choice(family.name, key, ranked, order, chosen_by, dm.source)


@dataclass(frozen=True)
class CandidateBuild:
    """What running a candidate for one launch plan builds: the spec, target and -D defines, and
    the split it makes (split_k.Split or None) with its cluster size (0: the reduce kernel or the
    in-kernel sum) and whether the kernel sums it itself (split_k.in_kernel_fixup)."""
    spec: KernelSpec
    target: str
    split: object
    in_cluster: int
    defines: dict
    fixup: bool = False

    @property
    def key(self) -> tuple:
        return (self.spec.name, self.target, tuple(sorted((k, str(v)) for k, v in self.defines.items())))


def candidate_build(cand: Candidate, plan, sms: int, device_target: str, plain: bool,
                    launch_defines=None) -> CandidateBuild:
    """The build a candidate makes for `plan` (runtime/plan.LaunchPlan: the C^T launch's for a swap
    candidate) on a device of `device_target`: exactly what gemm() builds when it runs the
    candidate (the sweep prebuilds these in parallel). launch_defines(spec, plan): -D values the
    runtime decides for the launch besides the configuration (a C larger than L2 stored
    evict-first: launch_config.c_stream_defines); None: none."""
    spec = get_spec(cand.kernel)
    target = spec.build_target(device_target)
    tuned = cand.params()
    split = split_k.choose_split(spec, plan, None, tuned, sms, plain=plain)
    in_cluster = split_k.cluster_splits(spec, split, target, tuned, plan, sms)
    fixup = split_k.in_kernel_fixup(spec, split, tuned, in_cluster)
    extra = launch_defines(spec, plan) if launch_defines is not None else {}
    defines = choose_params(spec, plan, None, tuned, sms,
                            {**extra, **split_k.switch_define(spec, split, in_cluster, fixup)})
    return CandidateBuild(spec, target, split, in_cluster, defines, fixup)


def try_build(cand: Candidate, plan, sms: int, device_target: str, plain: bool, launch_defines=None
              ) -> tuple[CandidateBuild, BuiltKernel | None, str | None, AsmError | None]:
    """(what the candidate builds, the build or None, why the kernel refused it or None, the error
    of a refusal met now). The kernel's guards refuse a build once per process: the refusal is
    remembered (refuse), so a later call skips the candidate without expanding it again."""
    cb = candidate_build(cand, plan, sms, device_target, plain, launch_defines)
    why = refusal(cb.key)
    if why is not None:
        return cb, None, why, None
    try:
        return cb, build_kernel(cb.spec, cb.defines, cb.target), None, None
    except AsmError as exc:
        why = exc.message.splitlines()[0] if exc.message else "error"
        refuse(cb.key, why)
        return cb, None, why, exc
