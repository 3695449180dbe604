"""The padded-copy-or-in-place model (asm/runtime/path_model.py) on the CPU: where an operand's rows
are not 16-byte aligned, a padded copy plus the TMA kernel against the spec's in-place kernel
(hgemm -> hgemm_mma). The decision comes from the modelled times, never a size threshold: in place
for small problems (the copy's launch and traffic cost more than the slower kernel loses), the copy
once the GEMM is long enough for the faster kernel to earn it back."""
from __future__ import annotations

import dataclasses

import math

import pytest

from asmgemm.runtime import path_model
from asmgemm.runtime.path_model import H100, coefficients, copy_path_s, decide, in_place_path_s, tma_kernel_s


def both_copied(m: int, n: int, k: int, itemsize: int = 2) -> int:
    """Bytes of A (m x k) and B (k x n) copied into padded storage."""
    return (m * k + k * n) * itemsize


def test_4095_cubed_with_both_operands_copied_takes_the_copy():
    """The module's own example: 134 MB moved (~45 us of copy and 2 x 20 us of host work) against
    ~340 us of in-place GEMM and ~196 us of TMA kernel (1024 whole tiles of 128 x 128)."""
    m = n = k = 4095
    copied = both_copied(m, n, k)
    assert copy_path_s(m, n, k, copied, H100, copies=2) == pytest.approx(
        2 * 20e-6 + 2 * copied / 3.0e12 + 2 * 1024 * 128 * 128 * k / 700e12)
    assert in_place_path_s(m, n, k, H100) == pytest.approx(2 * m * n * k / 400e12)
    assert copy_path_s(m, n, k, copied, H100, copies=2) < 300e-6 < in_place_path_s(m, n, k, H100)
    assert not decide(m, n, k, copied, H100, copies=2).in_place


def test_1000_cubed_runs_in_place():
    """At 1000^3 one copy's host work alone costs more than the in-place kernel's whole run."""
    assert in_place_path_s(1000, 1000, 1000, H100) < H100.copy_host_s
    assert decide(1000, 1000, 1000, both_copied(1000, 1000, 1000), H100).in_place
    assert decide(1000, 1000, 1000, 1000 * 1000 * 2, H100).in_place           # one operand copied


@pytest.mark.parametrize("operands", [1, 2])
def test_the_decision_flips_once_from_in_place_to_copy_as_the_problem_grows(operands):
    """Cubes of growing size: in place up to a size, the copy from there on (no flip back)."""
    wins = []
    for n in range(64, 8193, 64):
        copied = both_copied(n, n, n) if operands == 2 else n * n * 2
        wins.append(decide(n, n, n, copied, H100, copies=operands).in_place)
    flips = [i for i in range(1, len(wins)) if wins[i] != wins[i - 1]]
    assert wins[0] and not wins[-1] and len(flips) == 1, flips
    # the flip lies between the two examples of the module docstring
    assert 1000 < 64 * (flips[0] + 1) < 4095


def test_deep_k_favours_the_copy_and_short_k_in_place():
    """The copy is paid once per operand byte, the kernel's advantage per flop: a long K (more
    flops per copied byte of a K x N B) tips the same M x N towards the copy."""
    m = n = 2048
    assert decide(m, n, 64, both_copied(m, n, 64), H100, copies=2).in_place
    assert not decide(m, n, 16384, both_copied(m, n, 16384), H100, copies=2).in_place


def test_no_copied_bytes_still_pays_the_host_work():
    """With nothing to copy the copy path is the TMA kernel plus one copy's host work (the runtime
    never asks then: launch_config._in_place_or returns the TMA kernel first)."""
    assert copy_path_s(1, 1, 1, 0, H100) == pytest.approx(H100.copy_host_s + tma_kernel_s(1, 1, 1, H100))
    # one whole 128 x 128 tile, at the rate of the one multiprocessor it fills
    assert tma_kernel_s(1, 1, 1, H100) == pytest.approx(2 * 128 * 128 / (H100.tma_flops / H100.sms))


def test_the_h100_has_measured_coefficients():
    assert coefficients("NVIDIA H100 80GB HBM3", 132) is H100
    assert coefficients("NVIDIA H100 80GB HBM3", 66) is H100          # a reading, whatever the count


