"""From (kernel spec, problem, device) to a launch configuration: which kernel runs, on which
launch geometry, built with which -D parameters, split how, chosen by what. The decision half of
`asmgemm.gemm`, apart from the arrays: it reads only descriptions of the operands (arrays.Matrix:
shapes, strides, dtypes, the alignment of pointers) and the device's facts, so it runs on the
CPU (tests/test_launch_config.py). gemm.py turns its answer into a kept launch (kept_launch.py)
and launches it.

The steps, in order (each may change the kernel or the geometry the next one sees):
  1. a batched call folds into one 2-D GEMM where it is one, else the kernel's batched mode (a
     TMA kernel's where TMA reads the batch in place, else the in-place kernel's: no padded
     copies of a batch);
  2. plan.plan_launch: the kernel's A, B and C, the operand swap for a column-major C, call values;
  3. an untuned 2-D call follows the spec's routes ([[NAME.route]]) and, on a TMA kernel, the
     `in_place` kernel where the path model says it wins: over a padded copy where TMA cannot read
     an operand, else against the TMA kernel's catalog pick by the cost model's two estimates;
  4. the user's tuning cache (unless params= or lookups are off);
  5. a family with a catalog: dispatch.choose (the database's exact hit, else the cost model),
     optionally reordered by a timing hook ($ASMGEMM_AUTOTUNE, gemm.py);
  6. the spec's swap rule (a kernel without a catalog; a catalog's C^T entries are ranked in 5):
     the C^T launch with the kernel's transposed store;
  7. TMA kernels: operands TMA cannot read get padded copies (planned here on the copy's layout;
     gemm.py makes the copies at each launch);
  8. the build: the catalog's first candidate the kernel's guards accept, else params= / the
     tuning entry / the size rules, with split-K (a workspace and a reduce, or inside a cluster).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from ..errors import AsmError
from ..files import warn_cache
from ..kernel_spec import DTYPE_ITEMSIZE, KernelSpec, get_spec, spec_for_dtype
from . import dispatch, path_model, split_k
from .arrays import FRESH_ALLOCATION, Dtype, Matrix, padded_matrix, ptr_of
from .build_cache import BuiltKernel, build_kernel, defines_of
from .gpu import DeviceFacts
from .launch import call_defines, choose_params, takes_c_trans, untuned_size_rule
from .plan import LaunchPlan, fresh_operands, plan_launch
from .tensor_map import addressable, batch_addressable
from .tune_cache import lookup_tuned, lookups_disabled

# CuPy has no bfloat16 dtype: bfloat16 data in CuPy arrays travels as its 16-bit patterns (uint16 or
# int16 arrays) to a kernel whose spec says bfloat16, named with kernel= (e.g. 'bgemm').
_BITS_OF = {"bfloat16": ("uint16", "int16")}


class Problem(NamedTuple):
    """One call as the configuration sees it: descriptions of the operands, not the arrays. c is
    the C the kernel writes (gemm allocates a new one before it asks)."""

    a: Matrix
    b: Matrix
    c: Matrix
    bias: Matrix | None = None
    trans_a: bool = False
    trans_b: bool = False
    act: int = 0                 # kernel_spec.activation_code
    params: dict | None = None   # the caller's -D overrides (params=): they pin the build


@dataclass
class LaunchConfig:
    """What runs for a Problem. `built` None: nothing to launch (`empty`: M or N is 0; else K is 0
    with no fused epilogue, so C is only zeroed or scaled by beta)."""

    spec: KernelSpec             # the kernel that runs (after routes, in_place, the catalog)
    plan: LaunchPlan             # its launch geometry (after the swap, C^T, padded copies)
    c_shape: tuple               # the caller's C
    new_c_dtype: str | None      # the dtype of a C gemm allocates (None: A's)
    kernel_batch: int = 1        # grid z of a batched kernel (1: one 2-D GEMM)
    copied: tuple = (0, 0)       # (the caller's A, B): element size of one TMA needs copied, else 0
    built: BuiltKernel | None = None
    split: split_k.Split | None = None   # split-K through a workspace and a reduce (None: none)
    in_cluster: int = 0          # S of a split summed inside clusters of S blocks (0: none)
    fixup: bool = False          # the split summed by each tile's last block, one launch (split_k.in_kernel_fixup)
    config: str | None = None    # the catalog entry that runs (dispatch.py), or None
    chosen_by: str = "size rules"    # "database", "model", "autotune", "params", "tuning cache"
    empty: bool = False
    choice: dispatch.Choice | None = field(default=None, repr=False)
    # copy or in place, where TMA could not read an operand and the path model decided (None: no decision)
    path: path_model.PathDecision | None = None


def pick_spec(kernel: str | None, dtype: str, c_dtype: str | None, facts: DeviceFacts, bias=None,
              act: int = 0) -> KernelSpec:
    """The spec for A/B of `dtype` and C of `c_dtype` (None: gemm allocates C; the kernel decides):
    kernel= names one, else the first spec of these dtypes for the device. AsmError when it takes
    other dtypes, lacks this call's fused epilogue or is not built for the device."""
    spec = get_spec(kernel) if kernel else spec_for_dtype(dtype, facts.target, c_dtype)
    d = spec.dtypes

    def takes(want: str, got: str) -> bool:
        return got == want or got in _BITS_OF.get(want, ())
    if not (d.a == d.b and takes(d.a, dtype) and (c_dtype is None or takes(d.c, c_dtype))):
        shown = dtype if c_dtype in (None, dtype) else f"{dtype} (A, B) and {c_dtype} (C)"
        raise AsmError(f"kernel '{spec.name}' takes A/B {d.a}, C {d.c}; the arrays are {shown}")
    check_epilogue(spec, bias, act)
    if spec.build_target(facts.target) is None:
        raise AsmError(f"kernel '{spec.name}' is not built for {facts.target} ({facts.name}); "
                       f"its targets: {', '.join(spec.targets)}")
    return spec


