"""Applying a rules file (sass/patch_rules.py) to a cubin: select instructions, set their control
fields, prove the result safe (sass/hazards.py), and write it only then.

    plan_patch(cubin_bytes, rules, source)  -> PatchPlan   (nothing written; .hazards, .changes)
    write_patched(plan, path)                               (refuses a plan with hazards)

The instructions, their text and control flow come from the SASS inspector (nvdisasm's listing,
sass/inspect.py); the words edited are the cubin's own bytes (sass/elf.py). The two are checked
against each other word by word before anything is selected, so a listing that does not describe
these bytes stops the patch. After the edit nvdisasm reads the patched cubin again
(`verify_encoding`): the same instructions must come back, since some opcodes accept only some
stall/yield values.
"""
from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import AsmError, ToolchainError
from ..isa import control_bits as cb
from ..isa.arch import arch_for
from ..scheduler.latencies_sm90 import timing_table
from .decode import text_reuse_slots
from .elf import ElfCubin
from .code_references import code_references
from .hazards import CheckReport, Hazard, check_patch
from .inspect import SassKernel, inspect_cubin
from .listing import disassemble_listing
from .patch_rules import Rule, Rules
from .reorder_pass import ReorderLimit, ReorderSummary, plan_reorder
from .reuse_pass import ReuseSummary, plan_reuse
from .stall_pass import StallYieldSummary, plan_stall_yield


@dataclass
class Change:
    kernel: str
    index: int
    address: int
    text: str
    before: dict[str, int]
    after: dict[str, int]
    rules: list[int]                   # 1-based numbers of the rules that selected it ([]: a pass)
    moved_from: int | None = None      # the reorder pass: the input address of the word now here

    def fields(self) -> dict[str, tuple[int, int]]:
        return {k: (self.before[k], self.after[k]) for k in self.before if self.before[k] != self.after[k]}

    def to_json(self) -> dict:
        out = {"kernel": self.kernel, "address": f"{self.address:#06x}", "instruction": self.text,
               "rules": self.rules,
               "fields": {k: {"before": a, "after": b} for k, (a, b) in self.fields().items()}}
        if self.moved_from is not None:
            out["moved_from"] = f"{self.moved_from:#06x}"
        return out


@dataclass
class PatchPlan:
    source: str
    cubin: bytes                       # the patched bytes (written only when no hazards)
    changes: list[Change]
    selected: int                      # instructions the rules selected (changed or not)
    checks: dict[str, CheckReport] = field(default_factory=dict)
    reuse_pass: list[ReuseSummary] = field(default_factory=list)
    stall_pass: list[StallYieldSummary] = field(default_factory=list)
    reorder_pass: list[ReorderSummary] = field(default_factory=list)

    @property
    def hazards(self) -> list[Hazard]:
        return [h for c in self.checks.values() for h in c.hazards]

    def to_json(self) -> dict:
        return {"source": self.source, "accepted": not self.hazards, "selected": self.selected,
                "changed": len(self.changes), "changes": [c.to_json() for c in self.changes],
                "checks": {k: c.to_json() for k, c in self.checks.items()},
                "reuse_pass": [r.to_json() for r in self.reuse_pass],
                "stall_pass": [s.to_json() for s in self.stall_pass],
                "reorder_pass": [r.to_json() for r in self.reorder_pass]}


def load_kernels(data: bytes, source: str) -> tuple[ElfCubin, dict[str, SassKernel], str]:
    """The cubin's bytes and its decoded kernels, checked against each other word by word."""
    elf = ElfCubin(data, source)
    report = inspect_cubin(data, source=source, line_info=False)
    for name, kernel in report.kernels.items():
        text = elf.kernel(name)
        # nvdisasm -c leaves out the NOP padding after a function's last instruction (seen with
        # nvdisasm 13: ptxas pads .text sections with NOPs); no rule can select those words.
        if text.count < len(kernel.instructions):
            raise AsmError(f"{source}: {name}: nvdisasm lists {len(kernel.instructions)} instructions "
                           f"but .text.{name} holds only {text.count} words")
        for k, ins in enumerate(kernel.instructions):
            if ins.address != 16 * k or ins.word != elf.word(name, k):
                raise AsmError(f"{source}: {name} {ins.address:#06x}: nvdisasm's encoding differs from "
                               "the bytes of the cubin; refusing to patch")
    return elf, report.kernels, report.target


