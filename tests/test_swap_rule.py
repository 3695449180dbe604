"""Small M through the operand swap: a row-major C computed as C^T = op(B)^T op(A)^T by a kernel
that stores its result transposed (call value c_trans, hgemm's C_T), so that the user's few rows
are the wgmma's N (BN = 16, 32, 64). The spec language's [[NAME.swap_rule]] (a kernel without a
catalog), hgemm's catalog entries with swap = true (ranked by the cost model: test_dispatch.py),
the plan, and the builds (ptxas: no spills, the narrow HGMMA, no staged C). CPU only."""
from __future__ import annotations

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec, load_spec_file
from asmgemm.runtime.plan import plan_launch, transposed_bias_mode
from asmgemm.toolchain import disassemble, find_tool
from sweeps import sample_every
from test_kernel_spec import GOOD, write_spec

HGEMM = get_spec("hgemm")


# ---- the spec key -----------------------------------------------------------------------------------
def test_swap_rules_see_the_sizes_and_the_call_parameters(tmp_path):
    p = write_spec(tmp_path, GOOD + """
call_params = { TRANS_A = "trans_a", C_T = "c_trans" }
[[k.swap_rule]]
when = "M <= 64 and TRANS_A == 0"
""")
    (spec,) = load_spec_file(p)
    assert spec.swaps(16, 4096, 4096, 132, {"TRANS_A": 0, "C_T": 0})
    assert not spec.swaps(16, 4096, 4096, 132, {"TRANS_A": 1, "C_T": 0})
    assert not spec.swaps(65, 4096, 4096, 132, {"TRANS_A": 0, "C_T": 0})
    assert spec.to_json()["swap_rules"] == [{"when": "M <= 64 and TRANS_A == 0"}]


@pytest.mark.parametrize("extra,message", [
    ('[[k.swap_rule]]\nwhen = "M <= 64"\n', "must map the call value 'c_trans'"),
    ('call_params = { C_T = "c_trans" }\n[[k.swap_rule]]\nwhen = "M <= 64"\nkernel = "x"\n',
     "a table with exactly 'when'"),
    ('call_params = { C_T = "c_trans" }\n[[k.swap_rule]]\nwhen = "ROWS <= 64"\n', "undefined name 'ROWS'"),
])
def test_bad_swap_rules_are_refused_at_load(tmp_path, extra, message):
    p = write_spec(tmp_path, GOOD + extra)
    with pytest.raises(AsmError, match=message):
        load_spec_file(p)


@pytest.mark.parametrize("name", ["hgemm", "bgemm", "hgemm_f32c"])
def test_the_16_bit_kernels_offer_c_transposed_entries(name):
    """The TMA kernels' catalog has C^T entries, 16, 32, 64 and 192 columns wide (the user's rows;
    192: a few tile rows over a large B, read once), and no swap rule: the cost model weighs them
    against the entries that run the call as it is."""
    spec = get_spec(name)
    assert spec.call_value_param("c_trans") == "C_T" and not spec.swap_rules
    widths = {dict(e.set)["BN"] for e in spec.configs if e.swap}
    assert widths == {16, 32, 64, 192}


# ---- the plan ---------------------------------------------------------------------------------------
def _ptr(x):
    return x.ctypes.data


def test_a_c_trans_plan_swaps_the_operands_and_keeps_c_row_major():
    m, n, k = 16, 256, 64
    a, b = np.zeros((m, k), np.float16), np.zeros((k, n), np.float16)
    c, bias = np.zeros((m, n), np.float16), np.zeros(n, np.float16)
    plain = plan_launch(a, b, c, trans_a=False, trans_b=False, ptr_of=_ptr, bias=bias)
    p = plan_launch(a, b, c, trans_a=False, trans_b=False, ptr_of=_ptr, bias=bias, c_trans=True)
    assert not plain.c_trans and plain.call_values["c_trans"] == 0 and plain.call_values["wide_c"] == 1
    assert p.c_trans and p.swapped and (p.m, p.n, p.k, p.ldc) == (n, m, k, n)
    # the kernel's A is B^T (M-major), its B is A (K-major): the small-BN tiles need that
    assert (p.a.ptr, p.b.ptr, p.layout) == (_ptr(b), _ptr(a), "tt")
    # the user's columns are the kernel's rows; a pair is two rows of C: no vector stores
    assert p.call_values["bias"] == 2 and p.call_values["vec_c"] == 0 and p.call_values["wide_c"] == 0