def new_c_dtype(spec: KernelSpec) -> str | None:
    """The dtype of a C gemm allocates: the kernel's C type where it differs from its A type (the
    fp32 C of a 16-bit GEMM); None: A's."""
    return spec.dtypes.c if spec.dtypes.c != spec.dtypes.a else None


def configure(spec: KernelSpec, problem: Problem, facts: DeviceFacts,
              autotune: Callable[[dispatch.Choice], None] | None = None) -> LaunchConfig:
    """The launch configuration of `problem` on `spec` (as pick_spec returned it) and the device
    (the module docstring lists the steps). `autotune`: called with the catalog's choice when the
    cost model ranked it (not the database), to reorder it by timing; None leaves the model's order."""
    ma, mb, mc, mbias = problem.a, problem.b, problem.c, problem.bias
    trans_a, trans_b, act, params = problem.trans_a, problem.trans_b, problem.act, problem.params
    batch, batched, m, n = batch_shape(ma, mb, trans_a, trans_b)
    c_shape = (batch, m, n) if batched else (m, n)
    kernel_batch, batch_strides = 1, (0, 0, 0)
    if batched:
        # a kernel without a batched mode hands a batch it cannot take to its family's in-place
        # kernel where that has one (hgemm -> hgemm_mma: grid z, any batch strides, any leading
        # dimension); params= pin the kernel asked for
        batch_spec = spec if params is not None else mode_kernel(spec, "batched", facts, mbias, act)
        ma, mb, mc, kernel_batch, batch_strides = fold_batch(batch_spec, ma, mb, mc, batch, m, n, trans_a, mbias)
        if kernel_batch > 1:
            spec = batch_spec
        elif takes_tensor_maps(spec) and not all(addressable(x.ptr, x.shape[0], x.strides[0] // x.dtype.itemsize,
                                                              x.dtype.itemsize) for x in (ma, mb)):
            # one 2-D GEMM over views of the batch, whose rows TMA cannot read: the TMA padding
            # copies 2-D operands only, the in-place kernel reads them as they are (a TMA kernel
            # with a batched mode of its own, hgemm, hands such a fold to its in-place kernel too)
            in_place = None if params is not None else \
                (batch_spec if batch_spec is not spec else _batch_in_place_kernel(spec, facts, mbias, act))
            if in_place is None:
                raise AsmError(f"kernel '{spec.name}' reads A and B through TMA, which needs 16-byte aligned rows; "
                               "a batched call gets no padded copies",
                               hint="pass operands whose rows are 16-byte aligned")
            spec = in_place

    def planned(a: Matrix, b: Matrix, c_trans: bool = False) -> LaunchPlan:
        return plan_launch(a, b, mc, trans_a=trans_a, trans_b=trans_b, ptr_of=ptr_of, bias=mbias, activation=act,
                           batch=kernel_batch, batch_strides=batch_strides, c_trans=c_trans)
    plan = planned(ma, mb)
    rankings: dict = {}

    def rank_catalog(family: KernelSpec, launch: LaunchPlan) -> CatalogRanking:
        # once a configure: the path model's TMA side and the launch it keeps rank the same catalog
        # (keyed by the plan's identity; the entry holds the plan, so its id is not reused meanwhile)
        key = (family.name, id(launch))
        if key not in rankings:
            rankings[key] = (launch, _rank_catalog(family, launch, ma, mb, planned, facts, mbias, act, kernel_batch))
        return rankings[key][1]
    if kernel_batch > 1 and takes_tensor_maps(spec):
        # a batch TMA cannot read in place runs on the in-place kernel (no padded copies of a batch)
        spec = _batch_in_place_or(spec, plan, ma.dtype.itemsize, facts, mbias, act, pinned=params is not None)
    if params is None and kernel_batch == 1 and spec.routes:
        # an untuned 2-D call: the spec may send this shape to another kernel (params= are -D
        # parameters of the kernel asked for, so they keep it)
        spec = _routed(spec, plan, facts, mbias, act)
    path = None
    tma_kept = None     # where the TMA kernel keeps the call below: (its tuning entry, its swap) as judged there
    if params is None and kernel_batch == 1 and spec.in_place and takes_tensor_maps(spec):
        # operands TMA cannot read: a padded copy, or the spec's in-place kernel (path_model); a
        # kernel named with kernel= is the family asked for, so this choice is still open (params=
        # pin one build, so they keep the kernel). Judged on the plan the TMA kernel would run: its
        # swap rule may run the call as C^T, whose operands are the other way round (an A it loads
        # itself, A_LDG, unswapped, becomes a B it must copy: 32 x 3184 x 31 fp16 nn)
        tuned_tma = None if lookups_disabled() else lookup_tuned_choice(facts.name, spec, plan)
        swaps = not tuned_tma and _takes_c_trans(spec, plan, None, facts.sm_count)
        tma_plan = planned(ma, mb, c_trans=True) if swaps else plan
        chosen, path = _in_place_or(spec, plan, tma_plan, ma.dtype.itemsize, facts, mbias, act,
                                    tuned_tma=bool(tuned_tma), rank_catalog=rank_catalog)
        if chosen is spec:
            tma_kept = (tuned_tma, tma_plan)
        spec = chosen
    # the tuning cache's entry for the launch as called (an entry was timed unswapped: it keeps the
    # call off a C^T launch)
    # (none for a batch on a persistent kernel: the entries time 2-D GEMMs, and a batch of them is
    # walked as the tiles of all its matrices)
    if tma_kept is not None:
        tuned = tma_kept[0]
    else:
        tuned = None if (params is not None or lookups_disabled() or _walks_batch(spec, kernel_batch)) else \
            lookup_tuned_choice(facts.name, spec, plan)
    # a family with a catalog: the dispatch database's exact hit or the cost model's ranking
    # (runtime/dispatch.py) decides, unless params= or the user's own tuning entry do
    plain = mbias is None and act == 0 and kernel_batch == 1
    if tma_kept is not None:
        plan = tma_kept[1]      # as the in-place check planned it (params None: the same swap rule)
    elif not tuned and _takes_c_trans(spec, plan, params, facts.sm_count):
        plan = planned(ma, mb, c_trans=True)
    choice = plan_ct = None
    copied, copied_ct = (0, 0), (0, 0)
    if params is None and not tuned and spec.configs and min(plan.m, plan.n, plan.k) > 0:
        plan, copied, plan_ct, copied_ct, choice = rank_catalog(spec, plan)
        if choice.chosen_by == "model" and not plan.swapped and autotune is not None:
            autotune(choice)
    elif takes_tensor_maps(spec):
        plan, copied = _tma_plan(spec, ma, mb, plan, planned)
    cfg = LaunchConfig(spec, plan, c_shape, new_c_dtype(spec), kernel_batch, copied, choice=choice,
                       chosen_by="params" if params is not None else "tuning cache" if tuned else "size rules",
                       path=path)
    if plan.m == 0 or plan.n == 0:
        cfg.empty = True
        return cfg
    if plan.k == 0 and mbias is None and act == 0:
        # (with a fused epilogue the kernel runs: its K loop does nothing and the epilogue still
        # applies beta, the bias and the activation)
        return cfg
    target = spec.build_target(facts.target)
    if choice is not None:
        cfg.spec, picked, cfg.split, cfg.in_cluster, cfg.built, cfg.fixup = build_choice(choice, plan, facts, plain,
                                                                                         plan_ct, kernel_batch)
        cfg.config, cfg.chosen_by = picked.label, choice.chosen_by
        if picked.swap:
            cfg.plan, cfg.copied = plan_ct, copied_ct
    else:
        cfg.split, cfg.in_cluster, cfg.fixup, cfg.built = _rules_build(spec, plan, params, tuned, facts, target,
                                                                       kernel_batch, plain)
    return cfg


