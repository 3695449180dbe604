"""Golden SASS summaries of the shipped kernels (kernels_ptx/*.sasm, default parameters).

Each tests/golden/sass/<kernel>.json holds the fields of `asmgemm sass` that depend only on the
.sasm, asmgemm's own stages and the ptxas version: instruction count and mix, loops and their
mix, registers, shared memory, stack frame, local-memory instructions, bank conflicts, reuse hits
and the sum of stall counts. Left out on purpose: addresses, live-register counts and anything
else nvdisasm computes, and the wording of the listing.

A change in these numbers means the SASS changed: look at `asmgemm sass KERNEL` before accepting
it. To accept (regenerate) deliberately:

    ASMGEMM_REGEN_GOLDEN=1 python3 -m pytest -q tests/test_sass_golden.py

A golden made with another ptxas version is skipped (the file records the version), and a kernel
without a golden file is skipped with the command above as the reason.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from asmgemm.pipeline import assemble_traced, build_file, shipped_kernels
from asmgemm.sass.inspect import inspect_build
from asmgemm.toolchain import find_tool, tool_version

GOLDEN = Path(__file__).parent / "golden" / "sass"
REGEN = os.environ.get("ASMGEMM_REGEN_GOLDEN") == "1"

pytestmark = [
    pytest.mark.toolchain,
    pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                       reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')"),
]


def _stable(summary) -> dict:
    d = summary.to_json()
    keep = ("instructions", "mix", "groups", "bank_conflicts", "reuse_hits", "reuse_flags", "stall_cycles",
            "local_loads", "local_stores", "registers", "shared_bytes", "stack_frame_bytes", "loops")
    return {k: d[k] for k in keep if k in d}


def golden_summary(name: str) -> dict:
    report = inspect_build(assemble_traced(build_file(name)))
    kernels = {}
    for k in report.kernels.values():
        entry = _stable(k.summary)
        entry["loop_summaries"] = [dict(_stable(s), depth=lp.depth) for lp, s in zip(k.loops, k.loop_summaries)]
        kernels[k.name] = entry
    return {"kernel_file": f"kernels_ptx/{name}.sasm", "target": report.target,
            "ptxas": tool_version("ptxas"), "kernels": kernels}


@pytest.mark.parametrize("name", sorted(shipped_kernels()))
def test_golden_sass_summary(name):
    path = GOLDEN / f"{name}.json"
    if not REGEN and not path.exists():
        pytest.skip(f"no golden for {name}: ASMGEMM_REGEN_GOLDEN=1 python3 -m pytest -q tests/test_sass_golden.py")
    got = golden_summary(name)
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        return
    want = json.loads(path.read_text())
    if want["ptxas"] != got["ptxas"]:
        pytest.skip(f"golden made with ptxas {want['ptxas']}, this is {got['ptxas']}")
    assert got["kernels"].keys() == want["kernels"].keys()
    for kname, w in want["kernels"].items():
        g = got["kernels"][kname]
        for key in w:
            assert g.get(key) == w[key], f"{name}/{kname}: {key} changed: golden {w[key]!r}, now {g.get(key)!r}"


def test_golden_files_belong_to_shipped_kernels():
    stale = [p.stem for p in GOLDEN.glob("*.json") if p.stem not in shipped_kernels()]
    assert not stale, f"golden files without a kernel in kernels_ptx/: {stale}"