@pytest.mark.parametrize("sms", [66, 132, 264, 46])
def test_an_unknown_device_scales_the_h100s_rates_by_its_sm_count(sms):
    """Rates and bandwidth per SM as the H100's; the launch cost does not scale."""
    c = coefficients("NVIDIA A100-SXM4-80GB", sms)
    f = sms / 132
    assert c.copy_bytes_per_s == pytest.approx(H100.copy_bytes_per_s * f)
    assert c.tma_flops == pytest.approx(H100.tma_flops * f)
    assert c.in_place_flops == pytest.approx(H100.in_place_flops * f)
    assert c.copy_host_s == H100.copy_host_s
    # halving every rate doubles every term but the launch: a smaller GPU copies sooner
    if sms < 132:
        n = next(n for n in range(64, 8193, 64) if not decide(n, n, n, both_copied(n, n, n), H100).in_place)
        assert not decide(n, n, n, both_copied(n, n, n), c).in_place


def test_a_zero_sm_count_does_not_divide_by_zero():
    c = coefficients("Some GPU", 0)
    assert c.tma_flops == pytest.approx(H100.tma_flops / 132) and c.tma_flops > 0


def test_coefficients_are_frozen_data():
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100.tma_flops = 1.0
    assert path_model.PathCoefficients(1, 2, 3, 4) == path_model.PathCoefficients(1, 2, 3, 4)


def test_padding_and_idle_multiprocessors_are_charged_on_both_paths():
    """Each path pays for the whole tiles it runs and the slots they leave idle: a 5 x 4096 x 4096
    call is 92% padding in the in-place kernel's 64 x 64 tiles (64 of its 528 slots) and 96% in the
    TMA kernel's 128 x 128 (32 of 132 multiprocessors), so neither path runs it at its full rate;
    652 x 415 x 148 (77 tiles) and 1000 x 1000 x 999 stay in place, 4095^3 takes the copies."""
    from asmgemm.runtime.path_model import blocks_per_sm
    assert blocks_per_sm(128, 128) == 2 and blocks_per_sm(64, 64) == 4
    assert in_place_path_s(5, 4096, 4096, H100, (64, 64)) == pytest.approx(
        2 * 64 * 64 * 64 * 4096 / (H100.in_place_flops * 64 / 528))
    assert tma_kernel_s(5, 4096, 4096, H100) == pytest.approx(2 * 32 * 128 * 128 * 4096 / (H100.tma_flops * 32 / 132))
    assert in_place_path_s(5, 4096, 4096, H100, (64, 64)) > 10 * in_place_path_s(5, 4096, 4096, H100)
    assert decide(652, 415, 148, 652 * 148 * 2, H100, (64, 64)).in_place
    assert decide(1000, 1000, 999, 1000 * 999 * 2, H100, (64, 64)).in_place
    assert not decide(4095, 4095, 4095, both_copied(4095, 4095, 4095), H100, (128, 128), copies=2).in_place
    # the padded flops of whole tiles, at the rate of the slots they fill
    assert in_place_path_s(64, 64, 64, H100, (64, 64)) == pytest.approx(
        2 * 64 * 64 * 64 / (H100.in_place_flops * 1 / (H100.sms * 4)))


def test_the_cost_models_time_replaces_the_tile_estimate():
    """Where the in-place kernel has a catalog, the runtime passes the cost model's time of its pick
    (split-K included): a few tiles over a deep K that the tile estimate sends to the copies runs in
    place once the model's split time says so, and back the other way."""
    m, n, k = 31, 747, 7681
    copied = both_copied(m, n, k)
    assert not decide(m, n, k, copied, H100, (128, 128), copies=2).in_place
    assert decide(m, n, k, copied, H100, (128, 128), copies=2, in_place_s=15e-6).in_place
    assert not decide(m, n, k, copied, H100, copies=2, in_place_s=1e-3).in_place


def test_an_unaligned_c_is_charged_at_the_tma_kernels_element_store_rate():
    """A large C over a tiny K: the TMA kernel writes C in elements or pairs where its rows are not
    whole 16-byte pieces (measured 0.3-0.6 TB/s on the H100), so that store, not its flops, sets its
    time; whole pieces store faster."""
    m, n, k = 3658, 15588, 20
    c_bytes = m * n * 2
    scalar = tma_kernel_s(m, n, k, H100, c_bytes, c_wide=False)
    assert scalar == pytest.approx(c_bytes / H100.c_narrow_store_bytes_per_s)
    assert tma_kernel_s(m, n, k, H100, c_bytes, c_wide=True) < scalar
    assert tma_kernel_s(m, n, k, H100) < tma_kernel_s(m, n, k, H100, c_bytes, c_wide=True)
    # 40 us of in-place kernel (the C write at DRAM speed) beats the copies and the element stores
    assert decide(m, n, k, (m * k + k * n) * 2, H100, copies=2, in_place_s=40e-6, c_bytes=c_bytes,
                  c_wide=False).in_place


