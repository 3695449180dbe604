"""Layers point one way: commands -> library (bench, tuning) -> runtime -> pipeline stages, and
within the stages each one imports only the stages below it (STAGE_RANK). Checked on the import
statements of every module of the package, function-level imports included, resolved to the
module they load:

  * no import cycles among first-party modules (strongly connected components of the graph);
  * every import of another stage points to a lower rank;
  * an import inside a function is only for an optional GPU module (cupy, torch, cuda-bindings,
    triton), matplotlib (the optional `plot` extra), or one of the few lazy loads listed in
    LAZY_IMPORTS, each with its reason (importlib.import_module and __import__ count as imports);
  * no first-party import hides behind `except ImportError`, in the package or in the tests.

And on a fresh interpreter: importing the runtime pulls in neither the benchmark nor the tuner nor
CuPy. Each checker is also run on a small planted graph that breaks its rule, so that a checker
that can no longer fail is caught too."""
from __future__ import annotations

import ast
import functools
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:           # Python 3.10
    import tomli as tomllib

TESTS = Path(__file__).parent
# The packages of pyproject.toml's [tool.setuptools] packages; each is looked up where it is
# installed (asmgemm.scheduler and asmgemm.grammar live outside asm/).
PACKAGES = ["asmgemm", "asmgemm.expand", "asmgemm.isa", "asmgemm.commands", "asmgemm.sass", "asmgemm.runtime", "asmgemm.bench",
            "asmgemm.tuning", "asmgemm.grammar", "asmgemm.kernels_ptx", "asmgemm.scheduler"]
# folders of data alone (the Hopper kernel's parts, the dispatch databases), listed in pyproject.toml
# so that their files ship (package-data); no modules to check
DATA_PACKAGES = ["asmgemm.kernels_ptx.hgemm", "asmgemm.kernels_ptx.mma_gemm", "asmgemm.kernels_ptx.dispatch"]

# Rank of each stage: a module may import its own stage and stages of a lower rank, nothing else.
# A stage is a top-level module of the package or a subpackage ("sass": asmgemm.sass.*). Stages
# of one rank are independent: neither imports the other. Ranks follow the real dependencies,
# bottom up: the version, positions (source.py), the lazy list (list_view.py), the environment reader
# (environment.py) and the data-only packages; errors; the data models
# (ast, ir) and reading files; expressions, the parser cache and the ISA facts; the toolchain
# (ptxas, nvdisasm) and the reader of a `.control` line; the accepted targets, the grammars' shared tree builder and ptxas's names; the
# fast parser and the stages after expansion (register planner, scheduler, emitter); the parser
# and the SASS inspector and patcher (whose hazard check reads the scheduler's latencies); the expander, the kernel specs and the
# choice among ptxas runs (which the inspector judges); the pipeline that runs a build; the
# runtime; the library (benchmark, tuner); the command line.
STAGE_RANK = {
    "version": 0, "source": 0, "grammar": 0, "kernels_ptx": 0, "list_view": 0, "environment": 0,
    "errors": 1,
    "ast": 2, "ir": 2, "files": 2,
    "expr": 3, "parser_cache": 3, "isa": 3,
    "toolchain": 4, "control_line": 4, "build_memo": 4,
    "targets": 5, "parse_tree": 5, "ptxas_names": 5,
    "parse_fast": 6, "regalloc": 6, "scheduler": 6, "emit": 6,
    "parse": 7, "sass": 7, "slow_ops": 7,
    "expand": 8, "kernel_spec": 8, "ptxas_choice": 8,
    "pipeline": 9,
    "runtime": 10,
    "bench": 11, "tuning": 11,
    "commands": 12, "cli": 12, "": 12,          # "": the package facade (asmgemm/__init__.py: asmgemm.gemm)
}
# The library's two parts do not lean on each other the other way round: the tuner times with the
# benchmark's clock, the benchmark never asks the tuner.
ALLOWED_SAME_RANK = {("tuning", "bench")}

