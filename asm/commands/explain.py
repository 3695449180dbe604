"""`asmgemm explain M N K`: which configuration asmgemm.gemm runs for a call, and why."""
from __future__ import annotations

import click
from rich.table import Table

from ..errors import AsmError
from ..kernel_spec import DTYPE_ITEMSIZE, KernelSpec, activation_code, get_spec
from ..runtime import dispatch, dispatch_db
from ..runtime.arrays import Dtype
from ..runtime.build_cache import defines_of
from ..runtime.cost_model import variant_of, why_slower
from ..runtime.gpu import DeviceFacts, device_facts, gpu_available
from ..runtime.launch import size_rule_index
from ..runtime.launch_config import Problem, build_choice, configure, new_c_dtype, pick_spec
from ..runtime.plan import fresh_operands, fresh_plan
from .common import LAYOUT, emit_json, make_console

DTYPES = ("float32", "float16", "bfloat16")


@click.command("explain")
@click.argument("m", type=click.IntRange(1, 1 << 20))
@click.argument("n", type=click.IntRange(1, 1 << 20))
@click.argument("k", type=click.IntRange(1, 1 << 20))
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="A and B's dtype.  [default: float32, or the dtype --kernel takes]")
@click.option("--kernel", "kernel", default=None, metavar="NAME",
              help="Explain this kernel's catalog, as gemm(kernel=NAME) runs the call (e.g. hgemm_mma, the "
                   "in-place kernel, on a GPU whose 16-bit calls otherwise go to the TMA kernel). Default: the "
                   "kernel gemm() picks by dtype.")
@click.option("--layout", type=LAYOUT, default="nn", show_default=True,
              help="Storage of A and B: first letter A, second B; n = as is, t = stored transposed.")
@click.option("--fused", is_flag=True, help="The call has a fused bias or activation (no split-K then).")
@click.option("--batch", type=click.IntRange(1, 1 << 20), default=1, show_default=True,
              help="A batch of this many M x N x K products, each with its own A and B (attention's Q.K^T "
                   "and P.V: 3-D operands one matrix after another); batched calls are never split.")
@click.option("--gpu", "gpu", default=None, metavar="NAME",
              help="Explain for this GPU's dispatch database (a name such as 'NVIDIA H100 80GB HBM3' or its "
                   "file's slug). Default: the GPU here, else the shipped database's GPU.")
@click.option("--top", type=click.IntRange(1, 1000), default=12, show_default=True, help="Candidates listed.")
@click.option("--no-build", is_flag=True,
              help="Do not build the candidates to check them against the kernels' .error guards (faster; the "
                   "pick shown is then the model's first, which a guard might still refuse, and the 'runs' line, "
                   "which plans the call as gemm() does, is left out).")
