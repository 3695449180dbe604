"""Build a spec'd kernel once per configuration: in memory for the process, on disk across runs.

Key: sha256 over the kernel source and every file it `.include`s, the -D defines (sorted), the
target, the ptxas version, the asmgemm version and the entry format. Disk folder: `kernels/` under
the cache folder (asmgemm.files.cache_root). Each entry is `<key>.cubin`, `<key>.ptx` and
`<key>.json` (launch geometry, parameter list, the two files' names and sha256), written as one
commit (asmgemm.files.write_files). Nothing read back is trusted: every field is checked and both
digests compared (`read_entry`); a damaged entry is rebuilt with one warning and never loaded.
A cache folder that cannot be created or written costs the cache, not the call: the kernel is
built into a private temporary folder for the process, with one warning.

The launch geometry comes from the build itself: the spec names the constants (THREADS, TM, ...)
and the pipeline returns their values; the parameter list is the entry's `.param` list.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import json
import re
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import AsmError
from ..files import cache_root, warn_cache, write_files
from ..isa.arch import arch_for
from ..kernel_spec import ARGUMENTS, ARRAY_ARGUMENTS, SASS_PATCH_KEYS, KernelSpec
from ..toolchain import ptxas_version
from ..version import __version__

_INCLUDE_RE = re.compile(r'^\s*\.include\s+"([^"]+)"', re.MULTILINE)
MAX_INCLUDES = 64
META_FORMAT = 8          # of <key>.json (see read_entry); part of the key, so older entries are never read


@dataclass(frozen=True)
class BuiltKernel:
    """A compiled kernel and how to launch it."""

    key: str
    name: str              # entry point
    threads: int
    tile_m: int            # rows of C per block
    tile_n: int            # columns of C per block
    smem_bytes: int        # dynamic shared memory per block
    params: tuple[tuple[str, str], ...]    # (abi name, PTX type) per .param, in order
    cubin_path: str
    ptx_path: str
    target: str
    box_rows: tuple[int, int, int] = (0, 0, 0)     # TMA box heights of tmap_a, tmap_b, tmap_c (0: none)
    cluster: int = 1                       # blocks per cluster along the grid's x
    cluster_rows: int = 1                  # tile rows of the unit a persistent cluster walks
    cluster_cols: int = 1                  # tile columns of that unit
    # control-code passes applied after ptxas (spec.sass_patch); () for
    # ptxas's own code. A patched kernel loads from its cubin only (no PTX fallback: ptxas would
    # schedule it again and the launch would silently run ptxas's codes).
    sass_patch: tuple[tuple[str, object], ...] = ()
    # the ptxas options of the run that shipped, where the source names `.ptxas_alternative`s
    # (asmgemm.ptxas_choice); () for ptxas's defaults
    ptxas_options: tuple[str, ...] = ()


def cache_dir() -> Path:
    return cache_root() / "kernels"


def source_files(path: Path) -> list[tuple[Path, bytes | None]]:
    """The kernel file and everything it includes, transitively (relative to the including file),
    with their bytes (None when unreadable). Also what the tuning cache validates its entries by."""
    seen: list[tuple[Path, bytes | None]] = []
    todo = [Path(path)]
    visited: set[Path] = set()
    while todo and len(visited) < MAX_INCLUDES:
        p = todo.pop(0)
        rp = p.resolve()
        if rp in visited:
            continue
        visited.add(rp)
        try:
            data = p.read_bytes()
        except OSError:
            seen.append((p, None))
            continue
        seen.append((p, data))
        for inc in _INCLUDE_RE.findall(data.decode("utf-8", "replace")):
            todo.append(p.parent / inc)
    return seen


def digest_files(files: list[tuple[Path, bytes | None]]) -> str:
    """sha256 over files by name and content (a missing one by its name, so it still counts)."""
    h = hashlib.sha256()
    for p, data in files:
        h.update(p.name.encode() + b"\0" + (data if data is not None else b"<missing>") + b"\0")
    return h.hexdigest()


def source_digest(source_path: Path) -> str:
    """sha256 over the kernel file and its includes, by name and content."""
    return digest_files(source_files(source_path))


def cache_key(source_path: Path, defines: dict, target: str, ptxas: str, entry: str = "",
              sass_patch: tuple = ()) -> str:
    files = source_files(source_path)
    h = hashlib.sha256(digest_files(files).encode() + b"\0")
    for k in sorted(defines):
        h.update(f"-D{k}={defines[k]}\0".encode())
    h.update(f"target={target}\0ptxas={ptxas}\0asmgemm={__version__}\0entry={entry}\0meta={META_FORMAT}".encode())
    # a source naming `.ptxas_alternative`s ships the run the SASS inspector models fastest
    # (asmgemm.ptxas_choice): a changed inspector or choice may choose another, so they key it too
    if any(data is not None and b".ptxas_alternative" in data for _, data in files):
        h.update(b"\0ptxas_choice=" + _sass_code_digest().encode())
    if sass_patch:
        h.update(b"\0sass=" + json.dumps(dict(sass_patch)).encode() + _sass_code_digest().encode())
        rules = dict(sass_patch).get("rules")
        if rules is not None:
            h.update(b"\0rules=" + source_digest(Path(rules)).encode())
    return h.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def _sass_code_digest() -> str:
    """sha256 over the code that patches or judges cubins (asm/sass, asm/isa, the latency table,
    ptxas_choice.py): a pass that changes makes new entries, so a cached cubin is never one an
    older pass wrote or chose."""
    root = Path(__file__).resolve().parent.parent
    # asmgemm.scheduler is its own folder (scheduler/ in the source tree, mapped into the package
    # when installed): found as the package, not under asm/, where the source tree has none
    scheduler = Path(str(resources.files("asmgemm.scheduler")))
    files = sorted([*(root / "sass").glob("*.py"), *(root / "isa").glob("*.py"),
                    *scheduler.glob("latencies*.py"), root / "ptxas_choice.py"])
    return digest_files([(p, p.read_bytes()) for p in files])


def launch_geometry(spec: KernelSpec, result) -> dict[str, int]:
    """threads, tile_m, tile_n, smem_bytes and the TMA box heights (0 when the kernel takes no tensor
    map) of a build, from the constants the spec names."""
    out = {"box_rows_a": 0, "box_rows_b": 0, "box_rows_c": 0, "cluster": 1}
    for field in ("threads", "tile_m", "tile_n", "smem_bytes", "box_rows_a", "box_rows_b", "box_rows_c", "cluster",
                  "cluster_rows", "cluster_cols"):
        const = getattr(spec.launch, field)
        if const is None:          # an optional key the spec leaves out
            continue
        value = result.constants.get(const)
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if field == "smem_bytes" else 1):
            raise AsmError(f"{spec.spec_file}: [{spec.name}] launch.{field} names the constant '{const}', which "
                           f"{'the build does not define' if value is None else f'is {value!r}, not a positive integer'}",
                           hint=f"define it at the top level of {spec.source.name} (`.const {const} = ...`)")
        out[field] = value
    out.setdefault("cluster_cols", 1)
    out.setdefault("cluster_rows", out["cluster"] // out["cluster_cols"])
    if out["cluster"] % (out["cluster_rows"] * out["cluster_cols"]):
        raise AsmError(f"{spec.spec_file}: [{spec.name}] launch.cluster_rows x cluster_cols ({out['cluster_rows']} x "
                       f"{out['cluster_cols']}) does not divide launch.cluster ({out['cluster']}): a cluster's blocks "
                       f"cover whole units of tiles")
    return out


def abi_params(spec: KernelSpec, result) -> tuple[tuple[str, str], ...]:
    """The entry's .param list matched against the spec's abi: (abi name, PTX type) per parameter."""
    params = result.entry_params(spec.entry)
    if len(params) != len(spec.abi):
        raise AsmError(f"{spec.spec_file}: [{spec.name}] abi lists {len(spec.abi)} arguments, but the entry "
                       f"'{spec.entry}' in {spec.source.name} has {len(params)} .param: "
                       f"{', '.join(p.name for p in params) or 'none'}")
    out = []
    for name, p in zip(spec.abi, params):
        if p.type not in ARGUMENTS[name] or p.count != ARRAY_ARGUMENTS.get(name):
            count = ARRAY_ARGUMENTS.get(name)
            raise AsmError(f"{spec.spec_file}: [{spec.name}] abi argument '{name}' is passed as "
                           f"{'/'.join(ARGUMENTS[name])}{'' if count is None else f'[{count}]'}, but .param {p.name} of '{spec.entry}' is "
                           f"{p.type or 'untyped'}{'' if p.count is None else f'[{p.count}]'}")
        out.append((name, p.type))
    return tuple(out)


_memory: dict[str, BuiltKernel] = {}
# (kernel, defines, target) -> BuiltKernel for this process: the per-call path skips hashing files
# and asking ptxas its version. A kernel edited while the process runs needs clear_memory_cache().
_by_config: dict[tuple, BuiltKernel] = {}


def build_kernel(spec: KernelSpec, defines: dict, target: str) -> BuiltKernel:
    """The compiled kernel for these defines and target: from memory, from disk, or built now."""
    defines = {k: str(v) for k, v in defines.items()}
    config = (spec.name, str(spec.source), tuple(sorted(defines.items())), target)
    hit = _by_config.get(config)
    if hit is not None:
        return hit
    built = _build_kernel(spec, defines, target)
    _by_config[config] = built
    _defines_of[built.key] = dict(defines)
    return built


_defines_of: dict[str, dict[str, str]] = {}     # BuiltKernel.key -> the -D parameters it was built with


def defines_of(built: BuiltKernel) -> dict[str, str]:
    """The -D parameters `built` was built with in this process (the configuration that ran:
    last_launch()["params"]); {} for one this process did not build through build_kernel."""
    return dict(_defines_of.get(built.key, {}))


# ---- the disk entry ------------------------------------------------------------------------------
# <key>.json holds the launch geometry, the parameter list, the FILE NAMES of <key>.cubin and
# <key>.ptx (never paths: those are derived from the key and the cache folder) and the sha256 of
# each, plus a sha256 over the metadata itself. Everything is checked on every read from disk;
# an entry that fails any check is damaged: rebuilt (one warning) and never loaded.
MAX_TILE = 1 << 16
_HEX64 = re.compile(r"[0-9a-f]{64}")


class DamagedEntry(Exception):
    """A kernel-cache entry that cannot be trusted (why: the message)."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _meta_digest(meta: dict) -> str:
    body = {k: v for k, v in meta.items() if k != "sha256"}
    return _sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def entry_metadata(built: BuiltKernel, cubin: bytes, ptx: bytes) -> dict:
    """The JSON content of a kernel-cache entry for `built`, whose files hold `cubin` and `ptx`."""
    meta = {"format": META_FORMAT, "key": built.key, "name": built.name, "target": built.target,
            "threads": built.threads, "tile_m": built.tile_m, "tile_n": built.tile_n,
            "smem_bytes": built.smem_bytes, "box_rows": list(built.box_rows), "cluster": built.cluster,
            "cluster_rows": built.cluster_rows, "cluster_cols": built.cluster_cols,
            "params": [list(p) for p in built.params],
            "cubin": f"{built.key}.cubin", "ptx": f"{built.key}.ptx",
            "cubin_sha256": _sha256(cubin), "ptx_sha256": _sha256(ptx),
            "sass_patch": dict(built.sass_patch), "ptxas_options": list(built.ptxas_options)}
    meta["sha256"] = _meta_digest(meta)
    return meta


