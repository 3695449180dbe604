"""sm_90 (Hopper, H100) instruction timing: the one table the scheduler and the control-code model
read. Data only; the code that uses it is in depgraph.py, list_scheduler.py and control_codes.py.
Which targets it serves: `timing_table(arch_for(target))` at the end of this file.

Each row is one class of SASS instruction (the PTX instructions that ptxas lowers to it are mapped
by classify.py). Every figure carries the key of its source in SOURCES: first our own H100
microbenchmark (H100-UBENCH, tools/sched_latency_ubench.py), then NVIDIA's documents and papers;
figures that none of them gives are marked `ESTIMATE` (MEASURE_ON_H100 lists them by priority).
`estimated_figures()` counts them, and a test keeps every key valid.

Terms, all in core clock cycles of one SM sub-partition (SMSP: one warp scheduler, 4 per SM):
  latency       issue of the producer -> earliest issue of a dependent instruction.
  issue         cycles the instruction's pipe is busy with one warp instruction (the reciprocal of
                its throughput on one SMSP): a second instruction of the same pipe issues no sooner.
                From a vendor "results per clock per SM" figure R: issue = 32 / (R / 4) = 128 / R.
  variable      True: the hardware tracks the result with a scoreboard (SASS "write barrier",
                6 per warp on Volta and later) and consumers wait on it; False: the result is ready
                after a fixed latency that the stall counts of the instructions in between cover.
  read_latency  for instructions that read their source registers after issue (memory and MIO
                operations): cycles until the sources have been read, so that an instruction that
                overwrites them must wait (a SASS "read barrier"). 0: sources read at issue.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    key: str
    cite: str


SOURCES = {s.key: s for s in [
    Source("H100-UBENCH",
           "tools/sched_latency_ubench.py, run by us on an NVIDIA H100 80GB HBM3 (sm_90, CUDA 13.0 "
           "driver JIT) on 2026-11-23: one warp, chains of 128 dependent instructions x 64 loop trips "
           "between two %clock64 reads, median of 5 runs (all 5 within 0.1%); issue costs from 8 "
           "independent chains. Each chain was checked with ptxas 13.0 + nvdisasm to compile to the "
           "SASS named. Raw numbers: tools/data/sched_latency_h100.json"),
    Source("PTXAS-OBS",
           "what ptxas 13.0 does for sm_90, observed with `asmgemm sched --compare-sass` on "
           "kernels_ptx/sgemm.sasm (2026-11-23): back-to-back STS, LDS.128 and LDG get stall 4, and "
           "ptxas spaces shared loads 4 instructions apart among FFMAs even when the PTX bunches "
           "them; modelled as one LD/ST issue port per SMSP taking 4 cycles per warp memory "
           "instruction (32 threads over 8 LD/ST lanes, as NVIDIA's SM diagrams draw them: not "
           "verified here). With it the model agrees with 1528 of ptxas's 1536 stall counts on "
           "ptxas's own order of the SGEMM regions (STS 4/4, LDS 69/69, FFMA 1455/1463). Other widths "
           "and STG/LDSM are assumed to behave alike"),
    Source("PG-THROUGHPUT",
           "NVIDIA CUDA C++ Programming Guide, 'Arithmetic Instructions' (section 5.4.1 in CUDA "
           "12.x), table 'Throughput of Native Arithmetic Instructions (operations per clock cycle "
           "per multiprocessor)', compute capability 9.0 column; issue cycles per warp instruction "
           "on one SMSP = 128 / results-per-clock-per-SM"),
    Source("PG-LATENCY",
           "NVIDIA CUDA C++ Programming Guide, 'Multiprocessor Level' (section 5.2.3 in CUDA 12.x): "
           "the execution time of most arithmetic instructions is typically 4 clock cycles on "
           "compute capability 7.x; Jia et al. 2018 (JIA2018) measure 4 cycles for FFMA/FADD on Volta. "
           "Used for fixed-latency ALU classes we did not measure on the H100"),
    Source("JIA2018",
           "Z. Jia, M. Maggioni, B. Staiger, D. P. Scarpazza, 'Dissecting the NVIDIA Volta GPU "
           "Architecture via Microbenchmarking', arXiv:1804.06826 (2018): 128-bit instruction words, "
           "per-instruction control bits (4 reuse, 6-bit wait mask, 3-bit read barrier, 3-bit write "
           "barrier, yield, 4-bit stall), 6 dependency barriers for variable-latency instructions"),
    Source("JIA2019",
           "Z. Jia, M. Maggioni, J. Smith, D. P. Scarpazza, 'Dissecting the NVidia Turing T4 GPU via "
           "Microbenchmarking', arXiv:1903.07486 (2019): same control-bit layout on Turing"),
    Source("LUO2024",
           "W. Luo, R. Fan, Z. Li, D. Du, Q. Wang, X. Chu, 'Benchmarking and Dissecting the Nvidia "
           "Hopper GPU Architecture', arXiv:2402.13499 (2024): pointer-chasing memory latencies on "
           "Hopper; their L2-hit figure (~260 cycles) agrees with our H100-UBENCH ldg_l2 (260.05)"),
    Source("PG-SMEM",
           "NVIDIA CUDA C++ Programming Guide, shared memory (compute capability 5.x and later): 32 "
           "banks of successive 32-bit words, each delivering 32 bits per clock; a conflict-free "
           "warp access of 4-byte words takes one 128-byte wavefront, 8-byte words two, 16-byte "
           "words four. Issue costs of LDS/STS/LDSM widths derive from this"),
    Source("H100-WP",
           "NVIDIA H100 Tensor Core GPU Architecture whitepaper: 132 SMs (SXM5), 4 SMSPs per SM, "
           "dense FP16/BF16 tensor peak 989.4 TFLOPS, TF32 494.7 TFLOPS, INT8 1978.9 TOPS, FP64 tensor "
           "66.9 TFLOPS at 1830 MHz boost. Tensor issue costs derive from these peaks "
           "(FMA/clock/SMSP = peak / (2 x 132 x 4 x 1.83e9)); mma.sync is reported not to reach the "
           "wgmma peak, so these are lower bounds"),
    Source("MAXAS",
           "S. Gray, maxas (github.com/NervanaSystems/maxas), MaxAs.pm scheduler and the wiki "
           "'Control Codes': list scheduling by stall/mix/dependents; yield set with stalls > 4"),
    Source("ESTIMATE",
           "no measurement or document: an estimate by analogy with the classes above, to be "
           "measured on the H100 (see MEASURE_ON_H100)"),
]}


@dataclass(frozen=True)
class Timing:
    sass: str               # the SASS opcode ptxas emits for this class (what the inspector shows)
    pipe: str               # issue resource shared by the classes that name it
    latency: int
    latency_src: str
    issue: int
    issue_src: str
    variable: bool = False
    read_latency: int = 0
    read_src: str = ""
    note: str = ""

    def sources(self) -> dict[str, str]:
        out = {"latency": self.latency_src, "issue": self.issue_src}
        if self.read_latency:
            out["read_latency"] = self.read_src
        return out


# Pipes (per SMSP on Hopper, H100 whitepaper): 'fma' = the two 16-lane FP32 datapaths (FFMA goes
# to either, so one FFMA per cycle); 'fmaheavy' = IMAD, which only one of them executes; 'alu' =
# 16 INT32 lanes; 'fp64' = 16 FP64 lanes; 'xu' = 4 special-function lanes; 'smem' = the shared
# memory/MIO path of warp shuffles; 'lsu' = the LD/ST issue port of every shared, global and local
# memory instruction; 'tensor' = the SMSP's tensor core; 'cbu' =
# barriers and fences.
# The shared-memory and global-memory classes share ONE issue port, 'lsu' (PTXAS-OBS): a warp
# issues at most one memory instruction per 4 cycles; bandwidth (wavefronts) is not modelled.
_F = "PG-THROUGHPUT"
_L = "PG-LATENCY"
_U = "H100-UBENCH"
_O = "PTXAS-OBS"
_E = "ESTIMATE"

TABLE: dict[str, Timing] = {
    # ---- FP32 / FP16 / FP64 arithmetic (fixed latency) ---------------------------------------
    "FFMA":  Timing("FFMA", "fma", 4, _U, 1, _U, note="fma.rn.f32, mad.f32: measured 4.06 / issue 1.09"),
    "FMUL":  Timing("FMUL", "fma", 4, _U, 1, _F, note="mul.f32: measured 4.06; 128 results/clk/SM"),
    "FADD":  Timing("FADD", "fma", 4, _U, 1, _F, note="add/sub.f32: measured 4.06; 128 results/clk/SM"),
    "FMNMX": Timing("FMNMX", "alu", 4, _L, 2, _F, note="min/max.f32: 64/clk/SM"),
    "HFMA2": Timing("HFMA2", "fma", 8, _U, 1, _F,
                    note="f16x2 fma chain: 8.04 per instruction; ptxas split the chain between HFMA2 "
                         "and HFMA2.MMA, so this is their average"),
    "DFMA":  Timing("DFMA", "fp64", 8, _U, 2, _U, note="f64 fma: measured 8.02 / issue 2.07"),
    # ---- integer (fixed latency) -------------------------------------------------------------
    "IMAD":  Timing("IMAD", "fmaheavy", 4, _U, 2, _U, note="mad.lo.u32: measured 4.06 / issue 2.07"),
    "IADD3": Timing("IADD3", "alu", 4, _L, 2, _F,
                    note="an alternating add.u32/xor.b32 chain (IMAD.IADD + LOP3.LUT) measured 10.02 "
                         "cycles per pair: a pipe-change cost the model does not have"),
    "LOP3":  Timing("LOP3", "alu", 4, _L, 2, _F, note="see IADD3"),
    "SHF":   Timing("SHF", "alu", 4, _U, 2, _F, note="shf.l.wrap: measured 4.06"),
    "MOV":   Timing("MOV", "alu", 4, _L, 2, _F, note="register moves; ptxas often emits IMAD.MOV"),
    "SEL":   Timing("SEL", "alu", 4, _U, 2, _F, note="setp+selp chain: 8.06 per pair, split 4 + 4"),
    "PRMT":  Timing("PRMT", "alu", 4, _L, 2, _F),
    "ISETP": Timing("ISETP", "alu", 4, _U, 2, _F, note="setp+selp chain: 8.06 per pair, split 4 + 4"),
    # ---- special function unit and conversions (variable latency, scoreboard) ------------------
    "MUFU":  Timing("MUFU", "xu", 17, _U, 8, _U, variable=True,
                    note="ex2.approx.ftz: measured 17.00 / issue 8.07 (16 results/clk/SM)"),
    "CVT":   Timing("F2I", "xu", 12, _U, 8, _F, variable=True,
                    note="I2F + FMUL + F2I chain: 28.01; (28 - 4) / 2 per conversion"),
    "POPC":  Timing("POPC", "xu", 17, _U, 8, _F, variable=True, note="popc.b32: measured 17.00"),
    "S2R":   Timing("S2R", "xu", 20, _E, 1, _E, variable=True, note="mov from %tid, %ctaid, ..."),
    "LDC":   Timing("LDC", "lsu", 12, _E, 1, _E, variable=True, note="ld.param / ld.const"),
    # ---- warp-level --------------------------------------------------------------------------
    "SHFL":  Timing("SHFL", "smem", 26, _U, 4, _F, variable=True, read_latency=2, read_src=_E,
                    note="shfl.sync.idx (lane = the shuffled value): measured 26.00; 32 results/clk/SM"),
    "VOTE":  Timing("VOTE", "alu", 4, _L, 2, _E),
    # ---- shared memory -----------------------------------------------------------------------
    "LDS32":  Timing("LDS", "lsu", 23, _U, 4, _O, variable=True, read_latency=2,
                     read_src=_E, note="pointer chase: measured 23.00"),
    "LDS64":  Timing("LDS.64", "lsu", 23, _U, 4, _O, variable=True, read_latency=2,
                     read_src=_E, note="pointer chase: measured 23.00"),
    "LDS128": Timing("LDS.128", "lsu", 26, _U, 4, _O, variable=True,
                     read_latency=2, read_src=_E, note="pointer chase: measured 26.00"),
    "STS32":  Timing("STS", "lsu", 1, _E, 4, _O, read_latency=4, read_src=_E),
    "STS64":  Timing("STS.64", "lsu", 2, _E, 4, _O, read_latency=4, read_src=_E),
    "STS128": Timing("STS.128", "lsu", 4, _E, 4, _O, read_latency=4, read_src=_E),
    "LDSM1":  Timing("LDSM", "lsu", 24, _E, 4, _O, variable=True, read_latency=2,
                     read_src=_E, note="ldmatrix .x1: one 8x8 b16 matrix = one wavefront; latency "
                     "taken from LDS32 + 1"),
    "LDSM2":  Timing("LDSM", "lsu", 25, _E, 4, _O, variable=True, read_latency=2,
                     read_src=_E),
    "LDSM4":  Timing("LDSM", "lsu", 27, _E, 4, _O, variable=True, read_latency=2,
                     read_src=_E),
    "STSM":   Timing("STSM", "lsu", 4, _E, 4, _O, read_latency=4, read_src=_E),
    "ATOMS":  Timing("ATOMS", "lsu", 40, _E, 4, _E, variable=True, read_latency=4, read_src=_E),
    # ---- global / local memory ---------------------------------------------------------------
    "LDG":    Timing("LDG", "lsu", 260, _U, 4, _O, variable=True, read_latency=4,
                     read_src=_E, note="L2 hit (ld.global.cg chase): measured 260.05, as LUO2024; "
                     "an L1 hit (ld.global / .ca chase) measured 34.03; DRAM is longer"),
    "STG":    Timing("STG", "lsu", 1, _E, 4, _O, read_latency=4, read_src=_E),
    "LDL":    Timing("LDL", "lsu", 34, _U, 4, _E, variable=True, read_latency=4, read_src=_E,
                     note="local memory, assumed L1-resident: the L1-hit LDG figure"),
    "STL":    Timing("STL", "lsu", 1, _E, 4, _E, read_latency=4, read_src=_E),
    "ATOMG":  Timing("ATOMG", "lsu", 300, _E, 4, _E, variable=True, read_latency=4, read_src=_E),
    # cp.async: no register result; `latency` is when the copy has landed in shared memory, which
    # is what cp.async.wait_group waits for.
    "LDGSTS": Timing("LDGSTS", "lsu", 260, _E, 4, _O, read_latency=4, read_src=_E,
                     note="cp.async: completion assumed equal to an L2-hit global load (H100-UBENCH)"),
    "LDGDEPBAR": Timing("LDGDEPBAR", "lsu", 1, _E, 1, _E, note="cp.async.commit_group"),
    "DEPBAR": Timing("DEPBAR", "cbu", 1, _E, 1, _E, note="cp.async.wait_group / wait_all"),
    "TMA":    Timing("UTMALDG", "lsu", 260, _E, 1, _E, read_latency=4, read_src=_E,
                     note="cp.async.bulk*: completion signalled through an mbarrier"),
    # ---- tensor cores (mma.sync): variable latency; issue from the whitepaper peak --------------
    "HMMA":   Timing("HMMA", "tensor", 24, _U, 4, "H100-WP", variable=True, read_latency=2,
                     read_src=_E, note="m16n8k16 f16->f32, accumulator chain: measured 24.09; issue "
                     "2048 FMA / 512 FMA/clk/SMSP, scaled with the shape (classify.py)"),
    "HMMA_TF32": Timing("HMMA", "tensor", 24, _E, 4, "H100-WP", variable=True, read_latency=2,
                        read_src=_E, note="m16n8k8 tf32: latency taken from the f16 HMMA"),
    "IMMA":   Timing("IMMA", "tensor", 24, _E, 4, "H100-WP", variable=True, read_latency=2,
                     read_src=_E, note="m16n8k32 s8: latency taken from the f16 HMMA"),
    "DMMA":   Timing("DMMA", "tensor", 24, _E, 8, "H100-WP", variable=True, read_latency=2,
                     read_src=_E, note="m8n8k4 f64: latency taken from the f16 HMMA"),
    # ---- control / synchronisation (never moved by the scheduler) ------------------------------
    "BAR":    Timing("BAR", "cbu", 1, _E, 1, _E),
    "FENCE":  Timing("MEMBAR", "cbu", 1, _E, 1, _E),
    "MBAR":   Timing("SYNCS", "smem", 20, _E, 1, _E, variable=True, read_latency=2, read_src=_E,
                     note="mbarrier.*"),
    "WGMMA":  Timing("HGMMA", "tensor", 1, _E, 1, _E, note="wgmma.*: kept in place"),
    "CS2R":   Timing("CS2R", "alu", 4, _E, 1, _E, note="%clock/%clock64 reads: kept in place"),
    "NOP":    Timing("NOP", "alu", 1, _E, 1, _E),
    "OTHER":  Timing("?", "alu", 4, _E, 2, _E, note="opcode not classified: conservative order"),
}

# Peak tensor throughput per SMSP used to scale mma.sync issue costs by shape (H100-WP):
# 989.4e12 / (2 * 132 * 4 * 1.83e9) = 512 FP16 FMA/clk/SMSP; TF32 256; INT8 1024; FP64 32.
TENSOR_FMA_PER_CLK_SMSP = {"f16": 512, "bf16": 512, "tf32": 256, "s8": 1024, "u8": 1024,
                           "s4": 2048, "u4": 2048, "e4m3": 1024, "e5m2": 1024, "f64": 32, "b1": 4096}

# The control-code format (JIA2018, JIA2019; unchanged through Hopper as far as we know): stall
# counts 0-15, 6 dependency scoreboards.
MAX_STALL = 15
SCOREBOARDS = 6

# What the H100 microbenchmarks should measure to replace the ESTIMATE figures above, by priority
# for the SGEMM kernel.
MEASURE_ON_H100 = [
    "STS/LDS issue spacing per width (the independent-load test was dropped: ptxas restructured it)",
    "read latencies (when a store or load has read its source registers): every read_latency",
    "S2R, LDC, ATOMS/ATOMG, mbarrier latencies; ldmatrix .x1/.x2/.x4 latency",
    "cp.async (LDGSTS) completion, as seen by cp.async.wait_group",
    "tf32/s8/f64 mma.sync latencies and every mma issue rate",
    "why IMAD.IADD + LOP3.LUT alternating costs 10 cycles a pair (pipe change?)",
]


def estimated_figures() -> list[tuple[str, str]]:
    """(class, field) of every figure whose source is ESTIMATE."""
    out = []
    for name, t in TABLE.items():
        for fld, src in t.sources().items():
            if src == "ESTIMATE":
                out.append((name, fld))
    return out


def timing_table(arch) -> tuple[dict[str, Timing], str]:
    """(table, note): the timing table for a target's Arch (asmgemm.isa.arch). Only sm_90 is
    measured for now; other modelled Volta-or-later targets (the same control-code format) use it
    with a note saying so; earlier targets and unmodelled ones are refused with a ValueError (the
    scheduler turns it into an error at the first `.schedule` region). It lives here, not on the
    Arch, so that isa/ imports nothing above it."""
    if not arch.modelled:
        raise ValueError(f"asmgemm has no latency data for {arch.name} (the scheduler's table, "
                         "measured on sm_90, serves sm_70 to sm_90a)")
    if arch.number < 70:
        raise ValueError(f"the scheduler models Volta-and-later control codes; {arch.name} is older "
                         "(Maxwell/Pascal use a different control-code format)")
    if arch.number == 90:
        return TABLE, "sm_90 table"
    return TABLE, f"sm_90 table used for {arch.name} (no {arch.name} table yet)"
