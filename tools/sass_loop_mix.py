"""Instruction mix of the hottest loop (the largest backward branch) in a cubin's SASS.
Usage: sass_loop_mix.py FILE.cubin   (nvdisasm from asmgemm.toolchain)"""
import re
import subprocess
import sys
from collections import Counter

from asmgemm.toolchain import find_tool


def loop_mix(cubin_path: str) -> tuple[int, Counter]:
    text = subprocess.run([find_tool("nvdisasm"), "-c", cubin_path], capture_output=True, text=True, check=True).stdout
    ins, labels, pending = [], {}, None
    for line in text.splitlines():
        m = re.match(r"^\.(L_x_\d+):", line)
        if m:
            pending = m.group(1)
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            if pending:
                labels[pending], pending = addr, None
            ins.append((addr, m.group(2).strip()))
    best = None
    for addr, text_ in ins:
        m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", text_)
        if m and m.group(1) in labels and labels[m.group(1)] < addr:
            if best is None or addr - labels[m.group(1)] > best[1] - best[0]:
                best = (labels[m.group(1)], addr)
    mix = Counter()
    for addr, text_ in ins:
        if best and best[0] <= addr <= best[1]:
            words = text_.split()
            op = words[1] if words[0].startswith("@") else words[0]
            mix[op.split(".")[0] + (".128" if ".128" in op else "")] += 1
    return sum(mix.values()), mix


if __name__ == "__main__":
    total, mix = loop_mix(sys.argv[1])
    print(f"loop: {total} instructions, FFMA {mix['FFMA']} ({100 * mix['FFMA'] / max(total, 1):.1f}%): "
          + ", ".join(f"{k} {v}" for k, v in mix.most_common()))