def _int_field(meta: dict, name: str, low: int, high: int) -> int:
    v = meta.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        raise DamagedEntry(f"{name} is {v!r}, not an integer in {low}..{high}")
    return v


def read_entry(meta_path: Path, key: str, spec: KernelSpec, target: str) -> BuiltKernel:
    """The entry <key>.json in its folder, every field and both digests checked; DamagedEntry when
    anything is off."""
    folder = meta_path.parent
    try:
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DamagedEntry(f"unreadable metadata ({exc})") from None
    if not isinstance(meta, dict):
        raise DamagedEntry("the metadata is not a JSON object")
    if meta.get("format") != META_FORMAT:
        raise DamagedEntry(f"format {meta.get('format')!r}, expected {META_FORMAT}")
    expected = {"key": key, "name": spec.entry, "target": target, "cubin": f"{key}.cubin", "ptx": f"{key}.ptx"}
    for name, want in expected.items():
        if meta.get(name) != want:
            raise DamagedEntry(f"{name} is {meta.get(name)!r}, expected {want!r}")
    limits = arch_for(target).limits
    threads = _int_field(meta, "threads", 1, limits.max_threads_per_block)
    tile_m = _int_field(meta, "tile_m", 1, MAX_TILE)
    tile_n = _int_field(meta, "tile_n", 1, MAX_TILE)
    smem = _int_field(meta, "smem_bytes", 0, limits.shared_per_block_optin)
    box_rows = meta.get("box_rows")
    if not (isinstance(box_rows, list) and len(box_rows) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 256 for v in box_rows)):
        raise DamagedEntry(f"box_rows is {box_rows!r}, not three integers in 0..256")
    cluster = _int_field(meta, "cluster", 1, 16)
    cluster_rows = _int_field(meta, "cluster_rows", 1, cluster)
    cluster_cols = _int_field(meta, "cluster_cols", 1, cluster)
    raw = meta.get("params")
    if not (isinstance(raw, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                          for p in raw)):
        raise DamagedEntry("params is not a list of [name, PTX type] pairs")
    params = tuple((n, t) for n, t in raw)
    if [n for n, _ in params] != list(spec.abi):
        raise DamagedEntry(f"params {[n for n, _ in params]} do not follow the spec's abi {list(spec.abi)}")
    for n, t in params:
        if t not in ARGUMENTS[n]:
            raise DamagedEntry(f"param {n} has type {t!r}, not one of {'/'.join(ARGUMENTS[n])}")
    options = meta.get("ptxas_options", [])
    if not (isinstance(options, list) and all(isinstance(o, str) for o in options)):
        raise DamagedEntry(f"ptxas_options is {options!r}, not a list of options")
    if meta.get("sass_patch") != dict(spec.sass_patch):
        raise DamagedEntry(f"sass_patch is {meta.get('sass_patch')!r}, expected {dict(spec.sass_patch)!r}")
    if meta.get("sha256") != _meta_digest(meta):
        raise DamagedEntry("the metadata does not match its sha256 (edited by hand?)")
    for kind in ("cubin", "ptx"):
        digest = meta.get(f"{kind}_sha256")
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise DamagedEntry(f"{kind}_sha256 is not a sha256")
        try:
            data = (folder / expected[kind]).read_bytes()
        except OSError as exc:
            raise DamagedEntry(f"cannot read {expected[kind]} ({exc.strerror})") from None
        if _sha256(data) != digest:
            raise DamagedEntry(f"{expected[kind]} ({len(data)} bytes) does not match its sha256")
    return BuiltKernel(key, spec.entry, threads, tile_m, tile_n, smem, params,
                       str(folder / expected["cubin"]), str(folder / expected["ptx"]), target, tuple(box_rows), cluster,
                       cluster_rows, cluster_cols, spec.sass_patch, tuple(options))


