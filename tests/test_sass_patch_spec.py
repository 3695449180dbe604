"""A kernel table with `sass_patch` (issue 35: "asmgemm.gemm can load a patched cubin for a kernel
configuration: an opt-in spec or parameter, never silently"): the runtime's build applies the
passes and rules after ptxas, runs the safety check, caches the patched cubin under its own key,
and refuses to build (never to run unpatched) when the check finds a hazard.

Built on the tiny fp64 test kernel (tests/data/tiny_gemm): a spec file written per test holds the
plain table and a patched one `like` it, so the two differ only by sass_patch.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from asmgemm import kernel_spec
from asmgemm.errors import AsmError
from asmgemm.sass.elf import ElfCubin
from asmgemm.sass.inspect import inspect_cubin
from asmgemm.toolchain import find_tool

TINY = Path(__file__).parent / "data" / "tiny_gemm"
needs_tools = pytest.mark.skipif(find_tool("ptxas", required=False) is None
                                 or find_tool("nvdisasm", required=False) is None,
                                 reason="ptxas and nvdisasm not installed")
DEFINES = {"TILE": 16, "TRANS_A": 0, "TRANS_B": 0}


def _spec_file(tmp_path: Path, patch: str, rules: str | None) -> Path:
    """tiny_dgemm.toml with its source made absolute, and a table tiny_dgemm_sass = tiny_dgemm plus
    `sass_patch = {patch}` (and rules.toml holding `rules`)."""
    text = (TINY / "tiny_dgemm.toml").read_text()
    text = text.replace('source = "tiny_dgemm.sasm"', f'source = "{(TINY / "tiny_dgemm.sasm").as_posix()}"')
    if rules is not None:
        (tmp_path / "rules.toml").write_text(rules)
    text += f'\n[tiny_dgemm_sass]\nlike = "tiny_dgemm"\nsass_patch = {patch}\n'
    path = tmp_path / "specs.toml"
    path.write_text(text)
    return path


@pytest.fixture
def specs(monkeypatch, tmp_path):
    """Load a spec file made by _spec_file through $ASMGEMM_KERNEL_SPECS, with a private kernel cache."""
    from asmgemm.runtime import build_cache
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path / "cache"))
    build_cache.clear_memory_cache()

    def load(patch: str, rules: str | None = None):
        monkeypatch.setenv(kernel_spec.SPECS_ENV, str(_spec_file(tmp_path, patch, rules)))
        return kernel_spec.get_spec("tiny_dgemm"), kernel_spec.get_spec("tiny_dgemm_sass")
    yield load
    build_cache.clear_memory_cache()


SLOW_DFMA = '[[rule]]\nopcode = "DFMA"\nloop = 0\nstall = 11\n'      # a longer stall: always safe
NO_WAITS = '[[rule]]\nopcode = ".*"\nwait = []\n'                     # every scoreboard wait dropped


def a_differs(a: str, b: str) -> bool:
    return Path(a).read_bytes() != Path(b).read_bytes()


def _loop_dfma_stalls(cubin_path: str) -> list[int]:
    data = Path(cubin_path).read_bytes()
    report = inspect_cubin(data, source=cubin_path, line_info=False)
    kernel = report.kernels["tiny_dgemm"]
    elf = ElfCubin(data, cubin_path)
    out = [elf.control("tiny_dgemm", k)["stall"] for k, i in enumerate(kernel.instructions)
           if i.opcode == "DFMA" and 0 in i.loops]
    assert out, "the tiny kernel's loop has DFMA instructions"
    return out


@pytest.mark.toolchain
@needs_tools
def test_a_patched_table_builds_the_patched_cubin_under_its_own_key(specs):
    from asmgemm.runtime.build_cache import build_kernel
    plain_spec, patched_spec = specs("{ rules = \"rules.toml\" }", SLOW_DFMA)
    plain = build_kernel(plain_spec, DEFINES, "sm_90")
    patched = build_kernel(patched_spec, DEFINES, "sm_90")
    assert plain.key != patched.key and plain.sass_patch == ()
    assert dict(patched.sass_patch) == {"rules": str(patched_spec.spec_file.parent / "rules.toml")}
    assert set(_loop_dfma_stalls(patched.cubin_path)) == {11}
    assert set(_loop_dfma_stalls(plain.cubin_path)) != {11}, "ptxas's own stalls stay in the plain kernel"
    assert a_differs(plain.cubin_path, patched.cubin_path)
    # everything but the control fields is ptxas's: the same words with the control bits masked
    a, b = ElfCubin(Path(plain.cubin_path).read_bytes()), ElfCubin(Path(patched.cubin_path).read_bytes())
    from asmgemm.isa import control_bits as cb
    mask = ~(((1 << cb.CONTROL_WIDTH) - 1) << cb.CONTROL_LO)
    assert [w & mask for w in a.words("tiny_dgemm")] == [w & mask for w in b.words("tiny_dgemm")]
    meta = json.loads(Path(patched.cubin_path).with_suffix(".json").read_text())
    assert meta["sass_patch"] == {"rules": str(patched_spec.spec_file.parent / "rules.toml")}


@pytest.mark.toolchain
@needs_tools
def test_the_disk_entry_of_a_patched_kernel_is_read_back_and_a_changed_rules_file_rebuilds(specs, tmp_path):
    from asmgemm.runtime import build_cache
    _, patched_spec = specs("{ rules = \"rules.toml\" }", SLOW_DFMA)
    first = build_cache.build_kernel(patched_spec, DEFINES, "sm_90")
    build_cache.clear_memory_cache()
    again = build_cache.build_kernel(patched_spec, DEFINES, "sm_90")       # from disk this time
    assert again == first
    (tmp_path / "rules.toml").write_text(SLOW_DFMA.replace("stall = 11", "stall = 10"))
    build_cache.clear_memory_cache()
    changed = build_cache.build_kernel(patched_spec, DEFINES, "sm_90")
    assert changed.key != first.key and set(_loop_dfma_stalls(changed.cubin_path)) == {10}


@pytest.mark.toolchain
@needs_tools
def test_a_patch_the_check_refuses_stops_the_build_and_caches_nothing(specs, tmp_path):
    from asmgemm.runtime.build_cache import build_kernel
    _, patched_spec = specs("{ rules = \"rules.toml\" }", NO_WAITS)
    with pytest.raises(AsmError) as err:
        build_kernel(patched_spec, DEFINES, "sm_90")
    assert "[tiny_dgemm_sass] sass_patch: the safety check refuses" in err.value.message
    assert "scoreboard" in err.value.message
    assert not list((tmp_path / "cache").rglob("*.cubin")), "no cubin is written for a refused patch"


@pytest.mark.parametrize("patch, said", [
    ("{ reuse = 1 }", "sass_patch.reuse: true or false"),
    ("{ yield_every = -2 }", "sass_patch.yield_every: a whole number >= 0"),
    ("{ rules = \"missing.toml\" }", "sass_patch.rules: no such file"),
    ("{ stalls = true }", "sass_patch: unknown key 'stalls'"),
    ("{}", "sass_patch: a table of passes"),
])
def test_a_bad_sass_patch_table_is_refused_when_the_spec_loads(tmp_path, patch, said):
    path = _spec_file(tmp_path, patch, None)
    with pytest.raises(AsmError) as err:
        kernel_spec.load_spec_file(path)
    assert said in err.value.message and "[tiny_dgemm_sass]" in err.value.message


def test_a_patched_table_is_never_chosen_by_dtype(monkeypatch, tmp_path):
    """Only kernel="tiny_dgemm_sass" runs the patched code: a float64 call gets the plain table even
    where the patched one comes first in file order (which decides between tables of one dtype)."""
    plain = (TINY / "tiny_dgemm.toml").read_text().replace(
        'source = "tiny_dgemm.sasm"', f'source = "{(TINY / "tiny_dgemm.sasm").as_posix()}"')
    patched = (plain.replace("[tiny_dgemm", "[tiny_dgemm_sass").replace("[[tiny_dgemm.", "[[tiny_dgemm_sass.")
               .replace('summary = ', 'entry = "tiny_dgemm"\nsass_patch = { reuse = true }\nsummary = ', 1))
    path = tmp_path / "specs.toml"
    path.write_text(patched + "\n" + plain)
    monkeypatch.setenv(kernel_spec.SPECS_ENV, str(path))
    names = list(kernel_spec.all_specs())
    assert names.index("tiny_dgemm_sass") < names.index("tiny_dgemm")
    assert kernel_spec.get_spec("tiny_dgemm_sass").sass_patch == (("reuse", True),)
    assert kernel_spec.spec_for_dtype("float64").name == "tiny_dgemm"
