"""The caches trust nothing they read back, and never take a call down.

Kernel cache (runtime/build_cache.py): an entry's metadata names its files (never paths) and holds
their sha256; every field is checked on read. A damaged entry (an empty or garbled cubin or PTX, a
hand-edited or unreadable JSON, one that points elsewhere) is rebuilt with one warning and never
loaded; a cache folder that cannot be written costs the cache (the kernel is built into a private
temporary folder), not the call. Tuning cache: an entry the kernel refuses falls back to the
untuned choice with one warning, once; an unreadable tune.json is one clear line.

Driven through asmgemm.gemm with a stand-in CuPy whose RawModule records what it was asked to
load (the launch itself does nothing): the same code path as on the GPU, up to the launch.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from asmgemm.toolchain import find_tool
from fake_cupy import FakeArray, forget_loaded, make_cupy, read_bytes

pytestmark = [pytest.mark.toolchain,
              pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")]

GPU = "Fake GPU"


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A stand-in CuPy; returns the list of (path, bytes) each RawModule was created from, and a
    private kernel cache and tuning cache (lookups on)."""
    loads, launches = [], []

    def function(path, entry):
        loads.append((path, read_bytes(path)))
        return lambda grid, block, args, shared_mem=0: launches.append((grid, block, args, shared_mem))
    monkeypatch.setitem(sys.modules, "cupy", make_cupy(function, GPU))
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ASMGEMM_TUNE_CACHE", str(tmp_path / "cache" / "tune.json"))
    monkeypatch.delenv("ASMGEMM_NO_TUNE_CACHE", raising=False)
    from asmgemm.runtime import build_cache, launch_config, tune_cache
    forget_loaded(monkeypatch)
    monkeypatch.setattr(launch_config, "_tuned", {})
    monkeypatch.setattr(launch_config, "_rejected", set())
    tune_cache._memo.clear()
    build_cache.clear_memory_cache()
    yield types.SimpleNamespace(loads=loads, launches=launches, folder=tmp_path / "cache" / "kernels")
    build_cache.clear_memory_cache()
    tune_cache._memo.clear()


def cache_warning(w) -> bool:
    from asmgemm.files import CacheWarning
    return issubclass(w.category, CacheWarning)


def new_process(gpu):
    """What a new process knows: nothing in memory, nothing loaded."""
    from asmgemm.runtime import build_cache, kept_launch, launch_config
    build_cache.clear_memory_cache()
    kept_launch._functions.clear()
    kept_launch._modules.clear()
    launch_config.forget_tuned_lookups()
    gpu.loads.clear()


def call_gemm(**kw):
    import asmgemm
    rs = np.random.default_rng(0)
    a = rs.standard_normal((64, 64)).astype(np.float32).view(FakeArray)
    b = rs.standard_normal((64, 64)).astype(np.float32).view(FakeArray)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asmgemm.gemm(a, b, **kw)
    return [w for w in caught if issubclass(w.category, RuntimeWarning)]


def the_entry(gpu) -> tuple[Path, dict]:
    (meta_path,) = gpu.folder.glob("*.json")
    return meta_path, json.loads(meta_path.read_text())


def test_an_entry_names_its_files_and_holds_their_digests(gpu):
    assert call_gemm() == []
    meta_path, meta = the_entry(gpu)
    key = meta_path.stem
    assert meta["key"] == key and meta["cubin"] == f"{key}.cubin" and meta["ptx"] == f"{key}.ptx"
    assert not any(isinstance(v, str) and os.sep in v for v in meta.values()), "a path in the metadata"
    for kind in ("cubin", "ptx"):
        assert meta[f"{kind}_sha256"] == hashlib.sha256((gpu.folder / meta[kind]).read_bytes()).hexdigest()
    (path, data), = gpu.loads
    assert Path(path) == gpu.folder / f"{key}.cubin" and data[:4] == b"\x7fELF"
    # a second process loads it from disk, without a warning
    new_process(gpu)
    assert call_gemm() == []
    assert gpu.loads[0][0] == path


# Each damage(folder, key, meta) spoils the entry <key>.* in folder; meta is a copy of its JSON.
def _zero_cubin(folder, key, meta):
    (folder / f"{key}.cubin").write_bytes(b"")


