"""Split-K on the CPU (asm/runtime/split_k.py, [sgemm.split_k] in kernels.toml, sgemm.sasm's
SPLIT_K=1, kernels_ptx/splitk_reduce.sasm): the choice of S and k_chunk, the spec's checks, the
builds, and asmgemm.gemm driven to both launches through a stand-in CuPy whose kernels interpret
the packed arguments (fake_cupy.interpreting_kernel: the partial pass per split, then the reduce),
so a wrong pointer offset, stride, chunk or argument order gives a wrong C.

sgemm has no split rules since its catalog ([[sgemm.config]]) took over: which S an untuned call
runs is the cost model's choice (tests/test_dispatch.py); here the split is asked for, by a
catalog candidate's params or by params= directly, and the mechanism checked."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from asmgemm import kernel_spec
from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec, load_spec_file
from asmgemm.runtime import split_k
from asmgemm.runtime.plan import call_values_for, plan_launch
from asmgemm.toolchain import find_tool
from dispatch_helpers import dispatch_dir  # noqa: F401  (the fixture)
from fake_cupy import FakeArray, forget_loaded, interpreting_kernel, make_cupy, make_torch
from sweeps import sample_every

needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="ptxas not installed")
SGEMM = get_spec("sgemm")
KERNELS = Path(SGEMM.source).parent


def _plan(m, n, k, layout="nn", ptr=256):
    from types import SimpleNamespace
    ta, tb = layout[0] == "t", layout[1] == "t"

    def mat(r, c):
        return SimpleNamespace(shape=(r, c), ndim=2, strides=(c * 4, 4), dtype=SimpleNamespace(itemsize=4))
    a = mat(k, m) if ta else mat(m, k)
    b = mat(n, k) if tb else mat(k, n)
    return plan_launch(a, b, mat(m, n), trans_a=ta, trans_b=tb, ptr_of=lambda x: ptr)


# ---- choosing S and k_chunk ----------------------------------------------------------------------
def _cand(splits, reduce="kernel", config="t64x64_k16"):
    """sgemm's catalog entry `config` split S ways, as dispatch hands it to the build."""
    from asmgemm.runtime.catalog import Candidate
    e = next(e for e in SGEMM.configs if e.name == config)
    return Candidate("sgemm", e.name, e.kernel, e.set, e.tile, splits, reduce)


# (the splits the retired split rules gave these decode shapes, now asked by a candidate): k_chunk
# is ceil(K / S) rounded up to 16, S = ceil(K / k_chunk)
@pytest.mark.parametrize("m,n,k,asked,splits,chunk", [(1, 4096, 4096, 9, 9, 464), (16, 4096, 14336, 9, 9, 1600),
                                                      (128, 768, 3072, 24, 24, 128), (128, 4096, 4096, 8, 8, 512),
                                                      (1, 768, 768, 12, 12, 64), (17, 576, 2000, 24, 21, 96)])
def test_a_candidates_split_is_the_launchs(m, n, k, asked, splits, chunk):
    """The params of a split candidate (SPLIT_K = S, CLUSTER_K = 1) decide the split the way a
    tuning entry naming SPLIT_K does; the reduce kernel, not clusters, even on sm_90."""
    plan = _plan(m, n, k)
    cand = _cand(asked)
    split = split_k.choose_split(SGEMM, plan, None, cand.params(), 132)
    assert split == split_k.Split(splits, chunk)
    assert (split.splits - 1) * split.k_chunk < k <= split.splits * split.k_chunk
    assert split_k.cluster_splits(SGEMM, split, "sm_90", cand.params(), plan, 132) == 0
    assert split_k.switch_define(SGEMM, split, 0) == {"SPLIT_K": 1, "SPLIT_FIXUP": 0}


@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4096), (1100, 1100, 1100), (1024, 4096, 4096), (16, 4096, 256),
                                   (2048, 2048, 7), (1, 1, 1), (16, 4096, 14336)])
def test_no_split_unless_asked(m, n, k):
    """Without params= or a candidate's params, sgemm does not split (it has no split rules); a
    fused call never does."""
    assert split_k.choose_split(SGEMM, _plan(m, n, k), None, None, 132) is None
    assert split_k.untuned_split(SGEMM, m, n, k, 132) is None
    assert split_k.choose_split(SGEMM, _plan(m, n, k), None, _cand(8).params(), 132, plain=False) is None


@pytest.mark.parametrize("config", ["t128x128_k16", "t64x64_k16_cpasync"])
@pytest.mark.parametrize("s", [2, 4, 8])
def test_a_cluster_candidate_sums_its_split_in_one_launch_where_clusters_exist(config, s):
    """A cluster candidate (CLUSTER_K = S): its S blocks of a tile are one cluster on sm_90 (the
    switch off, the cluster switch at S), the reduce kernel where the target has no clusters."""
    plan = _plan(512, 768, 768)
    cand = _cand(s, "cluster", config)
    split = split_k.choose_split(SGEMM, plan, None, cand.params(), 132)
    assert split.splits == s
    assert split_k.cluster_splits(SGEMM, split, "sm_90", cand.params(), plan, 132) == s
    assert split_k.cluster_splits(SGEMM, split, "sm_80", cand.params(), plan, 132) == 0
    assert split_k.switch_define(SGEMM, split, s) == {"SPLIT_K": 0, "CLUSTER_K": s, "SPLIT_FIXUP": 0}