def untuned_params(spec: KernelSpec, m: int, n: int, k: int, layout: str, facts: DeviceFacts, *, bias: int = 0,
                   act: int = 0) -> tuple[LaunchConfig, dict | None]:
    """(configure's answer, the params= that run it again) for an untuned call of this shape and
    layout on fresh operands (plan.fresh_operands; `bias` a kernel_spec.BIAS_MODES value, `act` an
    activation code): a catalog's pick as its candidate's params (C^T and split included), a kernel
    that chooses by its own rules as its build's -D values (split_k.rerun_params). params None
    where the launch is one params= cannot name (a split of the rules, padded copies). For scripts
    that time a change of kernel selection (tools/choice_ab.py) or lay -D values over what a call
    runs (tools/epilogue_bench.py)."""
    item = DTYPE_ITEMSIZE[spec.dtypes.a]
    c_item = DTYPE_ITEMSIZE[spec.dtypes.c]
    a, b, c, ta, tb = fresh_operands(m, n, k, layout, Dtype(spec.dtypes.a, item), Dtype(spec.dtypes.c, c_item))
    vec = None
    if bias:
        rows = n if bias == 1 else m
        vec = Matrix((rows,) if bias == 1 else (rows, 1), (c_item,) if bias == 1 else (c_item, c_item),
                     Dtype(spec.dtypes.c, c_item), FRESH_ALLOCATION, 0)
    cfg = configure(spec, Problem(a, b, c, vec, ta, tb, act, None), facts)
    params = None
    if cfg.config and cfg.choice is not None:
        found = [x for x in cfg.choice.order if x.label == cfg.config]
        params = found[0].params() if found else None
    elif cfg.built is not None and cfg.split is None and not cfg.in_cluster and cfg.copied == (0, 0):
        params = split_k.rerun_params(cfg.spec.name, defines_of(cfg.built), None, False, 0)
    return cfg, params


def untuned_defines(spec: KernelSpec, m: int, n: int, k: int, layout: str, facts: DeviceFacts, *, bias: int = 0,
                    act: int = 0) -> dict:
    """The -D values a script's overrides lie over to change one knob of what an untuned call of
    `spec` at this shape runs (tools/variant_ab.py, mma_bench.py, epilogue_bench.py; bias and act as
    untuned_params takes them): untuned_params' params= (a catalog's pick with its split, or a rules
    kernel's build), else, where the call runs another kernel (a route, in place) or a launch params=
    cannot name (the rules' split, padded copies), the size rule's choice for this kernel, with the
    split rule's S under its switch for a plain call (a fused one is never split). Before, the scripts
    took the size rule alone, which for a catalog family is the source's defaults."""
    cfg, params = untuned_params(spec, m, n, k, layout, facts, bias=bias, act=act)
    if params is not None and cfg.spec.name == spec.name:
        return dict(params)
    chosen = untuned_size_rule(spec, m, n, k, layout, facts.sm_count, bias=bias, activation=act)
    split = split_k.untuned_split(spec, m, n, k, facts.sm_count, layout) if not (bias or act) else None
    if split is not None:           # params= turn the rule's split off unless they name it
        chosen[spec.split_k.switch] = split.splits
    return chosen


def _rules_build(spec: KernelSpec, plan: LaunchPlan, params: dict | None, tuned: dict | None, facts: DeviceFacts,
                 target: str, kernel_batch: int, plain: bool):
    """(split, cluster S, in-kernel sum, build) of a kernel without a catalog choice: params=, the
    tuning entry, else the spec's size and split rules."""
    split = split_k.choose_split(spec, plan, params, tuned, facts.sm_count, plain=plain)
    in_cluster = split_k.cluster_splits(spec, split, target, params if params is not None else tuned, plan,
                                        facts.sm_count)
    fixup = split_k.in_kernel_fixup(spec, split, params if params is not None else tuned, in_cluster)
    defines = {**split_k.switch_define(spec, split, in_cluster, fixup), **batch_defines(spec, kernel_batch, params),
               **c_stream_defines(spec, plan, kernel_batch, facts, params)}
    return split, in_cluster, fixup, _build_for(spec, plan, params, tuned, facts, target, defines)