# Optional GPU modules: absent on a CPU machine, so imported where they are used.
GPU_MODULES = ("cupy", "cupyx", "cupy_backends", "torch", "cuda", "triton")
# Optional extras that are not GPU modules, with the reason each is imported where used.
OPTIONAL_MODULES = {"matplotlib": "the optional `plot` extra: only `asmgemm bench --plot` needs it"}
# Other imports inside a function, each with its reason: (importing module, module it loads).
LAZY_IMPORTS = {
    ("asmgemm.cli", "importlib.import_module"):
        "the command line loads a subcommand's module when that command runs (cli.LazyGroup): "
        "`asmgemm build` does not load the benchmark, the tuner, the runtime or CuPy's checks",
    ("asmgemm", "asmgemm.runtime.gemm"):
        "`asmgemm.gemm` loads the runtime on first use: every submodule import runs asmgemm/__init__.py, "
        "and the command line and the pipeline must not load the runtime",
    ("asmgemm", "asmgemm.runtime.grouped"):
        "`asmgemm.grouped_gemm` loads the runtime on first use, as `asmgemm.gemm` does",
    ("asmgemm.runtime.launch", "asmgemm.pipeline"):
        "importing the runtime (`asmgemm.gemm`) does not load the assembler (expander, register planner, "
        "scheduler, emitter: about a third more import time); it loads when a kernel's source defaults "
        "are first read",
    ("asmgemm.runtime.build_cache", "asmgemm.pipeline"):
        "as runtime.launch: the assembler loads when a kernel is first built (a kernel-cache miss)",
    ("asmgemm.runtime.build_cache", "asmgemm.sass.patch"):
        "the control-code patcher (nvdisasm listings, the safety check) loads only when a kernel table with "
        "sass_patch is built, which no default call does",
    ("asmgemm.runtime.build_cache", "asmgemm.sass.patch_rules"):
        "as asmgemm.sass.patch: only a sass_patch kernel with a rules file reads one",
}


@dataclass(frozen=True)
class Import:
    importer: str          # module name
    target: str            # the module it loads (first-party: resolved to a module of the package)
    line: int
    in_function: bool
    path: str


def _package_dirs() -> dict[str, Path]:
    return {name: Path(importlib.util.find_spec(name).submodule_search_locations[0]) for name in PACKAGES}


def package_modules() -> dict[str, Path]:
    """Every module of the installed package: name -> file."""
    out = {}
    for package, folder in _package_dirs().items():
        for path in sorted(folder.glob("*.py")):
            out[package if path.name == "__init__.py" else f"{package}.{path.stem}"] = path
    return out


