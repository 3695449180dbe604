"""Shape presets, shape specs and shape files for `asmgemm bench`/`tune`."""
import json

import pytest

from asmgemm.bench.shapes import (LAYOUTS, PRESETS, TRANSFORMER_MODELS, Shape, layout_flags, load_shape_file,
                                  parse_layouts, parse_shape, parse_shapes, shape_argument)
from asmgemm.errors import AsmError


def test_square_preset_is_1024_to_8192():
    assert [(s.m, s.n, s.k) for s in PRESETS["square"]] == [(d, d, d) for d in (1024, 2048, 4096, 8192)]


def test_transformer_preset_derives_gemms_from_model_configs():
    shapes = {(s.m, s.n, s.k) for s in PRESETS["transformer"]}
    # Llama-3-8B, T=4096: QKV out = 4096 + 2*8*128 = 6144; FFN up 4096->14336; down 14336->4096
    assert (4096, 6144, 4096) in shapes
    assert (4096, 14336, 4096) in shapes and (4096, 4096, 14336) in shapes
    # Qwen2-7B: 3584 hidden, 28 heads (head_dim 128), 4 KV heads: QKV out 3584 + 1024 = 4608
    assert (512, 4608, 3584) in shapes and (512, 18944, 3584) in shapes and (512, 3584, 18944) in shapes
    # Llama-2-7B has no GQA: QKV out = 3 * 4096
    assert (512, 12288, 4096) in shapes
    for model in TRANSFORMER_MODELS:
        assert model.hidden % model.heads == 0


def test_presets_have_no_duplicate_shapes():
    for name, shapes in PRESETS.items():
        keys = [(s.m, s.n, s.k) for s in shapes]
        assert len(keys) == len(set(keys)), name


@pytest.mark.parametrize("text", ["4096,4096,4096", "4096x4096x4096", " 4096 x 4096 x 4096 "])
def test_parse_shape_forms(text):
    assert parse_shape(text) == Shape(4096, 4096, 4096)


@pytest.mark.parametrize("text", ["4096,4096", "a,b,c", "0,1,1", "1,1,99999999", "-1,2,3"])
def test_parse_shape_rejects(text):
    with pytest.raises(AsmError):
        parse_shape(text)


def test_shape_argument_is_parse_shape_for_argparse():
    """The tools' --shape type: parse_shape's sizes as a tuple, its refusal as argparse's usage error."""
    import argparse
    assert shape_argument("176x15696x16336") == (176, 15696, 16336) == shape_argument("176,15696,16336")
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", type=shape_argument)
    assert parser.parse_args(["--shape", "3x4x5"]).shape == (3, 4, 5)
    with pytest.raises(argparse.ArgumentTypeError, match="out of range"):
        shape_argument("3x0x5")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a shape"):
        shape_argument("12xx3")


def test_parse_shapes_mixes_presets_and_shapes_and_dedupes():
    shapes = parse_shapes("square,3000x5000x700,1024x1024x1024")
    assert [s.key for s in shapes] == ["1024x1024x1024", "2048x2048x2048", "4096x4096x4096",
                                       "8192x8192x8192", "3000x5000x700"]


def test_parse_shapes_unknown_preset_names_the_presets():
    with pytest.raises(AsmError) as e:
        parse_shapes("sqare")
    assert "square" in e.value.message and "sqare" in e.value.message


def test_text_shape_file(tmp_path):
    p = tmp_path / "shapes.txt"
    p.write_text("# comment\n1024 2048 512 my layer\n\n3000x5000x700  # odd\n1024 2048 512 again\n")
    shapes = parse_shapes(str(p))
    assert [(s.m, s.n, s.k, s.label) for s in shapes] == [(1024, 2048, 512, "my layer"), (3000, 5000, 700, "")]


def test_json_shape_file(tmp_path):
    p = tmp_path / "shapes.json"
    p.write_text(json.dumps([[1, 2, 3], {"m": 4, "n": 5, "k": 6, "label": "x"}]))
    assert [(s.m, s.n, s.k, s.label) for s in load_shape_file(p)] == [(1, 2, 3, ""), (4, 5, 6, "x")]


@pytest.mark.parametrize("content, needle", [("1024 2048\n", ":1:"), ("[[1, 2]]", "item 0"), ("[1, 2", "invalid JSON"),
                                             ("# nothing\n", "no shapes")])
def test_bad_shape_files_say_where(tmp_path, content, needle):
    p = tmp_path / ("s.json" if content.startswith("[") else "s.txt")
    p.write_text(content)
    with pytest.raises(AsmError) as e:
        load_shape_file(p)
    assert needle in e.value.message


def test_layouts():
    assert parse_layouts("nn") == ["nn"]
    assert parse_layouts("all") == list(LAYOUTS)
    assert parse_layouts("NT, nn, nt") == ["nt", "nn"]
    with pytest.raises(AsmError):
        parse_layouts("nx")
    assert layout_flags("tn") == (True, False) and layout_flags("nt") == (False, True)


def test_flops():
    assert Shape(2, 3, 4).flops == 48


def test_presets_cover_decoding_small_batches_bert_primes_and_shallow_k():
    from asmgemm.bench.shapes import PRESETS
    tr = {(s.m, s.n, s.k) for s in PRESETS["transformer"]}
    for tokens in (1, 16, 128, 512, 4096):
        assert (tokens, 14336, 4096) in tr                     # Llama-3-8B FFN up
        assert (tokens, 2304, 768) in tr and (tokens, 768, 3072) in tr   # GPT-2 small QKV, FFN down
    odd = {(s.m, s.n, s.k) for s in PRESETS["odd"]}
    assert {(4097, 4097, 4097), (1009, 1013, 1019)} <= odd
    assert {k for m, n, k in odd if (m, n) == (2048, 2048)} == {1, 7, 16, 31}


