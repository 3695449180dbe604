"""tensor_map.mover: a map moved to another address is the driver's map at that address, by
rewriting the address word only where the driver's maps were checked to hold the address there
alone; a driver whose maps put the address (or anything derived from it) elsewhere keeps getting
every new address. The driver is a stand-in here (its layout is what each test sets); on the GPU,
the maps gemm launches with are the driver's own (tests/test_hgemm_gpu.py)."""
import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.runtime import tensor_map

BASE = 0x7F00_0000_0000


def _driver(monkeypatch, layout):
    """A stand-in for the driver's encode (tensor_map._encode), recording the addresses asked."""
    asked = []

    def encode(tm):
        asked.append(tm.ptr)
        words = np.array([tm.rows * 1000 + i for i in range(16)], dtype=np.uint64)
        words[0] = tm.ptr
        if layout == "address_also_in_word_5":
            words[5] = tm.ptr >> 4
        elif layout == "high_bits_elsewhere":
            words[3] = tm.ptr >> 32              # agrees for low-bit moves only: the high probe tells
        elif layout == "address_not_in_word_0":
            words[0], words[1] = 7, tm.ptr
        return np.frombuffer(words.tobytes(), dtype="V128")[0]
    tensor_map.clear_cache()
    monkeypatch.setattr(tensor_map, "_encode", encode)
    return asked


def _words(value):
    return np.frombuffer(value.tobytes(), dtype=np.uint64)


def _tm(ptr=BASE):
    return tensor_map.tile_map("A", ptr, "float16", 300, 512, 512, 64)


def test_a_map_is_moved_by_rewriting_its_address_word(monkeypatch):
    asked = _driver(monkeypatch, "address_in_word_0")
    move = tensor_map.mover(_tm())
    learned = len(asked)
    assert learned == 1 + len(tensor_map._ADDRESS_PROBES)      # the map, then one probe per bit
    for ptr in (BASE + 16, BASE + (1 << 30), BASE - 4096, 0x1000):
        assert np.array_equal(_words(move(ptr)), _words(tensor_map._encode(_tm(ptr))))
    assert len(asked) == learned + 4                           # only the comparisons above asked the driver


@pytest.mark.parametrize("layout", ["address_also_in_word_5", "high_bits_elsewhere", "address_not_in_word_0"])
def test_a_map_whose_address_is_not_word_0_alone_goes_to_the_driver(monkeypatch, layout):
    asked = _driver(monkeypatch, layout)
    move = tensor_map.mover(_tm())
    before = len(asked)
    got = move(BASE + (3 << 40))
    assert asked[before:] == [BASE + (3 << 40)]
    assert np.array_equal(_words(got), _words(tensor_map._encode(_tm(BASE + (3 << 40)))))


def test_a_moved_map_keeps_the_alignment_rule(monkeypatch):
    _driver(monkeypatch, "address_in_word_0")
    move = tensor_map.mover(_tm())
    with pytest.raises(AsmError, match="16 bytes"):
        move(BASE + 8)
