"""What changed between two cubins, field by field: `asmgemm sass --diff a.cubin b.cubin`.

For each kernel present in both, every instruction word that differs is reported with its
nvdisasm text (from a) and, when only the control fields differ, each changed field with its old
and new value (layout: isa/control_bits.py); a word that differs outside the control fields is
reported as a different instruction. Every other section is compared byte for byte, so a patch
that touched anything but control codes shows up.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..isa import control_bits as cb
from .decode import control_string
from .elf import ElfCubin

_CONTROL_MASK = sum(f.mask << f.lo for f in cb.CONTROL_FIELDS)


@dataclass
class WordDiff:
    kernel: str
    address: int
    text: str
    old: int
    new: int

    @property
    def control_only(self) -> bool:
        return not (self.old ^ self.new) & ~_CONTROL_MASK

    def fields(self) -> dict[str, tuple[int, int]]:
        a, b = cb.decode_control(self.old), cb.decode_control(self.new)
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "address": f"{self.address:#06x}", "instruction": self.text,
                "control_only": self.control_only,
                "control": [_control(self.old), _control(self.new)],
                "fields": {k: {"before": a, "after": b} for k, (a, b) in self.fields().items()},
                "encoding": [f"{self.old:#034x}", f"{self.new:#034x}"]}


@dataclass
class SectionDiff:
    name: str
    change: str                        # "only in a", "only in b", "size", "bytes"
    detail: str

    def to_json(self) -> dict:
        return {"section": self.name, "change": self.change, "detail": self.detail}


@dataclass
class CubinDiff:
    a: str
    b: str
    words: list[WordDiff] = field(default_factory=list)
    sections: list[SectionDiff] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.words and not self.sections

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "identical": self.identical,
                "instructions": [w.to_json() for w in self.words],
                "sections": [s.to_json() for s in self.sections],
                "control_bits": cb.layout_table()}


def _control(word: int) -> str:
    f = cb.decode_control(word)
    return control_string(f["wait_mask"], None if f["read_barrier"] == cb.NO_BARRIER else f["read_barrier"],
                          None if f["write_barrier"] == cb.NO_BARRIER else f["write_barrier"],
                          f["yield"] == 0, f["stall"])


def diff_cubins(a: bytes, b: bytes, a_name: str = "a", b_name: str = "b",
                texts: dict[str, dict[int, str]] | None = None) -> CubinDiff:
    """Compare two cubins. `texts`: kernel -> address -> instruction text (nvdisasm's, of a)."""
    ea, eb = ElfCubin(a, a_name), ElfCubin(b, b_name)
    out = CubinDiff(a_name, b_name)
    sa = {s.name: s for s in ea.sections}
    sb = {s.name: s for s in eb.sections}
    code_sections = {f".text.{k}" for k in set(ea.kernels) & set(eb.kernels)}
    for name in list(sa) + [n for n in sb if n not in sa]:
        if name not in sb:
            out.sections.append(SectionDiff(name, "only in a", f"{sa[name].size} bytes"))
        elif name not in sa:
            out.sections.append(SectionDiff(name, "only in b", f"{sb[name].size} bytes"))
        elif sa[name].size != sb[name].size:
            out.sections.append(SectionDiff(name, "size", f"{sa[name].size} -> {sb[name].size} bytes"))
        elif name not in code_sections and sa[name].type != 8:       # SHT_NOBITS has no bytes
            x = a[sa[name].offset: sa[name].offset + sa[name].size]
            y = b[sb[name].offset: sb[name].offset + sb[name].size]
            if x != y:
                n = sum(1 for p, q in zip(x, y) if p != q)
                out.sections.append(SectionDiff(name, "bytes", f"{n} of {len(x)} bytes differ"))
    for kernel in ea.kernels:
        if kernel not in eb.kernels or ea.kernels[kernel].count != eb.kernels[kernel].count:
            continue
        names = (texts or {}).get(kernel, {})
        for k, (old, new) in enumerate(zip(ea.words(kernel), eb.words(kernel))):
            if old != new:
                out.words.append(WordDiff(kernel, 16 * k, names.get(16 * k, "?"), old, new))
    return out


def render_diff(diff: CubinDiff) -> list[str]:
    """Plain lines: one per changed instruction, its control codes and the changed fields."""
    if diff.identical:
        return [f"{diff.a} and {diff.b}: identical"]
    lines = [f"--- {diff.a}", f"+++ {diff.b}"]
    for s in diff.sections:
        lines.append(f"section {s.name}: {s.change} ({s.detail})")
    kernel = None
    for w in diff.words:
        if w.kernel != kernel:
            kernel = w.kernel
            lines.append(f"{kernel}:")
        if not w.control_only:
            lines.append(f"  {w.address:#06x}  {w.text}\n      instruction bits differ: "
                         f"{w.old:#034x} -> {w.new:#034x}")
            continue
        parts = ", ".join(f"{k} {_shown(k, a)} -> {_shown(k, b)}" for k, (a, b) in w.fields().items())
        lines.append(f"  {w.address:#06x}  {_control(w.old)} -> {_control(w.new)}  {w.text}\n      {parts}")
    lines.append(f"{len(diff.words)} instruction(s) changed, "
                 f"{sum(1 for w in diff.words if not w.control_only)} outside the control fields; "
                 f"{len(diff.sections)} other section(s) differ")
    return lines


def _shown(name: str, value: int) -> str:
    if name == "yield":
        return "on(Y)" if value == 0 else "off"
    if name in ("write_barrier", "read_barrier"):
        return "none" if value == cb.NO_BARRIER else str(value)
    if name == "wait_mask":
        return "B" + "".join(str(i) if value >> i & 1 else "-" for i in range(cb.NUM_SCOREBOARDS))
    if name == "reuse":
        return "".join(s for i, s in enumerate(cb.REUSE_SLOTS) if value >> i & 1) or "-"
    return str(value)
