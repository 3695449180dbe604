"""The whole pipeline, one call per stage, each stage's output kept for inspection:

  source -> parse (AST) -> expand (flat ir.Module) -> allocate (register plan) -> schedule
         -> emit (PTX text) -> [assemble: ptxas -> cubin]

`build_file`/`build_source` run everything up to PTX on the CPU; `assemble` runs ptxas and maps
its complaints back to the .sasm line that produced the offending PTX line.
"""
from __future__ import annotations

import dataclasses
import gc
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from . import ast, build_memo, ir, ptxas_choice
from .emit import EmittedPtx, LineLayout, TRACE_MODES, emit_ptx
from .errors import AsmError, Note
from .expand import ExpandResult, expand
from .files import read_source
from .isa.arch import (DEFAULT_TARGET, FEATURE_USES, arch_for, check_features, instruction_features,
                       required_features)
from .parse import parse_source
from .parse_fast import PLAIN_PTX_NODES, Statements
from .ptxas_choice import PtxasChoice
from .ptxas_names import locate as locate_named
from .regalloc import Allocation, allocate
from .sass.control_directive import ControlReport, apply_controls, has_controls
from .scheduler import schedule_module
from .source import SourceFile
from .targets import SUPPORTED_TARGETS, require_supported_target
from .toolchain import (ABORTED, KernelResources, killed_by_signal, parse_diagnostics, parse_resource_usage,
                        run_ptxas)


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
    ast: ast.Module                    # its top level: functions without their bodies (_top_level)
    parameters: dict[str, object]
    tunables: dict[str, list]
    constants: dict[str, object]       # top-level constants after -D: the build's metadata (tile sizes...)
    allocated: ir.Module               # the expanded module, its named registers renamed by the plan
    allocation: Allocation
    scheduled: ir.Module
    schedule_report: object | None
    target: str
    emitted: EmittedPtx
    includes: tuple[Path, ...] = ()    # every file the build `.include`d, as the expander found it
    # `.ptxas_alternative` option sets: assemble() tries each beside ptxas's defaults (ptxas_choice.py)
    ptxas_alternatives: tuple[tuple[str, ...], ...] = ()

    @property
    def input_files(self) -> list[Path]:
        """The source and every file it included: what the build read, and no output may replace."""
        return [Path(self.source.path), *self.includes]

    @property
    def expanded(self) -> ir.Module:
        """The module as expansion left it, before the register plan renamed its registers in
        place: expanded again from the source when asked (a large kernel's instructions twice
        over, expanded and planned, were a third of its build's memory)."""
        result = expand(parse_source(self.source), self.options.defines, self.options.include_dirs)
        return _without_unit_clusters(result.module)

    @property
    def ptx(self) -> str:
        return self.emitted.text

    @property
    def kernel_names(self) -> list[str]:
        return [f.name for f in self.scheduled.functions() if f.kind == "entry" and f.body is not None]

    def entry_params(self, entry: str) -> tuple[ir.ParamInfo, ...]:
        """The .param list of a kernel entry, as the runtime packs it."""
        for f in self.scheduled.functions():
            if f.kind == "entry" and f.body is not None and f.name == entry:
                return f.params
        raise AsmError(f"{self.source.path} has no kernel entry '{entry}' "
                       f"(entries: {', '.join(self.kernel_names) or 'none'})")


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
    # A build allocates a few objects per source token and frees almost nothing until it ends, the
    # pattern in which CPython's cyclic collector runs over and over for nothing (a third of the
    # time of a 10 MB PTX build); it makes no cycles worth collecting, so the collector pauses.
    memo = build_memo.entry_path(source.path, source.text, options or BuildOptions())
    kept = build_memo.read(memo)
    if kept is not None:
        return kept
    enabled = gc.isenabled()
    gc.disable()
    try:
        result = _build(source, options)
    finally:
        if enabled:
            gc.enable()
    build_memo.write(memo, result)
    return result