def test_the_decision_carries_the_terms_it_was_made_from():
    """decide(): the copy path's three terms add up to copy_path_s, the in-place time is the one
    given (else in_place_path_s), and .in_place is its verdict (what launch_config acts on and explain
    prints)."""
    m, n, k = 5546, 2800, 14
    copied = n * k * 2
    d = decide(m, n, k, copied, H100, copies=1, in_place_s=41.8e-6, c_bytes=m * n * 2)
    assert d.copy_host_s == pytest.approx(H100.copy_host_s) and d.copy_bytes_s == pytest.approx(2 * copied / 3.0e12)
    assert d.copy_path_s == pytest.approx(copy_path_s(m, n, k, copied, H100, 1, m * n * 2))
    assert d.in_place == (41.8e-6 <= d.copy_path_s)
    assert decide(1000, 1000, 1000, copied, H100).in_place_s == pytest.approx(
        in_place_path_s(1000, 1000, 1000, H100))
    assert d.to_json()["copy_path_us"] == pytest.approx(d.copy_path_s * 1e6, abs=1e-3)


def test_in_place_off_keeps_the_tma_kernel_inside_and_restores_the_decision_after():
    before = path_model.decide
    with path_model.in_place_off():
        inside = path_model.decide(1000, 1000, 1000, both_copied(1000, 1000, 1000), H100, copies=2)
        assert not inside.in_place and inside.in_place_s < inside.copy_path_s     # the terms still computed
    assert path_model.decide is before
    assert path_model.decide(1000, 1000, 1000, both_copied(1000, 1000, 1000), H100, copies=2).in_place
    with pytest.raises(RuntimeError), path_model.in_place_off():
        raise RuntimeError("restored on the way out too")
    assert path_model.decide is before


# ---- operands TMA reads in place: the two kernels' picks by the cost model -------------------------
def test_the_margin_is_the_two_estimates_errors_at_their_sizes_combined():
    """e^hypot of each estimate's rms log error at its own size: a 3-4-5 triangle gives e^0.5; the
    shipped tables give a narrower margin on tiny calls than on long ones, and never a narrower one
    for a longer in-place estimate (launch_config's shortcut weighs the fastest candidate only)."""
    tables = dict(tma_table=((1e-5, 0.3), (math.inf, 0.6)), in_place_table=((1e-5, 0.4), (math.inf, 0.8)))
    assert path_model.aligned_margin(5e-6, 5e-6, **tables) == pytest.approx(math.e ** 0.5)
    assert path_model.aligned_margin(5e-6, 2e-5, **tables) == pytest.approx(math.e ** math.hypot(0.3, 0.8))
    tiny, long = path_model.aligned_margin(5e-6, 4e-6), path_model.aligned_margin(40e-6, 30e-6)
    assert 1.1 < tiny < long < 1.6
    margins = [path_model.aligned_margin(10e-6, s * 1e-6) for s in range(1, 100)]
    assert margins == sorted(margins)


def test_an_aligned_call_runs_in_place_only_where_it_wins_by_the_margin():
    """Nothing copied: the TMA kernel's time is the one given (its configuration's), and the
    in-place kernel must be shorter after the margin: 10 us against 12.9 at 1.3 keeps the TMA
    kernel; against 13.1 it moves."""
    keep = decide(16, 16, 8192, 0, H100, copies=0, in_place_s=10e-6, tma_s=12.9e-6, margin=1.3)
    move = decide(16, 16, 8192, 0, H100, copies=0, in_place_s=10e-6, tma_s=13.1e-6, margin=1.3)
    assert not keep.in_place and move.in_place
    assert move.copy_path_s == pytest.approx(13.1e-6) and move.to_json()["margin"] == 1.3
    # without a margin (the copy path's decisions) the point estimates decide, as before
    assert decide(16, 16, 8192, 0, H100, copies=0, in_place_s=10e-6, tma_s=10.5e-6).in_place
