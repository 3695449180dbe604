"""What the scheduler needs to know about one PTX instruction: its timing class (a row of the
latency table), its effect on memory, and whether it may move at all.

PTX -> SASS correspondences follow the PTX ISA (docs.nvidia.com/cuda/parallel-thread-execution,
section 9.7) and what ptxas is commonly seen to emit; they are approximations (ptxas may split or
fuse instructions), which is why compare_with_sass matches on line info first.
"""
from __future__ import annotations

from dataclasses import dataclass

from .latencies_sm90 import TENSOR_FMA_PER_CLK_SMSP
from asmgemm import ir

# Placement of an instruction in the dependency graph:
#   'free'   moves wherever its register and memory dependencies allow
#   'fence'  a memory fence: keeps its order with every memory operation (registers still free)
#   'fixed'  never moves: nothing crosses it in either direction
FREE, FENCE, FIXED = "free", "fence", "fixed"

# Control transfers and labels are not allowed inside a .schedule region (regions are
# straight-line code); depgraph.py turns these into an AsmError at the instruction.
CONTROL_TRANSFER = {"bra", "brx", "ret", "exit"}

# Special registers whose value changes on its own: reading them is an observation of time or
# placement, so the reading instruction keeps its place.
VOLATILE_SREGS = ("%clock", "%clock64", "%globaltimer", "%globaltimer_lo", "%globaltimer_hi")
SPECIAL_REG_PREFIXES = ("%tid", "%ntid", "%ctaid", "%nctaid", "%laneid", "%warpid", "%nwarpid",
                        "%smid", "%nsmid", "%gridid", "%lanemask", "%cluster", "%is_explicit_cluster",
                        "%dynamic_smem_size", "%total_smem_size", "%pm", "%envreg",
                        "%reserved_smem")

_TYPE_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
               "e4m3": 1, "e5m2": 1,
               "b32": 4, "u32": 4, "s32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4, "tf32": 4,
               "b64": 8, "u64": 8, "s64": 8, "f64": 8, "b128": 16}
_FLOAT_TYPES = {"f16", "bf16", "f32", "f64", "f16x2", "bf16x2", "tf32", "e4m3", "e5m2"}
_SPACES = ("shared", "global", "local", "param", "const")


@dataclass(frozen=True)
class MemAccess:
    space: str                  # 'shared', 'global', 'local', 'param', 'const', 'generic'
    reads: bool
    writes: bool
    base: str | None = None     # address register name ([%r5+16] -> '%r5'), or a symbol name
    base_is_reg: bool = False
    offset: int = 0
    size: int | None = None     # bytes accessed per thread; None = unknown (overlaps anything)
    read_only: bool = False     # ld.param/ld.const/ld.global.nc: no store in the kernel aliases it


@dataclass(frozen=True)
class Kind:
    cls: str                    # key of latencies_sm90.TABLE
    placement: str = FREE       # FREE / FENCE / FIXED
    mem: tuple[MemAccess, ...] = ()
    order_tag: str | None = None  # ordering group: see order_role
    order_role: str = "chain"     # 'chain': keeps its order with every other instruction of the tag;
                                  # 'member': stays between the chain instructions around it
                                  # (a cp.async copy between its group's commits) but members may
                                  # reorder among themselves
    issue_override: int | None = None   # shape-dependent issue cost (mma.sync)
    control: bool = False       # a control transfer (error inside a region)
    why_fixed: str = ""


def _space(mods: list[str]) -> str:
    for m in mods:
        head = m.split("::", 1)[0]
        if head in _SPACES:
            return head
    return "generic"


def _elem_bytes(mods: list[str]) -> int | None:
    for m in reversed(mods):
        if m in _TYPE_BYTES:
            return _TYPE_BYTES[m]
    return None


def _vec(mods: list[str]) -> int:
    for m in mods:
        if m in ("v2", "v4", "v8"):
            return int(m[1])
    return 1