@click.option("--json", "as_json", is_flag=True, help="Every candidate and term as JSON.")
def command(m, n, k, dtype, layout, fused, batch, gpu, kernel, top, no_build, as_json):
    """Show the candidates of an M x N x K call, the cost model's estimate for each, the pick, and
    why the others lost.

    \b
    The call is planned as asmgemm.gemm plans one on fresh contiguous operands of this layout. The
    kernel family comes from the dtype; its catalog ([[FAMILY.config]] in kernels.toml) crossed
    with split-K choices gives the candidates; the GPU's dispatch database gives the model's
    coefficients and exact hits (a call measured by `asmgemm tune --sweep`). Terms (microseconds):
      tiles/slots   blocks of the grid, and how many the GPU holds at once (SMs x blocks per SM)
      waves         tiles / slots; a last wave that fills few slots wastes the rest
      variant       the block time's factor for how the call's operands load (the load variant:
                    layout, 128-bit loads, copy widths), "(layout)" where the sweep never timed the
                    configuration with that variant and its layout's factor stands in
      block         one block's modelled time (fixed part + K steps, times that factor)
      load          the load floor: the bytes all the blocks load (L2 hits and misses) at the
                    fastest rate the sweep saw the configuration load them
      launch        (--json) the launch's own fixed time (its start and drain), once a launch
                    whatever its blocks; part of compute
      sum           where a split's slices are added: "kernel" (the reduce kernel, a second
                    launch), "cluster" (inside clusters of S blocks), "in_kernel" (the last
                    block of each tile, one launch) or "cluster+in_kernel" (past 8 splits:
                    clusters of C blocks, label /sScC, each into a slice that the last block of
                    each rank adds, one launch)
      split         that sum's modelled cost
      host          the call's host work: Python, arguments and the launch, plus the reduce
                    kernel's launch and workspace or the kept scratch of a split summed in the kernel
      call          modelled GPU time + host time of the call (what a caller waits for)
    For 16-bit dtypes on a GPU with a TMA kernel (sm_90) the table is the TMA kernel's catalog, and
    "runs" first says which kernel gemm() launches and the path model's two times: the TMA
    kernel's pick (with padded copies where TMA cannot read an operand's rows) against the
    in-place kernel's pick (hgemm_mma), and which one won. A launch chosen by size rules (a route's
    kernel, e.g. hgemm_skinny) names its rule, numbered as docs/kernel-selection.md numbers them.

    \b
    Examples:
      asmgemm explain 4096 4096 4096
      asmgemm explain 1 4096 14336 --layout nt
      asmgemm explain 305 923 6 --dtype float16 --json
      asmgemm explain 4096 4096 128 --dtype float16 --layout nt --batch 128    # attention's Q.K^T
      asmgemm explain 4096 4096 4096 --kernel hgemm_mma    # the in-place kernel's catalog on an H100
    """
    facts = _facts(gpu)
    if dtype is None:
        dtype = get_spec(kernel).dtypes.a if kernel else "float32"
    act = activation_code("relu") if fused else 0
    runs_with = pick_spec(kernel, dtype, None, facts, None, act)      # the spec gemm() plans the call with
    family = runs_with
    if not family.configs and family.in_place:
        inner = get_spec(family.in_place)
        note = (f"{family.name} (TMA) has no catalog: it runs by its size rules; calls whose operands TMA cannot "
                f"read may run {inner.name}, explained here")
        family = inner
    elif not family.configs:
        raise AsmError(f"kernel '{family.name}' ({dtype} on {facts.target}) has no catalog: it runs by its "
                       "size rules (kernels.toml), which explain does not cover")
    else:
        note = None
    size = DTYPE_ITEMSIZE[family.dtypes.a]
    plan = fresh_plan(m, n, k, layout, size, DTYPE_ITEMSIZE[family.dtypes.c])
    # (a batch is never swapped nor split: launch_config.configure's plan_ct and `plain`)
    plan_ct = (fresh_plan(m, n, k, layout, size, DTYPE_ITEMSIZE[family.dtypes.c], c_trans=True)
               if batch == 1 and any(e.swap for e in family.configs) else None)
    plain = not fused and batch == 1
    choice = dispatch.choose(family, plan.layout, plan.m, plan.n, plan.k, call_values=plan.call_values,
                             gpu=facts.name, target=facts.target, sms=facts.sm_count, plain=plain,
                             clock_hz=facts.clock_hz, dram_bytes_per_s=facts.dram_bytes_per_s,
                             swapped=(plan_ct.layout, plan_ct.call_values) if plan_ct is not None else None,
                             batch=batch)
    ran = None if no_build else _first_that_builds(choice, plan, facts, plain, plan_ct)
    pick = ran or choice.pick
    if not no_build and pick is not None:
        # the candidates modelled faster than the pick need a reason: a refusal is one
        pick_s = next(e.call_s for e in choice.ranked if e.candidate.label == pick.label)
        _check_builds([e.candidate for e in choice.ranked[:top] if e.call_s < pick_s], choice, plan, facts,
                      plain, plan_ct)
    by_label = {e.candidate.label: e for e in choice.ranked}
    best = by_label[pick.label] if pick is not None else None
    rows = []
    for e in choice.ranked[:top] if pick is None or pick.label in [x.candidate.label for x in choice.ranked[:top]] \
            else [best] + choice.ranked[:top - 1]:
        label = e.candidate.label
        if label in choice.refused:
            why = f"refused by the kernel: {choice.refused[label]}"
        elif e is not best and e.call_s <= best.call_s:
            # modelled no slower than the pick: the pick is the database's measured best for this call
            why = "modelled faster, but the sweep measured the pick faster on this call"
        elif e is best:
            why = "the pick (" + ("exact database hit" if choice.chosen_by == "database" and
                                  choice.order[0].label == label else "least modelled call time") + ")"
        else:
            why = why_slower(e, best)
        rows.append({**e.to_json(), "why": why})
    runs = None if no_build else _what_runs(runs_with, m, n, k, dtype, layout, act, facts, batch)
    report = {"call": {"m": m, "n": n, "k": k, "dtype": dtype, "layout": layout, "fused": fused, "batch": batch,
                       "kernel": kernel},
              "runs": runs,
              "kernel_call": {"m": plan.m, "n": plan.n, "k": plan.k, "layout": plan.layout, "swapped": plan.swapped},
              "gpu": facts.name, "sms": facts.sm_count, "family": family.name, "note": note,
              "model": choice.model_source, "chosen_by": choice.chosen_by,
              "load_variant": variant_of(plan.layout, plan.call_values),
              "pick": pick.label if pick is not None else None,
              "pick_params": pick.params() if pick is not None else None,
              "candidates": len(choice.ranked), "refused": dict(choice.refused), "rows": rows}
    if as_json:
        emit_json(report)
        return
    _print(report)


