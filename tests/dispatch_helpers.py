"""Dispatch databases of the tests' own (asm/runtime/dispatch_db.py), for the CPU tests of the
catalog dispatch: a database is written to a temporary directory that $ASMGEMM_DISPATCH_DIR points
at, the shipped databases are hidden (so what a test asserts does not move with the next sweep),
and the models and refusals dispatch.py remembers are forgotten before and after.

Use: `from dispatch_helpers import dispatch_dir  # noqa: F401` (the fixture), then
`dispatch_dir("Fake GPU", best={key: label})` writes that GPU's database and returns its path."""
from __future__ import annotations

import json

import pytest


def database(gpu: str, *, target: str = "sm_90", sms: int = 132, clock_hz: float = 1.5e9,
             dram_bytes_per_s: float = 3e12, best: dict | None = None, configs: dict | None = None,
             cluster_slots: dict | None = None, **model) -> dict:
    """A format-1 database document: no fitted configurations unless given (the prior stands in
    for each), host and split costs as `model` says."""
    m = {"host_s": 10e-6, "launch_s": 4e-6, "reduce_fixed_s": 3e-6, "reduce_bytes_per_s": 0.0,
         "cluster_block_s": 0.0, "configs": configs or {}, "cluster_slots": cluster_slots or {}}
    m.update(model)
    return {"format": 1, "gpu": gpu, "target": target, "sms": sms, "clock_hz": clock_hz,
            "dram_bytes_per_s": dram_bytes_per_s, "families": ["sgemm"], "model": m, "best": best or {}}


@pytest.fixture
def dispatch_dir(tmp_path, monkeypatch):
    """write(gpu, **database kw) -> the path of that GPU's database in a directory of this test's
    own; no shipped database is seen, no autotuning runs."""
    from asmgemm.runtime import dispatch, dispatch_db
    d = tmp_path / "dispatch"
    d.mkdir()
    monkeypatch.setenv(dispatch_db.DIR_ENV, str(d))
    monkeypatch.setattr(dispatch_db, "shipped_dir", lambda: tmp_path / "no_shipped_databases")
    monkeypatch.delenv("ASMGEMM_AUTOTUNE", raising=False)
    dispatch.forget()

    def write(gpu: str, **kw):
        path = d / f"{dispatch_db.slug(gpu)}.json"
        path.write_text(json.dumps(database(gpu, **kw)), encoding="utf-8")
        dispatch.forget()
        return path

    write.dir = d
    yield write
    dispatch.forget()
