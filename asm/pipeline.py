"""The whole pipeline, one call per stage, each stage's output kept for inspection:

  source -> parse (AST) -> expand (flat ir.Module) -> allocate (register plan) -> schedule
         -> emit (PTX text) -> [assemble: ptxas -> cubin]

`build_file`/`build_source` run everything up to PTX on the CPU; `assemble` runs ptxas and maps
its complaints back to the .sasm line that produced the offending PTX line.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from . import ast, ir
from .emit import EmittedPtx, TRACE_MODES, emit_ptx
from .errors import AsmError, Note
from .expand import ExpandResult, expand
from .isa.register_banks import SUPPORTED_TARGETS
from .parse import parse_source
from .regalloc import Allocation, allocate
from .source import SourceFile, Span, read_source
from .toolchain import KernelResources, PtxasResult, parse_diagnostics, parse_resource_usage, run_ptxas

DEFAULT_TARGET = "sm_90"

# Instructions that exist only on sm_90a (PTX ISA 9.0, "Target ISA notes" of each): a source that
# uses them is built for sm_90a unless the user asked for a target explicitly.
SM90A_ONLY_PREFIXES = ("wgmma.", "setmaxnreg.")


@dataclass
class BuildOptions:
    defines: dict[str, str] = field(default_factory=dict)
    target: str | None = None          # None: the source's .target, else sm_90 (sm_90a if needed)
    trace: str = "none"
    schedule: bool = True
    annotate: bool = False
    include_dirs: list[str] = field(default_factory=list)


@dataclass
class BuildResult:
    source: SourceFile
    options: BuildOptions
    ast: ast.Module
    expanded: ir.Module
    parameters: dict[str, object]
    tunables: dict[str, list]
    allocated: ir.Module
    allocation: Allocation
    scheduled: ir.Module
    schedule_report: object | None
    target: str
    emitted: EmittedPtx

    @property
    def ptx(self) -> str:
        return self.emitted.text

    @property
    def kernel_names(self) -> list[str]:
        return [f.name for f in self.scheduled.functions() if f.kind == "entry" and f.body is not None]


def shipped_kernels() -> dict[str, Path]:
    """Kernels that ship with asmgemm, by name (file stem)."""
    root = resources.files("asmgemm.kernels_ptx")
    out = {}
    for entry in root.iterdir():
        if entry.name.endswith(".sasm"):
            out[entry.name[:-5]] = Path(str(entry))
    return dict(sorted(out.items()))


def resolve_input(path_or_name: str | os.PathLike) -> Path:
    p = Path(path_or_name)
    if p.is_file():
        return p
    kernels = shipped_kernels()
    name = p.name[:-5] if p.name.endswith(".sasm") else p.name
    if str(path_or_name) == p.name and name in kernels:
        return kernels[name]
    if p.exists():
        raise AsmError(f"{path_or_name} is not a regular file")
    known = ", ".join(kernels) or "none"
    raise AsmError(f"no such file or shipped kernel: {path_or_name} (shipped kernels: {known})")


def build_file(path_or_name, options: BuildOptions | None = None) -> BuildResult:
    path = resolve_input(path_or_name)
    shown = str(path_or_name) if Path(path_or_name).is_file() else str(path)
    return build(read_source(path, shown_as=shown), options)


def build_source(text: str, path: str = "<input>", options: BuildOptions | None = None) -> BuildResult:
    return build(SourceFile.from_text(path, text), options)


def build(source: SourceFile, options: BuildOptions | None = None) -> BuildResult:
    options = options or BuildOptions()
    if options.trace not in TRACE_MODES:
        raise AsmError(f"unknown trace mode '{options.trace}' (choose from {', '.join(TRACE_MODES)})")
    if options.target is not None and options.target not in SUPPORTED_TARGETS:
        raise AsmError(f"unsupported target '{options.target}' (supported: {', '.join(SUPPORTED_TARGETS)})")
    tree = parse_source(source)
    result: ExpandResult = expand(tree, options.defines, options.include_dirs)
    module = result.module
    target = choose_target(module, options.target)
    allocated, allocation = allocate(module, target)
    scheduled, report = _schedule(allocated, target, options)
    emitted = emit_ptx(scheduled, target, trace=options.trace, source_name=source.path,
                       ptx_name=Path(source.path).with_suffix(".ptx").name)
    return BuildResult(source, options, tree, module, result.parameters, result.tunables, allocated, allocation,
                       scheduled, report, target, emitted)


def _schedule(module: ir.Module, target: str, options: BuildOptions):
    try:
        from .scheduler import schedule_module
    except ImportError:
        schedule_module = None
    if schedule_module is None:
        return module, None
    return schedule_module(module, target, enabled=options.schedule, annotate=options.annotate)


def uses_sm90a_features(module: ir.Module) -> Span | None:
    for fn in module.functions():
        for ins in fn.instructions():
            if ins.opcode.startswith(SM90A_ONLY_PREFIXES):
                return ins.span or fn.span
    return None


def choose_target(module: ir.Module, requested: str | None) -> str:
    needs_a = uses_sm90a_features(module)
    if requested:
        if needs_a is not None and requested == "sm_90":
            raise AsmError(f"this instruction needs target sm_90a, but --target {requested} was given", needs_a,
                           hint="build with --target sm_90a (or leave --target out)")
        return requested
    declared = module.target[0] if module.target else None
    if declared:
        if declared not in SUPPORTED_TARGETS:
            raise AsmError(f"unsupported .target {declared} (supported: {', '.join(SUPPORTED_TARGETS)})")
        if needs_a is not None and declared == "sm_90":
            return "sm_90a"
        return declared
    return "sm_90a" if needs_a is not None else DEFAULT_TARGET


# ---- ptxas -----------------------------------------------------------------------------------
@dataclass
class AssembleResult:
    cubin: bytes
    kernels: list[KernelResources]
    warnings: list[str]
    log: str


def assemble(result: BuildResult, extra_args: list[str] | None = None) -> AssembleResult:
    """ptxas the build's PTX; ptxas errors become AsmErrors at the .sasm line that produced them."""
    args = list(extra_args or [])
    if result.options.trace in ("loc", "ptx-lines") and "-lineinfo" not in args:
        args.append("-lineinfo")
    ptx_name = Path(result.source.path).with_suffix(".ptx").name
    code, log, cubin = run_ptxas(result.ptx, result.target, args, ptx_name=ptx_name)
    diags = parse_diagnostics(log)
    if code != 0 or cubin is None:
        errors = [d for d in diags if d.severity == "error"] or diags
        if not errors:
            raise AsmError(f"ptxas failed (exit {code}): {log.strip()[:2000]}")
        first = errors[0]
        span = result.emitted.span_for_line(first.line) if first.line else None
        ptx_line = result.ptx.splitlines()[first.line - 1].strip() if first.line else ""
        notes = []
        for d in errors[1:6]:
            notes.append(Note(f"ptxas: {d.message}",
                              result.emitted.span_for_line(d.line) if d.line else None))
        where = f" (PTX line {first.line}: {ptx_line})" if first.line else ""
        raise AsmError(f"ptxas: {first.message}{where}", span, notes=notes)
    warnings = [f"{d.message}" for d in diags if d.severity == "warning"]
    return AssembleResult(cubin, parse_resource_usage(log), warnings, log)
