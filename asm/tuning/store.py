"""The tuning cache, write side: `asmgemm tune` stores its winner here (the runtime only reads:
asmgemm.runtime.tune_cache, which documents the file). Writes go through a temporary file and a
rename under a lock file, so an interrupted or concurrent tune leaves either the old or the new
cache, never a half-written one."""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from ..errors import AsmError
from ..files import write_atomic
from ..runtime import tune_cache as cache

try:
    import fcntl            # POSIX only: elsewhere the read-modify-write runs without a lock
except ImportError:
    fcntl = None


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on <cache>.lock for the read-modify-write (POSIX; elsewhere, no lock)."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        fh = open(lock_path, "a+")
    except OSError as exc:
        raise AsmError(f"cannot lock the tuning cache {path}: {lock_path}: {exc.strerror or exc}") from None
    try:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        fh.close()  # closing releases the lock


def make_entry(kernel: str, dtype: str, kernel_path: str | None, params: dict, shape: tuple[int, int, int],
               tflops: float | None = None, default_tflops: float | None = None, **extra) -> dict:
    path = cache.kernel_source_path(kernel, kernel_path)
    entry = {
        "kernel": kernel,
        "dtype": dtype,
        "kernel_path": str(kernel_path) if kernel_path else None,
        "params": dict(params),
        "source_hash": cache.current_source_hash(path) if path else None,
        "ptxas": cache.current_ptxas_version(),
        "shape": list(shape),
        "tflops": tflops,
        "default_tflops": default_tflops,
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    entry.update(extra)
    return entry


def store_tuned(gpu_name: str, layout: str, shape: tuple[int, int, int], entry: dict,
                path: Path | None = None) -> tuple[Path, str | None]:
    """Insert/replace one entry; stale entries are dropped on the way. Returns (cache path, where a
    corrupt old file was moved, or None)."""
    path = Path(path) if path else cache.cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AsmError(f"cannot create the tuning cache folder {path.parent}: {exc.strerror or exc}",
                       hint="set ASMGEMM_CACHE_DIR or ASMGEMM_TUNE_CACHE to a writable place") from None
    moved = None
    with _locked(path):
        try:
            data = cache.read_cache(path)
        except cache.CacheCorrupt:
            moved = str(path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"))
            try:
                os.replace(path, moved)
            except OSError as exc:
                raise AsmError(f"the tuning cache {path} is not readable and cannot be moved aside: "
                               f"{exc.strerror or exc}") from None
            data = {"format": cache.CACHE_FORMAT, "entries": {}}
        entries = {k: v for k, v in data["entries"].items() if cache.entry_is_current(v)}
        entries[cache.cache_key(gpu_name, entry["kernel"], layout, *shape)] = entry
        data = {"format": cache.CACHE_FORMAT, "entries": dict(sorted(entries.items()))}
        write_atomic(path, json.dumps(data, indent=1, sort_keys=False) + "\n", durable=True)
    cache.forget(path)
    return path, moved