def test_params_split_in_clusters_unless_they_keep_the_reduce():
    """sgemm has no cluster_when: params= naming SPLIT_K = S <= 8 run in clusters of S on sm_90
    unless CLUSTER_K = 1 keeps the reduce kernel; past 8 blocks (the portable cluster size) the
    reduce kernel."""
    plan = _plan(512, 768, 768)
    for s, params, want in ((3, {"SPLIT_K": 3}, 3), (8, {"SPLIT_K": 8}, 8), (3, {"SPLIT_K": 3, "CLUSTER_K": 1}, 0),
                            (12, {"SPLIT_K": 12}, 0)):
        split = split_k.choose_split(SGEMM, plan, params, None, 132)
        assert split.splits == s
        assert split_k.cluster_splits(SGEMM, split, "sm_90", params, plan, 132) == want, params


def test_split_for_never_makes_an_empty_split():
    for k in list(range(1, 200)) + [255, 256, 257, 1000, 4095, 4096, 14336, 100003]:
        for requested in (1, 2, 3, 5, 8, 9, 16, 100, 256):
            s = split_k.split_for(k, requested)
            if s is None:
                continue
            assert 2 <= s.splits <= requested and s.k_chunk % 16 == 0
            assert (s.splits - 1) * s.k_chunk < k <= s.splits * s.k_chunk, (k, requested, s)
    assert split_k.split_for(16, 8) is None           # one chunk of 16 is all of K: no split
    assert split_k.split_for(40, 8) == split_k.Split(3, 16)      # fewer real splits than asked
    assert split_k.split_for(4096, 1) is None


def test_params_and_the_tuning_cache_decide_before_the_rule():
    p = _plan(16, 4096, 14336)
    assert split_k.choose_split(SGEMM, p, {"SPLIT_K": 4}, None, 132) == split_k.Split(4, 3584)
    assert split_k.choose_split(SGEMM, p, {"SPLIT_K": "3"}, None, 132).splits == 3     # bench -D passes strings
    assert split_k.choose_split(SGEMM, p, {"SPLIT_K": 1}, None, 132) is None
    assert split_k.choose_split(SGEMM, p, {"BK": 16}, None, 132) is None     # params without it: off
    # a tuned entry of tile parameters keeps the split rules' split (sgemm_skinny has them; sgemm has
    # none, so there it runs unsplit); one naming SPLIT_K decides it
    skinny = get_spec("sgemm_skinny")
    ruled = split_k.choose_split(skinny, p, None, None, 132)
    assert ruled is not None and split_k.choose_split(skinny, p, None, {"MR": 16}, 132) == ruled
    assert split_k.choose_split(SGEMM, p, None, {"BK": 16}, 132) is None
    assert split_k.choose_split(SGEMM, p, None, {"BK": 16, "SPLIT_K": 2}, 132).splits == 2
    assert split_k.choose_split(SGEMM, p, None, {"BK": 16, "SPLIT_K": 1}, 132) is None
    assert split_k.choose_split(SGEMM, p, None, None, 132, plain=False) is None
    # a large problem split on request (what bench -D SPLIT_K=... measures)
    assert split_k.choose_split(SGEMM, _plan(4096, 4096, 4096), {"SPLIT_K": 2}, None, 132).splits == 2


@pytest.mark.parametrize("value", [0, -1, 257, "x", 2.5, True, None])
def test_a_bad_split_count_is_a_clear_error(value):
    with pytest.raises(AsmError, match="number of K splits"):
        split_k.choose_split(SGEMM, _plan(16, 4096, 4096), {"SPLIT_K": value}, None, 132)


def test_split_k_refused_where_the_call_is_not_a_plain_gemm():
    with pytest.raises(AsmError, match="plain 2-D GEMM"):
        split_k.choose_split(SGEMM, _plan(16, 4096, 4096), {"SPLIT_K": 4}, None, 132, plain=False)


def test_the_kernel_switch_replaces_the_split_count():
    from asmgemm.runtime.launch import choose_params
    p = _plan(16, 4096, 14336)
    asked = {"THREADS": 64, "BK": 16, "SPLIT_K": 9}
    split = split_k.choose_split(SGEMM, p, asked, None, 132)
    chosen = choose_params(SGEMM, p, asked, None, 132, split_k.switch_define(SGEMM, split))
    assert chosen["SPLIT_K"] == 1 and chosen["THREADS"] == 64          # the switch, not S = 9
    chosen = choose_params(SGEMM, p, {"SPLIT_K": 5}, None, 132, split_k.switch_define(SGEMM, None))
    assert chosen["SPLIT_K"] == 0
    assert split_k.switch_define(get_spec("hgemm"), None) == {"SPLIT_K": 0}     # the HGEMM's switch too


