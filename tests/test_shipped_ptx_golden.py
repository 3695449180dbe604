"""Digests of the PTX the shipped kernels build to, over a sweep of parameters.

A rewrite of a kernel's source for readability (names, macros, comments) must not change its PTX;
this test holds it to that, byte for byte apart from two source positions in comments (`normalized`). The sweep covers, for `sgemm`: the default and the large
variant (RQ=4 BK=16 LOAD_AHEAD=1 LDG_NC=0) in all 16 TRANS_A/TRANS_B/VEC_A/VEC_B layouts, every
point of its `.tune` space (nn layout, 128-bit loads; points the kernel refuses with `.error` are
recorded as "error" and must keep failing), and a few mixed ones that reach the remaining macro
branches (cp.async and 64 threads with transposed and scalar operands, coherent loads, BK=4),
split-K's partial pass (SPLIT_K=1 on the 64-thread BK=16 cp.async kernel the split rule runs) in
all 16 layouts, and `splitk_reduce` for each C type, with and without vectors. For `mma_gemm`
(built for sm_80, its first target; the other targets differ in the `.target` line): the default
and each tiling its untuned size rules pick, in all 4 layouts with 16- and 2-byte copies, fp16 and
bf16; mixed and 8- and 4-byte copies; fp32 C, WIDE_C, bias per column and per row, each
activation; 13 points of its `.tune` space (every 17th: the whole space is 216 points); its
batched (BATCHED=1) and grouped (GROUPED=1) launch modes; and split-K's partial pass, alone
(SPLIT_K=1) and summing in the kernel (SPLIT_FIXUP=1).

A digest that differs is either a regression or a deliberate change of the kernel or emitter. To
accept a deliberate change, regenerate and review the diff (and the PTX) before committing:

    ASMGEMM_REGEN_GOLDEN=1 python3 -m pytest -q -m "" tests/test_shipped_ptx_golden.py && git diff tests/golden

(`-m ""`: the slow set too, every configuration; under `-n` the workers write the file in turn.)
"""
import functools
import itertools
import json
import os
from pathlib import Path

import pytest

from asmgemm.errors import AsmError
from asmgemm.expand import expand
from asmgemm.parse import parse_source
from asmgemm.pipeline import BuildOptions, build_file, resolve_input
from asmgemm.files import read_source
from ptx_digest import digest
from sweeps import sample_every

GOLDEN = Path(__file__).parent / "golden" / "shipped_ptx_sha256.json"
LAYOUTS = [dict(TRANS_A=ta, TRANS_B=tb, VEC_A=va, VEC_B=vb)
           for ta, tb, va, vb in itertools.product((0, 1), repeat=4)]
LARGE = dict(RQ=4, BK=16, LOAD_AHEAD=1, LDG_NC=0)
SPLIT_SMALL = dict(SPLIT_K=1, THREADS=64, BK=16, ASYNC=1)
MIXED = [
    dict(ASYNC=1, TRANS_A=1, VEC_A=0, TRANS_B=1),
    dict(ASYNC=1, TRANS_A=1, VEC_B=0),
    dict(ASYNC=1, RQ=4, BK=16, TRANS_B=1, VEC_B=0),
    dict(ASYNC=1, THREADS=64, TRANS_A=1, VEC_A=0, VEC_B=0),
    dict(ASYNC=1, THREADS=64, BK=4, TRANS_A=1, TRANS_B=1),
    dict(THREADS=64, TRANS_A=1, VEC_A=0, TRANS_B=1, LDG_NC=0),
    dict(THREADS=64, LOAD_AHEAD=1, TRANS_A=1, VEC_A=0, VEC_B=0, LDG_NC=0),
    dict(PREFETCH=1, TRANS_A=1, VEC_A=0, TRANS_B=1, VEC_B=0, LDG_NC=0),
]


@functools.lru_cache(maxsize=None)
def expanded(name: str):
    """The shipped source parsed and expanded (no register plan), once per kernel: the sweep and the
    defaults both read it while the module is collected, in every xdist worker."""
    return expand(parse_source(read_source(resolve_input(name))))