def _garble_cubin(folder, key, meta):
    p = folder / f"{key}.cubin"
    data = bytearray(p.read_bytes())
    data[len(data) // 2: len(data) // 2 + 16] = b"\xff" * 16
    p.write_bytes(bytes(data))


def _garble_ptx(folder, key, meta):
    p = folder / f"{key}.ptx"
    p.write_text(p.read_text().replace("ret;", "exit;"))


def _missing_cubin(folder, key, meta):
    (folder / f"{key}.cubin").unlink()


def edit(**fields):
    def damage(folder, key, meta):
        meta.update({k: (v(meta) if callable(v) else v) for k, v in fields.items()})
        (folder / f"{key}.json").write_text(json.dumps(meta))
    return damage


def _truncated_json(folder, key, meta):
    p = folder / f"{key}.json"
    p.write_text(p.read_text()[:40])


DAMAGE = {
    "empty cubin": _zero_cubin, "garbled cubin": _garble_cubin, "garbled ptx": _garble_ptx,
    "missing cubin": _missing_cubin, "threads='lots'": edit(threads="lots"), "tile_m=0": edit(tile_m=0),
    "smem too large": edit(smem_bytes=1 << 30), "threads=true": edit(threads=True),
    # the old format's absolute paths and the new one's names, pointing outside the cache
    "cubin elsewhere": edit(cubin="/etc/hostname", cubin_path="/etc/hostname", ptx_path="/etc/hostname"),
    "other key": edit(key="0" * 32),
    "params reordered": edit(params=lambda m: list(reversed(m["params"]))),
    "param type": edit(params=lambda m: [[n, ".f64"] for n, _ in m["params"]]),
    "truncated json": _truncated_json, "json list": lambda f, k, m: (f / f"{k}.json").write_text("[]"),
    # a value in range, but not what the build said: the metadata's own digest catches it
    "plausible edit": edit(tile_m=lambda m: m["tile_m"] * 2),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_entry_is_rebuilt_with_one_warning_and_never_loaded(gpu, damage):
    assert call_gemm() == []
    meta_path, meta = the_entry(gpu)
    key = meta_path.stem
    good_cubin = (gpu.folder / f"{key}.cubin").read_bytes()
    DAMAGE[damage](gpu.folder, key, dict(meta))
    new_process(gpu)
    caught = call_gemm()
    assert [cache_warning(w) for w in caught] == [True], [str(w.message) for w in caught]
    text = str(caught[0].message)
    assert "damaged" in text and "rebuilding" in text and "\n" not in text
    (path, data), = gpu.loads
    assert Path(path) == gpu.folder / f"{key}.cubin" and data == good_cubin, "loaded something else than a fresh build"
    # rebuilt whole: the next process finds a sound entry and no warning
    assert the_entry(gpu)[1] == meta
    new_process(gpu)
    assert call_gemm() == []
    assert gpu.loads[0][1] == good_cubin


@pytest.mark.parametrize("how", ["uncreatable", "read-only"])
def test_an_unwritable_cache_folder_builds_in_memory_with_one_warning(gpu, tmp_path, monkeypatch, how):
    if how == "uncreatable":
        (tmp_path / "file").write_text("a file where the cache folder would go\n")
        monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path / "file" / "cache"))
    else:
        ro = tmp_path / "ro" / "kernels"
        ro.mkdir(parents=True)
        os.chmod(ro, 0o555)
        monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path / "ro"))
        if os.geteuid() == 0:        # root writes anywhere: let the access check say what it would for a user
            real_access = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == ro and mode & os.W_OK
                                else real_access(p, mode, **kw))
    caught = call_gemm()
    assert len(caught) == 1 and cache_warning(caught[0])
    assert "cannot write the kernel cache folder" in str(caught[0].message) and "\n" not in str(caught[0].message)
    (path, data), = gpu.loads
    assert data[:4] == b"\x7fELF" and not str(path).startswith(str(tmp_path))
    assert call_gemm(trans_b=True) == [], "one warning per process, not per kernel"
    assert len(gpu.launches) == 2


def _store_tuned(params, shape=(64, 64, 64)):
    from asmgemm.kernel_spec import get_spec
    from asmgemm.tuning import store
    spec = get_spec("sgemm")
    entry = store.make_entry("sgemm", "float32", str(spec.source.resolve()), params, shape)
    return store.store_tuned(GPU, "nn", shape, entry)[0]


