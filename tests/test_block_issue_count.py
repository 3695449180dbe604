"""tools/block_issue_count.py on the CPU: one block of mma_gemm run by the interpreter, its PTX
instructions a warp by region; the regions add up to the total, the tool agrees with ptx_sim's own
`issued=` counter, and a bad argument is a usage error (exit 2), not a traceback."""
from __future__ import annotations

import collections
import importlib.util
import math
from pathlib import Path

import numpy as np

from ptx_sim import Memory
from test_mma_gemm_sim import _aligned, _args, _halves, _kernel

TOOL = Path(__file__).resolve().parent.parent / "tools" / "block_issue_count.py"
SMALL = dict(BM=64, BN=64, WM=32, WN=32, ALIGN_A=2, ALIGN_B=4, C_PIECE=4)


def _tool():
    spec = importlib.util.spec_from_file_location("block_issue_count", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_regions_add_up_and_match_the_interpreters_own_count():
    out = _tool().count("mma_gemm", SMALL, 64, 64, 3, None, (0, 0), sass=False)
    assert out["warps"] == 4 and "entry" in out["regions"]
    assert math.isclose(sum(r["ptx"] for r in out["regions"].values()), out["ptx_per_warp"], abs_tol=0.5)
    # the same one-block grid through ptx_sim's issued= counter
    kern, threads, smem, bm, bn = _kernel(**SMALL)
    a, b, c = _halves(64, 3), _halves(3, 64, seed=1), _aligned((64, 64), np.float16)
    mem, issued = Memory(), collections.Counter()
    kern.run((1, 1, 1), (threads, 1, 1), _args(a, b, c, 64, 64, 3, 3, 64, 64, mem), mem, smem, issued=issued)
    assert sum(issued.values()) == out["ptx_per_warp"] * out["warps"]


def test_bad_arguments_are_usage_errors(capsys):
    tool = _tool()
    assert tool.main(["--mnk", "0,5,5", "--no-sass"]) == 2
    assert tool.main(["--mnk", "5,5", "--no-sass"]) == 2
    assert tool.main(["--mnk", "5,5,5", "-D", "BM", "--no-sass"]) == 2
    assert "--mnk M,N,K" in capsys.readouterr().err
