"""Every hgemm.sasm configuration the untuned dispatch can pick, derived from kernels.toml.

The golden PTX test of the shipped kernels (test_shipped_ptx_golden.py) sweeps the `.tune` space;
the launches the runtime actually makes come from the spec instead: the swap rule, the size rules
(first match wins), the split rule, the call parameters and the like-tables' fixed defines. This
module walks those with the runtime's own functions over a grid of problem shapes, every layout
and every 16-bit family (hgemm, bgemm, hgemm_f32c, bgemm_f32c: all built from hgemm.sasm), and
returns the distinct -D sets. Nothing here names a configuration: a new size rule or call
parameter in kernels.toml shows up in the list by itself (and `rules_reached` says which rules the
grid reaches, so a rule the grid misses is noticed).

What a call can vary, and how the sweep covers it:
  * shape: SIZES x SIZES x DEPTHS below (M, N, K of the user's call, on an H100's 132 SMs); the
    values sit on both sides of the rules' thresholds (16/32/64 rows, K 64/512/1024/2048/4096/8192,
    row pitches on and off 128-byte lines, tile counts around one wave).
  * operands: freshly allocated contiguous arrays (plan.fresh_plan, what `tune` and `explain`
    plan with), plus a C view whose row pitch is odd (no paired and no 16-byte stores) or even but
    no multiple of 16 bytes (paired stores only), which a caller's strided C gives at any N.
  * epilogue: none, and one fused bias + activation per layout so that each bias mode and each
    activation code is reached (EPILOGUES).
  * batches: contiguous 3-D A, B and C of BATCHES x BATCH_SIZES x BATCH_SIZES x BATCH_DEPTHS
    (attention's Q.K^T and P.V shapes among them), which TMA reads in place (the kernel's BATCHED
    mode; a batch it cannot read runs hgemm_mma, left out like the routes). Their size rules see
    the batch stacked along M (launch.rules_rows), split no K and run unclustered (batch_defines).
  * C past the L2 (C_STREAM, launch_config.c_stream_defines on an H100's L2: H100_L2), 2-D or batched.
Routes to other kernels (hgemm_skinny) are left out: their configurations are gemm_skinny.sasm's.
The rules are compiled to Python for the walk (CompiledRules) and every configuration found is
checked against the spec's own evaluation (RuntimeRules).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from asmgemm.expand import expand
from asmgemm.expr import compile_expression
from asmgemm.kernel_spec import (ACTIVATIONS, BIAS_MODES, DRAM_RATE_NAME, DTYPE_ITEMSIZE, H100_DRAM_PER_SM_CYCLE,
                                 KernelSpec, all_specs)
from asmgemm.parse import parse_source
from asmgemm.pipeline import BuildOptions, build_file, resolve_input
from asmgemm.runtime import launch_config, split_k, tensor_map
from asmgemm.runtime.launch import call_defines, default_params, rules_rows
from asmgemm.runtime.plan import fresh_plan, shifted_c, transposed_bias_mode
from asmgemm.files import read_source

import ptx_digest as golden

SOURCE = "hgemm.sasm"
SMS = 132                                   # the H100 SXM the size rules were measured on
LAYOUTS = ("nn", "nt", "tn", "tt")
SIZES = (1, 16, 32, 33, 64, 65, 128, 129, 256, 384, 512, 768, 1000, 1024, 2048, 2304, 4096, 6144, 10240, 14336)
DEPTHS = (7, 64, 509, 768, 1000, 1024, 1536, 2048, 3000, 4096, 8192, 14336)
# (bias mode, activation code) fused per layout, besides the plain GEMM every layout runs
EPILOGUES = {"nn": (BIAS_MODES["column"], 1), "nt": (BIAS_MODES["row"], 2),
             "tn": (BIAS_MODES["column"], 3), "tt": (BIAS_MODES["row"], len(ACTIVATIONS))}
# a C view's (vec_c, wide_c): an odd row pitch (neither) and an even one off 16 bytes (pairs only)
C_VIEWS = ((0, 0), (1, 0))
# batched calls (3-D operands, every matrix its own): attention's b.h x s x s x d and s x d x s
BATCHES = (2, 32, 512)
BATCH_SIZES = (64, 128, 512, 2048, 4096)
BATCH_DEPTHS = (64, 128, 512, 2048)
# the H100 SXM's L2 (cudaDevAttrL2CacheSize), as launch_config.c_stream_defines reads it from DeviceFacts
H100_L2 = SimpleNamespace(l2_bytes=50 * 1024 * 1024)


def families() -> list[KernelSpec]:
    """The specs whose source is hgemm.sasm, in the spec file's order."""
    return [s for s in all_specs().values() if s.source.name == SOURCE]