def _build(source: SourceFile, options: BuildOptions | None) -> BuildResult:
    options = options or BuildOptions()
    if options.trace not in TRACE_MODES:
        raise AsmError(f"unknown trace mode '{options.trace}' (choose from {', '.join(TRACE_MODES)})")
    if options.target is not None:
        require_supported_target(options.target)      # AsmError listing the supported ones
    tree = parse_source(source)
    result: ExpandResult = expand(tree, options.defines, options.include_dirs)
    layout = plain_ptx_layout(tree) if options.trace == "none" and not options.annotate else None
    tree = _top_level(tree)
    module = _without_unit_clusters(result.module)
    target = choose_target(module, options.target)
    allocated, allocation = allocate(module, target)
    scheduled, report = _schedule(allocated, target, options)
    emitted = emit_ptx(scheduled, target, trace=options.trace, source_name=source.path,
                       ptx_name=Path(source.path).with_suffix(".ptx").name, layout=layout)
    return BuildResult(source, options, tree, result.parameters, result.tunables, result.constants,
                       allocated, allocation, scheduled, report, target, emitted, result.includes,
                       result.ptxas_alternatives)


def _top_level(tree: ast.Module) -> ast.Module:
    """The module with its functions' bodies left out: what the build keeps of the AST once
    expansion has read it. A large source's function bodies were most of a build's memory, and
    nothing after expansion reads them (ptxas errors are mapped through the emitted lines)."""
    if not any(type(s) is ast.Function and s.body for s in tree.body):
        return tree
    return ast.Module([dataclasses.replace(s, body=[]) if type(s) is ast.Function and s.body else s
                       for s in tree.body], tree.source)


def plain_ptx_layout(tree: ast.Module) -> LineLayout | None:
    """A LineLayout when `tree` is plain PTX (no macro-layer statement anywhere), else None.
    Sources with a macro layer (the shipped kernels) keep the emitter's own layout: their lines
    have no one-to-one counterpart in the PTX anyway."""
    header: dict[str, int] = {}
    todo = [tree.body]
    while todo:
        for s in todo.pop():
            if type(s) not in PLAIN_PTX_NODES or type(s) is ast.Instr and s.pinned:
                return None
            if type(s) is ast.Function:
                # a body's recognised lines are plain PTX: only what the grammar built is asked
                # (reading them all would build every line's node again)
                if type(s.body) is Statements:
                    todo.append(s.body.grammar_nodes)
                elif s.body is not None:
                    todo.append(s.body)
            elif type(s) is ast.Scope:
                todo.append(s.body)
            elif type(s) in (ast.Version, ast.Target, ast.AddressSize):
                header[{ast.Version: "version", ast.Target: "target", ast.AddressSize: "address_size"}[type(s)]] = \
                    s.span.line
    return LineLayout(tree.source.path, header)


def _schedule(module: ir.Module, target: str, options: BuildOptions):
    return schedule_module(module, target, enabled=options.schedule, annotate=options.annotate)


_FEATURE_SREGS = frozenset(u.sreg for u in FEATURE_USES if u.sreg)


def _without_unit_clusters(module: ir.Module) -> ir.Module:
    """The module with `.reqnctapercluster 1, 1, 1` left out of every function that uses no other
    cluster feature: a launch without clusters is a cluster of one block (PTX ISA,
    "Cluster of Cooperative Thread Arrays"), so the directive asks for nothing, and leaving it out
    lets one source build for targets without clusters (gemm_skinny.sasm: `.reqnctapercluster
    1, 1, {CLUSTER_K}`, CLUSTER_K = 1 on sm_80). A function that also uses cluster instructions
    (hgemm.sasm with CLUSTER = 1) keeps it: what it was written for stays in its PTX."""
    def unit(perf: str) -> bool:
        word, _, rest = perf.partition(" ")
        return word == ".reqnctapercluster" and [v.strip() for v in rest.split(",")] == ["1", "1", "1"]
    def uses_clusters(fn: ir.Function) -> bool:
        # one instruction of each (opcode, special registers), as choose_target reads them: the
        # features of every instruction took ~0.06 s a build of sgemm, mma_gemm or gemm_skinny
        sample = _feature_sample(module.copy_with(items=[fn])).items[0]
        return any("clusters" in instruction_features(ins) for ins in sample.instructions())
    items, changed = [], False
    for item in module.items:
        if isinstance(item, ir.Function) and any(unit(p) for p in item.perf) and not uses_clusters(item):
            item = dataclasses.replace(item, perf=[p for p in item.perf if not unit(p)])
            changed = True
        items.append(item)
    return module.copy_with(items=items) if changed else module


