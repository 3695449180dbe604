"""Build a spec'd kernel once per configuration: in memory for the process, on disk across runs.

Key: sha256 over the kernel source and every file it `.include`s, the -D defines (sorted), the
target, the ptxas version and the asmgemm version. Disk folder: `kernels/` under the cache folder
(asmgemm.files.cache_root). Each entry is `<key>.cubin`, `<key>.ptx` and `<key>.json` (launch
geometry and parameter list), each written atomically, the JSON last, so a reader that finds the
JSON finds complete files.

The launch geometry comes from the build itself: the spec names the constants (THREADS, TM, ...)
and the pipeline returns their values; the parameter list is the entry's `.param` list.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import __version__
from ..errors import AsmError
from ..files import cache_root, write_atomic
from ..kernel_spec import ARGUMENTS, KernelSpec
from ..toolchain import ptxas_version

_INCLUDE_RE = re.compile(r'^\s*\.include\s+"([^"]+)"', re.MULTILINE)
MAX_INCLUDES = 64


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

    def to_json(self) -> dict:
        d = asdict(self)
        d["params"] = [list(p) for p in self.params]
        return d

    @staticmethod
    def from_json(d: dict) -> "BuiltKernel":
        d = dict(d)
        d["params"] = tuple(tuple(p) for p in d["params"])
        return BuiltKernel(**d)


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


def cache_key(source_path: Path, defines: dict, target: str, ptxas: str, entry: str = "") -> str:
    h = hashlib.sha256(source_digest(source_path).encode() + b"\0")
    for k in sorted(defines):
        h.update(f"-D{k}={defines[k]}\0".encode())
    h.update(f"target={target}\0ptxas={ptxas}\0asmgemm={__version__}\0entry={entry}".encode())
    return h.hexdigest()[:32]


def launch_geometry(spec: KernelSpec, result) -> dict[str, int]:
    """threads, tile_m, tile_n and smem_bytes of a build, from the constants the spec names."""
    out = {}
    for field in ("threads", "tile_m", "tile_n", "smem_bytes"):
        const = getattr(spec.launch, field)
        value = result.constants.get(const)
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if field == "smem_bytes" else 1):
            raise AsmError(f"{spec.spec_file}: [{spec.name}] launch.{field} names the constant '{const}', which "
                           f"{'the build does not define' if value is None else f'is {value!r}, not a positive integer'}",
                           hint=f"define it at the top level of {spec.source.name} (`.const {const} = ...`)")
        out[field] = value
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
        if p.type not in ARGUMENTS[name] or p.count is not None:
            raise AsmError(f"{spec.spec_file}: [{spec.name}] abi argument '{name}' is passed as "
                           f"{'/'.join(ARGUMENTS[name])}, but .param {p.name} of '{spec.entry}' is "
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
    return built


def _build_kernel(spec: KernelSpec, defines: dict, target: str) -> BuiltKernel:
    from ..pipeline import BuildOptions, assemble, build_file

    key = cache_key(spec.source, defines, target, ptxas_version(), spec.entry)
    hit = _memory.get(key)
    if hit is not None:
        return hit
    folder = cache_dir()
    meta_path = folder / f"{key}.json"
    if meta_path.is_file():
        try:
            built = BuiltKernel.from_json(json.loads(meta_path.read_text()))
            if Path(built.cubin_path).is_file() and Path(built.ptx_path).is_file():
                _memory[key] = built
                return built
        except (OSError, ValueError, TypeError, KeyError):
            pass  # a damaged entry is rebuilt below
    result = build_file(spec.source, BuildOptions(defines=defines, target=target))
    geo = launch_geometry(spec, result)
    params = abi_params(spec, result)
    asm = assemble(result)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AsmError(f"cannot create the kernel cache folder {folder}: {exc.strerror}",
                       hint="set ASMGEMM_CACHE_DIR to a writable folder") from None
    cubin_path, ptx_path = folder / f"{key}.cubin", folder / f"{key}.ptx"
    built = BuiltKernel(key, spec.entry, geo["threads"], geo["tile_m"], geo["tile_n"], geo["smem_bytes"], params,
                        str(cubin_path), str(ptx_path), target)
    write_atomic(cubin_path, asm.cubin)
    write_atomic(ptx_path, result.ptx)
    write_atomic(meta_path, json.dumps(built.to_json(), indent=1))
    _memory[key] = built
    return built


def clear_memory_cache() -> None:
    """Forget the kernels built in this process (after editing a kernel source while it runs)."""
    _memory.clear()
    _by_config.clear()