def _function_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a function (or a class inside one, or a lambda)."""
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    inner.add(id(sub))
    return inner


def _dynamic_import(func: ast.expr) -> str:
    """'importlib.import_module' or '__import__' for a call that imports a module by name; else ''."""
    if isinstance(func, ast.Attribute) and func.attr == "import_module" and \
            isinstance(func.value, ast.Name) and func.value.id == "importlib":
        return "importlib.import_module"
    if isinstance(func, ast.Name) and func.id in ("import_module", "__import__"):
        return "importlib.import_module" if func.id == "import_module" else "__import__"
    return ""


def _inside_function(tree: ast.AST, target: ast.AST) -> bool:
    return any(target is sub for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for sub in ast.walk(node))


def imports_of(module: str, source: str, known: set[str], path: str = "") -> list[Import]:
    """Every import statement of one module, relative ones resolved; a first-party name is resolved
    to the module it loads (`from .isa.arch import arch_for` -> asmgemm.isa.arch; `from . import ir`
    -> asmgemm.ir; `from . import x` where x is no module -> the package itself)."""
    tree = ast.parse(source)
    inner = _function_nodes(tree)
    is_package = path.endswith("__init__.py") or module in PACKAGES
    package = module if is_package else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Call) and _dynamic_import(node.func):
            out.append(Import(module, _dynamic_import(node.func), node.lineno, _inside_function(tree, node), path))
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for alias in node.names:
                names.append(f"{name}.{alias.name}" if f"{name}.{alias.name}" in known else name)
        else:
            continue
        for name in names:
            if name.split(".")[0] == "asmgemm":
                while name not in known and "." in name:     # asmgemm.isa.arch.arch_for -> asmgemm.isa.arch
                    name = name.rsplit(".", 1)[0]
            out.append(Import(module, name, node.lineno, id(node) in inner, path))
    return out


@functools.lru_cache(maxsize=1)
def _package_imports() -> tuple[tuple[str, ...], tuple[Import, ...]]:
    """(module names, every import of the package): parsed once per test process (0.7 s of CPU a
    time on the 2-core machine, and five tests ask for the graph); the files do not change while
    the tests run."""
    modules = package_modules()
    known = set(modules)
    return tuple(modules), tuple(i for name, path in modules.items()
                                 for i in imports_of(name, path.read_text(encoding="utf-8"), known, str(path)))


def import_graph() -> tuple[dict[str, set[str]], list[Import]]:
    """The import graph of the package (a fresh one each call) and the imports it came from."""
    modules, found = _package_imports()
    found = list(found)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for i in found:
        if i.target in graph and i.target != i.importer:
            graph[i.importer].add(i.target)
    return graph, found


# ---- the checkers ------------------------------------------------------------------------------
def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, without
    recursion): each is a set of modules that import one another, however indirectly."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def rank_violations(graph: dict[str, set[str]], ranks: dict[str, int],
                    same_rank_allowed: set[tuple[str, str]] = frozenset()) -> list[str]:
    """Imports of a stage that is not below the importer's (its own stage excepted); a stage
    missing from `ranks` is a violation too, so that a new stage gets its place."""
    wrong = []
    for importer in sorted(graph):
        own = stage_of(importer)
        if own not in ranks:
            wrong.append(f"{importer}: stage '{own}' has no rank in STAGE_RANK")
            continue
        for target in sorted(graph[importer]):
            other = stage_of(target)
            if other == own or (own, other) in same_rank_allowed:
                continue
            if other not in ranks:
                wrong.append(f"{importer} imports {target}: stage '{other}' has no rank in STAGE_RANK")
            elif ranks[other] >= ranks[own]:
                wrong.append(f"{importer} (stage '{own}', rank {ranks[own]}) imports {target} "
                             f"(stage '{other}', rank {ranks[other]})")
    return wrong


def function_level_violations(found: list[Import], lazy: dict[tuple[str, str], str]) -> list[str]:
    top = (GPU_MODULES + tuple(OPTIONAL_MODULES))
    return list(dict.fromkeys(f"{i.path}:{i.line}: {i.importer} imports {i.target} inside a function"
                              for i in found if i.in_function and i.target.split(".")[0] not in top
                              and (i.importer, i.target) not in lazy))


# ---- the package -------------------------------------------------------------------------------
def test_the_packages_are_pyprojects():
    """A new subpackage is added to pyproject.toml's list (or it would not install); it must be
    here too, or its modules would escape these checks."""
    pyproject = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))
    assert sorted(pyproject["tool"]["setuptools"]["packages"]) == sorted(PACKAGES + DATA_PACKAGES)
    for name in DATA_PACKAGES:
        folder = Path(importlib.util.find_spec(name).submodule_search_locations[0])
        assert not list(folder.glob("*.py")), f"{name} holds modules: move it to PACKAGES"


def test_the_graph_covers_the_whole_package():
    graph, found = import_graph()
    assert {"asmgemm.scheduler.schedule", "asmgemm.isa.arch", "asmgemm.parse_tree", "asmgemm.files",
            "asmgemm.commands.build"} <= set(graph)
    # function-level imports are in the graph: the runtime's lazy load of the pipeline is an edge
    assert "asmgemm.pipeline" in graph["asmgemm.runtime.launch"]
    assert any(i.in_function for i in found)


def test_no_import_cycles():
    cycles = import_cycles(import_graph()[0])
    assert not cycles, "modules that import one another:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_each_stage_imports_only_stages_below_it():
    wrong = rank_violations(import_graph()[0], STAGE_RANK, ALLOWED_SAME_RANK)
    assert not wrong, "imports against the ranks of STAGE_RANK:\n" + "\n".join(wrong)


def test_isa_imports_nothing_above_it():
    graph = import_graph()[0]
    isa = STAGE_RANK["isa"]
    above = [f"{m} imports {t}" for m, targets in graph.items() if stage_of(m) == "isa"
             for t in targets if stage_of(t) != "isa" and STAGE_RANK[stage_of(t)] >= isa]
    assert not above, above


def test_imports_inside_functions_are_only_for_optional_gpu_modules():
    """An import inside a function hides what a module needs and hid all three cycles this
    project had; it is only for modules a CPU machine may not have (cupy, torch, cuda-bindings,
    triton; matplotlib, an optional extra) and the lazy loads of LAZY_IMPORTS, each kept for the
    reason given there."""
    graph, found = import_graph()
    wrong = function_level_violations(found, LAZY_IMPORTS)
    assert not wrong, "imports inside functions:\n" + "\n".join(wrong)
    used = {(i.importer, i.target) for i in found if i.in_function}
    stale = sorted(set(LAZY_IMPORTS) - used)
    assert not stale, f"LAZY_IMPORTS lists imports that are no longer inside a function: {stale}"


def test_importing_the_runtime_pulls_in_neither_bench_nor_tuner():
    code = ("import sys, asmgemm, asmgemm.runtime, asmgemm.runtime.gemm; asmgemm.gemm; "
            "import asmgemm.runtime.launch, asmgemm.runtime.tune_cache, asmgemm.runtime.gpu; "
            "print(sorted(m for m in sys.modules if m.startswith(('asmgemm.bench', 'asmgemm.tuning', "
            "'asmgemm.commands', 'cupy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_importing_the_runtime_does_not_load_the_assembler():
    """What LAZY_IMPORTS keeps the runtime's imports of the pipeline inside functions for."""
    code = ("import sys, asmgemm, asmgemm.runtime.gemm, asmgemm.runtime.launch, asmgemm.runtime.build_cache; "
            "asmgemm.gemm; print(sorted(m for m in sys.modules if m in ('asmgemm.pipeline', 'asmgemm.expand', "
            "'asmgemm.regalloc', 'asmgemm.emit')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("stage", ["asmgemm.pipeline", "asmgemm.sass.inspect", "asmgemm.scheduler",
                                   "asmgemm.kernel_spec", "asmgemm.isa.arch"])