class RuntimeRules:
    """The spec's own rule evaluation (kernel_spec's expression trees): what gemm() runs."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec

    def routes(self, m: int, n: int, k: int, calls: dict) -> bool:
        return self.spec.route_for(m, n, k, SMS, calls) is not None

    def swaps(self, m: int, n: int, k: int, calls: dict) -> bool:
        return self.spec.swaps(m, n, k, SMS, calls)

    def size_rule(self, m: int, n: int, k: int, calls: dict, pitches: dict) -> int:
        """The index of the size rule that holds (-1: none, the source defaults)."""
        chosen = self.spec.size_rule(m, n, k, SMS, calls, pitches)
        return [dict(r.set) for r in self.spec.size_rules].index(chosen) if chosen else -1

    def splits(self, m: int, n: int, k: int) -> int:
        return self.spec.split_k.splits(m, n, k, SMS) if self.spec.split_k else 1


class CompiledRules(RuntimeRules):
    """The same rules compiled into Python closures (asmgemm.expr.compile_expression over the
    spec's own expression trees: no rule text is handed to Python's compile/eval), evaluated over
    one dict of names per call: many times faster than the tree walk, which the walk over
    hundreds of thousands of calls needs. walk() checks every configuration found this way against
    RuntimeRules, so a difference cannot go unnoticed."""

    def __init__(self, spec: KernelSpec):
        super().__init__(spec)
        self.terms = [(t.name, compile_expression(t.tree)) for t in spec.terms]
        self.size_rules = [compile_expression(r.tree) for r in spec.size_rules]
        self.swap_rules = [compile_expression(r.tree) for r in spec.swap_rules]
        self.route_rules = [compile_expression(r.tree) for r in spec.routes]
        self.split_rules = [(compile_expression(r.when_tree), compile_expression(r.splits_tree))
                            for r in (spec.split_k.rules if spec.split_k else ())]
        if spec.split_k and any(r.cost is not None for r in spec.split_k.rules):
            raise NotImplementedError("split rules with a cost: use RuntimeRules")
        self.c_bytes = DTYPE_ITEMSIZE[spec.dtypes.c]

    @staticmethod
    def _names(m: int, n: int, k: int, more: dict) -> dict:
        return {"M": m, "N": n, "K": k, "SMS": SMS, **more}

    def routes(self, m, n, k, calls):
        names = self._names(m, n, k, calls)
        return any(r(names) for r in self.route_rules)

    def swaps(self, m, n, k, calls):
        names = self._names(m, n, k, calls)
        return any(r(names) for r in self.swap_rules)

    def size_rule(self, m, n, k, calls, pitches):
        names = self._names(m, n, k, {**dict.fromkeys((p for p, _ in self.spec.call_params), 0), **calls,
                                      **pitches, "C_BYTES": self.c_bytes,
                                      DRAM_RATE_NAME: H100_DRAM_PER_SM_CYCLE})
        for name, term in self.terms:
            names[name] = term(names)
        return next((i for i, r in enumerate(self.size_rules) if r(names)), -1)

    def splits(self, m, n, k):
        names = self._names(m, n, k, {})
        return next((s(names) for w, s in self.split_rules if w(names)), 1)


def _padded(pitch: int, name: str, values: dict) -> int:
    """The pitch the launch plans with: TMA-read operands whose rows it cannot address are padded
    copies (gemm._tma_ready), except an A the kernel loads itself (a_ldg)."""
    if name == "PITCH_A" and values.get("a_ldg"):
        return pitch
    return tensor_map.padded_pitch(pitch)


def dispatched(rules: RuntimeRules, m: int, n: int, k: int, layout: str, bias: int, act: int,
               c_view: tuple[int, int] | None, batch: int = 1) -> tuple[dict, int] | None:
    """(the -D set an untuned gemm() builds for this call, the index of the size rule that chose
    it, -1 for none), or None where the spec routes the call to another kernel. The steps of
    launch_config.configure for an untuned call: route, swap, size rule over the padded pitches,
    split, C_STREAM, call parameters, the table's fixed defines (asm/runtime/launch.choose_params).
    `batch` > 1: a batch of `batch` contiguous M x N x K GEMMs, run by the kernel's BATCHED mode
    where TMA reads it in place (None otherwise: hgemm_mma runs it)."""
    spec = rules.spec
    item_a, item_c = DTYPE_ITEMSIZE[spec.dtypes.a], DTYPE_ITEMSIZE[spec.dtypes.c]
    plan = fresh_plan(m, n, k, layout, item_a, item_c)
    values = {**plan.call_values, "bias": bias, "activation": act}
    if c_view is not None:
        values["vec_c"], values["wide_c"] = c_view
    values["shifted_c"] = shifted_c(item_c, False, values["wide_c"], act)
    if batch > 1:
        # launch_config.configure: a batch TMA cannot read in place (rows or matrices off 16
        # bytes) runs on the in-place kernel; a batched launch is never routed, swapped or split
        plan = dataclasses.replace(plan, batch=batch, batch_strides=(m * k, k * n, m * n))
        if launch_config.batch_unreadable(plan, item_a):
            return None
        values["batched"] = 1
    elif rules.routes(m, n, k, call_defines(spec, values)):
        return None
    elif rules.swaps(m, n, k, call_defines(spec, values)):
        plan = fresh_plan(m, n, k, layout, item_a, item_c, c_trans=True)
        values = {**plan.call_values, "bias": transposed_bias_mode(bias), "activation": act}
        values["shifted_c"] = shifted_c(item_c, True, values["wide_c"], act)
    calls = call_defines(spec, values)
    fresh = spec.fresh_pitches(plan.m, plan.n, k, calls)
    index = rules.size_rule(rules_rows(spec, plan), plan.n, k, calls,
                            {name: _padded(p, name, values) for name, p in fresh.items()})
    defines = {**default_params(spec), **(dict(spec.size_rules[index].set) if index >= 0 else {})}
    launch_defines = {**launch_config.batch_defines(spec, batch, None),
                      **launch_config.c_stream_defines(spec, plan, batch, H100_L2, None)}
    defines.update(launch_defines)
    sk = spec.split_k
    if sk is not None and batch == 1:
        requested = max(1, min(rules.splits(plan.m, plan.n, k), split_k.MAX_SPLITS))
        if requested > 1 and (bias or act or (plan.c_trans and not sk.c_trans)):
            requested = 1           # split-K runs only for a plain GEMM (split_k.choose_split)
        split = split_k.split_for(k, requested, sk.k_multiple)
        defines.update(split_k.switch_define(spec, split, split_k.cluster_splits(spec, split, "sm_90a", None, plan, SMS)))
    defines.update(call_defines(spec, values, defines))
    defines.update(spec.defines)
    return defines, index


def calls():
    """(spec, M, N, K, layout, bias, activation, C view[, batch]) of every call the walk makes."""
    for spec in families():
        for layout in LAYOUTS:
            for epilogue in ((0, 0), EPILOGUES[layout]):
                for m, n, k in itertools.product(SIZES, SIZES, DEPTHS):
                    for c_view in (None,) + C_VIEWS:
                        if c_view is not None and c_view[0] == 1 and n % 2:
                            continue         # an odd N has no paired stores in any view
                        yield spec, m, n, k, layout, *epilogue, c_view
            for batch, m, n, k in itertools.product(BATCHES, BATCH_SIZES, BATCH_SIZES, BATCH_DEPTHS):
                yield spec, m, n, k, layout, 0, 0, None, batch


def walk() -> tuple[list[dict], dict[str, set[int]]]:
    """(the distinct -D sets in first-seen order, family name -> the size rule indices reached).
    Each set is recomputed for the first call that produced it through the runtime's own rule
    evaluation; a difference from the compiled rules raises AssertionError."""
    seen: dict[tuple, tuple[dict, tuple]] = {}
    reached: dict[str, set[int]] = {}
    compiled = {spec.name: CompiledRules(spec) for spec in families()}
    for call in calls():
        spec, *args = call
        got = dispatched(compiled[spec.name], *args)
        if got is None:
            continue
        defines, index = got
        reached.setdefault(spec.name, set()).add(index)
        seen.setdefault(tuple(sorted(defines.items())), (defines, call))
    for defines, (spec, *args) in seen.values():
        again = dispatched(RuntimeRules(spec), *args)
        assert again is not None and again[0] == defines, \
            f"{spec.name} {args}: compiled rules gave {defines}, the spec's own {again}"
    return [d for d, _ in seen.values()], reached


def rules_reached() -> dict[str, set[int]]:
    return walk()[1]


def configs() -> list[dict]:
    """Every -D set (all parameters named, source defaults included) the dispatch builds hgemm.sasm with."""
    return walk()[0]


# ---- the golden digests -------------------------------------------------------------------------

GOLDEN = Path(__file__).parent / "golden" / "hgemm_dispatch_ptx_sha256.json"
TARGET = "sm_90a"


def source_defaults() -> dict[str, int]:
    """hgemm.sasm's `?=` parameters at their defaults, in source order."""
    return dict(expand(parse_source(read_source(resolve_input("hgemm")))).parameters)


