"""The portable tensor-core GEMM (kernels_ptx/mma_gemm.sasm: hgemm_mma, bgemm_mma, hgemm_mma_f32c,
bgemm_mma_f32c) on the CPU, for every target of its spec (sm_80, sm_86, sm_89, sm_90, sm_120: the
GPUs other than the H100 are only ever built here; issue 31, "Targets we cannot run here").

Every tiling the untuned dispatch may pick (each entry of the spec's catalog, [[hgemm_mma.config]])
is built for every target with the tile the entry names, and a covering set of calls spreads the
four layouts, the copy widths
ALIGN_A/ALIGN_B (16, 8, 4 bytes by cp.async, 2 through registers), bf16, an fp32 C and the fused
epilogue over the targets, and the batched and grouped launch modes (BATCHED=1, GROUPED=1) on
every target. Each build: ptxas -v without warnings, spills, stack or local memory,
a block's registers and shared memory within the target's limits. Their SASS (nvdisasm): every
loop of the main loop runs HMMA.16816 (.BF16 for bf16, MT x NT x BK / 16 of them) and LDSM.x4
(.MT88 exactly for the MN-major tiles), the loop that copies runs LDGSTS of the operands' copy
width where ALIGN >= 4 and, for ALIGN = 2, two LDG.128 and one STS.128 a 16-byte chunk (REALIGN = 1, the default) or LDG.U16 + STS.U16 (REALIGN = 0), and no LDGSTS for that operand;
the sm_90 build is the portable code (no HGMMA, no WARPGROUP). The `.error` guards refuse bad
tilings with the kernel's message at its line.

Each configuration is built once, when a test first asks for it, and the result is shared by the
tests (`_built`); the default test run builds a sample of the configurations, `-m slow` the rest."""
from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from asmgemm.errors import AsmError
from asmgemm.expand import expand
from asmgemm.isa.arch import arch_for
from asmgemm.kernel_spec import get_spec
from asmgemm.parse import parse_source
from asmgemm.pipeline import BuildOptions, assemble, build_file, resolve_input
from asmgemm.runtime.launch import untuned_size_rule
from asmgemm.files import read_source
from asmgemm.toolchain import disassemble
from catalog_entries import entries_that_split
from sweeps import sample_every
from test_sgemm_sass import _opcode, _sass_instructions, needs_tools

SPEC = get_spec("hgemm_mma")
TARGETS = SPEC.targets
SMS = 132
LAYOUTS = ("nn", "nt", "tn", "tt")
ALIGNS = (16, 8, 4, 2)
LARGE, SMALL = (4096, 4096, 4096), (512, 512, 512)
KERNELS = {(0, 0): "hgemm_mma", (1, 0): "bgemm_mma", (0, 1): "hgemm_mma_f32c", (1, 1): "bgemm_mma_f32c"}
# sm_120 has no SM table in asm/isa/arch.py; compute capability 12.0 has sm_86's 99 KB a block
# (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability")
SMEM_FALLBACK = arch_for("sm_86").sm_limits.shared_per_block_optin


ENTRIES = {e.name: e for e in SPEC.configs}
# the catalog's entries these builds pick per call (as the retired size rules did): the source's
# defaults, the eight-warp tiling that makes room for a 2-byte copy, the 64 x 64 tiles for a small problem;
# and the eight-warp 256-wide tiles, which a Config names (`entry`) to build them on every target
DEFAULT, NARROW, SMALL_TILES = "t128x128_w64x64", "t128x128_w64x32", "t64x64_w32x32"
WIDE = ("t128x256_w64x64", "t256x128_w64x64")


def tiling_name(shape: tuple[int, int, int], align_a: int = 16, align_b: int = 16) -> str:
    """The catalog entry built for a call of this shape whose operands allow copies of align_a /
    align_b bytes: 64 x 64 tiles for the small problem, else the defaults, or WN = 32 for 2-byte copies
    (the defaults' register guard refuses those)."""
    if shape == SMALL:
        return SMALL_TILES
    return NARROW if 2 in (align_a, align_b) else DEFAULT


