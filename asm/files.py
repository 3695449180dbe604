"""Files asmgemm writes: the one atomic-write helper and the one cache-folder lookup.

Every output (PTX, cubin, JSON reports, the kernel and tuning caches, benchmark baselines) goes
through `write_atomic`: a temporary file in the destination's folder, then a rename, so a reader
sees the old file or the new one, never half of one, and a failed or interrupted command leaves
nothing behind.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from .errors import AsmError


def cache_root() -> Path:
    """$ASMGEMM_CACHE_DIR, else $XDG_CACHE_HOME/asmgemm, else ~/.cache/asmgemm. The kernel cache
    (kernels/) and the tuning cache (tune.json) live under it."""
    base = os.environ.get("ASMGEMM_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "asmgemm"


def _mode_for(path: Path) -> int:
    """The mode a plain open() would give: the existing file's, else 0666 less the umask
    (mkstemp alone would make every output 0600)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: str | os.PathLike, data: str | bytes, *, durable: bool = False) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename.

    durable=True also fsyncs before the rename (caches other processes read concurrently).
    Raises AsmError (never OSError) when the folder is missing or not writable; on any failure,
    KeyboardInterrupt included, the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise AsmError(f"cannot write {path}: folder {folder} does not exist")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise AsmError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise AsmError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
