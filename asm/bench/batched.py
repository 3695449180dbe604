"""Issue 33's benchmark sets: attention's batched GEMMs and a mixture of experts' grouped GEMM,
timed against torch in one process by bench's own method (timing.time_modes: the `call`, `gpu` and
`loop` columns, implementations interleaved, L2 flushed between repetitions).

`asmgemm bench`'s rows are one 2-D GEMM each (Shape: M, N, K); a batched or grouped call has
other operands and other anchors, so these sets are their own presets here, run by
`asmgemm bench --shapes attention|moe` (each alone: a line per case, the summary per timing mode,
--json) or `python3 tools/batched_bench.py --shapes attention|moe [--quick]`.

attention  b*h in {32, 128, 512}, s in {128, 512, 2048, 4096}, d in {64, 128}: Q.K^T (s x d . d x s,
           K stored (s, d): layout "nt") and P.V (s x s . s x d, "nn"), fp16 and bf16, as torch
           computes them on (b*h, s, d) tensors; anchor torch.matmul (torch.bmm's kernels).
moe        E in {8, 64} experts, (K, N) in {(4096, 14336), (14336, 4096), (7168, 2048)}, bf16, tokens
           totalling 4096 and 32768 split over the experts by `skewed_tokens`; B as torch keeps an
           expert's weight, (E, N, K) viewed as (E, K, N). Anchor torch._grouped_mm where the
           device's torch has it (and it runs), else a Python loop of torch.matmul per expert; each
           row says which (`anchor`).

skewed_tokens(total, E, seed), exactly: rng = random.Random(seed); expert e's weight is
1 / (e + 1) ** 1.2 (Zipf-like: a few experts take most tokens), every fourth expert (e % 4 == 3)
weight 0 (empty), the weights shuffled by rng.shuffle; tokens = floor(total * w / sum w), the
remainder given one token each to the experts with the largest fractional parts (ties: lower e).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ..runtime import gemm as runtime_gemm, grouped as runtime_grouped   # modules: looked up when called
from .timing import LOOP_CALLS, MODES, L2Flusher, TimingStats, make_pre_roll, time_modes

ATTENTION_BH = (32, 128, 512)
ATTENTION_S = (128, 512, 2048, 4096)
ATTENTION_D = (64, 128)
MOE_EXPERTS = (8, 64)
MOE_KN = ((4096, 14336), (14336, 4096), (7168, 2048))
MOE_TOKENS = (4096, 32768)
SETS = ("attention", "moe")


@dataclass(frozen=True)
class AttentionCase:
    bh: int
    s: int
    d: int
    which: str          # "qk" (Q.K^T) or "pv" (P.V)
    dtype: str

    @property
    def label(self) -> str:
        return f"{'QK^T' if self.which == 'qk' else 'PV'} bh={self.bh} s={self.s} d={self.d} {self.dtype}"

    @property
    def flops(self) -> int:
        return 2 * self.bh * self.s * self.s * self.d


@dataclass(frozen=True)
class MoeCase:
    experts: int
    k: int
    n: int
    total: int
    dtype: str = "bfloat16"
    seed: int = 0

    @property
    def tokens(self) -> list[int]:
        return skewed_tokens(self.total, self.experts, self.seed)

    @property
    def label(self) -> str:
        return f"moe E={self.experts} K={self.k} N={self.n} tokens={self.total}"

    @property
    def flops(self) -> int:
        return 2 * self.total * self.k * self.n


def skewed_tokens(total: int, experts: int, seed: int = 0) -> list[int]:
    """Tokens per expert summing to `total` (module docstring, exactly)."""
    rng = random.Random(seed)
    weights = [0.0 if e % 4 == 3 else 1.0 / (e + 1) ** 1.2 for e in range(experts)]
    rng.shuffle(weights)
    whole = sum(weights)
    shares = [total * w / whole for w in weights]
    tokens = [math.floor(x) for x in shares]
    left = total - sum(tokens)
    by_fraction = sorted(range(experts), key=lambda e: (-(shares[e] - tokens[e]), e))
    for e in by_fraction[:left]:
        tokens[e] += 1
    return tokens


def attention_cases() -> list[AttentionCase]:
    return [AttentionCase(bh, s, d, which, dtype) for dtype in ("float16", "bfloat16") for which in ("qk", "pv")
            for bh in ATTENTION_BH for s in ATTENTION_S for d in ATTENTION_D]


def moe_cases() -> list[MoeCase]:
    return [MoeCase(e, k, n, t) for e in MOE_EXPERTS for k, n in MOE_KN for t in MOE_TOKENS]


@dataclass
class BatchedRow:
    label: str
    flops: int
    anchor: str
    rel_err: float | None = None
    timings: dict[str, dict[str, TimingStats]] = field(default_factory=dict)   # mode -> impl -> stats
    error: str | None = None
    kernel: str | None = None      # what asmgemm ran (last_launch(): kernel and its launch-mode switches)

    def ratio(self, mode: str = "call") -> float | None:
        """asmgemm's speed over the anchor's (> 1: faster) in this timing mode."""
        t = self.timings.get(mode, {})
        if "asmgemm" not in t or self.anchor not in t:
            return None
        return t[self.anchor].median_ms / t["asmgemm"].median_ms


# batches (attention) or rows (moe) compared in float64: the largest attention output is 17 GB in
# fp16, twice that in float64, so the check reads a leading part of it
CHECK_BATCHES = 4
CHECK_ROWS = 4096


def _rel_err(torch, got, want) -> float:
    """||got - want|| / ||want|| in float64 over the leading batches (3-D) or rows (2-D)."""
    part = CHECK_BATCHES if got.dim() == 3 else CHECK_ROWS
    got, want = got[:part].double(), want[:part].double()
    return float(torch.linalg.norm(got - want) / torch.linalg.norm(want))


def attention_calls(torch, case: AttentionCase):
    """({impl: call}, (asmgemm's output call, the anchor's)) for one attention case. Both allocate
    their output each call, as torch.matmul does."""
    dt = getattr(torch, case.dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    if case.which == "qk":
        x = torch.randn(case.bh, case.s, case.d, device="cuda", generator=g).to(dt)
        y = torch.randn(case.bh, case.s, case.d, device="cuda", generator=g).to(dt)
        ours = lambda: runtime_gemm.gemm(x, y, trans_b=True)                       # noqa: E731
        theirs = lambda: torch.matmul(x, y.transpose(1, 2))                    # noqa: E731
    else:
        # P: rows of a softmax, drawn in its own dtype (bh 512 x 4096^2 is 17 GB in fp16, 34 in fp32)
        x = torch.rand(case.bh, case.s, case.s, device="cuda", generator=g, dtype=dt).div_(case.s)
        y = torch.randn(case.bh, case.s, case.d, device="cuda", generator=g).to(dt)
        ours = lambda: runtime_gemm.gemm(x, y)                                      # noqa: E731
        theirs = lambda: torch.matmul(x, y)                                    # noqa: E731
    return {"asmgemm": ours, "torch": theirs}, (ours, theirs)


def grouped_mm_runs(torch) -> bool:
    """Whether this torch has torch._grouped_mm and it runs here (a bf16 call on this device)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(2, 64, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        torch._grouped_mm(a, b, offs=torch.tensor([16, 32], device="cuda", dtype=torch.int32))
        return True
    except (RuntimeError, TypeError):
        return False


def moe_calls(torch, case: MoeCase, anchor: str):
    """({impl: call}, (asmgemm's output call, the anchor's)) for one grouped case."""
    dt = getattr(torch, case.dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    tokens = case.tokens
    a = torch.randn(case.total, case.k, device="cuda", generator=g).to(dt)
    w = (torch.randn(case.experts, case.n, case.k, device="cuda", generator=g) * case.k ** -0.5).to(dt)
    b = w.transpose(1, 2)                                  # (E, K, N) view of (E, N, K) weights
    offs = torch.tensor(tokens, device="cuda").cumsum(0).to(torch.int32)
    ours = lambda: runtime_grouped.grouped_gemm(a, b, offs)                             # noqa: E731
    if anchor == "torch._grouped_mm":
        theirs = lambda: torch._grouped_mm(a, b, offs=offs)                     # noqa: E731
    else:
        bounds = [0]
        for t in tokens:
            bounds.append(bounds[-1] + t)                  # host offsets: the loop pays no device read

        def theirs():
            y = torch.empty(case.total, case.n, device="cuda", dtype=dt)
            for e in range(case.experts):
                if bounds[e + 1] > bounds[e]:
                    torch.matmul(a[bounds[e]:bounds[e + 1]], b[e], out=y[bounds[e]:bounds[e + 1]])
            return y
    return {"asmgemm": ours, anchor: theirs}, (ours, theirs)


# the switches that say which launch mode and tile ran (last_launch()["params"])
SHOWN_PARAMS = ("BATCHED", "GROUPED", "BN", "CONSUMERS", "CLUSTER_N")


def ran_kernel() -> str | None:
    """asmgemm's latest launch in a few words: its kernel and SHOWN_PARAMS (so a row says whether
    the wgmma kernel or the portable one ran it)."""
    ran = runtime_gemm.last_launch()
    if not ran:
        return None
    params = ran.get("params") or {}
    return " ".join([ran["kernel"]] + [f"{k}={params[k]}" for k in SHOWN_PARAMS if k in params])


def run_set(name: str, reps: int = 20, flush: bool = True, cases=None, log=print,
            loop_calls: int = LOOP_CALLS) -> list[BatchedRow]:
    """Time every case of set `name` ("attention" or "moe"; `cases`: a subset) against its anchor
    (loop_calls: calls per `loop` measurement, 0 for none; the largest attention cases take
    milliseconds a call)."""
    import cupy
    import torch
    if name not in SETS:
        raise ValueError(f"unknown set {name!r}: {', '.join(SETS)}")
    flusher = L2Flusher() if flush else None
    pre_roll = make_pre_roll(True)
    anchor = "torch"
    if name == "moe":
        anchor = "torch._grouped_mm" if grouped_mm_runs(torch) else "torch.matmul loop"
        log(f"moe anchor: {anchor}")
    rows = []
    for case in cases if cases is not None else (attention_cases() if name == "attention" else moe_cases()):
        row = BatchedRow(case.label, case.flops, anchor)
        made = fns = ours = theirs = None       # released before the next case's operands are made
        try:
            made = attention_calls(torch, case) if name == "attention" else moe_calls(torch, case, anchor)
            fns, (ours, theirs) = made
            row.rel_err = _rel_err(torch, ours(), theirs())
            row.kernel = ran_kernel()
            row.timings = time_modes(fns, reps, flush=flusher, pre_roll=pre_roll, loop_calls=loop_calls)
        except Exception as exc:         # a row that fails says why; the set goes on
            row.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        rows.append(row)
        shown = " ".join(f"{m} {row.ratio(m):.2f}x" for m in MODES if row.ratio(m)) or row.error
        log(f"{row.label:52s} err {row.rel_err if row.rel_err is not None else float('nan'):.1e}  {shown}"
            + (f"  [{row.kernel}]" if row.kernel else ""))
        del made, fns, ours, theirs
        torch.cuda.empty_cache()
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def summary(rows: list[BatchedRow], mode: str = "call") -> dict:
    """Geometric mean of asmgemm / anchor speed in `mode`, the lowest, and the rows under 0.85x."""
    ratios = [(r.ratio(mode), r.label) for r in rows if r.ratio(mode)]
    if not ratios:
        return {"mode": mode, "rows": 0}
    geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
    return {"mode": mode, "rows": len(ratios), "geomean": geo, "min": min(ratios),
            "under_0.85": [label for x, label in ratios if x < 0.85], "failed": [r.label for r in rows if r.error]}



def report(name: str, rows: list[BatchedRow]) -> dict:
    """The set's JSON document: its anchor, the summary per timing mode and each row's error,
    ratios and median times (what `asmgemm bench --shapes attention|moe --json` and
    tools/batched_bench.py write)."""
    return {"set": name, "anchor": rows[0].anchor if rows else None,
            "summary": {mode: summary(rows, mode) for mode in MODES},
            "rows": [{"label": r.label, "anchor": r.anchor, "rel_err": r.rel_err, "error": r.error, "kernel": r.kernel,
                      "ratio": {m: r.ratio(m) for m in MODES},
                      "ms": {m: {impl: s.median_ms for impl, s in t.items()} for m, t in r.timings.items()}}
                     for r in rows]}


def summary_lines(doc: dict) -> list[str]:
    """A line per timing mode of a report's summary (modes without a ratio left out)."""
    return [f"{mode}: geomean {s['geomean']:.3f}x {doc['anchor']} over {s['rows']} rows, lowest {s['min'][0]:.3f}x "
            f"({s['min'][1]}), {len(s['under_0.85'])} under 0.85x, {len(s['failed'])} failed"
            for mode, s in doc["summary"].items() if s.get("rows")]
