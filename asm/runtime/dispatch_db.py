"""The per-GPU dispatch database: the cost model's fitted coefficients and the sweep's best
configuration per measured call (exact hits), one JSON file per GPU model.

Where a GPU's file is looked for, first hit wins:
  1. $ASMGEMM_DISPATCH_DIR/<slug>.json     (what `asmgemm tune --sweep --fit` writes by default:
     ~/.cache/asmgemm/dispatch when the variable is unset)
  2. the package's kernels_ptx/dispatch/<slug>.json    (shipped: the H100's)
<slug> is the GPU's name in lower case with runs of other characters as '_'
('NVIDIA H100 80GB HBM3' -> nvidia_h100_80gb_hbm3).

A kernel family a GPU's own file has not swept (or a GPU with no file) gets the model alone: the
model of another file for the same target that swept it (the H100's sgemm for an H200, the H200's
TMA kernel for an H100: the same SMs and clock), scaled by the clock ratio, with none of its exact
hits (those were timed on the other GPU) and with this GPU's SM count and DRAM rate; and with no
such file either, the prior of cost_model.py. `explain` names which decided for the call's family."""
from __future__ import annotations

import json
import os
import re
from importlib import resources
from dataclasses import replace
from pathlib import Path

from ..errors import AsmError
from ..kernel_spec import get_spec, twins
from .cost_model import PRIOR_FIXUP_FIXED_S, PRIOR_SCRATCH_S, ConfigFit, DeviceModel

FORMAT = 1
DIR_ENV = "ASMGEMM_DISPATCH_DIR"


