"""tools/judge_model.py on the kept H200 sweeps (tools/data/judge_h200.json.gz, compact): every call
of them judged, with the model the H200 gets (the H100's, rescaled); a compact document judges as
the full one it was made from; a database laid over with --db is the one judged; sweeps of two GPUs
refused."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = [str(ROOT / "tools" / "data" / "judge_h200.json.gz")]


def _run(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "judge_model.py"), *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def _calls() -> int:
    """The calls the sweeps timed: a sample's own M x N x K and layout, or the call it keeps (a
    swapped candidate's)."""
    return len({s.get("call") or f"sgemm|{s['layout']}|{s['m']}x{s['n']}x{s['k']}|plain"
                for path in SWEEPS for s in json.load(gzip.open(path))["samples"]})


def test_the_kept_sweeps_are_judged_with_the_model_the_h200_gets(tmp_path):
    assert SWEEPS
    out = tmp_path / "r.json"
    run = _run(*SWEEPS, "--json", str(out), "--worst", "3")
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["gpu"] == "NVIDIA H200" and report["model"].startswith("the model alone")
    sg = report["families"]["sgemm"]
    assert sg["calls"] == _calls() and 0 < sg["within_5pct"] <= sg["calls"] and len(sg["worst"]) <= 3
    assert sg["geomean_pick_over_best"] >= 1.0
    assert f"on {sg['within_5pct']} of {sg['calls']} calls" in run.stdout


def test_a_database_laid_over_is_the_one_judged(tmp_path):
    """A database whose configurations all have one coefficient set ranks by tile count alone: a
    different share than the shipped one's, and its GPU named in the model line."""
    shipped = json.loads((ROOT / "kernels_ptx" / "dispatch" / "nvidia_h100_80gb_hbm3.json").read_text())
    flat = dict(shipped, model=dict(shipped["model"], residuals=[], configs={
        k: dict(v, block_s=1e-6, step_s=1e-7, variants={}) for k, v in shipped["model"]["configs"].items()}))
    db = tmp_path / "flat.json"
    db.write_text(json.dumps(flat))
    reports = []
    for name, extra in (("shipped", []), ("flat", ["--db", str(db)])):
        assert _run(*SWEEPS, "--json", str(tmp_path / f"{name}.json"), *extra).returncode == 0
        reports.append(json.loads((tmp_path / f"{name}.json").read_text()))
    a, b = reports
    assert a["families"]["sgemm"]["calls"] == b["families"]["sgemm"]["calls"]
    assert a["families"]["sgemm"]["geomean_pick_over_best"] != b["families"]["sgemm"]["geomean_pick_over_best"]


def test_a_compact_document_judges_as_the_full_one(tmp_path):
    """The compact document with the fields it leaves out written in (family, kernel, call,
    call_variant, swap) and "compact" dropped: the same report."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from judge_model import expand
    finally:
        sys.path.pop(0)
    doc = json.load(gzip.open(SWEEPS[0]))
    full = expand(doc)
    assert all({"family", "kernel", "call", "call_variant", "swap"} <= set(s) for s in full["samples"])
    plain = {k: v for k, v in full.items() if k != "compact"}
    assert expand(plain) is plain
    (tmp_path / "full.json").write_text(json.dumps(plain))
    reports = []
    for name, path in (("compact", SWEEPS[0]), ("full", str(tmp_path / "full.json"))):
        assert _run(path, "--json", str(tmp_path / f"{name}.r.json")).returncode == 0
        reports.append(json.loads((tmp_path / f"{name}.r.json").read_text())["families"])
    assert reports[0] == reports[1]


def test_sweeps_of_two_gpus_are_refused(tmp_path):
    other = json.load(gzip.open(SWEEPS[0]))
    other["gpu"] = "Another GPU"
    path = tmp_path / "other.json"
    path.write_text(json.dumps(other))
    run = _run(SWEEPS[0], str(path))
    assert run.returncode != 0 and "one at a time" in run.stderr and "Traceback" not in run.stderr