def _feature_sample(module: ir.Module) -> ir.Module:
    """The module with only the first instruction of each (opcode, special registers): what an
    instruction's features depend on (isa/arch.py, instruction_features), so the features and the
    first use of each are those of the whole module, found in a fraction of the time (a plain-PTX
    file repeats a few hundred opcodes). tests/test_parse_fast.py checks the two agree."""
    seen: set = set()
    items = []
    sregs_of: dict[int, frozenset] = {}        # per operand object (expansion shares them)
    of_list: dict[int, frozenset] = {}         # per operand list (shared too), the last few thousand
    none = frozenset()
    for item in module.items:
        if isinstance(item, ir.Function) and item.body is not None:
            body = []
            for ins in item.instructions():
                found = of_list.get(id(ins.operands))
                if found is None:
                    found = none
                    for op in ins.operands:
                        sregs = sregs_of.get(id(op))
                        if sregs is None:
                            sregs = sregs_of[id(op)] = frozenset(
                                r.name.split(".", 1)[0] for r in ir.operand_regs(op)) & _FEATURE_SREGS
                        if sregs:
                            found = found | sregs
                    if len(of_list) >= 20_000:
                        of_list.clear()
                    of_list[id(ins.operands)] = found
                if ins.guard is not None and ins.guard.reg.name.split(".", 1)[0] in _FEATURE_SREGS:
                    found = found | {ins.guard.reg.name.split(".", 1)[0]}
                key = (ins.opcode, found)
                if key not in seen:
                    seen.add(key)
                    body.append(ins)
            item = dataclasses.replace(item, body=body)
        items.append(item)
    return module.copy_with(items=items)


def choose_target(module: ir.Module, requested: str | None) -> str:
    """The build's target: --target, else the source's .target, else DEFAULT_TARGET. Without
    --target, a source that uses an architecture-specific feature (wgmma, setmaxnreg: sm_90a only)
    is built for the `a` variant of sm_90. A feature the chosen target lacks is an AsmError at the
    first instruction that uses it (isa/arch.py: FEATURES, FEATURE_USES)."""
    uses = required_features(_feature_sample(module))
    declared = module.target[0] if module.target else None
    if requested:
        target, chosen_by = requested, "option"
    elif declared:
        if declared not in SUPPORTED_TARGETS:
            raise AsmError(f"unsupported .target {declared} (supported: {', '.join(SUPPORTED_TARGETS)})")
        target, chosen_by = declared, "directive"
    else:
        target, chosen_by = DEFAULT_TARGET, ""
    arch = arch_for(target)
    specific = target + "a"
    if not requested and not arch.arch_specific and specific in SUPPORTED_TARGETS:
        a_arch = arch_for(specific)
        if any(f not in arch.features and f in a_arch.features for f, _ in uses):
            target, arch = specific, a_arch
    check_features(arch, uses, chosen_by)
    return target


# ---- ptxas -----------------------------------------------------------------------------------
@dataclass
class AssembleResult:
    cubin: bytes
    kernels: list[KernelResources]
    warnings: list[str]
    log: str
    control: ControlReport | None = None   # what the `.control` directives did to ptxas's code
    # which ptxas run shipped, where the source names `.ptxas_alternative`s (ptxas_choice.py)
    ptxas_choice: PtxasChoice | None = None

    @property
    def ptxas_options(self) -> tuple[str, ...]:
        return self.ptxas_choice.options if self.ptxas_choice is not None else ()


def assemble(result: BuildResult, extra_args: list[str] | None = None) -> AssembleResult:
    """ptxas the build's PTX; ptxas errors become AsmErrors at the .sasm line that produced them.
    When the build has `.control` directives, the cubin returned is ptxas's with their control
    fields written and checked (sass/control_directive.py); a refused patch is an AsmError at the
    directive, and no cubin comes back. When the source names `.ptxas_alternative`s, ptxas runs
    with each as well and the run ptxas_choice.choose keeps is the one returned (its
    `ptxas_choice` says which and why)."""
    assembled = _run_ptxas(result, extra_args)
    if result.ptxas_alternatives:
        assembled = _choose_run(result, extra_args, assembled)
    if not has_controls(result.scheduled):
        return assembled
    args = list(extra_args or []) + list(assembled.ptxas_options)
    if result.options.trace == "ptx-lines":
        traced, traced_ptx = assembled.cubin, result.ptx      # the cubin carries its own line table
    else:
        traced_build = _traced(result)
        traced, traced_ptx = _run_ptxas(traced_build, args).cubin, traced_build.ptx
    report = apply_controls(result.scheduled, assembled.cubin, traced, traced_ptx, result.source.path,
                            result.target)
    return dataclasses.replace(assembled, cubin=report.cubin, control=report)


