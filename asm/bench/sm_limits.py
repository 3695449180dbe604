"""Per-SM resource limits that decide whether a kernel variant can launch, and how many blocks of it
fit on one SM. Data only, one row per compute capability.

Sources: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" (Table 21 in
the 12.x guide): 32-bit registers per SM 64K, per thread 255, threads per block 1024, resident
threads per SM 2048 (cc 8.0, 9.0) / 1536 (cc 8.6, 8.9) / 1024 (cc 7.5), resident blocks per SM 32
(16 for cc 8.6/8.9/7.5), shared memory per SM and the opt-in maximum per block (cc 9.0: 228 KB and
227 KB; cc 8.0: 164 KB and 163 KB; cc 8.6/8.9: 100 KB and 99 KB; cc 7.x: 96 KB and 96/64 KB), 48 KB
of static shared memory per block; "Shared Memory" of the compute capability 8.x/9.0 sections: 1 KB
of shared memory is reserved per resident block. Register allocation unit (256 registers per warp)
from the CUDA Occupancy Calculator's GPU data sheet.
cudaDevAttrMaxSharedMemoryPerBlockOptin read on the project's H100: 232448 (= 227 KB), matching.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SmLimits:
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255
    register_alloc_unit_per_warp: int = 256
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    shared_per_sm: int = 228 * 1024
    shared_per_block_optin: int = 227 * 1024
    static_shared_per_block: int = 48 * 1024
    shared_reserved_per_block: int = 1024


SM_LIMITS: dict[str, SmLimits] = {
    "sm_90": SmLimits(),
    "sm_90a": SmLimits(),
    "sm_89": SmLimits(max_threads_per_sm=1536, max_blocks_per_sm=24, shared_per_sm=100 * 1024,
                      shared_per_block_optin=99 * 1024),
    "sm_86": SmLimits(max_threads_per_sm=1536, max_blocks_per_sm=16, shared_per_sm=100 * 1024,
                      shared_per_block_optin=99 * 1024),
    "sm_80": SmLimits(shared_per_sm=164 * 1024, shared_per_block_optin=163 * 1024),
    "sm_75": SmLimits(max_threads_per_sm=1024, max_blocks_per_sm=16, shared_per_sm=64 * 1024,
                      shared_per_block_optin=64 * 1024, shared_reserved_per_block=0),
    "sm_70": SmLimits(max_threads_per_sm=2048, shared_per_sm=96 * 1024, shared_per_block_optin=96 * 1024,
                      shared_reserved_per_block=0),
}


def limits_for(target: str) -> SmLimits:
    """The target's limits; an unknown (older) target gets sm_70's, the most conservative modern row."""
    return SM_LIMITS.get(target, SM_LIMITS["sm_70"])


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
