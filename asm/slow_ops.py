"""PTX instructions that ptxas assembles into a long sequence where one instruction would do: notes
for `asmgemm check`, each at the .sasm line that wrote it (and the macro call that expanded it).

Division and remainder of an unsigned integer by an immediate power of two. ptxas 13.0 (-O3) does
not strength-reduce them: `div.u32 q, a, 2` becomes the reciprocal sequence (I2F.U32.RP,
MUFU.RCP, F2I.FTZ.U32.TRUNC, IMAD.HI and two compare-and-fix steps, about 15 SASS instructions), and
`rem.u32` the same, where `shr.u32 q, a, 1` and `and.b32 r, a, 1` are one each (PTX ISA, "div",
"rem": unsigned division truncates, so a / 2^k = a >> k and a % 2^k = a & (2^k - 1) for every a).
tests/test_slow_ops.py assembles such a probe and fails when a ptxas no longer keeps the division,
so this note cannot outlive its reason. Signed division is left alone: it truncates toward zero,
and a right shift rounds toward minus infinity for a negative a.

A note, not an error: the shift is the writer's choice to make (ptxas allocates registers
differently around it: docs/log/mma.md, step 14)."""
from __future__ import annotations

from dataclasses import dataclass

from . import ir
from .source import Span

_UNSIGNED = ("u16", "u32", "u64")


@dataclass(frozen=True)
class SlowOp:
    """One source line whose division by 2^shift ptxas keeps as a division (`count` instructions of
    the expanded kernel came from it: a macro's line counts once per expansion)."""
    span: Span | None
    opcode: str            # 'div.u32', 'rem.u64'
    divisor: int
    count: int

    @property
    def shift(self) -> int:
        return self.divisor.bit_length() - 1

    def message(self) -> str:
        op, typ = self.opcode.split(".")
        bits = typ[1:]
        instead = (f"shr.u{bits} by {self.shift}" if op == "div"
                   else f"and.b{bits} with {self.divisor - 1}")
        times = f" ({self.count} instructions of the kernel come from this line)" if self.count > 1 else ""
        return (f"{self.opcode} by {self.divisor}: ptxas assembles it as a division sequence (~15 SASS "
                f"instructions: MUFU.RCP and its fix-ups); {instead} is one instruction{times}")

    def to_json(self) -> dict:
        span = self.span
        return {"path": span.path if span else None, "line": span.line if span else None,
                "col": span.col if span else None, "opcode": self.opcode, "divisor": self.divisor,
                "count": self.count, "message": self.message()}


def _slow_division(ins: ir.Instruction) -> tuple[str, int] | None:
    """('div.u32', 4) for an unsigned div/rem by an immediate power of two, else None."""
    parts = ins.opcode.split(".")
    if parts[0] not in ("div", "rem") or parts[-1] not in _UNSIGNED or len(ins.operands) != 3:
        return None
    d = ins.operands[2]
    if not isinstance(d, ir.Imm) or not isinstance(d.value, int) or d.value <= 0 or d.value & (d.value - 1):
        return None
    return f"{parts[0]}.{parts[-1]}", d.value


def slow_ops(module: ir.Module) -> list[SlowOp]:
    """The module's unsigned divisions and remainders by an immediate power of two, one entry per
    source line (in the order they first appear)."""
    found: dict[tuple, int] = {}
    for fn in module.functions():
        for ins in fn.instructions():
            slow = _slow_division(ins)
            if slow is not None:
                key = (ins.span, *slow)
                found[key] = found.get(key, 0) + 1
    return [SlowOp(span, op, d, n) for (span, op, d), n in found.items()]