def test_stages_do_not_reach_up(stage):
    code = (f"import sys, {stage}; print(sorted(m for m in sys.modules if m.startswith(("
            "'asmgemm.runtime', 'asmgemm.bench', 'asmgemm.tuning', 'asmgemm.commands'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_isa_loads_no_stage_above_it():
    code = ("import sys, asmgemm.isa.arch, asmgemm.isa.register_banks, asmgemm.isa.ptx_operands, "
            "asmgemm.isa.control_bits; print(sorted(m for m in sys.modules if m.startswith('asmgemm.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = {stage_of(m) for m in ast.literal_eval(out)}
    assert all(STAGE_RANK[s] <= STAGE_RANK["isa"] for s in loaded), loaded


def _hidden_first_party_imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        catches = {getattr(h.type, "id", None) for h in node.handlers} | \
                  {getattr(e, "id", None) for h in node.handlers if isinstance(h.type, ast.Tuple) for e in h.type.elts}
        if not catches & {"ImportError", "ModuleNotFoundError", "Exception"}:
            continue
        for inner in node.body:
            for sub in ast.walk(inner):
                if isinstance(sub, ast.ImportFrom) and (sub.level or (sub.module or "").startswith("asmgemm")) or \
                        isinstance(sub, ast.Import) and any(a.name.startswith("asmgemm") for a in sub.names):
                    yield f"{path}:{sub.lineno}"


def test_no_first_party_import_behind_an_import_error_fallback():
    found = [w for path in package_modules().values() for w in _hidden_first_party_imports(path)]
    found += [w for path in sorted(TESTS.rglob("*.py")) for w in _hidden_first_party_imports(path)]
    found += [f"{p}: importorskip of our own module" for p in sorted(TESTS.rglob("*.py"))
              if "importorskip(" + '"asmgemm' in p.read_text(encoding="utf-8")]
    assert not found, "first-party imports that would hide real breakage:\n" + "\n".join(found)


# ---- the checkers fail on planted violations -----------------------------------------------------
PLANTED = {
    "asmgemm.errors": "from .source import Span\n",
    "asmgemm.source": "def read_source():\n    from .errors import AsmError\n",
    "asmgemm.isa.arch": "from .. import ir\nfrom ..toolchain import ptxas_targets\n",
    "asmgemm.ir": "",
    "asmgemm.toolchain": "from .errors import AsmError\n",
    "asmgemm.runtime.gpu": "def f():\n    import cupy\n",
    "asmgemm.cli": "import importlib\ndef f(name):\n    return importlib.import_module(name)\n",
}


def _planted_graph(sources: dict[str, str]):
    known = set(sources)
    found = [i for name, text in sources.items() for i in imports_of(name, text, known, f"<{name}>")]
    graph = {name: set() for name in sources}
    for i in found:
        if i.target in graph and i.target != i.importer:
            graph[i.importer].add(i.target)
    return graph, found


def test_the_cycle_checker_finds_a_cycle_hidden_in_a_function():
    graph, _ = _planted_graph(PLANTED)
    assert graph["asmgemm.source"] == {"asmgemm.errors"}            # the function-level import counts
    assert import_cycles(graph) == [["asmgemm.errors", "asmgemm.source"]]
    # a longer ring, and none once it is cut
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(ring) == [["a", "b", "c"]]
    ring["c"] = set()
    assert import_cycles(ring) == []


def test_the_rank_checker_finds_an_import_upwards():
    graph, _ = _planted_graph(PLANTED)
    ranks = {"errors": 1, "source": 0, "isa": 3, "ir": 2, "toolchain": 4, "runtime": 10, "cli": 12}
    wrong = rank_violations(graph, ranks)
    assert any("asmgemm.isa.arch (stage 'isa', rank 3) imports asmgemm.toolchain" in w for w in wrong)
    assert any("asmgemm.source (stage 'source', rank 0) imports asmgemm.errors" in w for w in wrong)
    assert not any("imports asmgemm.ir" in w for w in wrong)        # downwards is fine
    assert rank_violations(graph, {k: v for k, v in ranks.items() if k != "ir"}) \
        == ["asmgemm.ir: stage 'ir' has no rank in STAGE_RANK",
            "asmgemm.isa.arch imports asmgemm.ir: stage 'ir' has no rank in STAGE_RANK",
            "asmgemm.isa.arch (stage 'isa', rank 3) imports asmgemm.toolchain (stage 'toolchain', rank 4)",
            "asmgemm.source (stage 'source', rank 0) imports asmgemm.errors (stage 'errors', rank 1)"]


def test_the_function_level_checker_allows_gpu_modules_and_listed_lazy_loads_only():
    _, found = _planted_graph(PLANTED)
    assert function_level_violations(found, {}) == \
        ["<asmgemm.source>:2: asmgemm.source imports asmgemm.errors inside a function",    # cupy passes
         "<asmgemm.cli>:3: asmgemm.cli imports importlib.import_module inside a function"]
    assert function_level_violations(found, {("asmgemm.source", "asmgemm.errors"): "a reason",
                                             ("asmgemm.cli", "importlib.import_module"): "a reason"}) == []
