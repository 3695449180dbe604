"""A small PTX interpreter for the CPU tests: runs one kernel's PTX, as asmgemm built it, on numpy
arrays, so that a kernel's arithmetic, indexing, predication, barriers and shuffles are checked
without a GPU. Made for kernels_ptx/gemm_skinny.sasm and extended for mma_gemm.sasm (its tensor-core
path: cp.async, ldmatrix, mma.sync m16n8k16, and the warp scan of its grouped mode: shfl.up/idx,
vote.ballot, popc; and the arrival count of its one-launch split-K: atom.global.inc/add, fence,
membar, bar.red.or.pred); the instructions are the ones handled here, anything else is a clear
NotImplementedError. Not a model of timing or of the memory model: cp.async copies at once (its
groups and waits are checked only for their form; a partial src-size still reads the whole copy,
as compute-sanitizer reports sm_90's LDGSTS.ZFILL doing), mma.sync accumulates in float64 and rounds
once to fp32; blocks run one after another (`run`'s order), so every store of an earlier block
is seen by a later one and fences have nothing to order (they run as no-ops); an atomic is a
read-modify-write per thread in thread order.

Execution: the threads of one cluster (one block without clusters) run together, vectorized over
threads with numpy: each step executes the instruction at the lowest program counter among the
threads still running, for every thread at that counter (so convergent code runs in lockstep and
divergent code reconverges at the lowest counter). `bar.sync` and `barrier.cluster.wait` check
that every running thread of the block (of the cluster) is at that barrier, `shfl.sync` that all
32 lanes of each warp are there: a kernel that could deadlock or read an inactive lane fails.

Memory: global addresses are real host addresses of numpy arrays registered with `Memory.add`; a
load or store outside every registered array is an error (an out-of-bounds access of the kernel).
Shared memory is one zeroed byte array per block, the dynamic `smem` symbol at shared address 0;
`mapa` marks a shared address with the block's rank in its cluster (bit 24 up).

Arithmetic: fp32 adds and multiplies round once (numpy float32); fma.rn is computed in float64
and rounded to fp32 (exact product; the sum may round twice, which no test tolerance sees);
ex2.approx, rcp.approx and div.full are numpy's exact float32 versions (the PTX ones are within
2 ulp)."""
from __future__ import annotations

import collections
import ctypes
import re
from dataclasses import dataclass

import numpy as np

_U64 = np.uint64
# the program counter of a thread that has ended: past every other, so the lowest counter among
# all threads is the lowest among those still running
_DONE_PC = np.iinfo(np.int64).max
_TYPES = {"f32": np.float32, "f16": np.float16, "u32": np.uint32, "s32": np.int32, "b32": np.uint32,
          "u64": np.uint64, "s64": np.int64, "b64": np.uint64, "u16": np.uint16, "b16": np.uint16, "s16": np.int16,
          "bf16": np.uint16, "pred": np.bool_}
_BITS = {"f32": 32, "f16": 16, "u32": 32, "s32": 32, "b32": 32, "u64": 64, "s64": 64, "b64": 64, "u16": 16,
         "b16": 16, "s16": 16, "bf16": 16}
_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal}


class SimError(AssertionError):
    """The kernel did something a GPU would not do well-definedly (or this interpreter lacks)."""


class Memory:
    """Global memory: numpy arrays at their real host addresses."""

    def __init__(self):
        self.regions: list[tuple[int, np.ndarray]] = []

    def add(self, array: np.ndarray) -> int:
        """Register `array` (its whole buffer, base and views alike); returns its address."""
        base = array
        while isinstance(base.base, np.ndarray):
            base = base.base
        if not (base.flags.c_contiguous or base.flags.f_contiguous):
            raise ValueError("register a contiguous base array")
        flat = np.ctypeslib.as_array((ctypes.c_uint8 * base.nbytes).from_address(base.ctypes.data))
        self.regions.append((base.ctypes.data, flat))
        return array.ctypes.data

    def _where(self, addr: np.ndarray, width: int):
        for start, flat in self.regions:
            off = addr.astype(np.int64) - start
            if off.size and (off >= 0).all() and (off + width <= flat.size).all():
                return flat, off
        bad = [int(a) for a in addr if not any(0 <= int(a) - s and int(a) - s + width <= f.size
                                                for s, f in self.regions)]
        raise SimError(f"global access of {width} bytes outside every array: {[hex(b) for b in bad[:4]]}")

    def load(self, addr: np.ndarray, width: int) -> np.ndarray:
        if addr.size == 0:
            return np.zeros((0, width), np.uint8)
        flat, off = self._where(addr, width)
        return flat[off[:, None] + np.arange(width)]

    def store(self, addr: np.ndarray, data: np.ndarray) -> None:
        if addr.size == 0:
            return
        width = data.shape[1]
        flat, off = self._where(addr, width)
        idx = off[:, None] + np.arange(width)
        if len(np.unique(off)) != len(off):
            raise SimError("two threads store to one address in one instruction")
        flat[idx] = data


@dataclass
class Instr:
    line: int
    text: str
    guard: str | None       # predicate name, '!' prefixed when negated
    op: str
    parts: list[str]        # the opcode split at '.'
    args: list[str]


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round to nearest even (NaN: the canonical quiet NaN)."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + _U64(0x7FFF) + ((u >> _U64(16)) & _U64(1))) >> _U64(16)).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


# a warp's lane l as the fragment layouts index it: g = l / 4 (its row group), t = l % 4
_LANE_G = np.arange(32) // 4
_LANE_T = np.arange(32) % 4


