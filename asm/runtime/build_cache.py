"""Build a shipped kernel once per configuration: in memory for the process, on disk across runs.

Key: sha256 over the kernel source and every file it `.include`s, the -D defines (sorted), the
target, the ptxas version and the asmgemm version. Disk folder: $ASMGEMM_CACHE_DIR, else
~/.cache/asmgemm (XDG_CACHE_HOME respected), sub-folder `kernels/`. Each entry is `<key>.cubin`,
`<key>.ptx` and `<key>.json` (launch geometry), each written atomically (temporary file + rename),
the JSON last, so a reader that finds the JSON finds complete files.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, asdict
from pathlib import Path

from .. import __version__
from ..errors import AsmError

_INCLUDE_RE = re.compile(r'^\s*\.include\s+"([^"]+)"', re.MULTILINE)
_META_RE = re.compile(r"^\s*\.global\s+[^;]*?\b(\w+)_meta_([a-z]+)_(\d+)\s*;", re.MULTILINE)
MAX_INCLUDES = 64


@dataclass(frozen=True)
class BuiltKernel:
    """A compiled kernel and how to launch it (geometry read from the kernel's meta symbols)."""

    key: str
    name: str              # entry point
    threads: int
    tile_m: int            # rows of C per block
    tile_n: int            # columns of C per block
    smem_bytes: int        # dynamic shared memory per block
    cubin_path: str
    ptx_path: str
    target: str


def cache_dir() -> Path:
    base = os.environ.get("ASMGEMM_CACHE_DIR")
    if base:
        return Path(base) / "kernels"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "asmgemm" / "kernels"


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


def cache_key(source_path: Path, defines: dict, target: str, ptxas_version: str) -> str:
    h = hashlib.sha256(source_digest(source_path).encode() + b"\0")
    for k in sorted(defines):
        h.update(f"-D{k}={defines[k]}\0".encode())
    h.update(f"target={target}\0ptxas={ptxas_version}\0asmgemm={__version__}".encode())
    return h.hexdigest()[:32]


def launch_meta(ptx: str, entry: str) -> dict[str, int]:
    """The `.global .u32 <entry>_meta_<what>_<value>;` symbols a kernel declares about itself."""
    meta = {what: int(v) for kname, what, v in _META_RE.findall(ptx) if kname == entry}
    missing = {"threads", "tilem", "tilen", "smem"} - set(meta)
    if missing:
        raise AsmError(f"kernel '{entry}' does not declare its launch geometry ({', '.join(sorted(missing))} missing)")
    return meta


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_memory: dict[str, BuiltKernel] = {}
# (kernel, defines, target) -> BuiltKernel for this process: the per-call path skips hashing files
# and asking ptxas its version. A kernel edited while the process runs needs clear_memory_cache().
_by_config: dict[tuple, BuiltKernel] = {}


@functools.lru_cache(maxsize=None)
def _ptxas_version() -> str:
    from ..toolchain import tool_version
    return tool_version("ptxas")


def build_kernel(kernel: str, defines: dict, target: str, entry: str | None = None) -> BuiltKernel:
    """The compiled kernel for these defines and target: from memory, from disk, or built now."""
    defines = {k: str(v) for k, v in defines.items()}
    config = (kernel, tuple(sorted(defines.items())), target, entry)
    hit = _by_config.get(config)
    if hit is not None:
        return hit
    built = _build_kernel(kernel, defines, target, entry)
    _by_config[config] = built
    return built


def _build_kernel(kernel: str, defines: dict, target: str, entry: str | None) -> BuiltKernel:
    from ..pipeline import BuildOptions, assemble, build_file, resolve_input

    path = resolve_input(kernel)
    entry = entry or path.stem
    key = cache_key(path, defines, target, _ptxas_version())
    hit = _memory.get(key)
    if hit is not None:
        return hit
    folder = cache_dir()
    meta_path = folder / f"{key}.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            built = BuiltKernel(**meta)
            if Path(built.cubin_path).is_file() and Path(built.ptx_path).is_file():
                _memory[key] = built
                return built
        except (OSError, ValueError, TypeError):
            pass  # a damaged entry is rebuilt below
    result = build_file(path, BuildOptions(defines=defines, target=target))
    asm = assemble(result)
    geo = launch_meta(result.ptx, entry)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AsmError(f"cannot create the kernel cache folder {folder}: {exc.strerror}",
                       hint="set ASMGEMM_CACHE_DIR to a writable folder") from None
    cubin_path, ptx_path = folder / f"{key}.cubin", folder / f"{key}.ptx"
    built = BuiltKernel(key, entry, geo["threads"], geo["tilem"], geo["tilen"], geo["smem"], str(cubin_path),
                        str(ptx_path), target)
    _write_atomic(cubin_path, asm.cubin)
    _write_atomic(ptx_path, result.ptx.encode())
    _write_atomic(meta_path, json.dumps(asdict(built), indent=1).encode())
    _memory[key] = built
    return built


def clear_memory_cache() -> None:
    _memory.clear()
    _by_config.clear()