def untuned(shape: tuple[int, int, int], layout: str = "nn", align_a: int = 16, align_b: int = 16) -> dict:
    """That entry's -D set (what choose_params lays over the defaults for its candidate)."""
    return dict(ENTRIES[tiling_name(shape, align_a, align_b)].set)


@dataclass(frozen=True)
class Config:
    target: str
    shape: tuple[int, int, int]
    layout: str = "nn"
    align_a: int = 16
    align_b: int = 16
    bf16: int = 0
    c_f32: int = 0
    epilogue: tuple = ()          # (("WIDE_C", 1), ("BIAS", 1), ("ACT", 2)): the fused epilogue's -D values
    realign: int = 1              # ALIGN 2: 1 16-byte granules realigned in registers (the default), 2 through a
                                  # cp.async ring, 0 2-byte loads
    entry: str = ""               # a catalog entry named outright, else tiling_name's for the call

    @property
    def tiling(self) -> str:
        return self.entry or tiling_name(self.shape, self.align_a, self.align_b)

    @property
    def kernel(self) -> str:
        return KERNELS[(self.bf16, self.c_f32)]

    @property
    def defines(self) -> dict[str, int]:
        """What the runtime builds for this call: the size rule's tiling, the call parameters, the
        kernel's own defines (BF16, C_F32)."""
        return {**dict(ENTRIES[self.tiling].set),
                "TRANS_A": int(self.layout[0] == "t"), "TRANS_B": int(self.layout[1] == "t"),
                "ALIGN_A": self.align_a, "ALIGN_B": self.align_b, **dict(self.epilogue),
                **dict(get_spec(self.kernel).defines), **({} if self.realign == 1 else {"REALIGN": self.realign})}

    def __str__(self) -> str:
        tiling = dict(ENTRIES[self.tiling].set)
        parts = [self.target, self.kernel, self.layout, f"align{self.align_a}/{self.align_b}"]
        parts += [f"{k}={v}" for k, v in {**tiling, **dict(self.epilogue)}.items()]
        return " ".join(parts + ([] if self.realign == 1 else [f"REALIGN={self.realign}"]))


# (layout, ALIGN_A, ALIGN_B): each orientation of each operand (K- or MN-major) with each copy width,
# every layout twice, equal and mixed widths, both operands through registers once
LAYOUT_ALIGNS = [("nn", 16, 4), ("nn", 8, 2), ("nt", 4, 16), ("nt", 2, 8),
                 ("tn", 16, 16), ("tn", 8, 8), ("tt", 4, 4), ("tt", 2, 2)]
# (kernel's (BF16, C_F32), problem, layout, ALIGN_A, epilogue -D values)
KERNEL_EPILOGUES = [((0, 0), LARGE, "tn", 16, (("WIDE_C", 1), ("BIAS", 1), ("ACT", 2))),
                    ((0, 0), SMALL, "tn", 2, (("BIAS", 2), ("ACT", 4))),
                    ((1, 0), LARGE, "tt", 8, (("ACT", 3),)),
                    ((1, 0), SMALL, "nn", 16, (("WIDE_C", 1), ("BIAS", 1), ("ACT", 2))),
                    ((0, 1), LARGE, "nn", 4, (("WIDE_C", 1), ("BIAS", 1), ("ACT", 2))),
                    ((1, 1), SMALL, "tt", 16, (("BIAS", 2), ("ACT", 1)))]


# the launch modes (call values batched, grouped): grid z over a batch, problems along M from offs
LAUNCH_MODES = ("BATCHED", "GROUPED")


