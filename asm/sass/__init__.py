"""The SASS inspector: what ptxas really produced.

  cubin.py         the ELF container: architecture, functions, registers, stack, shared memory
  listing.py       nvdisasm runs (-hex -lrm count; -g) read into plain records
  decode.py        one instruction: text fields and control bits (layout: isa/control_bits.py)
  cfg.py           basic blocks and natural loops from branch targets
  analysis.py      register banks (isa/register_banks.py), reuse-cache hits, summaries
  inspect.py       inspect_cubin / inspect_build -> SassReport (the public entry points)
  plan_compare.py  the register plan next to ptxas's allocation (`asmgemm regs --sass`)
  render.py        rich tables for `asmgemm sass`
"""