def _kernels_of(rule: Rule, kernels: dict[str, SassKernel]) -> list[SassKernel]:
    if rule.kernel is None:
        if len(kernels) != 1:
            raise AsmError(f"rule {rule.index + 1}: the cubin has {len(kernels)} kernels "
                           f"({', '.join(kernels)}); say which with kernel = \"NAME\"", rule.span())
        return list(kernels.values())
    if rule.kernel not in kernels:
        raise AsmError(f"rule {rule.index + 1}: no kernel named '{rule.kernel}' in the cubin "
                       f"(kernels: {', '.join(kernels)})", rule.span("kernel"))
    return [kernels[rule.kernel]]


def _region(rule: Rule, kernel: SassKernel) -> list[int]:
    n = len(kernel.instructions)
    if rule.region_kind is None:
        return list(range(n))
    if rule.region_kind == "indices":      # an exact set, built by a caller (sass/control_directive.py)
        return sorted(rule.region)
    if rule.region_kind == "loop":
        if rule.region >= len(kernel.loops):
            raise AsmError(f"rule {rule.index + 1}: {kernel.name} has {len(kernel.loops)} loop(s); "
                           f"there is no loop {rule.region}", rule.span("loop"))
        return sorted(kernel.loops[rule.region].instruction_indices(kernel.blocks))
    if rule.region_kind == "instructions":
        lo, hi = rule.region
        if hi > n:
            raise AsmError(f"rule {rule.index + 1}: {kernel.name} has {n} instructions; the range ends "
                           f"at {hi}", rule.span("instructions"))
        return list(range(lo, hi))
    if rule.region_kind == "addresses":
        lo, hi = rule.region
        if lo % 16 or hi % 16 or hi > 16 * n:
            raise AsmError(f"rule {rule.index + 1}: addresses must be multiples of 0x10 within "
                           f"{kernel.name}'s 0x0000-{16 * n:#06x}", rule.span("addresses"))
        return list(range(lo // 16, hi // 16))
    start, end = rule.region
    for lab in (start, end):
        if lab not in kernel.labels:
            raise AsmError(f"rule {rule.index + 1}: {kernel.name} has no label '{lab}' "
                           f"(labels: {', '.join(kernel.labels) or 'none'})", rule.span("labels"))
    return list(range(kernel.labels[start] // 16, kernel.labels[end] // 16))


def plan_patch(data: bytes, rules: Rules | None, source: str = "<cubin>", *,
               reuse_pass: bool = False, stall_pass: bool = False, yield_every: int = 0,
               reorder_pass: bool = False, reorder_blocks: int | None = None,
               reorder_moves: int | None = None) -> PatchPlan:
    """Apply `rules` (and, when asked, the reuse pass: sass/reuse_pass.py, then the stall/yield
    pass: sass/stall_pass.py, `stall_pass` lowering stalls and `yield_every` = N > 0 placing a yield
    on every N-th FFMA/HMMA of each loop, then the reorder pass, last: sass/reorder_pass.py) to a
    copy of the cubin and check the result; nothing is written. The passes run on every kernel of
    the cubin. A reordered kernel is judged by sass/reorder_check.py instead of check_patch, which
    assumes every instruction stays where it was. `reorder_blocks` / `reorder_moves` apply only part
    of the reorder pass (sass/reorder_pass.py ReorderLimit; None or 0: no limit), for bisecting a
    wrong result on the GPU (tools/reorder_bisect.py)."""
    if yield_every < 0:
        raise AsmError(f"yield_every must be at least 1 (or 0 for no yield placement), not {yield_every}")
    limit = None
    if reorder_blocks or reorder_moves:
        if not reorder_pass:
            raise AsmError("reorder_blocks and reorder_moves limit the reorder pass: they need reorder_pass")
        try:
            limit = ReorderLimit(reorder_blocks or None, reorder_moves or None)
        except ValueError as exc:
            raise AsmError(str(exc)) from None
    elf, kernels, target = load_kernels(data, source)
    selected: dict[tuple[str, int], list[int]] = {}
    for rule in (rules.rules if rules else []):
        hits = 0
        for kernel in _kernels_of(rule, kernels):
            for k in _region(rule, kernel):
                if rule.opcode.fullmatch(kernel.instructions[k].name):
                    elf.set_control(kernel.name, k, **rule.fields)
                    selected.setdefault((kernel.name, k), []).append(rule.index + 1)
                    hits += 1
        if not hits:
            raise AsmError(f"rule {rule.index + 1}: selects no instruction (opcode /{rule.opcode.pattern}/ "
                           "matched in full against names such as FFMA or LDS.U.128)",
                           rule.span("opcode"))
    reuse_summaries = []
    if reuse_pass:
        for name, kernel in kernels.items():
            flags, summary = plan_reuse(kernel, target)
            for k, reuse in flags.items():
                elf.set_control(name, k, reuse=elf.control(name, k)["reuse"] | reuse)
                selected.setdefault((name, k), [])
            reuse_summaries.append(summary)
    table, _note = timing_table(arch_for(target))
    stall_summaries = []
    if stall_pass or yield_every:
        # after the reuse pass: a yield placed here clears the reuse flags under it
        for name, kernel in kernels.items():
            words = elf.words(name)[:len(kernel.instructions)]
            new, summary = plan_stall_yield(kernel, words, table, target,
                                            stall_pass=stall_pass, yield_every=yield_every)
            for k, (old, word) in enumerate(zip(words, new)):
                if word != old:
                    elf.set_word(name, k, word)
                    selected.setdefault((name, k), [])
            stall_summaries.append(summary)
    reorder_summaries, reordered = [], {}
    if reorder_pass:
        for name, kernel in kernels.items():
            origin, words, summary, report = plan_reorder(
                kernel, elf.words(name), code_references(elf, name), table, target,
                _encodable_by_nvdisasm(elf.to_bytes(), name, kernel, source), limit)
            reorder_summaries.append(summary)
            if origin[:len(kernel.instructions)] != list(range(len(kernel.instructions))):
                elf.permute(name, origin + list(range(len(origin), elf.kernel(name).count)),
                            [(b.start, b.end) for b in kernel.blocks if b.reachable])
                reordered[name] = report
                # the rules that selected a word follow it to its new index
                before = {k: rules_of for (kname, k), rules_of in selected.items() if kname == name}
                for k in before:
                    del selected[(name, k)]
                selected.update({(name, k): before.get(j, []) for k, j in enumerate(origin)
                                 if k != j or j in before})
            for k, w in enumerate(words):
                if w != elf.word(name, k):
                    elf.set_word(name, k, w)
                    selected.setdefault((name, k), [])
    changes = []
    for name, k, old, new in elf.changed():
        src = elf.origin(name)[k]
        ins = kernels[name].instructions[src]
        changes.append(Change(name, k, 16 * k, ins.text, cb.decode_control(elf.original_word(name, src)),
                              cb.decode_control(new), selected.get((name, k), []),
                              ins.address if src != k else None))
    checks = {}
    for name, kernel in kernels.items():
        words = elf.words(name)[:len(kernel.instructions)]
        if name in reordered:
            # the reorder pass ran sass/reorder_check.py on exactly these words (it is the last edit)
            checks[name] = reordered[name]
        else:
            checks[name] = check_patch(kernel, words, table)
    if changes:
        origins = {name: elf.origin(name) for name in reordered}
        for hazard in verify_encoding(kernels, elf.to_bytes(), source, origins):
            checks[hazard.kernel].hazards.append(hazard)
    return PatchPlan(source, elf.to_bytes(), changes, len(selected), checks, reuse_summaries,
                     stall_summaries, reorder_summaries)


_NVDISASM_ADDRESS = re.compile(r"at address (0x[0-9a-fA-F]+)")


def _encodable_by_nvdisasm(data: bytes, name: str, kernel: SassKernel, source: str):
    """For the reorder pass: the indices of kernel `name` whose words nvdisasm cannot read back as
    the moved instructions (`verify_encoding` on a scratch copy of the cubin)."""
    def bad(origin: list[int], words: list[int]) -> list[int]:
        scratch = ElfCubin(data, source)
        count = scratch.kernel(name).count
        scratch.permute(name, origin + list(range(len(origin), count)),
                        [(b.start, b.end) for b in kernel.blocks if b.reachable])
        for k, w in enumerate(words):
            if w != scratch.word(name, k):
                scratch.set_word(name, k, w)
        found = verify_encoding({name: kernel}, scratch.to_bytes(), source, {name: origin})
        return [h.address // 16 for h in found]
    return bad


def verify_encoding(kernels: dict[str, SassKernel], patched: bytes, source: str,
                    origins: dict[str, list[int]] | None = None) -> list[Hazard]:
    """nvdisasm must read the patched words as the same instructions, with `.reuse` exactly on the
    slots whose flags are set. Not every control value is legal everywhere: nvdisasm 13 decodes the
    stall and yield bits of some opcodes through a table of allowed values (S2R refuses stall 0
    and 15: "Opclass 's2r_', undefined value 0x1f for table 'TABLES_opex_0'"), so a patch is
    disassembled again before it may be written."""
    try:
        listing = disassemble_listing(patched, line_info=False)
    except ToolchainError as exc:
        m = _NVDISASM_ADDRESS.search(exc.message)
        address = int(m.group(1), 16) if m else 0
        name = next(iter(kernels))
        for kname, kernel in kernels.items():      # nvdisasm names the address, not the kernel
            if any(i.address == address for i in kernel.instructions):
                name = kname
                break
        text = next((i.text for i in kernels[name].instructions if i.address == address), "?")
        said = exc.message.removeprefix("nvdisasm failed (exit 1): ").splitlines()[0]
        return [Hazard(name, address, text, "encoding",
                       f"nvdisasm cannot decode the patched word ({said}); this opcode does not "
                       "accept these control values")]
    out = []
    for name, kernel in kernels.items():
        fn = listing.functions.get(name)
        if fn is None or len(fn.instructions) != len(kernel.instructions):
            out.append(Hazard(name, 0, "", "encoding", "nvdisasm lists the patched kernel differently"))
            continue
        origin = (origins or {}).get(name) or range(len(kernel.instructions))
        for k, after in enumerate(fn.instructions):
            # a reordered kernel: the word at k is the input's instruction origin[k]
            before = kernel.instructions[origin[k]]
            reuse = cb.decode_control(cb.word_of(after.lo, after.hi))["reuse"]
            slots = [i for i in range(len(cb.REUSE_SLOTS)) if reuse >> i & 1]
            if after.text.replace(".reuse", "") != before.text.replace(".reuse", "") or \
                    text_reuse_slots(after.text, before.destinations) != slots:
                out.append(Hazard(name, after.address, before.text, "encoding",
                                  f"nvdisasm reads the patched word as '{after.text}'"))
    return out


def write_patched(plan: PatchPlan, path: str | Path) -> None:
    """Write the patched cubin, all at once (a temporary file renamed over `path`), or refuse."""
    if plan.hazards:
        raise AsmError(f"refusing to write {path}: the patch has {len(plan.hazards)} hazard(s)")
    write_atomically(Path(path), plan.cubin)


def write_atomically(path: Path, data: bytes) -> None:
    """No partial file: a reader sees the old file or the whole new one, never a torn write."""
    folder = path.resolve().parent
    if not folder.is_dir():
        raise AsmError(f"cannot write {path}: no folder {folder}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        # mkstemp makes the file private (0600); give it the mode a plain open() would have
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
