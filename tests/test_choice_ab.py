"""tools/choice_ab.py on the CPU: which calls two records of the dispatch's choices differ on, the
summary of their timings, and a record of a few calls made here (configure with the builds)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))          # the tool imports its siblings (gpu_events) by name
spec = importlib.util.spec_from_file_location("choice_ab", TOOLS / "choice_ab.py")
choice_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(choice_ab)


def call(m, kernel, label, params, **extra):
    return {"m": m, "n": 64, "k": 32, "layout": "nn", "dtype": "float32", "kernel": kernel, "label": label,
            "params": params, **extra}


def test_only_the_calls_whose_choice_differs_are_moved():
    old = {"calls": [call(1, "sgemm", "t64x64_k16", {"BK": 16}), call(2, "sgemm", "t64x64_k16", {"BK": 16}),
                     call(3, "hgemm", None, None), call(4, "sgemm", "a", {}, error="no")]}
    new = {"calls": [call(1, "sgemm", "t64x64_k16", {"BK": 16}), call(2, "sgemm", "t64x64_k16", {"BK": 8}),
                     call(3, "hgemm_mma", "t64x64_w32x32", {"BM": 64}), call(4, "sgemm", "b", {}),
                     call(5, "sgemm", "c", {})]}
    moved = choice_ab.moved(old, new)
    assert [(o["m"], n["m"]) for o, n in moved] == [(2, 2), (3, 3)]      # 4: an error; 5: only in one
    # a switch the new tree adds at 0 (off) is no move; at 1 it is
    old = {"calls": [call(1, "sgemm", "t", {"BK": 16}), call(2, "sgemm", "t", {"BK": 16})]}
    new = {"calls": [call(1, "sgemm", "t", {"BK": 16, "SPLIT_FIXUP": 0}), call(2, "sgemm", "t", {"BK": 16, "FIX": 1})]}
    assert [n["m"] for _, n in choice_ab.moved(old, new)] == [2]


def test_the_summary_is_new_over_old_by_each_column():
    rows = [{"call": "a", "old": {"gpu": 10.0, "call": 30.0}, "new": {"gpu": 5.0, "call": 30.0}},
            {"call": "b", "old": {"gpu": 10.0, "call": 30.0}, "new": {"gpu": 20.0, "call": 30.0}},
            {"call": "c", "old": {"gpu": 10.0, "call": 30.0}, "new": {"gpu": 10.2, "call": 60.0}}]
    got = choice_ab.summarize(rows)
    assert got["moved"] == 3
    assert got["gpu"]["new_over_old"] == pytest.approx(1.02 ** (1 / 3), abs=1e-4)
    assert (got["gpu"]["slower"], got["gpu"]["faster"]) == (1, 1)
    assert got["gpu"]["worst"][0] == {"call": "b", "new_over_old": 2.0}
    assert (got["call"]["slower"], got["call"]["faster"]) == (1, 0)


@pytest.mark.slow
def test_a_record_names_what_configure_chooses(tmp_path):
    out = tmp_path / "rec.json"
    assert choice_ab.main(["record", "--shapes", "64x96x128", "--dtypes", "float32", "--layouts", "nn", "tt",
                           "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["calls"]
    assert [(r["m"], r["n"], r["k"], r["layout"]) for r in rows] == [(64, 96, 128, "nn"), (64, 96, 128, "tt")]
    for r in rows:
        assert r["kernel"].startswith("sgemm") and r["label"] and r["params"] and r["chosen_by"] == "model"


@pytest.mark.slow
def test_a_rules_choice_records_its_builds_values_so_a_changed_build_is_a_move(tmp_path):
    """A kernel that chooses by its own rules (label null: hgemm's route to hgemm_skinny for two rows
    of an M-major A into a wide B, K under the skinny kernel's split rule) records the build's -D
    values, less the split switches (params= name a split by its count), so that a change to what
    its rules build is a move `time` can run both ways as params=; a catalog's call records its
    entry (label and params)."""
    out = tmp_path / "rec.json"
    assert choice_ab.main(["record", "--gpu", "NVIDIA H200", "--shapes", "2x20000x500", "--shapes", "592x6656x5456",
                           "--dtypes", "float16", "--layouts", "tn", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["calls"]
    assert [r["kernel"] for r in rows] == ["hgemm_skinny", "hgemm"]
    assert rows[0]["label"] is None and rows[0]["params"]["MR"] == 4 and "SPLIT_K" not in rows[0]["params"]
    assert rows[1]["label"] and rows[1]["params"] and rows[1]["chosen_by"] in ("model", "database")
    old = {"calls": [dict(rows[0], params={**rows[0]["params"], "MR": 16}), rows[1]]}
    assert [n["m"] for _, n in choice_ab.moved(old, {"calls": rows})] == [2]
