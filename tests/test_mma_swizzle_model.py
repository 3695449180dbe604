"""The shared-memory layout of the portable tensor-core GEMM (kernels_ptx/mma_gemm.sasm and its
macros in kernels_ptx/mma_sync.inc) as a CPU model, written from the kernel's comments:

  * SWIZZLE_OFFSET: the 16-byte chunk of byte offset o is XORed with bits S..S+2 of o,
    S = log2(max(RB, 128)) for tile rows of RB bytes;
  * COPY_TILE: thread t copies chunk c = t % CPR of tile rows t // CPR + i * RSTEP (CPR = RB / ALIGN
    chunks of ALIGN bytes a row, RSTEP = THREADS / CPR), to the swizzled offset of its linear one;
  * LDSM_SETUP: lanes 8q .. 8q + 7 give the rows of matrix q of an ldmatrix.x4; matrix q's origin
    is (mn 8h, k 8u) for A and (mn 8u, k 8h) for B (h = q % 2, u = q / 2); lane r of the eight gives
    row mn + r of a K-major tile, row k + r of an MN-major one (read with .trans);
  * the fragments: A's LDSM_X4 d0..d3 are mma.m16n8k16's a0..a3, B's d0, d1 are b0, b1 of the
    block's first 8 columns and d2, d3 those of the next 8;
  * EPI_SWIZZLE: each warp stages 16 rows of WN floats, rows padded by 8 floats, lane writes row
    lane / 4, columns 8j + 2 (lane % 4) (8 bytes), and the 16-byte chunks c and c ^ 1 of a row trade
    places where bit 3 of c is set; lanes read back EV consecutive columns of a row (one or two
    16-byte chunks).

What the model checks: (a) bank-conflict freedom: every 8-lane phase of an ldmatrix and every
8-thread group of 16-byte cp.async writes touch 8 different 16-byte bank groups (address / 16 % 8),
and the narrower copies (8, 4, 2 bytes) and the epilogue's 8-byte writes (half warps) and 16-byte
reads (quarter warps) hit no bank twice;
(b) the data mapping: a tile whose elements are their own (mn, k) coordinates, copied by the
modelled cp.async into a byte-addressed shared memory and read back by the modelled ldmatrix (PTX
ISA 9.7.9.22: thread `lane` receives row lane / 4, elements 2 (lane % 4) and +1 of each 8 x 8
matrix; transposed with .trans), gives each lane exactly the mma.m16n8k16 A and B fragments (PTX
ISA 9.7.14.5.8); and the epilogue staging is a bijection whose read-back returns what each lane
wrote.

The model is tied to the kernel: the kernel's own PTX is run by a small interpreter over every
thread of one block (integer arithmetic, predicates and uniform branches; memory instructions are
recorded, not performed), and the shared-memory addresses of its cp.async copies (and their global
sources), 2-byte staged loads and stores (REALIGN = 0) or realigned granule loads and 16-byte stores
(REALIGN = 1), ldmatrix loads and epilogue staging must be the model's,
tile after tile through the ring; each mma.sync must take its A and B registers straight from
the ldmatrix the model says (A: d0..d3; B: d0, d1 or d2, d3), and each tile's accumulators must be
staged where the model puts that tile. So a change of the swizzle rule in the kernel fails here
with the lane and the address, and the same change made to the model shows what it does to the
bank groups and the fragments.

CPU only: builds PTX (no ptxas). The default run keeps a fixed sample of each sweep (every third
operand case, every eighth configuration run, every fourth CPU case); `-m slow` runs the rest (tests/sweeps.py)."""
from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

from asmgemm.pipeline import BuildOptions, build_file
from sweeps import sample_every

SIZES = (64, 128, 256)          # BM and BN of the model sweep
DEPTHS = (32, 64)               # BK
ALIGNS = (16, 8, 4, 2)          # copy widths (bytes)
WARP_TILES = (32, 64)           # WM and WN


# ---- the model ---------------------------------------------------------------------------------
def swizzle(o, s: int):
    """SWIZZLE_OFFSET(dst, o, S): bits 4..6 of o (its 16-byte chunk in a 128-byte line) XOR bits
    S..S+2 (works on ints and numpy arrays)."""
    return o ^ (((o >> s) & 7) << 4)


