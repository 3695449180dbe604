"""Every hgemm.sasm configuration the untuned dispatch can pick, derived from kernels.toml.

The golden PTX test of the shipped kernels (test_shipped_ptx_golden.py) sweeps the `.tune` space;
the launches the runtime actually makes come from the spec instead: the family's catalog
([[hgemm.config]], ranked per call by the cost model, so any entry may run a call on some GPU),
the call parameters and the like-tables' fixed defines. This module walks those with the
runtime's own functions (catalog.candidates, dispatch.candidate_build) over a few calls per kind
of operand, every layout and every 16-bit family (hgemm, bgemm, hgemm_f32c, bgemm_f32c: all built
from hgemm.sasm), and returns the distinct -D sets the kernel's guards accept. Nothing here names
a configuration: a new catalog entry or call parameter in kernels.toml shows up in the list by
itself (and `entries_reached` says which entries the walk builds, so an entry no call can run is
noticed).

What a call can vary, and how the walk covers it (the catalog's candidates do not depend on the
sizes beyond these):
  * operands: fresh contiguous arrays (plan.fresh_plan, what `tune` and `explain` plan with) of
    SHAPES: aligned rows; an odd N and K = 7 (an A whose rows TMA cannot address loaded by the
    kernel itself where it is K-major: a_ldg; C without paired stores); C larger than the L2
    (C_STREAM, launch_config.c_stream_defines on an H100's L2: H100_L2); plus a C view whose row
    pitch is odd (no paired and no 16-byte stores) or even but no multiple of 16 bytes (paired
    stores only), which a caller's strided C gives at any N.
  * epilogue: none (split-K's partial pass where an entry lists splits), and one fused bias +
    activation per layout so that each bias mode and each activation code is reached (EPILOGUES).
  * the C^T launch of the catalog's swap entries, with its own call values.
  * batches: contiguous 3-D A, B and C (the kernel's BATCHED mode; the catalog's entries without
    clusters of their own).
Routes to other kernels (hgemm_skinny) are left out: their configurations are gemm_skinny.sasm's.
"""
from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from asmgemm.expand import expand
from asmgemm.errors import AsmError
from asmgemm.kernel_spec import ACTIVATIONS, BIAS_MODES, DTYPE_ITEMSIZE, KernelSpec, all_specs
from asmgemm.parse import parse_source
from asmgemm.pipeline import BuildOptions, build_file, resolve_input
from asmgemm.runtime import dispatch, launch_config
from asmgemm.runtime.catalog import candidates
from asmgemm.runtime.plan import fresh_plan, shifted_c, transposed_bias_mode
from asmgemm.files import read_source

import ptx_digest as golden

SOURCE = "hgemm.sasm"
SMS = 132                                   # an H100 SXM's
LAYOUTS = ("nn", "nt", "tn", "tt")
# (M, N, K): aligned; odd N with K = 7 (a_ldg where A is K-major, no paired stores of C); C past the L2
SHAPES = ((1000, 1024, 1024), (64, 1001, 7), (8192, 8192, 1024))
# (bias mode, activation code) fused per layout, besides the plain GEMM every layout runs
EPILOGUES = {"nn": (BIAS_MODES["column"], 1), "nt": (BIAS_MODES["row"], 2),
             "tn": (BIAS_MODES["column"], 3), "tt": (BIAS_MODES["row"], len(ACTIVATIONS))}
# a C view's (vec_c, wide_c): an odd row pitch (neither) and an even one off 16 bytes (pairs only)
C_VIEWS = ((0, 0), (1, 0))
BATCH = (8, 512, 512, 128)                  # a batch of 8 products of 512 x 512 x 128
# the H100 SXM's L2 (cudaDevAttrL2CacheSize), as launch_config.c_stream_defines reads it from DeviceFacts
H100_L2 = SimpleNamespace(l2_bytes=50 * 1024 * 1024)
TARGET = "sm_90a"


def families() -> list[KernelSpec]:
    """The specs whose source is hgemm.sasm, in the spec file's order."""
    return [s for s in all_specs().values() if s.source.name == SOURCE]


