"""Finding and running NVIDIA's command-line tools (ptxas, nvdisasm).

Search order, so that a user's own CUDA install wins over the pip wheels:
  1. ASMGEMM_PTXAS / ASMGEMM_NVDISASM (a full path),
  2. PATH,
  3. the pip packages' bin folders (`site-packages/nvidia/cu13/bin`, and the older
     `nvidia/cuda_nvcc/bin` / `nvidia/cuda_nvdisasm/bin` layouts),
  4. CUDA_HOME/bin and /usr/local/cuda/bin.

ASMGEMM_TOOL_MEMO=DIR keeps every successful ptxas and nvdisasm run in DIR, by the tool (its path,
size and modification time), its arguments and its input, and answers the same run again from there
instead of starting the tool: both are pure functions of those. The test suite sets it for one
session (tests/conftest.py), where the same kernels are assembled and disassembled by many tests
and by both workers of `pytest -n 2`. A failed run is never kept.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import AsmError, ToolchainError

_EXTRA_FOR = {"ptxas": "cuda-tools", "nvdisasm": "cuda-tools"}
_PIP_PACKAGE_FOR = {"ptxas": "nvidia-cuda-nvcc==13.0.88", "nvdisasm": "nvidia-cuda-nvdisasm"}


def _pip_bin_dirs() -> list[Path]:
    roots: list[Path] = []
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.append(Path(p))
    roots.extend(Path(p) for p in sys.path if p.endswith("site-packages"))
    dirs: list[Path] = []
    for root in roots:
        for sub in ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin", "nvidia/cuda_nvdisasm/bin"):
            d = root / sub
            if d.is_dir() and d not in dirs:
                dirs.append(d)
    return dirs


def find_tool(name: str, required: bool = True) -> str | None:
    """Absolute path of `name` (ptxas or nvdisasm), or a ToolchainError that says what to install."""
    var = f"ASMGEMM_{name.upper()}"
    override = os.environ.get(var)
    if override:
        p = Path(override)
        if p.is_dir():
            raise ToolchainError(f"{var}={override} is a directory; it must name the {name} executable itself",
                                 hint=f"for example {var}={p / name}")
        if not p.is_file():
            raise ToolchainError(f"{var}={override}: no such file; it must name the {name} executable",
                                 hint=f"fix or unset {var} (unset, {name} is looked up on PATH)")
        if not os.access(p, os.X_OK):
            raise ToolchainError(f"{var}={override} is not executable; it must name the {name} executable",
                                 hint=f"chmod +x {override}, or point {var} at {name}")
        return override
    found = shutil.which(name)
    if found:
        return found
    candidates = _pip_bin_dirs()
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidates.append(Path(cuda_home) / "bin")
    candidates.append(Path("/usr/local/cuda/bin"))
    for d in candidates:
        exe = d / name
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    if not required:
        return None
    raise ToolchainError(
        f"{name} not found on PATH or in the NVIDIA pip packages",
        hint=f"install it with: pip install 'asmgemm[{_EXTRA_FOR[name]}]'  "
             f"(or pip install {_PIP_PACKAGE_FOR[name]}), or set ASMGEMM_{name.upper()}",
    )


@functools.lru_cache(maxsize=None)
def ptxas_version() -> str:
    """The ptxas version (e.g. 'V13.0.88'), asked once per process: kernel and tuning caches key on it."""
    return tool_version("ptxas")


def ptxas_targets() -> tuple[str, ...] | None:
    """The `.target` names (sm_XX, sm_XXa, sm_XXf) the ptxas in use assembles, or None when there
    is no ptxas (or it cannot be run, or its help lists none). Asked once per ptxas path: tests
    and users may point ASMGEMM_PTXAS at another ptxas within one process."""
    try:
        exe = find_tool("ptxas", required=False)
    except ToolchainError:          # a broken ASMGEMM_PTXAS: the build reports it when it runs ptxas
        return None
    if exe is None:
        return None
    return _ptxas_targets_at(exe)


# ptxas has no option that lists its architectures alone (13.0 refuses `--list-gpu-arch`, which
# nvcc has); `ptxas --help` lists them as the allowed values of --gpu-name:
#   --gpu-name <gpu name>   (-arch)
#           ... Allowed values for this option:  'compute_100',...,'sm_90','sm_90a'.
_GPU_NAME_HELP = re.compile(r"^--gpu-name\b(?P<body>.*?)(?=^--|\Z)", re.M | re.S)
_SM_NAME = re.compile(r"'(sm_\d+[a-z]?)'")


@functools.lru_cache(maxsize=8)
def _ptxas_targets_at(exe: str) -> tuple[str, ...] | None:
    try:
        proc = subprocess.run([exe, "--help"], capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ptxas_targets(proc.stdout + proc.stderr)


def parse_ptxas_targets(help_text: str) -> tuple[str, ...] | None:
    """The sm_* values `ptxas --help` allows for --gpu-name (None when it names none)."""
    m = _GPU_NAME_HELP.search(help_text)
    if m is None:
        return None
    names = tuple(dict.fromkeys(_SM_NAME.findall(m.group("body"))))
    return names or None


def _run_tool(name: str, exe: str, args: list[str]) -> subprocess.CompletedProcess:
    """Run a tool; failing to start it (a file that is not a program) is a ToolchainError."""
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, errors="replace")
    except OSError as exc:
        var = f"ASMGEMM_{name.upper()}"
        via = f" ({var}={exe})" if os.environ.get(var) == exe else ""
        hint = f"check that it is the {name} program" + (f", or unset {var}" if via else "")
        raise ToolchainError(f"cannot run {name} {exe}{via}: {exc.strerror or exc}", hint=hint) from None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def killed_by_signal(tool: str, signum: int, log: str, crash: str) -> str:
    """The message for a tool that a signal ended: who is likely to blame (`crash` when the tool
    itself crashed), and what it said."""
    if signum == getattr(signal, "SIGKILL", None):
        why = f"something outside {tool} killed it (often the out-of-memory killer)"
    elif signum in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)):
        why = "it was stopped from outside"
    else:
        why = crash
    tail = log.strip()[-2000:]
    return (f"{tool} was killed by signal {signum} ({signal_name(signum)}): {why}"
            + (f"\n{tool} said: {tail}" if tail else ""))


def tool_version(name: str) -> str:
    exe = find_tool(name)
    out = _run_tool(name, exe, ["--version"]).stdout
    m = re.search(r"release [\d.]+, (V[\d.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


@dataclass
class KernelResources:
    """What `ptxas -v` reports for one function."""

    name: str
    target: str = ""
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_frame: int = 0
    shared_bytes: int = 0
    constant_bytes: dict[str, int] = field(default_factory=dict)
    barriers: int = 0
    local_bytes: int = 0
    compile_ms: float | None = None

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0 or self.local_bytes > 0

    def to_json(self) -> dict:
        d = asdict(self)
        d["spills"] = self.spills
        return d


@dataclass
class PtxasResult:
    cubin: bytes
    kernels: list[KernelResources]
    log: str
    warnings: list[str]


@dataclass
class PtxasDiagnostic:
    """One `ptxas <file>, line N; error : text` line."""

    line: int | None
    severity: str
    message: str


_DIAG = re.compile(r"^ptxas\s+(?P<file>.*?), line (?P<line>\d+); (?P<sev>error|warning|fatal)\s*:\s*(?P<msg>.*)$")
_ON_LINE = re.compile(r"\bon line (\d+)\b")
# What ptxas says last after any error; it adds nothing to the errors before it.
ABORTED = "Ptx assembly aborted due to errors"
_DIAG_NOLINE = re.compile(r"^ptxas (?P<sev>error|warning|fatal)\s*:\s*(?P<msg>.*)$")


def parse_diagnostics(log: str) -> list[PtxasDiagnostic]:
    diags = []
    for raw in log.splitlines():
        m = _DIAG.match(raw.strip())
        if m:
            # `ptxas f.ptx, line 1; fatal : Unsupported .version 99.9` is an error with a line.
            sev = "error" if m["sev"] == "fatal" else m["sev"]
            diags.append(PtxasDiagnostic(int(m["line"]), sev, m["msg"].strip()))
            continue
        m = _DIAG_NOLINE.match(raw.strip())
        if m:
            sev = "error" if m["sev"] == "fatal" else m["sev"]
            # Some fatal messages carry their line in the text: "... encountered on line 22".
            at = _ON_LINE.search(m["msg"])
            diags.append(PtxasDiagnostic(int(at.group(1)) if at else None, sev, m["msg"].strip()))
    return diags


def parse_resource_usage(log: str) -> list[KernelResources]:
    """Parse the `-v` report. Formats seen from ptxas 12.x/13.x:

    ptxas info    : Compiling entry function 'k' for 'sm_90'
    ptxas info    : Function properties for k
        8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, 368 bytes cmem[0]
    """
    kernels: dict[str, KernelResources] = {}
    order: list[str] = []
    current: KernelResources | None = None
    for raw in log.splitlines():
        line = raw.strip()
        m = re.search(r"Compiling entry function '([^']+)' for '([^']+)'", line) or \
            re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            if name not in kernels:
                kernels[name] = KernelResources(name)
                order.append(name)
            current = kernels[name]
            if "Compiling entry" in line:
                current.target = m.group(2)
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
            continue
        if line.startswith("ptxas info") and "Used" in line:
            m = re.search(r"Used (\d+) registers", line)
            if m:
                current.registers = int(m.group(1))
            m = re.search(r"used (\d+) barriers", line)
            if m:
                current.barriers = int(m.group(1))
            m = re.search(r"(\d+) bytes smem", line)
            if m:
                current.shared_bytes = int(m.group(1))
            m = re.search(r"(\d+) bytes lmem", line)
            if m:
                current.local_bytes = int(m.group(1))
            for bank, size in re.findall(r"(\d+) bytes cmem\[(\d+)\]", line):
                current.constant_bytes[f"cmem[{size}]"] = int(bank)
            continue
        m = re.search(r"Compile time = ([\d.]+) ms", line)
        if m:
            current.compile_ms = float(m.group(1))
    return [kernels[n] for n in order]


TOOL_MEMO_ENV = "ASMGEMM_TOOL_MEMO"


def _memo_key(tool: str, exe: str, args: list[str], data: bytes) -> Path | None:
    """Where ASMGEMM_TOOL_MEMO keeps this run (module docstring), or None when it is not set."""
    folder = os.environ.get(TOOL_MEMO_ENV)
    if not folder:
        return None
    try:
        st = os.stat(exe)
    except OSError:
        return None
    h = hashlib.sha256(f"{exe}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for a in args:
        h.update(a.encode() + b"\0")
    h.update(data)
    return Path(folder) / f"{tool}-{h.hexdigest()}"


def _memo_write(path: Path, suffix: str, data: bytes) -> None:
    """One file of a kept run, written whole (another process may read the folder at any time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path.with_suffix(suffix))


