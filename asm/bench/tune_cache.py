"""The tuning cache: the best parameters `asmgemm tune` found, per (GPU, dtype, layout, shape bucket),
consulted by `asmgemm.gemm` through `lookup_tuned`.

File: $ASMGEMM_TUNE_CACHE, else $ASMGEMM_CACHE_DIR/tune.json, else $XDG_CACHE_HOME/asmgemm/tune.json
(~/.cache/asmgemm/tune.json). JSON:

    {"format": 1,
     "entries": {"NVIDIA H100 80GB HBM3|float32|nn|4096x4096x4096": {
         "kernel": "sgemm", "kernel_path": "...", "params": {"BK": 8, ...},
         "source_hash": "<sha256 of the .sasm and its .includes>", "ptxas": "V13.0.88",
         "shape": [4096, 4096, 4096], "tflops": 51.2, "default_tflops": 48.0, "updated": "..."}}}

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
import functools
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

from ..runtime.build_cache import digest_files, source_digest, source_files

CACHE_FORMAT = 1


def cache_path() -> Path:
    explicit = os.environ.get("ASMGEMM_TUNE_CACHE")
    if explicit:
        return Path(explicit)
    folder = os.environ.get("ASMGEMM_CACHE_DIR")
    if folder:
        return Path(folder) / "tune.json"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "asmgemm" / "tune.json"


def bucket_dim(x: int) -> int:
    if x < 1:
        raise ValueError(f"dimension must be >= 1, got {x}")
    return 1 << (x - 1).bit_length()


def shape_bucket(m: int, n: int, k: int) -> str:
    return f"{bucket_dim(m)}x{bucket_dim(n)}x{bucket_dim(k)}"


def cache_key(gpu_name: str, dtype_name: str, layout: str, m: int, n: int, k: int) -> str:
    return f"{gpu_name}|{dtype_name}|{layout.lower()}|{shape_bucket(m, n, k)}"


# ---- what an entry is valid for ----------------------------------------------------------------
def source_hash(path: str | os.PathLike) -> str:
    """sha256 over the kernel file and every file it includes (the runtime's build-cache digest)."""
    return source_digest(Path(path))


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


@functools.lru_cache(maxsize=1)
def current_ptxas_version() -> str | None:
    try:
        from ..toolchain import tool_version
        return tool_version("ptxas")
    except Exception:
        return None


def kernel_source_path(kernel: str, kernel_path: str | None = None) -> str | None:
    if kernel_path and os.path.isfile(kernel_path):
        return kernel_path
    try:
        from ..pipeline import shipped_kernels
        p = shipped_kernels().get(kernel)
        return str(p) if p else None
    except Exception:
        return None


def entry_is_current(entry: dict) -> bool:
    path = kernel_source_path(entry.get("kernel", ""), entry.get("kernel_path"))
    if path is None:
        return False
    return (entry.get("source_hash") == current_source_hash(path)
            and entry.get("ptxas") == current_ptxas_version())


def lookups_disabled() -> bool:
    return os.environ.get("ASMGEMM_NO_TUNE_CACHE", "") not in ("", "0")


@contextlib.contextmanager
def lookups_off():
    """Within the block, gemm() runs untuned (its defaults and size rule)."""
    old = os.environ.get("ASMGEMM_NO_TUNE_CACHE")
    os.environ["ASMGEMM_NO_TUNE_CACHE"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["ASMGEMM_NO_TUNE_CACHE"]
        else:
            os.environ["ASMGEMM_NO_TUNE_CACHE"] = old


# ---- reading -----------------------------------------------------------------------------------
class CacheCorrupt(Exception):
    pass


def _parse(text: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CacheCorrupt(f"invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise CacheCorrupt("not a tuning cache (no 'entries' object)")
    if data.get("format") != CACHE_FORMAT:
        raise CacheCorrupt(f"format {data.get('format')!r}, expected {CACHE_FORMAT}")
    for key, entry in data["entries"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("params"), dict):
            raise CacheCorrupt(f"entry {key!r} has no 'params' object")
    return data


def read_cache(path: Path | None = None) -> dict:
    """The cache's content; an empty cache when the file does not exist; CacheCorrupt when it is
    not a readable cache."""
    path = Path(path) if path else cache_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"format": CACHE_FORMAT, "entries": {}}
    except (OSError, UnicodeDecodeError) as exc:
        raise CacheCorrupt(f"cannot read {path}: {exc}") from None
    return _parse(text)


_memo: dict[str, tuple[tuple, dict | None]] = {}
_warned: set[str] = set()


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
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"asmgemm: ignoring the tuning cache {path}: {exc}", RuntimeWarning, stacklevel=3)
        data = None
    _memo[key] = (stamp, data)
    return data


def lookup_entry(gpu_name: str, dtype_name: str, layout: str, m: int, n: int, k: int,
                 kernel: str | None = None, path: Path | None = None) -> dict | None:
    data = _read_memoized(Path(path) if path else cache_path())
    if not data:
        return None
    entry = data["entries"].get(cache_key(gpu_name, dtype_name, layout, m, n, k))
    if entry is None or (kernel is not None and entry.get("kernel") != kernel):
        return None
    if not entry_is_current(entry):
        return None
    return entry


def lookup_tuned(gpu_name: str, dtype_name: str, layout: str, m: int, n: int, k: int,
                 kernel: str | None = None) -> dict | None:
    """The tuned -D parameters for this problem, or None (no entry, a stale one, or no readable
    cache, or lookups turned off by ASMGEMM_NO_TUNE_CACHE). Never raises for a bad cache: `gemm`
    then runs with the kernel's defaults."""
    if lookups_disabled():
        return None
    try:
        entry = lookup_entry(gpu_name, dtype_name, layout, m, n, k, kernel)
    except Exception as exc:  # the cache must never take gemm down
        warnings.warn(f"asmgemm: tuning cache lookup failed: {exc}", RuntimeWarning, stacklevel=2)
        return None
    return dict(entry["params"]) if entry else None


# ---- writing -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on <cache>.lock for the read-modify-write (POSIX; elsewhere, no lock)."""
    lock_path = path.with_name(path.name + ".lock")
    fh = open(lock_path, "a+")
    try:
        try:
            import fcntl
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        except ImportError:
            pass
        yield
    finally:
        fh.close()  # closing releases the lock


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt included: never leave the temporary file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_entry(kernel: str, kernel_path: str | None, params: dict, shape: tuple[int, int, int],
               tflops: float | None = None, default_tflops: float | None = None, **extra) -> dict:
    path = kernel_source_path(kernel, kernel_path)
    entry = {
        "kernel": kernel,
        "kernel_path": str(kernel_path) if kernel_path else None,
        "params": dict(params),
        "source_hash": current_source_hash(path) if path else None,
        "ptxas": current_ptxas_version(),
        "shape": list(shape),
        "tflops": tflops,
        "default_tflops": default_tflops,
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    entry.update(extra)
    return entry


def store_tuned(gpu_name: str, dtype_name: str, layout: str, shape: tuple[int, int, int], entry: dict,
                path: Path | None = None) -> tuple[Path, str | None]:
    """Insert/replace one entry; stale entries are dropped on the way. Returns (cache path, where a
    corrupt old file was moved, or None)."""
    path = Path(path) if path else cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    moved = None
    with _locked(path):
        try:
            data = read_cache(path)
        except CacheCorrupt:
            moved = str(path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"))
            os.replace(path, moved)
            data = {"format": CACHE_FORMAT, "entries": {}}
        entries = {k: v for k, v in data["entries"].items() if entry_is_current(v)}
        entries[cache_key(gpu_name, dtype_name, layout, *shape)] = entry
        data = {"format": CACHE_FORMAT, "entries": dict(sorted(entries.items()))}
        _write_atomic(path, json.dumps(data, indent=1, sort_keys=False) + "\n")
    _memo.pop(str(path), None)
    return path, moved