# ---- the kernel: epilogue, routes, in_place ------------------------------------------------------
def takes_call(spec: KernelSpec, bias, act: int, batch: int) -> bool:
    """Whether a catalog entry's kernel can take this call: its fused epilogue, and a batch (grid z)
    only where the kernel has a batched mode (sgemm_skinny has none)."""
    return not missing_epilogue(spec, bias, act) and (batch == 1 or spec.call_value_param("batched") is not None)


def missing_epilogue(spec: KernelSpec, bias, act: int) -> list[str]:
    """The call values of this call's fused epilogue ("bias", "activation") the kernel maps no
    parameter to."""
    wants = [what for what, on in (("bias", bias is not None), ("activation", act != 0)) if on]
    return [what for what in wants if spec.call_value_param(what) is None]


def check_epilogue(spec: KernelSpec, bias, act: int) -> None:
    """AsmError unless the kernel has the fused epilogue this call asks for."""
    missing = missing_epilogue(spec, bias, act)
    if missing:
        raise AsmError(f"kernel '{spec.name}' has no fused epilogue for {' and '.join(missing)} (its spec maps no "
                       f"parameter to the call value{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))})",
                       hint="apply the bias/activation in a separate pass, or pick a kernel with a fused epilogue "
                            "(sgemm for float32)")


def _routed(spec: KernelSpec, plan: LaunchPlan, facts: DeviceFacts, bias, act: int) -> KernelSpec:
    """The kernel the spec's routes ([[NAME.route]]) send this launch to, else `spec`. A route whose
    kernel lacks this call's fused epilogue or the device is not taken (the call stays with `spec`);
    one naming a kernel of other dtypes is a spec error."""
    name = spec.route_for(plan.m, plan.n, plan.k, facts.sm_count, call_defines(spec, plan.call_values))
    if name is None:
        return spec
    return _other_kernel(spec, name, "routes to", bias, act, facts.target) or spec


def _other_kernel(spec: KernelSpec, name: str, relation: str, bias, act: int, device_target: str) -> KernelSpec | None:
    """The kernel `spec` names (a route's, `in_place`) where it can take this call, else None: one
    lacking the call's fused epilogue or the device is not taken; one of other dtypes is a spec error."""
    other = get_spec(name)
    if other.dtypes != spec.dtypes:
        raise AsmError(f"kernel '{spec.name}' {relation} '{other.name}', whose dtypes differ "
                       f"({vars(other.dtypes)} against {vars(spec.dtypes)})", hint=f"see {spec.spec_file}")
    if missing_epilogue(other, bias, act) or other.build_target(device_target) is None:
        return None
    return other


def _in_place_or(spec: KernelSpec, plan: LaunchPlan, tma_plan: LaunchPlan, itemsize: int, facts: DeviceFacts,
                 bias, act: int, tuned_tma: bool = False,
                 rank_catalog: Callable[[KernelSpec, LaunchPlan], "CatalogRanking"] | None = None
                 ) -> tuple[KernelSpec, path_model.PathDecision | None]:
    """(the spec's `in_place` kernel where this launch would copy an operand into padded storage
    for `spec` (TMA cannot read its rows) and the path model expects the in-place kernel to finish
    no later than the copies and `spec`, else `spec` (also where the in-place kernel lacks this
    call's fused epilogue or the device); the path model's decision, None where it made none).
    plan: the call as the in-place kernel's dispatch sees it; tma_plan: as `spec` would run it
    (swapped where its swap rule runs the call as C^T), whose operands and C the copies and the
    TMA kernel's store are judged on.
    Also where TMA reads A and B but writes C in elements or pairs (rows of C not whole 16-byte
    pieces) and that store is the TMA kernel's modelled time (path_model.narrow_store_bound): the
    in-place kernel stages C through shared memory and stored such a C at 0.91 TB/s where the TMA
    kernel managed 0.32-0.61 (docs/log/dispatch.md).
    And where TMA reads and writes everything in place (aligned operands, C in whole pieces): the
    cost model's GPU time of the TMA kernel's catalog pick against the in-place kernel's, which
    must win by path_model.aligned_margin; `tuned_tma`: the user's tuning entry for the TMA
    kernel, which keeps it. The TMA side is priced on the operands it would read (padded copies
    where it cannot), ranked by configure's rank_catalog, which keeps the ranking for the launch."""
    unread = unreadable(spec, tma_plan, itemsize)
    copied = sum(op.rows * op.cols * itemsize for op in unread)
    c_bytes = plan.m * plan.n * DTYPE_ITEMSIZE[spec.dtypes.c]
    # (a C the kernel stores shifted, SHIFTED_C, is still priced at the narrow rate: its store rate is
    # not measured yet on the large, store-bound calls this is for)
    c_wide = bool(tma_plan.call_values.get("wide_c", 1))
    model = path_model.coefficients(facts.name, facts.sm_count)
    if not copied and not c_wide and not path_model.narrow_store_bound(tma_plan.m, tma_plan.n, plan.k, model, c_bytes):
        return spec, None
    # nothing copied and C in whole pieces: the two kernels weighed at their own configurations
    aligned = not copied and c_wide
    if aligned and tuned_tma:
        return spec, None
    other = _other_kernel(spec, spec.in_place, "names in_place", bias, act, facts.target)
    if other is None:
        return spec, None
    tma_s = None
    if spec.configs:
        # the TMA kernel's catalog ranked by the cost model, as configure runs it (C^T entries on
        # the C^T launch): its pick's modelled GPU time is the TMA side, copies or none
        tma_s = _catalog_gpu_s(rank_catalog(spec, tma_plan), facts, bias is None and act == 0)
        if tma_s is None:
            return spec, None
    elif aligned:
        return spec, None           # no model of a TMA kernel without a catalog to weigh

    in_place_s = tile = None
    if other.configs:
        # the cost model's time for the configuration gemm() would run in place (split-K where the
        # call is plain): the first of its order whose build the kernel's guards accept, since the
        # model's own pick may be one they refuse for these operands (a 64 x 64 warp tile with
        # 2-byte copies: too many registers), and comparing the copy with a kernel that cannot run
        # chose in place at 3-6x the copy path's time (docs/log/dispatch.md)
        plain = bias is None and act == 0
        choice = dispatch.choose(other, plan.layout, plan.m, plan.n, plan.k, call_values=plan.call_values,
                                 gpu=facts.name, target=facts.target, sms=facts.sm_count, plain=plain,
                                 clock_hz=facts.clock_hz, dram_bytes_per_s=facts.dram_bytes_per_s)
        fastest = min((e.corrected_gpu_s for e in choice.ranked), default=None)
        if aligned and fastest is not None and fastest * path_model.aligned_margin(tma_s, fastest) > tma_s:
            # no candidate can win by the margin, whichever builds: weighed on the model's pick, so
            # the TMA kernel keeps the call without a build of the in-place kernel (ptxas's seconds
            # on a cold cache, most calls)
            in_place_s = fastest
        else:
            try:
                _, runs, _, _, _, _ = build_choice(choice, plan, facts, plain)
            except AsmError:
                return spec, None       # no configuration of the in-place kernel takes these operands
            picked = [e for e in choice.ranked if e.candidate is runs]
            if picked:
                in_place_s = picked[0].corrected_gpu_s
    else:
        chosen = other.size_rule(plan.m, plan.n, plan.k, facts.sm_count, call_defines(other, plan.call_values),
                                 dram_per_sm_cycle=facts.dram_per_sm_cycle)
        tile = (int(chosen.get("BM", 128)), int(chosen.get("BN", 128)))
    if aligned:
        if in_place_s is None:
            return spec, None       # no catalog estimate of the in-place kernel to weigh
        decision = path_model.decide(tma_plan.m, tma_plan.n, plan.k, 0, model, copies=0, in_place_s=in_place_s,
                                     tma_s=tma_s, margin=path_model.aligned_margin(tma_s, in_place_s))
    else:
        decision = path_model.decide(tma_plan.m, tma_plan.n, plan.k, copied, model, tile, copies=len(unread),
                                     in_place_s=in_place_s, c_bytes=c_bytes, c_wide=c_wide,
                                     tma_s=tma_s if c_wide else None)
    return (other if decision.in_place else spec), decision