def configs() -> list[Config]:
    """The builds: LAYOUT_ALIGNS on the large problem (the default tiling, or WN = 32 where a copy
    is 2 bytes wide) and KERNEL_EPILOGUES (bf16, fp32 C, bias per column and per row, each
    activation, WIDE_C), spread over the targets; then, for each target, each catalog tiling it
    has not been built with yet (the large problem aligned and with a 2-byte A, the small one, the
    256-wide tiles)."""
    out = [Config(TARGETS[n % len(TARGETS)], LARGE, layout, a, b) for n, (layout, a, b) in enumerate(LAYOUT_ALIGNS)]
    out += [Config(TARGETS[(n + 3) % len(TARGETS)], shape, layout, a, 16, bf16, c_f32, epi)
            for n, ((bf16, c_f32), shape, layout, a, epi) in enumerate(KERNEL_EPILOGUES)]
    # issue 33's launch modes on every target, over the layouts, copy widths and kernels
    out += [Config(target, LARGE if n % 2 else SMALL, LAYOUTS[(n + m) % 4], (16, 8, 2, 4, 16)[n],
                   (4, 16, 8, 2, 16)[(n + m) % 5], (n + m) % 2, (n // 2 + m) % 2,
                   ((mode, 1),) + ((("BIAS", 1), ("ACT", 4)) if n == 2 else ()))
            for m, mode in enumerate(LAUNCH_MODES) for n, target in enumerate(TARGETS)]
    # the 2-byte loads (REALIGN = 0) of an odd leading dimension, kept for the A/B against the realigned path
    out += [dataclasses.replace(c, realign=0) for c in out[:len(LAYOUT_ALIGNS)] if 2 in (c.align_a, c.align_b)]
    # and through the cp.async ring (REALIGN = 2, opt-in: its raw ring needs 192 KB of shared memory at
    # 128 x 128 with 4 stages, so sm_90 only here)
    out += [Config("sm_90", LARGE, layout, 2, 2, realign=2) for layout in ("nn", "tn")]
    have = {(c.target, _tiling_key(c)) for c in out}
    for ti, target in enumerate(TARGETS):
        # (the wide tiles copy 16-byte rows only: their guard, test_bad_parameters_... below)
        wide = [Config(target, LARGE, entry=name) for name in WIDE]
        for n, cfg in enumerate([Config(target, LARGE), Config(target, SMALL), Config(target, LARGE, align_a=2)] + wide):
            cfg = dataclasses.replace(cfg, layout=LAYOUTS[(ti + n) % 4])
            if (target, _tiling_key(cfg)) not in have:
                out.append(cfg)
                have.add((target, _tiling_key(cfg)))
    return list(dict.fromkeys(out))


def _tiling_key(c: Config) -> tuple:
    return tuple(sorted(dict(ENTRIES[c.tiling].set).items()))


CONFIGS = configs()
# every 10th: five of the 41 builds, each with ptxas and nvdisasm, sm_120 and a 256-wide tile among them
PARAMS = sample_every(10, CONFIGS)


@dataclass
class Built:
    constants: dict
    kernel: object                # toolchain.KernelResources
    warnings: list
    sass: str


@functools.lru_cache(maxsize=None)
def _build_one(cfg: Config) -> Built | AsmError:
    """The build, its ptxas figures and SASS, or the AsmError that stopped it (kept, so that one
    failing configuration fails its own tests only)."""
    try:
        result = build_file("mma_gemm", BuildOptions(defines={k: str(v) for k, v in cfg.defines.items()},
                                                     target=cfg.target))
        asm = assemble(result)
        (kernel,) = asm.kernels
        return Built(result.constants, kernel, asm.warnings, disassemble(asm.cubin))
    except AsmError as exc:
        return exc


def _built(cfg: Config) -> Built:
    built = _build_one(cfg)
    if isinstance(built, AsmError):
        pytest.fail(f"{cfg}: the build failed: {built}", pytrace=False)
    return built


def _loops(sass: str) -> list[list[str]]:
    """The bodies (instruction text, ptxas's `@!PT` padding left out) of every backward branch."""
    labels, pending = {}, []
    for line in sass.splitlines():
        m = re.match(r"^\.(L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)
        if m and pending:
            labels.update({p: int(m.group(1), 16) for p in pending})
            pending = []
    ins = _sass_instructions(sass)
    out = []
    for addr, text in ins:
        m = re.search(r"BRA\S*\s.*\(\.(L_x_\d+)\)", text)
        if m and labels.get(m.group(1), addr + 1) <= addr:
            out.append([t for a, t in ins if labels[m.group(1)] <= a <= addr and not t.startswith("@!PT ")])
    return out


def _counts(body: list[str]) -> Counter:
    return Counter(_opcode(t) for t in body)


def _total(counts: Counter, prefix: str) -> int:
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))