def test_a_long_list_of_shapes_is_not_taken_for_a_file_name():
    """26 decode shapes make a string longer than a file name may be (the OS refuses to look it
    up: ENAMETOOLONG), which once ended in an internal error."""
    spec = ",".join(f"{m}x{n}x4096" for m in (1, 16) for n in range(4096, 4096 + 13 * 1024, 1024))
    assert len(spec) > 255
    assert len(parse_shapes(spec)) == 26


# ---- random:SEED:COUNT[:ALIGN] and the linear preset (issue 32) ---------------------------------
def _keys(shapes):
    return [(s.m, s.n, s.k, s.layout) for s in shapes]


def test_random_preset_is_determined_by_its_seed():
    from asmgemm.bench.shapes import random_shapes
    assert _keys(parse_shapes("random:11:60")) == _keys(parse_shapes("random:11:60")) == _keys(random_shapes(11, 60))
    assert _keys(parse_shapes("random:11:60")) != _keys(parse_shapes("random:12:60"))
    # a longer list starts with the shorter one (each shape is drawn after the ones before)
    assert _keys(random_shapes(11, 60))[:10] == _keys(random_shapes(11, 10))
    # the algorithm of the shapes.py docstring, pinned: a change to it changes every stored result's meaning
    assert _keys(random_shapes(11, 3)) == [(81, 229, 7853, "nt"), (139, 299, 7, "tn"), (452, 2198, 3, "nt")]
    assert _keys(random_shapes(11, 3, 16)) == [(96, 240, 7856, "nt"), (144, 304, 16, "tn"), (464, 2208, 16, "nt")]
    assert [s.label for s in random_shapes(11, 3)] == ["random 1/3", "random 2/3", "random 3/3"]


@pytest.mark.parametrize("align", [1, 3, 16, 128, 1000])
def test_random_shapes_stay_in_bounds(align):
    shapes = parse_shapes(f"random:{align}:300:{align}" if align != 1 else "random:5:300")
    assert len(shapes) == len(set(_keys(shapes))) == 300
    for s in shapes:
        assert all(1 <= d <= 16384 and d % align == 0 for d in (s.m, s.n, s.k)), s
        assert 2 ** 18 <= s.m * s.n * s.k <= 2 ** 36, s
        assert s.layout in LAYOUTS
    if align == 1:   # log-uniform reaches both ends of [1, 16384]
        dims = [d for s in shapes for d in (s.m, s.n, s.k)]
        assert min(dims) < 8 and max(dims) > 8192


def test_random_layouts_cover_all_four():
    from collections import Counter
    counts = Counter(s.layout for s in parse_shapes("random:7:200"))
    assert set(counts) == set(LAYOUTS) and min(counts.values()) >= 30      # 50 each expected


@pytest.mark.parametrize("spec, needle", [
    ("random", "write random:SEED:COUNT[:ALIGN]"),
    ("random:x", "write random:SEED:COUNT[:ALIGN]"),
    ("random:1", "write random:SEED:COUNT[:ALIGN]"),
    ("random:x:5", "SEED must be a non-negative integer, got 'x'"),
    ("random:1:five", "COUNT must be a non-negative integer"),
    ("random:-1:5", "SEED must be a non-negative integer"),
    ("random:1:0", "COUNT=0 is out of range (1..10000)"),
    ("random:1:10001", "COUNT=10001 is out of range"),
    ("random:1:5:0", "ALIGN=0 is out of range (1..4096"),
    ("random:1:5:4097", "ALIGN=4097 is out of range"),
    ("random:1:5:16:2", "write random:SEED:COUNT[:ALIGN]"),
    ("random:1:5:4096", "found only 4 distinct shapes"),
])
def test_malformed_random_specs(spec, needle, run_cli):
    with pytest.raises(AsmError) as e:
        parse_shapes(spec)
    assert needle in e.value.message
    code, _, err = run_cli("bench", "--shapes", spec)       # stops before any GPU work
    assert code == 1 and needle in err and "Traceback" not in err, err


def test_linear_preset_is_x_times_w_transposed():
    shapes = PRESETS["linear"]
    assert len(shapes) == 6 * 4 and {s.layout for s in shapes} == {"nt"}
    assert {s.m for s in shapes} == {1, 8, 64, 256, 1024, 4096}
    for t in (1, 8, 64, 256, 1024, 4096):
        # M = tokens, N = out features, K = in features
        assert {(s.n, s.k) for s in shapes if s.m == t} == {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)}
    assert shapes[0].label == "linear qkv T=1"


def test_own_layouts_survive_parsing_and_dedupe():
    """The same M, N, K with an own layout and without is two problems; equal ones are one."""
    shapes = parse_shapes("1x4096x4096,linear,linear")
    assert _keys(shapes)[:2] == [(1, 4096, 4096, None), (1, 6144, 4096, "nt")]
    assert len(shapes) == 1 + 24
    assert Shape(1, 4096, 4096) != Shape(1, 4096, 4096, layout="nt")


def test_bench_runs_a_shape_with_its_own_layout_under_that_layout_only():
    from asmgemm.commands.bench import _items
    plain, own_nt, own_tt = Shape(8, 8, 8), Shape(16, 16, 16, layout="nt"), Shape(32, 32, 32, layout="tt")
    items = [(lay, s.key) for _, lay, s in _items(["k"], [plain, own_nt, own_tt], ["nn", "nt"])]
    assert items == [("nn", "8x8x8"), ("nt", "8x8x8"), ("nt", "16x16x16"), ("tt", "32x32x32")]