@dataclass(frozen=True)
class Operand:
    """One operand's tile in a stage: A (op 0, BM x BK) or B (op 1, BK x BN), K-major or MN-major."""

    op: int            # 0: A, 1: B
    kc: bool           # K-major: tile rows are mn indices of BK halves; else rows of k, of MN halves
    mn: int            # BM or BN
    bk: int
    align: int         # ALIGN_A / ALIGN_B: the copy width, bytes
    threads: int
    w: int             # WM or WN: the warp tile along mn
    obase: int = 0     # the tile's offset in its stage (A_BYTES for B)

    @property
    def rb(self) -> int:
        return 2 * self.bk if self.kc else 2 * self.mn

    @property
    def rows(self) -> int:
        return self.mn if self.kc else self.bk

    @property
    def s(self) -> int:
        return max(self.rb, 128).bit_length() - 1

    @property
    def cpr(self) -> int:
        return self.rb // self.align

    @property
    def rstep(self) -> int:
        return self.threads // self.cpr

    @property
    def nch(self) -> int:
        return self.rows // self.rstep

    @property
    def imm(self) -> bool:
        """IMM_*: the stride between a thread's chunks is a multiple of the swizzle's period."""
        return (self.rstep * self.rb) % (1 << (self.s + 3)) == 0

    @property
    def valid(self) -> bool:
        """The kernel's `.error` conditions on the copy geometry."""
        return self.cpr <= self.threads and self.threads % self.cpr == 0 and self.rows % self.rstep == 0

    @property
    def tile_bytes(self) -> int:
        return self.mn * self.bk * 2

    def chunk(self, t, i):
        """(tile row, first element of the chunk in the row, linear byte offset) of thread t's
        chunk i (numpy arrays over t)."""
        row = t // self.cpr + i * self.rstep
        c = t % self.cpr
        return row, c * (self.align // 2), row * self.rb + c * self.align

    def copy_dest(self, t, i):
        """The shared offset (from the stage) thread t's chunk i is written to."""
        return self.obase + swizzle(self.chunk(t, i)[2], self.s)

    def ldsm_addresses(self, w0: int, block: int, ks: int) -> np.ndarray:
        """The 32 lanes' ldmatrix.x4 row addresses (offsets from the stage) for 16 x 16 block
        `block` along mn (A: m16 tile i; B: 16-wide column pair jj) and k16 step ks, in the warp
        whose tile starts at mn = w0."""
        lane = np.arange(32)
        q, r = lane >> 3, lane & 7
        h, u = q & 1, q >> 1
        if self.op == 0:
            mn, k = w0 + 16 * block + 8 * h, 16 * ks + 8 * u
        else:
            mn, k = w0 + 16 * block + 8 * u, 16 * ks + 8 * h
        off = (mn + r) * self.rb + 2 * k if self.kc else (k + r) * self.rb + 2 * mn
        return self.obase + swizzle(off, self.s)

    @property
    def blocks(self) -> int:
        """16-wide blocks along mn of a warp tile: MT for A, NT / 2 for B."""
        return self.w // 16

    def warp_offsets(self) -> list[int]:
        return list(range(0, self.mn, self.w))


def operands(cfg: dict) -> tuple[Operand, Operand]:
    """The model's A and B of a kernel configuration (the kernel's -D names, defaults filled in)."""
    c = {**DEFAULTS, **cfg}
    threads = 32 * (c["BM"] // c["WM"]) * (c["BN"] // c["WN"])
    a = Operand(0, not c["TRANS_A"], c["BM"], c["BK"], c["ALIGN_A"], threads, c["WM"])
    b = Operand(1, bool(c["TRANS_B"]), c["BN"], c["BK"], c["ALIGN_B"], threads, c["WN"], a.tile_bytes)
    return a, b


DEFAULTS = dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=4, TRANS_A=0, TRANS_B=0, ALIGN_A=16, ALIGN_B=16,
                C_F32=0)


def conflict_ways(addresses, width: int) -> int:
    """Shared-memory wavefronts one phase of accesses (`width` bytes each at `addresses`) needs:
    the most distinct 4-byte words any of the 32 banks holds (1: conflict-free)."""
    words = {a // 4 + j for a in np.asarray(addresses).tolist() for j in range(max(1, width // 4))}
    return max(Counter(w % 32 for w in words).values())


def phases(values, width: int):
    """values (one per thread of a warp, in lane order) cut into the hardware's phases: 128 bytes
    of accesses each (8 threads of 16-byte accesses, 16 of 8 bytes, all 32 of 4 or 2)."""
    n = min(32, max(1, 128 // width))
    return [values[p:p + n] for p in range(0, len(values), n)]


def bank_groups(addresses) -> list[int]:
    return [int(a) // 16 % 8 for a in addresses]


def model_operands() -> dict[tuple, list[Operand]]:
    """Every operand tile of the sweep the kernel accepts, by (op, K-major, MN size, BK): each copy
    width x thread count (of some BM x BN tiling with WM, WN in {32, 64}) x warp width."""
    out: dict[tuple, list[Operand]] = {}
    for op, kc, mn, bk in itertools.product((0, 1), (True, False), SIZES, DEPTHS):
        found = set()
        for align, w, other, wo in itertools.product(ALIGNS, WARP_TILES, SIZES, WARP_TILES):
            threads = 32 * (mn // w) * (other // wo)
            o = Operand(op, kc, mn, bk, align, threads, w)
            if threads <= 1024 and o.valid:
                found.add(o)
        out[(op, kc, mn, bk)] = sorted(found, key=lambda o: (o.align, o.threads, o.w))
    return out


MODEL_OPERANDS = model_operands()
CASES = list(MODEL_OPERANDS)
CASE_IDS = [f"{'AB'[op]}-{'K' if kc else 'MN'}major-{mn}x{bk}" for op, kc, mn, bk in CASES]


# ---- (a) bank conflicts ---------------------------------------------------------------------------
def test_swizzle_permutes_chunks_inside_each_line():
    """The XOR keeps every byte in its 128-byte line (so a line written by 8 consecutive threads
    stays one line) and is periodic in 2^(S+3) bytes (strides of that size stay immediates)."""
    for s in (7, 8, 9):
        o = np.arange(1 << (s + 4))
        z = swizzle(o, s)
        assert sorted(z.tolist()) == o.tolist()                  # a permutation of the tile
        assert (z // 128 == o // 128).all() and (z % 16 == o % 16).all()
        assert (swizzle(o + (1 << (s + 3)), s) == z + (1 << (s + 3))).all()


@pytest.mark.parametrize("case", sample_every(3, CASES), ids=CASE_IDS)
def test_ldmatrix_phases_hit_eight_bank_groups(case):
    """Each 8-lane phase of every ldmatrix.x4 (one 8 x 8 matrix: 8 rows of 16 bytes) touches 8
    distinct 16-byte bank groups, for every warp tile width, warp, 16 x 16 block and k16 step."""
    for o in dict.fromkeys(dataclasses.replace(o, align=16, threads=128) for o in MODEL_OPERANDS[case]):
        for w0, block, ks in itertools.product(o.warp_offsets(), range(o.blocks), range(o.bk // 16)):
            addr = o.ldsm_addresses(w0, block, ks)
            assert (addr % 16 == 0).all()
            for q in range(4):
                groups = bank_groups(addr[8 * q: 8 * q + 8])
                assert len(set(groups)) == 8, (o.w, w0, block, ks, q, groups)


@pytest.mark.parametrize("case", sample_every(3, CASES), ids=CASE_IDS)
def test_copies_are_conflict_free(case):
    """The cp.async writes of a tile (and ALIGN = 2's 2-byte stores), for every copy width and
    thread count: each 8-thread group of 16-byte copies touches 8 distinct bank groups, every
    phase of narrower ones no bank twice, and the chunks of all threads cover the tile once."""
    for o in dict.fromkeys(dataclasses.replace(o, w=16) for o in MODEL_OPERANDS[case]):
        t = np.arange(o.threads)
        covered = np.zeros(o.tile_bytes, int)
        for i in range(o.nch):
            dest = o.copy_dest(t, i)
            np.add.at(covered, (dest[:, None] + np.arange(o.align)).ravel(), 1)
            for warp in range(o.threads // 32):
                for phase in phases(dest[32 * warp: 32 * warp + 32], o.align):
                    if o.align == 16:
                        assert len(set(bank_groups(phase))) == len(phase) == 8, (o, i, warp, bank_groups(phase))
                    assert conflict_ways(phase, o.align) == 1, (o, i, warp, phase)
        assert (covered == 1).all(), f"{o}: the copies do not cover the tile exactly once"


@pytest.mark.parametrize("case", sample_every(3, CASES), ids=CASE_IDS)
def test_immediate_chunk_strides_keep_the_swizzle(case):
    """IMM_*: where the kernel adds i * RSTEP * RB to the swizzled first chunk instead of
    swizzling each chunk, the two are the same address."""
    for o in MODEL_OPERANDS[case]:
        t = np.arange(o.threads)
        if o.imm:
            for i in range(o.nch):
                assert (o.copy_dest(t, i) == o.copy_dest(t, 0) + i * o.rstep * o.rb).all(), (o, i)


# ---- (b) the data mapping ------------------------------------------------------------------------
def element_ids(mn, k, bk: int):
    """The id of element (mn, k) of a tile: its coordinates, packed."""
    return mn * bk + k


def copied_tile(o: Operand) -> np.ndarray:
    """Shared memory (one 16-bit cell per 2 bytes, from the tile's start) after the modelled copies
    of a tile whose element (mn, k) holds element_ids(mn, k); -1 where nothing was written."""
    smem = np.full(o.tile_bytes // 2, -1, np.int64)
    t = np.arange(o.threads)
    for i in range(o.nch):
        row, first, _ = o.chunk(t, i)
        dest = o.copy_dest(t, i) - o.obase
        for e in range(o.align // 2):
            # K-major: tile row = mn, elements along k; MN-major: tile row = k, elements along mn
            mn, k = (row, first + e) if o.kc else (first + e, row)
            assert (smem[(dest + 2 * e) // 2] == -1).all(), "two copies write one element"
            smem[(dest + 2 * e) // 2] = element_ids(mn, k, o.bk)
    return smem


LANE, Q, HALF = np.ix_(np.arange(32), np.arange(4), np.arange(2))


def ldmatrix_x4(smem: np.ndarray, addresses: np.ndarray, trans: bool) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA 9.7.9.22): matrix q's row j is the
    8 halves at the address lane 8q + j gives; thread lane receives of each matrix q one 32-bit
    register d_q of two halves: row lane / 4, elements 2 (lane % 4) and +1, or with .trans row
    2 (lane % 4) and +1 of element lane / 4. Returns [lane, q, half] of smem cells."""
    g, t = LANE // 4, LANE % 4
    row, col = (2 * t + HALF, g) if trans else (g, 2 * t + HALF)
    return smem[(addresses[8 * Q + row] + 2 * col) // 2]


def expected_fragment(o: Operand, w0: int, block: int, ks: int) -> np.ndarray:
    """mma.m16n8k16 (PTX ISA 9.7.14.5.8, .f16/.bf16), g = lane / 4, t = lane % 4: A's a0..a3 hold
    (row g, k 2t..2t+1), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8); B's b0, b1 (k 2t..2t+1,
    column g), (k 2t + 8.., g). Per the kernel's register assignment, A block `block`'s d0..d3 are
    a0..a3, B block jj's d0, d1 are b0, b1 of columns 16 jj + 0..7 and d2, d3 of 16 jj + 8..15.
    Returns [lane, d, half] of element ids."""
    g, t = LANE // 4, LANE % 4
    if o.op == 0:
        mn, k = g + 8 * (Q & 1), 2 * t + HALF + 8 * (Q >> 1)
    else:
        mn, k = g + 8 * (Q >> 1), 2 * t + HALF + 8 * (Q & 1)
    return element_ids(w0 + 16 * block + mn, 16 * ks + k, o.bk)


@pytest.mark.parametrize("case", sample_every(3, CASES), ids=CASE_IDS)
def test_copies_and_ldmatrix_give_the_mma_fragments(case):
    """Copy a tile of coordinates through the swizzle (every copy width and thread count), load
    every warp's fragments of every k16 step back with ldmatrix (.trans for an MN-major tile):
    each lane holds exactly its A or B fragment of mma.m16n8k16."""
    for o in MODEL_OPERANDS[case]:
        smem = copied_tile(o)
        assert (smem >= 0).all()
        for w0, block, ks in itertools.product(o.warp_offsets(), range(o.blocks), range(o.bk // 16)):
            got = ldmatrix_x4(smem, o.ldsm_addresses(w0, block, ks) - o.obase, trans=not o.kc)
            want = expected_fragment(o, w0, block, ks)
            bad = np.argwhere(got != want)
            assert not len(bad), f"{o}: warp tile at {w0}, block {block}, k16 step {ks}: lane, register, " \
                                 f"half {bad[0].tolist()} holds (mn, k) {divmod(int(got[tuple(bad[0])]), o.bk)} " \
                                 f"instead of {divmod(int(want[tuple(bad[0])]), o.bk)}"


# ---- the epilogue staging ------------------------------------------------------------------------
@dataclass(frozen=True)
class Staging:
    """EPI_SWIZZLE: one warp's 16 x WN fp32 staging area (offsets from its start)."""

    wn: int
    cb: int            # bytes of an element of C: 2 (fp16/bf16) or 4 (C_F32)

    @property
    def stride(self) -> int:
        return (self.wn + 8) * 4

    @property
    def ev(self) -> int:
        return 16 // self.cb

    @property
    def lpr(self) -> int:
        return self.wn // self.ev

    @property
    def rpi(self) -> int:
        return 32 // self.lpr

    def offset(self, row, col):
        """Where float (row, col) is staged: chunk c = col / 4 of the row swaps with c ^ 1 where
        bit 3 of c is set, and in odd rows where four lanes read a row (LPR = 4)."""
        c = col // 4
        flip = ((c >> 3) & 1) ^ ((row & 1) if self.lpr == 4 else 0)
        return row * self.stride + 16 * (c ^ flip) + 4 * (col % 4)

    def writes(self):
        """[(pass-local row, col, offset)] of each lane's 8-byte stores, per n8 tile j and half r:
        lane writes row lane / 4 (+ 8), columns 8j + 2 (lane % 4) and +1."""
        out = []
        for j, r in itertools.product(range(self.wn // 8), range(2)):
            lanes = []
            for lane in range(32):
                row, col = lane // 4 + 8 * r, 8 * j + 2 * (lane % 4)
                lanes.append((row, col, self.offset(row, col)))
            out.append(lanes)
        return out

    @property
    def lw(self) -> int:
        """WIDE_C = 0: lanes a staged row's column group is read by (LW), rows a read covers (RPW),
        column groups a row (NCW)."""
        return min(self.wn, 32)

    @property
    def rpw(self) -> int:
        return 32 // self.lw

    @property
    def ncw(self) -> int:
        return self.wn // self.lw

    def narrow_reads(self):
        """WIDE_C = 0: [[(row, col, offset)] per lane] per 4-byte load (ld.shared.f32): lane reads
        row r0 + lane / LW, column LW c + lane % LW, for r0 = 0, RPW, ... and groups c < NCW."""
        out = []
        for r0, c in itertools.product(range(0, 16, self.rpw), range(self.ncw)):
            lanes = []
            for lane in range(32):
                row, col = r0 + lane // self.lw, self.lw * c + lane % self.lw
                lanes.append((row, col, self.offset(row, col)))
            out.append(lanes)
        return out

    def reads(self):
        """[[(row, first col, offset)] per lane] per 16-byte load: lane reads row lane / LPR (+ q RPI),
        columns EV (lane % LPR) + 4e .. + 3."""
        out = []
        for q, e in itertools.product(range(16 // self.rpi), range(self.ev // 4)):
            lanes = []
            for lane in range(32):
                row, col = lane // self.lpr + q * self.rpi, self.ev * (lane % self.lpr) + 4 * e
                lanes.append((row, col, self.offset(row, col)))
            out.append(lanes)
        return out


STAGINGS = [Staging(wn, cb) for wn in WARP_TILES for cb in (2, 4)]
# WN = 32 with a 16-bit C: a quarter warp reads two rows (LPR = 4), 160 bytes apart = 10 chunks,
# at chunks 0, 2, 4, 6 of each: bank groups {0, 2, 4, 6} and {2, 4, 6, 0}, two wavefronts a load,
# until odd rows swapped their chunk pairs too (EPI_SWIZZLE's row rule). None are left.
KNOWN_READ_CONFLICTS = {}


@pytest.mark.parametrize("st", STAGINGS, ids=[f"WN{s.wn}-C{8 * s.cb}" for s in STAGINGS])
def test_epilogue_staging_writes_are_conflict_free(st):
    """Each n8 tile's 8-byte stores (st.shared.v2.f32): no bank twice in either half warp."""
    for lanes in st.writes():
        offsets = [off for _, _, off in lanes]
        assert all(off % 8 == 0 for off in offsets)
        for phase in phases(offsets, 8):
            assert conflict_ways(phase, 8) == 1, phase


@pytest.mark.parametrize("st", [pytest.param(s, marks=pytest.mark.xfail(
    strict=True, reason=f"{KNOWN_READ_CONFLICTS[s]}-way bank conflict: see KNOWN_READ_CONFLICTS")) if s in
    KNOWN_READ_CONFLICTS else s for s in STAGINGS], ids=[f"WN{s.wn}-C{8 * s.cb}" for s in STAGINGS])
def test_epilogue_staging_reads_are_conflict_free(st):
    """Each 16-byte read-back (ld.shared.v4.f32): 8 distinct bank groups in every quarter warp."""
    for lanes in st.reads():
        offsets = [off for _, _, off in lanes]
        assert all(off % 16 == 0 for off in offsets)
        for phase in phases(offsets, 16):
            assert len(set(bank_groups(phase))) == 8, (lanes[0], bank_groups(phase))


@pytest.mark.parametrize("st", STAGINGS, ids=[f"WN{s.wn}-C{8 * s.cb}" for s in STAGINGS])
def test_epilogue_staging_conflicts_are_the_known_ones(st):
    """The read-back's wavefronts a quarter warp, where not 1 (KNOWN_READ_CONFLICTS): if the rule
    changes, this says by how much."""
    ways = max(conflict_ways(phase, 16) for lanes in st.reads() for phase in phases([o for *_, o in lanes], 16))
    assert ways == KNOWN_READ_CONFLICTS.get(st, 1)


# WIDE_C = 0 reads one float a lane: WN = 16 (two rows a read) to 128 (four column groups)
NARROW_STAGINGS = [Staging(wn, cb) for wn in (16, 32, 64, 128) for cb in (2, 4) if 32 % max(1, wn * cb // 16) == 0]


@pytest.mark.parametrize("st", NARROW_STAGINGS, ids=[f"WN{s.wn}-C{8 * s.cb}" for s in NARROW_STAGINGS])
def test_epilogue_narrow_reads_are_conflict_free_and_whole(st):
    """WIDE_C = 0: each 4-byte read-back (the warp's 32 lanes, one phase) hits 32 different banks
    (WN = 16, no catalog or .tune tiling: two rows 96 bytes apart, 2-way), consecutive lanes read
    consecutive columns of a row (LW of them, the columns the lanes then store side by side in C),
    and the reads fetch every staged float once, from where its writer put it."""
    written = {}
    for lanes in st.writes():
        for row, col, off in lanes:
            written[off], written[off + 4] = (row, col), (row, col + 1)
    read = []
    for lanes in st.narrow_reads():
        offsets = [off for *_, off in lanes]
        assert conflict_ways(offsets, 4) == (2 if st.wn == 16 else 1), (lanes[0], offsets)
        for lane, (row, col, off) in enumerate(lanes):
            assert written[off] == (row, col), (lane, row, col, off)
            if lane % st.lw:
                assert (row, col) == (lanes[lane - 1][0], lanes[lane - 1][1] + 1)
            read.append((row, col))
    assert sorted(read) == [(r, c) for r in range(16) for c in range(st.wn)]


@pytest.mark.parametrize("st", STAGINGS, ids=[f"WN{s.wn}-C{8 * s.cb}" for s in STAGINGS])
def test_epilogue_staging_is_a_bijection_read_back_whole(st):
    """The writes put the 16 x WN floats at distinct offsets inside the warp's 16 rows (padding
    never written), and the reads fetch every float once, each from where its writer put it."""
    written = {}
    for lanes in st.writes():
        for row, col, off in lanes:
            for x in range(2):
                assert off + 4 * x not in written, "two floats staged at one offset"
                written[off + 4 * x] = (row, col + x)
    assert sorted(written.values()) == [(r, c) for r in range(16) for c in range(st.wn)]
    assert max(written) < 16 * st.stride and all(off % st.stride < 4 * st.wn for off in written)
    read = []
    for lanes in st.reads():
        for row, col, off in lanes:
            for x in range(4):
                assert written[off + 4 * x] == (row, col + x), (row, col + x, off)
                read.append((row, col + x))
    assert sorted(read) == sorted(written.values())


# ---- the kernel against the model: its PTX, interpreted ------------------------------------------
FLOAT_TYPES = {"f32", "f16", "bf16", "f16x2", "bf16x2", "f64"}
INT_WIDTH = {"u16": 16, "s16": 16, "b16": 16, "u32": 32, "s32": 32, "b32": 32, "u64": 64, "s64": 64, "b64": 64}
ACCESS_BYTES = {"f32": 4, "b32": 4, "u32": 4, "s32": 4, "u16": 2, "b16": 2, "f16": 2, "u64": 8, "b64": 8}


def _operands(text: str) -> list[str]:
    """Split an instruction's operands at top-level commas ({..} and [..] kept whole)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def _names(vector: str) -> list[str]:
    return [x.strip() for x in vector.strip()[1:-1].split(",")]


class BlockRun:
    """One block of the kernel's PTX executed on the CPU, every thread at once (numpy arrays over
    %tid.x): integer arithmetic, predicates, selects and branches (which must be uniform). Global
    and shared memory are not modelled: loads give 0, and every shared-memory access, cp.async,
    ldmatrix and mma is recorded (`records`) with its per-thread addresses and register names.
    An instruction it does not know fails the test, so a new construct in the kernel is seen."""

    def __init__(self, ptx: str, threads: int, params: dict, grid: tuple[int, int]):
        body = ptx[ptx.index("{", ptx.index(".entry")) + 1: ptx.rindex("}")]
        self.lines: list[str] = []
        self.labels: dict[str, int] = {}
        for raw in body.splitlines():
            line = raw.split("//")[0].strip()
            if not line or line.startswith(".reg"):
                continue
            label = re.fullmatch(r"([A-Za-z_$][\w$]*):", line)
            if label:
                self.labels[label.group(1)] = len(self.lines)
                continue
            assert line.endswith(";"), line
            self.lines.append(line[:-1].strip())
        self.threads = threads
        self.params = params
        self.special = {"%tid.x": np.arange(threads, dtype=np.int64), "%ctaid.x": 0, "%ctaid.y": 0,
                        "%nctaid.x": grid[0], "%nctaid.y": grid[1], "smem": 0}
        self.regs: dict[str, np.ndarray] = {}
        self.records: list[dict] = []

    # operands ----------------------------------------------------------------------------------
    def ival(self, x: str, width: int = 64, signed: bool = False) -> np.ndarray:
        x = x.strip()
        v = self.special[x] if x in self.special else (self.regs.get(x, 0) if x.startswith("%") else int(x, 0))
        v = np.array(np.broadcast_to(np.asarray(v, dtype=np.int64), (self.threads,)))
        if width < 64:
            v &= (1 << width) - 1
            if signed:
                v = np.where(v >= 1 << (width - 1), v - (1 << width), v)
        return v

    def fval(self, x: str) -> np.ndarray:
        x = x.strip()
        if x.startswith("0f"):
            return np.full(self.threads, float(np.frombuffer(bytes.fromhex(x[2:])[::-1], np.float32)[0]))
        return np.array(np.broadcast_to(np.asarray(self.regs.get(x, 0.0), np.float64), (self.threads,)))

    def pred(self, x: str) -> np.ndarray:
        v = np.broadcast_to(np.asarray(self.regs.get(x.lstrip("!"), False), bool), (self.threads,))
        return ~v if x.startswith("!") else v

    def address(self, x: str) -> np.ndarray:
        m = re.fullmatch(r"\[\s*([%\w.]+)\s*(?:([+-])\s*(\w+))?\s*\]", x.strip())
        assert m, x
        off = int(m.group(3), 0) * (-1 if m.group(2) == "-" else 1) if m.group(3) else 0
        return self.ival(m.group(1)) + off

    def write(self, name: str, value: np.ndarray, guard) -> None:
        if guard is not None:
            old = np.broadcast_to(np.asarray(self.regs.get(name, 0), dtype=value.dtype), (self.threads,))
            value = np.where(guard, value, old)
        self.regs[name] = value
        self.producer.pop(name, None)

    def record(self, kind: str, guard, **kw) -> None:
        active = np.ones(self.threads, bool) if guard is None else np.array(guard, bool)
        self.records.append(dict(kind=kind, active=active, mma_before=self.mmas, **kw))

    # execution ---------------------------------------------------------------------------------
    def run(self, max_steps: int = 200_000) -> "BlockRun":
        self.mmas = 0
        self.producer: dict[str, tuple[int, int]] = {}     # register -> (ldmatrix record, d index)
        pc = steps = 0
        while pc < len(self.lines):
            steps += 1
            assert steps < max_steps, "the block did not finish"
            text = self.lines[pc]
            pc += 1
            guard = None
            m = re.match(r"@(!?%\w+)\s+(.*)", text)
            if m:
                guard, text = self.pred(m.group(1)), m.group(2)
            op, _, rest = text.partition(" ")
            parts, args = op.split("."), _operands(rest)
            if parts[0] == "bra":
                assert guard is None or guard.all() or not guard.any(), f"divergent branch: {text}"
                if guard is None or guard.all():
                    pc = self.labels[args[0]]
            elif parts[0] == "ret":
                break
            else:
                self.execute(parts, args, guard, text)
        return self

    def execute(self, parts: list[str], args: list[str], guard, text: str) -> None:  # noqa: C901
        base, typ = parts[0], parts[-1]
        if base == "ldmatrix":
            assert "x4" in parts and guard is None, text
            dests = _names(args[0])
            self.record("ldsm", guard, addr=self.address(args[1]), trans="trans" in parts, dests=dests)
            for d, name in enumerate(dests):
                self.write(name, np.zeros(self.threads, np.int64), guard)
                self.producer[name] = (len(self.records) - 1, d)
        elif base == "mma":
            d, a, b, c = (_names(x) for x in args)
            assert d == c, text
            self.record("mma", guard, acc=tuple(d), a=[self.producer.get(x) for x in a],
                        b=[self.producer.get(x) for x in b])
            self.mmas += 1
        elif base == "cp" and parts[2] in ("commit_group", "wait_group", "wait_all"):
            self.record(parts[2], guard)
        elif base == "cp":
            size = int(args[2], 0)
            src_size = self.ival(args[3], 32) if len(args) > 3 else np.full(self.threads, size)
            self.record("cp", guard, addr=self.address(args[0]), size=size, src=self.address(args[1]),
                        src_size=src_size)
        elif base in ("bar", "fence", "membar"):
            self.record(base, guard)
        elif base == "ld" and parts[1] == "param":
            v = self.params[args[1].strip()[1:-1]]
            self.write(args[0], np.full(self.threads, v, np.float64 if typ in FLOAT_TYPES else np.int64), guard)
        elif base in ("ld", "st"):
            vec = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
            where, values = (args[1], args[0]) if base == "ld" else (args[0], args[1])
            names = _names(values) if values.startswith("{") else [values]
            self.record(f"{base}.{parts[1]}", guard, addr=self.address(where), size=vec * ACCESS_BYTES[typ],
                        names=names)
            if base == "ld":
                for name in names:
                    self.write(name, np.zeros(self.threads, np.float64 if typ in FLOAT_TYPES else np.int64), guard)
        elif any(p in FLOAT_TYPES for p in parts) and base not in ("setp", "mov", "selp"):
            if not args[0].startswith("{"):           # float arithmetic and conversions: values not kept
                self.write(args[0], np.zeros(self.threads), guard)
        elif base == "cvta":
            self.write(args[0], self.ival(args[1]), guard)
        elif typ == "pred" and base in ("and", "or", "xor"):
            a, b = self.pred(args[1]), self.pred(args[2])
            self.write(args[0], np.asarray({"and": a & b, "or": a | b, "xor": a ^ b}[base], bool), guard)
        elif base == "prmt":
            # prmt.b32 d, a, b, c (default mode): byte i of d is byte (c >> 4 i) & 7 of b:a
            pool = (self.ival(args[1], 32) & 0xFFFFFFFF) | ((self.ival(args[2], 32) & 0xFFFFFFFF) << 32)
            sel = self.ival(args[3], 32)
            out = np.zeros(self.threads, np.int64)
            for i in range(4):
                nib = (sel >> (4 * i)) & 0xF
                assert not (nib & 8).any(), f"the interpreter does not know sign replication: {text}"
                out |= ((pool >> (8 * (nib & 7))) & 0xFF) << (8 * i)
            self.write(args[0], out, guard)
        elif base == "mov":
            if args[0].startswith("{") or args[1].startswith("{"):     # packing halves: values not kept
                if not args[0].startswith("{"):
                    self.write(args[0], np.zeros(self.threads), guard)
            elif typ in FLOAT_TYPES:
                self.write(args[0], self.fval(args[1]), guard)
            elif typ == "pred":
                self.write(args[0], np.array(self.pred(args[1])), guard)
            else:
                self.write(args[0], self.ival(args[1], INT_WIDTH[typ]), guard)
        elif base == "setp":
            cmp_, boolop = parts[1], (parts[2] if len(parts) == 4 else None)
            if typ in FLOAT_TYPES:
                a, b = self.fval(args[1]), self.fval(args[2])
                cmp_ = cmp_[:-1] if cmp_ in ("equ", "neu", "ltu", "leu", "gtu", "geu") else cmp_
            else:
                a = self.ival(args[1], INT_WIDTH[typ], typ[0] == "s")
                b = self.ival(args[2], INT_WIDTH[typ], typ[0] == "s")
            cmp_ = {"lo": "lt", "ls": "le", "hi": "gt", "hs": "ge"}.get(cmp_, cmp_)
            r = {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[cmp_]
            if boolop:
                q = self.pred(args[3])
                r = {"and": r & q, "or": r | q, "xor": r ^ q}[boolop]
            self.write(args[0], np.asarray(r, bool), guard)
        elif base == "selp":
            p = self.pred(args[3])
            if typ in FLOAT_TYPES:
                self.write(args[0], np.where(p, self.fval(args[1]), self.fval(args[2])), guard)
            else:
                self.write(args[0], np.where(p, self.ival(args[1], INT_WIDTH[typ]), self.ival(args[2], INT_WIDTH[typ])),
                           guard)
        elif base == "cvt":
            dt, st = parts[-2], parts[-1]
            v = self.ival(args[1], INT_WIDTH[st], st[0] == "s")
            self.write(args[0], v & ((1 << INT_WIDTH[dt]) - 1) if INT_WIDTH[dt] < 64 else v, guard)
        else:
            self.integer(base, parts, args, guard, text)

    def integer(self, base: str, parts: list[str], args: list[str], guard, text: str) -> None:
        typ = parts[-1]
        assert typ in INT_WIDTH, f"the interpreter does not know: {text}"
        w, signed, wide = INT_WIDTH[typ], typ[0] == "s", "wide" in parts
        a = self.ival(args[1], w, signed)
        b = self.ival(args[2], w, signed) if len(args) > 2 else None
        if base in ("shl", "shr"):
            b = self.ival(args[2], 32)
        ops = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "min": lambda: np.minimum(a, b),
               "max": lambda: np.maximum(a, b), "and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b,
               "not": lambda: ~a, "shl": lambda: a << b, "shr": lambda: a >> b,
               "div": lambda: a // b if not signed else np.trunc(a / b).astype(np.int64),
               "rem": lambda: a % b if not signed else np.fmod(a, b),
               "mad": lambda: a * b + self.ival(args[3], 64 if wide else w, signed),
               "bfe": lambda: (a >> self.ival(args[2], 32)) & ((1 << self.ival(args[3], 32)) - 1)}
        assert base in ops and (base in ("mul", "mad") or not wide), f"the interpreter does not know: {text}"
        assert base not in ("mul", "mad") or "lo" in parts or wide, f"the interpreter does not know: {text}"
        out = 64 if wide else w
        r = np.asarray(ops[base](), np.int64)
        self.write(args[0], r & ((1 << out) - 1) if out < 64 else r, guard)


# Configurations whose PTX is run: the untuned tilings (defaults, 64 x 64 with 32 x 32 warps, WN = 32
# for a 2-byte copy), every layout, every copy width, BK = 64 with 3 stages, 256-wide tiles, fp32 C.
TIE_CONFIGS = [
    {},
    dict(TRANS_A=1), dict(TRANS_B=1), dict(TRANS_A=1, TRANS_B=1),
    dict(BM=64, BN=64, WM=32, WN=32), dict(BM=64, BN=64, WM=32, WN=32, TRANS_A=1, TRANS_B=1, C_F32=1),
    dict(WN=32, ALIGN_A=2, REALIGN=0), dict(WN=32, ALIGN_B=2, TRANS_A=1, TRANS_B=1, REALIGN=0),
    # ALIGN 2 realigned (REALIGN = 1, the default): 16-byte chunks from two granule loads each
    dict(WN=32, ALIGN_A=2, ALIGN_B=2), dict(BM=64, BN=64, WM=32, WN=32, ALIGN_A=2, TRANS_A=1, TRANS_B=1),
    dict(ALIGN_A=8, ALIGN_B=4, TRANS_B=1), dict(ALIGN_A=4, ALIGN_B=8, TRANS_A=1),
    dict(BK=64, STAGES=3, TRANS_A=1), dict(BM=256, BN=64, WN=32, BK=64, STAGES=3, TRANS_B=1, C_F32=1),
    dict(BM=64, BN=256, WM=32, TRANS_A=1, ALIGN_B=8, STAGES=5),
    # 16-byte pieces of C (the runtime's wide_c): the configurations above run WIDE_C = 0
    dict(WIDE_C=1), dict(BM=64, BN=64, WM=32, WN=32, TRANS_B=1, C_F32=1, WIDE_C=1),
    dict(WN=32, ALIGN_A=2, WIDE_C=1, REALIGN=0),
]


def _tie_id(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items()) or "defaults"


@functools.lru_cache(maxsize=None)
def kernel_run(items: tuple) -> tuple[dict, BlockRun]:
    """The constants of the build of these -D values and its PTX run for block (0, 0) of an
    interior-tile problem with KT = STAGES + 2 K tiles (the unguarded, the last and the past-K
    iterations all run; padded leading dimensions, an odd ldc where WIDE_C = 0)."""
    result = build_file("mma_gemm", BuildOptions(defines={k: str(v) for k, v in items}, target="sm_80"))
    c = result.constants
    m, n, k = 2 * c["BM"], 2 * c["BN"], c["BK"] * (c["STAGES"] + 2)
    # (odd where the copies are 2 bytes wide: rows at every offset in their 16-byte granules)
    lda = (m if c["TRANS_A"] else k) + 24 + (c["ALIGN_A"] == 2)
    ldb = (k if c["TRANS_B"] else n) + 40 + (c["ALIGN_B"] == 2)
    params = dict(param_A=1 << 32, param_B=2 << 32, param_C=3 << 32, param_bias=4 << 32, param_M=m, param_N=n,
                  param_K=k, param_lda=lda, param_ldb=ldb, param_ldc=n + (0 if c["WIDE_C"] else 3), param_alpha=1.0,
                  param_beta=0.0)
    run = BlockRun(result.ptx, c["THREADS"], params, (2, 2)).run()
    return c, run


def _warp_offset(o: Operand, c: dict, warp: int) -> int:
    return (warp // c["WARPS_N"]) * c["WM"] if o.op == 0 else (warp % c["WARPS_N"]) * c["WN"]


def _global_address(o: Operand, c: dict, t: np.ndarray, i: int, tile: int) -> np.ndarray:
    """The global address thread t's chunk i of K tile `tile` copies from (block (0, 0))."""
    row, first, _ = o.chunk(t, i)
    base, ld = (1 << 32, c["_lda"]) if o.op == 0 else (2 << 32, c["_ldb"])
    k0 = tile * o.bk
    # K-major: stored rows are mn, elements k; MN-major: stored rows are k, elements mn
    r, e = (row, k0 + first) if o.kc else (k0 + row, first)
    return base + 2 * (r * ld + e)


@pytest.fixture(scope="module", params=sample_every(8, TIE_CONFIGS), ids=[_tie_id(c) for c in TIE_CONFIGS])
def tie(request):
    c, run = kernel_run(tuple(sorted(request.param.items())))
    # the copy geometry is of the kernel's chunks: CW bytes (16 for a realigned ALIGN = 2 operand)
    cfg = {**{k: c[k] for k in DEFAULTS}, "ALIGN_A": c["CW_A"], "ALIGN_B": c["CW_B"]}
    a, b = operands(cfg)
    c = {**c, "_lda": run.params["param_lda"], "_ldb": run.params["param_ldb"]}
    return c, run, (a, b)


def test_kernel_constants_are_the_models(tie):
    """The geometry the model derives is the one the kernel's constants give."""
    c, run, (a, b) = tie
    for o, x in ((a, "A"), (b, "B")):
        assert (c[f"RB_{x}"], c[f"S_{x}"], c[f"CPR_{x}"], c[f"RSTEP_{x}"], c[f"NCH_{x}"], c[f"IMM_{x}"]) == \
            (o.rb, o.s, o.cpr, o.rstep, o.nch, int(o.imm))
    assert c["THREADS"] == a.threads and c["A_BYTES"] == a.tile_bytes
    assert c["STAGE_BYTES"] == a.tile_bytes + b.tile_bytes
    st = Staging(c["WN"], c["CB"])
    assert (c["EPI_STRIDE"], c["EV"], c["LPR"], c["RPI"]) == (st.stride, st.ev, st.lpr, st.rpi)


def test_kernel_copies_are_the_models(tie):
    """Every commit group g holds the copies of K tile g into stage g % STAGES, at the model's
    swizzled offsets, from the model's global addresses (whole chunks inside the matrix), or none
    (past K); ALIGN = 2's loads of tile g come in group g's window and its stores of tile g - 1 (to
    that tile's stage) in the same window: 2-byte ones (REALIGN = 0), or (REALIGN = 1) two 16-byte
    loads a chunk, of the aligned granule holding the chunk's first element and the next, and one
    16-byte store at the chunk's swizzled offset."""
    c, run, ops = tie
    stages, stage_bytes, kt = c["STAGES"], c["STAGE_BYTES"], run.params["param_K"] // c["BK"]
    t = np.arange(c["THREADS"])
    windows: list[list[dict]] = [[]]
    for r in run.records:
        if r["kind"] == "commit_group":
            windows.append([])
        else:
            windows[-1].append(r)
    assert len(windows) - 1 == kt + stages - 1, "one commit group per K tile, STAGES - 1 ahead"
    assert not any(r["kind"] == "cp" or r["kind"] == "st.shared" and r["size"] == 2 for r in windows[-1])
    for g, window in enumerate(windows[:-1]):
        for o in ops:
            staged = o.align == 2
            realigned = bool(c[f"REALIGN_{'AB'[o.op]}"])
            if realigned:
                prev = {i: o.copy_dest(t, i) + ((g - 1) % stages) * stage_bytes for i in range(o.nch)}
                loads = [r for r in window if r["kind"] == "ld.global" and r["size"] == 16
                         and (r["addr"][r["active"]] >> 32 == o.op + 1).all()]
                stores = [r for r in window if r["kind"] == "st.shared" and r["size"] == 16
                          and (r["addr"] - (g - 1) % stages * stage_bytes - o.obase < o.tile_bytes).all()
                          and (r["addr"] >= (g - 1) % stages * stage_bytes + o.obase).all()]
                if g < kt:
                    assert len(loads) == 2 * o.nch, (g, len(loads))
                    for i in range(o.nch):
                        granule = _global_address(o, c, t, i, g) & ~15
                        for h, r in enumerate(loads[2 * i: 2 * i + 2]):
                            assert r["active"].all() and (r["addr"] == granule + 16 * h).all(), \
                                (g, i, h, _first_difference(r["addr"], granule + 16 * h))
                assert len(stores) in ((o.nch,) if 1 <= g <= kt else (0, o.nch)), (g, len(stores))
                for i, r in enumerate(stores):
                    assert (r["addr"] == prev[i]).all(), (g, i, _first_difference(r["addr"], prev[i]))
                continue
            wanted = {i: o.copy_dest(t, i) + (g % stages) * stage_bytes for i in range(o.nch)}
            if staged:
                # (a load no thread runs is none: the other operand's 2-byte loads of a chunk at
                # the matrix's end, COPY_TILE's `last`, predicated off here)
                loads = [r for r in window if r["kind"] == "ld.global" and r["mma_before"] < run.mmas
                         and r["active"].any() and (r["addr"][r["active"]] >> 32 == o.op + 1).all()]
                stores = [r for r in window if r["kind"] == "st.shared" and r["size"] == 2
                          and (r["addr"] - (g - 1) % stages * stage_bytes - o.obase < o.tile_bytes).all()
                          and (r["addr"] >= (g - 1) % stages * stage_bytes + o.obase).all()]
                if g < kt:
                    assert len(loads) == o.nch, (g, len(loads))
                    for i, r in enumerate(loads):
                        want = _global_address(o, c, t, i, g)
                        assert (r["addr"][r["active"]] == want[r["active"]]).all() and r["active"].all(), (g, i)
                prev = {i: o.copy_dest(t, i) + ((g - 1) % stages) * stage_bytes for i in range(o.nch)}
                assert len(stores) in ((o.nch,) if 1 <= g <= kt else (0, o.nch)), (g, len(stores))
                for i, r in enumerate(stores):
                    assert (r["addr"] == prev[i]).all(), (g, i, _first_difference(r["addr"], prev[i]))
                continue
            copies = [r for r in window if r["kind"] == "cp" and r["size"] == o.align
                      and ((r["addr"] - o.obase) % stage_bytes < o.tile_bytes).all()]
            assert len(copies) == (o.nch if g < kt else len(copies)) and len(copies) in (0, o.nch), (g, len(copies))
            for i, r in enumerate(copies):
                assert (r["addr"] == wanted[i]).all(), f"{'AB'[o.op]} tile {g} chunk {i}: " \
                                                       f"{_first_difference(r['addr'], wanted[i])}"
                if g < kt:
                    assert (r["src_size"] == o.align).all(), (g, i)
                    assert (r["src"] == _global_address(o, c, t, i, g)).all(), \
                        f"{'AB'[o.op]} tile {g} chunk {i} source: " \
                        f"{_first_difference(r['src'], _global_address(o, c, t, i, g))}"


def _first_difference(got: np.ndarray, want: np.ndarray) -> str:
    t = int(np.argmax(got != want))
    return f"thread {t}: kernel 0x{int(got[t]):x}, model 0x{int(want[t]):x}"


def _ldsm_table(c: dict, ops) -> dict:
    """{(per-thread addresses, trans): (op, stage, block, ks)} of every ldmatrix the model has."""
    table = {}
    for o, ks, block in itertools.product(ops, range(c["BK"] // 16), range(max(o.blocks for o in ops))):
        if block < o.blocks:
            addr = np.concatenate([o.ldsm_addresses(_warp_offset(o, c, w), block, ks)
                                   for w in range(c["THREADS"] // 32)])
            for stage in range(c["STAGES"]):
                table[(tuple((addr + stage * c["STAGE_BYTES"]).tolist()), not o.kc)] = (o.op, stage, block, ks)
    return table


def _label(table: dict, r: dict) -> tuple:
    """(op, stage, block, k16 step) of an ldmatrix record; fails where the model has no such load."""
    found = table.get((tuple(r["addr"].tolist()), r["trans"]))
    assert found is not None, f"an ldmatrix{'.trans' if r['trans'] else ''} the model does not make: lanes' " \
                              f"addresses {[hex(x) for x in r['addr'][:8].tolist()]}..."
    return found


def test_kernel_ldmatrix_loads_are_the_models(tie):
    """Every ldmatrix of the run reads the model's addresses (with .trans exactly for MN-major
    tiles), and over the run each (stage, block, k16 step) is read as often as the ring visits
    it: K tile kt from stage kt % STAGES (plus, at most, the first step of tile KT)."""
    c, run, ops = tie
    table = _ldsm_table(c, ops)
    kt, ksteps = run.params["param_K"] // c["BK"], c["BK"] // 16
    seen = Counter()
    for r in (r for r in run.records if r["kind"] == "ldsm"):
        seen[_label(table, r)] += 1
    want = Counter()
    for tile, ks, o in itertools.product(range(kt), range(ksteps), ops):
        for block in range(o.blocks):
            want[(o.op, tile % c["STAGES"], block, ks)] += 1
    extra = seen - want
    assert not want - seen, f"missing ldmatrix loads: {want - seen}"
    assert all(stage == kt % c["STAGES"] and ks == 0 for _, stage, _, ks in extra), f"unexpected loads: {extra}"


def test_kernel_mma_operands_are_the_model_fragments(tie):
    """Each mma.sync takes as A the four registers d0..d3 of one A ldmatrix (block i), as B d0, d1
    or d2, d3 of one B ldmatrix (block jj: n8 tile 2 jj or 2 jj + 1) of the same stage and k16
    step, and accumulates tile (i, j) in registers of its own; every tile gets KT x KSTEPS mmas,
    one per k16 step of each K tile."""
    c, run, ops = tie
    table = _ldsm_table(c, ops)
    label = {}
    for n, r in enumerate(run.records):
        if r["kind"] == "ldsm":
            label[n] = _label(table, r)
    tiles: dict[tuple, tuple] = {}
    steps = Counter()
    for r in (r for r in run.records if r["kind"] == "mma"):
        assert None not in r["a"] and None not in r["b"], "an mma operand does not come from an ldmatrix"
        (na, da), (nb, db) = zip(*r["a"]), zip(*r["b"])
        assert len(set(na)) == 1 and list(da) == [0, 1, 2, 3], r["a"]
        assert len(set(nb)) == 1 and list(db) in ([0, 1], [2, 3]), r["b"]
        (opa, sa, i, ksa), (opb, sb, jj, ksb) = label[na[0]], label[nb[0]]
        assert (opa, opb) == (0, 1) and (sa, ksa) == (sb, ksb), (label[na[0]], label[nb[0]])
        tile = (i, 2 * jj + db[0] // 2)
        assert tiles.setdefault(r["acc"], tile) == tile, f"accumulators {r['acc']} serve two tiles"
        steps[tile] += 1
    mt, nt = c["WM"] // 16, c["WN"] // 8
    kt = run.params["param_K"] // c["BK"]
    assert sorted(steps) == [(i, j) for i in range(mt) for j in range(nt)]
    assert set(steps.values()) == {kt * c["BK"] // 16}
    assert len(set(tiles)) == mt * nt, "two tiles share accumulators"


def test_kernel_epilogue_staging_is_the_models(tie):
    """After the last mma, each warp stages its accumulators: the 8-byte stores of tile (i, j)'s
    fragment halves r = 0, 1 (rows g, g + 8) land at the model's EPI_SWIZZLE offsets in the warp's
    area, and the read-backs are the model's, once per m16 pass: 16-byte ones (WIDE_C = 1), or
    one float a lane (WIDE_C = 0: Staging.narrow_reads)."""
    c, run, ops = tie
    st = Staging(c["WN"], c["CB"])
    # the accumulators of tile (i, j), from the mmas (as the previous test checks them)
    table = _ldsm_table(c, ops)
    tile_of = {}
    for r in (r for r in run.records if r["kind"] == "mma"):
        (na, _), (nb, db) = r["a"][0], r["b"][0]
        i, jj = _label(table, run.records[na])[2], _label(table, run.records[nb])[2]
        tile_of[r["acc"]] = (i, 2 * jj + db // 2)
    half_of = {}
    for acc, (i, j) in tile_of.items():
        half_of[acc[:2]], half_of[acc[2:]] = (i, j, 0), (i, j, 1)
    stg = np.arange(c["THREADS"]) // 32 * c["EPI_WARP"]
    lane = np.arange(c["THREADS"]) % 32
    stores = [r for r in run.records if r["kind"] == "st.shared" and r["mma_before"] == run.mmas]
    loads = [r for r in run.records if r["kind"] == "ld.shared" and r["mma_before"] == run.mmas]
    done = Counter()
    for r in stores:
        assert r["size"] == 8 and r["active"].all()
        i, j, half = half_of[tuple(r["names"])]
        row, col = lane // 4 + 8 * half, 8 * j + 2 * (lane % 4)
        want = stg + st.offset(row, col)
        assert (r["addr"] == want).all(), f"tile ({i}, {j}) half {half}: {_first_difference(r['addr'], want)}"
        done[(i, j, half)] += 1
    assert set(done.values()) == {1} and len(done) == 2 * len(tile_of)
    mt = c["WM"] // 16
    reads = Counter()
    model = st.reads() if c["WIDE_C"] else st.narrow_reads()
    model_reads = [stg + np.array([lanes[ln][2] for ln in lane]) for lanes in model]
    for r in loads:
        assert r["size"] == (16 if c["WIDE_C"] else 4) and r["active"].all()
        hit = [n for n, want in enumerate(model_reads) if (r["addr"] == want).all()]
        assert hit, f"a read-back the model does not make: {[hex(x) for x in r['addr'][:8].tolist()]}"
        reads[hit[0]] += 1
    assert reads == Counter({n: mt for n in range(len(model_reads))})


def test_kernel_stores_of_c_are_the_models(tie):
    """The epilogue's stores to C cover the block's BM x BN tile once. WIDE_C = 1: 16-byte pieces
    (EV columns a lane). WIDE_C = 0 (the lane mapping of issue 32): one element a lane, and in every
    store instruction the lanes of each LW-lane group hold one row's consecutive columns at
    consecutive addresses (LW x CB contiguous bytes: 64 for a 16-bit C of WN >= 32, 128 for fp32),
    so a warp's store is 2 to 4 sectors of one row (and WN = 16 two half rows), not 2 bytes of
    every 16 over 512."""
    c, run, _ = tie
    ldc, cb = run.params["param_ldc"], c["CB"]
    lw = min(c["WN"], 32)
    seen = Counter()
    stores = [r for r in run.records if r["kind"] == "st.global"]
    assert stores
    for r in stores:
        assert r["active"].all(), "an interior block stores every element"
        off = r["addr"] - (3 << 32)
        assert (off % cb == 0).all()
        row, col = np.divmod(off // cb, ldc)
        if c["WIDE_C"]:
            assert r["size"] == 16 and (off % 16 == 0).all()
            width = c["EV"]
        else:
            assert r["size"] == cb
            width = 1
            rows, cols = row.reshape(-1, lw), col.reshape(-1, lw)
            assert (rows == rows[:, :1]).all(), f"one lane group stores several rows: {rows[0]}"
            assert (np.diff(cols, axis=1) == 1).all(), f"lanes store columns {cols[0]}"
            assert (np.diff(off.reshape(-1, lw), axis=1) == cb).all()
        for rw, cl in zip(row.tolist(), col.tolist()):
            for e in range(width):
                seen[(rw, cl + e)] += 1
    assert set(seen.values()) == {1}, "an element stored twice"
    assert sorted(seen) == [(m, n) for m in range(c["BM"]) for n in range(c["BN"])]


# ---- the kernel's values on the CPU: its whole PTX, executed ----------------------------------------
class ValueRun(BlockRun):
    """BlockRun with values: every register holds its bit pattern (fp32 as its 32 bits, halves as
    16), and global and shared memory are byte arrays, so the PTX of a block computes its tile of
    C. cp.async copies at once (src-size bytes, the rest zero-filled), ldmatrix.x4 (.trans) and
    mma.sync.m16n8k16 act per warp as the PTX ISA defines them (9.7.9.22, 9.7.14.5.8), fp32
    arithmetic rounds as fp32 does (fma through float64: one rounding of an exact product, then
    fp32), ex2.approx, rcp.approx and div.full are exact fp32 here, cvt.rn to f16/bf16 rounds to
    nearest even. `globals_` maps the top 32 bits of an address (param_A = 1 << 32, ...) to a byte
    array; an access outside it by an active lane fails the run (a guard the kernel missed). The
    threads run in lockstep, so bar.sync and cp.async.wait_group have nothing to wait for."""

    def __init__(self, ptx: str, threads: int, params: dict, grid: tuple[int, int], block: tuple[int, int],
                 globals_: dict[int, np.ndarray], smem_bytes: int):
        super().__init__(ptx, threads, params, grid)
        self.special["%ctaid.x"], self.special["%ctaid.y"] = block
        self.mem = globals_
        self.smem = np.zeros(smem_bytes, np.uint8)

    # values --------------------------------------------------------------------------------------
    def bits(self, x: str, width: int = 64) -> np.ndarray:
        x = x.strip()
        if x.startswith("0f"):
            return np.full(self.threads, int(x[2:], 16), np.int64)
        return self.ival(x, width)

    def fval(self, x: str) -> np.ndarray:
        return (self.bits(x, 32) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)

    def fwrite(self, name: str, value, guard) -> None:
        self.write(name, np.asarray(value, np.float32).view(np.uint32).astype(np.int64), guard)

    # memory --------------------------------------------------------------------------------------
    def _place(self, space: str, addr: np.ndarray, size: int, active: np.ndarray):
        """(byte array, offsets) of an access of `size` bytes by each active lane."""
        if space == "shared":
            mem, off = self.smem, addr
        else:
            (region,) = set((addr[active] >> 32).tolist()) or {None}
            if region is None:
                return None, None
            mem, off = self.mem[region], addr & 0xFFFFFFFF
        a = off[active]
        assert (a >= 0).all() and (a + size <= len(mem)).all(), \
            f"{space} access of {size} bytes outside its array (size {len(mem)}): {a.min()}..{a.max()}"
        return mem, off

    def load(self, space: str, addr, size: int, active) -> np.ndarray:
        out = np.zeros(self.threads, np.int64)
        mem, off = self._place(space, addr, size, active)
        if mem is not None:
            for b in range(size):
                out[active] |= mem[off[active] + b].astype(np.int64) << (8 * b)
        return out

    def store(self, space: str, addr, size: int, value: np.ndarray, active) -> None:
        mem, off = self._place(space, addr, size, active)
        if mem is not None:
            for b in range(size):
                mem[off[active] + b] = (value[active] >> (8 * b)) & 0xFF

    # execution -----------------------------------------------------------------------------------
    def execute(self, parts: list[str], args: list[str], guard, text: str) -> None:  # noqa: C901
        base, typ = parts[0], parts[-1]
        active = np.ones(self.threads, bool) if guard is None else np.array(guard, bool)
        if base == "ld" and parts[1] == "param":
            v = self.params[args[1].strip()[1:-1]]
            if typ in FLOAT_TYPES:
                self.fwrite(args[0], np.full(self.threads, v, np.float32), guard)
            else:
                self.write(args[0], np.full(self.threads, v, np.int64), guard)
        elif base in ("ld", "st") and parts[1] in ("global", "shared"):
            vec = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
            size = ACCESS_BYTES[typ]
            where, values = (args[1], args[0]) if base == "ld" else (args[0], args[1])
            names = _names(values) if values.startswith("{") else [values]
            addr = self.address(where)
            self.record(f"{base}.{parts[1]}", guard, addr=addr, size=vec * size, names=names)
            for n, name in enumerate(names):
                if base == "ld":
                    self.write(name, self.load(parts[1], addr + n * size, size, active), guard)
                else:
                    self.store(parts[1], addr + n * size, size, self.bits(name, 8 * size), active)
        elif base == "cp" and parts[1] == "async" and parts[2] not in ("commit_group", "wait_group", "wait_all"):
            dst, src, size = self.address(args[0]), self.address(args[1]), int(args[2], 0)
            src_size = self.ival(args[3], 32) if len(args) > 3 else np.full(self.threads, size)
            self.record("cp", guard, addr=dst, size=size, src=src, src_size=src_size)
            for b in range(size):
                got = self.load("global", src + b, 1, active & (src_size > b))
                self.store("shared", dst + b, 1, got, active)
        elif base == "ldmatrix":
            self.ldmatrix(parts, args, guard)
        elif base == "mma":
            self.mma(parts, args)
        elif base == "cvt" and (parts[-1] in FLOAT_TYPES or parts[-2] in FLOAT_TYPES):
            self.convert(parts, args, guard)
        elif base == "mov" and (args[0].startswith("{") or args[1].startswith("{")):
            if args[1].startswith("{"):        # pack: the first element in the low bits
                v, w = np.zeros(self.threads, np.int64), 32 // len(_names(args[1]))
                for n, x in enumerate(_names(args[1])):
                    v |= (self.bits(x, w) & ((1 << w) - 1)) << (w * n)
                self.write(args[0], v, guard)
            else:
                w = 32 // len(_names(args[0]))
                for n, x in enumerate(_names(args[0])):
                    self.write(x, (self.bits(args[1], 32) >> (w * n)) & ((1 << w) - 1), guard)
        elif base == "mov" and typ != "pred":
            self.write(args[0], self.bits(args[1], 64 if typ[1:] == "64" else 32 if typ != "b16" else 16), guard)
        elif base == "selp" and typ in FLOAT_TYPES:
            self.write(args[0], np.where(self.pred(args[3]), self.bits(args[1], 32), self.bits(args[2], 32)), guard)
        elif typ == "f32" and base not in ("setp", "selp"):
            self.float_op(base, parts, args, guard, text)
        else:
            super().execute(parts, args, guard, text)

    def float_op(self, base: str, parts: list[str], args: list[str], guard, text: str) -> None:
        x = [self.fval(a) for a in args[1:]]
        with np.errstate(all="ignore"):
            if base == "fma":
                r = (x[0].astype(np.float64) * x[1] + x[2]).astype(np.float32)
            else:
                r = {"mul": lambda: x[0] * x[1], "add": lambda: x[0] + x[1], "sub": lambda: x[0] - x[1],
                     "div": lambda: x[0] / x[1], "rcp": lambda: np.float32(1) / x[0], "ex2": lambda: np.exp2(x[0]),
                     "abs": lambda: np.abs(x[0]), "neg": lambda: -x[0], "min": lambda: np.minimum(x[0], x[1]),
                     "max": lambda: np.maximum(x[0], x[1])}[base]()
        self.fwrite(args[0], r, guard)

    def convert(self, parts: list[str], args: list[str], guard) -> None:
        dt, st = parts[-2], parts[-1]
        if st == "f32" and dt in ("f16", "bf16"):
            self.write(args[0], _to_half(self.fval(args[1]), dt), guard)
        elif st == "f32" and dt in ("f16x2", "bf16x2"):      # d = {a (upper half), b (lower)}
            hi, lo = _to_half(self.fval(args[1]), dt[:-2]), _to_half(self.fval(args[2]), dt[:-2])
            self.write(args[0], (hi << 16) | lo, guard)
        elif dt == "f32" and st in ("f16", "bf16"):
            self.fwrite(args[0], _from_half(self.bits(args[1], 16), st), guard)
        else:
            raise AssertionError(f"the interpreter does not know: cvt.{dt}.{st}")

    def ldmatrix(self, parts: list[str], args: list[str], guard) -> None:
        """Matrix q's row j is the 8 halves at the address of lane 8q + j; thread `lane` gets of each
        matrix q row lane / 4, halves 2 (lane % 4) and +1 (.trans: rows 2 (lane % 4) and +1 of column
        lane / 4), the lower column (row) in the low half."""
        assert guard is None
        addr = self.address(args[1])
        lane = np.arange(self.threads) % 32
        warp0 = np.arange(self.threads) - lane
        g, t = lane // 4, lane % 4
        for q, name in enumerate(_names(args[0])):
            halves = []
            for h in range(2):
                row, col = (2 * t + h, g) if "trans" in parts else (g, 2 * t + h)
                rows_addr = addr[warp0 + 8 * q + row]
                halves.append(self.load("shared", rows_addr + 2 * col, 2, np.ones(self.threads, bool)))
            self.write(name, halves[0] | (halves[1] << 16), None)

    def mma(self, parts: list[str], args: list[str]) -> None:
        """mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, per warp: g = lane / 4,
        t = lane % 4; a0..a3 hold A (g, 2t..+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..); b0, b1
        B (k 2t..+1, n g), (k 2t + 8.., g); c0..c3 C (g, 2t..+1), (g + 8, 2t..+1)."""
        ab = parts[-2]
        d, a, b, c = (_names(x) for x in args)
        warps = self.threads // 32
        lane = np.arange(32)
        g, t = lane // 4, lane % 4
        A = np.zeros((warps, 16, 16))
        B = np.zeros((warps, 16, 8))
        C = np.zeros((warps, 16, 8))
        for n, name in enumerate(a):
            v = self.bits(name, 32).reshape(warps, 32)
            r, k = g + 8 * (n & 1), 2 * t + 8 * (n >> 1)
            A[:, r, k], A[:, r, k + 1] = _from_half(v & 0xFFFF, ab), _from_half(v >> 16, ab)
        for n, name in enumerate(b):
            v = self.bits(name, 32).reshape(warps, 32)
            k = 2 * t + 8 * n
            B[:, k, g], B[:, k + 1, g] = _from_half(v & 0xFFFF, ab), _from_half(v >> 16, ab)
        for n, name in enumerate(c):
            C[:, g + 8 * (n >> 1), 2 * t + (n & 1)] = self.fval(name).reshape(warps, 32)
        D = (A @ B + C).astype(np.float32)
        for n, name in enumerate(d):
            self.fwrite(name, D[:, g + 8 * (n >> 1), 2 * t + (n & 1)].reshape(-1), None)
        self.mmas += 1


def _to_half(x: np.ndarray, dt: str) -> np.ndarray:
    """fp32 -> f16 or bf16 bits, rounded to nearest even (finite x)."""
    if dt == "f16":
        return np.asarray(x, np.float32).astype(np.float16).view(np.uint16).astype(np.int64)
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.int64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def _from_half(h, dt: str) -> np.ndarray:
    h = np.asarray(h, np.int64) & 0xFFFF
    if dt == "f16":
        return h.astype(np.uint16).view(np.float16).astype(np.float32)
    return (h << 16).astype(np.uint32).view(np.float32)


def _halves(x: np.ndarray, bf16: int) -> np.ndarray:
    """float64 values (exactly representable) -> their 16-bit patterns."""
    return _to_half(np.asarray(x, np.float32), "bf16" if bf16 else "f16").astype(np.uint16)


def _values_of(bits: np.ndarray, bf16: int) -> np.ndarray:
    return _from_half(bits, "bf16" if bf16 else "f16").astype(np.float64)


def _stored(rows: int, cols: int, ld: int, dtype) -> int:
    """Elements of a rows x cols matrix of leading dimension ld, to its last element exactly."""
    return (rows - 1) * ld + cols


def _activation(x: np.ndarray, act: int) -> np.ndarray:
    import math
    if act == 1:
        return np.maximum(x, 0)
    if act == 2:
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if act == 3:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if act == 4:
        return x / (1 + np.exp(-x))
    return x


def run_on_cpu(defines: dict, m: int, n: int, k: int, lda: int, ldb: int, ldc: int, alpha: float, beta: float,
               seed: int = 0):
    """Build mma_gemm with these -D values (sm_80 PTX), run every block of the grid in ValueRun on
    random A, B, C (and bias) of the build's types, and return (C as stored, the float64 reference
    rounded to C's type, the runs). A and B hold values exact in their 16-bit type; C's ldc
    padding holds a sentinel, and C is NaN where beta == 0 (it must not be read)."""
    result = build_file("mma_gemm", BuildOptions(defines={k_: str(v) for k_, v in defines.items()}, target="sm_80"))
    c = result.constants
    bf16, cf32, bias_mode, act = c["BF16"], c["C_F32"], c["BIAS"], c["ACT"]
    rng = np.random.default_rng(seed)
    ar, ac = (k, m) if c["TRANS_A"] else (m, k)
    br, bc = (n, k) if c["TRANS_B"] else (k, n)
    a = _values_of(_halves(rng.uniform(-1, 1, (ar, ac)), bf16), bf16)
    b = _values_of(_halves(rng.uniform(-1, 1, (br, bc)), bf16), bf16)
    c0 = rng.uniform(-1, 1, (m, n)).astype(np.float32)
    if not cf32:
        c0 = _values_of(_halves(c0, bf16), bf16)

    def lay_out(x, ld, elem_bits, pad):
        rows, cols = x.shape
        full = np.full((rows, ld), pad, elem_bits.dtype if hasattr(elem_bits, "dtype") else np.uint16)
        full[:, :cols] = elem_bits
        return full.reshape(-1)[:_stored(rows, cols, ld, None)]

    a_mem = lay_out(a, lda, _halves(a, bf16), 0x7E00).view(np.uint8).copy()
    b_mem = lay_out(b, ldb, _halves(b, bf16), 0x7E00).view(np.uint8).copy()
    sentinel = 0x7FBADBAD if cf32 else 0x7BAD
    c_bits = (np.asarray(c0, np.float32).view(np.uint32) if cf32 else _halves(c0, bf16))
    if beta == 0:
        c_bits = np.full_like(c_bits, 0x7FC00000 if cf32 else 0x7E00)       # NaN: never read
    c_mem = lay_out(c0, ldc, c_bits, sentinel).view(np.uint8).copy()
    bias = np.zeros(0)
    bias_mem = np.zeros(16, np.uint8)
    if bias_mode:
        bias = rng.uniform(-1, 1, n if bias_mode == 1 else m).astype(np.float32)
        if not cf32:
            bias = _values_of(_halves(bias, bf16), bf16)
        bias_mem = (np.asarray(bias, np.float32).view(np.uint32) if cf32 else _halves(bias, bf16)).view(np.uint8).copy()
    mem = {1: a_mem, 2: b_mem, 3: c_mem, 4: bias_mem}
    params = dict(param_A=1 << 32, param_B=2 << 32, param_C=3 << 32, param_bias=4 << 32, param_M=m, param_N=n,
                  param_K=k, param_lda=lda, param_ldb=ldb, param_ldc=ldc, param_alpha=alpha, param_beta=beta)
    grid = (-(-n // c["BN"]), -(-m // c["BM"]))
    runs = []
    for by, bx in itertools.product(range(grid[1]), range(grid[0])):
        runs.append(ValueRun(result.ptx, c["THREADS"], params, grid, (bx, by), mem, c["SMEM_BYTES"]).run(400_000))
    # the reference, in float64 from the same inputs
    ref = alpha * ((a.T if c["TRANS_A"] else a) @ (b.T if c["TRANS_B"] else b))
    if beta:
        ref = ref + beta * c0
    if bias_mode:
        ref = ref + (bias.reshape(1, n) if bias_mode == 1 else bias.reshape(m, 1))
    ref = _activation(ref, act)
    if cf32:
        got_all = np.frombuffer(c_mem.tobytes(), np.uint32)
        vals = lambda x: x.view(np.float32).astype(np.float64)          # noqa: E731
    else:
        got_all = np.frombuffer(c_mem.tobytes(), np.uint16)
        vals = lambda x: _values_of(x, bf16)                             # noqa: E731
    full = np.full(m * ldc, sentinel, got_all.dtype)
    full[:len(got_all)] = got_all
    full = full.reshape(m, ldc)
    assert (full[:, n:] == sentinel).all(), "C's padding (columns N .. ldc) was written"
    return vals(full[:, :n]), ref, c, runs


CPU_CASES = [
    # (-D values, M, N, K, lda, ldb, ldc, alpha, beta): odd N and ldc (WIDE_C = 0) but where noted
    pytest.param(dict(BM=64, BN=64, WM=32, WN=32, TRANS_B=1, BIAS=1, ACT=2), 37, 45, 32, 32, 32, 45, 1.25, 0.5,
                 id="f16-nt-t64x64-37x45x32-colbias-gelu"),
    # (REALIGN = 0: the realigned path branches per thread at the matrix's end, which ValueRun's
    # uniform branches cannot run; tests/test_mma_gemm_sim.py computes it in ptx_sim)
    pytest.param(dict(WN=32, BF16=1, ALIGN_B=2, BIAS=2, ACT=4, REALIGN=0), 129, 67, 64, 64, 67, 69, 1.0, -0.75,
                 id="bf16-nn-t128x128w64x32-129x67x64-ldb67-rowbias-silu"),
    pytest.param(dict(TRANS_B=1, BIAS=2, ACT=3), 129, 67, 7, 8, 8, 67, 0.5, 1.0,
                 id="f16-nt-t128x128-129x67x7-rowbias-gelu_tanh"),
    pytest.param(dict(C_F32=1, TRANS_A=1, TRANS_B=1, BIAS=1, ACT=1), 37, 45, 21, 40, 24, 47, 1.0, 2.0,
                 id="f16-f32c-tt-t128x128-37x45x21-colbias-relu"),
    pytest.param(dict(BM=64, BN=64, WM=32, WN=32, BF16=1, C_F32=1, BIAS=1), 70, 33, 2, 8, 33 + 7, 33, -1.0, 0.25,
                 id="bf16-f32c-nn-t64x64-70x33x2-colbias"),
    pytest.param(dict(BM=64, BN=64, WM=32, WN=32, TRANS_B=1, BIAS=1, ACT=2), 37, 45, 32, 32, 32, 45, 1.0, 0.0,
                 id="f16-nt-t64x64-37x45x32-beta0"),
    pytest.param(dict(BM=64, BN=64, WM=32, WN=32, WIDE_C=1, BIAS=1, ACT=2), 40, 48, 32, 32, 48, 56, 1.0, 0.5,
                 id="f16-nn-t64x64-40x48x32-WIDE_C"),
]


@pytest.mark.parametrize("defines, m, n, k, lda, ldb, ldc, alpha, beta", sample_every(4, CPU_CASES))
def test_kernel_computes_c_on_the_cpu(defines, m, n, k, lda, ldb, ldc, alpha, beta):
    """The kernel's PTX, every block of the grid executed by ValueRun, gives C = act(alpha op(A)
    op(B) + beta C + bias) of float64 numpy within C's rounding: odd M, N and ldc (the narrow
    epilogue of issue 32: WIDE_C = 0), K of 2 to 64 (one K tile, zero-filled), beta, a bias per
    column or per row, each activation; every element of C inside M x N written, the padding
    between rows (ldc > N) never; C never read where beta == 0 (it holds NaN)."""
    got, ref, c, runs = run_on_cpu(defines, m, n, k, lda, ldb, ldc, alpha, beta)
    assert not np.isnan(got).any(), "elements of C left unwritten (NaN)"
    tol = 1e-5 if c["C_F32"] else (2.0 ** -7 if c["BF16"] else 2.0 ** -10)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * 0.05)
    c_loads = [r for run in runs for r in run.records
               if r["kind"] == "ld.global" and (r["addr"][r["active"]] >> 32 == 3).any()]
    assert bool(c_loads) == (beta != 0), f"{len(c_loads)} loads of C with beta = {beta}"
    if not c["WIDE_C"]:
        # each load and store of C: a lane group (LW lanes) at consecutive addresses of one row
        lw = min(c["WN"], 32)
        for r in (r for run in runs for r in run.records if r["kind"] in ("st.global", "ld.global")):
            if (r["addr"] >> 32 == 3).all():
                assert r["size"] == c["CB"]
                assert (np.diff(r["addr"].reshape(-1, lw), axis=1) == c["CB"]).all()
