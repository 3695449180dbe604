"""The tuning cache, read side: the best parameters `asmgemm tune` found, per (GPU, kernel, layout,
shape bucket), consulted by `asmgemm.gemm` through `lookup_tuned`. The write side (`store_tuned`)
belongs to the tuning workflow (asmgemm.tuning.store); the runtime only reads.

File: $ASMGEMM_TUNE_CACHE, else tune.json in the cache folder (asmgemm.files.cache_root:
$ASMGEMM_CACHE_DIR, else $XDG_CACHE_HOME/asmgemm, ~/.cache/asmgemm). JSON:

    {"format": 2,
     "entries": {"NVIDIA H100 80GB HBM3|sgemm|nn|4096x4096x4096": {
         "kernel": "sgemm", "dtype": "float32", "kernel_path": "...", "params": {"BK": 8, ...},
         "source_hash": "<sha256 of the .sasm and its .includes>", "ptxas": "V13.0.88",
         "shape": [4096, 4096, 4096], "tflops": 51.2, "default_tflops": 48.0, "updated": "..."}}}

Format 1 keyed entries by dtype instead of kernel; such a file is ignored (with one warning) and
replaced at the next `asmgemm tune`.

Shape bucket: each of M, N, K rounded up to a power of two (3000x5000x700 -> 4096x8192x1024): the
best tile shape changes with the problem's order of magnitude, not with its last digits.

ASMGEMM_NO_TUNE_CACHE=1 turns lookups off (what `asmgemm bench --defaults`, `--save-baseline`, the
perf tests and the tuner's "default" trial use: gemm's choice without any tuning).

An entry is ignored (and dropped at the next write) when the kernel source or the ptxas version
changed since it was tuned: its timings say nothing about the new code. A corrupt file never
breaks `gemm`: lookups return None, and the next write moves it aside to tune.json.corrupt-<time>
and starts afresh. Writes go through a temporary file and a rename under a lock file, so an
interrupted or concurrent tune leaves either the old or the new cache, never a half-written one.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

from ..environment import env_value
from ..errors import AsmError, ToolchainError
from ..files import cache_root, warn_cache
from ..kernel_spec import all_specs
from ..toolchain import ptxas_version
from .build_cache import digest_files, source_files

CACHE_FORMAT = 2


def cache_path() -> Path:
    explicit = os.environ.get("ASMGEMM_TUNE_CACHE")
    if explicit:
        return Path(explicit)
    return cache_root() / "tune.json"


def bucket_dim(x: int) -> int:
    if x < 1:
        raise ValueError(f"dimension must be >= 1, got {x}")
    return 1 << (x - 1).bit_length()


def shape_bucket(m: int, n: int, k: int) -> str:
    return f"{bucket_dim(m)}x{bucket_dim(n)}x{bucket_dim(k)}"


def cache_key(gpu_name: str, kernel: str, layout: str, m: int, n: int, k: int) -> str:
    return f"{gpu_name}|{kernel}|{layout.lower()}|{shape_bucket(m, n, k)}"


# ---- what an entry is valid for ----------------------------------------------------------------
def _stamp(p: Path):
    try:
        st = p.stat()
        return (st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        return None


_hash_memo: dict[str, tuple[list[tuple[Path, object]], str]] = {}


def current_source_hash(path: str | os.PathLike) -> str | None:
    """source_hash, recomputed only when a file involved changed (stat of each, per call)."""
    if not os.path.isfile(path):
        return None
    key = str(Path(path).resolve())
    hit = _hash_memo.get(key)
    if hit and all(_stamp(p) == stamp for p, stamp in hit[0]):
        return hit[1]
    files = source_files(Path(path))
    digest = digest_files(files)
    _hash_memo[key] = ([(p, _stamp(p)) for p, _ in files], digest)
    return digest


def current_ptxas_version() -> str | None:
    """The ptxas an entry must have been tuned with; None (every entry stale) when there is none."""
    try:
        return ptxas_version()
    except ToolchainError:  # no ptxas here, so no build and no valid entry either
        return None


def kernel_source_path(kernel: str, kernel_path: str | None = None) -> str | None:
    if kernel_path and os.path.isfile(kernel_path):
        return kernel_path
    spec = all_specs().get(kernel)
    return str(spec.source) if spec else None


def entry_is_current(entry: dict) -> bool:
    path = kernel_source_path(entry.get("kernel", ""), entry.get("kernel_path"))
    if path is None:
        return False
    return (entry.get("source_hash") == current_source_hash(path)
            and entry.get("ptxas") == current_ptxas_version())


NO_TUNE_CACHE_ENV = "ASMGEMM_NO_TUNE_CACHE"


def lookups_disabled() -> bool:
    """$ASMGEMM_NO_TUNE_CACHE set (not "" or "0"): gemm() runs untuned. Read on every gemm() call
    (environment.py: without os.environ.get's cost for an unset variable)."""
    return env_value(NO_TUNE_CACHE_ENV, "") not in ("", "0")


@contextlib.contextmanager
def lookups_off():
    """Within the block, gemm() runs untuned (its defaults and size rule)."""
    old = os.environ.get(NO_TUNE_CACHE_ENV)
    os.environ[NO_TUNE_CACHE_ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ[NO_TUNE_CACHE_ENV]
        else:
            os.environ[NO_TUNE_CACHE_ENV] = old


# ---- reading -----------------------------------------------------------------------------------
class CacheCorrupt(Exception):
    pass


def _parse(text: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CacheCorrupt(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise CacheCorrupt("invalid JSON: nested too deeply") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise CacheCorrupt("not a tuning cache (no 'entries' object)")
    if data.get("format") != CACHE_FORMAT:
        raise CacheCorrupt(f"format {data.get('format')!r}, expected {CACHE_FORMAT}")
    for key, entry in data["entries"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("params"), dict):
            raise CacheCorrupt(f"entry {key!r} has no 'params' object")
    return data


_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARAM_TEXT = re.compile(r"-?[A-Za-z0-9_.]{1,64}")


def entry_problem(entry: dict) -> str | None:
    """Why an entry (of a readable cache) cannot be used as it stands, or None: its parameters must
    be -D NAME=VALUE pairs (names; integers or short words), its kernel a name, its kernel_path a
    path or null. (Parameters the kernel itself refuses are caught when gemm builds them.)"""
    if not isinstance(entry.get("kernel"), str):
        return f"'kernel' is {entry.get('kernel')!r}, not a kernel name"
    if entry.get("kernel_path") is not None and not isinstance(entry.get("kernel_path"), str):
        return f"'kernel_path' is {entry.get('kernel_path')!r}, not a path"
    for name, value in entry["params"].items():
        ok_value = (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, str) and _PARAM_TEXT.fullmatch(value))
        if not _PARAM_NAME.fullmatch(name) or not ok_value:
            return f"parameter {name}={value!r} is not NAME=integer"
    return None


def read_cache(path: Path | None = None) -> dict:
    """The cache's content; an empty cache when the file does not exist; CacheCorrupt when it is
    not a readable cache."""
    path = Path(path) if path else cache_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"format": CACHE_FORMAT, "entries": {}}
    except UnicodeDecodeError:
        raise CacheCorrupt("not UTF-8 text") from None
    except OSError as exc:
        raise CacheCorrupt(f"not readable ({exc.strerror or exc})") from None
    return _parse(text)


_memo: dict[str, tuple[tuple, dict | None]] = {}


def _read_memoized(path: Path) -> dict | None:
    """read_cache, re-read only when the file's mtime/size/inode change: `gemm` calls this per call."""
    try:
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        return None
    key = str(path)
    hit = _memo.get(key)
    if hit and hit[0] == stamp:
        return hit[1]
    try:
        data = read_cache(path)
    except CacheCorrupt as exc:
        warn_cache(f"asmgemm: ignoring the tuning cache {path}: {exc}", once=f"tune-cache:{key}")
        data = None
    _memo[key] = (stamp, data)
    return data


def forget(path: Path) -> None:
    """Drop the memoized content of a cache file (after writing it)."""
    _memo.pop(str(path), None)


def lookup_entry(gpu_name: str, kernel: str, layout: str, m: int, n: int, k: int,
                 path: Path | None = None) -> dict | None:
    data = _read_memoized(Path(path) if path else cache_path())
    if not data:
        return None
    key = cache_key(gpu_name, kernel, layout, m, n, k)
    entry = data["entries"].get(key)
    if entry is None or entry.get("kernel") != kernel:
        return None
    problem = entry_problem(entry)
    if problem:
        path = Path(path) if path else cache_path()
        warn_cache(f"asmgemm: ignoring the tuning cache entry {key!r} in {path}: {problem}",
                   once=f"tune-entry:{path}:{key}:{problem}")
        return None
    if not entry_is_current(entry):
        return None
    return entry


def lookup_tuned(gpu_name: str, kernel: str, layout: str, m: int, n: int, k: int) -> dict | None:
    """The tuned -D parameters for this problem, or None (no entry, a stale one, or no readable
    cache, or lookups turned off by ASMGEMM_NO_TUNE_CACHE). Never raises for a bad cache: `gemm`
    then runs with the kernel's defaults."""
    if lookups_disabled():
        return None
    try:
        entry = lookup_entry(gpu_name, kernel, layout, m, n, k)
    except Exception as exc:  # the cache must never take gemm down
        why = exc.message if isinstance(exc, AsmError) else f"{type(exc).__name__}: {exc}"
        warn_cache(f"asmgemm: tuning cache lookup failed: {why.splitlines()[0] if why else ''}",
                   once=f"tune-lookup:{why}")
        return None
    return dict(entry["params"]) if entry else None