def _c_trans_launch(spec: KernelSpec, ma: Matrix, mb: Matrix, planned, copied: tuple
                    ) -> tuple[LaunchPlan | None, tuple]:
    """(the C^T launch's plan, what it copies) for the catalog's swap entries: on a TMA kernel with
    the operands TMA would read (_tma_plan), and None where that launch copies an operand the launch
    as called (`copied`) reads in place: the cost model has no term for the copy, so such C^T entries
    are not offered (32 x 3184 x 31 fp16 nn: the K-major A the kernel loads itself, A_LDG, becomes a
    B that TMA cannot read; the copy ran 7.6 us of GPU and 47.6 a call against the in-place kernel's
    5.3 and 31.6 on the H200)."""
    plan_ct, copied_ct = planned(ma, mb, c_trans=True), (0, 0)
    if takes_tensor_maps(spec):
        plan_ct, copied_ct = _tma_plan(spec, ma, mb, plan_ct, planned)
        if sum(1 for x in copied_ct if x) > sum(1 for x in copied if x):
            return None, (0, 0)
    return plan_ct, copied_ct


class CatalogRanking(NamedTuple):
    """A TMA kernel's catalog ranked for one launch (_rank_catalog)."""
    plan: LaunchPlan            # on the operands TMA reads (padded copies where it cannot)
    copied: tuple               # what that launch copies (_tma_plan)
    plan_ct: LaunchPlan | None  # the C^T launch the catalog's swap entries run (_c_trans_launch)
    copied_ct: tuple
    choice: dispatch.Choice


def _rank_catalog(spec: KernelSpec, plan: LaunchPlan, ma: Matrix, mb: Matrix, planned, facts: DeviceFacts, bias,
                  act: int, kernel_batch: int) -> CatalogRanking:
    """`spec`'s catalog ranked for the launch `plan` (configure's planned, ma, mb): on the operands
    TMA would read, C^T entries on the C^T launch, entries whose kernel takes the call's epilogue."""
    copied = (0, 0)
    if takes_tensor_maps(spec):
        plan, copied = _tma_plan(spec, ma, mb, plan, planned)
    plan_ct, copied_ct = None, (0, 0)
    if kernel_batch == 1 and not plan.swapped and any(e.swap for e in spec.configs):
        plan_ct, copied_ct = _c_trans_launch(spec, ma, mb, planned, copied)    # the catalog may run it as C^T
    choice = dispatch.choose(spec, plan.layout, plan.m, plan.n, plan.k, call_values=plan.call_values,
                             gpu=facts.name, target=facts.target, sms=facts.sm_count,
                             plain=bias is None and act == 0 and kernel_batch == 1,
                             clock_hz=facts.clock_hz, dram_bytes_per_s=facts.dram_bytes_per_s,
                             usable=lambda name: takes_call(get_spec(name), bias, act, kernel_batch),
                             swapped=(plan_ct.layout, plan_ct.call_values) if plan_ct is not None else None,
                             batch=kernel_batch)
    return CatalogRanking(plan, copied, plan_ct, copied_ct, choice)


def _catalog_gpu_s(ranked: CatalogRanking, facts: DeviceFacts, plain: bool) -> float | None:
    """The modelled GPU time of the ranking's pick, the first whose build the kernel accepts; None
    where none does."""
    try:
        _, runs, _, _, _, _ = build_choice(ranked.choice, ranked.plan, facts, plain, ranked.plan_ct)
    except AsmError:
        return None
    return next((e.corrected_gpu_s for e in ranked.choice.ranked if e.candidate is runs), None)