def patched_cubin(spec: KernelSpec, cubin: bytes, source: str) -> bytes:
    """ptxas's cubin with the spec's control-code passes applied (asmgemm.sass.patch.plan_patch,
    the same passes and safety check as `asmgemm patch`). A patch the check refuses stops the
    build with every hazard named: a kernel table that asks for passes never runs without them."""
    from ..sass.patch import plan_patch         # on a cache miss of a patched kernel only
    from ..sass.patch_rules import load_rules

    options = dict(spec.sass_patch)
    rules = load_rules(options.pop("rules")) if "rules" in options else None
    keywords = {SASS_PATCH_KEYS[k][0]: v for k, v in options.items()}
    plan = plan_patch(cubin, rules, source, **keywords)
    if plan.hazards:
        shown = "\n".join(h.line() for h in plan.hazards[:8])
        more = f"\n... and {len(plan.hazards) - 8} more" if len(plan.hazards) > 8 else ""
        raise AsmError(f"{spec.spec_file}: [{spec.name}] sass_patch: the safety check refuses the patched "
                       f"cubin of {source}:\n{shown}{more}",
                       hint="asmgemm patch CUBIN ... --json shows the whole check")
    return plan.cubin


_uncached_dir: tempfile.TemporaryDirectory | None = None


def _uncached_folder() -> Path:
    """A private temporary folder for kernels built while the cache folder cannot be written
    (removed when the process exits): CuPy loads a cubin from a path."""
    global _uncached_dir
    if _uncached_dir is None:
        _uncached_dir = tempfile.TemporaryDirectory(prefix="asmgemm-kernels-")
        atexit.register(_uncached_dir.cleanup)
    return Path(_uncached_dir.name)