def config_id(defines: dict, defaults: dict) -> str:
    """'hgemm BN=128 CLUSTER_M=1': the defines that differ from the source defaults, in source order
    (a define the source no longer has is shown last, so that it cannot vanish from the id)."""
    order = {name: i for i, name in enumerate(defaults)}
    shown = [(k, v) for k, v in defines.items() if defaults.get(k) != v]
    shown.sort(key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
    return " ".join(["hgemm"] + [f"{k}={v}" for k, v in shown])


def defines_of(config: str) -> dict[str, str]:
    """The -D set a config id names (the inverse of config_id over the defaults)."""
    return dict(item.split("=", 1) for item in config.split()[1:])


def normalized(ptx: str, path: str) -> str:
    """hgemm's PTX as the golden digests compare it (tests/ptx_digest.py)."""
    return golden.normalized(ptx, path, "hgemm")


def ptx_digest(config: str) -> str:
    """sha256 of the normalized PTX of one configuration (no ptxas: the PTX text is the contract)."""
    result = build_file("hgemm", BuildOptions(defines=defines_of(config), target=TARGET))
    return golden.digest(result.ptx, result.source.path, "hgemm")


def digests(configs: list[str], workers: int | None = None) -> dict[str, str]:
    """ptx_digest of each configuration, built by a process pool (each build is independent)."""
    workers = workers or max(1, min(len(configs), os.cpu_count() or 1))
    if workers == 1:
        return {c: ptx_digest(c) for c in configs}
    with ProcessPoolExecutor(workers) as pool:
        return dict(zip(configs, pool.map(ptx_digest, configs, chunksize=4)))


def config_ids() -> list[str]:
    defaults = source_defaults()
    return [config_id(d, defaults) for d in configs()]


def main() -> None:
    """Regenerate the golden file: python3 tests/hgemm_dispatch_configs.py (then review the diff)."""
    ids = config_ids()
    print(f"{len(ids)} configurations; building", flush=True)
    GOLDEN.write_text(json.dumps(digests(ids), indent=1) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
