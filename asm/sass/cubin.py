"""Reading what a cubin says about itself: is it a CUDA ELF at all, for which SM, which functions
it holds and their resources (registers, stack frame, static shared memory).

Only the standard library (`struct`; sections and symbols through sass/elf.py): this runs before
nvdisasm, so that a wrong file gets a clear error instead of nvdisasm's, and it gives the
per-kernel resources that nvdisasm's code listing does not print.

Sources:
- ELF64 header and section/symbol tables: the System V ABI (generic ELF), as in
  llvm/include/llvm/BinaryFormat/ELF.h. EM_CUDA = 190.
- CUDA e_flags: up to ELF ABI version 7 the SM number is the low byte (EF_CUDA_SM(x) = x, with
  EF_CUDA_VIRTUAL_SM(x) = x << 16) and a kernel's register count is the top byte of its .text
  section's sh_info (SHI_REGISTERS(x) = x << 24); see the ELF writers in public SASS assemblers
  (e.g. r3d-gpu ELFGenerator.cpp) and LLVM's ELF.h. The ABI version 8 cubins of CUDA 12.8+/13
  (checked here with ptxas 13.0: sm_80 -> 0x6005004, sm_90 and sm_90a -> 0x6005a04, sm_100a ->
  0x6006402) move the SM number to bits 8..15 and the register count to the .nv.info attribute
  EIATTR_REGCOUNT.
- .nv.info attributes: 4-byte header (format, attribute, 16-bit size or value); format 4
  (EIFMT_SVAL) is followed by `size` bytes, the others carry their value in the header
  (CuAssembler, CuAsm/CubinFile.py ParseNVInfo). Attribute codes as nvdisasm names them:
  0x2f EIATTR_REGCOUNT, 0x11 EIATTR_FRAME_SIZE, 0x12 EIATTR_MIN_STACK_SIZE,
  0x23 EIATTR_MAX_STACK_SIZE; each has a (symbol index, value) payload.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..errors import AsmError
from .elf import ElfCubin

EM_CUDA = 190
_ELF_MAGIC = b"\x7fELF"
_FATBIN_MAGIC = b"\x50\xed\x55\xba"      # 0xBA55ED50, little-endian: a fatbinary, not a cubin

EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_MAX_STACK_SIZE = 0x23
EIATTR_REGCOUNT = 0x2f
EIFMT_SVAL = 4

_RESERVED_SHARED_BYTES = 1024

@dataclass
class CubinFunction:
    name: str
    symbol_index: int
    entry: bool                 # a __global__ kernel (STO_CUDA_ENTRY), not a device function
    code_bytes: int
    code_offset: int = 0        # file offset of its .text section (instruction words, little-endian)
    registers: int = 0
    frame_bytes: int = 0        # per-thread stack frame: local memory for spills and local arrays
    min_stack_bytes: int = 0
    max_stack_bytes: int | None = None
    shared_bytes: int = 0       # static shared memory the kernel declared (what ptxas -v reports)
    reserved_shared_bytes: int = 0  # system-reserved shared memory counted in the same section


@dataclass
class CubinInfo:
    sm: int                     # 90 for sm_90 and sm_90a (the 'a' is only in nvdisasm's .target)
    abi_version: int
    functions: dict[str, CubinFunction] = field(default_factory=dict)
    sections: list[str] = field(default_factory=list)

    @property
    def has_line_info(self) -> bool:
        return ".debug_line" in self.sections

    @property
    def has_ptx_line_info(self) -> bool:
        return ".nv_debug_line_sass" in self.sections


def _bad(what: str, source: str, hint: str | None = None) -> AsmError:
    return AsmError(f"{source}: {what}", hint=hint)


def read_cubin(data: bytes, source: str = "<cubin>") -> CubinInfo:
    """Parse the ELF container; AsmError (never struct.error) for anything that is not a cubin."""
    if data[:4] == _FATBIN_MAGIC:
        raise _bad("is a fatbinary, not a cubin", source,
                   hint="extract the sm_90 cubin with `cuobjdump -xelf all FILE`, or give the .ptx")
    if data[:4] != _ELF_MAGIC:
        raise _bad("is not a cubin (no ELF header)", source,
                   hint="give a .cubin written by ptxas, a .ptx or a .sasm file")
    try:
        return _read(data, source)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"is a damaged or truncated cubin ({exc})", source) from None


def _read(data: bytes, source: str) -> CubinInfo:
    if data[4] != 2 or data[5] != 1:
        raise _bad("is not a 64-bit little-endian ELF file, so not a cubin", source)
    abi_version = data[8]
    (e_machine,) = struct.unpack_from("<H", data, 18)
    if e_machine != EM_CUDA:
        raise _bad(f"is an ELF file for machine {e_machine}, not a CUDA cubin (machine {EM_CUDA})",
                   source)
    (e_flags,) = struct.unpack_from("<I", data, 48)
    sm = (e_flags >> 8) & 0xFF if abi_version >= 8 else e_flags & 0xFF

    # Sections, symbols and kernels: the one ELF reader (sass/elf.py).
    elf = ElfCubin(data, source)
    names = [sh.name for sh in elf.sections]
    info = CubinInfo(sm=sm, abi_version=abi_version, sections=names)
    by_symbol: dict[int, CubinFunction] = {}
    for name, text in elf.kernels.items():
        fn = CubinFunction(name=name, symbol_index=text.symbol.index, entry=text.entry,
                           code_bytes=text.section.size, code_offset=text.section.offset,
                           registers=(text.section.info >> 24) & 0xFF)
        by_symbol[text.symbol.index] = fn
        info.functions[name] = fn
    # On sm_90 the first 1 KB of a CTA's shared window is reserved for the system (CUDA C++
    # Programming Guide, "Shared Memory" for compute capability 8.x/9.0); ptxas then marks the
    # cubin with a `.nv.shared.reserved.0` section and lays the kernel's own shared variables out
    # after that KB inside .nv.shared.<name> (seen here: 4096 declared bytes -> a 5120-byte
    # section and shared addresses starting at 0x400, while ptxas -v says "4096 bytes smem";
    # without the reserved section, as for sm_80, the section is exactly the declared size).
    reserved = _RESERVED_SHARED_BYTES if ".nv.shared.reserved.0" in names else 0
    for name, fn in info.functions.items():
        if f".nv.shared.{name}" in names:
            size = elf.section_named(f".nv.shared.{name}").size
            fn.reserved_shared_bytes = min(reserved, size)
            fn.shared_bytes = size - fn.reserved_shared_bytes

    for sh in elf.sections:
        if sh.name == ".nv.info" or sh.name.startswith(".nv.info."):
            _read_nv_info(data[sh.offset: sh.offset + sh.size], by_symbol)
    return info


def _read_nv_info(blob: bytes, by_symbol: dict[int, CubinFunction]) -> None:
    pos = 0
    while pos + 4 <= len(blob):
        fmt, attr, size = struct.unpack_from("<BBH", blob, pos)
        pos += 4
        if fmt != EIFMT_SVAL:
            continue            # value is in the header; none of these is one we read
        payload = blob[pos: pos + size]
        pos += size
        if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE,
                    EIATTR_MAX_STACK_SIZE) and len(payload) >= 8:
            sym, value = struct.unpack_from("<II", payload, 0)
            fn = by_symbol.get(sym)
            if fn is None:
                continue
            if attr == EIATTR_REGCOUNT:
                fn.registers = value
            elif attr == EIATTR_FRAME_SIZE:
                fn.frame_bytes = value
            elif attr == EIATTR_MIN_STACK_SIZE:
                fn.min_stack_bytes = value
            else:
                fn.max_stack_bytes = value
