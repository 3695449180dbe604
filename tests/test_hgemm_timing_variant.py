"""tools/variants/hgemm_timing.sasm: hgemm.sasm's parts plus the timing-only switches.

With STORE_C, MMA_OFF and REDUCE_C at their defaults the variant must build hgemm.sasm's PTX byte
for byte (so that what it times is the shipped kernel); each switch must take out what it says.
"""
from pathlib import Path

import pytest

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, build_file

import hgemm_dispatch_configs as dispatch_configs
from sweeps import sample_every

VARIANT = Path(__file__).resolve().parents[1] / "tools" / "variants" / "hgemm_timing.sasm"
# one build of each of the source's kernels (kernels.toml's size rules pick them): the defaults,
# 64-row tiles in 2 x 2 clusters, the swapped decode launch with split-K in a cluster and a fused
# epilogue, split-K's partial pass, A_LDG with the staged store, the staged store with the
# activation warps, an fp32 C staged in 128 x 96 tiles
CONFIGS = [
    {},
    dict(CONSUMERS=1, BN=64, STAGES=8, CLUSTER_M=2, CLUSTER_N=2, MMA_IN_FLIGHT=1),
    dict(C_T=1, BN=16, TRANS_B=1, STAGES=10, CLUSTER_M=1, GROUP_M=4, CLUSTER_K=4, STREAM=1, BIAS=2, ACT=4),
    dict(SPLIT_K=1, TRANS_A=1, VEC_C=1),
    dict(A_LDG=1, WIDE_C=1, VEC_C=1, BN=128, CLUSTER_M=1, GROUP_M=4),
    dict(WIDE_C=1, VEC_C=1, BIAS=1, ACT=2, BF16=1),
    dict(C_F32=1, WIDE_C=1, VEC_C=1, BN=96, CLUSTER_M=2, STAGES=6, TRANS_A=1, TRANS_B=1),
]


def ptx(source, defines: dict) -> str:
    result = build_file(str(source), BuildOptions(defines={k: str(v) for k, v in defines.items()},
                                                  target=dispatch_configs.TARGET))
    return dispatch_configs.normalized(result.ptx, result.source.path)


@pytest.mark.parametrize("defines", sample_every(2, CONFIGS), ids=[dispatch_configs.config_id(d, {}) for d in CONFIGS])
def test_switches_off_build_the_shipped_kernel(defines):
    assert ptx(VARIANT, defines) == ptx("hgemm", defines)


def test_mma_off_issues_no_wgmma():
    assert "wgmma.mma_async" in ptx(VARIANT, {})
    assert "wgmma.mma_async" not in ptx(VARIANT, {"MMA_OFF": 1})


def test_store_c_off_stores_only_for_alpha_minus_zero():
    stored = ptx(VARIANT, {})
    skipped = ptx(VARIANT, {"STORE_C": 0})
    assert "0x80000000" not in stored and "0x80000000" in skipped


def test_reduce_c_off_sends_nothing_between_blocks():
    cluster_k = dict(BN=128, STAGES=6, CLUSTER_M=1, CLUSTER_K=4, STREAM=1)
    assert "st.async" in ptx(VARIANT, cluster_k)
    assert "st.async" not in ptx(VARIANT, {**cluster_k, "REDUCE_C": 0})


def test_store_c_off_with_activation_warps_is_refused():
    with pytest.raises(AsmError, match="ACT_WARPS_ASKED=0"):
        ptx(VARIANT, dict(STORE_C=0, WIDE_C=1, VEC_C=1, ACT=1))
    ptx(VARIANT, dict(STORE_C=0, WIDE_C=1, VEC_C=1, ACT=1, ACT_WARPS_ASKED=0))


def test_shipped_kernel_has_no_timing_switches():
    """The switches are the variant's: the shipped kernel refuses them as unknown -D parameters."""
    for switch in ("STORE_C", "MMA_OFF", "REDUCE_C"):
        with pytest.raises(AsmError):
            ptx("hgemm", {switch: 1})
