"""A cubin as an editable ELF file: sections, symbols, and each kernel's `.text.<name>` as 128-bit
instruction words whose control fields (isa/control_bits.py) can be rewritten in place.

Writing never re-serialises the ELF: the file is kept as one byte buffer and an edit overwrites
the 16 bytes of one instruction word, so relocations, `.nv.info` attributes, constant banks,
section order, padding and alignment are the input's bytes by construction. `set_control`
refuses any change outside the six control fields, so an edit cannot alter what an instruction
does, only how it is scheduled.

The one other edit is `permute`: the reorder pass (sass/reorder_pass.py) moves whole words within
given index ranges (basic blocks). Each range must hold the same instructions as before, bits
outside the control fields compared; after a permutation, a later control edit of a word is
judged against the input word it came from (`origin`).

Layout facts (ELF64 header, section header table, symbol table entries): the System V generic
ABI, as in llvm/include/llvm/BinaryFormat/ELF.h; the sm_90 instruction word is 16 bytes,
little-endian, low 64-bit half first (isa/control_bits.py, checked there against nvdisasm -hex).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import AsmError
from ..isa import control_bits as cb

WORD_BYTES = 16
SHT_SYMTAB = 2
STT_FUNC = 2
STO_CUDA_ENTRY = 0x10

_ELF_MAGIC = b"\x7fELF"
# Every bit of a 128-bit word that lies outside the control fields an edit may change.
_CONTROL_MASK = sum(f.mask << f.lo for f in cb.CONTROL_FIELDS)
_OUTSIDE_CONTROL = ((1 << 128) - 1) & ~_CONTROL_MASK


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int       # file offset of its bytes
    size: int
    link: int
    info: int
    align: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    index: int
    name: str
    info: int
    other: int
    section: int      # st_shndx
    value: int
    size: int

    @property
    def is_function(self) -> bool:
        return self.info & 0xF == STT_FUNC


@dataclass(frozen=True)
class KernelText:
    """A function's code section: `count` instruction words from file offset `offset`."""
    name: str
    section: Section
    symbol: Symbol
    entry: bool       # a __global__ kernel (STO_CUDA_ENTRY), not a device function

    @property
    def count(self) -> int:
        return self.section.size // WORD_BYTES


