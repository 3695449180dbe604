"""Plain PTX is valid .sasm: nvcc's PTX, passed through `asmgemm build`, must compile to the same
machine code as the original.

For each corpus file (tests/corpus/ptx, made by tools/regen_corpus.sh from tests/corpus/cuda),
ptxas assembles the original and asmgemm's re-emitted PTX for the file's own target, nvdisasm lists
both, and the per-function SASS opcode sequences (opcode with modifiers, predicate included) must
be identical. Operands are compared too, except where ptxas is free to differ without changing the
program (nothing, so far: a difference there is a real change in what asmgemm emitted). The two
cubins' ELF symbol tables (functions, variables, sections: name, binding, type, value, size) must
be identical as well.

`assert_same_machine_code` is shared with tests/test_ptx_fidelity.py.
"""
import re
import struct
from pathlib import Path

import pytest

from asmgemm.pipeline import BuildOptions, build_file
from asmgemm.toolchain import disassemble, find_tool, run_ptxas
from sweeps import sample_every

CORPUS = sorted((Path(__file__).parent / "corpus" / "ptx").glob("*.ptx"))

pytestmark = [
    pytest.mark.toolchain,
    pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                       reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')"),
]

_FUNCTION = re.compile(r"^\s*\.text\.(?P<name>\S+):|^\s*(?P<label>\.?[\w$]+):\s*$")
# nvdisasm -c line: "        /*0040*/                   FFMA R4, R2, R3, R4 ;"
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?P<text>[^;]*?)\s*;")


def sass_by_function(cubin: bytes) -> dict[str, list[str]]:
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


def elf_symbols(cubin: bytes) -> list[tuple]:
    """The symbol table of a cubin (ELF64, little-endian: the System V ABI's layout), as sorted
    (name, st_info, st_other, section name, value, size) tuples."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstr(section, off):
        start = section[4] + off
        return cubin[start:cubin.index(b"\0", start)].decode()

    names = [cstr(sections[shstrndx], s[0]) for s in sections]
    out = []
    for sec in sections:
        if sec[1] != 2:                               # SHT_SYMTAB
            continue
        strtab = sections[sec[6]]
        for k in range(sec[5] // 24):
            st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from(
                "<IBBHQQ", cubin, sec[4] + k * 24)
            where = names[st_shndx] if 0 < st_shndx < len(names) else st_shndx
            out.append((cstr(strtab, st_name), st_info, st_other, where, st_value, st_size))
    return sorted(out, key=repr)


def ptx_target(text: str) -> str:
    return re.search(r"^\.target\s+(\w+)", text, re.M).group(1)


def assert_same_machine_code(original: str, rebuilt: str, target: str, what: str) -> None:
    """ptxas both texts for `target`; same SASS per function (opcodes first, for a clearer
    message, then whole instructions) and the same ELF symbol table."""
    code, log, cubin_before = run_ptxas(original, target)
    assert code == 0, f"{what}: the original does not assemble:\n{log}"
    code, log, cubin_after = run_ptxas(rebuilt, target)
    assert code == 0, f"ptxas rejects asmgemm's output for {what}:\n{log}"

    before, after = sass_by_function(cubin_before), sass_by_function(cubin_after)
    assert before, f"no SASS functions found in {what}: the disassembly format changed?"
    assert sorted(before) == sorted(after), "the set of functions differs"
    for name in before:
        ops_before = [t.split(" ", 1)[0] if not t.startswith("@") else " ".join(t.split(" ", 2)[:2])
                      for t in before[name]]
        ops_after = [t.split(" ", 1)[0] if not t.startswith("@") else " ".join(t.split(" ", 2)[:2])
                     for t in after[name]]
        assert ops_before == ops_after, f"{what}:{name}: SASS opcode sequence differs"
        assert before[name] == after[name], f"{what}:{name}: SASS operands differ"
    symbols = elf_symbols(cubin_before)
    assert any(s[0] in before for s in symbols), f"{what}: no function symbol found: the ELF reader is wrong?"
    assert symbols == elf_symbols(cubin_after), f"{what}: the ELF symbol tables differ"


@pytest.mark.parametrize("path", sample_every(10, CORPUS), ids=[p.name for p in CORPUS])
def test_rebuilt_ptx_compiles_to_identical_sass(path: Path):
    original = path.read_text()
    target = ptx_target(original)
    result = build_file(str(path), BuildOptions())
    assert result.target == target
    assert_same_machine_code(original, result.ptx, target, path.name)


def test_corpus_is_not_empty():
    # Guards against the glob silently matching nothing (a moved folder would pass every test above).
    assert len(CORPUS) >= 17