# The ptxas options a source may ask to be assembled with as well (`.ptxas_alternative`): options
# that change how ptxas allocates and schedules the same program, nothing that changes what the
# cubin is for or where it goes. --register-usage-level: CUDA 12.8+ ptxas, "controls the
# aggressiveness of optimizations that affect register usage" (ptxas --help; default 5).
PTXAS_ALTERNATIVE_OPTIONS = {
    "--register-usage-level": lambda v: v.isdigit() and 0 <= int(v) <= 10,
    "--allow-expensive-optimizations": lambda v: v in ("true", "false"),
}


def parse_ptxas_alternative(text: str) -> tuple[str, ...]:
    """The options of a `.ptxas_alternative "..."` line, each `--name=value` from
    PTXAS_ALTERNATIVE_OPTIONS; AsmError (no span: the caller adds it) for anything else."""
    allowed = ", ".join(f"{name}=..." for name in PTXAS_ALTERNATIVE_OPTIONS)
    words = text.split()
    if not words:
        raise AsmError(f"'.ptxas_alternative' names no options (it takes {allowed})")
    for word in words:
        name, eq, value = word.partition("=")
        check = PTXAS_ALTERNATIVE_OPTIONS.get(name)
        if check is None or not eq or not check(value):
            raise AsmError(f"'.ptxas_alternative': '{word}' is not an option it takes ({allowed}; "
                           "--register-usage-level 0 to 10, --allow-expensive-optimizations true or false)")
    return tuple(words)