def _takes_c_trans(spec: KernelSpec, plan: LaunchPlan, params: dict | None, sm_count: int) -> bool:
    """Whether this 2-D launch with a row-major C runs as C^T with the kernel's transposed store:
    untuned, the spec's swap rules on the user's sizes (plan is not swapped yet); with params=, only
    where they name the kernel's c_trans parameter (e.g. {'C_T': 1, 'BN': 16, ...})."""
    if plan.swapped or plan.batch != 1:
        return False
    return takes_c_trans(spec, plan.m, plan.n, plan.k, sm_count, plan.call_values, params)


# ---- the build -------------------------------------------------------------------------------------
_tuned: dict[tuple, dict | None] = {}
# (kernel, target, tuned parameters) the kernel refused to build: never tried again in this process
_rejected: set[tuple] = set()


def lookup_tuned_choice(gpu_name: str, spec: KernelSpec, plan: LaunchPlan) -> dict | None:
    """The tuning cache's choice for this launch (kernel-level layout and M, N, K, i.e. after the
    operand swap), remembered per process; None when there is none."""
    key = (gpu_name, spec.name, plan.layout, plan.m, plan.n, plan.k)
    if key not in _tuned:
        _tuned[key] = lookup_tuned(gpu_name, spec.name, plan.layout, plan.m, plan.n, plan.k)
    return _tuned[key]


def forget_tuned_lookups() -> None:
    """Forget the tuning-cache answers remembered by this process."""
    _tuned.clear()


def _build_for(spec: KernelSpec, plan: LaunchPlan, params: dict | None, tuned: dict | None, facts: DeviceFacts,
               target: str, launch_defines: dict | None = None) -> BuiltKernel:
    """The kernel built with the caller's params, else the tuning cache's choice, else the untuned
    choice. A tuning-cache entry the kernel refuses (an `.error`, an unknown parameter) costs one
    warning and falls back to the untuned choice; it is remembered, so no later call rebuilds it.
    The caller's own params= that fail raise."""
    if tuned:
        rejected = (spec.name, target, tuple(sorted((k, str(v)) for k, v in tuned.items())))
        if rejected not in _rejected:
            try:
                return build_kernel(spec, choose_params(spec, plan, None, tuned, facts.sm_count, launch_defines,
                                                        facts.dram_per_sm_cycle), target)
            except (AsmError, ValueError, TypeError) as exc:
                failure = exc
        else:
            failure = None
        built = build_kernel(spec, choose_params(spec, plan, None, None, facts.sm_count, launch_defines,
                                                 facts.dram_per_sm_cycle), target)
        if failure is not None:    # the untuned build works, so the entry was at fault
            _rejected.add(rejected)
            why = failure.message if isinstance(failure, AsmError) else str(failure)
            where = f"{failure.span.path}:{failure.span.line}: " if getattr(failure, "span", None) else ""
            shown = " ".join(f"{k}={v}" for k, v in tuned.items())
            warn_cache(f"asmgemm: the tuning cache entry for {spec.name} {plan.layout} {plan.m}x{plan.n}x{plan.k} "
                       f"({shown}) does not build ({where}{why.splitlines()[0] if why else 'error'}); "
                       "using the untuned choice", once=f"tuned:{rejected}")
        return built
    return build_kernel(spec, choose_params(spec, plan, params, None, facts.sm_count, launch_defines,
                                             facts.dram_per_sm_cycle), target)


def build_choice(choice: dispatch.Choice, plan: LaunchPlan, facts: DeviceFacts, plain: bool,
                 plan_ct: LaunchPlan | None = None, kernel_batch: int = 1):
    """(spec, candidate, split, cluster S, build, in-kernel sum) of the first candidate of `choice` whose build the
    kernel's guards accept (a swap candidate built for `plan_ct`, the C^T launch); a refusal is
    remembered per build, so it costs one expansion per process. Every candidate refused: the
    first refusal is the error. (A batch on the TMA kernel: its guards refuse the entries whose
    clusters share tiles or split K, so the catalog's unclustered entries run it.)"""
    def launch_defines(spec: KernelSpec, p: LaunchPlan) -> dict:
        return c_stream_defines(spec, p, kernel_batch, facts, None)
    first = None
    for cand in choice.order:
        cb, built, why, error = dispatch.try_build(cand, plan_ct if cand.swap else plan, facts.sm_count, facts.target,
                                                   plain, launch_defines)
        if built is not None:
            return cb.spec, cand, cb.split, cb.in_cluster, built, cb.fixup
        first = first or error
        choice.refused[cand.label] = why
        if choice.chosen_by == "database" and cand is choice.order[0]:
            choice.chosen_by = "model"          # the exact hit's build is refused: the model's order runs
    if first is not None:
        raise first
    raise AsmError(f"kernel family '{choice.family}': no configuration of its catalog can run this call "
                   f"({len(choice.order)} candidates, every one refused: {'; '.join(choice.refused.values())})")


# ---- batches (3-D operands) ---------------------------------------------------------------------
def mode_kernel(spec: KernelSpec, mode: str, facts: DeviceFacts, bias, act: int) -> KernelSpec:
    """The kernel that runs a launch mode (call value `mode`: "batched", "grouped") of `spec`'s
    family: `spec` where it maps that call value; else its `in_place` kernel where that maps it and
    takes this call's fused epilogue and the device (the Hopper kernels' portable twins); else
    `spec` (the caller then names what is missing)."""
    if spec.call_value_param(mode) is not None or not spec.in_place:
        return spec
    other = _other_kernel(spec, spec.in_place, "names in_place", bias, act, facts.target)
    return other if other is not None and other.call_value_param(mode) is not None else spec


def _walks_batch(spec: KernelSpec, kernel_batch: int) -> bool:
    """Whether this launch is a batch walked by a persistent kernel (hgemm's BATCHED)."""
    return kernel_batch > 1 and spec.launch.grid == "persistent"


