"""The tuning cache: keys and buckets, read/write, invalidation, corrupt files, interrupted writes."""
import json
import os
import warnings

import pytest

from asmgemm.runtime import tune_cache as tc
from asmgemm.tuning import store as tstore

GPU = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "tune.json"
    monkeypatch.setenv("ASMGEMM_TUNE_CACHE", str(path))
    monkeypatch.setattr(tc, "current_ptxas_version", lambda: "V13.0.88")
    kernel = tmp_path / "k.sasm"
    kernel.write_text('.const BK ?= 8\n.include "part.inc"\n')
    (tmp_path / "part.inc").write_text("// part\n")
    tc._memo.clear()
    return path, kernel


def store(kernel, params, shape=(4096, 4096, 4096), layout="nn", dtype="float32", gpu=GPU):
    entry = tstore.make_entry("k", dtype, str(kernel), params, shape, tflops=50.0, default_tflops=45.0)
    return tstore.store_tuned(gpu, layout, shape, entry)


@pytest.mark.parametrize("x, b", [(1, 1), (2, 2), (3, 4), (700, 1024), (4096, 4096), (4097, 8192)])
def test_bucket_rounds_up_to_a_power_of_two(x, b):
    assert tc.bucket_dim(x) == b


def test_cache_path_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("ASMGEMM_TUNE_CACHE", raising=False)
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path))
    assert tc.cache_path() == tmp_path / "tune.json"
    monkeypatch.setenv("ASMGEMM_TUNE_CACHE", str(tmp_path / "x.json"))
    assert tc.cache_path() == tmp_path / "x.json"


def test_store_then_lookup_within_the_bucket(cache):
    path, kernel = cache
    store(kernel, {"BK": 16, "THREADS": 64}, shape=(3000, 5000, 700))
    assert json.loads(path.read_text())["entries"].keys() == {f"{GPU}|k|nn|4096x8192x1024"}
    assert tc.lookup_tuned(GPU, "k", "nn", 2500, 6000, 1000) == {"BK": 16, "THREADS": 64}
    assert tc.lookup_tuned(GPU, "k", "nn", 5000, 6000, 1000) is None       # other bucket
    assert tc.lookup_tuned(GPU, "k", "nt", 3000, 5000, 700) is None         # other layout
    assert tc.lookup_tuned("NVIDIA H200", "k", "nn", 3000, 5000, 700) is None
    assert tc.lookup_tuned(GPU, "other", "nn", 3000, 5000, 700) is None          # other kernel


def test_no_cache_file_is_no_entry(cache):
    assert tc.lookup_tuned(GPU, "k", "nn", 64, 64, 64) is None


def test_a_second_store_replaces_and_keeps_others(cache):
    path, kernel = cache
    store(kernel, {"BK": 8})
    store(kernel, {"BK": 8}, layout="nt")
    store(kernel, {"BK": 16})
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) == {"BK": 16}
    assert tc.lookup_tuned(GPU, "k", "nt", 4096, 4096, 4096) == {"BK": 8}


def test_editing_the_kernel_or_an_include_invalidates(cache, tmp_path):
    path, kernel = cache
    store(kernel, {"BK": 16})
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) == {"BK": 16}
    (tmp_path / "part.inc").write_text("// part, edited\n")
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) is None
    store(kernel, {"BK": 8})
    kernel.write_text(kernel.read_text() + "// edit\n")
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) is None


def test_a_new_ptxas_invalidates_and_stale_entries_are_dropped_on_write(cache, monkeypatch):
    path, kernel = cache
    store(kernel, {"BK": 16}, layout="tt")
    monkeypatch.setattr(tc, "current_ptxas_version", lambda: "V13.1.0")
    assert tc.lookup_tuned(GPU, "k", "tt", 4096, 4096, 4096) is None
    store(kernel, {"BK": 8})
    keys = json.loads(path.read_text())["entries"].keys()
    assert keys == {f"{GPU}|k|nn|4096x4096x4096"}


def test_corrupt_cache_is_ignored_then_moved_aside(cache):
    path, kernel = cache
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "entries": {"x": ')
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) is None
    assert any("ignoring the tuning cache" in str(x.message) for x in w)
    _, moved = store(kernel, {"BK": 8})
    assert moved and os.path.exists(moved)
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) == {"BK": 8}


@pytest.mark.parametrize("content", ["[]", '{"format": 99, "entries": {}}', '{"format": 1, "entries": {}}',
                                     '{"format": 2, "entries": {"k": {"x": 1}}}'])
def test_wrong_structure_counts_as_corrupt(cache, content):
    path, _ = cache
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(tc.CacheCorrupt):
        tc.read_cache(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert tc.lookup_tuned(GPU, "k", "nn", 1, 1, 1) is None


def test_interrupted_write_leaves_the_old_cache(cache, monkeypatch):
    path, kernel = cache
    store(kernel, {"BK": 8})
    before = path.read_text()

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(tc.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store(kernel, {"BK": 16})
    monkeypatch.undo()
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_lookup_rereads_after_the_file_changes(cache):
    path, kernel = cache
    store(kernel, {"BK": 8})
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) == {"BK": 8}
    store(kernel, {"BK": 16})
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) == {"BK": 16}


def test_entry_for_a_missing_kernel_is_not_current(cache, tmp_path):
    path, kernel = cache
    store(kernel, {"BK": 8})
    kernel.unlink()
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) is None


def test_lookups_can_be_turned_off(cache, monkeypatch):
    path, kernel = cache
    store(kernel, {"BK": 8})
    with tc.lookups_off():
        assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) is None
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) == {"BK": 8}
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "1")
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) is None
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "0")
    assert tc.lookup_tuned(GPU, "k", "nn", 4096, 4096, 4096) == {"BK": 8}
