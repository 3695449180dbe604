"""GEMM problem shapes for `asmgemm bench` / `asmgemm tune`: presets, parsing, layouts.

A shape is (M, N, K) for C[M×N] = op(A)[M×K] · op(B)[K×N]. A layout is two letters, the first for
A and the second for B: `n` = stored as the math says (row-major), `t` = stored transposed.

Presets:
  square       1024³, 2048³, 4096³, 8192³ — the classic throughput curve.
  odd          sizes that stress edge handling and wave quantization: 1000³, 3000×5000×700,
               4097×4097×4097, 127×129×1000, 8192×1024×8192, 4096×4096×1024, primes
               (1009×1013×1019, 4099×4093×509), and shallow K (2048×2048 with K = 1, 7, 16, 31).
  transformer  the four projections of one decoder layer (QKV, attention output, FFN up/gate,
               FFN down) for token counts 1 and 16 (decoding), 128 (a small batch), 512 and
               4096 (prefill), in the form C[tokens × out] = X[tokens × in] · W[in × out], i.e.
               M = tokens, N = out features, K = in features.
  linear       the nn.Linear layers of a Llama-style block (Llama-3-8B sizes): QKV 4096->6144,
               attention output 4096->4096, gate+up fused 4096->28672, down 14336->4096, at
               T = 1, 8, 64, 256, 1024, 4096 tokens, as PyTorch computes them: Y[T x out] =
               X[T x in] · W^T with W stored (out, in), i.e. M = T, N = out, K = in, layout "nt"
               (B stored transposed). Each shape carries that layout (bench ignores --layouts for it).
  small        tiny shapes for smoke tests (a few ms in total).

Random shapes, `random:SEED:COUNT[:ALIGN]` (`random_shapes`): COUNT distinct shapes, each with its
own layout, the same for the same SEED, COUNT and ALIGN on every machine and Python 3 version.
The algorithm, exactly (rng = random.Random(SEED), ALIGN default 1, CAP = the largest multiple of
ALIGN <= 16384):
  for each of the COUNT shapes (label "random i/COUNT", i from 1):
    repeat:
      for M, then N, then K:  x = exp(rng.random() * ln 16384)       (log-uniform in [1, 16384])
                              v = min(ceil(x), 16384)
                              v = min(ceil(v / ALIGN) * ALIGN, CAP)   (up to a multiple of ALIGN)
      if 2^18 <= M·N·K <= 2^36:
        layout = LAYOUTS[int(rng.random() * 4)]                      (LAYOUTS = nn, nt, tn, tt)
    until M·N·K was in bounds and (M, N, K, layout) is not one of the shapes before it.
Only random.Random(SEED).random() is used: Python guarantees its sequence for a given seed across
versions (its other methods' algorithms may change); math.exp and math.log are IEEE double. ALIGN
is at most 4096: every dimension is at least ALIGN, so a larger one would make every M·N·K exceed
2^36.

Transformer sizes, from each model's published config (hidden_size, intermediate_size,
num_attention_heads, num_key_value_heads; head_dim = hidden / heads: 128, except 64 for BERT/GPT-2):
  Llama-3-8B   4096, 14336, 32 heads, 8 KV heads  (huggingface.co/meta-llama/Meta-Llama-3-8B config.json)
  Mistral-7B   4096, 14336, 32 heads, 8 KV heads  (Jiang et al. 2023, arXiv:2310.06825, Table 1):
               the same GEMMs as Llama-3-8B, so listed once under that name.
  Llama-2-7B   4096, 11008, 32 heads, 32 KV heads (Touvron et al. 2023, arXiv:2307.09288; HF config.json)
  Qwen2-7B     3584, 18944, 28 heads, 4 KV heads  (huggingface.co/Qwen/Qwen2-7B config.json)
  BERT-base/GPT-2  768, 3072, 12 heads, 12 KV heads (Devlin et al. 2018, arXiv:1810.04805, BERT-base;
               Radford et al. 2019, GPT-2 small: n_embd 768, 4 x 768 MLP); head_dim 64
The QKV projection's output width is hidden + 2 · kv_heads · head_dim (grouped-query attention).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import AsmError

LAYOUTS = ("nn", "nt", "tn", "tt")

# Limits that keep a typo (an extra digit) from asking for a terabyte of device memory. MAX_DIM is
# the one bound on M, N and K of `run` (its --m/--n/--k option type), `bench` and `tune`.
MAX_DIM = 1 << 20
MAX_ELEMENTS_PER_MATRIX = 1 << 31


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int
    label: str = ""
    layout: str | None = None   # a preset's own layout (random, linear): bench runs only it; None: --layouts

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def key(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class TransformerModel:
    name: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_gemms(self, tokens: int) -> list[Shape]:
        qkv = self.hidden + 2 * self.kv_heads * self.head_dim
        return [
            Shape(tokens, qkv, self.hidden, f"{self.name} qkv T={tokens}"),
            Shape(tokens, self.hidden, self.hidden, f"{self.name} attn-out T={tokens}"),
            Shape(tokens, self.ffn, self.hidden, f"{self.name} ffn-up T={tokens}"),
            Shape(tokens, self.hidden, self.ffn, f"{self.name} ffn-down T={tokens}"),
        ]


# Sources in the module docstring.
TRANSFORMER_MODELS = (
    TransformerModel("Llama-3-8B/Mistral-7B", hidden=4096, ffn=14336, heads=32, kv_heads=8),
    TransformerModel("Llama-2-7B", hidden=4096, ffn=11008, heads=32, kv_heads=32),
    TransformerModel("Qwen2-7B", hidden=3584, ffn=18944, heads=28, kv_heads=4),
    TransformerModel("BERT-base/GPT-2", hidden=768, ffn=3072, heads=12, kv_heads=12),
)
TRANSFORMER_TOKEN_COUNTS = (1, 16, 128, 512, 4096)


def dedupe(shapes: list[Shape]) -> list[Shape]:
    """Keep the first of shapes with equal (M, N, K) and own layout; order is kept. (The same M, N, K
    with another own layout is another problem: bench runs both.)"""
    seen: set[tuple[int, int, int, str | None]] = set()
    out = []
    for s in shapes:
        if (s.m, s.n, s.k, s.layout) not in seen:
            seen.add((s.m, s.n, s.k, s.layout))
            out.append(s)
    return out


def _square(*sizes: int) -> list[Shape]:
    return [Shape(s, s, s, f"square {s}") for s in sizes]


def _transformer() -> list[Shape]:
    out: list[Shape] = []
    for tokens in TRANSFORMER_TOKEN_COUNTS:
        for model in TRANSFORMER_MODELS:
            out.extend(model.layer_gemms(tokens))
    return dedupe(out)   # models sharing a hidden size share the attention-output GEMM


# (name, in features, out features) of the nn.Linear layers of a Llama-3-8B block: QKV with
# grouped-query attention (4096 + 2 · 8 · 128 = 6144), the attention output, gate and up fused into
# one GEMM (2 · 14336), down.
LINEAR_LAYERS = (("qkv", 4096, 6144), ("o", 4096, 4096), ("gate+up", 4096, 28672), ("down", 14336, 4096))
LINEAR_TOKEN_COUNTS = (1, 8, 64, 256, 1024, 4096)


def _linear() -> list[Shape]:
    # Y = X · W^T with W stored (out, in) as nn.Linear keeps it: B = W^T is the transposed storage, "nt"
    return [Shape(t, out, inp, f"linear {name} T={t}", "nt")
            for t in LINEAR_TOKEN_COUNTS for name, inp, out in LINEAR_LAYERS]


PRESETS: dict[str, list[Shape]] = {
    "square": _square(1024, 2048, 4096, 8192),
    "odd": [Shape(1000, 1000, 1000, "odd 1000"), Shape(3000, 5000, 700, "odd 3000x5000x700"),
            Shape(4097, 4097, 4097, "odd 4097"), Shape(127, 129, 1000, "odd skinny"),
            Shape(8192, 1024, 8192, "tall"), Shape(4096, 4096, 1024, "short k"),
            Shape(1009, 1013, 1019, "primes"), Shape(4099, 4093, 509, "primes large"),
            *[Shape(2048, 2048, k, f"shallow k={k}") for k in (1, 7, 16, 31)]],
    "transformer": _transformer(),
    "linear": _linear(),
    "small": [Shape(128, 128, 128, "small 128"), Shape(129, 65, 33, "small odd")],
}

# The random preset (module docstring): dimensions in [1, RANDOM_MAX_DIM], M·N·K within these
# bounds (2^18: below it a GEMM is a few launches' worth of work; 2^36: about 4096³, seconds of
# timing per shape at most), COUNT and ALIGN bounded so that a typo cannot start an endless run.
RANDOM_MAX_DIM = 16384
RANDOM_MIN_VOLUME, RANDOM_MAX_VOLUME = 1 << 18, 1 << 36
RANDOM_MAX_COUNT = 10000
RANDOM_MAX_ALIGN = 4096
# Draws per shape before giving up: the acceptance rate is about 0.6 for ALIGN 1; only an ALIGN
# that leaves fewer than COUNT distinct shapes (4096: 4 of them) runs out.
_RANDOM_TRIES = 10000
_RANDOM_SPEC = "random:SEED:COUNT[:ALIGN]"


def random_shapes(seed: int, count: int, align: int = 1) -> list[Shape]:
    """COUNT distinct random shapes with their own layouts, by the algorithm in the module docstring."""
    if not 1 <= count <= RANDOM_MAX_COUNT:
        raise AsmError(f"--shapes {_RANDOM_SPEC}: COUNT={count} is out of range (1..{RANDOM_MAX_COUNT})")
    if not 1 <= align <= RANDOM_MAX_ALIGN:
        raise AsmError(f"--shapes {_RANDOM_SPEC}: ALIGN={align} is out of range (1..{RANDOM_MAX_ALIGN}; "
                       f"every dimension is at least ALIGN, and M·N·K must stay <= 2^36)")
    rng = random.Random(seed)
    cap = RANDOM_MAX_DIM // align * align
    log_max = math.log(RANDOM_MAX_DIM)

    def dim() -> int:
        # random() only (module docstring: its stream is what Python keeps stable); min(): exp may round up
        v = min(math.ceil(math.exp(rng.random() * log_max)), RANDOM_MAX_DIM)
        return min(-(-v // align) * align, cap)

    seen: set[tuple[int, int, int, str]] = set()
    out: list[Shape] = []
    for i in range(1, count + 1):
        for _ in range(_RANDOM_TRIES):
            m, n, k = dim(), dim(), dim()
            if not RANDOM_MIN_VOLUME <= m * n * k <= RANDOM_MAX_VOLUME:
                continue
            layout = LAYOUTS[int(rng.random() * len(LAYOUTS))]
            if (m, n, k, layout) not in seen:
                break
        else:
            raise AsmError(f"--shapes random:{seed}:{count}:{align}: found only {len(out)} distinct shapes "
                           f"with ALIGN={align} and 2^18 <= M·N·K <= 2^36; ask for fewer or a smaller ALIGN")
        seen.add((m, n, k, layout))
        out.append(Shape(m, n, k, f"random {i}/{count}", layout))
    return out


def parse_random_spec(text: str) -> list[Shape]:
    """'random:SEED:COUNT[:ALIGN]' -> random_shapes(SEED, COUNT, ALIGN)."""
    fields = text.split(":")
    if fields[0].strip().lower() != "random" or len(fields) not in (3, 4):
        raise AsmError(f"--shapes '{text}': write {_RANDOM_SPEC} (e.g. random:11:60, or random:11:60:16 for "
                       "dimensions that are multiples of 16)")
    values = []
    for name, field in zip(("SEED", "COUNT", "ALIGN"), fields[1:]):
        field = field.strip()
        if not re.fullmatch(r"\d{1,19}", field):
            raise AsmError(f"--shapes '{text}': {name} must be a non-negative integer, got '{field}' "
                           f"(write {_RANDOM_SPEC})")
        values.append(int(field))
    return random_shapes(*values)


_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[x×X*,]\s*(\d+)\s*[x×X*,]\s*(\d+)\s*$")


def make_shape(m: int, n: int, k: int, label: str = "", where: str = "") -> Shape:
    for name, v in (("M", m), ("N", n), ("K", k)):
        if not 1 <= v <= MAX_DIM:
            raise AsmError(f"{where}{name}={v} is out of range (1..{MAX_DIM})")
    for name, elems in (("A", m * k), ("B", k * n), ("C", m * n)):
        if elems > MAX_ELEMENTS_PER_MATRIX:
            raise AsmError(f"{where}{m}x{n}x{k}: {name} would have {elems} elements (limit {MAX_ELEMENTS_PER_MATRIX})")
    return Shape(m, n, k, label)


def parse_shape(text: str, where: str = "") -> Shape:
    """'M,N,K' or 'MxNxK' -> Shape."""
    m = _SHAPE_RE.match(text)
    if not m:
        raise AsmError(f"{where}'{text}' is not a shape: write M,N,K or MxNxK (e.g. 4096,4096,4096)")
    return make_shape(*(int(g) for g in m.groups()), where=where)


def shape_argument(text: str) -> tuple[int, int, int]:
    """(M, N, K) of parse_shape(text), as an argparse `type=` for the tools' --shape options: a bad
    shape becomes argparse's usage error (its message, exit status 2), not a traceback."""
    try:
        shape = parse_shape(text)
    except AsmError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return shape.m, shape.n, shape.k