def batch_defines(spec: KernelSpec, kernel_batch: int, params: dict | None) -> dict:
    """-D values a batched launch of a persistent kernel gets besides its size rule: its cluster
    switches (the launch table's cluster_rows / cluster_cols constants) at 1, since the multicast
    loads that share a cluster's tiles are 2-D (hgemm/guards.inc refuses them with BATCHED).
    params= are the caller's build as given: the kernel's guards then say what is missing."""
    if params is not None or not _walks_batch(spec, kernel_batch):
        return {}
    return {name: 1 for name in (spec.launch.cluster_rows, spec.launch.cluster_cols) if name}


def c_stream_defines(spec: KernelSpec, plan: LaunchPlan, kernel_batch: int, facts: DeviceFacts,
                     params: dict | None) -> dict:
    """The kernel's C_STREAM switch (its launch table's `c_stream`) at 1 where the launch's C, every
    matrix of a batch, is larger than the GPU's L2: such a C cannot stay in L2 for whoever reads it
    next, and stored evict-first it does not push out the A and B lines the kernel's next tiles read
    again. Measured on the H100 (hgemm, attention's Q.K^T, docs/log/hgemm.md "C evict-first"): b.h = 512,
    s = 2048, d = 128 (8.6 GB of C) 0.803 -> 0.869x torch, b.h = 128, s = 4096 0.801 -> 0.881. params=
    are the caller's build as given; an unknown L2 (0) asks nothing."""
    name = spec.launch.c_stream
    if name is None or params is not None or not facts.l2_bytes:
        return {}
    c_bytes = max(1, kernel_batch) * plan.m * plan.n * DTYPE_ITEMSIZE[spec.dtypes.c]
    return {name: 1} if c_bytes > facts.l2_bytes else {}


def batch_unreadable(plan: LaunchPlan, itemsize: int) -> list:
    """The kernel operands of a batched launch that TMA cannot read in place: rows not 16-byte
    addressable, or matrices whose batch stride is no whole number of 16-byte pieces
    (tensor_map.batch_addressable; a shared operand's 0 is). A batch's A is read through its map
    even where a 2-D launch's would be loaded by the kernel itself (A_LDG is 2-D only)."""
    return [op for op, stride in zip((plan.a, plan.b), plan.batch_strides)
            if not addressable(op.ptr, op.rows, op.ld, itemsize) or not batch_addressable(stride, itemsize)]


def _batch_in_place_or(spec: KernelSpec, plan: LaunchPlan, itemsize: int, facts: DeviceFacts, bias, act: int,
                       pinned: bool) -> KernelSpec:
    """`spec` (a TMA kernel with a batched mode) where TMA reads every matrix of the batch in place;
    else its `in_place` kernel, which reads any batch strides and leading dimensions as they are:
    the padded copy that decides a 2-D call (path_model) has no batched form, so there is nothing
    to weigh. AsmError where that kernel cannot take the call, or params= pin `spec`."""
    unread = batch_unreadable(plan, itemsize)
    if not unread:
        return spec
    names = " and ".join("A" if op is (plan.b if plan.swapped else plan.a) else "B" for op in unread)
    why = (f"kernel '{spec.name}' reads a batch through 3-D TMA maps, which need 16-byte aligned rows and batch "
           f"strides; those of {names} are not, and a batch gets no padded copies")
    other = None if pinned else _batch_in_place_kernel(spec, facts, bias, act)
    if other is None:
        raise AsmError(why, hint="pass operands whose rows and batches start at multiples of 16 bytes"
                       + (f", or name kernel='{spec.in_place}'" if spec.in_place and not pinned else ""))
    return other


def _batch_in_place_kernel(spec: KernelSpec, facts: DeviceFacts, bias, act: int) -> KernelSpec | None:
    """`spec`'s in-place kernel where it has a batched mode and takes this call (its fused epilogue,
    the device), else None."""
    if not spec.in_place:
        return None
    other = _other_kernel(spec, spec.in_place, "names in_place", bias, act, facts.target)
    return other if other is not None and other.call_value_param("batched") is not None else None


def batch_shape(ma: Matrix, mb: Matrix, trans_a: bool, trans_b: bool) -> tuple[int, bool, int, int]:
    """(batch, batched, M, N) of a call: A and B are matrices or batches (batch, rows, cols) of
    them; a batch of 1 or a 2-D operand is shared by every batch (torch.matmul's broadcast of one
    batch dimension); batched: whether C has the batch dimension (some operand is 3-D)."""
    if ma.ndim not in (2, 3) or mb.ndim not in (2, 3):
        raise AsmError(f"A and B must be 2-D matrices or 3-D batches (batch, rows, cols), got shapes {ma.shape} "
                       f"and {mb.shape}")
    ba = ma.shape[0] if ma.ndim == 3 else 1
    bb = mb.shape[0] if mb.ndim == 3 else 1
    if ba != bb and 1 not in (ba, bb):
        raise AsmError(f"batch sizes differ: A has {ba} matrices, B has {bb} (one of them may be 1, or 2-D, to be "
                       "shared by every batch)")
    rows_a, cols_a = ma.shape[-2:]
    rows_b, cols_b = mb.shape[-2:]
    return max(ba, bb), ma.ndim == 3 or mb.ndim == 3, (cols_a if trans_a else rows_a), (rows_b if trans_b else cols_b)