def slug(gpu: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")


def user_dir() -> Path:
    env = os.environ.get(DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "asmgemm" / "dispatch"


def shipped_dir() -> Path:
    return Path(str(resources.files("asmgemm.kernels_ptx") / "dispatch"))


def exact_key(family: str, layout: str, m: int, n: int, k: int, plain: bool) -> str:
    """The key of one measured call: the family, the kernel-level layout and sizes (after the
    operand swap), and whether it was a plain 2-D call (splits allowed)."""
    return f"{family}|{layout}|{m}x{n}x{k}|{'plain' if plain else 'fused'}"


def _files() -> list[Path]:
    out = []
    for d in (user_dir(), shipped_dir()):
        if d.is_dir():
            out.extend(sorted(d.glob("*.json")))
    return out


_memo: dict[tuple, dict] = {}


def read(path: Path) -> dict:
    """One database file, checked for its format (a damaged file is an error naming it)."""
    key = (str(path),)
    try:
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        pass
    if key in _memo:
        return _memo[key]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise AsmError(f"cannot read the dispatch database {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise AsmError(f"{path}:{exc.lineno}:{exc.colno}: error: the dispatch database is not valid JSON: {exc.msg}",
                       hint="delete it, or run `asmgemm tune --sweep` again") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("gpu"), str):
        raise AsmError(f"{path}: not a dispatch database of format {FORMAT} (keys 'format', 'gpu', 'model', 'best')")
    _memo[key] = data
    return data


def database_for(gpu: str) -> tuple[dict | None, Path | None]:
    """This GPU's own database and its path, or (None, None)."""
    want = slug(gpu)
    for path in _files():
        if path.stem == want:
            return read(path), path
    return None, None


def _same_target(target: str) -> list[tuple[dict, Path]]:
    """Every database of a GPU of this target (sm_90 and sm_90a alike), in _files' order."""
    base = target.rstrip("af")
    return [(data, path) for data, path in ((read(p), p) for p in _files())
            if str(data.get("target", "")).rstrip("af") == base]


# The model's terms a whole fit shares (the host's, the reduce kernel's, the clusters'): a database
# holding families fitted apart (merged: merge_fit) keeps each one's under "family_terms"
SHARED_TERMS = ("host_s", "launch_s", "reduce_fixed_s", "reduce_bytes_per_s", "cluster_block_s", "fixup_fixed_s",
                "scratch_s")


def model_from(data: dict, source: str, path: Path | None = None, family: str | None = None) -> DeviceModel:
    """The DeviceModel a database holds; for `family`, with the shared terms it was fitted with
    (model.family_terms, where a merge kept them apart)."""
    m = data["model"]
    own = m.get("family_terms", {}).get(family) if family else None
    if own:
        m = {**m, **own}
    # neighbours of the earlier form (ratios of call times, "res", until 2026-11-30) are not read:
    # cost_model now scales the term each ratio was measured against, which that form does not say
    residuals = [r for r in m.get("residuals", []) if isinstance(r, dict) and "gpu_res" in r]
    if len(residuals) < len(m.get("residuals", [])):
        source += (f"; {len(m['residuals']) - len(residuals)} of its neighbours are of an earlier form and unused "
                   "(tools/rebuild_residuals.py rewrites them from the sweeps it was fitted on)")
    try:
        return DeviceModel(
            gpu=data["gpu"], sms=int(data["sms"]), clock_hz=float(data["clock_hz"]),
            dram_bytes_per_s=float(data["dram_bytes_per_s"]), host_s=float(m["host_s"]),
            launch_s=float(m["launch_s"]), reduce_fixed_s=float(m["reduce_fixed_s"]),
            reduce_bytes_per_s=float(m["reduce_bytes_per_s"]), cluster_block_s=float(m["cluster_block_s"]),
            fixup_fixed_s=float(m.get("fixup_fixed_s", PRIOR_FIXUP_FIXED_S)),
            scratch_s=float(m.get("scratch_s", PRIOR_SCRATCH_S)),
            configs={k: ConfigFit(float(v["block_s"]), float(v["step_s"]), float(v["alone"]),
                                  int(v["blocks_per_sm"]), int(v.get("samples", 0)),
                                  {str(a): float(b) for a, b in v.get("variants", {}).items()},
                                  {str(a): int(b) for a, b in v.get("variant_blocks", {}).items()},
                                  float(v.get("load_bytes_per_s", 0.0)),
                                  float(v["alone_block"]) if "alone_block" in v else None,
                                  float(v.get("launch_fixed_s", 0.0)))
                     for k, v in m["configs"].items()},
            cluster_slots={k: int(v) for k, v in m.get("cluster_slots", {}).items()}, source=source,
            residuals=residuals)
    except (KeyError, TypeError, ValueError) as exc:
        where = str(path) if path is not None else f"the dispatch database of {data.get('gpu')}"
        raise AsmError(f"{where}: a model entry is malformed ({type(exc).__name__}: {exc})",
                       hint="delete it, or run `asmgemm tune --sweep` again") from None


def model_to_json(dm: DeviceModel) -> dict:
    return {"host_s": dm.host_s, "launch_s": dm.launch_s, "reduce_fixed_s": dm.reduce_fixed_s,
            "reduce_bytes_per_s": dm.reduce_bytes_per_s, "cluster_block_s": dm.cluster_block_s,
            "fixup_fixed_s": dm.fixup_fixed_s, "scratch_s": dm.scratch_s,
            "configs": {k: {"block_s": f.block_s, "step_s": f.step_s, "alone": f.alone,
                            **({} if f.alone_block is None else {"alone_block": f.alone_block}),
                            "blocks_per_sm": f.blocks_per_sm, "samples": f.samples,
                            "variants": dict(sorted(f.variants.items())),
                            "variant_blocks": dict(sorted(f.variant_blocks.items())),
                            "load_bytes_per_s": f.load_bytes_per_s,
                            **({"launch_fixed_s": f.launch_fixed_s} if f.launch_fixed_s else {})}
                        for k, f in sorted(dm.configs.items())},
            "cluster_slots": dict(sorted(dm.cluster_slots.items())), "residuals": dm.residuals}


def device_model(gpu: str, target: str, sms: int, clock_hz: float, dram_bytes_per_s: float,
                 family: str | None = None) -> tuple[DeviceModel, dict]:
    """(the model for this GPU and kernel family, its exact hits): its own database's where that
    one swept the family (or names no families), else the first other GPU's of the same target that
    did, rescaled (no exact hits: "the model alone"; the H200's sweep of the TMA kernel serves the
    H100, the H100's of sgemm the H200), else its own for whatever it has, else the prior (module
    docstring). A family is priced whole by one database: its configurations and the terms fitted
    with them (the host's, the reduce kernel's, the clusters')."""
    def swept(data: dict) -> bool:
        names = data.get("families")
        return family is None or not names or any(_twins(family, name) for name in names)
    own, own_path = database_for(gpu)
    if own is not None and swept(own):
        dm = model_from(own, f"fitted on this GPU ({own_path})", own_path, swept_family(own, family))
        if sms:
            dm.sms = sms
        return dm, dict(own.get("best", {}))
    for other, path in _same_target(target):
        if slug(str(other["gpu"])) != slug(gpu) and swept(other):
            dm = model_from(other, f"the model alone: coefficients of {other['gpu']} ({path.name}), scaled to this "
                                   "GPU's clock; no exact hits", path, swept_family(other, family))
            return _rescaled(dm, gpu, sms, clock_hz, dram_bytes_per_s), {}
    if own is not None:
        dm = model_from(own, f"fitted on this GPU ({own_path}), which has not swept {family}", own_path)
        if sms:
            dm.sms = sms
        return dm, dict(own.get("best", {}))
    return DeviceModel(gpu, sms or 1, clock_hz or 1.5e9, dram_bytes_per_s or 1e12,
                       source="the prior: no sweep of this GPU or its target (asmgemm tune --sweep fits one)"), {}


def swept_family(data: dict, family: str | None) -> str | None:
    """The family a database swept that prices `family` (itself, or its twin)."""
    return next((name for name in data.get("families", []) if family and _twins(family, name)), family)


def merge_fit(old: dict, new: dict) -> dict:
    """A database of one GPU that `new` (a fit of some families) makes of `old` (the file it
    replaces): new's families as new has them, old's other families kept whole: their
    configurations, neighbours, exact hits and the shared terms they were fitted with
    (model.family_terms), so that `asmgemm tune sgemm --sweep` then `tune hgemm --sweep` on one GPU
    leaves both fitted. Old of another GPU or format: new alone."""
    if old.get("gpu") != new.get("gpu") or old.get("format") != FORMAT or not isinstance(old.get("model"), dict):
        return new
    kept = [f for f in old.get("families", []) if f not in new.get("families", [])]
    if not kept:
        return new
    om, nm = old["model"], new["model"]
    keys = {f"{e.kernel}:{e.name}" for fam in kept for e in _configs_of(fam)}
    terms = dict(nm.get("family_terms", {}))
    for fam in kept:
        terms[fam] = om.get("family_terms", {}).get(fam) or {t: om[t] for t in SHARED_TERMS if t in om}
    model = {**nm, "configs": {**{k: v for k, v in om.get("configs", {}).items() if k in keys}, **nm["configs"]},
             "cluster_slots": {**om.get("cluster_slots", {}), **nm.get("cluster_slots", {})},
             "residuals": [r for r in om.get("residuals", []) if r.get("family") in kept] + list(nm.get("residuals", [])),
             "family_terms": dict(sorted(terms.items()))}
    best = {k: v for k, v in old.get("best", {}).items() if k.split("|", 1)[0] in kept}
    fit = dict(new.get("fit", {}))
    fit["held_out"] = {**{f: r for f, r in old.get("fit", {}).get("held_out", {}).items() if f in kept},
                       **fit.get("held_out", {})}
    return {**new, "families": sorted(set(kept) | set(new.get("families", []))), "model": model,
            "best": dict(sorted({**best, **new.get("best", {})}.items())), "fit": fit}


def _configs_of(family: str):
    try:
        return get_spec(family).configs
    except AsmError:
        return ()


def _twins(family: str, swept: str) -> bool:
    """Whether a sweep of family `swept` prices `family`: the same, or its twin (kernel_spec.twins)."""
    if family == swept:
        return True
    try:
        return twins(get_spec(family), get_spec(swept))
    except AsmError:
        return False


def _rescaled(dm: DeviceModel, gpu: str, sms: int, clock_hz: float, dram_bytes_per_s: float) -> DeviceModel:
    """Another GPU's model as this GPU's: times scaled by the clock ratio, this GPU's size and DRAM rate."""
    scale = (dm.clock_hz / clock_hz) if clock_hz and dm.clock_hz else 1.0
    # times follow the clock, and so does the rate the blocks load at (L2 and the SMs run on it)
    dm.configs = {k: replace(f, block_s=f.block_s * scale, step_s=f.step_s * scale,
                             load_bytes_per_s=f.load_bytes_per_s / scale, launch_fixed_s=f.launch_fixed_s * scale)
                  for k, f in dm.configs.items()}
    dm.gpu, dm.sms = gpu, sms or dm.sms
    dm.clock_hz = clock_hz or dm.clock_hz
    dm.dram_bytes_per_s = dram_bytes_per_s or dm.dram_bytes_per_s
    return dm


def write(path: Path, data: dict) -> None:
    """Write a database whole or not at all (a temporary file renamed over the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
