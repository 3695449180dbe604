"""Layers point one way: commands -> library (bench, tuning) -> runtime -> pipeline stages. Checked on
the import statements of every module (function-level imports too), and on a fresh interpreter:
importing the runtime pulls in neither the benchmark nor the tuner nor CuPy. And no first-party
import hides behind `except ImportError`, in the package or in the tests."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import asmgemm

PACKAGE = Path(asmgemm.__file__).parent
TESTS = Path(__file__).parent
# Layer of each top-level part of the package; a module may import its own layer and the ones below.
LAYERS = {"commands": 3, "cli": 3, "": 3, "bench": 2, "tuning": 2, "runtime": 1}   # "": the package facade (asmgemm.gemm)
STAGES = 0       # everything else: parse, expand, regalloc, emit, toolchain, isa, sass, scheduler, specs


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        yield path, ("asmgemm." + ".".join(rel.parts)).removesuffix(".__init__")


def _imports(path: Path, module: str):
    """(absolute module name, node) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name != "asmgemm":        # `from . import ir`: the names below are the modules
                yield name, node
            for alias in node.names:       # `from . import x` names a module too
                yield f"{name}.{alias.name}", node


def _layer(module: str) -> tuple[str, int] | None:
    if not module.startswith("asmgemm"):
        return None
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return top, LAYERS.get(top, STAGES)


def test_every_import_points_down():
    wrong = []
    for path, module in _modules():
        own = _layer(module)
        for name, node in _imports(path, module):
            target = _layer(name)
            if target is None or own is None:
                continue
            if target[1] > own[1] or (own[0] == "bench" and target[0] == "tuning"):
                wrong.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {module} ({own[0]}) imports {name}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_importing_the_runtime_pulls_in_neither_bench_nor_tuner():
    code = ("import sys, asmgemm, asmgemm.runtime, asmgemm.runtime.gemm; asmgemm.gemm; "
            "import asmgemm.runtime.launch, asmgemm.runtime.tune_cache, asmgemm.runtime.gpu; "
            "print(sorted(m for m in sys.modules if m.startswith(('asmgemm.bench', 'asmgemm.tuning', "
            "'asmgemm.commands', 'cupy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _hidden_first_party_imports(path: Path, module: str | None):
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
    found = [w for path, module in _modules() for w in _hidden_first_party_imports(path, module)]
    found += [w for path in sorted(TESTS.rglob("*.py")) for w in _hidden_first_party_imports(path, None)]
    found += [f"{p}: importorskip of our own module" for p in sorted(TESTS.rglob("*.py"))
              if "importorskip(" + '"asmgemm' in p.read_text(encoding="utf-8")]
    assert not found, "first-party imports that would hide real breakage:\n" + "\n".join(found)


@pytest.mark.parametrize("stage", ["asmgemm.pipeline", "asmgemm.sass.inspect", "asmgemm.scheduler",
                                   "asmgemm.kernel_spec", "asmgemm.isa.arch"])
def test_stages_do_not_reach_up(stage):
    code = (f"import sys, {stage}; print(sorted(m for m in sys.modules if m.startswith(("
            "'asmgemm.runtime', 'asmgemm.bench', 'asmgemm.tuning', 'asmgemm.commands'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
