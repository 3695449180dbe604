"""Instruction mix of the hottest loop (the largest loop the SASS inspector finds) in a cubin.
Usage: sass_loop_mix.py FILE.cubin   (the same decoding as `asmgemm sass FILE.cubin --loop`)"""
import sys
from collections import Counter
from pathlib import Path

from asmgemm.sass.inspect import inspect_cubin


def loop_mix(cubin_path: str) -> tuple[int, Counter]:
    report = inspect_cubin(Path(cubin_path).read_bytes(), source=cubin_path)
    loops = [(kernel, loop.instruction_indices(kernel.blocks)) for kernel in report.kernels.values()
             for loop in kernel.loops]
    mix = Counter()
    if loops:
        kernel, indices = max(loops, key=lambda kl: len(kl[1]))
        for i in indices:
            ins = kernel.instructions[i]
            mix[ins.opcode + (".128" if "128" in ins.modifiers else "")] += 1
    return sum(mix.values()), mix


if __name__ == "__main__":
    total, mix = loop_mix(sys.argv[1])
    print(f"loop: {total} instructions, FFMA {mix['FFMA']} ({100 * mix['FFMA'] / max(total, 1):.1f}%): "
          + ", ".join(f"{k} {v}" for k, v in mix.most_common()))