def _mem_of(op: ir.Operand, space: str, reads: bool, writes: bool, size: int | None,
            read_only: bool = False) -> MemAccess:
    base, is_reg, off = None, False, 0
    if isinstance(op, ir.Mem):
        off = op.offset
        b = op.base
        if isinstance(b, ir.Reg):
            base, is_reg = b.name, True
        elif isinstance(b, ir.Sym):
            base, off = b.name, off + b.offset
        elif b is None:
            base = "<absolute>"
        if op.extra:              # [tensor_map, {coords}]: address is not a simple base+offset
            size = None
    return MemAccess(space, reads, writes, base, is_reg, off, size, read_only)


def _first_mem(ins: ir.Instruction, n: int = 0) -> ir.Operand | None:
    found = [o for o in ins.operands if isinstance(o, ir.Mem)]
    return found[n] if len(found) > n else None


def _reads_volatile_sreg(ins: ir.Instruction) -> bool:
    return any(r.name.split(".")[0] in VOLATILE_SREGS for r in ins.registers())


def _reads_special(ins: ir.Instruction) -> bool:
    return any(r.name.startswith(SPECIAL_REG_PREFIXES) for r in ins.registers())


def _mma_issue(mods: list[str], table_rate: dict[str, int]) -> tuple[str, int | None]:
    shape = next((m for m in mods if m.startswith("m") and "n" in m and "k" in m), None)
    types = [m for m in mods if m in table_rate]
    ab = types[1] if len(types) >= 3 else (types[0] if types else "f16")
    if "f64" in types:
        ab = "f64"
    cls = {"tf32": "HMMA_TF32", "f64": "DMMA"}.get(ab, "IMMA" if ab in ("s8", "u8", "s4", "u4", "b1")
                                                    else "HMMA")
    if not shape:
        return cls, None
    try:
        m, rest = shape[1:].split("n", 1)
        n, k = rest.split("k", 1)
        fmas = int(m) * int(n) * int(k)
    except ValueError:
        return cls, None
    rate = table_rate.get(ab, 512)
    return cls, max(1, -(-fmas // rate))


def classify(ins: ir.Instruction) -> Kind:
    op = ins.opcode
    mods = ins.modifiers
    base = ins.base

    if _reads_volatile_sreg(ins):
        return Kind("CS2R", FIXED, why_fixed="reads a clock/timer register")

    # ---- control flow --------------------------------------------------------------------------
    if base in CONTROL_TRANSFER:
        return Kind("BAR", FIXED, control=True, why_fixed="control transfer")
    if base in ("call",):
        return Kind("OTHER", FIXED, why_fixed="function call")
    if base in ("trap", "brkpt", "nanosleep", "pmevent", "setmaxnreg", "griddepcontrol", "elect",
                "tensormap", "activemask"):
        return Kind("OTHER", FIXED, why_fixed=f"{base} has effects beyond its operands")

    # ---- synchronisation -------------------------------------------------------------------------
    if base in ("bar", "barrier"):
        # A barrier is a wall: nothing crosses it, which also keeps every shared/global access
        # on its side. Issue 4 lists barriers among the instructions that never move; a user who
        # wants arithmetic to flow across one ends the region before it.
        return Kind("BAR", FIXED, why_fixed="barrier")
    if base in ("membar", "fence"):
        return Kind("FENCE", FENCE, why_fixed="memory fence")
    if base == "mbarrier":
        m = _first_mem(ins)
        return Kind("MBAR", FENCE, mem=(_mem_of(m, "shared", True, True, 8),) if m else (),
                    order_tag="mbarrier")
    if base == "wgmma":
        return Kind("WGMMA", FIXED, why_fixed="wgmma (asynchronous warpgroup MMA) is kept in place")

    # ---- memory ----------------------------------------------------------------------------------
    if base == "cp":
        if "async" in mods and "bulk" not in mods:
            if "commit_group" in mods:
                return Kind("LDGDEPBAR", FREE, order_tag="cp.async")
            if "wait_group" in mods or "wait_all" in mods:
                # Waiting makes earlier copies visible: shared accesses after it stay after it.
                return Kind("DEPBAR", FREE, order_tag="cp.async")
            if "mbarrier" in mods:      # cp.async.mbarrier.arrive
                return Kind("MBAR", FENCE, order_tag="mbarrier")
            dst, src = _first_mem(ins, 0), _first_mem(ins, 1)
            size = None
            for o in ins.operands[2:3]:
                if isinstance(o, ir.Imm) and isinstance(o.value, int):
                    size = o.value
            return Kind("LDGSTS", FREE, order_tag="cp.async", order_role="member",
                        mem=(_mem_of(dst, "shared", False, True, size),
                             _mem_of(src, "global", True, False, size)))
        # cp.async.bulk*, cp.reduce.async.bulk*: TMA, completion through mbarrier/bulk groups
        mems = tuple(_mem_of(m, "generic", True, True, None)
                     for m in (_first_mem(ins, 0), _first_mem(ins, 1)) if m is not None)
        return Kind("TMA", FENCE, mem=mems, order_tag="bulk")
    if base in ("ld", "ldu"):
        space = _space(mods)
        m = _first_mem(ins)
        eb = _elem_bytes(mods)
        size = eb * _vec(mods) if eb else None
        ro = space in ("param", "const") or "nc" in mods or base == "ldu"
        placement = FENCE if ("acquire" in mods or "volatile" in mods and space != "shared") else FREE
        if space == "shared":
            cls = {8: "LDS64", 16: "LDS128"}.get(size or 4, "LDS32")
        elif space in ("param", "const"):
            cls = "LDC"
        elif space == "local":
            cls = "LDL"
        else:
            cls = "LDG"
        return Kind(cls, placement, mem=(_mem_of(m, space, True, False, size, ro),))
    if base == "st":
        space = _space(mods)
        m = _first_mem(ins)
        eb = _elem_bytes(mods)
        size = eb * _vec(mods) if eb else None
        placement = FENCE if ("release" in mods or "volatile" in mods and space != "shared") else FREE
        if space == "shared":
            cls = {8: "STS64", 16: "STS128"}.get(size or 4, "STS32")
        elif space == "local":
            cls = "STL"
        else:
            cls = "STG"
        if "async" in mods:       # st.async: remote shared memory with mbarrier completion
            return Kind("STS32", FENCE, mem=(_mem_of(m, "shared", False, True, size),),
                        order_tag="mbarrier")
        return Kind(cls, placement, mem=(_mem_of(m, space, False, True, size),))
    if base in ("atom", "red"):
        space = _space(mods)
        m = _first_mem(ins)
        eb = _elem_bytes(mods)
        cls = "ATOMS" if space == "shared" else "ATOMG"
        placement = FENCE if any(s in mods for s in ("acquire", "release", "acq_rel")) else FREE
        return Kind(cls, placement, mem=(_mem_of(m, space, True, True, eb),))
    if base == "ldmatrix":
        n = 4 if "x4" in mods else 2 if "x2" in mods else 1
        m = _first_mem(ins)
        # Each thread supplies one row address; rows of the 8x8 matrices may lie anywhere.
        return Kind(f"LDSM{n}", FREE, mem=(_mem_of(m, "shared", True, False, None),))
    if base == "stmatrix":
        m = _first_mem(ins)
        return Kind("STSM", FREE, mem=(_mem_of(m, "shared", False, True, None),))
    if base in ("prefetch", "prefetchu", "applypriority", "discard", "createpolicy"):
        m = _first_mem(ins)
        if m is None:
            return Kind("OTHER", FREE)
        return Kind("STG" if base == "discard" else "LDG", FREE,
                    mem=(_mem_of(m, _space(mods), base != "discard", base == "discard", None),))
    if base in ("isspacep", "cvta", "mapa", "getctarank"):
        return Kind("IADD3")
    if base in ("wmma",):
        if "mma" in mods:
            return Kind("HMMA")
        m = _first_mem(ins)
        space = _space(mods)
        if "load" in mods:
            return Kind("LDS128" if space == "shared" else "LDG", FREE,
                        mem=(_mem_of(m, space, True, False, None),))
        return Kind("STS128" if space == "shared" else "STG", FREE,
                    mem=(_mem_of(m, space, False, True, None),))
    if base in ("tex", "tld4", "txq", "suld", "sust", "sured", "suq", "istypep"):
        m = _first_mem(ins)
        return Kind("LDG", FENCE, mem=(_mem_of(m, "generic", True, base in ("sust", "sured"),
                                               None),) if m else ())

    # ---- tensor cores ----------------------------------------------------------------------------
    if base == "mma":
        cls, issue = _mma_issue(mods, TENSOR_FMA_PER_CLK_SMSP)
        return Kind(cls, issue_override=issue)

    # ---- warp-level --------------------------------------------------------------------------------
    if base in ("shfl", "match", "redux"):
        return Kind("SHFL")
    if base == "vote":
        return Kind("VOTE")

    # ---- arithmetic ------------------------------------------------------------------------------
    types = [m for m in mods if m in _TYPE_BYTES]
    t = types[-1] if types else ""
    is_float = t in _FLOAT_TYPES
    if base == "mov":
        if _reads_special(ins):
            return Kind("S2R")
        return Kind("MOV")
    if base in ("fma", "mad", "mad24", "madc"):
        if t == "f64":
            return Kind("DFMA")
        if t in ("f16", "f16x2", "bf16", "bf16x2"):
            return Kind("HFMA2")
        if t == "f32":
            return Kind("FFMA")
        return Kind("IMAD")
    if base in ("mul", "mul24"):
        if t == "f64":
            return Kind("DFMA")
        if t in ("f16", "f16x2", "bf16", "bf16x2"):
            return Kind("HFMA2")
        return Kind("FMUL" if t == "f32" else "IMAD")
    if base in ("add", "sub", "addc", "subc"):
        if t == "f64":
            return Kind("DFMA")
        if t in ("f16", "f16x2", "bf16", "bf16x2"):
            return Kind("HFMA2")
        return Kind("FADD" if t == "f32" else "IADD3")
    if base in ("neg", "abs", "min", "max", "copysign"):
        if t == "f64":
            return Kind("DFMA")
        return Kind("FMNMX" if is_float else "IADD3")
    if base in ("and", "or", "xor", "not", "cnot", "lop3"):
        return Kind("LOP3")
    if base in ("shl", "shr", "shf"):
        return Kind("SHF")
    if base in ("selp", "slct"):
        return Kind("SEL")
    if base in ("setp", "set"):
        return Kind("ISETP")
    if base in ("prmt", "bfe", "bfi", "sad", "dp4a", "dp2a", "szext", "bmsk"):
        return Kind("IMAD" if base in ("dp4a", "dp2a", "sad") else "PRMT")
    if base in ("popc", "clz", "bfind", "brev", "fns"):
        return Kind("POPC")
    if base in ("rcp", "rsqrt", "sqrt", "ex2", "lg2", "sin", "cos", "tanh", "div", "rem"):
        # Integer div/rem are long IMAD/I2F sequences in SASS; modelled as one XU operation.
        return Kind("MUFU")
    if base == "cvt":
        # cvt between integer widths is a move/PRMT; anything involving a float type uses the XU.
        if any(m in _FLOAT_TYPES for m in mods):
            return Kind("CVT")
        return Kind("PRMT")
    if base in ("testp",):
        return Kind("ISETP")
    if base == "nop":
        return Kind("NOP")
    # Anything else: we do not know whether it touches memory, so it keeps its order with every
    # memory operation; its register dependencies still come from defs_and_uses.
    return Kind("OTHER", FENCE, why_fixed=f"unclassified opcode {op}")