def run_ptxas(ptx: str, target: str = "sm_90", extra_args: list[str] | None = None,
              ptx_name: str = "input.ptx") -> tuple[int, str, bytes | None]:
    """Assemble PTX text; returns (exit code, combined log, cubin bytes or None)."""
    exe = find_tool("ptxas")
    memo = _memo_key("ptxas", exe, [f"-arch={target}", ptx_name, *(extra_args or [])], ptx.encode("utf-8"))
    if memo is not None and memo.with_suffix(".log").exists():
        return 0, memo.with_suffix(".log").read_text(encoding="utf-8"), memo.with_suffix(".cubin").read_bytes()
    with tempfile.TemporaryDirectory(prefix="asmgemm-") as tmp:
        src = Path(tmp) / ptx_name
        out = Path(tmp) / "out.cubin"
        src.write_text(ptx, encoding="utf-8")
        cmd = [f"-arch={target}", "-v", "-o", str(out), str(src)] + list(extra_args or [])
        proc = _run_tool("ptxas", exe, cmd)
        log = proc.stdout + proc.stderr
        cubin = out.read_bytes() if proc.returncode == 0 and out.exists() else None
        if memo is not None and cubin is not None:
            _memo_write(memo, ".cubin", cubin)          # the cubin first: the log marks the run kept
            _memo_write(memo, ".log", log.encode("utf-8"))
        return proc.returncode, log, cubin


def disassemble(cubin: bytes, extra_args: list[str] | None = None) -> str:
    """nvdisasm text for a cubin (default flags: -hex for encodings, -c for code only)."""
    exe = find_tool("nvdisasm")
    args = extra_args if extra_args is not None else ["-hex", "-c"]
    memo = _memo_key("nvdisasm", exe, list(args), cubin)
    if memo is not None and memo.with_suffix(".txt").exists():
        return memo.with_suffix(".txt").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="asmgemm-") as tmp:
        path = Path(tmp) / "in.cubin"
        path.write_bytes(cubin)
        proc = _run_tool("nvdisasm", exe, [*args, str(path)])
        code = proc.returncode
        if code < 0:
            raise ToolchainError(killed_by_signal("nvdisasm", -code, proc.stderr, "an nvdisasm crash on this cubin"))
        if code != 0:
            said = proc.stderr.strip() or proc.stdout.strip()
            raise ToolchainError(f"nvdisasm failed (exit {code})" + (f": {said}" if said else " and printed nothing"))
        if memo is not None:
            _memo_write(memo, ".txt", proc.stdout.encode("utf-8"))
        return proc.stdout