# ---- the untuned tilings -------------------------------------------------------------------------
def test_every_catalog_tiling_is_built_on_every_target():
    """The tilings built below are the catalog's entries, every one on every target; hgemm_mma has
    no size rules left to pick behind the catalog's back, and a call's candidates are its entries."""
    from asmgemm.runtime.catalog import candidates
    assert {DEFAULT, NARROW, SMALL_TILES, *WIDE} == set(ENTRIES) and not SPEC.size_rules
    wanted = {tuple(sorted(dict(e.set).items())) for e in SPEC.configs}
    for target in TARGETS:
        assert {_tiling_key(c) for c in CONFIGS if c.target == target} == wanted, f"{target} misses a tiling"
        cands = candidates(SPEC, 4096, 4096, target, plain=True)
        assert [c.config for c in cands if c.splits == 1] == list(ENTRIES)
        # each entry but the unsplit 256-wide tiles also splits K (the SPLIT_K build of the same
        # tiling and the reduce kernel; the one-launch sum, SPLIT_FIXUP, is params= only; a fused
        # epilogue never splits)
        assert {c.config for c in cands if c.splits > 1 and c.reduce == "kernel"} == \
            {e.name for e in entries_that_split("hgemm_mma")} == set(ENTRIES) - set(WIDE)
        assert all(c.splits == 1 for c in candidates(SPEC, 4096, 4096, target, plain=False))
    for shape, layout in itertools.product((LARGE, SMALL), LAYOUTS):
        assert untuned_size_rule(SPEC, *shape, layout, SMS) == {}


def test_the_configs_cover_layouts_aligns_kernels_and_epilogues():
    """The covering set: each operand in each orientation with each copy width, every layout, the
    four kernels, bias per column and per row, each activation, WIDE_C; 2-byte copies on every
    target."""
    assert {(c.layout[0], c.align_a) for c in CONFIGS} == set(itertools.product("nt", ALIGNS))
    assert {(c.layout[1], c.align_b) for c in CONFIGS} == set(itertools.product("nt", ALIGNS))
    assert {c.layout for c in CONFIGS} == set(LAYOUTS)
    assert {c.kernel for c in CONFIGS} == set(KERNELS.values())
    epi = {kv for c in CONFIGS for kv in c.epilogue}
    assert {("BIAS", 1), ("BIAS", 2), ("WIDE_C", 1)} | {("ACT", a) for a in range(1, 5)} <= epi
    assert set(TARGETS) == {c.target for c in CONFIGS if c.align_a == 2 or c.align_b == 2}
    for mode in LAUNCH_MODES:
        assert set(TARGETS) == {c.target for c in CONFIGS if (mode, 1) in c.epilogue}, mode


# ---- ptxas ---------------------------------------------------------------------------------------
@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("cfg", PARAMS, ids=str)
def test_builds_without_spills_or_local_memory(cfg):
    """ptxas -v: no warning, no spill, no stack frame or local memory; one block's registers and
    shared memory fit the target."""
    b = _built(cfg)
    k, c = b.kernel, b.constants
    assert not b.warnings, b.warnings
    assert k.spill_stores == k.spill_loads == 0, f"{cfg}: spills {k}"
    assert k.stack_frame == k.local_bytes == 0, f"{cfg}: local memory {k}"
    limits = arch_for(cfg.target).sm_limits
    assert 0 < k.registers <= 255 and k.registers * c["THREADS"] <= 65536, f"{cfg}: {k.registers} registers"
    smem = limits.shared_per_block_optin if limits else SMEM_FALLBACK
    assert c["SMEM_BYTES"] + k.shared_bytes <= smem, f"{cfg}: {c['SMEM_BYTES']} bytes of shared memory"
    # the catalog entry's tile (the cost model's unit of work) is the build's own
    assert (c["BM"], c["BN"], c["BK"]) == ENTRIES[cfg.tiling].tile, cfg


