"""Plain PTX is valid .sasm: nvcc's PTX, passed through `asmgemm build`, must compile to the same
machine code as the original.

For each corpus file (tests/corpus/ptx, made by tools/regen_corpus.sh from tests/corpus/cuda),
ptxas assembles the original and asmgemm's re-emitted PTX for the file's own target, nvdisasm lists
both, and the per-function SASS opcode sequences (opcode with modifiers, predicate included) must
be identical. Operands are compared too, except where ptxas is free to differ without changing the
program (nothing, so far: a difference there is a real change in what asmgemm emitted).
"""
import re
from pathlib import Path

import pytest

from asmgemm.pipeline import BuildOptions, build_file
from asmgemm.toolchain import disassemble, find_tool, run_ptxas

CORPUS = sorted((Path(__file__).parent / "corpus" / "ptx").glob("*.ptx"))

pytestmark = [
    pytest.mark.toolchain,
    pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                       reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')"),
]

_FUNCTION = re.compile(r"^\s*\.text\.(?P<name>\S+):|^\s*(?P<label>\.?[\w$]+):\s*$")
# nvdisasm -c line: "        /*0040*/                   FFMA R4, R2, R3, R4 ;"
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?P<text>[^;]*?)\s*;")


def _sass_by_function(cubin: bytes) -> dict[str, list[str]]:
    """{function: [instruction text]} from nvdisasm; branch targets are addresses, so identical
    code gives identical text."""
    out: dict[str, list[str]] = {}
    current = None
    for line in disassemble(cubin, ["-c"]).splitlines():
        header = re.match(r"^\s*\.section\s+\.text\.([^,\s]+)", line)
        if header:
            current = header.group(1)
            out[current] = []
            continue
        m = _INSTR.search(line)
        if m and current is not None:
            out[current].append(" ".join(m.group("text").split()))
    return out


def _target(text: str) -> str:
    return re.search(r"^\.target\s+(\w+)", text, re.M).group(1)


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_rebuilt_ptx_compiles_to_identical_sass(path: Path):
    original = path.read_text()
    target = _target(original)
    code, log, cubin_before = run_ptxas(original, target)
    assert code == 0, f"the corpus file itself does not assemble:\n{log}"

    result = build_file(str(path), BuildOptions())
    assert result.target == target
    code, log, cubin_after = run_ptxas(result.ptx, target)
    assert code == 0, f"ptxas rejects asmgemm's output for {path.name}:\n{log}"

    before, after = _sass_by_function(cubin_before), _sass_by_function(cubin_after)
    assert before, f"no SASS functions found in {path.name}: the disassembly format changed?"
    assert sorted(before) == sorted(after), "the set of functions differs"
    for name in before:
        ops_before = [t.split(" ", 1)[0] if not t.startswith("@") else " ".join(t.split(" ", 2)[:2])
                      for t in before[name]]
        ops_after = [t.split(" ", 1)[0] if not t.startswith("@") else " ".join(t.split(" ", 2)[:2])
                     for t in after[name]]
        assert ops_before == ops_after, f"{path.name}:{name}: SASS opcode sequence differs"
        assert before[name] == after[name], f"{path.name}:{name}: SASS operands differ"


def test_corpus_is_not_empty():
    # Guards against the glob silently matching nothing (a moved folder would pass every test above).
    assert len(CORPUS) >= 8