def _choose_run(result: BuildResult, extra_args: list[str] | None, defaults: AssembleResult) -> AssembleResult:
    """The build assembled with each `.ptxas_alternative` too; the run ptxas_choice.choose keeps."""
    runs = [defaults] + [_run_ptxas(result, list(extra_args or []) + list(options))
                         for options in result.ptxas_alternatives]
    trials = [ptxas_choice.trial(options, run.cubin, result.target, run.kernels)
              for options, run in zip(((),) + result.ptxas_alternatives, runs)]
    choice = ptxas_choice.choose(trials)
    return dataclasses.replace(runs[choice.chosen], ptxas_choice=choice)


def _run_ptxas(result: BuildResult, extra_args: list[str] | None) -> AssembleResult:
    args = list(extra_args or [])
    if result.options.trace in ("loc", "ptx-lines") and "-lineinfo" not in args:
        args.append("-lineinfo")
    ptx_name = Path(result.source.path).with_suffix(".ptx").name
    code, log, cubin = run_ptxas(result.ptx, result.target, args, ptx_name=ptx_name)
    diags = parse_diagnostics(log)
    if code < 0:
        raise AsmError(killed_by_signal(
            "ptxas", -code, log, "this is a ptxas crash on this input, not an error asmgemm can point at in the "
            "source; write the PTX with `asmgemm build -o FILE.ptx` and run ptxas on it to reproduce"))
    if code != 0 or cubin is None:
        errors = [d for d in diags if d.severity == "error"] or diags
        # "Ptx assembly aborted due to errors" only closes the real errors before it.
        errors = [d for d in errors if d.message != ABORTED] or errors
        if not errors:
            tail = log.strip()[-2000:]
            raise AsmError(f"ptxas failed (exit {code})" + (f": {tail}" if tail else " and printed nothing"))
        ptx_lines = result.ptx.splitlines()

        def where(d) -> tuple:
            if not d.line:
                # a message about a function or variable: its declaration
                return locate_named(d.message, result.scheduled)
            return result.emitted.span_for_line(d.line) or _header_span(result, ptx_lines, d.line), []

        first = errors[0]
        span, notes = where(first)
        ptx_line = ptx_lines[first.line - 1].strip() if first.line and first.line <= len(ptx_lines) else ""
        notes += [Note(f"ptxas: {d.message}", where(d)[0]) for d in errors[1:6]]
        at = f" (PTX line {first.line}: {ptx_line})" if first.line else ""
        raise AsmError(f"ptxas: {first.message}{at}", span, notes=notes)
    warnings = [f"{d.message}" for d in diags if d.severity == "warning"]
    return AssembleResult(cubin, parse_resource_usage(log), warnings, log)


def _header_span(result: BuildResult, ptx_lines: list[str], line: int):
    """A PTX header line (.version/.target/.address_size) has no instruction behind it: point at
    the directive the source wrote, if it wrote one."""
    if line > len(ptx_lines):
        return None
    words = ptx_lines[line - 1].split()
    kind = {".version": ast.Version, ".target": ast.Target, ".address_size": ast.AddressSize}.get(
        words[0] if words else "")
    if kind is None:
        return None
    return next((s.span for s in result.ast.body if isinstance(s, kind)), None)


@dataclass
class TracedBuild:
    """A build assembled for the SASS inspector: the PTX re-emitted in trace mode "ptx-lines" (a
    `.loc` per instruction pointing at its own PTX line) and ptxas run with -lineinfo, so every
    SASS instruction can be tied to its PTX line, its position in the function and its .sasm line.
    -lineinfo does not change the code (checked on the shipped kernels: identical SASS opcode
    sequences with and without it)."""

    build: BuildResult             # the build in "ptx-lines" trace mode
    assembled: AssembleResult


def assemble_traced(result: BuildResult) -> TracedBuild:
    """The line-traced PTX of a build, assembled (the build is re-emitted only if it was not
    traced already: expansion, allocation and scheduling are not redone). Its `.control`
    directives are applied as in `assemble`: the inspector shows the code that ships."""
    traced = _traced(result)
    return TracedBuild(traced, assemble(traced))


def _traced(result: BuildResult) -> BuildResult:
    """The build re-emitted in trace mode "ptx-lines" (itself if it already is)."""
    if result.options.trace == "ptx-lines":
        return result
    emitted = emit_ptx(result.scheduled, result.target, trace="ptx-lines", source_name=result.source.path,
                       ptx_name=Path(result.source.path).with_suffix(".ptx").name)
    return dataclasses.replace(result, emitted=emitted,
                               options=dataclasses.replace(result.options, trace="ptx-lines"))
