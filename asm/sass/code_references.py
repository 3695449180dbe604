"""Where a cubin names a kernel's instructions by offset: the `.nv.info.<kernel>` attributes and the
relocations of `.text.<kernel>`. An instruction named there must not move (the reorder pass,
sass/reorder_pass.py, anchors it): the driver patches or looks up exactly that offset, so a word
moved away from it would break the attribute or the relocation.

Format of `.nv.info` sections (SHT_LOPROC, 0x70000000), as relied on here. A section is a run of
records, each starting with a 4-byte head: one byte of format, one byte of attribute id, then a
16-bit little-endian value:
  EIFMT_NVAL (1)  no value (the 16 bits are zero);
  EIFMT_BVAL (2)  a byte value in the 16 bits;
  EIFMT_HVAL (3)  a 16-bit value;
  EIFMT_SVAL (4)  the 16 bits are a size, and that many bytes of payload follow.
An *_INSTR_OFFSETS attribute is an SVAL whose payload is a list of 32-bit byte offsets into the
kernel's `.text` section, except EIATTR_MBARRIER_INSTR_OFFSETS, whose payload is 16-byte records
with the offset in the first 32-bit word (seen in ptxas 13.0's hgemm: the other three words are a
register number or 0xff, the mbarrier's shared-memory offset and flags; every first word is the
offset of a SYNCS instruction). Sources, read to learn the layout (nothing copied): CuAssembler's
CuNVInfo (github.com/cloudcores/CuAssembler, "EIATTR" records and its offset labels such as
EIATTR_EXIT_INSTR_OFFSETS), the attribute id tables of the open ELF readers that list them
(VivekPanyam/cudaparsers; redplait's nvd `is_addr_list`, which marks 0x1c, 0x1d, 0x25, 0x28, 0x31,
0x39 and 0x47 as offset lists), and the cubins of ptxas 13.0 for sm_90/sm_90a: every shipped
kernel's EXIT_INSTR_OFFSETS name exactly its EXIT instructions, COOP_GROUP_INSTR_OFFSETS name
instructions too, and hgemm's MBARRIER_INSTR_OFFSETS name its SYNCS instructions (the tests check
the first and last on real cubins).

Conservative rule: an attribute id that is neither in OFFSET_ATTRIBUTES nor in
PLAIN_ATTRIBUTES makes the kernel unmovable (`unknown` says which), because its payload might
name offsets this module cannot see. Relocations (SHT_REL 9 with 16-byte entries, SHT_RELA 4
with 24-byte entries; r_offset is the first 8 bytes; System V gABI) whose section's sh_info is
the kernel's text section anchor the instruction holding r_offset.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .elf import WORD_BYTES, ElfCubin

SHT_RELA = 4
SHT_REL = 9
SHT_LOPROC = 0x70000000
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4

# Attributes whose SVAL payload lists instruction offsets [sources above]; each record is 4 bytes
# (just the offset) unless RECORD_BYTES says otherwise, the offset always its first 32-bit word.
OFFSET_ATTRIBUTES = {
    0x1C: "EIATTR_EXIT_INSTR_OFFSETS",
    0x1D: "EIATTR_S2RCTAID_INSTR_OFFSETS",
    0x25: "EIATTR_LD_CACHEMOD_INSTR_OFFSETS",
    0x27: "EIATTR_ATOM_SYS_INSTR_OFFSETS",
    0x28: "EIATTR_COOP_GROUP_INSTR_OFFSETS",
    0x2D: "EIATTR_ATOMF16_EMUL_INSTR_OFFSETS",
    0x31: "EIATTR_INT_WARP_WIDE_INSTR_OFFSETS",
    0x39: "EIATTR_MBARRIER_INSTR_OFFSETS",
    0x46: "EIATTR_SYSCALL_OFFSETS",
    0x47: "EIATTR_SW_WAR_MEMBAR_SYS_INSTR_OFFSETS",
    0x57: "EIATTR_STACK_CANARY_TRAP_OFFSETS",
    0x59: "EIATTR_LOCAL_CTA_ASYNC_STORE_OFFSETS",
}
RECORD_BYTES = {0x39: 16}
# Attributes known to hold resources, parameters or flags, no instruction offset [sources above].
# Left out on purpose, so that they make a kernel unmovable: INDIRECT_BRANCH_TARGETS (0x34),
# ATOM16_EMUL_INSTR_REG_MAP (0x2e), COROUTINE_RESUME_ID_OFFSETS (0x3a), INSTR_REG_MAP (0x40),
# UNUSED_LOAD_BYTE_OFFSET (0x44): offsets inside a layout this module does not parse.
PLAIN_ATTRIBUTES = {
    0x04: "EIATTR_CTAIDZ_USED", 0x05: "EIATTR_MAX_THREADS", 0x0A: "EIATTR_PARAM_CBANK",
    0x0F: "EIATTR_EXTERNS", 0x10: "EIATTR_REQNTID", 0x11: "EIATTR_FRAME_SIZE",
    0x12: "EIATTR_MIN_STACK_SIZE", 0x17: "EIATTR_KPARAM_INFO", 0x19: "EIATTR_CBANK_PARAM_SIZE",
    0x1B: "EIATTR_MAXREG_COUNT", 0x1E: "EIATTR_CRS_STACK_SIZE", 0x23: "EIATTR_MAX_STACK_SIZE",
    0x29: "EIATTR_COOP_GROUP_MASK_REGIDS", 0x2A: "EIATTR_SW1850030_WAR", 0x2B: "EIATTR_WMMA_USED",
    0x2F: "EIATTR_REGCOUNT", 0x30: "EIATTR_SW2393858_WAR", 0x32: "EIATTR_SHARED_SCRATCH",
    0x35: "EIATTR_SW2861232_WAR", 0x36: "EIATTR_SW_WAR", 0x37: "EIATTR_CUDA_API_VERSION",
    0x38: "EIATTR_NUM_MBARRIERS", 0x3D: "EIATTR_CTA_PER_CLUSTER", 0x3E: "EIATTR_EXPLICIT_CLUSTER",
    0x3F: "EIATTR_MAX_CLUSTER_RANK", 0x41: "EIATTR_RESERVED_SMEM_USED",
    0x42: "EIATTR_RESERVED_SMEM_0_SIZE", 0x4C: "EIATTR_NUM_BARRIERS", 0x50: "EIATTR_SPARSE_MMA_MASK",
    0x54: "EIATTR_REG_RECONFIG", 0x5F: "EIATTR_MERCURY_ISA_VERSION",
}


@dataclass(frozen=True)
class Attribute:
    fmt: int
    ident: int
    value: int                  # NVAL/BVAL/HVAL value; SVAL payload size
    payload: bytes = b""

    @property
    def name(self) -> str:
        return OFFSET_ATTRIBUTES.get(self.ident) or PLAIN_ATTRIBUTES.get(self.ident) or f"EIATTR_{self.ident:#04x}"


@dataclass
class CodeReferences:
    """Instruction indices of one kernel that the cubin names, each with why."""
    kernel: str
    anchored: dict[int, list[str]] = field(default_factory=dict)   # index -> ["EIATTR_EXIT_INSTR_OFFSETS", ...]
    unknown: list[str] = field(default_factory=list)               # reasons the kernel may not move at all

    def add(self, offset: int, why: str) -> None:
        if offset % WORD_BYTES:
            self.unknown.append(f"{why} names offset {offset:#x}, not an instruction boundary")
            return
        self.anchored.setdefault(offset // WORD_BYTES, []).append(why)


def parse_nv_info(data: bytes, where: str) -> list[Attribute]:
    """The records of one .nv.info section; a record running past the end is a ValueError."""
    out, at = [], 0
    while at < len(data):
        if at + 4 > len(data):
            raise ValueError(f"{where}: a record head at {at:#x} runs past the end ({len(data)} bytes)")
        fmt, ident = data[at], data[at + 1]
        (value,) = struct.unpack_from("<H", data, at + 2)
        at += 4
        payload = b""
        if fmt == EIFMT_SVAL:
            if at + value > len(data):
                raise ValueError(f"{where}: attribute {ident:#04x} at {at - 4:#x} claims {value} bytes, "
                                 f"past the end")
            payload = data[at: at + value]
            at += value
        elif fmt not in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            raise ValueError(f"{where}: unknown record format {fmt} at {at - 4:#x}")
        out.append(Attribute(fmt, ident, value, payload))
    return out


def code_references(elf: ElfCubin, kernel: str) -> CodeReferences:
    text = elf.kernel(kernel)
    refs = CodeReferences(kernel)
    data = elf.to_bytes()
    for sh in elf.sections:
        if sh.type == SHT_LOPROC and sh.name == f".nv.info.{kernel}":
            try:
                attributes = parse_nv_info(data[sh.offset: sh.offset + sh.size], sh.name)
            except ValueError as exc:
                refs.unknown.append(str(exc))
                continue
            for a in attributes:
                if a.ident in OFFSET_ATTRIBUTES:
                    step = RECORD_BYTES.get(a.ident, 4)
                    if a.fmt != EIFMT_SVAL or len(a.payload) % step:
                        refs.unknown.append(f"{a.name} is not a list of {step}-byte records")
                        continue
                    for at in range(0, len(a.payload), step):
                        refs.add(struct.unpack_from("<I", a.payload, at)[0], a.name)
                elif a.ident not in PLAIN_ATTRIBUTES:
                    refs.unknown.append(f"{sh.name} holds attribute {a.ident:#04x}, whose meaning is not "
                                        "known here: it might name instruction offsets")
        elif sh.type in (SHT_REL, SHT_RELA) and sh.info == text.section.index:
            entsize = sh.entsize or (24 if sh.type == SHT_RELA else 16)
            for i in range(sh.size // entsize):
                (offset,) = struct.unpack_from("<Q", data, sh.offset + i * entsize)
                refs.add(offset - offset % WORD_BYTES, f"relocation in {sh.name}")
    return refs