def dispatched(spec: KernelSpec, m: int, n: int, k: int, layout: str, bias: int, act: int,
               c_view: tuple[int, int] | None, batch: int = 1) -> list[tuple[dict, str]]:
    """(the -D set, the catalog entry) of every candidate an untuned gemm() may build for this call:
    the catalog's candidates (catalog.candidates: split where the call is plain, C^T entries on
    the C^T launch, no clustered entry for a batch) through dispatch.candidate_build, with the
    call's values (its bias, activation and C view) and C_STREAM (launch_config.c_stream_defines).
    `batch` > 1: a batch of contiguous M x N x K GEMMs in the kernel's BATCHED mode (none where TMA
    cannot read it in place: hgemm_mma runs it). Not filtered by the kernel's guards (walk does)."""
    item_a, item_c = DTYPE_ITEMSIZE[spec.dtypes.a], DTYPE_ITEMSIZE[spec.dtypes.c]

    def plan_of(c_trans: bool):
        plan = fresh_plan(m, n, k, layout, item_a, item_c, c_trans=c_trans)
        values = {**plan.call_values, "bias": transposed_bias_mode(bias) if c_trans else bias, "activation": act}
        if c_view is not None and not c_trans:
            values["vec_c"], values["wide_c"] = c_view
        values["shifted_c"] = shifted_c(item_c, c_trans, values["wide_c"], act)
        if batch > 1:
            plan = dataclasses.replace(plan, batch=batch, batch_strides=(m * k, k * n, m * n))
            values["batched"] = 1
        return dataclasses.replace(plan, call_values=values)
    plan = plan_of(False)
    if batch > 1 and launch_config.batch_unreadable(plan, item_a):
        return []
    plain = bias == 0 and act == 0 and batch == 1
    plan_ct = plan_of(True) if batch == 1 else None
    cands = candidates(spec, plan.m, k, "sm_90a", plain=plain, two_d=batch == 1,
                       swapped_m=n if plan_ct is not None else None,
                       trans_b=(plan.call_values["trans_b"], plan_ct.call_values["trans_b"] if plan_ct else 0))

    def c_stream(s, p):
        return launch_config.c_stream_defines(s, p, batch, H100_L2, None)
    out = []
    for cand in cands:
        cb = dispatch.candidate_build(cand, plan_ct if cand.swap else plan, SMS, "sm_90", plain, c_stream)
        out.append(({k: int(v) if isinstance(v, bool) else v for k, v in cb.defines.items()}, cand.config))
    return out


def calls():
    """(spec, M, N, K, layout, bias, activation, C view[, batch]) of every call the walk makes: every
    family and layout at the aligned shape, plain and fused; the other kinds of operand (SHAPES'
    others, the C views, a batch) in the first family only, in two layouts (an M-major and a
    K-major A), since the like-tables' fixed defines do not meet them in the kernel's guards."""
    for spec in families():
        for layout in LAYOUTS:
            for epilogue in ((0, 0), EPILOGUES[layout]):
                yield spec, *SHAPES[0], layout, *epilogue, None
    first = families()[0]
    for layout in ("nn", "tn"):
        for epilogue in ((0, 0), EPILOGUES[layout]):
            for m, n, k in SHAPES:
                for c_view in (None,) + C_VIEWS:
                    if (m, n, k) == SHAPES[0] and c_view is None:
                        continue             # (above)
                    if c_view is not None and c_view[0] == 1 and n % 2:
                        continue             # an odd N has no paired stores in any view
                    yield first, m, n, k, layout, *epilogue, c_view
        yield first, *BATCH[1:], layout, 0, 0, None, BATCH[0]


def _accepted(defines: dict) -> bool:
    """Whether the kernel's guards accept this -D set (a refusal is what gemm() skips)."""
    try:
        build_file("hgemm", BuildOptions(defines={k: str(v) for k, v in defines.items()}, target=TARGET))
        return True
    except AsmError:
        return False


def walk(workers: int | None = None) -> tuple[list[dict], dict[str, set[str]]]:
    """(the distinct -D sets the guards accept, in first-seen order; family name -> the catalog
    entries with at least one accepted build)."""
    seen: dict[tuple, tuple[dict, str, str]] = {}
    for spec, *args in calls():
        for defines, entry in dispatched(spec, *args):
            seen.setdefault(tuple(sorted(defines.items())), (defines, spec.name, entry))
    found = list(seen.values())
    workers = workers or max(1, os.cpu_count() or 1)
    with ProcessPoolExecutor(workers) as pool:
        ok = list(pool.map(_accepted, [d for d, _, _ in found], chunksize=8))
    reached: dict[str, set[str]] = {}
    for (defines, family, entry), good in zip(found, ok):
        if good:
            reached.setdefault(family, set()).add(entry)
    return [d for (d, _, _), good in zip(found, ok) if good], reached


def entries_reached() -> dict[str, set[str]]:
    return walk()[1]


def configs() -> list[dict]:
    """Every -D set (all parameters named, source defaults included) the dispatch may build hgemm.sasm with."""
    return walk()[0]


# ---- the golden digests -------------------------------------------------------------------------

GOLDEN = Path(__file__).parent / "golden" / "hgemm_dispatch_ptx_sha256.json"


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