def parse_shapes(spec: str) -> list[Shape]:
    """SPEC: preset names and/or MxNxK shapes separated by commas ('square,3000x5000x700'), or the
    path of a shape file (see `load_shape_file`); `random:SEED:COUNT[:ALIGN]` among them draws random
    shapes (`random_shapes`). Duplicates are dropped, order is kept."""
    spec = spec.strip()
    if not spec:
        raise AsmError("--shapes is empty: give a preset (" + ", ".join(PRESETS) + f"), {_RANDOM_SPEC}, MxNxK "
                       "shapes, or a file")
    if spec not in PRESETS and _is_file(spec):
        return load_shape_file(Path(spec))
    out: list[Shape] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part in PRESETS:
            out.extend(PRESETS[part])
        elif part.lower().startswith("random"):
            out.extend(parse_random_spec(part))
        elif re.fullmatch(r"[\dxX×*]+", part):
            out.append(parse_shape(part))
        else:
            raise AsmError(f"--shapes: '{part}' is neither a preset ({', '.join(PRESETS)}), {_RANDOM_SPEC}, "
                           "an MxNxK shape, nor an existing file")
    return dedupe(out)


def _is_file(text: str) -> bool:
    """Whether `text` names an existing file; a name the OS refuses to look up (too long: a long
    list of shapes, or a NUL) names none."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def load_shape_file(path: Path) -> list[Shape]:
    """A shape file is either JSON (a list of [M, N, K] or {"m":..,"n":..,"k":..,"label":..}) or text:
    one 'M N K [label]' (or 'MxNxK [label]') per line, '#' starts a comment."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AsmError(f"cannot read shape file {path}: {exc}") from None
    shapes: list[Shape] = []
    if path.suffix == ".json" or text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AsmError(f"{path}:{exc.lineno}:{exc.colno}: error: invalid JSON: {exc.msg}") from None
        if not isinstance(data, list):
            raise AsmError(f"{path}: expected a JSON list of shapes")
        for i, item in enumerate(data):
            where = f"{path}: item {i}: "
            if isinstance(item, list) and len(item) == 3 and all(isinstance(v, int) for v in item):
                shapes.append(make_shape(*item, where=where))
            elif isinstance(item, dict) and all(isinstance(item.get(d), int) for d in "mnk"):
                shapes.append(make_shape(item["m"], item["n"], item["k"], str(item.get("label", "")), where))
            else:
                raise AsmError(f"{where}expected [M, N, K] or {{\"m\": M, \"n\": N, \"k\": K}}")
    else:
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{path}:{lineno}: "
            fields = line.split()
            if _SHAPE_RE.match(fields[0]):
                shape, rest = parse_shape(fields[0], where), fields[1:]
            elif len(fields) >= 3 and all(f.isdigit() for f in fields[:3]):
                shape, rest = make_shape(*(int(f) for f in fields[:3]), where=where), fields[3:]
            else:
                raise AsmError(f"{where}expected 'M N K [label]' or 'MxNxK [label]', got '{line}'")
            shapes.append(Shape(shape.m, shape.n, shape.k, " ".join(rest)))
    if not shapes:
        raise AsmError(f"shape file {path} lists no shapes")
    return dedupe(shapes)


def parse_layouts(spec: str) -> list[str]:
    out = []
    for part in (p.strip().lower() for p in spec.split(",")):
        if not part:
            continue
        if part == "all":
            out.extend(LAYOUTS)
        elif part in LAYOUTS:
            out.append(part)
        else:
            raise AsmError(f"unknown layout '{part}' (choose from {', '.join(LAYOUTS)} or all; "
                           "first letter A, second B: n = as is, t = stored transposed)")
    if not out:
        raise AsmError("no layout given")
    return list(dict.fromkeys(out))


def layout_flags(layout: str) -> tuple[bool, bool]:
    """'nt' -> (trans_a=False, trans_b=True)."""
    if layout not in LAYOUTS:
        raise AsmError(f"unknown layout '{layout}'")
    return layout[0] == "t", layout[1] == "t"
