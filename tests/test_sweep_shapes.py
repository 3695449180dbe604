"""tools/sweep_shapes.py, the drawn sets of tools/dispatch_sweep.sh: the same seed draws the same
shapes (the shipped H100 database's first training sweep is seed 9001's, 20 calls a layout: the
kept samples in tools/data/dispatch/sweep_2026-11-27 are exactly its calls), every shape within its
set's ranges and rounding, and the two output forms tune --sweep reads."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sweep_shapes  # noqa: E402

LAYOUTS = ["nn", "nt", "tn", "tt"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_train_seed_9001_is_the_kept_sweeps_calls(layout):
    doc = json.loads(gzip.open(ROOT / "tools" / "data" / "dispatch" / "sweep_2026-11-27" /
                               f"sweep_sgemm_train_{layout}.json.gz").read())
    kept = {(s["m"], s["n"], s["k"]) for s in doc["samples"]}
    drawn = [(m, n, k) for m, n, k, _ in sweep_shapes.volume_shapes("train", 9001, 20, layout)]
    assert len(drawn) == 20 and set(drawn) == kept


@pytest.mark.parametrize("name", sorted(sweep_shapes.VOLUME_SETS))
@pytest.mark.parametrize("align", [1, 8])
def test_volume_sets_keep_their_bounds_and_rounding(name, align):
    low, lo_log2, hi_log2 = sweep_shapes.VOLUME_SETS[name]
    shapes = sweep_shapes.volume_shapes(name, 17, 40, "nt", align)
    assert len(shapes) == 40
    for i, (m, n, k, label) in enumerate(shapes):
        assert 2**lo_log2 <= m * n * k <= 2**hi_log2
        # train rounds its second half to 16; sizes at 16384 are clipped there whatever the rounding
        step = 16 if name == "train" and i >= 20 else align
        assert all(low <= d <= 16384 and (d % step == 0 or d == 16384) for d in (m, n, k)), (m, n, k)
        assert label.endswith(f" nt {i}")


@pytest.mark.parametrize("name", sorted(sweep_shapes.BOX_SETS))
def test_box_sets_keep_their_ranges(name):
    align = 8 if name == "wide_b" else 1
    shapes = sweep_shapes.box_shapes(name, 9406, 50, "tt", align)
    assert len(shapes) == 50
    for dims in shapes:
        for d, (lo, hi) in zip(dims, sweep_shapes.BOX_SETS[name]):
            assert lo <= d <= hi + align - 1 and d % align == 0, (name, dims)


def test_the_same_seed_draws_the_same_shapes_and_each_layout_its_own():
    a = sweep_shapes.box_shapes("wide_b", 9406, 12, "nn", 8)
    assert a == sweep_shapes.box_shapes("wide_b", 9406, 12, "nn", 8)
    assert a != sweep_shapes.box_shapes("wide_b", 9406, 12, "nt", 8)
    assert a != sweep_shapes.box_shapes("wide_b", 9407, 12, "nn", 8)
    # the first of seed 9406's nn calls, swept on the H200 (docs/log/dispatch.md, "A few tile rows over a large B")
    assert a[0] == (368, 14232, 8552)


def _cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "sweep_shapes.py"), *args], capture_output=True,
                          text=True, timeout=60)


def test_the_command_prints_a_shape_file_or_a_shape_list():
    got = _cli("train", "9001", "4", "nn")
    assert got.returncode == 0
    lines = got.stdout.splitlines()
    assert len(lines) == 4 and all(len(line.split()) == 6 and line.split()[3:5] == ["train", "nn"] for line in lines)
    got = _cli("rows", "9005", "3", "nn")
    assert got.returncode == 0 and got.stdout.strip() == "57x4882x4242,20x3466x5485,54x12252x7360"
    bad = _cli("wide_b", "1", "0", "nn")
    assert bad.returncode == 2 and "count" in bad.stderr and "Traceback" not in bad.stderr
