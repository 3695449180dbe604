#!/usr/bin/env python3
"""The shapes of tools/dispatch_sweep.sh's drawn sweep sets, one set and layout a call, the same for
the same seed (the shipped databases' sweeps are reproducible from their seeds: train seed 9001, 20
calls a layout, is tools/data/dispatch/sweep_2026-11-27's sgemm set; tests/test_sweep_shapes.py).

  train      M, N, K log-uniform in [1, 16384] with 2^18 <= M N K <= 2^36; the first half rounded up
             to --align (1: unrounded), the second to 16
  large_odd  M, N, K log-uniform in [256, 16384] with 2^33 <= M N K <= 2^38, rounded up to --align
  rows       sgemm's skinny class: M in [17, 128], N in [2048, 16384], K in [512, 8192]
  wide_b     a few tile rows over a large B: M in [129, 512], N in [4096, 16384], K in [2048, 16384]

train and large_odd print a shape file (`M N K label` a line, what `asmgemm tune --sweep FILE`
reads); rows and wide_b print one line of comma-separated MxNxK.

    python3 tools/sweep_shapes.py train 9001 20 nn
    python3 tools/sweep_shapes.py wide_b 9406 12 nt --align 8
"""
from __future__ import annotations

import argparse
import math
import random
import sys

MAX_SIZE = 16384
# set -> (low size, log2 of the least M N K, log2 of the largest): the volume-bounded sets
VOLUME_SETS = {"train": (1, 18, 36), "large_odd": (256, 33, 38)}
# set -> ((M low, high), (N low, high), (K low, high)): the box sets
BOX_SETS = {"rows": ((17, 128), (2048, 16384), (512, 8192)),
            "wide_b": ((129, 512), (4096, 16384), (2048, 16384))}


def _round_up(x: int, align: int) -> int:
    return -(-x // align) * align


def volume_shapes(name: str, seed: int, count: int, layout: str, align: int = 1) -> list[tuple[int, int, int, str]]:
    """(M, N, K, label) of a train or large_odd set: each size log-uniform from the set's low size to
    16384, rounded up to `align` (train: the first half; its second half to 16), drawn again until
    M N K is within the set's bounds."""
    low, lo_log2, hi_log2 = VOLUME_SETS[name]
    rng = random.Random(f"{seed}:{layout}")
    out: list[tuple[int, int, int, str]] = []
    while len(out) < count:
        a = align if low > 1 or len(out) < count // 2 else 16
        dims = [min(MAX_SIZE, _round_up(int(math.exp(rng.uniform(math.log(low), math.log(MAX_SIZE)))), a))
                for _ in range(3)]
        if 2**lo_log2 <= dims[0] * dims[1] * dims[2] <= 2**hi_log2:
            out.append((*dims, f"{'train' if low == 1 else 'large'} {layout} {len(out)}"))
    return out


def box_shapes(name: str, seed: int, count: int, layout: str, align: int = 1) -> list[tuple[int, int, int]]:
    """(M, N, K) of a rows or wide_b set: each size log-uniform in its range, rounded up to `align`."""
    rng = random.Random(f"{seed}:{layout}")

    def draw(lo: int, hi: int) -> int:
        return _round_up(int(math.exp(rng.uniform(math.log(lo), math.log(hi)))), align)
    (m_lo, m_hi), (n_lo, n_hi), (k_lo, k_hi) = BOX_SETS[name]
    return [(draw(m_lo, m_hi), draw(n_lo, n_hi), draw(k_lo, k_hi)) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("set", choices=[*VOLUME_SETS, *BOX_SETS])
    ap.add_argument("seed", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("layout", choices=["nn", "nt", "tn", "tt"])
    ap.add_argument("--align", type=int, default=1, help="round sizes up to a multiple of this (default 1)")
    args = ap.parse_args(argv)
    if args.count < 1 or args.align < 1:
        ap.error("count and --align must be >= 1")
    if args.set in VOLUME_SETS:
        for m, n, k, label in volume_shapes(args.set, args.seed, args.count, args.layout, args.align):
            print(m, n, k, label)
    else:
        print(",".join(f"{m}x{n}x{k}" for m, n, k in box_shapes(args.set, args.seed, args.count, args.layout, args.align)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