def _halves_to_f32(bits: np.ndarray, bf16: bool) -> np.ndarray:
    """16-bit patterns (fp16 or bf16) as float32 values."""
    bits = bits.astype(np.uint16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32) if bf16 else bits.view(np.float16).astype(
        np.float32)


def _split_args(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


class Kernel:
    """One .entry of a PTX module."""

    def __init__(self, ptx: str, entry: str | None = None):
        m = re.search(r"\.entry\s+(\w+)\s*\((.*?)\)", ptx, re.S)
        if m is None or (entry is not None and m.group(1) != entry):
            raise ValueError("no such entry")
        self.name = m.group(1)
        self.params = re.findall(r"\.param\s+\.(\w+)\s+(\w+)", m.group(2))
        body = ptx[m.end():]
        body = body[body.index("{") + 1: body.rindex("}")]
        self.reg_types: dict[str, str] = {}
        self.code: list[Instr] = []
        self.labels: dict[str, int] = {}
        for n, raw in enumerate(body.split("\n")):
            line = raw.split("//")[0].strip()
            if not line:
                continue
            if line.startswith(".reg"):
                rm = re.match(r"\.reg\s+\.(\w+)\s+(.*);", line)
                for name in _split_args(rm.group(2)):
                    rng = re.match(r"([%\w]+)<(\d+)>$", name)
                    names = [f"{rng.group(1)}{i}" for i in range(int(rng.group(2)))] if rng else [name]
                    for x in names:
                        self.reg_types[x] = rm.group(1)
                continue
            if line.startswith("."):
                continue
            lm = re.match(r"^([A-Za-z_$][\w$]*):$", line)
            if lm:
                self.labels[lm.group(1)] = len(self.code)
                continue
            im = re.match(r"^(?:@(!?[%\w]+)\s+)?([\w.:]+)\s*(.*?);$", line)
            if im is None:
                raise ValueError(f"cannot read PTX line: {line!r}")
            op = im.group(2)
            self.code.append(Instr(n, line, im.group(1), op.split(".")[0], op.split("."), _split_args(im.group(3))))

    # ---- running ----------------------------------------------------------------------------------
    def run(self, grid, block, args: dict, memory: Memory, smem_bytes: int = 0, cluster: tuple = (1, 1, 1),
            max_steps: int = 5_000_000, order=None, issued=None) -> None:
        """Every block (cluster) of the grid, one after another: z outermost, then y, then x, or
        in `order` (a sequence of (x, y, z) block indices, each once: the order blocks happen to
        finish in, for kernels whose result must not depend on it). `issued`: a Counter that gets
        each instruction's index in `code` once for every warp that executes it, predicated off or
        not (what the SM issues, as ncu's inst_executed counts); by opcode: by_opcode(issued)."""
        names = [n for _, n in self.params]
        missing = [n for n in names if n.removeprefix("param_") not in args]
        if missing:
            raise ValueError(f"arguments missing: {missing}")
        cz = cluster[2]
        if cluster[0] != 1 or cluster[1] != 1 or grid[2] % cz:
            raise ValueError("clusters of (1, 1, S) along grid z only")
        every = [(bx, by, bz) for bz in range(0, grid[2], cz) for by in range(grid[1]) for bx in range(grid[0])]
        if order is not None:
            if sorted(order) != sorted(every):
                raise ValueError("order: each block of the grid once")
            every = list(order)
        for ctaid in every:
            _Run(self, ctaid, cz, block[0], args, memory, smem_bytes, max_steps, grid, issued).go()


    def by_opcode(self, issued) -> collections.Counter:
        """An `issued` count (run()) summed by opcode, modifiers included ('cp.async.ca.shared.global')."""
        out = collections.Counter()
        for pc, warps in issued.items():
            out[".".join(self.code[pc].parts)] += warps
        return out


class _Run:
    """One cluster of blocks (bx, by, bz .. bz + cz - 1) of `threads` threads each."""

    def __init__(self, k: Kernel, ctaid, cz, threads, args, memory, smem_bytes, max_steps, grid, issued=None):
        self.k, self.mem, self.args, self.max_steps = k, memory, args, max_steps
        self.issued = issued
        self.nt = threads
        self.T = T = cz * threads
        self.rank = np.repeat(np.arange(cz), threads).astype(_U64)
        self.tid = np.tile(np.arange(threads), cz).astype(_U64)
        self.ctaid = (ctaid[0], ctaid[1], ctaid[2])
        self.cz = cz
        self.grid = tuple(grid)
        self.smem = [np.zeros(max(smem_bytes, 16), np.uint8) for _ in range(cz)]
        self.regs: dict[str, np.ndarray] = {}
        for name, t in k.reg_types.items():
            self.regs[name] = np.zeros(T, np.bool_ if t == "pred" else _U64)
        self.pc = np.zeros(T, np.int64)
        self._imm: dict = {}
        self.done = np.zeros(T, np.bool_)

    # values: every register holds raw bits in a uint64 (predicates: bool)
    def _special(self, name: str) -> np.ndarray:
        if name == "%tid.x":
            return self.tid.copy()
        if name in ("%tid.y", "%tid.z"):
            return np.zeros(self.T, _U64)
        if name.startswith("%ctaid."):
            axis = "xyz".index(name[-1])
            v = np.full(self.T, self.ctaid[axis], _U64)
            return v + self.rank if axis == 2 else v
        if name.startswith("%nctaid."):
            return np.full(self.T, self.grid["xyz".index(name[-1])], _U64)
        if name == "%ntid.x":
            return np.full(self.T, self.nt, _U64)
        if name == "%cluster_ctarank":
            return self.rank.copy()
        if name == "%laneid":
            return self.tid % _U64(32)
        raise NotImplementedError(name)

    def bits(self, operand: str, t: str) -> np.ndarray:
        """The operand's raw bits (uint64 per thread) read as type t (immediates in t's encoding)."""
        if operand in self.regs:
            return self.regs[operand]
        key = (operand, t)
        if key not in self._imm:
            self._imm[key] = self._immediate(operand, t)
        return self._imm[key]

    def _immediate(self, operand: str, t: str) -> np.ndarray:
        if operand.startswith("%"):
            return self._special(operand)
        if operand == "smem":
            return np.zeros(self.T, _U64)
        if re.fullmatch(r"0[fF][0-9a-fA-F]{8}", operand):
            return np.full(self.T, int(operand[2:], 16), _U64)
        if re.fullmatch(r"-?(0[xX][0-9a-fA-F]+|\d+)[Uu]?", operand):
            v = int(operand.rstrip("Uu"), 0)
            return np.full(self.T, v & ((1 << _BITS.get(t, 64)) - 1), _U64)
        if re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", operand) and t == "f32":
            return np.full(self.T, np.float32(float(operand)).view(np.uint32), _U64)
        raise NotImplementedError(f"operand {operand!r}")

    def val(self, operand: str, t: str) -> np.ndarray:
        """The operand as a numpy array of type t."""
        if t == "pred":
            neg = operand.startswith("!")
            v = self.regs[operand.lstrip("!")]
            return ~v if neg else v
        b = self.bits(operand, t)
        n = _BITS[t]
        raw = (b & _U64((1 << n) - 1)) if n < 64 else b
        if n == 64:
            return raw.view(np.int64) if t == "s64" else raw
        if n == 32:
            u = raw.astype(np.uint32)
            return u.view(np.float32) if t == "f32" else (u.view(np.int32) if t == "s32" else u)
        u = raw.astype(np.uint16)
        return u.view(np.float16) if t == "f16" else (u.view(np.int16) if t == "s16" else u)

    def put(self, reg: str, value: np.ndarray, mask: np.ndarray, t: str) -> None:
        if reg not in self.regs:
            raise NotImplementedError(f"destination {reg!r}")
        if t == "pred":
            self.regs[reg][mask] = np.asarray(value, np.bool_)[mask] if np.ndim(value) else bool(value)
            return
        n = _BITS[t]
        value = np.asarray(value)
        if value.ndim == 0:
            value = np.full(self.T, value)
        if n == 64:
            raw = value.astype(np.int64).view(_U64) if value.dtype.kind == "i" else value.astype(_U64)
        elif n == 32:
            v = value.astype(np.float32) if t == "f32" else value
            raw = (v.view(np.uint32) if v.dtype.itemsize == 4 else v.astype(np.int64).astype(np.uint32)).astype(_U64)
        else:
            v = value.astype(np.float16) if t == "f16" else value
            raw = (v.view(np.uint16) if v.dtype.itemsize == 2 else v.astype(np.int64).astype(np.uint16)).astype(_U64)
        self.regs[reg][mask] = raw[mask]

    def address(self, operand: str) -> np.ndarray:
        m = re.fullmatch(r"\[([%\w]+)(?:\+(-?\w+))?\]", operand)
        if m is None:
            raise NotImplementedError(f"address {operand!r}")
        base = self.bits(m.group(1), "u64")
        return base + _U64(int(m.group(2), 0) & (2 ** 64 - 1)) if m.group(2) else base

    def vec_regs(self, operand: str) -> list[str]:
        return [x.strip() for x in operand.strip("{}").split(",")]

    # ---- the scheduler -------------------------------------------------------------------------
    def go(self) -> None:
        code = self.k.code
        for _ in range(self.max_steps):
            pc = self.pc.min()                  # (a finished thread's counter is _DONE_PC)
            if pc == _DONE_PC:
                return
            sel = self.pc == pc
            if pc >= len(code):
                raise SimError("ran past the end of the kernel")
            ins = code[pc]
            if self.issued is not None:
                warps = np.unique((self.rank * _U64(self.nt) + self.tid)[sel] // _U64(32))
                self.issued[pc] += len(warps)
            mask = sel
            if ins.guard is not None:
                g = self.val(ins.guard, "pred")
                mask = sel & g
            nxt = self.step(ins, mask, sel)
            if nxt is None:
                self.pc[sel] = pc + 1
        raise SimError("step limit reached (a kernel that does not end?)")

    def _all_here(self, sel: np.ndarray, what: str, per_block: bool) -> None:
        live = ~self.done
        groups = self.rank if per_block else np.zeros(self.T, _U64)
        for g in np.unique(groups[sel]):
            inside = groups == g
            if (live & inside & ~sel).any():
                raise SimError(f"{what}: not every running thread of the {'block' if per_block else 'cluster'} is there")

    def step(self, ins: Instr, mask: np.ndarray, sel: np.ndarray):
        op, p, a = ins.op, ins.parts, ins.args
        t = p[-1]
        if op == "bra":
            target = self.k.labels[a[0]]
            self.pc[mask] = target
            self.pc[sel & ~mask] += 1
            return True
        if op == "ret" or op == "exit":
            self.done[mask] = True
            self.pc[sel & ~mask] += 1
            self.pc[mask] = _DONE_PC
            return True
        if op == "bar":
            if p[1] == "warp":                  # bar.warp.sync: the warp's 32 lanes
                self._warp_all_here(ins, sel, sel)
                return None
            self._all_here(sel, ins.text, per_block=True)
            if p[1] == "red":                   # bar.red.or.pred d, barrier, c: d = c of any thread
                if p[2:] != ["or", "pred"]:
                    raise NotImplementedError(ins.text)
                c = self.val(a[2], "pred")
                for r in np.unique(self.rank[sel]):
                    block = sel & (self.rank == r)
                    self.put(a[0], np.full(self.T, bool((c & block).any())), block, "pred")
            return None
        if op in ("fence", "membar"):
            return None                         # blocks run one after another: nothing to order
        if op == "atom":
            return self._atom(ins, mask)
        if op == "cp":
            return self._cp_async(ins, mask)
        if op == "ldmatrix":
            return self._ldmatrix(ins, mask, sel)
        if op == "mma":
            return self._mma(ins, mask, sel)
        if op == "vote":
            return self._vote(ins, mask, sel)
        if op == "popc":
            x = self.val(a[1], "u32").astype(np.uint64)
            count = np.zeros(self.T, np.uint64)
            for i in range(32):
                count += (x >> np.uint64(i)) & np.uint64(1)
            self.put(a[0], count.astype(np.uint32), mask, "u32")
            return None
        if op == "bfe" and t == "u32":
            x = self.val(a[1], "u32").astype(_U64)
            pos, length = self.val(a[2], "u32").astype(_U64), self.val(a[3], "u32").astype(_U64)
            r = (x >> np.minimum(pos, _U64(31))) & ((_U64(1) << np.minimum(length, _U64(32))) - _U64(1))
            self.put(a[0], r.astype(np.uint32), mask, "u32")
            return None
        if op == "barrier":
            if p[1] != "cluster":
                raise NotImplementedError(ins.text)
            if p[2] == "wait":
                self._all_here(sel, ins.text, per_block=False)
            return None
        if op == "ld":
            return self._ld(ins, mask)
        if op == "st":
            return self._st(ins, mask)
        if op == "mov":
            if a[0].startswith("{"):           # unpack: mov.b32 {lo, hi}, r
                dst = self.vec_regs(a[0])
                src = self.bits(a[1], t)
                w = _BITS[t] // len(dst)
                for i, d in enumerate(dst):
                    self.put(d, ((src >> _U64(w * i)) & _U64((1 << w) - 1)).astype(np.uint16 if w == 16 else np.uint32),
                             mask, "b16" if w == 16 else "b32")
                return None
            if a[1].startswith("{"):           # pack: mov.b32 r, {lo, hi}
                src = self.vec_regs(a[1])
                w = _BITS[t] // len(src)
                out = np.zeros(self.T, _U64)
                for i, s in enumerate(src):
                    out |= (self.bits(s, "b16" if w == 16 else "b32") & _U64((1 << w) - 1)) << _U64(w * i)
                self.put(a[0], out.astype(np.uint32) if _BITS[t] == 32 else out, mask, t)
                return None
            self.put(a[0], self.val(a[1], t), mask, t)
            return None
        if op == "cvta":
            self.put(a[0], self.val(a[1], t), mask, t)
            return None
        if op == "cvt":
            return self._cvt(ins, mask)
        if op == "setp":
            cmp = p[1]
            x, y = self.val(a[1], t), self.val(a[2], t)
            if cmp == "neu":
                r = (x != y) | np.isnan(x) | np.isnan(y)
            elif cmp in _CMP:
                r = _CMP[cmp](x, y)
            else:
                raise NotImplementedError(ins.text)
            if len(p) == 4:                     # setp.cmp.bool.type p, a, b, c
                c = self.val(a[3], "pred")
                r = {"and": r & c, "or": r | c, "xor": r ^ c}[p[2]]
            self.put(a[0], r, mask, "pred")
            return None
        if op == "selp":
            c = self.val(a[3], "pred")
            self.put(a[0], np.where(c, self.val(a[1], t), self.val(a[2], t)), mask, t)
            return None
        if op == "shfl":
            return self._shfl(ins, mask, sel)
        if op == "mapa":
            addr = self.val(a[1], "u32").astype(_U64)
            rank = self.val(a[2], "u32").astype(_U64)
            self.put(a[0], ((rank + _U64(1)) << _U64(24)) | addr, mask, "u32")
            return None
        if op == "prmt":
            return self._prmt(ins, mask)
        if op in ("and", "or", "xor") and t == "pred":
            x, y = self.val(a[1], "pred"), self.val(a[2], "pred")
            self.put(a[0], {"and": x & y, "or": x | y, "xor": x ^ y}[op], mask, "pred")
            return None
        return self._alu(ins, mask)

    def _alu(self, ins: Instr, mask):
        op, p, a = ins.op, ins.parts, ins.args
        t = p[-1]
        if t == "f32":
            x = [self.val(s, "f32") for s in a[1:]]
            with np.errstate(all="ignore"):
                if op == "fma":
                    r = (x[0].astype(np.float64) * x[1].astype(np.float64) + x[2].astype(np.float64)).astype(np.float32)
                elif op == "add":
                    r = x[0] + x[1]
                elif op == "sub":
                    r = x[0] - x[1]
                elif op == "mul":
                    r = x[0] * x[1]
                elif op == "div":
                    r = x[0] / x[1]
                elif op == "rcp":
                    r = np.float32(1) / x[0]
                elif op == "ex2":
                    r = np.exp2(x[0])
                elif op == "neg":
                    r = -x[0]
                elif op == "abs":
                    r = np.abs(x[0])
                elif op in ("min", "max"):
                    r = np.fmin(x[0], x[1]) if op == "min" else np.fmax(x[0], x[1])
                else:
                    raise NotImplementedError(ins.text)
            self.put(a[0], r, mask, "f32")
            return None
        # integers: computed in Python ints' width through int64/uint64 with wrap-around
        if op == "mul" and p[1] == "wide":
            src = t
            dst = {"u32": "u64", "s32": "s64"}[src]
            r = self.val(a[1], src).astype(np.int64) * self.val(a[2], src).astype(np.int64)
            self.put(a[0], r, mask, dst)
            return None
        if op == "mad" and p[1] == "wide":
            src = t
            dst = {"u32": "u64", "s32": "s64"}[src]
            r = (self.val(a[1], src).astype(np.int64) * self.val(a[2], src).astype(np.int64)).view(_U64)
            r = r + self.val(a[3], dst).astype(np.int64).view(_U64) if dst == "s64" else r + self.val(a[3], dst)
            self.put(a[0], r, mask, dst)
            return None
        n = _BITS[t]
        modulus = _U64((1 << n) - 1) if n < 64 else None

        def u(s):
            v = self.bits(s, t)
            return v & modulus if modulus is not None else v

        def s_(s):
            v = self.val(s, t)
            return v.astype(np.int64)
        with np.errstate(all="ignore"):
            if op in ("add", "sub", "mul", "mad", "and", "or", "xor", "shl", "not", "neg"):
                x = [u(s) for s in a[1:]]
                if op == "neg":
                    r = _U64(0) - x[0]
                elif op == "add":
                    r = x[0] + x[1]
                elif op == "sub":
                    r = x[0] - x[1]
                elif op == "mul":
                    if p[1] != "lo":
                        raise NotImplementedError(ins.text)
                    r = x[0] * x[1]
                elif op == "mad":
                    if p[1] != "lo":
                        raise NotImplementedError(ins.text)
                    r = x[0] * x[1] + x[2]
                elif op == "and":
                    r = x[0] & x[1]
                elif op == "or":
                    r = x[0] | x[1]
                elif op == "xor":
                    r = x[0] ^ x[1]
                elif op == "not":
                    r = ~x[0]
                else:           # shl: amounts past the width give 0
                    amt = self.val(a[2], "u32").astype(_U64)
                    r = np.where(amt >= n, _U64(0), x[0] << np.minimum(amt, _U64(63)))
                r = r & modulus if modulus is not None else r
                self.put(a[0], r.astype(np.uint32) if n == 32 else r, mask, t)
                return None
            if op == "shr":
                amt = self.val(a[2], "u32").astype(np.int64)
                if t.startswith("s"):
                    v = s_(a[1])
                    r = v >> np.minimum(amt, n - 1)
                else:
                    v = u(a[1])
                    r = np.where(amt >= n, _U64(0), v >> np.minimum(amt, 63).astype(_U64))
                self.put(a[0], r, mask, t)
                return None
            if op == "shf":
                # shf.{l,r}.{clamp,wrap}.b32 d, a, b, c: the 64 bits b:a shifted by c (clamp: at
                # most 32; wrap: c mod 32), d = the high (l) or low (r) word
                if n != 32 or p[1] not in ("l", "r") or p[2] not in ("clamp", "wrap"):
                    raise NotImplementedError(ins.text)
                lo, hi = u(a[1]), u(a[2])
                amt = self.val(a[3], "u32").astype(_U64)
                amt = np.minimum(amt, _U64(32)) if p[2] == "clamp" else amt & _U64(31)
                both = (hi << _U64(32)) | lo
                r = (both >> amt) if p[1] == "r" else ((both << amt) >> _U64(32))
                self.put(a[0], (r & _U64(0xFFFFFFFF)).astype(np.uint32), mask, t)
                return None
            if op in ("min", "max", "div", "rem"):
                if t.startswith("s"):
                    x, y = s_(a[1]), s_(a[2])
                else:
                    x, y = u(a[1]), u(a[2])
                if op == "min":
                    r = np.minimum(x, y)
                elif op == "max":
                    r = np.maximum(x, y)
                else:
                    if (y[mask] == 0).any():
                        raise SimError(f"{ins.text}: division by zero")
                    y = np.where(y == 0, 1, y)
                    r = x // y if op == "div" else x % y
                self.put(a[0], r, mask, t)
                return None
        raise NotImplementedError(ins.text)

    def _prmt(self, ins: Instr, mask):
        """prmt.b32 d, a, b, c (the default mode; PTX ISA, "prmt"): the bytes of b:a are numbered 0..7
        (a's low byte 0, b's high byte 7); byte i of d is byte (c >> 4 i) & 7 of them, or that byte's
        sign (its bit 7 copied into all 8 bits) where bit 3 of the nibble is set."""
        p, a = ins.parts, ins.args
        if p[1:] != ["b32"]:
            raise NotImplementedError(ins.text)
        pool = self.bits(a[1], "b32") & _U64(0xFFFFFFFF) | (self.bits(a[2], "b32") & _U64(0xFFFFFFFF)) << _U64(32)
        c = self.bits(a[3], "b32")
        out = np.zeros(self.T, _U64)
        for i in range(4):
            nibble = (c >> _U64(4 * i)) & _U64(0xF)
            byte = (pool >> ((nibble & _U64(7)) * _U64(8))) & _U64(0xFF)
            byte = np.where(nibble & _U64(8), np.where(byte & _U64(0x80), _U64(0xFF), _U64(0)), byte)
            out |= byte << _U64(8 * i)
        self.put(a[0], out.astype(np.uint32), mask, "b32")
        return None

    def _cvt(self, ins: Instr, mask):
        p, a = ins.parts, ins.args
        dst, src = p[-2], p[-1]
        if dst in ("f16x2", "bf16x2") and src == "f32":      # d = {cvt(a) high, cvt(b) low}
            halves = []
            for operand in a[1:3]:
                v = self.val(operand, "f32")
                halves.append(v.astype(np.float16).view(np.uint16).astype(_U64) if dst == "f16x2" else
                              _bf16_bits(v).astype(_U64))
            self.put(a[0], ((halves[0] << _U64(16)) | halves[1]).astype(np.uint32), mask, "b32")
            return None
        x = self.val(a[1], src if src != "bf16" else "b16")
        if dst == "f32" and src == "bf16":
            self.put(a[0], (x.astype(np.uint32) << np.uint32(16)).view(np.float32), mask, "f32")
            return None
        if dst == "f32" and src == "f16":
            r = x.astype(np.float32)
        elif dst == "f16" and src == "f32":
            r = x.astype(np.float16)             # round to nearest even
        elif dst == "bf16" and src == "f32":
            self.put(a[0], _bf16_bits(x), mask, "b16")
            return None
        elif dst in ("u32", "u64", "u16", "s32", "s64") and src in ("u32", "u64", "u16", "s32", "s64", "b16"):
            r = x.astype(np.int64) if src.startswith("s") else x.astype(_U64)
            n = _BITS[dst]
            if n < 64:
                r = r.astype(np.int64).astype(_U64) & _U64((1 << n) - 1)
        else:
            raise NotImplementedError(ins.text)
        self.put(a[0], r, mask, dst)
        return None

    def _space(self, p: list[str]) -> str:
        for x in p[1:]:
            if x in ("global", "shared", "param", "shared::cluster", "shared::cta", "local"):
                return x
        return "generic"

    def _ld(self, ins: Instr, mask):
        p, a = ins.parts, ins.args
        t = p[-1]
        space = self._space(p)
        nvec = int(p[-2][1:]) if p[-2] in ("v2", "v4") else 1
        dsts = self.vec_regs(a[0]) if nvec > 1 else [a[0]]
        width = _BITS[t] // 8
        if space == "param":
            name = a[1].strip("[]").removeprefix("param_")
            v = self.args[name]
            arr = np.full(self.T, v, dtype=_TYPES[t])
            self.put(a[0], arr, mask, t)
            return None
        idx = np.nonzero(mask)[0]
        if idx.size == 0:
            return None
        addr = self.address(a[1])[idx]
        if space == "global":
            raw = self.mem.load(addr, width * nvec)
        elif space in ("shared", "shared::cta", "shared::cluster"):
            raw = self._shared(idx, addr, width * nvec, cluster=space == "shared::cluster")
        else:
            raise NotImplementedError(ins.text)
        for i, d in enumerate(dsts):
            chunk = raw[:, i * width:(i + 1) * width].copy().view(_TYPES[t] if t != "bf16" else np.uint16).reshape(-1)
            full = np.zeros(self.T, dtype=chunk.dtype)
            full[idx] = chunk
            self.put(d, full, mask, t)
        return None

    def _atom(self, ins: Instr, mask):
        """atom.global.{inc,add}.u32 d, [a], b: per thread in thread order, d = the old value;
        inc stores old >= b ? 0 : old + 1, add old + b."""
        p, a = ins.parts, ins.args
        if self._space(p) != "global" or p[-1] != "u32" or p[-2] not in ("inc", "add"):
            raise NotImplementedError(ins.text)
        idx = np.nonzero(mask)[0]
        addr = self.address(a[1])
        b = self.val(a[2], "u32")
        old = np.zeros(self.T, np.uint32)
        for i in idx:
            at = addr[i:i + 1]
            v = int(self.mem.load(at, 4).copy().reshape(-1).view(np.uint32)[0])
            old[i] = v
            new = (0 if v >= int(b[i]) else v + 1) if p[-2] == "inc" else (v + int(b[i])) & 0xFFFFFFFF
            self.mem.store(at, np.asarray([new], np.uint32).view(np.uint8).reshape(1, 4))
        self.put(a[0], old, mask, "u32")
        return None

    def _shared(self, idx, addr, width, cluster=False, data=None):
        """Read (data None) or write shared memory for threads idx at 32-bit addresses addr."""
        addr = addr & _U64(0xFFFFFFFF)
        rank = self.rank[idx].copy()
        if cluster:
            tag = addr >> _U64(24)
            if (tag == 0).any():
                raise SimError("ld.shared::cluster of an address that mapa did not make")
            rank = tag - _U64(1)
            addr = addr & _U64(0xFFFFFF)
        out = np.zeros((idx.size, width), np.uint8)
        for r in np.unique(rank):
            sel = rank == r
            mem = self.smem[int(r)]
            off = addr[sel].astype(np.int64)
            if (off < 0).any() or (off + width > mem.size).any() or (off % min(width, 16)).any():
                raise SimError(f"shared access of {width} bytes out of range or misaligned: {off[:4]}")
            if data is None:
                out[sel] = mem[off[:, None] + np.arange(width)]
            else:
                mem[off[:, None] + np.arange(width)] = data[sel]
        return out

    def _st(self, ins: Instr, mask):
        p, a = ins.parts, ins.args
        t = p[-1]
        space = self._space(p)
        nvec = int(p[-2][1:]) if p[-2] in ("v2", "v4") else 1
        srcs = self.vec_regs(a[1]) if nvec > 1 else [a[1]]
        width = _BITS[t] // 8
        idx = np.nonzero(mask)[0]
        if idx.size == 0:
            return None
        addr = self.address(a[0])[idx]
        data = np.concatenate([self.val(s, t)[idx].astype(_TYPES[t] if t != "bf16" else np.uint16)
                               .view(np.uint8).reshape(idx.size, width) for s in srcs], axis=1)
        if space == "global":
            self.mem.store(addr, data)
        elif space in ("shared", "shared::cta"):
            self._shared(idx, addr, width * nvec, data=data)
        else:
            raise NotImplementedError(ins.text)
        return None

    def _warp_all_here(self, ins: Instr, sel, mask) -> None:
        """SimError unless all 32 lanes of every warp at this instruction take part."""
        warps = (self.rank * _U64(self.nt) + self.tid) // _U64(32)
        for w in np.unique(warps[sel]):
            if not (sel[warps == w]).all() or not (mask[warps == w]).all():
                raise SimError(f"{ins.text}: not all 32 lanes of a warp take part")

    def _shfl(self, ins: Instr, mask, sel):
        p, a = ins.parts, ins.args
        if p[1] != "sync" or p[2] not in ("bfly", "up", "idx") or p[3] != "b32":
            raise NotImplementedError(ins.text)
        clamp = {"bfly": 0x1F, "idx": 0x1F, "up": 0}[p[2]]
        if int(a[3], 0) != clamp or int(a[4], 0) & 0xFFFFFFFF != 0xFFFFFFFF:
            raise NotImplementedError(ins.text)
        self._warp_all_here(ins, sel, mask)
        src = self.bits(a[1], "b32")
        b = self.val(a[2], "u32").astype(_U64) & _U64(31)
        gid = self.rank * _U64(self.nt) + self.tid
        lane = gid & _U64(31)
        if p[2] == "bfly":
            partner = (gid & ~_U64(31)) | (lane ^ b)
        elif p[2] == "idx":
            partner = (gid & ~_U64(31)) | b
        else:                                   # up: lanes below b keep their own value
            partner = np.where(lane >= b, gid - b, gid)
        out = src[partner.astype(np.int64)]
        self.put(a[0], out.astype(np.uint32), mask, "b32")
        return None

    def _vote(self, ins: Instr, mask, sel):
        p, a = ins.parts, ins.args
        if p[1:] != ["sync", "ballot", "b32"] or int(a[2], 0) & 0xFFFFFFFF != 0xFFFFFFFF:
            raise NotImplementedError(ins.text)
        self._warp_all_here(ins, sel, mask)
        pred = self.val(a[1], "pred")
        gid = (self.rank * _U64(self.nt) + self.tid).astype(np.int64)
        bits = (pred.astype(_U64) << (gid.astype(_U64) & _U64(31)))
        out = np.zeros(self.T, _U64)
        for w in np.unique(gid // 32):
            lanes = gid // 32 == w
            out[lanes] = np.bitwise_or.reduce(bits[lanes])
        self.put(a[0], out.astype(np.uint32), mask, "b32")
        return None

    def _cp_async(self, ins: Instr, mask):
        """cp.async.{ca,cg}.shared.global [dst], [src], size[, src_size]: copied at once; the bytes
        past src_size are zero (not read); commit_group / wait_group: nothing to do."""
        p, a = ins.parts, ins.args
        if p[1] != "async":
            raise NotImplementedError(ins.text)
        if p[2] in ("commit_group", "wait_group", "wait_all"):
            return None
        if p[2] not in ("ca", "cg") or p[3:5] != ["shared", "global"]:
            raise NotImplementedError(ins.text)
        size = int(a[2], 0)
        if (p[2] == "cg" and size != 16) or size not in (4, 8, 16):
            raise SimError(f"{ins.text}: cp.async.{p[2]} of {size} bytes")
        idx = np.nonzero(mask)[0]
        if idx.size == 0:
            return None
        dst = self.address(a[0])[idx]
        src = self.address(a[1])[idx]
        src_size = self.val(a[3], "u32")[idx].astype(np.int64) if len(a) > 3 else np.full(idx.size, size)
        if (src_size > size).any() or (src_size < 0).any():
            raise SimError(f"{ins.text}: src-size outside 0..{size}")
        if (src % _U64(size)).any():
            raise SimError(f"{ins.text}: global address not aligned to {size} bytes")
        data = np.zeros((idx.size, size), np.uint8)
        for width in sorted(set(src_size.tolist())):
            if width == 0:
                continue
            rows = np.nonzero(src_size == width)[0]
            # a partial src-size still reads all cp-size bytes (sm_90's LDGSTS.ZFILL takes a
            # predicate, not a size: compute-sanitizer memcheck reports a 16-byte read there on the
            # H200), so the whole source must lie inside an array; only its first src-size bytes land
            data[rows, :width] = self.mem.load(src[rows], size)[:, :width]
        self._shared(idx, dst, size, data=data)
        return None

    def _warp_ids(self, sel):
        gid = (self.rank * _U64(self.nt) + self.tid).astype(np.int64)
        return [np.nonzero(gid // 32 == w)[0] for w in np.unique(gid[sel] // 32)]

    def _ldmatrix(self, ins: Instr, mask, sel):
        """ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: lanes 8q .. 8q + 7 give the rows of
        matrix q; lane l gets, in register q, row l / 4's elements 2 (l % 4) and + 1 (of the
        transpose with .trans), the lower column in the low half."""
        p, a = ins.parts, ins.args
        count = int(next(x for x in p if x in ("x1", "x2", "x4"))[1:])
        trans = "trans" in p
        self._warp_all_here(ins, sel, mask)
        dsts = self.vec_regs(a[0])
        addr = self.address(a[1])
        g, t2 = _LANE_G, 2 * _LANE_T           # lane l gets row l / 4, columns 2 (l % 4) and + 1
        for lanes in self._warp_ids(sel):
            out = []
            for q in range(count):
                rows = self._shared(lanes[8 * q: 8 * q + 8], addr[lanes[8 * q: 8 * q + 8]], 16)
                mat = rows.view(np.uint16).reshape(8, 8)
                if trans:
                    mat = mat.T
                out.append(mat[g, t2].astype(_U64) | (mat[g, t2 + 1].astype(_U64) << _U64(16)))
            for q, d in enumerate(dsts):
                full = self.regs[d].copy()
                full[lanes] = out[q]
                self.regs[d][:] = full
        return None

    def _mma(self, ins: Instr, mask, sel):
        """mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (PTX ISA, "Matrix Fragments
        for mma.m16n8k16"): g = lane / 4, t = lane % 4; A: a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..),
        a3 (g + 8, 2t + 8..); B: b0 (k 2t.., n g), b1 (k 2t + 8.., n g); C, D: c0, c1 (g, 2t, 2t + 1),
        c2, c3 (g + 8, 2t, 2t + 1)."""
        p, a = ins.parts, ins.args
        if "m16n8k16" not in p or p[-4] != "f32" or p[-1] != "f32" or p[-3] not in ("f16", "bf16"):
            raise NotImplementedError(ins.text)
        bf16 = p[-3] == "bf16"
        self._warp_all_here(ins, sel, mask)
        d, ar, br, cr = (self.vec_regs(x) for x in a)
        g, t2 = _LANE_G, 2 * _LANE_T           # (whole warps at once: one numpy gather per fragment)
        for lanes in self._warp_ids(sel):
            A = np.zeros((16, 16), np.float64)
            B = np.zeros((16, 8), np.float64)
            C = np.zeros((16, 8), np.float64)
            for i, (r, c) in enumerate(((g, t2), (g + 8, t2), (g, t2 + 8), (g + 8, t2 + 8))):
                w = self.regs[ar[i]][lanes]
                A[r, c] = _halves_to_f32(w & _U64(0xFFFF), bf16)
                A[r, c + 1] = _halves_to_f32(w >> _U64(16) & _U64(0xFFFF), bf16)
            for i, k0 in enumerate((t2, t2 + 8)):
                w = self.regs[br[i]][lanes]
                B[k0, g] = _halves_to_f32(w & _U64(0xFFFF), bf16)
                B[k0 + 1, g] = _halves_to_f32(w >> _U64(16) & _U64(0xFFFF), bf16)
            cd = ((g, t2), (g, t2 + 1), (g + 8, t2), (g + 8, t2 + 1))
            for i, (r, c) in enumerate(cd):
                C[r, c] = self.regs[cr[i]][lanes].astype(np.uint32).view(np.float32)
            D = (A @ B + C).astype(np.float32)
            for i, (r, c) in enumerate(cd):
                self.regs[d[i]][lanes] = D[r, c].view(np.uint32).astype(_U64)
        return None


def array_at_end(shape, dtype, fill=0.0, keep=None):
    """A new array whose registered memory (Memory.add) ends exactly at its last byte, its data
    starting at a multiple of 256 bytes: a kernel that reads one byte past it fails (an
    aligned_array's memory runs on to its buffer's end). The buffer it lives in is appended to
    `keep` (a list the caller holds while the kernel runs): the array does not own it."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 256, np.uint8)
    start = raw.ctypes.data + (-raw.ctypes.data % 256)
    out = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(start)).view(dtype).reshape(shape)
    out[...] = fill
    if keep is None:
        raise ValueError("pass a list to keep the buffer alive")
    keep.append(raw)
    return out


def matrix_at_end(rows, cols, ld, dtype, keep, lead=0, seed=0):
    """A rows x cols matrix of leading dimension ld starting `lead` elements into a buffer that ends
    at its last element (array_at_end: a read past it fails), uniform in [-1, 1): (the buffer, the
    matrix's values in float64). The buffer is appended to `keep`."""
    count = lead + (rows - 1) * ld + cols
    buf = array_at_end((count,), dtype, keep=keep)
    buf[...] = np.random.default_rng(seed).uniform(-1, 1, count)
    idx = lead + np.arange(rows)[:, None] * ld + np.arange(cols)[None, :]
    return buf, buf.astype(np.float64)[idx]


def aligned_array(shape, dtype, fill=0.0):
    """A new array whose data starts at a multiple of 256 bytes (as GPU allocators give), for a
    kernel's operands in Memory."""
    count = int(np.prod(shape))
    raw = np.empty(count * np.dtype(dtype).itemsize + 256, np.uint8)
    start = -raw.ctypes.data % 256
    out = raw[start:start + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
    out[...] = fill
    return out
