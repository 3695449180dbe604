"""sm_90 (Hopper, H100) instruction timing: the one table the scheduler and the control-code model
read. Data only; the code that uses it is in depgraph.py, list_scheduler.py and control_codes.py.

Each row is one class of SASS instruction (the PTX instructions that ptxas lowers to it are mapped
by classify.py). Every figure carries the key of its source in SOURCES; figures that no source
we could read gives are marked `ESTIMATE` and are to be measured on the H100 (the lead runs the
microbenchmarks: see MEASURE_ON_H100 below, the list of what is still to measure).

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
    Source("BPG-THROUGHPUT",
           "NVIDIA CUDA C++ Best Practices Guide (CUDA 12/13), 'Throughput of Native Arithmetic "
           "Instructions' table, compute capability 9.0 column (results per clock cycle per SM); "
           "issue cycles per warp instruction on one SMSP = 128 / results-per-clock-per-SM"),
    Source("BPG-LATENCY",
           "NVIDIA CUDA C++ Best Practices Guide, 'Arithmetic Instructions': 'the latency of most "
           "arithmetic instructions is typically 4 cycles on devices of compute capability 7.0'; "
           "Jia et al. 2018 (arXiv:1804.06826) measure 4 cycles for FFMA/FADD on Volta. Carried to "
           "sm_90 as an assumption until the H100 microbenchmark confirms it"),
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
           "Hopper GPU Architecture', arXiv:2402.13499 (2024), memory-latency microbenchmarks on "
           "Hopper (pointer chasing): shared memory ~29 cycles, L2 hit ~260 cycles. The figures are "
           "as we cite them; the tables were not re-read in this session: to confirm on the H100"),
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
           "not from a source we could read: an estimate by analogy with the classes above, to be "
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
# memory/MIO path (one 128-byte wavefront per clock per SM, shared by the 4 SMSPs; modelled per
# warp); 'lsu' = global/local memory address path; 'tensor' = the SMSP's tensor core; 'cbu' =
# barriers and fences.
_F = "BPG-THROUGHPUT"
_L = "BPG-LATENCY"
_E = "ESTIMATE"

TABLE: dict[str, Timing] = {
    # ---- FP32 / FP16 / FP64 arithmetic (fixed latency) ---------------------------------------
    "FFMA":  Timing("FFMA", "fma", 4, _L, 1, _F, note="fma.rn.f32, mad.f32: 128 results/clk/SM"),
    "FMUL":  Timing("FMUL", "fma", 4, _L, 1, _F, note="mul.f32: 128 results/clk/SM"),
    "FADD":  Timing("FADD", "fma", 4, _L, 1, _F, note="add/sub.f32: 128 results/clk/SM"),
    "FMNMX": Timing("FMNMX", "alu", 4, _E, 2, _F, note="min/max.f32: compare/min/max 64/clk/SM"),
    "HFMA2": Timing("HFMA2", "fma", 4, _E, 1, _F, note="f16x2 add/mul/fma: 256 results/clk/SM"),
    "DFMA":  Timing("DFMA", "fp64", 8, _E, 2, _F, note="f64 add/mul/fma: 64 results/clk/SM"),
    # ---- integer (fixed latency) -------------------------------------------------------------
    "IMAD":  Timing("IMAD", "fmaheavy", 4, _L, 2, _F, note="32-bit integer mul/mad: 64/clk/SM"),
    "IADD3": Timing("IADD3", "alu", 4, _L, 2, _F, note="32-bit integer add/sub: 64/clk/SM"),
    "LOP3":  Timing("LOP3", "alu", 4, _L, 2, _F, note="32-bit bitwise and/or/xor: 64/clk/SM"),
    "SHF":   Timing("SHF", "alu", 4, _L, 2, _F, note="32-bit shifts: 64/clk/SM"),
    "MOV":   Timing("MOV", "alu", 4, _E, 2, _F, note="register moves; ptxas often emits IMAD.MOV"),
    "SEL":   Timing("SEL", "alu", 4, _E, 2, _F),
    "PRMT":  Timing("PRMT", "alu", 4, _E, 2, _F),
    "ISETP": Timing("ISETP", "alu", 5, _E, 2, _F,
                    note="predicate producers: maxas used 13 on Maxwell; Volta+ figure to measure"),
    # ---- special function unit and conversions (variable latency, scoreboard) ------------------
    "MUFU":  Timing("MUFU", "xu", 18, _E, 8, _F, variable=True,
                    note="rcp/rsqrt/lg2/ex2/sin/cos .approx: 16 results/clk/SM"),
    "CVT":   Timing("F2F", "xu", 14, _E, 8, _F, variable=True,
                    note="float<->int and float width conversions: 16 results/clk/SM"),
    "POPC":  Timing("POPC", "xu", 14, _E, 8, _F, variable=True,
                    note="popc/clz/bfind/brev: 16 results/clk/SM"),
    "S2R":   Timing("S2R", "xu", 20, _E, 1, _E, variable=True, note="mov from %tid, %ctaid, ..."),
    "LDC":   Timing("LDC", "lsu", 12, _E, 1, _E, variable=True, note="ld.param / ld.const"),
    # ---- warp-level --------------------------------------------------------------------------
    "SHFL":  Timing("SHFL", "smem", 23, _E, 4, _F, variable=True, read_latency=2, read_src=_E,
                    note="shfl.sync: warp shuffle 32 results/clk/SM"),
    "VOTE":  Timing("VOTE", "alu", 4, _E, 2, _E),
    # ---- shared memory -----------------------------------------------------------------------
    "LDS32":  Timing("LDS", "smem", 29, "LUO2024", 1, "PG-SMEM", variable=True, read_latency=2,
                     read_src=_E),
    "LDS64":  Timing("LDS.64", "smem", 30, "LUO2024", 2, "PG-SMEM", variable=True, read_latency=2,
                     read_src=_E, note="latency: LDS32 + one extra wavefront (derived)"),
    "LDS128": Timing("LDS.128", "smem", 32, "LUO2024", 4, "PG-SMEM", variable=True,
                     read_latency=2, read_src=_E,
                     note="latency: LDS32 + three extra wavefronts (derived)"),
    "STS32":  Timing("STS", "smem", 1, _E, 1, "PG-SMEM", read_latency=4, read_src=_E),
    "STS64":  Timing("STS.64", "smem", 2, _E, 2, "PG-SMEM", read_latency=4, read_src=_E),
    "STS128": Timing("STS.128", "smem", 4, _E, 4, "PG-SMEM", read_latency=4, read_src=_E),
    "LDSM1":  Timing("LDSM", "smem", 30, _E, 1, "PG-SMEM", variable=True, read_latency=2,
                     read_src=_E, note="ldmatrix .x1: one 8x8 b16 matrix = one wavefront"),
    "LDSM2":  Timing("LDSM", "smem", 31, _E, 2, "PG-SMEM", variable=True, read_latency=2,
                     read_src=_E),
    "LDSM4":  Timing("LDSM", "smem", 33, _E, 4, "PG-SMEM", variable=True, read_latency=2,
                     read_src=_E),
    "STSM":   Timing("STSM", "smem", 4, _E, 4, "PG-SMEM", read_latency=4, read_src=_E),
    "ATOMS":  Timing("ATOMS", "smem", 40, _E, 2, _E, variable=True, read_latency=4, read_src=_E),
    # ---- global / local memory ---------------------------------------------------------------
    "LDG":    Timing("LDG", "lsu", 260, "LUO2024", 1, _E, variable=True, read_latency=4,
                     read_src=_E, note="latency of an L2 hit; an L1 hit is far shorter, DRAM longer"),
    "STG":    Timing("STG", "lsu", 1, _E, 1, _E, read_latency=4, read_src=_E),
    "LDL":    Timing("LDL", "lsu", 40, _E, 1, _E, variable=True, read_latency=4, read_src=_E,
                     note="local memory, assumed L1-resident"),
    "STL":    Timing("STL", "lsu", 1, _E, 1, _E, read_latency=4, read_src=_E),
    "ATOMG":  Timing("ATOMG", "lsu", 300, _E, 2, _E, variable=True, read_latency=4, read_src=_E),
    # cp.async: no register result; `latency` is when the copy has landed in shared memory, which
    # is what cp.async.wait_group waits for.
    "LDGSTS": Timing("LDGSTS", "lsu", 260, "LUO2024", 1, _E, read_latency=4, read_src=_E,
                     note="cp.async: completion ~ an L2-hit global load"),
    "LDGDEPBAR": Timing("LDGDEPBAR", "lsu", 1, _E, 1, _E, note="cp.async.commit_group"),
    "DEPBAR": Timing("DEPBAR", "cbu", 1, _E, 1, _E, note="cp.async.wait_group / wait_all"),
    "TMA":    Timing("UTMALDG", "lsu", 260, _E, 1, _E, read_latency=4, read_src=_E,
                     note="cp.async.bulk*: completion signalled through an mbarrier"),
    # ---- tensor cores (mma.sync): variable latency; issue from the whitepaper peak --------------
    "HMMA":   Timing("HMMA", "tensor", 33, _E, 4, "H100-WP", variable=True, read_latency=2,
                     read_src=_E, note="m16n8k16 f16/bf16: 2048 FMA / 512 FMA/clk/SMSP; issue "
                     "scales with the shape (classify.py)"),
    "HMMA_TF32": Timing("HMMA", "tensor", 33, _E, 4, "H100-WP", variable=True, read_latency=2,
                        read_src=_E, note="m16n8k8 tf32: 1024 FMA / 256 FMA/clk/SMSP"),
    "IMMA":   Timing("IMMA", "tensor", 33, _E, 4, "H100-WP", variable=True, read_latency=2,
                     read_src=_E, note="m16n8k32 s8: 4096 MAC / 1024 MAC/clk/SMSP"),
    "DMMA":   Timing("DMMA", "tensor", 33, _E, 8, "H100-WP", variable=True, read_latency=2,
                     read_src=_E, note="m8n8k4 f64: 256 FMA / 32 FMA/clk/SMSP"),
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
    "FFMA dependent-chain latency (confirm 4) and back-to-back issue rate (confirm 1/clk/SMSP)",
    "LDS.32/.64/.128 load-to-use latency (confirm ~29/30/32) and STS/LDS issue spacing",
    "IMAD, IADD3, ISETP->@P latencies",
    "LDG latency for L1 hit / L2 hit (confirm ~260) and LDGSTS (cp.async) completion",
    "ldmatrix .x1/.x2/.x4 latency; mma.sync m16n8k16 latency and issue rate",
    "SHFL, MUFU, F2F/I2F latencies",
]


def timing_table(target: str) -> tuple[dict[str, Timing], str]:
    """(table, note) for a target. Only sm_90 is measured for now; other Volta-or-later targets
    (the same control-code format) use it with a note saying so; earlier targets are refused."""
    from asmgemm.isa.register_banks import arch_number
    try:
        arch = arch_number(target)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if arch == 90:
        return TABLE, "sm_90 table"
    if arch >= 70:
        return TABLE, f"sm_90 table used for {target} (no {target} table yet)"
    raise ValueError(f"the scheduler models Volta-and-later control codes; {target} is older "
                     "(Maxwell/Pascal use a different control-code format)")
