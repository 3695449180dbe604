"""Running nvdisasm on a cubin and reading its text listing into plain records.

Two nvdisasm runs give everything the inspector needs (nvdisasm 13.x: `-plr`/`-lrm` make it
ignore `-g`, so they cannot share one run):

  nvdisasm -c -hex -lrm count  -> per instruction: address, text, the two 64-bit halves of the
                                  encoding, and the live-register counts (GPR, PRED, UGPR columns)
  nvdisasm -c -g               -> per instruction: the `.debug_line` line it came from (present
                                  when ptxas ran with -lineinfo and the PTX had `.loc` lines)

Listing shapes read here (nvdisasm 13.5 on sm_90 cubins):

          /*0090*/                   LDG.E R2, desc[UR4][R2.64] ;   /* 0x0000000402027981 */   // |   8   |   3    |
                                                                    /* 0x000ee8000c1e1900 */   // |   8   |   3    |
  .L_x_1:
          //## File "k.ptx", line 42
          /*00e0*/                   EXIT ;

With `-hex` the count columns are printed on the line of the high half; labels carry the counts
live at the block boundary, which are ignored (only instruction rows are read).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import AsmError, ToolchainError
from .. import toolchain

LISTING_FLAGS = ["-c", "-hex", "-lrm", "count"]
LINE_INFO_FLAGS = ["-c", "-g"]

_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)")
_LABEL = re.compile(r"^([^\s/][^\s:]*):\s*(//.*)?$")   # labels start in column 0
_INSTR = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s*(?P<text>.*?;)\s*(?:/\*\s*(?P<lo>0x[0-9a-fA-F]{16})\s*\*/)?\s*(?P<cols>//.*)?$")
_HI = re.compile(r"^\s*/\*\s*(?P<hi>0x[0-9a-fA-F]{16})\s*\*/\s*(?P<cols>//.*)?$")
_LINE_INFO = re.compile(r'^\s*//## File "(?P<file>[^"]*)", line (?P<line>\d+)')


@dataclass
class RawInstruction:
    address: int
    text: str                       # as nvdisasm prints it, `;` included
    lo: int | None = None
    hi: int | None = None
    live: dict[str, int] = field(default_factory=dict)   # {"GPR": 8, "PRED": 1, "UGPR": 3}
    line_file: str | None = None
    line: int | None = None


@dataclass
class RawFunction:
    name: str
    instructions: list[RawInstruction] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # label -> address of the next instruction


@dataclass
class RawListing:
    target: str | None
    functions: dict[str, RawFunction]


def _columns(cols: str | None) -> list[str] | None:
    """The cells of a `// | a | b |` trailer, or None when there is none."""
    if not cols or "|" not in cols:
        return None
    body = cols[2:].strip()
    if not body.startswith("|"):
        return None
    return [c.strip() for c in body.strip("|").split("|")]


def parse_listing(text: str) -> RawListing:
    """Parse a `nvdisasm -c [-hex] [-lrm count] [-g]` listing."""
    target = None
    functions: dict[str, RawFunction] = {}
    current: RawFunction | None = None
    header: list[str] | None = None
    pending_labels: list[str] = []
    last: RawInstruction | None = None
    line_file, line_no = None, None
    for raw in text.splitlines():
        m = _TARGET.match(raw)
        if m and target is None:
            target = m.group(1)
            continue
        m = _SECTION.match(raw)
        if m:
            current = functions.setdefault(m.group(1), RawFunction(m.group(1)))
            header, pending_labels, last = None, [], None
            line_file, line_no = None, None
            continue
        if current is None:
            continue
        cells = _columns("//" + raw.split("//", 1)[1]) if "//" in raw else None
        if header is None and cells and any(c in ("GPR", "UGPR", "PRED") for c in cells):
            header = cells
            continue
        m = _LINE_INFO.match(raw)
        if m:
            line_file, line_no = m["file"], int(m["line"])
            continue
        m = _INSTR.match(raw)
        if m:
            ins = RawInstruction(int(m.group(1), 16), m["text"].strip(),
                                 int(m["lo"], 16) if m["lo"] else None, None)
            ins.line_file, ins.line = line_file, line_no
            _take_counts(ins, header, _columns(m["cols"]))
            current.instructions.append(ins)
            for lab in pending_labels:
                current.labels[lab] = ins.address
            pending_labels = []
            last = ins
            continue
        m = _HI.match(raw)
        if m and last is not None and last.hi is None:
            last.hi = int(m["hi"], 16)
            _take_counts(last, header, _columns(m["cols"]))
            continue
        m = _LABEL.match(raw)
        if m:
            pending_labels.append(m.group(1))
            continue
    return RawListing(target, functions)


def _take_counts(ins: RawInstruction, header: list[str] | None, cells: list[str] | None) -> None:
    if not header or not cells or len(cells) != len(header):
        return
    for name, cell in zip(header, cells):
        if cell.isdigit():
            ins.live[name] = int(cell)


def disassemble_listing(cubin: bytes, line_info: bool) -> RawListing:
    """Run nvdisasm (once, or twice for line information) and merge the two listings."""
    listing = parse_listing(toolchain.disassemble(cubin, LISTING_FLAGS))
    if not listing.functions:
        raise AsmError("nvdisasm printed no code sections for this cubin (no kernels in it?)")
    for fn in listing.functions.values():
        for ins in fn.instructions:
            if ins.lo is None or ins.hi is None:
                raise ToolchainError(
                    f"could not read the encoding of '{ins.text}' at {ins.address:#06x} in nvdisasm's -hex listing",
                    hint="this nvdisasm prints a listing shape asmgemm does not know; "
                         f"run `nvdisasm {' '.join(LISTING_FLAGS)}` on the cubin to see it")
    if line_info:
        lines = parse_listing(toolchain.disassemble(cubin, LINE_INFO_FLAGS))
        for name, fn in listing.functions.items():
            other = lines.functions.get(name)
            if other is None:
                continue
            by_addr = {i.address: i for i in other.instructions}
            for ins in fn.instructions:
                src = by_addr.get(ins.address)
                if src is not None:
                    ins.line_file, ins.line = src.line_file, src.line
    return listing