def _what_runs(spec: KernelSpec, m: int, n: int, k: int, dtype: str, layout: str, act: int, facts: DeviceFacts,
               batch: int = 1) -> dict:
    """What asmgemm.gemm launches with `spec` (pick_spec's: kernel= or by dtype) for this call on
    fresh contiguous operands and a C it allocates (batch > 1: 3-D ones), `act` its activation code:
    launch_config.configure on their descriptions, as gemm plans (no GPU needed; builds cached)."""
    c_name = new_c_dtype(spec) or dtype
    a, b, c, trans_a, trans_b = fresh_operands(m, n, k, layout, Dtype(dtype, DTYPE_ITEMSIZE[dtype]),
                                               Dtype(c_name, DTYPE_ITEMSIZE[c_name]), batch)
    cfg = configure(spec, Problem(a, b, c, None, trans_a, trans_b, act), facts)
    copies = [name for name, size in zip("AB", cfg.copied) if size]
    return {"kernel": cfg.spec.name, "config": cfg.config, "chosen_by": cfg.chosen_by, "copies": copies,
            "tile": [cfg.built.tile_m, cfg.built.tile_n] if cfg.built is not None else None,
            "path": cfg.path.to_json() if cfg.path is not None else None,
            "size_rule": _size_rule(cfg, facts),
            "params": defines_of(cfg.built) if cfg.built is not None else None,
            # the runtime stores C evict-first (launch.c_stream) where C is larger than the GPU's L2,
            # which a GPU explained from its dispatch database does not say
            "c_stream_unknown": bool(cfg.built is not None and cfg.spec.launch.c_stream and not facts.l2_bytes)}


def _size_rule(cfg, facts: DeviceFacts) -> dict | None:
    """The size rule a launch chosen by its kernel's size rules took: its number (1-based, as
    docs/kernel-selection.md numbers them), condition and -D set, and the GPU's DRAM rate the rules
    saw; number None where none holds (the source's defaults). None for other launches."""
    if cfg.built is None or cfg.chosen_by != "size rules" or not cfg.spec.size_rules:
        return None
    i = size_rule_index(cfg.spec, cfg.plan, facts.sm_count, facts.dram_per_sm_cycle)
    rule = None if i is None else cfg.spec.size_rules[i]
    return {"spec": cfg.spec.name, "number": None if i is None else i + 1, "when": rule.when if rule else None,
            "set": dict(rule.set) if rule else {}, "dram_per_sm_cycle": facts.dram_per_sm_cycle}


