"""One architecture object per target (sm_50 ... sm_90a): the facts every stage asks about a target,
in one place. Data, with its sources; the little code here only looks it up.

    arch_for("sm_80")                   -> Arch  (an unmodelled Arch for a newer sm_XX name; AsmError
                                                  for a malformed name or one older than the tables)
    arch_for_compute_capability("90")   -> Arch  (what the runtime asks for a device: cupy's '90')
    MODELLED_TARGETS, DEFAULT_TARGET     (the targets asmgemm has data for; which targets a build
                                         accepts, these and what the ptxas in use assembles, is
                                         targets.py's SUPPORTED_TARGETS: it asks the toolchain)
    required_features(module)           -> [(feature, span)]: the features a module uses
    check_features(arch, uses, ...)     -> AsmError at the first use of a feature the target lacks

What an Arch holds, and where each fact comes from:
  bank_model      register-file banks: the BankModel objects of isa/register_banks.py, with their
                  sources there;
  limits          SM resources (SmLimits below, with sources) and `blocks_per_sm`, the occupancy rule;
  sass_decodable  whether the SASS inspector decodes its cubins (sm_90/sm_90a only);
  features        named PTX features (FEATURES below) this target has.
Which latency table serves a target is the scheduler's (scheduler/latencies_sm90.py: timing_table),
and which targets a build accepts is targets.py's: isa/ imports nothing above it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..errors import AsmError, Note
from ..source import Span
from .register_banks import MAXWELL, VOLTA_PLUS, BankModel

DEFAULT_TARGET = "sm_90"


# ---- SM resource limits ----------------------------------------------------------------------
# Per-SM resources that decide whether a kernel variant can launch, and how many blocks of it fit.
#
# Sources: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" (Table 21
# in the 12.x guide): 32-bit registers per SM 64K for every target here; per thread block 64K, but
# 32K on cc 5.3 and 6.2; per thread 255; threads per block 1024; resident warps per SM 64 (2048
# threads), except 32 on cc 7.5 and 48 on cc 8.6/8.7/8.9; resident blocks per SM 32, except 16 on
# cc 7.5/8.6/8.7 and 24 on cc 8.9; shared memory per SM 64 KB (cc 5.0, 5.3, 6.0, 6.2, 7.5), 96 KB
# (5.2, 6.1, 7.0, 7.2), 164 KB (8.0, 8.7), 100 KB (8.6, 8.9), 228 KB (9.0); the most shared memory
# one block may use (with the opt-in attribute above 48 KB) 48 KB on cc 5.x/6.x, 96 KB on 7.0/7.2,
# 64 KB on 7.5, 163 KB on 8.0/8.7, 99 KB on 8.6/8.9, 227 KB on 9.0; 48 KB of static shared memory
# per block everywhere. "Shared Memory" of the compute capability 8.x/9.0 sections: 1 KB of shared
# memory is reserved per resident block (none before 8.0). Register allocation unit (256 registers
# per warp, warp granularity, for every target here) from the CUDA Occupancy Calculator's GPU data.
# Cross-checked against NVIDIA's own encoding of the same table, CCCL
# cudax/include/cuda/experimental/__device/arch_traits.cuh (rows 6.0, 7.0, 7.5, 8.0, 8.6, 8.9, 9.0:
# identical figures). The rows 5.0, 5.2, 5.3, 6.1, 6.2, 7.2 and 8.7 are from the guide's table
# alone: no second source checked, and no GPU of those kinds measured.
# cudaDevAttrMaxSharedMemoryPerBlockOptin read on the project's H100: 232448 (= 227 KB), matching.

@dataclass(frozen=True)
class SmLimits:
    registers_per_sm: int = 65536
    registers_per_block: int = 65536
    max_registers_per_thread: int = 255
    register_alloc_unit_per_warp: int = 256
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    shared_per_sm: int = 228 * 1024
    shared_per_block_optin: int = 227 * 1024
    static_shared_per_block: int = 48 * 1024
    shared_reserved_per_block: int = 1024


_KB = 1024
_MAXWELL_PASCAL = dict(shared_per_block_optin=48 * _KB, shared_reserved_per_block=0)

SM_LIMITS: dict[str, SmLimits] = {
    "sm_50": SmLimits(shared_per_sm=64 * _KB, **_MAXWELL_PASCAL),
    "sm_52": SmLimits(shared_per_sm=96 * _KB, **_MAXWELL_PASCAL),
    "sm_53": SmLimits(shared_per_sm=64 * _KB, registers_per_block=32768, **_MAXWELL_PASCAL),
    "sm_60": SmLimits(shared_per_sm=64 * _KB, **_MAXWELL_PASCAL),
    "sm_61": SmLimits(shared_per_sm=96 * _KB, **_MAXWELL_PASCAL),
    "sm_62": SmLimits(shared_per_sm=64 * _KB, registers_per_block=32768, **_MAXWELL_PASCAL),
    "sm_70": SmLimits(shared_per_sm=96 * _KB, shared_per_block_optin=96 * _KB, shared_reserved_per_block=0),
    "sm_72": SmLimits(shared_per_sm=96 * _KB, shared_per_block_optin=96 * _KB, shared_reserved_per_block=0),
    "sm_75": SmLimits(max_threads_per_sm=1024, max_blocks_per_sm=16, shared_per_sm=64 * _KB,
                      shared_per_block_optin=64 * _KB, shared_reserved_per_block=0),
    "sm_80": SmLimits(shared_per_sm=164 * _KB, shared_per_block_optin=163 * _KB),
    "sm_86": SmLimits(max_threads_per_sm=1536, max_blocks_per_sm=16, shared_per_sm=100 * _KB,
                      shared_per_block_optin=99 * _KB),
    "sm_87": SmLimits(max_threads_per_sm=1536, max_blocks_per_sm=16, shared_per_sm=164 * _KB,
                      shared_per_block_optin=163 * _KB),
    "sm_89": SmLimits(max_threads_per_sm=1536, max_blocks_per_sm=24, shared_per_sm=100 * _KB,
                      shared_per_block_optin=99 * _KB),
    "sm_90": SmLimits(),
    "sm_90a": SmLimits(),
}


def blocks_per_sm(limits: SmLimits, threads: int, registers: int, shared_bytes: int) -> dict[str, int]:
    """Resident blocks per SM as limited by each resource (the CUDA occupancy calculation, without
    the warp-allocation granularity of old GPUs). 0 means the block cannot launch at all."""
    warps = -(-threads // 32)
    unit = limits.register_alloc_unit_per_warp
    regs_per_warp = -(-max(registers, 1) * 32 // unit) * unit
    warps_by_regs = limits.registers_per_sm // regs_per_warp
    by_regs = warps_by_regs // warps if warps else 0
    by_threads = limits.max_threads_per_sm // threads if threads else 0
    if shared_bytes > limits.shared_per_block_optin:
        by_shared = 0
    elif shared_bytes == 0:
        by_shared = limits.max_blocks_per_sm
    else:
        by_shared = limits.shared_per_sm // (shared_bytes + limits.shared_reserved_per_block)
    return {"registers": by_regs, "threads": by_threads, "shared": by_shared,
            "blocks": limits.max_blocks_per_sm,
            "resident": min(by_regs, by_threads, by_shared, limits.max_blocks_per_sm)}


# ---- PTX features ----------------------------------------------------------------------------
# The minimum target of each feature is the one in the "Target ISA notes" of the instruction's
# section of the PTX ISA (version 9.0, chapter 9.7 "Instructions"; sections named by title, as
# their numbers move between versions). A `min_target` with the `a` suffix is an
# architecture-specific feature: PTX ISA, "PTX Module Directives: .target" ("Target architectures
# with suffix a, such as sm_90a, include architecture-accelerated features that are supported on the
# specified architecture only, hence such targets do not follow the onion layer model"): it is on
# that target only, never on a later one. Every row was also checked against ptxas 13.0, which
# names the same minimum in its error ("Feature 'cp.async' requires .target sm_80 or higher",
# "Instruction 'wgmma.fence' not supported on .target 'sm_90'"); tests/test_isa_arch.py keeps
# checking a snippet of each feature at its minimum target and at the target before it.
#
# This is a first, located check of what a kernel needs, not a validator: ptxas stays the judge of
# everything else (its errors are mapped back to the .sasm line as well).

@dataclass(frozen=True)
class Feature:
    name: str
    min_target: str          # 'sm_80'; 'sm_90a': that target only
    section: str             # the PTX ISA section whose Target ISA notes give min_target


FEATURES: dict[str, Feature] = {f.name: f for f in [
    Feature("dp4a", "sm_61", "Integer Arithmetic Instructions: dp4a, dp2a"),
    Feature("mma.sync", "sm_70", "Warp-level matrix multiply-accumulate instruction: mma (.m8n8k4 with "
            ".f16: sm_70; the other shapes and types below)"),
    Feature("wmma", "sm_70", "Warp Level Matrix Multiply-Accumulate Instructions: wmma.load, wmma.store, "
            "wmma.mma (floating-point types; integer and sub-byte types need sm_72/sm_75: left to ptxas)"),
    Feature("match.sync", "sm_70", "Parallel Synchronization and Communication Instructions: match.sync"),
    Feature("nanosleep", "sm_70", "Miscellaneous Instructions: nanosleep"),
    Feature("ldmatrix", "sm_75", "Warp-level matrix load instruction: ldmatrix (.m8n8; the .m16n16 and "
            ".m8n16 shapes are sm_100a and later, outside our targets)"),
    Feature("movmatrix", "sm_75", "Warp-level matrix transpose instruction: movmatrix"),
    Feature("mma.sync.m16n8k8", "sm_75", "mma: .m16n8k8 (.f16: sm_75; .bf16/.tf32 need sm_80)"),
    Feature("mma.sync.m8n8k16", "sm_75", "mma: .m8n8k16 (.s8/.u8)"),
    Feature("mma.sync.m8n8k32", "sm_75", "mma: .m8n8k32 (.s4/.u4)"),
    Feature("mma.sync.m8n8k128", "sm_75", "mma: .m8n8k128 (.b1)"),
    Feature("mma.sync.m16n8k4", "sm_80", "mma: .m16n8k4 (.tf32; .f64 needs sm_90)"),
    Feature("mma.sync.m16n8k16", "sm_80", "mma: .m16n8k16 (.f16, .bf16, .s8/.u8; .f64 needs sm_90)"),
    Feature("mma.sync.m16n8k32", "sm_80", "mma: .m16n8k32 (.s8/.u8; .e4m3/.e5m2 need sm_89)"),
    Feature("mma.sync.m16n8k64", "sm_80", "mma: .m16n8k64 (.s4/.u4)"),
    Feature("mma.sync.m16n8k128", "sm_80", "mma: .m16n8k128 (.b1)"),
    Feature("mma.sync.m16n8k256", "sm_80", "mma: .m16n8k256 (.b1)"),
    Feature("mma.sync.f64", "sm_80", "mma: .m8n8k4 with .f64"),
    Feature("mma.sync.f64.m16n8", "sm_90", "mma: .m16n8k4, .m16n8k8, .m16n8k16 with .f64"),
    Feature("bf16", "sm_80", ".bf16/.bf16x2 types (cvt, fma, mma ...: sm_80 at least; some "
            "instructions need sm_90 with them: left to ptxas)"),
    Feature("tf32", "sm_80", ".tf32 type: cvt.rna.tf32.f32, mma"),
    Feature("fp8", "sm_89", ".e4m3/.e5m2 types: mma (sm_89), cvt ... .e4m3x2/.e5m2x2 (sm_89)"),
    Feature("cp.async", "sm_80", "Data Movement and Conversion Instructions: cp.async, "
            "cp.async.commit_group, cp.async.wait_group / cp.async.wait_all, and "
            "Parallel Synchronization: cp.async.mbarrier.arrive"),
    Feature("mbarrier", "sm_80", "Parallel Synchronization and Communication Instructions: mbarrier "
            "(init, inval, arrive, arrive_drop, test_wait, pending_count: sm_80)"),
    Feature("mbarrier.try_wait", "sm_90", "mbarrier.test_wait/mbarrier.try_wait: .try_wait needs sm_90"),
    Feature("mbarrier.tx", "sm_90", "mbarrier.expect_tx, mbarrier.complete_tx, and mbarrier.arrive "
            "with .expect_tx: sm_90"),
    Feature("redux.sync", "sm_80", "Parallel Synchronization and Communication Instructions: redux.sync "
            "(integer; .f32 min/max is sm_100a)"),
    Feature("stmatrix", "sm_90", "Warp-level matrix store instruction: stmatrix"),
    Feature("tma", "sm_90", "Data Movement and Conversion Instructions: cp.async.bulk, "
            "cp.async.bulk.tensor, cp.reduce.async.bulk(.tensor), cp.async.bulk.prefetch(.tensor), "
            "cp.async.bulk.commit_group / wait_group; prefetch .tensormap; tensormap.cp_fenceproxy"),
    Feature("clusters", "sm_90", "barrier.cluster; mapa; getctarank; st.async / red.async; the "
            ".shared::cluster state space and the .cluster scope; special registers %clusterid, "
            "%nclusterid, %cluster_ctaid, %cluster_nctaid, %cluster_ctarank, %cluster_nctarank, "
            "%is_explicit_cluster; performance-tuning directives .reqnctapercluster, "
            ".explicitcluster, .maxclusterrank"),
    Feature("elect.sync", "sm_90", "Parallel Synchronization and Communication Instructions: elect.sync"),
    Feature("fence.proxy.async", "sm_90", "Parallel Synchronization and Communication Instructions: "
            "membar/fence (.proxy.async: sm_90)"),
    Feature("griddepcontrol", "sm_90", "Parallel Synchronization and Communication Instructions: griddepcontrol"),
    Feature("multimem", "sm_90", "Data Movement and Conversion Instructions: multimem.ld_reduce, "
            "multimem.st, multimem.red"),
    Feature("wgmma", "sm_90a", "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions: "
            "wgmma.mma_async, wgmma.fence, wgmma.commit_group, wgmma.wait_group"),
    Feature("setmaxnreg", "sm_90a", "Miscellaneous Instructions: setmaxnreg"),
    Feature("tensormap.replace", "sm_90a", "Data Movement and Conversion Instructions: tensormap.replace"),
]}


@dataclass(frozen=True)
class FeatureUse:
    """One way a module can use a feature. Exactly one of `opcode`, `modifiers`, `directive`,
    `sreg` says what to look for:
      opcode      an instruction whose opcode starts with these dot-separated parts ('cp.async'
                  matches cp.async.ca.shared.global, not cp.asyncx); where several opcode rows
                  match, the longest decides (cp.async.bulk.tensor is 'tma', not 'cp.async');
      modifiers   parts that must all appear in the opcode after its first part ('shared::cluster'
                  in ld.shared::cluster.u32), within opcodes starting with `within` when given;
                  every matching modifier row applies, besides the opcode row;
      directive   a performance-tuning directive of a function ('.reqnctapercluster');
      sreg        a special register, by its name before any .x/.y/.z ('%clusterid')."""
    feature: str
    opcode: str = ""
    modifiers: tuple[str, ...] = ()
    within: str = ""
    directive: str = ""
    sreg: str = ""


FEATURE_USES: tuple[FeatureUse, ...] = (
    FeatureUse("dp4a", opcode="dp4a"),
    FeatureUse("dp4a", opcode="dp2a"),
    FeatureUse("mma.sync", opcode="mma"),
    FeatureUse("wmma", opcode="wmma"),
    FeatureUse("match.sync", opcode="match"),
    FeatureUse("nanosleep", opcode="nanosleep"),
    FeatureUse("ldmatrix", opcode="ldmatrix"),
    FeatureUse("movmatrix", opcode="movmatrix"),
    FeatureUse("stmatrix", opcode="stmatrix"),
    FeatureUse("cp.async", opcode="cp.async"),
    FeatureUse("tma", opcode="cp.async.bulk"),
    FeatureUse("tma", opcode="cp.reduce.async.bulk"),
    FeatureUse("tma", opcode="tensormap.cp_fenceproxy"),
    FeatureUse("tma", modifiers=("tensormap",), within="prefetch"),
    FeatureUse("tensormap.replace", opcode="tensormap.replace"),
    FeatureUse("mbarrier", opcode="mbarrier"),
    FeatureUse("mbarrier.try_wait", opcode="mbarrier.try_wait"),
    FeatureUse("mbarrier.tx", opcode="mbarrier.expect_tx"),
    FeatureUse("mbarrier.tx", opcode="mbarrier.complete_tx"),
    FeatureUse("mbarrier.tx", modifiers=("expect_tx",), within="mbarrier"),
    FeatureUse("redux.sync", opcode="redux"),
    FeatureUse("elect.sync", opcode="elect"),
    FeatureUse("fence.proxy.async", opcode="fence.proxy.async"),
    FeatureUse("griddepcontrol", opcode="griddepcontrol"),
    FeatureUse("multimem", opcode="multimem"),
    FeatureUse("wgmma", opcode="wgmma"),
    FeatureUse("setmaxnreg", opcode="setmaxnreg"),
    # mma shapes and types
    FeatureUse("mma.sync.m16n8k8", modifiers=("m16n8k8",), within="mma"),
    FeatureUse("mma.sync.m8n8k16", modifiers=("m8n8k16",), within="mma"),
    FeatureUse("mma.sync.m8n8k32", modifiers=("m8n8k32",), within="mma"),
    FeatureUse("mma.sync.m8n8k128", modifiers=("m8n8k128",), within="mma"),
    FeatureUse("mma.sync.m16n8k4", modifiers=("m16n8k4",), within="mma"),
    FeatureUse("mma.sync.m16n8k16", modifiers=("m16n8k16",), within="mma"),
    FeatureUse("mma.sync.m16n8k32", modifiers=("m16n8k32",), within="mma"),
    FeatureUse("mma.sync.m16n8k64", modifiers=("m16n8k64",), within="mma"),
    FeatureUse("mma.sync.m16n8k128", modifiers=("m16n8k128",), within="mma"),
    FeatureUse("mma.sync.m16n8k256", modifiers=("m16n8k256",), within="mma"),
    FeatureUse("mma.sync.f64", modifiers=("f64",), within="mma"),
    FeatureUse("mma.sync.f64.m16n8", modifiers=("m16n8k4", "f64"), within="mma"),
    FeatureUse("mma.sync.f64.m16n8", modifiers=("m16n8k8", "f64"), within="mma"),
    FeatureUse("mma.sync.f64.m16n8", modifiers=("m16n8k16", "f64"), within="mma"),
    # types, in any instruction
    FeatureUse("bf16", modifiers=("bf16",)),
    FeatureUse("bf16", modifiers=("bf16x2",)),
    FeatureUse("tf32", modifiers=("tf32",)),
    FeatureUse("fp8", modifiers=("e4m3",)),
    FeatureUse("fp8", modifiers=("e5m2",)),
    FeatureUse("fp8", modifiers=("e4m3x2",)),
    FeatureUse("fp8", modifiers=("e5m2x2",)),
    # thread-block clusters
    FeatureUse("clusters", opcode="barrier.cluster"),
    FeatureUse("clusters", opcode="mapa"),
    FeatureUse("clusters", opcode="getctarank"),
    FeatureUse("clusters", opcode="st.async"),
    FeatureUse("clusters", opcode="red.async"),
    FeatureUse("clusters", modifiers=("shared::cluster",)),
    FeatureUse("clusters", modifiers=("cluster",)),
    FeatureUse("clusters", directive=".reqnctapercluster"),
    FeatureUse("clusters", directive=".explicitcluster"),
    FeatureUse("clusters", directive=".maxclusterrank"),
    FeatureUse("clusters", sreg="%clusterid"),
    FeatureUse("clusters", sreg="%nclusterid"),
    FeatureUse("clusters", sreg="%cluster_ctaid"),
    FeatureUse("clusters", sreg="%cluster_nctaid"),
    FeatureUse("clusters", sreg="%cluster_ctarank"),
    FeatureUse("clusters", sreg="%cluster_nctarank"),
    FeatureUse("clusters", sreg="%is_explicit_cluster"),
)


# ---- the architectures -----------------------------------------------------------------------
def target_number(target: str) -> tuple[int, str]:
    """'sm_90a' -> (90, 'a'), 'sm_100f' -> (100, 'f'); ValueError for anything that is not
    sm_<digits> with an optional `a` (architecture-specific) or `f` (family-specific) suffix."""
    rest = target[3:] if target.startswith("sm_") else ""
    digits = rest.rstrip("af")
    if not digits.isdigit() or len(rest) - len(digits) > 1:
        raise ValueError(f"not a target name: {target!r} (expected sm_XX, sm_XXa or sm_XXf)")
    return int(digits), rest[len(digits):]


def _has(feature: Feature, number: int, name: str) -> bool:
    fnum, fsuffix = target_number(feature.min_target)
    if fsuffix:                       # architecture-specific: that target only
        return name == feature.min_target
    return number >= fnum


@dataclass(frozen=True)
class Arch:
    """A target. `modelled` targets (sm_50 ... sm_90a) have every fact below; the others (targets
    the ptxas in use assembles, such as sm_100 or sm_120, that asmgemm has no tables for) build
    plain PTX, and asking them for a bank model, SM limits or a latency table is an error that
    says so (`unmodelled_note`)."""
    name: str                    # 'sm_90a'
    number: int                  # 90
    suffix: str                  # 'a' (architecture-specific), 'f' (family-specific) or ''
    family: str                  # 'Hopper'
    banks: BankModel | None      # None: no register-bank data for this target
    sm_limits: SmLimits | None   # None: no SM resource table for this target
    sass_decodable: bool         # the SASS inspector decodes this target's cubins
    features: frozenset[str]

    @property
    def modelled(self) -> bool:
        return self.banks is not None

    @property
    def unmodelled_note(self) -> str:
        """'' for a modelled target; else what asmgemm does not know about it."""
        if self.modelled:
            return ""
        return (f"{self.name} is unmodelled: asmgemm has no register-bank, SM-limit or latency data for it "
                f"(its tables cover {MODELLED_TARGETS[0]} to {MODELLED_TARGETS[-1]}); plain PTX builds as "
                "written, and ptxas checks it")

    @property
    def bank_model(self) -> BankModel:
        if self.banks is None:
            raise AsmError(f"no register-bank model for {self.name}: {self.unmodelled_note}")
        return self.banks

    @property
    def limits(self) -> SmLimits:
        if self.sm_limits is None:
            raise AsmError(f"no SM resource limits for {self.name}: {self.unmodelled_note}")
        return self.sm_limits

    @property
    def arch_specific(self) -> bool:
        """The `a` variant: its architecture-specific features run on this GPU only."""
        return self.suffix == "a"

    @property
    def base(self) -> str:
        """'sm_90' for sm_90a."""
        return f"sm_{self.number}"

    @property
    def compute_capability(self) -> str:
        """'9.0'."""
        return f"{self.number // 10}.{self.number % 10}"

    @property
    def max_registers_per_thread(self) -> int:
        # 255 for every compute capability in the programming guide's table, 10.x and 12.x included:
        # the one SM fact an unmodelled target is given (the register planner needs it).
        return self.sm_limits.max_registers_per_thread if self.sm_limits is not None else 255

    def has(self, feature: str) -> bool:
        if feature not in FEATURES:
            raise ValueError(f"unknown feature {feature!r} (known: {', '.join(FEATURES)})")
        return feature in self.features

    def blocks_per_sm(self, threads: int, registers: int, shared_bytes: int) -> dict[str, int]:
        return blocks_per_sm(self.limits, threads, registers, shared_bytes)


_FAMILIES = ((50, "Maxwell"), (60, "Pascal"), (70, "Volta"), (75, "Turing"), (80, "Ampere"),
             (89, "Ada"), (90, "Hopper"))
# Families of targets asmgemm has no tables for, by name only (the CUDA programming guide's
# compute-capability list: 10.x, 11.0 and 12.x are Blackwell). Others are "unknown".
_UNMODELLED_FAMILIES = {100: "Blackwell", 101: "Blackwell", 103: "Blackwell", 110: "Blackwell",
                        120: "Blackwell", 121: "Blackwell"}


def _make(name: str) -> Arch:
    number, suffix = target_number(name)
    family = [f for lo, f in _FAMILIES if number >= lo][-1]
    return Arch(name=name, number=number, suffix=suffix, family=family,
                banks=MAXWELL if number < 70 else VOLTA_PLUS,
                sm_limits=SM_LIMITS[name],
                sass_decodable=number == 90,
                features=frozenset(f.name for f in FEATURES.values() if _has(f, number, name)))


def _make_unmodelled(name: str) -> Arch:
    """A target only ptxas knows: the features of the onion model (every plain feature whose
    minimum it reaches), none of sm_90a's architecture-specific ones (check_features leaves those
    to ptxas for such a target), and no banks, limits or latencies."""
    number, suffix = target_number(name)
    return Arch(name=name, number=number, suffix=suffix, family=_UNMODELLED_FAMILIES.get(number, "unknown"),
                banks=None, sm_limits=None, sass_decodable=False,
                features=frozenset(f.name for f in FEATURES.values()
                                   if not f.min_target.endswith("a") and _has(f, number, name)))


ARCHS: dict[str, Arch] = {name: _make(name) for name in SM_LIMITS}
# The targets asmgemm has data for (banks, limits, the latency table's reach).
MODELLED_TARGETS: tuple[str, ...] = tuple(ARCHS)

_UNMODELLED: dict[str, Arch] = {}


def arch_for(target: str) -> Arch:
    """The Arch of a target: a modelled one (ARCHS), or an unmodelled one for any other sm_XX,
    sm_XXa or sm_XXf name newer than the tables' first target. Whether a build may use a target
    (the ptxas in use assembles it) is not asked here: that needs the toolchain, which sits above
    isa/ (targets.py: SUPPORTED_TARGETS, require_supported_target). AsmError for anything else."""
    arch = ARCHS.get(target)
    if arch is not None:
        return arch
    arch = _UNMODELLED.get(target)
    if arch is None:
        try:
            number, _ = target_number(target)
        except ValueError:
            number = None
        if number is None or number < ARCHS[MODELLED_TARGETS[0]].number:
            raise AsmError(f"unsupported target '{target}' (asmgemm models {', '.join(MODELLED_TARGETS)}; "
                           "a newer sm_XX target builds where the ptxas in use assembles it)")
        arch = _UNMODELLED[target] = _make_unmodelled(target)
    return arch


def arch_for_compute_capability(cc) -> Arch:
    """The Arch of a device's compute capability: '90' (cupy), '9.0', 90 or (9, 0). The plain
    target (sm_90, not sm_90a). Modelled targets only: running a kernel needs the SM limits."""
    if isinstance(cc, tuple):
        text = "".join(str(p) for p in cc)
    else:
        text = str(cc).replace(".", "")
    target = f"sm_{text}"
    if target not in ARCHS:
        raise AsmError(f"GPU compute capability {cc} ({target}) is not a supported target "
                       f"(supported: {', '.join(MODELLED_TARGETS)})")
    return ARCHS[target]


def targets_with(feature: str) -> list[str]:
    return [a.name for a in ARCHS.values() if feature in a.features]


# ---- what a module uses ----------------------------------------------------------------------
def _starts(parts: list[str], prefix: str) -> bool:
    want = prefix.split(".")
    return parts[:len(want)] == want


def instruction_features(ins: ir.Instruction) -> list[str]:
    """The features one instruction needs (opcode, modifiers and special registers)."""
    parts = ins.opcode.split(".")
    found: list[str] = []
    best = None
    for use in FEATURE_USES:
        if use.opcode and not use.modifiers and _starts(parts, use.opcode):
            if best is None or len(use.opcode.split(".")) > len(best.opcode.split(".")):
                best = use
    if best is not None:
        found.append(best.feature)
    mods = set(parts[1:])
    for use in FEATURE_USES:
        if use.modifiers and all(m in mods for m in use.modifiers) \
                and (not use.within or _starts(parts, use.within)):
            found.append(use.feature)
    sregs = {r.name.split(".", 1)[0] for r in ins.registers() if r.name.startswith("%")}
    for use in FEATURE_USES:
        if use.sreg and use.sreg in sregs:
            found.append(use.feature)
    return list(dict.fromkeys(found))


def required_features(module: ir.Module) -> list[tuple[str, Span | None]]:
    """Every feature the module uses, once, with the span of its first use (the instruction; the
    function for a performance directive), in program order."""
    first: dict[str, Span | None] = {}
    for fn in module.functions():
        for perf in fn.perf:
            word = perf.split(None, 1)[0] if perf.strip() else ""
            for use in FEATURE_USES:
                if use.directive and use.directive == word:
                    first.setdefault(use.feature, fn.span)
        for ins in fn.instructions():
            for feature in instruction_features(ins):
                first.setdefault(feature, ins.span or fn.span)
    return list(first.items())


def check_features(arch: Arch, uses: list[tuple[str, Span | None]], chosen_by: str = "") -> None:
    """AsmError at the first use of a feature `arch` lacks; further ones become notes. `chosen_by`
    says where the target came from: 'option' (--target), 'directive' (the source's .target) or ''."""
    missing = [(f, span) for f, span in uses if f not in arch.features]
    if not arch.modelled:
        # The table knows sm_90a's architecture-specific features only; whether a newer a/f target
        # has one (setmaxnreg is on sm_100a too, wgmma is not) is ptxas's to say.
        missing = [(f, span) for f, span in missing if not FEATURES[f].min_target.endswith("a")]
    if not missing:
        return
    feature, span = missing[0]
    need = FEATURES[feature].min_target
    where = {"option": f" (--target {arch.name})",
             "directive": f" (the source's .target {arch.name})"}.get(chosen_by, "")
    notes = [Note(f"{f} needs {FEATURES[f].min_target} too", s) for f, s in missing[1:6]]
    if need.endswith("a"):
        hint = f"build with --target {need}" + (" (or leave --target out)" if chosen_by == "option" else "")
    else:
        hint = f"build for a target that has {feature}: {', '.join(targets_with(feature))}"
    raise AsmError(f"{feature} needs {need}; this build targets {arch.name}{where}", span,
                   notes=notes, hint=hint)