def fold_batch(spec: KernelSpec, ma: Matrix, mb: Matrix, mc: Matrix, batch: int, m: int, n: int, trans_a: bool,
               mbias: Matrix | None) -> tuple[Matrix, Matrix, Matrix, int, tuple]:
    """(A, B, C, kernel batch, batch strides) for a batched call. One 2-D GEMM where it is one,
    with no kernel change: the batches' matrices without the batch dimension when there is one
    batch; when B is shared and A's batches stack as rows (not transposed, rows contiguous, batch
    stride = M rows) and C's do too, C' = A' B with M' = batch * M. Otherwise a batched kernel
    (its spec maps the call value "batched"): the first batch's matrices, the batch, and the
    elements between batches of A, B and C (0: shared). No batched kernel: AsmError naming it."""
    if tuple(mc.shape) != (batch, m, n):
        raise AsmError(f"C has shape {tuple(mc.shape)}, expected ({batch}, {m}, {n}) = the batch of op(A) x op(B)")

    def matrix(x: Matrix) -> Matrix:            # one batch (or a 2-D operand): the matrix itself
        return x._replace(shape=tuple(x.shape[-2:]), strides=tuple(x.strides[-2:])) if x.ndim == 3 else x
    ba = ma.shape[0] if ma.ndim == 3 else 1
    bb = mb.shape[0] if mb.ndim == 3 else 1
    if batch <= 1 or (ba == 1 and bb == 1):
        return matrix(ma), matrix(mb), matrix(mc), 1, (0, 0, 0)

    def stacked_rows(x: Matrix):
        """The row stride of x's batches read as one (batch * rows) x cols row-major matrix, or None."""
        _, rows, cols = x.shape
        s_batch, s_row, s_col = x.strides
        if cols > 1 and s_col != x.dtype.itemsize:
            return None
        if rows == 1:
            return s_batch
        return s_row if s_batch == rows * s_row else None
    why = None
    if bb != 1:
        why = "B has a matrix per batch"
    elif ba == 1:
        why = "A is shared but C is not"
    elif trans_a:
        why = "A is transposed, so its batches do not stack as rows"
    elif stacked_rows(ma) is None:
        why = "A's batches are not contiguous row-major matrices one after the other (batch stride = M rows)"
    elif stacked_rows(mc) is None:
        why = "C's batches are not contiguous row-major matrices one after the other (batch stride = M rows)"
    elif mbias is not None and tuple(mbias.shape) == (m, 1) and m > 1:
        why = "a per-row bias would have to repeat in every batch"
    if why is None:
        rows = batch * m
        return (ma._replace(shape=(rows, ma.shape[2]), strides=(stacked_rows(ma), ma.strides[2])), matrix(mb),
                mc._replace(shape=(rows, n), strides=(stacked_rows(mc), mc.strides[2])), 1, (0, 0, 0))
    if spec.call_value_param("batched") is None:
        raise AsmError(f"kernel '{spec.name}' has no batched mode, and this batched call is not one 2-D GEMM: {why}",
                       hint="share a 2-D B between contiguous row-major batches of A and C (one GEMM with batch*M "
                            "rows), or call gemm once per batch")

    def stride(x: Matrix, name: str) -> int:
        """Elements from one batch of x to the next; 0 for a matrix every batch shares."""
        if x.ndim != 3 or x.shape[0] == 1:
            return 0
        s, item = x.strides[0], x.dtype.itemsize
        if s % item or s < 0 or (s == 0 and name == "C"):
            raise AsmError(f"{name}: a batch stride of {s} bytes is not supported (a non-negative whole number of "
                           f"{item}-byte elements{', and not 0 for C' if name == 'C' else ''})")
        return s // item
    return matrix(ma), matrix(mb), matrix(mc), batch, (stride(ma, "A"), stride(mb, "B"), stride(mc, "C"))


# ---- TMA: operands it cannot read in place ---------------------------------------------------------
def takes_tensor_maps(spec: KernelSpec) -> bool:
    return "tmap_a" in spec.abi or "tmap_b" in spec.abi


def loads_a_itself(spec: KernelSpec, plan: LaunchPlan) -> bool:
    """Whether the kernel reads this launch's A by its own loads instead of TMA: the plan's call
    value a_ldg (rows TMA cannot address, K <= LDG_A_MAX_K) in a kernel whose spec maps it."""
    return bool(plan.call_values.get("a_ldg")) and spec.call_value_param("a_ldg") is not None


def unreadable(spec: KernelSpec, plan: LaunchPlan, itemsize: int) -> list:
    """The kernel operands of this launch (plan.a, plan.b) that TMA cannot read in place (rows not
    16-byte addressable) and the kernel does not load itself (A_LDG): each needs a padded copy."""
    loads_a = loads_a_itself(spec, plan)
    return [op for op in (plan.a, plan.b)
            if not (op is plan.a and loads_a) and not addressable(op.ptr, op.rows, op.ld, itemsize)]


def stores_c_shifted(spec: KernelSpec, plan: LaunchPlan) -> bool:
    """Whether the kernel stages a C whose rows are not whole 16-byte pieces and stores it in whole
    aligned pieces, each staged row shifted (call value shifted_c in a kernel whose spec maps it:
    hgemm's SHIFTED_C; with beta != 0 the kernel's pair stores run instead)."""
    return bool(plan.call_values.get("shifted_c")) and spec.call_value_param("shifted_c") is not None


def _tma_plan(spec: KernelSpec, ma: Matrix, mb: Matrix, plan: LaunchPlan, planned) -> tuple[LaunchPlan, tuple]:
    """(plan, copied) with every operand TMA can read: one whose base or row stride is not a
    multiple of 16 bytes runs from a copy into row-major storage with a padded leading dimension
    (the copy costs one pass over that operand; the alternative is TMA's refusal), planned here on
    the copy's layout (arrays.padded_matrix); copied: (the caller's A, B): the element size of one
    copied, 0 for one read in place, for every launch to copy again. A kernel that maps the call
    value a_ldg reads such an A itself where the plan says so (K-major, K <= LDG_A_MAX_K): no copy."""
    missing = unreadable(spec, plan, ma.dtype.itemsize)
    if not missing:
        return plan, (0, 0)
    user_a_is_kernel_a = not plan.swapped
    copy_a = any(op is (plan.a if user_a_is_kernel_a else plan.b) for op in missing)
    copy_b = any(op is (plan.b if user_a_is_kernel_a else plan.a) for op in missing)
    item = ma.dtype.itemsize
    return (planned(padded_matrix(ma) if copy_a else ma, padded_matrix(mb) if copy_b else mb, plan.c_trans),
            (item if copy_a else 0, item if copy_b else 0))