def _build_kernel(spec: KernelSpec, defines: dict, target: str) -> BuiltKernel:
    from ..pipeline import BuildOptions, assemble, build_file    # on a cache miss (test_layers: LAZY_IMPORTS)

    key = cache_key(spec.source, defines, target, ptxas_version(), spec.entry, spec.sass_patch)
    hit = _memory.get(key)
    if hit is not None:
        return hit
    folder = cache_dir()
    meta_path = folder / f"{key}.json"
    try:
        present = meta_path.exists()
    except OSError:            # a folder this process may not search: the same as no entry
        present = False
    if present:
        try:
            built = read_entry(meta_path, key, spec, target)
            _memory[key] = built
            return built
        except DamagedEntry as exc:
            warn_cache(f"asmgemm: the kernel cache entry {meta_path} is damaged ({exc}); rebuilding it",
                       once=f"kernel-entry:{meta_path}")
    result = build_file(spec.source, BuildOptions(defines=defines, target=target))
    geo = launch_geometry(spec, result)
    params = abi_params(spec, result)
    assembled = assemble(result)
    cubin = assembled.cubin
    if spec.sass_patch:
        cubin = patched_cubin(spec, cubin, f"{spec.source.name} ({spec.name}, {target})")
    ptx = result.ptx.encode("utf-8")

    def entry_in(where: Path) -> tuple[BuiltKernel, list]:
        built = BuiltKernel(key, spec.entry, geo["threads"], geo["tile_m"], geo["tile_n"], geo["smem_bytes"],
                            params, str(where / f"{key}.cubin"), str(where / f"{key}.ptx"), target,
                            (geo["box_rows_a"], geo["box_rows_b"], geo["box_rows_c"]), geo["cluster"],
                            geo["cluster_rows"], geo["cluster_cols"], spec.sass_patch, assembled.ptxas_options)
        meta = json.dumps(entry_metadata(built, cubin, ptx), indent=1) + "\n"
        # one commit, the metadata with its files: a reader finds all three or the old entry
        return built, [(built.cubin_path, cubin), (built.ptx_path, ptx), (where / f"{key}.json", meta)]

    try:
        folder.mkdir(parents=True, exist_ok=True)
        built, files = entry_in(folder)
        write_files(files)
    except (OSError, AsmError) as exc:
        why = exc.message if isinstance(exc, AsmError) else (exc.strerror or str(exc))
        warn_cache(f"asmgemm: cannot write the kernel cache folder {folder} ({why}); building kernels in memory "
                   "for this process (set ASMGEMM_CACHE_DIR to a writable folder)", once=f"kernel-folder:{folder}")
        built, files = entry_in(_uncached_folder())
        write_files(files)
    _memory[key] = built
    return built


def clear_memory_cache() -> None:
    """Forget the kernels built in this process (after editing a kernel source while it runs)."""
    _memory.clear()
    _by_config.clear()