def tune_space(name: str) -> list[dict]:
    """Every point of the kernel's `.tune` space (parse and expansion only: no register plan)."""
    tunables = expanded(name).tunables
    return [dict(zip(tunables, values)) for values in itertools.product(*tunables.values())]


def configs() -> list[tuple[str, dict]]:
    """(kernel, defines) pairs, without duplicates, in a stable order."""
    sweep = [("sgemm_naive", {}), ("sgemm", {})]
    sweep += [("sgemm", layout) for layout in LAYOUTS]
    sweep += [("sgemm", {**LARGE, **layout}) for layout in LAYOUTS]
    sweep += [("sgemm", point) for point in tune_space("sgemm")]
    sweep += [("sgemm", mixed) for mixed in MIXED]
    # split-K's partial pass on the small-problem kernel the split rule runs, in all 16 layouts
    sweep += [("sgemm", {**SPLIT_SMALL, **layout}) for layout in LAYOUTS]
    sweep += [("splitk_reduce", dict(C_TYPE=ct, VEC=v)) for ct in (0, 1, 2) for v in (0, 1)]
    sweep += [("hgemm", {})]
    sweep += [("hgemm", dict(TRANS_A=ta, TRANS_B=tb, VEC_C=vc, BF16=bf)) for ta in (0, 1) for tb in (0, 1)
              for vc in (0, 1) for bf in (0, 1)]
    sweep += [("hgemm", dict(TRANS_A=ta, TRANS_B=tb, VEC_C=1, WIDE_C=1, BF16=bf)) for ta in (0, 1) for tb in (0, 1)
              for bf in (0, 1)]
    sweep += [("hgemm", point) for point in tune_space("hgemm")]
    sweep += mma_gemm_configs()
    return list({config_id(n, d): (n, d) for n, d in sweep}.values())


# mma_gemm's untuned tilings (kernels.toml [[hgemm_mma.size_rule]]): few 128 x 128 tiles, and WN = 32
# where an operand is copied 2 bytes at a time
MMA_SMALL = dict(BM=64, BN=64, WM=32, WN=32)
MMA_NARROW = dict(WN=32)
MMA_EPILOGUES = [
    dict(C_F32=1), dict(WIDE_C=1), dict(C_F32=1, WIDE_C=1, BIAS=1, ACT=2), dict(BIAS=2, ACT=4),
    dict(TRANS_B=1, BIAS=1, ACT=3), dict(BF16=1, WIDE_C=1, ACT=1), dict(BF16=1, C_F32=1, BIAS=2, ACT=2),
    dict(**MMA_SMALL, BIAS=1, ACT=2, WIDE_C=1), dict(**MMA_NARROW, ALIGN_A=2, C_F32=1, BIAS=1, ACT=4),
]


def mma_gemm_configs() -> list[tuple[str, dict]]:
    out = [("mma_gemm", {}), ("mma_gemm", MMA_SMALL), ("mma_gemm", MMA_NARROW)]
    for (ta, tb), align, bf16 in itertools.product(((0, 0), (0, 1), (1, 0), (1, 1)), (16, 2), (0, 1)):
        # the tiling the size rules pick for a large problem (16 bytes: the defaults; 2: WN = 32),
        # and for a small one
        for tiling in ({} if align == 16 else MMA_NARROW, MMA_SMALL):
            out.append(("mma_gemm", dict(**tiling, TRANS_A=ta, TRANS_B=tb, ALIGN_A=align, ALIGN_B=align, BF16=bf16)))
    out += [("mma_gemm", dict(ALIGN_A=8, ALIGN_B=4)), ("mma_gemm", dict(ALIGN_A=4, ALIGN_B=8, TRANS_A=1)),
            ("mma_gemm", dict(**MMA_NARROW, ALIGN_A=2, ALIGN_B=16, TRANS_B=1)),
            ("mma_gemm", dict(**MMA_NARROW, ALIGN_A=16, ALIGN_B=2, TRANS_A=1))]
    out += [("mma_gemm", epilogue) for epilogue in MMA_EPILOGUES]
    out += [("mma_gemm", point) for point in tune_space("mma_gemm")[::17]]
    # the launch modes of issue 33: batched (grid z) and grouped (problems along M from offs)
    out += [("mma_gemm", dict(BATCHED=1)), ("mma_gemm", dict(BATCHED=1, TRANS_A=1, TRANS_B=1, C_F32=1, BIAS=1, ACT=2)),
            ("mma_gemm", dict(**MMA_NARROW, BATCHED=1, ALIGN_A=2, ALIGN_B=2, BIAS=2)),
            ("mma_gemm", dict(GROUPED=1, BF16=1)), ("mma_gemm", dict(GROUPED=1, TRANS_B=1, WIDE_C=1, ACT=4)),
            ("mma_gemm", dict(**MMA_NARROW, GROUPED=1, TRANS_A=1, ALIGN_A=2, C_F32=1)),
            ("mma_gemm", dict(**MMA_SMALL, GROUPED=1, BIAS=1))]
    # split-K's partial pass, and the one launch whose tiles' last blocks sum it (issue 32: SPLIT_FIXUP)
    out += [("mma_gemm", dict(SPLIT_K=1)), ("mma_gemm", dict(SPLIT_K=1, SPLIT_FIXUP=1)),
            ("mma_gemm", dict(**MMA_SMALL, SPLIT_K=1, SPLIT_FIXUP=1, BF16=1, ALIGN_A=2, ALIGN_B=2)),
            ("mma_gemm", dict(**MMA_NARROW, SPLIT_K=1, SPLIT_FIXUP=1, C_F32=1, TRANS_A=1, TRANS_B=1))]
    return out


