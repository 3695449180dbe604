"""The GPU facts the runtime keys on (asm/runtime/gpu.py) without a GPU: $ASMGEMM_TARGET builds for
an older target than the device's own (sm_80 on an H100: what an A100 runs), never for one the
device cannot run."""
from __future__ import annotations

import sys

import pytest

from asmgemm.errors import AsmError
from asmgemm.runtime.gpu import TARGET_ENV, DeviceFacts, _older_target, device_facts

H100 = DeviceFacts(0, "NVIDIA H100 80GB HBM3", "sm_90", 132)


@pytest.mark.parametrize("wanted", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_75", "sm_50"])
def test_an_older_or_the_own_target_is_taken(wanted):
    facts = _older_target(H100, wanted)
    assert facts.target == wanted
    assert (facts.id, facts.name, facts.sm_count) == (H100.id, H100.name, H100.sm_count)


@pytest.mark.parametrize("wanted", ["sm_100", "sm_120", "sm_100a", "sm_89a", "sm_80f", "sm_91"])
def test_a_target_the_device_cannot_run_is_refused(wanted):
    """Newer numbers, and architecture- or family-specific targets of another number."""
    with pytest.raises(AsmError, match=rf"\${TARGET_ENV}={wanted}: NVIDIA H100 80GB HBM3 \(sm_90\) cannot run") as err:
        _older_target(H100, wanted)
    assert "sm_80" in err.value.hint


@pytest.mark.parametrize("wanted", ["garbage", "sm", "sm_", "sm_9x", "90", "sm_90ab", "SM_90", " sm_80"])
def test_a_malformed_target_is_refused(wanted):
    with pytest.raises(AsmError, match=rf"\${TARGET_ENV}: not a target name"):
        _older_target(H100, wanted)


def test_the_sm90a_device_target_takes_sm_90():
    """A device known by its suffixed target still runs the plain one of its number."""
    assert _older_target(DeviceFacts(0, "x", "sm_90a", 132), "sm_90").target == "sm_90"
    assert _older_target(DeviceFacts(0, "x", "sm_120", 84), "sm_89").target == "sm_89"


def test_device_facts_apply_the_environment(monkeypatch):
    """device_facts: the device's own target without $ASMGEMM_TARGET, the older one with it (the
    stand-in CuPy's device is compute capability 9.0)."""
    from fake_cupy import make_cupy
    monkeypatch.setitem(sys.modules, "cupy", make_cupy(lambda path, entry: None, name="NVIDIA H100 80GB HBM3"))
    monkeypatch.delenv(TARGET_ENV, raising=False)
    assert device_facts().target == "sm_90"
    monkeypatch.setenv(TARGET_ENV, "sm_80")
    facts = device_facts()
    assert (facts.target, facts.name, facts.sm_count) == ("sm_80", "NVIDIA H100 80GB HBM3", 132)
    monkeypatch.setenv(TARGET_ENV, "")
    assert device_facts().target == "sm_90"                  # empty: unset
    monkeypatch.setenv(TARGET_ENV, "sm_100")
    with pytest.raises(AsmError, match="cannot run code built for it"):
        device_facts()