class ElfCubin:
    """The bytes of one cubin, its section and symbol tables, and its kernels' instruction words."""

    def __init__(self, data: bytes, source: str = "<cubin>"):
        if data[:4] != _ELF_MAGIC:
            raise AsmError(f"{source}: is not a cubin (no ELF header)",
                           hint="give a .cubin written by ptxas")
        self.source = source
        self._original = bytes(data)
        self._data = bytearray(data)
        # kernel -> for each index, the input index whose word is there now (only once permuted)
        self._origin: dict[str, list[int]] = {}
        try:
            self.sections = self._read_sections()
            self.symbols = self._read_symbols()
        except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
            raise AsmError(f"{source}: is a damaged or truncated cubin ({exc})") from None
        self.kernels = self._find_kernels()

    # ---- reading the tables ---------------------------------------------------------------
    def _read_sections(self) -> list[Section]:
        d = self._original
        if d[4] != 2 or d[5] != 1:
            raise ValueError("not a 64-bit little-endian ELF file")
        (shoff,) = struct.unpack_from("<Q", d, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 58)
        raw = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
        names_at = raw[shstrndx][4]
        out = []
        for i, (name, stype, flags, _addr, offset, size, link, info, align, entsize) in enumerate(raw):
            if offset + (0 if stype == 8 else size) > len(d):     # SHT_NOBITS (8) has no bytes
                raise ValueError(f"section {i} runs past the end of the file")
            out.append(Section(i, self._cstr(names_at + name), stype, flags, offset, size, link, info,
                               align, entsize))
        return out

    def _cstr(self, offset: int) -> str:
        end = self._original.index(b"\0", offset)
        return self._original[offset:end].decode("utf-8")

    def _read_symbols(self) -> list[Symbol]:
        out: list[Symbol] = []
        for sh in self.sections:
            if sh.type != SHT_SYMTAB:
                continue
            names_at = self.sections[sh.link].offset
            entsize = sh.entsize or 24
            for i in range(sh.size // entsize):
                st_name, st_info, st_other, st_shndx, value, size = \
                    struct.unpack_from("<IBBHQQ", self._original, sh.offset + i * entsize)
                out.append(Symbol(i, self._cstr(names_at + st_name) if st_name else "", st_info,
                                  st_other, st_shndx, value, size))
        return out

    def _find_kernels(self) -> dict[str, KernelText]:
        out: dict[str, KernelText] = {}
        for sym in self.symbols:
            if not sym.is_function or not 0 < sym.section < len(self.sections):
                continue
            sec = self.sections[sym.section]
            if sec.name == f".text.{sym.name}":
                out[sym.name] = KernelText(sym.name, sec, sym, bool(sym.other & STO_CUDA_ENTRY))
        return out

    # ---- instruction words ----------------------------------------------------------------
    def section_named(self, name: str) -> Section:
        for sh in self.sections:
            if sh.name == name:
                return sh
        raise KeyError(name)

    def kernel(self, name: str) -> KernelText:
        if name not in self.kernels:
            raise AsmError(f"{self.source}: no kernel named '{name}' "
                           f"(kernels: {', '.join(self.kernels) or 'none'})")
        return self.kernels[name]

    def _word_offset(self, kernel: str, index: int) -> int:
        text = self.kernel(kernel)
        if not 0 <= index < text.count:
            raise IndexError(f"{kernel}: instruction {index} is outside its {text.count} words")
        return text.section.offset + index * WORD_BYTES

    def word(self, kernel: str, index: int) -> int:
        """The 128-bit word of instruction `index` (address = 16 * index) as it is now."""
        at = self._word_offset(kernel, index)
        return int.from_bytes(self._data[at: at + WORD_BYTES], "little")

    def original_word(self, kernel: str, index: int) -> int:
        at = self._word_offset(kernel, index)
        return int.from_bytes(self._original[at: at + WORD_BYTES], "little")

    def words(self, kernel: str) -> list[int]:
        return [self.word(kernel, i) for i in range(self.kernel(kernel).count)]

    def control(self, kernel: str, index: int) -> dict[str, int]:
        return cb.decode_control(self.word(kernel, index))

    def origin(self, kernel: str) -> list[int]:
        """For each instruction index, the input index of the word now there (identity unless
        `permute` moved words)."""
        return list(self._origin.get(kernel, range(self.kernel(kernel).count)))

    def set_word(self, kernel: str, index: int, word: int) -> None:
        """Replace a word; only its control fields may differ from the input word now at `index`
        (the input's own word there, or the one `permute` moved there)."""
        old = self.original_word(kernel, self._origin[kernel][index] if kernel in self._origin else index)
        if (old ^ word) & _OUTSIDE_CONTROL:
            raise ValueError(f"{kernel}: instruction {index} ({16 * index:#06x}): the new word changes "
                             f"bits outside the control fields ({(old ^ word) & _OUTSIDE_CONTROL:#x}); "
                             "only stall, yield, barriers, wait mask and reuse may be edited")
        at = self._word_offset(kernel, index)
        self._data[at: at + WORD_BYTES] = word.to_bytes(WORD_BYTES, "little")

    def set_control(self, kernel: str, index: int, **fields: int) -> None:
        """Set named control fields (stall=, yield=, write_barrier=, read_barrier=, wait_mask=,
        reuse=) of one instruction; the other bits of the word stay as they are."""
        by_name = {f.name: f for f in cb.CONTROL_FIELDS}
        word = self.word(kernel, index)
        for name, value in fields.items():
            if name not in by_name:
                raise ValueError(f"'{name}' is not a control field ({', '.join(by_name)})")
            word = by_name[name].insert(word, value)
        self.set_word(kernel, index, word)

    def permute(self, kernel: str, order: list[int], ranges: list[tuple[int, int]]) -> None:
        """Move words: afterwards index i holds what index order[i] holds now (control fields
        included). Every index outside `ranges` (half-open [start, end) index ranges, such as
        basic blocks) must stay where it is, and each range must be mapped onto itself, so the
        new words of a range are its old words in another order; anything else is refused."""
        count = self.kernel(kernel).count
        if sorted(order) != list(range(count)):
            raise ValueError(f"{kernel}: the new order is not a permutation of its {count} words")
        inside = [None] * count
        for r, (start, end) in enumerate(ranges):
            if not 0 <= start <= end <= count:
                raise ValueError(f"{kernel}: range [{start}, {end}) lies outside its {count} words")
            for i in range(start, end):
                if inside[i] is not None:
                    raise ValueError(f"{kernel}: ranges overlap at instruction {i}")
                inside[i] = r
        for i, j in enumerate(order):
            if i != j and (inside[i] is None or inside[i] != inside[j]):
                raise ValueError(f"{kernel}: instruction {j} ({16 * j:#06x}) would move to {i} "
                                 f"({16 * i:#06x}), out of its basic block: words move only within one")
        current = [self.word(kernel, i) for i in range(count)]
        origin = self.origin(kernel)
        for start, end in ranges:
            before = sorted(w & _OUTSIDE_CONTROL for w in current[start:end])
            after = sorted(current[order[i]] & _OUTSIDE_CONTROL for i in range(start, end))
            if before != after:      # cannot happen for a permutation; checked as the writer's promise
                raise ValueError(f"{kernel}: the words of [{start}, {end}) are not the same instructions")
        base = self.kernel(kernel).section.offset
        for i in range(count):
            if order[i] != i:
                at = base + i * WORD_BYTES
                self._data[at: at + WORD_BYTES] = current[order[i]].to_bytes(WORD_BYTES, "little")
        self._origin[kernel] = [origin[order[i]] for i in range(count)]

    def changed(self) -> list[tuple[str, int, int, int]]:
        """(kernel, index, old word, new word) of every edited instruction, in address order."""
        out = []
        for name, text in self.kernels.items():
            lo, hi = text.section.offset, text.section.offset + text.section.size
            if self._data[lo:hi] == self._original[lo:hi]:
                continue
            for i in range(text.count):
                old, new = self.original_word(name, i), self.word(name, i)
                if old != new:
                    out.append((name, i, old, new))
        return out

    def to_bytes(self) -> bytes:
        return bytes(self._data)
