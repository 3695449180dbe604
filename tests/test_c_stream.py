"""C_STREAM: the runtime asks hgemm to store C evict-first in L2 exactly where the launch's C (every
matrix of a batch) is larger than the GPU's L2 (launch_config.c_stream_defines), never with params=
or an unknown L2, and the kernel puts the policy on the staged C's TMA stores only (C_STREAM_ON):
elsewhere the switch changes no instruction. CPU: configure() with the builds recorded, and ptxas."""
from __future__ import annotations

import dataclasses

import pytest

from asmgemm.pipeline import BuildOptions, build_file
from asmgemm.runtime import launch_config
from asmgemm.runtime.arrays import Dtype, Matrix
from asmgemm.runtime.gpu import DeviceFacts
from asmgemm.runtime.launch_config import Problem, configure, pick_spec
from asmgemm.toolchain import find_tool

H100 = DeviceFacts(0, "NVIDIA H100 80GB HBM3", "sm_90", 132, 1.98e9, 3.35e12, 50 * 1024 * 1024)
F16 = Dtype("float16", 2)


def batch(b, rows, cols, ptr=1 << 20):
    return Matrix((b, rows, cols), (rows * cols * 2, cols * 2, 2), F16, ptr, 0)


def matrix(rows, cols, ptr=1 << 22):
    return Matrix((rows, cols), (cols * 2, 2), F16, ptr, 0)


@pytest.fixture
def builds(recorded_builds):
    return recorded_builds


def _defines(builds, a, b, c, facts=H100, **kw):
    configure(pick_spec(None, "float16", None, facts), Problem(a, b, c, **kw), facts)
    kernel, defines = builds[-1]
    assert kernel == "hgemm"
    return defines


def test_a_c_larger_than_l2_is_stored_evict_first(builds):
    # attention's Q.K^T: 32 x (2048 x 2048) halves = 256 MB of C
    q, k = batch(32, 2048, 128), batch(32, 2048, 128, ptr=1 << 34)
    assert _defines(builds, q, k, batch(32, 2048, 2048, ptr=1 << 36), trans_b=True)["C_STREAM"] == 1
    # a 2-D C of 8192 x 8192 halves (128 MB)
    assert _defines(builds, matrix(8192, 1024), matrix(1024, 8192), matrix(8192, 8192))["C_STREAM"] == 1


def test_a_c_that_fits_l2_is_not(builds):
    # 4096 x 4096 halves: 32 MB, under the 50 MB of L2
    assert _defines(builds, matrix(4096, 1024), matrix(1024, 4096), matrix(4096, 4096)).get("C_STREAM", 0) == 0
    # a batch counts whole: 2 x 4096 x 4096 halves is 64 MB
    q, k = batch(2, 4096, 128), batch(2, 4096, 128, ptr=1 << 34)
    assert _defines(builds, q, k, batch(2, 4096, 4096, ptr=1 << 36), trans_b=True)["C_STREAM"] == 1


def test_params_or_an_unknown_l2_ask_nothing(builds):
    big = (matrix(8192, 1024), matrix(1024, 8192), matrix(8192, 8192))
    assert "C_STREAM" not in _defines(builds, *big, facts=dataclasses.replace(H100, l2_bytes=0))
    assert _defines(builds, *big, params={"BN": 256}).get("C_STREAM", 0) == 0


@pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")
@pytest.mark.parametrize("wide_c,hinted", [(1, 4), (0, 0)])
def test_the_policy_goes_on_the_staged_c_stores_only(wide_c, hinted):
    """WIDE_C = 1 at BN = 256: C leaves by four TMA stores a tile, each with the evict-first policy;
    WIDE_C = 0 stores C by pairs, and C_STREAM = 1 changes nothing there."""
    def ptx(c_stream):
        defines = {"C_STREAM": str(c_stream), "WIDE_C": str(wide_c), "VEC_C": "1"}
        return build_file("hgemm", BuildOptions(defines=defines, target="sm_90a")).ptx
    on, off = ptx(1), ptx(0)
    assert on.count(".L2::cache_hint") - off.count(".L2::cache_hint") == hinted
    assert ("createpolicy.fractional.L2::evict_first" in on) == bool(hinted)
    if not hinted:
        assert on == off


@pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")
def test_a_batch_whose_c_streams_keeps_its_operands_evict_last():
    """KEEP_AB (on by default): in a batch whose C streams (C_STREAM_ON), every TMA load of A and B
    carries the evict-last policy; not where an operand streams (STREAM: P.V, measured slower), not
    in a 2-D launch, not with C_STREAM off, and KEEP_AB = 0 turns it off; where it is off it changes
    no instruction."""
    def ptx(**defines):
        defines = {"WIDE_C": "1", "VEC_C": "1", "CLUSTER_M": "1", **{k: str(v) for k, v in defines.items()}}
        return build_file("hgemm", BuildOptions(defines=defines, target="sm_90a")).ptx
    kept = ptx(BATCHED=1, C_STREAM=1)
    policies = [line.split()[1].rstrip(",") for line in kept.splitlines()
                if "createpolicy.fractional.L2::evict_last" in line]
    assert len(policies) == 1
    loads = [line.strip() for line in kept.splitlines()
             if "cp.async.bulk.tensor" in line and ".shared::cluster.global" in line]
    assert loads and all(".L2::cache_hint" in line and line.endswith(f", {policies[0]};") for line in loads)
    assert kept != ptx(BATCHED=1, C_STREAM=1, KEEP_AB=0)
    for off in ({"BATCHED": 1, "C_STREAM": 1, "STREAM": 1}, {"BATCHED": 1}, {"C_STREAM": 1}):
        text = ptx(**off)
        assert "L2::evict_last" not in text, off
        assert text == ptx(**off, KEEP_AB=0), off
