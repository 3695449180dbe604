"""Register-file bank models: the one place these facts live. Which target has which model is
part of the target's Arch (isa/arch.py); the register allocator (regalloc.py), the bank-conflict
report and the SASS inspector all read the model through it.

Sources:
- Maxwell/Pascal (sm_50..sm_62): 4 banks, bank = register index mod 4; two different source
  registers of one instruction in the same bank cost an extra cycle unless one comes from the
  operand reuse cache. Scott Gray, maxas wiki "SGEMM" (github.com/NervanaSystems/maxas/wiki/SGEMM),
  section "Register Banks"; Gray's allocation of the 64 SGEMM accumulators avoids them.
- Volta and later (sm_70+, including Turing, Ampere, Ada and Hopper sm_90/sm_90a): 2 banks,
  bank = register index mod 2, each 64 bits wide, so a bank serves two of an instruction's
  reads; a conflict needs three distinct source registers in one bank (a 3-source FFMA with all
  of R_even or all of R_odd). Jia, Maggioni, Staiger, Scarpazza, "Dissecting the NVIDIA Volta GPU
  Architecture via Microbenchmarking", arXiv:1804.06826 (2018), section 3 "Register banks";
  confirmed for Turing in Jia et al., arXiv:1903.07486 (2019). No later microbenchmark study we
  know of reports a change for Ampere or Hopper; the SASS inspector lets users check this model
  against ptxas's choices.
- Reuse cache: a source operand whose reuse flag was set by the previous instruction in the same
  slot is not read from its bank (same sources, and the control-code layout in isa/control_bits.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BankModel:
    name: str
    banks: int                 # number of banks: bank = index % banks
    reads_per_bank: int        # distinct registers one bank delivers to one instruction without a stall
    source: str

    def bank_of(self, index: int) -> int:
        return index % self.banks

    def conflicts(self, source_indices: list[int]) -> dict[int, list[int]]:
        """Banks read by more distinct registers than they can deliver: {bank: [indices]}."""
        per_bank: dict[int, list[int]] = {}
        for idx in dict.fromkeys(source_indices):  # a register read twice is one read
            per_bank.setdefault(self.bank_of(idx), []).append(idx)
        return {b: regs for b, regs in per_bank.items() if len(regs) > self.reads_per_bank}


MAXWELL = BankModel("maxwell-4bank", banks=4, reads_per_bank=1, source="maxas wiki, SGEMM: Register Banks")
VOLTA_PLUS = BankModel("volta-2bank", banks=2, reads_per_bank=2, source="Jia et al. 2018, arXiv:1804.06826")