def _check_builds(cands, choice, plan, facts, plain, plan_ct=None) -> None:
    """Build each candidate (cached) and record the kernel's refusals in `choice.refused`."""
    for cand in cands:
        _, built, why, _ = dispatch.try_build(cand, plan_ct if cand.swap else plan, facts.sm_count, facts.target,
                                              plain)
        if built is None:
            choice.refused[cand.label] = why


def _first_that_builds(choice, plan, facts, plain, plan_ct=None):
    """The candidate gemm() would run: what the runtime's launch_config.build_choice takes, the
    first in order whose build the kernel accepts (builds are cached: ptxas once per variant);
    None when the kernel refuses every one."""
    try:
        return build_choice(choice, plan, facts, plain, plan_ct)[1]
    except AsmError:
        return None


def _facts(gpu_name: str | None):
    """The GPU to explain for: named (its database), else the one here, else the shipped database's."""
    if gpu_name is None and gpu_available():
        return device_facts()
    files = dispatch_db._files()
    if not files:
        raise AsmError("no GPU here and no dispatch database to explain for", hint="run on a GPU, or pass --gpu")
    want = dispatch_db.slug(gpu_name) if gpu_name else None
    for path in files:
        data = dispatch_db.read(path)
        if want is None or path.stem == want or dispatch_db.slug(data["gpu"]) == want:
            return DeviceFacts(-1, data["gpu"], data["target"], int(data["sms"]), float(data["clock_hz"]),
                               float(data["dram_bytes_per_s"]))
    names = ", ".join(sorted({dispatch_db.read(p)["gpu"] for p in files}))
    raise AsmError(f"--gpu {gpu_name}: no dispatch database of that GPU (there are: {names})")


def _factor(row: dict) -> str:
    """The variant column: the factor, and where it came from unless the sweep timed the variant."""
    if row["factor_from"] == "none":
        return "-"
    return f"{row['variant_factor']:.2f}" + (" (layout)" if row["factor_from"] == "layout" else "")


def _neighbours(row: dict) -> str:
    """The neighbours column: the factor the sweep's nearest calls give the blocks' time, then the
    floors' ("f") where it is not 1 (cost_model.NEIGHBOURS)."""
    blocks, floor = row["neighbours"], row["floor_neighbours"]
    if blocks == 1.0 and floor == 1.0:
        return "-"
    return f"{blocks:.2f}" + (f" f{floor:.2f}" if floor != 1.0 else "")