def test_asmgemm_run_shape_uses_the_split_asked():
    """`asmgemm run sgemm --m 16 --n 4096 --k 14336 -D SPLIT_K=9`: the call values of fresh arrays,
    S = 9 of 1600 (the -D values arrive as strings)."""
    values = call_values_for(16, 4096, 14336, "nn", 4)
    assert values["vec_a"] == values["vec_b"] == 1
    split = split_k.choose_split(SGEMM, _plan(16, 4096, 14336), {"SPLIT_K": "9"}, None, 132)
    assert (split.splits, split.k_chunk) == (9, 1600)
    assert split.workspace_elems(16, 4096) == 9 * 16 * 4096


# ---- the spec's checks ---------------------------------------------------------------------------
BASE = f"""
[k]
source = "{SGEMM.source}"
dtypes = {{ a = "float32", b = "float32", acc = "float32", c = "float32" }}
targets = ["sm_90"]
abi = ["A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "alpha", "beta", "k_chunk", "split_stride"]
rel_err_limit = 1e-4
launch = {{ threads = "THREADS", tile_m = "TM", tile_n = "TN", smem_bytes = "SMEM_BYTES" }}
"""
REDUCE = KERNELS / "splitk_reduce.sasm"


def _load(tmp_path, extra, base=BASE):
    p = tmp_path / "specs.toml"
    p.write_text(textwrap.dedent(base) + textwrap.dedent(extra))
    return load_spec_file(p)


def _with_split_table(tmp_path, rest: str):
    """The base spec with a [k.split_k] table: switch SPLIT_K, the shipped reduce, then `rest`."""
    return _load(tmp_path, f'[k.split_k]\nswitch = "SPLIT_K"\nreduce = "{REDUCE}"\n' + textwrap.dedent(rest))


def test_a_split_k_table_loads(tmp_path):
    spec, = _with_split_table(tmp_path, """
        [[k.split_k.rule]]
        when = "M <= 16"
        splits = "K // 512"
        """)
    assert spec.split_k.switch == "SPLIT_K" and spec.split_k.reduce == REDUCE
    assert spec.split_k.splits(16, 64, 4096, 132) == 8 and spec.split_k.splits(17, 64, 4096, 132) == 1
    assert spec.to_json()["split_k"]["rules"] == [{"when": "M <= 16", "splits": "K // 512"}]


def test_cluster_when_limits_the_cluster_splits(tmp_path):
    spec, = _load(tmp_path, f"""
        [k.split_k]
        switch = "SPLIT_K"
        cluster_switch = "CLUSTER_K"
        cluster_when = "N * S <= 1000"
        reduce = "{REDUCE}"
        """)
    sk = spec.split_k
    assert sk.in_clusters(1, 100, 64, 132, 8) and not sk.in_clusters(1, 200, 64, 132, 8)
    shown = spec.to_json()["split_k"]
    assert (shown["cluster_switch"], shown["cluster_when"], shown["k_multiple"]) == ("CLUSTER_K", "N * S <= 1000", 16)
    assert split_k.cluster_splits(spec, split_k.Split(8, 64), "sm_90", None, _plan(1, 100, 512), 132) == 8
    assert split_k.cluster_splits(spec, split_k.Split(8, 64), "sm_90", None, _plan(1, 200, 512), 132) == 0
    assert split_k.cluster_splits(spec, split_k.Split(8, 64), "sm_80", None, _plan(1, 100, 512), 132) == 0
    assert split_k.cluster_splits(spec, split_k.Split(9, 64), "sm_90", None, _plan(1, 10, 576), 132) == 0
    assert split_k.cluster_splits(spec, split_k.Split(8, 64), "sm_90", {"CLUSTER_K": 1}, _plan(1, 100, 512), 132) == 0
    # params naming the switch above 1 ask for clusters where cluster_when says no (an A/B), not
    # past 8 blocks nor on a target without clusters
    assert split_k.cluster_splits(spec, split_k.Split(8, 64), "sm_90", {"CLUSTER_K": 8}, _plan(1, 200, 512), 132) == 8
    assert split_k.cluster_splits(spec, split_k.Split(9, 64), "sm_90", {"CLUSTER_K": 9}, _plan(1, 10, 576), 132) == 0
    assert split_k.cluster_splits(spec, split_k.Split(8, 64), "sm_80", {"CLUSTER_K": 8}, _plan(1, 100, 512), 132) == 0
    for bad, message in (('cluster_when = "Q > 1"', "undefined name 'Q'"),
                         ('cluster_when = 3', "cluster_when"),):
        with pytest.raises(AsmError, match=message):
            _load(tmp_path, f'[k.split_k]\nswitch = "SPLIT_K"\ncluster_switch = "CLUSTER_K"\n{bad}\nreduce = "{REDUCE}"\n')
    with pytest.raises(AsmError, match="cluster_when needs cluster_switch"):
        _load(tmp_path, f'[k.split_k]\nswitch = "SPLIT_K"\ncluster_when = "S < 4"\nreduce = "{REDUCE}"\n')
    with pytest.raises(AsmError, match="cluster_switch: 'SPLIT_K' is not a parameter name other than the switch"):
        _load(tmp_path, f'[k.split_k]\nswitch = "SPLIT_K"\ncluster_switch = "SPLIT_K"\nreduce = "{REDUCE}"\n')