# ---- SASS ----------------------------------------------------------------------------------------
@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("cfg", PARAMS, ids=str)
def test_main_loop_runs_hmma_ldsm_and_the_copies_of_its_alignment(cfg):
    """nvdisasm: the loops of the main loop (steady state, last tile, tiles past K; unrolled or
    not) run the tensor-core instructions the tiling asks for, the copying one the copies of each
    operand's width; no local memory, no Hopper-only instruction."""
    b = _built(cfg)
    c = b.constants
    ops = [_opcode(t) for _, t in _sass_instructions(b.sass)]
    assert not any(op.startswith(("LDL", "STL")) for op in ops), f"{cfg}: local memory in the SASS"
    assert not any(op.startswith(("HGMMA", "WARPGROUP", "UTMALDG")) for op in ops), f"{cfg}: Hopper-only code"
    loops = [_counts(body) for body in _loops(b.sass)]
    loops = [n for n in loops if _total(n, "HMMA")]
    assert loops, f"{cfg}: no loop runs HMMA"
    mt, nt, ksteps = c["WM"] // 16, c["WN"] // 8, c["BK"] // 16
    hmma = "HMMA.16816.F32.BF16" if cfg.bf16 else "HMMA.16816.F32"
    trans = ksteps * (mt * (1 - c["KC_A"]) + nt // 2 * (1 - c["KC_B"]))
    for n in loops:
        # per K tile (ptxas may unroll a loop: one barrier a tile): KSTEPS k16 steps of MT x NT
        # mma.sync m16n8k16 and MT + NT / 2 ldmatrix.x4 each, .trans for MN-major tiles
        tiles = _total(n, "BAR")
        assert tiles >= 1 and n[hmma] == _total(n, "HMMA") == tiles * mt * nt * ksteps, f"{cfg}: {n}"
        assert _total(n, "LDSM") == tiles * ksteps * (mt + nt // 2), f"{cfg}: {n}"
        assert n["LDSM.16.MT88.4"] == tiles * trans and n["LDSM.16.M88.4"] == _total(n, "LDSM") - tiles * trans, \
            f"{cfg}: {n}"
    # the steady-state loop: the one that copies most (the last ones copy nothing: tiles past K)
    # (a realigned operand's guarded loop holds each chunk's loads twice: its fast form and the
    # branch taken at the edges; the interior blocks' loop, the one that copies least of those that
    # copy, holds them once)
    copying = [n for n in loops if _total(n, "LDGSTS") + _total(n, "LDG")]
    main = min(copying, key=lambda n: (_total(n, "LDGSTS") + _total(n, "LDG")) / _total(n, "BAR"))
    tiles = _total(main, "BAR")
    cp_chunks = sum(c[f"NCH_{x}"] for x in "AB" if c[f"ALIGN_{x}"] >= 4)
    staged = sum(c[f"NCH_{x}"] for x in "AB" if c[f"STAGED_{x}"])
    realigned = sum(c[f"NCH_{x}"] for x in "AB" if c[f"REALIGN_{x}"])
    ring = sum(c[f"NCH_{x}"] for x in "AB" if c[f"RING_{x}"])
    for x, align in (("A", cfg.align_a), ("B", cfg.align_b)):
        assert (c[f"STAGED_{x}"], c[f"REALIGN_{x}"], c[f"RING_{x}"]) == \
            tuple(int(align == 2 and cfg.realign == r) for r in (0, 1, 2)), cfg
    # a realigned chunk: two 16-byte granules (LDG.128 through L1's non-coherent path), one STS.128;
    # through the ring: two 16-byte cp.async (LDGSTS) of its granules, two LDS.128, one STS.128; a
    # guarded ring loop (its copies zero-fill: LDGSTS...ZFILL) also stores each granule from the
    # matrix's last granule's words where that is the one it reads (lg: one more STS.128 a granule)
    assert main["LDG.E.128.CONSTANT"] == 2 * tiles * realigned, f"{cfg}: {main}"
    for n in copying:
        guarded = int(any(op.endswith(".ZFILL") for op in n))
        assert n["STS.128"] == _total(n, "BAR") * (realigned + ring + guarded * 2 * ring), f"{cfg}: {n}"
        assert n["LDS.128"] == _total(n, "BAR") * 2 * ring, f"{cfg}: {n}"
    assert _total(main, "LDGSTS") == tiles * (cp_chunks + 2 * ring), f"{cfg}: {main}"
    # cp.async of 16 bytes bypasses L1 (.cg: LDGSTS.E.BYPASS...128), 8 and 4 bytes do not (.ca)
    kinds = {16: "LDGSTS.E.BYPASS.LTC128B.128", 8: "LDGSTS.E.LTC128B.64", 4: "LDGSTS.E.LTC128B"}
    chunks = Counter()
    for x in "AB":
        if c[f"ALIGN_{x}"] >= 4:
            chunks[kinds[c[f"ALIGN_{x}"]]] += c[f"NCH_{x}"]
        if c[f"RING_{x}"]:
            chunks[kinds[16]] += 2 * c[f"NCH_{x}"]
    for kind, n in chunks.items():
        assert main[kind] + main[kind + ".ZFILL"] == tiles * n, f"{cfg}: {tiles} x {n} {kind} expected: {main}"
    assert main["LDG.E.U16.CONSTANT"] == main["STS.U16"] == tiles * staged, f"{cfg}: {main}"
    if not cp_chunks and not ring:
        assert not any(op.startswith("LDGSTS") for op in ops), f"{cfg}: cp.async with 2-byte copies only"


@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("cfg", PARAMS, ids=str)
def test_epilogue_stores_c_by_the_width_of_its_rows(cfg):
    """nvdisasm: the stores of C (the epilogue's straight-line code, WM x WN / 32 elements a thread)
    are 16-byte pieces where C's rows are (WIDE_C = 1: STG.E.128), else one element a lane
    (STG.E.U16 for a 16-bit C, STG.E for fp32), each of them a warp's LW consecutive columns of one
    row (tests/test_mma_swizzle_model.py checks the addresses): issue 32's narrow epilogue, which
    replaced EV consecutive columns a lane (2 bytes stored in every 16)."""
    b = _built(cfg)
    c = b.constants
    stg = Counter(op for op in (_opcode(t) for _, t in _sass_instructions(b.sass)) if op.startswith("STG"))
    elements = c["WM"] * c["WN"] // 32
    if c["WIDE_C"]:
        assert stg == Counter({"STG.E.128": elements // c["EV"]}), f"{cfg}: {stg}"
    else:
        assert stg == Counter({"STG.E" if c["C_F32"] else "STG.E.U16": elements}), f"{cfg}: {stg}"


@pytest.mark.parametrize("layout, epilogue", sample_every(2, [
    pytest.param("nn", dict(WIDE_C=1, BIAS=1), id="nn WIDE_C=1 BIAS=1"),
    pytest.param("tt", dict(BIAS=1, ACT=2), id="tt BIAS=1 ACT=2"),
    pytest.param("tn", dict(BIAS=1), id="tn BIAS=1"),
    pytest.param("nt", dict(WIDE_C=1, BIAS=1, ACT=2), id="nt WIDE_C=1 BIAS=1 ACT=2"),
]))
def test_default_tiling_with_a_column_bias_fits_the_register_plan(layout, epilogue):
    """gemm(a, b, bias=per_column[, activation="gelu"]) on fp16 or bf16 with a 16-bit C large
    enough for the default tiling (e.g. 4096^3, C rows 16-byte aligned: WIDE_C=1) builds. It did
    not while the main loop's fragments and addresses were .regs, a register each for the whole
    kernel ("cannot place register 'w3': no free index in R0..R254"): now .temps."""
    defines = {"TRANS_A": int(layout[0] == "t"), "TRANS_B": int(layout[1] == "t"), **epilogue}
    assert untuned(LARGE, layout) == {}               # the default entry: the source's defaults
    build_file("mma_gemm", BuildOptions(defines={k: str(v) for k, v in defines.items()}, target="sm_80"))


# ---- the .error guards ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _parsed():
    return parse_source(read_source(resolve_input("mma_gemm")))


@pytest.mark.parametrize("defines, message", [
    (dict(BK=48), "BK is 32 or 64"),
    (dict(STAGES=2), "STAGES is 3 to 6"),
    (dict(STAGES=7), "STAGES is 3 to 6"),
    (dict(WM=48), "multiples of the warp tile"),
    (dict(ALIGN_A=3), "ALIGN_A and ALIGN_B are 16, 8, 4 or 2"),
    (dict(ALIGN_B=1), "ALIGN_A and ALIGN_B are 16, 8, 4 or 2"),
    (dict(ALIGN_B=2), "too many registers in its main loop"),       # the default 64 x 64 warp tile
    (dict(ALIGN_A=2, TRANS_A=1), "too many registers in its main loop"),
    (dict(BIAS=3), "BIAS is 0"),
    (dict(ACT=5), "ACT is 0"),
    (dict(L2_PREFETCH=64), "L2_PREFETCH is 0, 128 or 256"),
    (dict(BM=256, BN=256, WM=32, WN=32), "more than 1024 threads"),
    (dict(REALIGN=3), "REALIGN is 0"),
    # one warp: an MN-major A's chunk rows 4 apart, each at its own granule offset
    (dict(BM=64, BN=64, WM=64, WN=64, TRANS_A=1, ALIGN_A=2), "REALIGN = 1 needs"),
    # the 256-wide catalog tiles: ptxas spills them with 8- or 4-byte copies on sm_80-sm_89
    (dict(BN=256, ALIGN_B=4), "eight warps of 64 x 64 copy 16-byte rows only"),
    (dict(BM=256, ALIGN_A=8, TRANS_B=1), "eight warps of 64 x 64 copy 16-byte rows only"),
])
def test_bad_parameters_stop_at_the_kernels_error(defines, message):
    """Refused while expanding (as a build does; the first one through build_file itself), with
    the kernel's message and a span on its `.error` line in mma_gemm/config.inc."""
    with pytest.raises(AsmError) as err:
        if defines == dict(BK=48):
            build_file("mma_gemm", BuildOptions(defines={k: str(v) for k, v in defines.items()}, target="sm_80"))
        else:
            expand(_parsed(), {k: str(v) for k, v in defines.items()})
    e = err.value
    assert message in e.message
    assert e.span is not None and Path(e.span.source.path).parts[-2:] == ("mma_gemm", "config.inc")
    line = e.span.source.line_text(e.span.line)
    assert line.lstrip().startswith(".error") and message.split(" ")[0] in line, line


def test_the_catalogs_narrow_warp_tile_makes_room_for_2_byte_copies():
    """ALIGN = 2 on the default 64 x 64 warp tiles is refused (above), so dispatch passes over that
    entry (tests/test_dispatch.py); the catalog's WN = 32 entry takes it for either operand, or both,
    in every layout."""
    for layout, (a, b) in itertools.product(LAYOUTS, [(2, 16), (16, 2), (2, 2)]):
        tiling = untuned(LARGE, layout, a, b)
        assert tiling == {"WN": 32}
        expand(_parsed(), {k: str(v) for k, v in {**tiling, "TRANS_A": int(layout[0] == "t"),
                                                   "TRANS_B": int(layout[1] == "t"), "ALIGN_A": a,
                                                   "ALIGN_B": b}.items()})
