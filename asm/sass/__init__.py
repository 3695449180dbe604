"""The SASS inspector: what ptxas really produced.

  cubin.py         the ELF container: architecture, functions, registers, stack, shared memory
  listing.py       nvdisasm runs (-hex -lrm count; -g) read into plain records
  decode.py        one instruction: text fields and control bits (layout: isa/control_bits.py)
  cfg.py           basic blocks and natural loops from branch targets
  analysis.py      register banks (isa/register_banks.py), reuse-cache hits, summaries
  inspect.py       inspect_cubin / inspect_build -> SassReport (the public entry points)
  plan_compare.py  the register plan next to ptxas's allocation (`asmgemm regs --sass`)
  render.py        rich tables for `asmgemm sass`

Patching control codes (issue 35; docs/design/sass-patching.md):
  elf.py           the cubin as an editable ELF: sections, symbols, .text words, in-place edits
  patch_rules.py   the TOML rules file of `asmgemm patch`
  hazards.py       the safety check a patch must pass before it is written
  patch.py         rules -> edited copy -> check -> nvdisasm re-read -> atomic write
  reuse_pass.py    the opt-in reuse pass (`asmgemm patch --reuse-pass`); no gain on the H100
  stall_pass.py    the opt-in stall/yield pass (`--stall-pass`, `--yield-every N`); no gain on the H100
  reorder_pass.py  the EXPERIMENTAL reorder pass (`--reorder-pass --experimental-reorder`): wrong sgemm
                   on the H100 (a missed scoreboard set-up delay, fixed on the CPU, not yet confirmed)
  block_deps.py    its dependency graph per basic block; reorder_check.py, the check of a permuted kernel
  code_references.py  the instruction offsets .nv.info and relocations name (never moved)
  control_directive.py  the `.control` directive: a .schedule region's SASS through ptxas's line table
  diff.py          `asmgemm sass --diff`: changed instructions field by field
"""