def test_c_trans_is_ignored_where_the_swap_is_already_made_or_a_batch_runs():
    a, b = np.zeros((16, 64), np.float16), np.zeros((64, 256), np.float16)
    cf = np.zeros((16, 256), np.float16, order="F")
    p = plan_launch(a, b, cf, trans_a=False, trans_b=False, ptr_of=_ptr, c_trans=True)
    assert p.swapped and not p.c_trans              # column-major C: the plain swap, C^T row-major
    c = np.zeros((16, 256), np.float16)
    p = plan_launch(a, b, c, trans_a=False, trans_b=False, ptr_of=_ptr, c_trans=True, batch=2)
    assert not p.swapped and not p.c_trans


# ---- the untuned choice -----------------------------------------------------------------------------
def test_a_swapped_launch_is_never_split_by_the_partial_pass_and_its_bias_axis_turns():
    """The kernel refuses C_T with SPLIT_K (its partial pass writes the kernel's orientation), so no
    C^T entry lists a split; a per-column bias of the user's C is a per-row bias of the kernel's."""
    assert all(e.splits == (1,) for e in HGEMM.configs if e.swap)
    assert transposed_bias_mode(1) == 2 and transposed_bias_mode(2) == 1 and transposed_bias_mode(0) == 0


# ---- the kernel -------------------------------------------------------------------------------------
def _build(defines: dict):
    from asmgemm.pipeline import BuildOptions, build_file
    return build_file("hgemm", BuildOptions(defines={k: str(v) for k, v in defines.items()}, target="sm_90a"))


SWAPPED = {"C_T": 1, "TRANS_A": 1, "TRANS_B": 1, "CLUSTER_M": 1, "STAGES": 8}


def test_small_bn_needs_k_major_b_and_c_t_no_split_or_wide_c():
    with pytest.raises(AsmError, match="16 or 32 only with K-major B"):
        _build({**SWAPPED, "TRANS_B": 0, "BN": 16})
    _build({**SWAPPED, "TRANS_B": 0, "BN": 64})          # one 64-column chunk of N-major B
    with pytest.raises(AsmError, match="C_T stores the kernel's C transposed"):
        _build({**SWAPPED, "BN": 16, "SPLIT_K": 1})
    with pytest.raises(AsmError, match="C_T: the transposed store"):
        _build({**SWAPPED, "BN": 16, "WIDE_C": 1})


@pytest.mark.toolchain
@pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                    reason="ptxas/nvdisasm not installed")
@pytest.mark.parametrize("defines", sample_every(5, [
    {"BN": 16}, {"BN": 32, "BIAS": 2, "ACT": 2}, {"BN": 64, "BF16": 1, "BIAS": 1, "ACT": 3},
    {"BN": 16, "C_F32": 1, "ACT": 4}, {"BN": 32, "CLUSTER_M": 2},
]), ids=["bn16", "bn32-gelu", "bn64-bf16", "bn16-f32c", "bn32-cluster"])
def test_swapped_builds_run_the_narrow_wgmma_without_spills(defines):
    from asmgemm.pipeline import assemble
    result = _build({**SWAPPED, **defines})
    assert result.constants["RING"] == 8 and result.constants["STAGED_C"] == 0
    asm = assemble(result)
    assert not asm.warnings, asm.warnings
    (k,) = asm.kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == k.stack_frame == 0
    ops = [line.split()[1] for line in disassemble(asm.cubin).splitlines()
           if line.strip().startswith("/*") and len(line.split()) > 1]
    bn = defines["BN"]
    hgmma = [op for op in ops if op.startswith("HGMMA")]
    assert len(hgmma) == 4 and all(op.startswith(f"HGMMA.64x{bn}x16.F32") for op in hgmma), hgmma
    assert any(op.startswith("UTMALDG") for op in ops)
    assert not any(op.startswith("UTMASTG") for op in ops)      # C leaves by element stores