def _print(r: dict) -> None:
    console = make_console()
    c, kc = r["call"], r["kernel_call"]
    batch = f"a batch of {c['batch']} x " if c["batch"] > 1 else ""
    console.print(f"[bold]{batch}{c['m']} x {c['n']} x {c['k']}[/] {c['dtype']} {c['layout']}"
                  f"{' fused' if c['fused'] else ''} on {r['gpu']} ({r['sms']} SMs): family [bold]{r['family']}[/], "
                  f"{r['candidates']} candidates")
    if kc["swapped"]:
        console.print(f"  runs as C^T: kernel call {kc['m']} x {kc['n']} x {kc['k']} {kc['layout']}")
    if r["note"]:
        console.print(f"  note: {r['note']}")
    runs = r["runs"]
    if runs is not None:
        what = f"{runs['kernel']} " + (f"[bold]{runs['config']}[/]" if runs["config"] else
                                      f"{runs['tile'][0]} x {runs['tile'][1]} tiles" if runs["tile"] else "")
        copies = f", copying {' and '.join(runs['copies'])} to padded rows first" if runs["copies"] else ""
        console.print(f"  runs: {what} ({runs['chosen_by']}){copies}")
        rule = runs["size_rule"]
        if rule is not None:
            took = (f"size rule {rule['number']} of {rule['spec']}: when {rule['when']} -> "
                    + " ".join(f"{k}={v}" for k, v in rule["set"].items()) if rule["number"] is not None else
                    f"no size rule of {rule['spec']} holds: the source's defaults")
            dram = rule["dram_per_sm_cycle"]
            dram = "unknown: the H100 SXM's" if dram is None else dram
            console.print(f"  {took} (docs/kernel-selection.md; DRAM_PER_SM_CYCLE {dram})")
        if runs["params"]:
            console.print("  built with: " + " ".join(f"{k}={v}" for k, v in sorted(runs["params"].items())))
        if runs["c_stream_unknown"]:
            console.print("  (the GPU's L2 size is not in its dispatch database: on the GPU itself a C larger than "
                          "L2 is also stored evict-first, C_STREAM=1)")
        p = runs["path"]
        if p is not None and p["copies"]:
            console.print(f"  path: TMA cannot read {p['copies']} operand(s) in place: copies + TMA kernel "
                          f"{p['copy_path_us']:.1f} us ({p['copy_host_us']:.1f} per-call cost of the copies, "
                          f"{p['copy_bytes_us']:.1f} moving {p['copied_bytes']} bytes, {p['tma_kernel_us']:.1f} "
                          f"the kernel) against the in-place kernel's {p['in_place_us']:.1f} us (GPU): "
                          f"{'in place' if p['in_place'] else 'copies'} (runtime/path_model.py)")
        elif p is not None and not p["narrow_c"]:
            # everything read and written in place: the two kernels weighed at their own configurations
            console.print(f"  path: TMA reads A, B and C in place: the TMA kernel at its configuration "
                          f"{p['tma_kernel_us']:.1f} us against the in-place kernel's {p['in_place_us']:.1f} us "
                          f"x {p['margin']:.2f} (the two estimates' error) (GPU): "
                          f"{'in place' if p['in_place'] else 'the TMA kernel'} (runtime/path_model.py)")
        elif p is not None:
            # nothing to copy: the TMA kernel's time is its store of C in elements or pairs
            console.print(f"  path: TMA reads A and B but would write C in elements or pairs (rows not 16-byte "
                          f"pieces): the TMA kernel {p['tma_kernel_us']:.1f} us (that store) against the in-place "
                          f"kernel's {p['in_place_us']:.1f} us (GPU): "
                          f"{'in place' if p['in_place'] else 'the TMA kernel'} (runtime/path_model.py)")
    console.print(f"  coefficients: {r['model']}")
    console.print("  neighbours: measured / modelled GPU time on the sweep's nearest calls, on the term each "
                  "was measured against: the blocks' time, or (f) the floors'; call us = the GPU time so "
                  "corrected + host us")
    layout, vec, widths = (r["load_variant"].split(":") + ["", ""])[:3]
    console.print(f"  load variant {r['load_variant']}: layout {layout}, 128-bit loads of A and B {' and '.join(vec) or '-'}, "
                  f"copy widths {widths.replace('/', ' and ')} bytes; the 'variant' column is its factor on a block's "
                  "K steps, '(layout)' where the sweep never timed the configuration with it")
    pick = "pick" if runs is None or runs["kernel"] == r["family"] else f"{r['family']}'s pick (where it runs)"
    console.print(f"  {pick}: [bold]{r['pick']}[/] ({'exact hit in the database' if r['chosen_by'] == 'database' else 'the model'})"
                  f"  params={r['pick_params']}")
    t = Table(show_edge=False, pad_edge=False)
    for col in ("config", "kernel", "tile", "tiles/slots", "waves", "k steps", "variant", "block us", "load us",
                "sum", "split us", "host us", "neighbours", "call us", "why"):
        # (the numbers never wrap: the reasons take what the terminal's width leaves)
        t.add_column(col, justify="left" if col in ("config", "kernel", "sum", "why") else "right",
                     no_wrap=col not in ("config", "sum", "why"))
    for row in r["rows"]:
        t.add_row(row["config"], row["kernel"], "x".join(map(str, row["tile"])), f"{row['tiles']}/{row['slots']}",
                  f"{row['waves']:.2f}", str(row["k_steps"]), _factor(row), f"{row['block_us']:.1f}",
                  f"{row['load_us']:.1f}" if row["load_us"] else "-", row["reduce"] or "-",
                  f"{row['split_us']:.1f}", f"{row['host_us']:.1f}", _neighbours(row), f"{row['call_us']:.1f}",
                  row["why"])
    console.print(t)