def config_id(name: str, defines: dict) -> str:
    """'sgemm RQ=4 TRANS_A=1': the kernel and the defines that differ from its defaults, in source order."""
    order = list(DEFAULTS[name])
    shown = sorted((k, v) for k, v in defines.items() if DEFAULTS[name].get(k) != v)
    return " ".join([name] + [f"{k}={v}" for k, v in sorted(shown, key=lambda kv: order.index(kv[0]))])


def defaults(name: str) -> dict:
    return dict(expanded(name).parameters)


def ptx_digest(name: str, defines: dict) -> str:
    """sha256 of the PTX, or "error" when the kernel refuses the parameters with `.error`."""
    try:
        result = build_file(name, BuildOptions(defines={k: str(v) for k, v in defines.items()},
                                               target=TARGETS.get(name, "sm_90")))
    except AsmError:
        return "error"
    return digest(result.ptx, result.source.path, name)


TARGETS = {"hgemm": "sm_90a", "mma_gemm": "sm_80"}
DEFAULTS = {name: defaults(name) for name in ("sgemm_naive", "sgemm", "hgemm", "splitk_reduce", "mma_gemm")}
CONFIGS = configs()
IDS = [config_id(n, d) for n, d in CONFIGS]
REGEN = bool(os.environ.get("ASMGEMM_REGEN_GOLDEN"))
STORED = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


def _store(key: str, digest: str) -> None:
    """Write one regenerated digest into the golden file as it is on disk now, under a lock: under
    `-n`, each worker holds its own STORED, and writing that back whole lost the other workers'
    entries (a regeneration under xdist once kept 4 of 8 changed digests)."""
    import fcntl
    import hashlib
    import tempfile
    # (a stable name: str hashes differ between the workers' processes)
    lock_path = Path(tempfile.gettempdir()) / f"asmgemm-golden-{hashlib.sha1(str(GOLDEN).encode()).hexdigest()[:12]}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        on_disk = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        on_disk[key] = digest
        STORED.update(on_disk)
        GOLDEN.write_text(json.dumps({k: on_disk[k] for k in IDS if k in on_disk}, indent=1) + "\n")


@pytest.mark.parametrize("name, defines", sample_every(160, CONFIGS, unpack=True), ids=IDS)
def test_shipped_ptx_matches_golden(name, defines):
    key = config_id(name, defines)
    digest = ptx_digest(name, defines)
    if REGEN:
        _store(key, digest)
    assert key in STORED, f"no golden digest for '{key}': run with ASMGEMM_REGEN_GOLDEN=1 and review it"
    assert digest == STORED[key], f"{key}: the PTX differs from the golden digest ({STORED[key]})"


def test_golden_lists_only_current_configs():
    if not REGEN:
        assert sorted(STORED) == sorted(IDS), "the golden JSON and the sweep list different configurations"