def test_a_tuned_entry_the_kernel_rejects_falls_back_once(gpu, monkeypatch):
    from asmgemm.runtime import build_cache, gemm, launch_config
    _store_tuned({"BK": 3, "THREADS": 64})              # sgemm's .error refuses BK=3
    builds = []
    real = build_cache.build_kernel

    def counting(spec, defines, target):
        builds.append(dict(defines))
        return real(spec, defines, target)
    monkeypatch.setattr(launch_config, "build_kernel", counting)
    caught = call_gemm()
    assert len(caught) == 1 and cache_warning(caught[0])
    text = str(caught[0].message)
    assert "tuning cache entry" in text and "BK=3" in text and "untuned" in text and "\n" not in text
    assert "error:" not in text
    assert [str(d["BK"]) for d in builds][:1] == ["3"] and len(builds) == 2 and str(builds[1]["BK"]) != "3"
    assert len(gpu.launches) == 1
    # the next call (even after the process forgot its tuning-cache answers) does not rebuild it
    builds.clear()
    gemm.forget_tuned_choices()
    assert call_gemm() == []
    assert all(str(d["BK"]) != "3" for d in builds)
    assert len(gpu.launches) == 2


def test_explicit_params_that_fail_still_raise(gpu):
    from asmgemm.errors import AsmError
    with pytest.raises(AsmError, match="BK must be a power of two"):
        call_gemm(params={"BK": 3})


def test_a_tuned_entry_with_values_that_are_not_parameters_is_ignored(gpu, tmp_path):
    path = _store_tuned({"BK": 8})
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    entry["params"] = {"BK": [8, 16], "THREADS": 64}
    path.write_text(json.dumps(data))
    caught = call_gemm()
    assert len(caught) == 1 and "ignoring the tuning cache entry" in str(caught[0].message)
    assert len(gpu.launches) == 1


def test_an_invalid_tune_json_is_one_warning_through_gemm(gpu, tmp_path):
    path = tmp_path / "cache" / "tune.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"format": 2, "entries": {')
    caught = call_gemm() + call_gemm(trans_a=True)
    assert len(caught) == 1 and cache_warning(caught[0])
    text = str(caught[0].message)
    assert text.count(str(path)) == 1 and "invalid JSON at line 1" in text and "\n" not in text
    assert "error:" not in text
    assert caught[0].filename == __file__, "the warning points at the caller's line, not asmgemm's"
    assert len(gpu.launches) == 2


def test_an_invalid_tune_json_is_one_line_in_bench(monkeypatch, tmp_path, run_cli):
    from test_bench_fakegpu import _fake_cupy, gemm_cost
    from asmgemm.bench import runner
    from asmgemm.runtime import tune_cache
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delenv("ASMGEMM_NO_TUNE_CACHE", raising=False)
    path = tmp_path / "tune.json"
    monkeypatch.setenv("ASMGEMM_TUNE_CACHE", str(path))
    path.write_text('{"format": 2, "entries": {')
    tune_cache._memo.clear()
    monkeypatch.setattr(runner, "make_runner", lambda spec: lambda a, b, c, ta, tb, p: gemm_cost(a, b, c, ta, tb, 2.0))
    code, out, err = run_cli("bench", "sgemm", "--shapes", "64x64x64,128x128x128", "--layouts", "nn,tn", "--reps", "1")
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [f"asmgemm: warning: ignoring the tuning cache {path}: invalid JSON at line 1, column 27: "
                     "Expecting property name enclosed in double quotes"], err
    tune_cache._memo.clear()


@pytest.mark.slow
def test_an_invalid_tune_json_does_not_disturb_tune_dry_run(monkeypatch, tmp_path, run_cli):
    path = tmp_path / "tune.json"
    monkeypatch.setenv("ASMGEMM_TUNE_CACHE", str(path))
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path / "cache"))
    path.write_text('{"format": 2, "entries": {')
    code, out, err = run_cli("tune", "sgemm", "--shape", "64,64,64", "--dry-run", "-D", "THREADS=64", "-D", "BK=8",
                             "--json")
    assert code == 0, err
    assert "error:" not in err and "Traceback" not in err
    assert path.read_text() == '{"format": 2, "entries": {'


def test_a_tuning_cache_that_cannot_be_written_is_a_clear_error(tmp_path, monkeypatch):
    from asmgemm.errors import AsmError
    from asmgemm.tuning import store
    (tmp_path / "file").write_text("a file where the cache folder would go\n")
    monkeypatch.setenv("ASMGEMM_TUNE_CACHE", str(tmp_path / "file" / "tune.json"))
    entry = store.make_entry("sgemm", "float32", None, {"BK": 8}, (64, 64, 64))
    with pytest.raises(AsmError, match="cannot create the tuning cache folder"):
        store.store_tuned(GPU, "nn", (64, 64, 64), entry)
