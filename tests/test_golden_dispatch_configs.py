"""Digests of hgemm.sasm's PTX for every configuration the untuned dispatch can pick.

tests/hgemm_dispatch_configs.py derives the configurations from kernels.toml (the catalog's
entries with their splits and C^T launches, and the call parameters of hgemm, bgemm, hgemm_f32c and
bgemm_f32c, every layout, plain and fused epilogues, fresh and strided C, a batch), less what the
kernel's guards refuse; tests/golden/hgemm_dispatch_ptx_sha256.json holds the sha256 of each one's
normalized PTX. A rewrite of the kernel's source for readability
(moving code between include files, renaming, comments) must leave every digest as it is.

The whole sweep (about fifteen hundred builds) is `slow`; the default run rebuilds every 256th
configuration of the file (10 builds: every 64th had cost it ~25 s of its 5 minutes on the 2-core
machine). A digest that differs is a regression or a deliberate change; for the latter
regenerate, review the diff and the PTX, and commit both:

    python3 tests/hgemm_dispatch_configs.py && git diff tests/golden
"""
import json
import os

import pytest

import hgemm_dispatch_configs as dispatch_configs

STORED: dict[str, str] = json.loads(dispatch_configs.GOLDEN.read_text())
SAMPLE_EVERY = 256
CONFIGS = list(STORED)
SAMPLE = CONFIGS[::SAMPLE_EVERY]


def check(configs: list[str], workers: int | None = None) -> None:
    built = dispatch_configs.digests(configs, workers)
    differ = [c for c in configs if built[c] != STORED[c]]
    assert not differ, (f"{len(differ)} of {len(configs)} configurations build other PTX than the golden digests, "
                        "e.g.\n  " + "\n  ".join(differ[:10]))


def test_sample_matches_golden():
    """Every 256th configuration, in the default run (10 builds)."""
    assert len(SAMPLE) >= 5, "the golden file lists too few configurations for a sample"
    # under `pytest -n`, the other workers already keep every core busy: a process pool of its own
    # (one per core) would only add its start-up and fight them for the cores (the 2-core machine:
    # 37 builds took 17-39 s through the pool; 19 took ~12 s in this process). The whole
    # sweep below keeps the pool: two thousand builds outlast the other slow tests.
    check(SAMPLE, workers=1 if os.environ.get("PYTEST_XDIST_WORKER") else None)


@pytest.mark.slow
def test_every_dispatch_config_matches_golden():
    check(CONFIGS)


@pytest.mark.slow
def test_golden_lists_what_the_spec_dispatches():
    """The stored configurations are those kernels.toml dispatches today: a new catalog entry, call
    parameter or family shows up here until the golden file is regenerated."""
    ids = dispatch_configs.config_ids()
    missing, stale = sorted(set(ids) - set(STORED)), sorted(set(STORED) - set(ids))
    assert not missing and not stale, (f"not in the golden file: {missing[:5]} ({len(missing)}); "
                                       f"no longer dispatched: {stale[:5]} ({len(stale)})")


@pytest.mark.slow
def test_the_walk_reaches_every_catalog_entry():
    """Each catalog entry builds for some call of the walk, in every family: an entry no call can
    build (its guards refuse every layout) would never run, and its configurations would be missing
    from the golden set."""
    reached = dispatch_configs.entries_reached()
    for spec in dispatch_configs.families():
        missed = sorted({e.name for e in spec.configs} - reached.get(spec.name, set()))
        assert not missed, f"{spec.name}: catalog entries no call of the walk builds: {missed}"