def test_a_cost_rule_takes_the_cheapest_candidate_and_the_first_tie(tmp_path):
    spec, = _with_split_table(tmp_path, """
        [[k.split_k.rule]]
        when = "M <= 16"
        splits = [1, 2, 4, 8]
        cost = "ceil_div(32, S * M) + S"
        """)
    rule, = spec.split_k.rules
    # M = 1: 33, 18, 12, 12 -> 4 (the first of the tie); M = 8: 5, 4, 5, 9 -> 2; M = 16: 3, 3, ... -> 1
    assert [spec.split_k.splits(m, 64, 4096, 132) for m in (1, 8, 16, 17)] == [4, 2, 1, 1]
    assert rule.cost_of(1, 64, 4096, 132, 8) == 12
    assert spec.to_json()["split_k"]["rules"] == [{"when": "M <= 16", "splits": [1, 2, 4, 8],
                                                   "cost": "ceil_div(32, S * M) + S"}]


@pytest.mark.parametrize("table,message", [
    ('switch = "SPLIT_K"\nreduce = "{r}"\nreduc = 1', "unknown key 'reduc'"),
    ('reduce = "{r}"', "needs 'switch'"),
    ('switch = "SPLIT_K"', "needs 'reduce'"),
    ('switch = "SPLIT_K"\nreduce = "nowhere.sasm"', "no such file"),
    ('switch = "TRANS_A"\nreduce = "{r}"', "also a call parameter"),
    ('switch = "2x"\nreduce = "{r}"', "not a parameter name"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\nrule = 3', "an array of tables"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\n[[k.split_k.rule]]\nwhen = "M < 2"', "'when' and 'splits'"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\n[[k.split_k.rule]]\nwhen = "M < 2"\nsplits = [2, 0]\ncost = "S"',
     "candidate split counts"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\n[[k.split_k.rule]]\nwhen = "M < 2"\nsplits = "2"\ncost = "S"',
     "candidate split counts"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\n[[k.split_k.rule]]\nwhen = "M < 2"\nsplits = [2, 3, 2]\ncost = "S"',
     "candidate 2 is listed twice"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\n[[k.split_k.rule]]\nwhen = "M < 2"\nsplits = [2, 3]\ncost = "S * Q"',
     "undefined name 'Q' in a split rule's cost"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\n[[k.split_k.rule]]\nwhen = "M < 2"\nsplits = [2, 3]\ncost = "ceil_div(S, M - 1)"',
     "division by zero in ceil_div"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\n[[k.split_k.rule]]\nwhen = "M < 2"\nsplits = "2"\ncosts = "S"',
     "'when' and 'splits'"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\n[[k.split_k.rule]]\nwhen = "Q < 2"\nsplits = "2"', "undefined name 'Q'"),
    ('switch = "SPLIT_K"\nreduce = "{r}"\n[[k.split_k.rule]]\nwhen = "M < 2"\nsplits = "K / 3"', "not an integer"),
])
def test_split_k_table_errors(tmp_path, table, message):
    base = BASE.replace('abi = ["A"', 'call_params = { TRANS_A = "trans_a" }\nabi = ["A"')
    with pytest.raises(AsmError, match=message):
        _load(tmp_path, "[k.split_k]\n" + table.format(r=REDUCE) + "\n", base)


def test_split_k_needs_its_abi_arguments_and_takes_both_grids(tmp_path):
    no_abi = BASE.replace(', "k_chunk", "split_stride"', "")
    with pytest.raises(AsmError, match="missing 'k_chunk'"):
        _load(tmp_path, f'[k.split_k]\nswitch = "SPLIT_K"\nreduce = "{REDUCE}"\n', no_abi)
    # a persistent kernel walks S copies of its units (hgemm); k_multiple defaults to 16
    persistent = BASE.replace('smem_bytes = "SMEM_BYTES" }', 'smem_bytes = "SMEM_BYTES", grid = "persistent" }')
    spec, = _load(tmp_path, f'[k.split_k]\nswitch = "SPLIT_K"\nreduce = "{REDUCE}"\nk_multiple = 64\n', persistent)
    assert spec.launch.grid == "persistent" and spec.split_k.k_multiple == 64
    with pytest.raises(AsmError, match="k_multiple: 48 is not a power of two"):
        _load(tmp_path, f'[k.split_k]\nswitch = "SPLIT_K"\nreduce = "{REDUCE}"\nk_multiple = 48\n', persistent)


def test_hgemm_splits_k_in_whole_k_tiles_on_a_persistent_grid():
    from asmgemm.runtime.launch import grid
    from types import SimpleNamespace
    hg = get_spec("hgemm")
    p = _plan(16, 4096, 4096)
    # (untuned, this shape splits K inside clusters instead: CLUSTER_K, tests/test_cluster_k.py)
    assert split_k.choose_split(hg, p, None, None, 132) is None
    split = split_k.choose_split(hg, p, {"SPLIT_K": 4}, None, 132)
    assert split is not None and split.k_chunk % 64 == 0 and split.splits == -(-4096 // split.k_chunk) == 4
    built = SimpleNamespace(tile_n=128, tile_m=128, cluster=1, cluster_rows=1, cluster_cols=1)
    one = grid(hg, built, p, 132)
    assert one == (32, 1, 1)
    assert grid(hg, built, p, 132, split.splits) == (32 * split.splits, 1, 1)
    assert grid(SGEMM, SimpleNamespace(tile_n=64, tile_m=64, cluster=1, cluster_rows=1, cluster_cols=1), p, 132, 3) == (64, 1, 3)   # tiles: z
    assert split_k.split_for(4096, 5, 64) == split_k.Split(5, 832)


# ---- builds ---------------------------------------------------------------------------------------


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("layout", sample_every(4, ["nn", "nt", "tn", "tt"]))
@pytest.mark.parametrize("variant", sample_every(5, [{"THREADS": 64, "BK": 16, "ASYNC": 1}, {"THREADS": 64, "BK": 16}, {},
                                                  {"RQ": 4, "BK": 16, "LOAD_AHEAD": 1, "LDG_NC": 0},
                                                  {"RQ": 4, "BK": 8, "LOAD_AHEAD": 1, "LDG_NC": 0}]),
                         ids=["t64-async", "t64", "default", "rq4-bk16-la", "rq4-bk8-la"])     # every size rule's kernel
def test_split_k_builds_have_no_spills(variant, layout):
    from asmgemm.pipeline import BuildOptions, assemble, build_file
    defines = {**variant, "SPLIT_K": 1, "TRANS_A": int(layout[0] == "t"), "TRANS_B": int(layout[1] == "t")}
    result = build_file(SGEMM.source, BuildOptions(defines={k: str(v) for k, v in defines.items()}, target="sm_90"))
    stats, = assemble(result).kernels
    assert not stats.spills, stats
    assert "%ctaid.z" in result.ptx and "param_k_chunk" in result.ptx


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("layout", sample_every(2, ["nn", "tt"]))
@pytest.mark.parametrize("variant,smem", sample_every(3, [({"THREADS": 64, "BK": 16, "ASYNC": 1}, 17408), ({"BK": 16}, 67584),
                                                          ({"RQ": 4, "BK": 16, "LOAD_AHEAD": 1, "LDG_NC": 0}, 135168)],
                                                      unpack=True),
                         ids=["t64-async", "t128-bk16", "rq4-bk16-la"])
def test_cluster_sum_builds(variant, smem, layout):
    """CLUSTER_K = 8: no spills (the loads of the 8 ranks' sums reuse the accumulators), a cluster
    of 8 along z, the split's k range from k_chunk, 8 reads across the cluster and 2 cluster
    barriers (before the reads, and before a block may leave), the tile's sums in shared memory."""
    from asmgemm.pipeline import BuildOptions, assemble, build_file
    defines = {**variant, "CLUSTER_K": 8, "TRANS_A": int(layout[0] == "t"), "TRANS_B": int(layout[1] == "t")}
    result = build_file(SGEMM.source, BuildOptions(defines={k: str(v) for k, v in defines.items()}, target="sm_90"))
    stats, = assemble(result).kernels
    assert not stats.spills, stats
    ptx = result.ptx
    assert ".reqnctapercluster 1, 1, 8" in ptx and "ld.param.u32" in ptx and "[param_k_chunk]" in ptx
    assert ptx.count("ld.shared::cluster") == 8 and ptx.count("mapa.shared::cluster") == 8
    assert ptx.count("barrier.cluster.arrive.release") == 2 == ptx.count("barrier.cluster.wait.acquire")
    assert "[param_split_stride]" not in ptx and f"sgemm_meta_smem_{smem};" in ptx


@pytest.mark.parametrize("defines,message", [({"CLUSTER_K": "9"}, "portable cluster size"),
                                             ({"CLUSTER_K": "2", "SPLIT_K": "1"}, "not with SPLIT_K"),
                                             ({"CLUSTER_K": "2", "BIAS": "1"}, "fused epilogue"),
                                             ({"CLUSTER_K": "2", "BATCHED": "1"}, "BATCHED")])
def test_cluster_sum_switch_is_checked(defines, message):
    from asmgemm.pipeline import BuildOptions, build_file
    with pytest.raises(AsmError, match=message):
        build_file(SGEMM.source, BuildOptions(defines=defines, target="sm_90"))


def test_split_k_switch_is_checked():
    from asmgemm.pipeline import BuildOptions, build_file
    with pytest.raises(AsmError, match="SPLIT_K is 0 or 1"):
        build_file(SGEMM.source, BuildOptions(defines={"SPLIT_K": "2"}, target="sm_90"))


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("c_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("vec", [0, 1])
def test_the_reduce_builds_for_each_c_type(private_cache, c_dtype, vec):
    from asmgemm.runtime.build_cache import build_kernel
    from dataclasses import replace
    spec = replace(SGEMM, dtypes=replace(SGEMM.dtypes, c=c_dtype))
    built = build_kernel(split_k.reduce_spec(spec), {"C_TYPE": split_k.C_TYPES[c_dtype], "VEC": vec}, "sm_90")
    assert [n for n, _ in built.params] == list(split_k.REDUCE_ABI)
    assert (built.threads, built.tile_m, built.tile_n, built.smem_bytes) == (256, 1, 256 * (4 if vec else 1), 0)


def test_reduce_vectors_only_where_aligned():
    p = _plan(16, 4096, 4096)
    assert split_k.reduce_defines(SGEMM, p) == {"C_TYPE": 0, "VEC": 1}
    assert split_k.reduce_defines(SGEMM, _plan(16, 4094, 4096))["VEC"] == 0
    assert split_k.reduce_defines(SGEMM, _plan(16, 4096, 4096, ptr=260))["VEC"] == 0


# ---- asmgemm.gemm through a stand-in CuPy -------------------------------------------------------


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32).view(FakeArray)


def _ref(a, b, c0, alpha, beta, ta, tb):
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    out = alpha * ((a64.T if ta else a64) @ (b64.T if tb else b64))
    return out + beta * np.asarray(c0, np.float64) if beta != 0 else out


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("layout", sample_every(4, ["nn", "nt", "tn", "tt"]))
def test_gemm_splits_as_asked_and_reduces(fake_fp32_gemm, layout):
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    _, launches = fake_fp32_gemm
    ta, tb = layout[0] == "t", layout[1] == "t"
    m, n, k = 17, 576, 2000                   # 9 tiles of 64x64, 25 splits asked: chunks of 80, 25 splits
    a = _rand(*((k, m) if ta else (m, k)))
    b = _rand(*((n, k) if tb else (k, n)), seed=1)
    c = np.full((m, n), np.nan, np.float32).view(FakeArray)        # beta = 0: never read
    asmgemm.gemm(a, b, c, trans_a=ta, trans_b=tb, params={"THREADS": 64, "BK": 16, "SPLIT_K": 25})
    assert (last_launch()["splits"], last_launch()["reduce"], last_launch()["chosen_by"]) == (25, "kernel", "params")
    np.testing.assert_allclose(np.asarray(c), _ref(a, b, None, 1.0, 0.0, ta, tb), rtol=1e-4, atol=1e-3)
    (g1, b1, args1, _, _), (g2, b2, args2, _, _) = launches
    assert g1 == (9, 1, 25) and b1 == (64, 1, 1)                      # 9 tile columns, 1 tile row, 25 splits
    v = dict(zip(get_spec("sgemm").abi, args1))            # the partial pass's arguments by name
    assert (float(v["alpha"]), float(v["beta"]), int(v["k_chunk"]), int(v["split_stride"])) == (1.0, 0.0, 80, m * n)
    assert int(args1[2]) != c.ctypes.data and int(args1[8]) == n           # C of the partial: the workspace, ld N
    w, c_ptr, mm, nn, ldc, splits, stride2, alpha2, beta2 = args2
    assert int(w) == int(args1[2]) and int(c_ptr) == c.ctypes.data
    assert (int(mm), int(nn), int(ldc), int(splits), int(stride2)) == (m, n, n, 25, m * n)
    assert g2 == (1, m, 1) and b2 == (256, 1, 1)                            # VEC=1: 1024 columns per block


@pytest.mark.toolchain
@needs_ptxas
def test_gemm_sums_eight_splits_in_clusters_in_one_launch(fake_fp32_gemm, dispatch_dir):
    """512x768x768 on sm_90, the database's pick t128x128_k16/s8c: 8 splits in clusters of 8, one
    launch on a grid of (6, 4, 8), no workspace, C the caller's, k_chunk the partial pass's (96);
    CLUSTER_K=1 in params= sends the same split through the workspace and the reduce."""
    import asmgemm
    from asmgemm.runtime import gemm as gemm_module
    _, launches = fake_fp32_gemm                 # the stand-in GPU: sm_90, 132 SMs
    dispatch_dir("Fake GPU", best={"sgemm|nn|512x768x768|plain": "t128x128_k16/s8c"})
    m, n, k = 512, 768, 768
    a, b = _rand(m, k), _rand(k, n, seed=5)
    c0 = _rand(m, n, seed=6)
    c = c0.copy().view(FakeArray)
    asmgemm.gemm(a, b, c, alpha=2.0, beta=0.5)
    assert gemm_module.last_launch()["config"] == "t128x128_k16/s8c"
    np.testing.assert_allclose(np.asarray(c), _ref(a, b, c0, 2.0, 0.5, False, False), rtol=1e-4, atol=1e-3)
    launch = gemm_module.last_launch()
    (grid_, block, args, _, _), = launches
    assert grid_ == (6, 4, 8) and block == (256, 1, 1) and (launch["splits"], launch["reduce"]) == (8, "cluster")
    v = dict(zip(SGEMM.abi, args))
    assert int(v["C"]) == c.ctypes.data and (int(v["k_chunk"]), int(v["ldc"])) == (96, n)
    assert (float(v["alpha"]), float(v["beta"])) == (2.0, 0.5)
    c2 = c0.copy().view(FakeArray)
    asmgemm.gemm(a, b, c2, alpha=2.0, beta=0.5, params={"THREADS": 256, "RQ": 2, "BK": 16, "SPLIT_K": 8,
                                                          "CLUSTER_K": 1})
    assert len(launches) == 3 and launches[1][0] == (6, 4, 8) and gemm_module.last_launch()["reduce"] == "kernel"
    np.testing.assert_allclose(np.asarray(c2), _ref(a, b, c0, 2.0, 0.5, False, False), rtol=1e-4, atol=1e-3)
    c3 = c0.copy().view(FakeArray)                 # params= naming S alone: clusters (no cluster_when)
    asmgemm.gemm(a, b, c3, alpha=2.0, beta=0.5, params={"THREADS": 256, "RQ": 2, "BK": 16, "SPLIT_K": 8})
    assert len(launches) == 4 and launches[3][0] == (6, 4, 8) and gemm_module.last_launch()["reduce"] == "cluster"


@pytest.mark.toolchain
@needs_ptxas
def test_alpha_beta_column_major_c_and_a_kept_plan(fake_fp32_gemm):
    import asmgemm
    _, launches = fake_fp32_gemm
    m, n, k = 40, 24, 1500                   # column-major C: the kernel's M x N is 24 x 40
    a, b = _rand(m, k), _rand(k, n, seed=2)
    c0 = _rand(m, n, seed=3)
    c = np.asfortranarray(c0).view(FakeArray)
    asked = {"THREADS": 64, "BK": 16, "SPLIT_K": 23}
    asmgemm.gemm(a, b, c, alpha=0.5, beta=-2.0, params=asked)
    np.testing.assert_allclose(np.asarray(c), _ref(a, b, c0, 0.5, -2.0, False, False), rtol=1e-4, atol=1e-3)
    assert len(launches) == 2 and launches[0][0][2] == 19                   # 23 asked: chunks of 80, 19 splits
    assert [int(x) for x in launches[1][2][2:5]] == [24, 40, m]            # the reduce sees the kernel's C
    c2 = np.asfortranarray(c0).view(FakeArray)
    asmgemm.gemm(a, b, c2, alpha=0.5, beta=-2.0, params=asked)              # the kept plan: both launches again
    assert len(launches) == 4 and np.array_equal(np.asarray(c2), np.asarray(c))


@pytest.mark.toolchain
@needs_ptxas
def test_params_set_or_turn_off_the_split(fake_fp32_gemm):
    import asmgemm
    _, launches = fake_fp32_gemm
    a, b = _rand(16, 2000), _rand(2000, 256, seed=4)
    asmgemm.gemm(a, b, params={"SPLIT_K": 1})
    assert len(launches) == 1 and launches[0][0][2] == 1
    c = asmgemm.gemm(a, b, params={"SPLIT_K": 3, "CLUSTER_K": 1, "THREADS": 64, "BK": 16})
    assert len(launches) == 3 and launches[1][0][2] == 3 and int(launches[1][2][-4]) == 672
    np.testing.assert_allclose(np.asarray(c), _ref(a, b, None, 1.0, 0.0, False, False), rtol=1e-4, atol=1e-3)
    # without CLUSTER_K = 1, S <= 8 on sm_90 (the stand-in's) sums in clusters of S: one launch
    c = asmgemm.gemm(a, b, params={"SPLIT_K": 3, "THREADS": 64, "BK": 16})
    assert len(launches) == 4 and launches[3][0][2] == 3
    np.testing.assert_allclose(np.asarray(c), _ref(a, b, None, 1.0, 0.0, False, False), rtol=1e-4, atol=1e-3)
    with pytest.raises(AsmError, match="number of K splits"):
        asmgemm.gemm(a, b, params={"SPLIT_K": 0})


@pytest.mark.toolchain
@needs_ptxas
def test_torch_tensors_get_a_torch_workspace(fake_fp32_gemm, monkeypatch):
    import asmgemm
    from asmgemm.runtime import split_scratch
    _, launches = fake_fp32_gemm
    monkeypatch.setattr(split_scratch, "SCRATCH", split_scratch.SplitScratch())    # nothing kept yet
    torch = make_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    made = []
    empty = torch.empty

    def tracked(shape, dtype=None, device=None):
        made.append((tuple(shape), dtype))
        return empty(shape, dtype=dtype, device=device)
    torch.empty = tracked
    # split 16 ways (past the 8 blocks a cluster may have: the workspace and the reduce)
    a, b = _rand(17, 1024), _rand(1024, 128, seed=5)
    out = asmgemm.gemm(torch.from_numpy(np.asarray(a)), torch.from_numpy(np.asarray(b)),
                       params={"THREADS": 64, "BK": 16, "SPLIT_K": 16})
    np.testing.assert_allclose(out.numpy(), _ref(a, b, None, 1.0, 0.0, False, False), rtol=1e-4, atol=1e-3)
    # S x M x N fp32 from torch, kept for the stream (a flat array: split_scratch.py)
    assert [shape for shape, dtype in made if dtype == torch.float32 and shape != (17, 128)] == [(16 * 17 * 128,)]


# ---- asmgemm bench names the untuned split --------------------------------------------------------
from test_bench_fakegpu import fake_gpu  # noqa: E402,F401  (the fixture: NumPy as CuPy, a Python kernel)


def test_bench_shows_the_split_the_rule_chose(fake_gpu, run_cli, tmp_path):
    """A kernel with split rules (sgemm_skinny, named): 16 rows, 5 column blocks of 128, min(2000 //
    256, ceil(264 / 5)) = 7 asked, chunks of 512 (whole 256-k rounds): 4 splits."""
    import json
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli("bench", "sgemm_skinny", "--shapes", "16x576x2000,16x128x128", "--reps", "2",
                                "--defaults", "--json", str(out))
    assert code == 0, err
    rows = {r["k"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows[2000]["params_source"] == "defaults" and rows[2000]["params"] == {"SPLIT_K": 4}
    assert rows[128]["params"] is None                          # K = 128: no split
    assert "defaults: SPLIT_K=4" in stdout


def test_bench_shows_a_tuned_entry_with_the_split_it_keeps(fake_gpu, monkeypatch):
    from asmgemm.bench import runner
    from asmgemm.bench.shapes import Shape
    from asmgemm.runtime import tune_cache
    skinny = get_spec("sgemm_skinny")
    monkeypatch.setattr(tune_cache, "lookup_tuned", lambda *a: {"MR": 16})
    assert runner.resolve_params(skinny, "Fake GPU 80GB", "nn", Shape(16, 576, 2000), {}, False) == \
        (None, "tuned", {"MR": 16, "SPLIT_K": 4})
    monkeypatch.setattr(tune_cache, "lookup_tuned", lambda *a: {"MR": 16, "SPLIT_K": 1})
    assert runner.resolve_params(skinny, "Fake GPU 80GB", "nn", Shape(16, 576, 2000), {}, False)[2] == \
        {"MR": 16, "SPLIT_K": 1}
    # sgemm has no split rules: a tuned entry of tile parameters runs unsplit, and shows so
    monkeypatch.setattr(tune_cache, "lookup_tuned", lambda *a: {"THREADS": 64, "BK": 16})
    assert runner.resolve_params(SGEMM, "Fake GPU 80GB", "nn", Shape(16, 576, 2000), {}, False) == \
        (None, "tuned", {"THREADS": 64, "BK": 16})


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.slow
def test_tune_times_its_candidates_with_the_split_asked(fake_gpu, run_cli):
    """`asmgemm tune -D SPLIT_K=4`: candidates built with the switch on, trials run with S = 4,
    and the stored entry names the split (so gemm() runs it)."""
    import json
    from test_bench_fakegpu import gemm_cost
    seen = []

    def kernel(a, b, c, ta, tb, params):
        seen.append(params)
        gemm_cost(a, b, c, ta, tb, 1.0 if params and params.get("BK") == 16 else 3.0)
    fake_gpu(kernel)
    code, out, err = run_cli("tune", "sgemm", "--shape", "16,256,2000", "--reps", "2", "-j", "2", "--json",
                             "-D", "SPLIT_K=4", "-D", "THREADS=64", "-D", "RQ=2", "-D", "PREFETCH=0",
                             "-D", "LOAD_AHEAD=0")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["build_defines"]["SPLIT_K"] == "1" and rep["survivors"] == 4
    assert all(p["SPLIT_K"] == "4" for p in seen if p is not None)
    from asmgemm.runtime.tune_cache import lookup_tuned
    assert lookup_tuned("Fake GPU 80GB", "sgemm", "nn", 16, 256, 2000)["SPLIT_K"] == "4"
    code, _, err = run_cli("tune", "sgemm", "--shape", "16,256,2000", "--dry-run", "-D", "SPLIT_K=0")
    assert code == 1 and "number of K splits" in err and "Traceback" not in err
