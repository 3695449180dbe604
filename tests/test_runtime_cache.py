"""The runtime's kernel cache without a GPU: keys change with everything that changes the binary,
entries are written whole (atomically) and found again, launch geometry comes from the kernel."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from asmgemm.runtime import build_cache
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.build_cache import cache_key, source_files
from asmgemm.toolchain import find_tool


@pytest.fixture
def kernel_dir(tmp_path):
    main = tmp_path / "k.sasm"
    inc = tmp_path / "part.inc"
    main.write_text('.include "part.inc"\n// main\n')
    inc.write_text("// include v1\n")
    return main, inc


def test_key_covers_source_includes_defines_target_and_ptxas(kernel_dir):
    main, inc = kernel_dir
    base = cache_key(main, {"BK": "8"}, "sm_90", "V13.0.88")
    assert base == cache_key(main, {"BK": "8"}, "sm_90", "V13.0.88")
    assert base != cache_key(main, {"BK": "16"}, "sm_90", "V13.0.88")
    assert base != cache_key(main, {"BK": "8", "RQ": "4"}, "sm_90", "V13.0.88")
    assert base != cache_key(main, {"BK": "8"}, "sm_90a", "V13.0.88")
    assert base != cache_key(main, {"BK": "8"}, "sm_90", "V13.1.0")
    inc.write_text("// include v2\n")
    assert base != cache_key(main, {"BK": "8"}, "sm_90", "V13.0.88"), "an include edit must change the key"


def test_a_source_with_ptxas_alternatives_is_keyed_by_the_code_that_chooses(kernel_dir, monkeypatch):
    """The run that ships depends on the SASS inspector and ptxas_choice (asmgemm.ptxas_choice):
    a change to that code changes the key of a source naming `.ptxas_alternative` (here in an
    include), and of no other source."""
    main, inc = kernel_dir
    plain = cache_key(main, {}, "sm_90", "v")
    inc.write_text('.ptxas_alternative "--register-usage-level=0"\n')
    chosen = cache_key(main, {}, "sm_90", "v")
    monkeypatch.setattr(build_cache, "_sass_code_digest", lambda: "another inspector")
    assert cache_key(main, {}, "sm_90", "v") != chosen
    inc.write_text("// include v1\n")
    assert cache_key(main, {}, "sm_90", "v") == plain


def test_define_order_does_not_matter(kernel_dir):
    main, _ = kernel_dir
    assert cache_key(main, {"A": "1", "B": "2"}, "sm_90", "v") == cache_key(main, {"B": "2", "A": "1"}, "sm_90", "v")


def test_source_files_follow_includes_and_survive_cycles(tmp_path):
    a, b = tmp_path / "a.sasm", tmp_path / "b.inc"
    a.write_text('.include "b.inc"\n')
    b.write_text('.include "a.sasm"\n.include "missing.inc"\n')
    names = [p.name for p, _ in source_files(a)]
    assert names == ["a.sasm", "b.inc", "missing.inc"]


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path))
    assert build_cache.cache_dir() == tmp_path / "kernels"
    monkeypatch.delenv("ASMGEMM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build_cache.cache_dir() == tmp_path / "xdg" / "asmgemm" / "kernels"


@pytest.mark.toolchain
@pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="ptxas not installed")
def test_build_once_then_memory_then_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path))
    build_cache.clear_memory_cache()
    defines = {"THREADS": 64, "BK": 8, "TRANS_A": 0, "TRANS_B": 0, "VEC_A": 0, "VEC_B": 1}
    built = build_cache.build_kernel(get_spec("sgemm"), defines, "sm_90")
    assert (built.threads, built.tile_m, built.tile_n) == (64, 64, 64)
    files = sorted(p.name for p in (tmp_path / "kernels").iterdir())
    assert files == sorted(f"{built.key}{ext}" for ext in (".cubin", ".json", ".ptx")), "temporary files left behind"
    assert Path(built.cubin_path).read_bytes()[:4] == b"\x7fELF"
    assert json.loads(Path(tmp_path / "kernels" / f"{built.key}.json").read_text())["smem_bytes"] == built.smem_bytes
    # memory hit: same object, no rebuild
    assert build_cache.build_kernel(get_spec("sgemm"), defines, "sm_90") is built

    # disk hit in a "new process": the pipeline must not run again
    build_cache.clear_memory_cache()
    import asmgemm.pipeline as pipeline

    def no_build(*a, **k):
        raise AssertionError("rebuilt although the disk cache had the kernel")
    monkeypatch.setattr(pipeline, "build_file", no_build)
    again = build_cache.build_kernel(get_spec("sgemm"), defines, "sm_90")
    assert again.key == built.key and again.cubin_path == built.cubin_path
    build_cache.clear_memory_cache()


@pytest.mark.toolchain
@pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                    reason="ptxas and nvdisasm not installed")
def test_the_kernel_cache_keeps_the_ptxas_run_that_shipped(monkeypatch, tmp_path):
    """sgemm's cluster-sum build ships ptxas's --register-usage-level=0 run (its `.ptxas_alternative`,
    asmgemm.ptxas_choice): the entry's metadata records the options and a disk hit reads them back,
    so last_launch() can name them; a build that keeps the defaults records none."""
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path))
    build_cache.clear_memory_cache()
    spec = get_spec("sgemm")
    cluster = {"THREADS": 256, "RQ": 2, "BK": 16, "TRANS_A": 0, "TRANS_B": 1, "VEC_A": 1, "VEC_B": 1, "CLUSTER_K": 2}
    built = build_cache.build_kernel(spec, cluster, "sm_90")
    assert built.ptxas_options == ("--register-usage-level=0",)
    meta = json.loads((tmp_path / "kernels" / f"{built.key}.json").read_text())
    assert meta["ptxas_options"] == ["--register-usage-level=0"]
    build_cache.clear_memory_cache()
    assert build_cache.build_kernel(spec, cluster, "sm_90").ptxas_options == built.ptxas_options
    staged = {"THREADS": 64, "BK": 16, "ASYNC": 1, "TRANS_A": 0, "TRANS_B": 0, "VEC_A": 1, "VEC_B": 1}
    assert build_cache.build_kernel(spec, staged, "sm_90").ptxas_options == ()
    build_cache.clear_memory_cache()


def test_the_patching_code_digest_covers_the_latency_table(monkeypatch):
    """_sass_code_digest reads the scheduler's latency table wherever asmgemm.scheduler lives (in
    the source tree it is scheduler/, not under asm/): an edited table changes the digest."""
    from importlib import resources
    table = sorted(Path(str(resources.files("asmgemm.scheduler"))).glob("latencies*.py"))
    assert table, "no latency table found beside asmgemm.scheduler"
    build_cache._sass_code_digest.cache_clear()
    before = build_cache._sass_code_digest()
    original = Path.read_bytes

    def edited(self):
        data = original(self)
        return data + b"\n# edited\n" if self == table[0] else data
    monkeypatch.setattr(Path, "read_bytes", edited)
    build_cache._sass_code_digest.cache_clear()
    try:
        assert build_cache._sass_code_digest() != before
    finally:
        monkeypatch.undo()
        build_cache._sass_code_digest.cache_clear()
