"""The rules file of `asmgemm patch`: which instructions get which control-field values.

    # sgemm_reuse.toml
    kernel = "sgemm"                  # default kernel of every rule (optional with one kernel)

    [[rule]]
    opcode = "FFMA"                   # regular expression, matched in full against the opcode
                                      # with its modifiers as nvdisasm prints them ("LDS.U.128")
    loop = 0                          # region: the instructions of loop 0 (`asmgemm sass --loop`)
    # addresses = [0x0400, 0x0800]    #   or a half-open address range
    # instructions = [64, 128]        #   or a half-open range of instruction indices
    # labels = [".L_x_3", ".L_x_4"]   #   or from one nvdisasm label up to (not including) another
    stall = 2                         # 0-15
    yield = true                      # the yield hint: true = on (`Y`, bit 109 = 0)
    write_barrier = "none"            # 0-5 or "none"
    read_barrier = 1                  # 0-5 or "none"
    wait = [0, 3]                     # the scoreboards waited on (replaces the mask)
    reuse = ["A", "B"]                # the source slots whose reuse flag is on (replaces the flags)

Rules apply in file order; a later rule's field wins for an instruction two rules select. A rule
that selects no instruction is an error: a pattern with a typo must not pass for a patch that
did nothing. Every error points at the rules file (`file:line:col` and a caret).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import AsmError
from ..isa import control_bits as cb
from ..source import SourceFile, Span

if sys.version_info >= (3, 11):
    import tomllib
else:                                  # pyproject's tomli dependency on 3.10
    import tomli as tomllib

REGION_KEYS = ("loop", "addresses", "instructions", "labels")
FIELD_KEYS = ("stall", "yield", "write_barrier", "read_barrier", "wait", "reuse")
RULE_KEYS = ("kernel", "opcode") + REGION_KEYS + FIELD_KEYS
_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


@dataclass
class Rule:
    index: int                         # 0-based position in the file
    kernel: str | None
    opcode: re.Pattern
    region_kind: str | None            # one of REGION_KEYS, "indices" (built by a caller, never read
                                       # from a file: sass/control_directive.py), or None: the whole kernel
    region: object                     # int (loop), (lo, hi) ints, (label, label), or a set of indices
    fields: dict[str, int] = field(default_factory=dict)   # control field name -> raw value
    spans: dict[str, Span] = field(default_factory=dict)   # key -> where it is written

    def span(self, key: str | None = None) -> Span | None:
        return self.spans.get(key) or self.spans.get("[[rule]]")


@dataclass
class Rules:
    path: str
    rules: list[Rule]


class _Locator:
    """Spans of keys in the rules text (tomllib gives values, not positions)."""

    def __init__(self, source: SourceFile):
        self.source = source
        self.text = source.text
        self.rule_starts = [m.start() for m in re.finditer(r"(?m)^[ \t]*\[\[[ \t]*rule[ \t]*\]\]", self.text)]
        headers = [m.start() for m in re.finditer(r"(?m)^[ \t]*\[", self.text)]
        self.first_header = headers[0] if headers else len(self.text)
        self.headers = headers

    def _block(self, rule: int | None) -> tuple[int, int]:
        if rule is None:
            return 0, self.first_header
        start = self.rule_starts[rule]
        later = [h for h in self.headers if h > start]
        return start, later[0] if later else len(self.text)

    def key(self, rule: int | None, key: str) -> Span | None:
        lo, hi = self._block(rule)
        m = re.compile(rf"(?m)^[ \t]*{re.escape(key)}[ \t]*=[ \t]*").search(self.text, lo, hi)
        if m is None:
            return None
        end = self.text.find("\n", m.end())
        end = len(self.text) if end < 0 else end
        value_end = self.text.find("#", m.end(), end)
        return Span(self.source, m.end(), (value_end if value_end >= 0 else end))

    def header(self, rule: int) -> Span:
        start = self.rule_starts[rule] + len(self.text[self.rule_starts[rule]:]) - len(self.text[self.rule_starts[rule]:].lstrip())
        return Span(self.source, start, self.text.find("]]", start) + 2)

    def at(self, line: int, col: int) -> Span:
        starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        off = starts[min(line, len(starts)) - 1] + col - 1
        return Span(self.source, off, off + 1)


def load_rules(path: str) -> Rules:
    p = Path(path)
    if not p.is_file():
        raise AsmError(f"no such rules file: {path}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise AsmError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_rules(text, str(path))


def parse_rules(text: str, path: str = "<rules>") -> Rules:
    source = SourceFile.from_text(path, text)
    where = _Locator(source)
    try:
        data = tomllib.loads(source.text)
    except tomllib.TOMLDecodeError as exc:
        m = _TOML_POSITION.search(str(exc))
        span = where.at(int(m.group(1)), int(m.group(2))) if m else None
        raise AsmError(f"not a valid TOML rules file: {_TOML_POSITION.sub('', str(exc)).strip()}",
                       span) from None
    for key in data:
        if key not in ("kernel", "rule"):
            raise AsmError(f"unknown top-level key '{key}' (expected 'kernel' and [[rule]] tables)",
                           where.key(None, key))
    default_kernel = data.get("kernel")
    if default_kernel is not None and not isinstance(default_kernel, str):
        raise AsmError("kernel must be a string (the kernel's name)", where.key(None, "kernel"))
    tables = data.get("rule", [])
    if not isinstance(tables, list) or not tables:
        raise AsmError("no rules: write at least one [[rule]] table", Span(source, 0, 0))
    rules = [_rule(i, t, default_kernel, where) for i, t in enumerate(tables)]
    return Rules(path, rules)


def _rule(i: int, table: dict, default_kernel: str | None, where: _Locator) -> Rule:
    def err(msg: str, key: str | None = None) -> AsmError:
        return AsmError(f"rule {i + 1}: {msg}", (where.key(i, key) if key else None) or where.header(i))

    for key in table:
        if key not in RULE_KEYS:
            raise err(f"unknown key '{key}' (keys: {', '.join(RULE_KEYS)})", key)
    spans = {k: s for k in table if (s := where.key(i, k)) is not None}
    spans["[[rule]]"] = where.header(i)
    kernel = table.get("kernel", default_kernel)
    if kernel is not None and not isinstance(kernel, str):
        raise err("kernel must be a string", "kernel")
    pattern = table.get("opcode")
    if not isinstance(pattern, str):
        raise err("needs opcode = \"REGEX\" (for example \"FFMA\" or \"LDS(\\\\..*)?\")", "opcode")
    try:
        opcode = re.compile(pattern)
    except re.error as exc:
        raise err(f"opcode is not a regular expression: {exc}", "opcode") from None
    regions = [k for k in REGION_KEYS if k in table]
    if len(regions) > 1:
        raise err(f"give one region, not {' and '.join(regions)}", regions[1])
    kind = regions[0] if regions else None
    region = table.get(kind) if kind else None
    if kind == "loop":
        if type(region) is not int or region < 0:
            raise err("loop must be a loop number (0, 1, ... as `asmgemm sass --loop` numbers them)", kind)
    elif kind in ("addresses", "instructions"):
        if not (isinstance(region, list) and len(region) == 2 and all(type(v) is int and v >= 0 for v in region)
                and region[0] < region[1]):
            raise err(f"{kind} must be [first, end] with first < end (end not included)", kind)
        region = tuple(region)
    elif kind == "labels":
        if not (isinstance(region, list) and len(region) == 2 and all(isinstance(v, str) for v in region)):
            raise err("labels must be [\"start label\", \"end label\"] (end not included)", kind)
        region = tuple(region)
    fields = _fields(table, err)
    if not fields:
        raise err(f"sets no control field (fields: {', '.join(FIELD_KEYS)})")
    return Rule(i, kernel, opcode, kind, region, fields, spans)


def _fields(table: dict, err) -> dict[str, int]:
    out: dict[str, int] = {}
    if "stall" in table:
        v = table["stall"]
        if type(v) is not int or not 0 <= v <= cb.STALL.mask:
            raise err(f"stall must be an integer 0-{cb.STALL.mask}", "stall")
        out["stall"] = v
    if "yield" in table:
        v = table["yield"]
        if not isinstance(v, bool):
            raise err("yield must be true (hint on, `Y`) or false", "yield")
        out["yield"] = 0 if v else 1          # the bit is inverted: 0 = hint on (control_bits.YIELD)
    for key in ("write_barrier", "read_barrier"):
        if key in table:
            v = table[key]
            if v == "none":
                out[key] = cb.NO_BARRIER
            elif type(v) is int and 0 <= v < cb.NUM_SCOREBOARDS:
                out[key] = v
            else:
                raise err(f"{key} must be a scoreboard 0-{cb.NUM_SCOREBOARDS - 1} or \"none\"", key)
    if "wait" in table:
        v = table["wait"]
        if not isinstance(v, list) or not all(type(s) is int and 0 <= s < cb.NUM_SCOREBOARDS for s in v):
            raise err(f"wait must be a list of scoreboards 0-{cb.NUM_SCOREBOARDS - 1} ([] for none)", "wait")
        out["wait_mask"] = sum(1 << s for s in set(v))
    if "reuse" in table:
        v = table["reuse"]
        if not isinstance(v, list) or not all(s in cb.REUSE_SLOTS for s in v):
            raise err(f"reuse must be a list of slots from {list(cb.REUSE_SLOTS)} ([] for none)", "reuse")
        out["reuse"] = sum(1 << cb.REUSE_SLOTS.index(s) for s in set(v))
    return out
