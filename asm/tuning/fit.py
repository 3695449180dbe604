"""Fit the cost model (runtime/cost_model.py) to sweep samples (sweep.py), check it on calls held
out of the fit, and make the GPU's dispatch database (runtime/dispatch_db.py).

Per configuration, c (per launch), a (per block), b (per K step), f and g (a lone block's shares of
a wave for its K steps and its fixed part) minimise the squared relative error of the modelled GPU
time over its unsplit samples: f and g on a grid of 0.05, c, a and b by least squares for each pair
(all kept >= 0), r from the driver's occupancy; then each load variant's factor on the K steps
(_variant_factors), and c, a, b, f, g again with it, VARIANT_ROUNDS times. Then, with those fixed,
the reduce kernel's fixed cost and bandwidth from the residuals of the split samples, the clusters'
extra per block-wave from the clustered ones, and the host costs from the measured host time of a
call; and each configuration's load rate (cost_model's load floor): the largest loaded_bytes / GPU
time over its samples, where it has LOAD_RATE_MIN_SAMPLES of them.
Pure Python: no GPU, no numpy."""
from __future__ import annotations

import math
import statistics
import zlib
from collections import defaultdict
from dataclasses import replace

from ..errors import AsmError
from ..kernel_spec import DTYPE_ITEMSIZE, get_spec
from ..runtime.catalog import Candidate, label_parts
from ..runtime.cost_model import (RETIRED_VARIANT, ConfigFit, DeviceModel, cluster_key, estimate, loaded_bytes,
                                  neighbour_factors, rank_key, residual_entry, split_host_s, variant_layout,
                                  variant_of)
from ..runtime.dispatch_db import FORMAT, exact_key, model_from, model_to_json
from ..runtime.plan import fresh_plan
from ..runtime.split_k import hybrid_cluster

ALONE_GRID = [i / 20 for i in range(21)]
HELD_OUT_SHARE = 4          # one call in 4 is held out of the fit (by a hash of its key: stable)
WITHIN = 0.05               # the model's pick "within 5%" of the best measured
# a configuration's load rate is its fastest sample's: with fewer samples than this the fastest
# seen may be far from what it can do, and a floor that binds too early costs more than none
LOAD_RATE_MIN_SAMPLES = 20


def _candidate(s: dict) -> Candidate:
    fam = get_spec(s["family"])
    entry = next((e for e in fam.configs if e.name == s["config"]), None)
    if entry is None:
        raise AsmError(f"sweep sample names configuration '{s['config']}', which {s['family']}'s catalog no "
                       "longer has: sweep again")
    return Candidate(s["family"], entry.name, entry.kernel, entry.set, entry.tile_for(s["layout"][1] == "t"),
                     int(s["splits"]), s["reduce"], bool(s.get("swap", False)), _cluster(s), entry.cluster)


def _cluster(s: dict) -> int:
    """A "cluster+in_kernel" sample's cluster size, as its label names it (t64x64_w32x32/s12c4);
    hybrid_cluster's choice for a label without one. 0 for every other reduce (Candidate.cluster)."""
    if s.get("reduce") != "cluster+in_kernel":
        return 0
    size = label_parts(s["label"]).cluster
    return size if size is not None else hybrid_cluster(int(s["splits"]))


def _variant(s: dict) -> str:
    """The sample's load variant (recorded by the sweep; for older samples, that of fresh operands)."""
    if s.get("variant"):
        return s["variant"]
    size = DTYPE_ITEMSIZE[get_spec(s["family"]).dtypes.a]
    s["variant"] = variant_of(s["layout"], fresh_plan(s["m"], s["n"], s["k"], s["layout"], size).call_values)
    return s["variant"]


def _family_sizes(family: str) -> tuple[str, int, int]:
    """(dtype, C's element size, A's and B's) of a family, as dispatch prices its calls."""
    spec = get_spec(family)
    return spec.dtypes.a, DTYPE_ITEMSIZE[spec.dtypes.c], DTYPE_ITEMSIZE[spec.dtypes.a]


def _sizes(s: dict) -> tuple[str, int, int]:
    """_family_sizes of the sample's family (an hgemm_mma sample priced as fp32 doubled its DRAM
    floor and took the fp32 prior's rates)."""
    return _family_sizes(s["family"])


def _call_key(s: dict) -> str:
    """The call a sample timed (recorded by the sweep; older samples: their own launch's sizes)."""
    return s.get("call") or exact_key(s["family"], s["layout"], s["m"], s["n"], s["k"], True)


def _call_sizes(s: dict) -> tuple[str, int, int]:
    """(load variant, M, N) of the call a sample timed, as the neighbours are keyed."""
    if s.get("call"):
        m, n, _ = (int(x) for x in s["call"].split("|")[2].split("x"))
        return s["call_variant"], m, n
    return _variant(s), s["m"], s["n"]


def _held_out(key: str) -> bool:
    return zlib.crc32(key.encode()) % HELD_OUT_SHARE == 0


def _solve2(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of y = a x1 + b x2 over (x1, x2, y) rows, a, b >= 0."""
    s11 = sum(x1 * x1 for x1, _, _ in rows)
    s22 = sum(x2 * x2 for _, x2, _ in rows)
    s12 = sum(x1 * x2 for x1, x2, _ in rows)
    s1y = sum(x1 * y for x1, _, y in rows)
    s2y = sum(x2 * y for _, x2, y in rows)
    syy = sum(y * y for _, _, y in rows)
    (a, b), _ = _nonneg_least_squares([[s11, s12], [s12, s22]], [s1y, s2y], syy)
    return a, b


def _wave_terms(cand: Candidate, s: dict, dm: DeviceModel, r: int, variant_blocks: dict) -> tuple[float, float, int]:
    """(c0, c1, K steps) of one sample: the modelled compute time is a (c0 + c1 g) + b steps v (c0 +
    c1 f) for a block's fixed time a, its step time b, the variant's factor v and the lone block's
    shares g and f (cost_model.estimate: c0 the full waves plus the last one's share of an SM, c1
    what a lone block adds on top of that share)."""
    def compute(alone: float):
        unit = ConfigFit(1.0, 0.0, alone, r, variant_blocks=variant_blocks)
        # (the unit fit has no variant factors: the variant only picks the build's blocks per SM)
        return estimate(cand, s["m"], s["n"], s["k"], _with(dm, s, unit), *_sizes(s), _variant(s))
    e0, e1 = compute(0.0), compute(1.0)
    return e0.compute_s, e1.compute_s - e0.compute_s, e0.steps


def _best_fit(terms: list[tuple[float, float, int, float, float, float]]) -> tuple[float, float, float, float, float]:
    """(c, a, b, f, g) minimising the weighted squared relative error of the modelled compute time
    c + a (c0 + c1 g) + b steps v (c0 + c1 f) over the samples' (c0, c1, steps, scale, step_scale,
    weight) (_wave_terms; scale = weight / measured time, step_scale = scale x v, the variant's
    factor), with f and g each on ALONE_GRID and c, a, b >= 0. Every row
    is linear in f and in g, so the sums of products the least squares needs are summed once and
    each (f, g) pair costs O(1)."""
    sums: dict[str, float] = defaultdict(float)
    for c0, c1, steps, scale, step_scale, w in terms:
        x = {"o": scale, "p": c0 * scale, "P": c1 * scale, "q": c0 * step_scale * steps,
             "Q": c1 * step_scale * steps, "y": w}
        for u, v in _PRODUCTS:
            sums[u + v] += x[u] * x[v]
    best = None
    for g in ALONE_GRID:
        s11 = sums["pp"] + 2 * g * sums["pP"] + g * g * sums["PP"]          # x1 = p + g P
        s1y = sums["py"] + g * sums["Py"]
        s01 = sums["op"] + g * sums["oP"]
        for f in ALONE_GRID:
            s22 = sums["qq"] + 2 * f * sums["qQ"] + f * f * sums["QQ"]      # x2 = q + f Q
            s12 = sums["pq"] + f * sums["pQ"] + g * sums["Pq"] + g * f * sums["PQ"]
            s2y = sums["qy"] + f * sums["Qy"]
            s02 = sums["oq"] + f * sums["oQ"]
            gram = [[sums["oo"], s01, s02], [s01, s11, s12], [s02, s12, s22]]
            coef, err = _nonneg_least_squares(gram, [sums["oy"], s1y, s2y], sums["yy"])
            if best is None or err < best[0]:
                best = (err, *coef, f, g)
    return best[1:]


def _nonneg_least_squares(gram: list[list[float]], xy: list[float], yy: float) -> tuple[list[float], float]:
    """(x >= 0, the squared error) minimising |A x - y|^2 from its normal equations' sums (gram =
    A^T A, xy = A^T y, yy = y^T y): the best of the unconstrained solutions on each subset of the
    variables (the others at 0) that come out non-negative (2^n subsets: n is 2 or 3 here)."""
    n = len(xy)
    best = ([0.0] * n, yy)
    for mask in range(1, 1 << n):
        idx = [i for i in range(n) if mask >> i & 1]
        sol = _solve_linear([[gram[i][j] for j in idx] for i in idx], [xy[i] for i in idx])
        if sol is None or min(sol) < 0:
            continue
        x = [0.0] * n
        for i, v in zip(idx, sol):
            x[i] = v
        err = yy - 2 * sum(x[i] * xy[i] for i in range(n)) + sum(x[i] * x[j] * gram[i][j]
                                                                for i in range(n) for j in range(n))
        if err < best[1]:
            best = (x, err)
    return best


def _solve_linear(m: list[list[float]], v: list[float]) -> list[float] | None:
    """m x = v by Gaussian elimination with partial pivoting; None where m is (nearly) singular."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    scale = max((abs(a[i][i]) for i in range(n)), default=0.0)
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[piv][c]) <= 1e-12 * max(scale, 1e-300):
            return None
        a[c], a[piv] = a[piv], a[c]
        for r in range(c + 1, n):
            k = a[r][c] / a[c][c]
            for j in range(c, n + 1):
                a[r][j] -= k * a[c][j]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][j] * x[j] for j in range(r + 1, n))) / a[r][r]
    return x


_PRODUCTS = [("o", "o"), ("o", "p"), ("o", "P"), ("o", "q"), ("o", "Q"), ("o", "y"),
             ("p", "p"), ("p", "P"), ("P", "P"), ("q", "q"), ("q", "Q"), ("Q", "Q"), ("p", "q"), ("p", "Q"),
             ("P", "q"), ("P", "Q"), ("p", "y"), ("P", "y"), ("q", "y"), ("Q", "y"), ("y", "y")]


VARIANT_PRIOR = 3           # a variant's factor is shrunk toward its layout's as if 3 more samples had its residual
VARIANT_ROUNDS = 3
VARIANT_CLAMP = 4.0         # a sample's implied step factor is kept within [1/4, 4] (a noisy sample's bound)


WAVE_REGIMES = (1.0, 4.0)    # tiles per block slot: under one wave, a few waves, many waves
REGIME_BALANCE = 0.5         # 0: every sample alike; 1: every regime alike (see regime_weights)


def regime_weights(rows: list[dict], dm: DeviceModel, r: int) -> list[float]:
    """A weight per sample that moves each wave regime (WAVE_REGIMES) of a configuration's samples
    toward the same total (REGIME_BALANCE: the power of the full balancing weight), so the regime a
    random sweep draws most (part of one wave: small shapes) does not decide alone the step time of
    the full waves large shapes run. On the H100's sweeps (docs/log/dispatch.md, fourth session):
    hgemm_mma's pick within 5% of the best on 13 of 32 large odd calls unweighted, 27 balanced
    fully, 26 at 0.5, where sgemm's held-out share keeps 0.885 (fully: 0.867; unweighted 0.894)."""
    def regime(s: dict) -> int:
        bm, bn, _ = _candidate(s).tile
        waves = math.ceil(s["m"] / bm) * math.ceil(s["n"] / bn) / (dm.sms * r)
        return sum(waves >= edge for edge in WAVE_REGIMES)
    regimes = [regime(s) for s in rows]
    counts = {g: regimes.count(g) for g in set(regimes)}
    return [(len(rows) / (len(counts) * counts[g])) ** REGIME_BALANCE for g in regimes]


def _variant_factors(logs: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Per load variant, the K steps' factor: the mean log of each sample's implied factor
    (weighted by the share of its time the steps take: a sample spent in its fixed part says little
    about how its steps load) shrunk toward its layout's (as if VARIANT_PRIOR more samples of the
    mean weight had the layout's), the layout's shrunk toward 0 likewise; the layouts' own factors
    under their names ('nn'), for the variants the sweep never saw (ConfigFit.factor). Which operand
    is transposed sets how a kernel reads it (sgemm_skinny's K-major B, the transposed C of its ct
    builds) more than the alignment does: skinny_r4's nn variants ran 1.19-2.08x its fitted block
    time on the H100, its nt ones 0.91-0.99x. logs: variant -> (weight, log factor) per sample."""
    def shrunk(x: list[tuple[float, float]], prior: float) -> float:
        total = sum(w for w, _ in x)
        mean_w = total / len(x)
        return (sum(w * v for w, v in x) + VARIANT_PRIOR * mean_w * prior) / (total + VARIANT_PRIOR * mean_w)
    by_layout: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for v, x in logs.items():
        by_layout[variant_layout(v)].extend(x)
    layouts = {lay: shrunk(x, 0.0) for lay, x in by_layout.items()}
    out = {lay: math.exp(mu) for lay, mu in layouts.items()}
    for v, x in logs.items():
        out[v] = math.exp(shrunk(x, layouts[variant_layout(v)]))
    return out


def _fit_config(rows: list[dict], dm: DeviceModel) -> ConfigFit:
    """a, b, f and g of one configuration (module docstring), each wave regime weighted alike
    (regime_weights), then a factor per load variant on the K steps from what each sample implies,
    refitted VARIANT_ROUNDS times."""
    r = statistics.mode([int(s["blocks_per_sm"]) for s in rows if s.get("blocks_per_sm")] or [1])
    by_variant: dict[str, list[int]] = defaultdict(list)
    for s in rows:
        if s.get("blocks_per_sm"):
            by_variant[_variant(s)].append(int(s["blocks_per_sm"]))
    modes = {v: statistics.mode(b) for v, b in sorted(by_variant.items())}
    rv = {v: b for v, b in modes.items() if b != r}
    weights = [math.sqrt(w) for w in regime_weights(rows, dm, r)]     # on squared errors
    terms = [_wave_terms(_candidate(s), s, dm, r, rv) for s in rows]
    variants: dict[str, float] = {}
    fit = None
    for _ in range(VARIANT_ROUNDS):
        c, a, b, f, g = _best_fit([(c0, c1, steps, w / (s["gpu_ms"] * 1e-3),
                                    w * variants.get(_variant(s), 1.0) / (s["gpu_ms"] * 1e-3), w)
                                   for (c0, c1, steps), s, w in zip(terms, rows, weights)])
        fit = ConfigFit(a, b, f, r, len(rows), variant_blocks=rv, alone_block=g, launch_fixed_s=c)
        # each sample's implied step factor: (measured - fixed part) / step part
        logs: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for s, (c0, c1, steps) in zip(rows, terms):
            y = s["gpu_ms"] * 1e-3
            fixed, stepping = c + a * (c0 + c1 * g), b * steps * (c0 + c1 * f)
            if stepping > 0:
                implied = min(VARIANT_CLAMP, max(1.0 / VARIANT_CLAMP, (y - fixed) / stepping))
                logs[_variant(s)].append((stepping / y, math.log(implied)))
        variants = _variant_factors(logs)
    fit = replace(fit, variants=dict(sorted(variants.items())))
    # centred: least squares of relative errors leaves the estimates low on average where the
    # samples scatter (an estimate of 1.5x the measured time costs 0.5^2, one of 1/1.5 of it only
    # 0.33^2); the path model compares them with the TMA kernel's time as they are, so c, a and b
    # are scaled by e^(mean log residual)
    residuals = []
    for s in rows:
        e = estimate(_candidate(s), s["m"], s["n"], s["k"], _with(dm, s, fit), *_sizes(s), _variant(s))
        if e.compute_s > 0:
            residuals.append(math.log(s["gpu_ms"] * 1e-3 / e.compute_s))
    centre = math.exp(sum(residuals) / len(residuals)) if residuals else 1.0
    return replace(fit, block_s=fit.block_s * centre, step_s=fit.step_s * centre,
                   launch_fixed_s=fit.launch_fixed_s * centre)


def _with(dm: DeviceModel, s: dict, fit: ConfigFit) -> DeviceModel:
    """dm with `fit` as the sample's configuration's coefficients."""
    return DeviceModel(dm.gpu, dm.sms, dm.clock_hz, dm.dram_bytes_per_s,
                       configs={f"{s['kernel']}:{s['config']}": fit}, cluster_slots=dm.cluster_slots)


def fit_model(doc: dict, samples: list[dict] | None = None) -> DeviceModel:
    """The DeviceModel of the sweep document's GPU fitted to `samples` (default: all of them)."""
    samples = [s for s in (doc["samples"] if samples is None else samples) if "error" not in s]
    dm = DeviceModel(doc["gpu"], int(doc["sms"]), float(doc["clock_hz"]) or 1.5e9,
                     float(doc["dram_bytes_per_s"]) or 1e12, source=f"fitted to a sweep of {doc['gpu']}")
    for s in samples:
        # (a split's clusters, or an entry's own: tiles sharing loads, blocks splitting K)
        size = _candidate(s).cluster_size if s.get("clusters_at_once") and s.get("blocks_per_sm") else 0
        if size > 1:
            key = cluster_key(size, int(s["blocks_per_sm"]))
            dm.cluster_slots[key] = max(dm.cluster_slots.get(key, 0), int(s["clusters_at_once"]) * size)
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        if s["splits"] == 1:
            groups[f"{s['kernel']}:{s['config']}"].append(s)
    for key, rows in groups.items():
        dm.configs[key] = _fit_config(rows, dm)
    for key, rate in load_rates(samples).items():
        if key in dm.configs:
            dm.configs[key] = replace(dm.configs[key], load_bytes_per_s=rate)
    # the reduce kernel: residual = fixed + bytes / bandwidth
    resid = []
    for s in samples:
        if s.get("reduce") != "kernel" or f"{s['kernel']}:{s['config']}" not in dm.configs:
            continue
        e = estimate(_candidate(s), s["m"], s["n"], s["k"], _no_split_costs(dm), *_sizes(s), _variant(s))
        y = s["gpu_ms"] * 1e-3
        moved = s["splits"] * s["m"] * s["n"] * 8 + s["m"] * s["n"] * 4
        # (no split costs: gpu_s is the partial pass's own time, its floors included)
        resid.append((1.0 / y, moved / y, (y - e.gpu_s) / y))
    if resid:
        fixed, per_byte = _solve2(resid)
        dm.reduce_fixed_s = fixed
        dm.reduce_bytes_per_s = 1.0 / per_byte if per_byte > 0 else 0.0
    extra = []
    for s in samples:
        if s.get("reduce") != "cluster" or f"{s['kernel']}:{s['config']}" not in dm.configs:
            continue
        e = estimate(_candidate(s), s["m"], s["n"], s["k"], _no_split_costs(dm), *_sizes(s), _variant(s))
        extra.append((s["gpu_ms"] * 1e-3 - e.gpu_s) / max(1, math.ceil(e.tiles / e.slots)))
    if extra:
        dm.cluster_block_s = max(0.0, statistics.median(extra))
    fixup = _fit_fixup_fixed(dm, samples)
    if fixup is not None:
        dm.fixup_fixed_s = fixup
    unsplit = [s["host_us"] for s in samples if s["splits"] == 1 and s.get("host_us")]
    split = [s["host_us"] for s in samples if s.get("reduce") == "kernel" and s.get("host_us")]
    scratch = [s["host_us"] for s in samples if s.get("reduce") in ("in_kernel", "cluster+in_kernel")
               and s.get("host_us")]
    if unsplit:
        dm.host_s = statistics.median(unsplit) * 1e-6
    if split and unsplit:
        dm.launch_s = max(0.0, statistics.median(split) - statistics.median(unsplit)) * 1e-6
    if scratch and unsplit:
        dm.scratch_s = max(0.0, statistics.median(scratch) - statistics.median(unsplit)) * 1e-6
    dm.residuals = _residuals(dm, samples)
    return dm


def _fit_fixup_fixed(dm: DeviceModel, samples: list[dict]) -> float | None:
    """The in-kernel sums' fixed hand-off (DeviceModel.fixup_fixed_s), from calls that timed a
    "cluster+in_kernel" candidate and the same configuration's cluster split (the largest S such):
    per pair, how much more the hybrid took than the model's difference between the two without the
    hand-off, over hybrids whose blocks fit in one wave (past that the waves' terms, not the
    hand-off, decide the difference); the median, not below 0. None where no call has such a pair."""
    bare = replace(dm, fixup_fixed_s=0.0)
    extra = []
    for rows in _by_call(samples).values():
        for h in rows:
            if h.get("reduce") != "cluster+in_kernel" or f"{h['kernel']}:{h['config']}" not in dm.configs:
                continue
            pairs = [c for c in rows if c.get("reduce") == "cluster" and c["config"] == h["config"]]
            if not pairs:
                continue
            c = max(pairs, key=lambda c: int(c["splits"]))
            eh, ec = (estimate(_candidate(x), x["m"], x["n"], x["k"], bare, *_sizes(x), _variant(x)) for x in (h, c))
            if eh.full_waves == 0:
                extra.append((h["gpu_ms"] - c["gpu_ms"]) * 1e-3 - (eh.gpu_s - ec.gpu_s))
    return max(0.0, statistics.median(extra)) if extra else None


def load_rates(samples: list[dict]) -> dict[str, float]:
    """"kernel:config" -> the largest rate its blocks were seen to load at (cost_model.loaded_bytes
    over the sample's GPU time, split samples included: they load the same bytes), for each
    configuration with LOAD_RATE_MIN_SAMPLES samples or more."""
    rates: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        if "error" in s or not s.get("gpu_ms"):
            continue
        rates[f"{s['kernel']}:{s['config']}"].append(
            loaded_bytes(_candidate(s), s["m"], s["n"], s["k"], _sizes(s)[2]) / (s["gpu_ms"] * 1e-3))
    return {key: max(r) for key, r in rates.items() if len(r) >= LOAD_RATE_MIN_SAMPLES}


def _residuals(dm: DeviceModel, samples: list[dict]) -> list[dict]:
    """Per measured call: log(measured GPU time / modelled) of each candidate timed there, and the
    floor that bound the model for those a floor bound ("dram" or "load"; the neighbours
    cost_model.rank corrects with: each ratio scales the term it was measured against)."""
    out = []
    for key, rows in _by_call(samples).items():
        s0 = rows[0]
        variant, m, n = _call_sizes(s0)
        res, floor = {}, {}
        for s in rows:
            e = estimate(_candidate(s), s["m"], s["n"], s["k"], dm, *_sizes(s), _variant(s))
            ratio, bound = residual_entry(e, s["gpu_ms"] * 1e-3)
            res[s["label"]] = round(ratio, 4)
            floor.pop(s["label"], None)
            if bound:
                floor[s["label"]] = bound
        out.append({"family": s0["family"], "variant": variant, "m": m, "n": n, "k": s0["k"], "plain": True,
                    "gpu_res": res, **({"floor": dict(sorted(floor.items()))} if floor else {})})
    return out


def _no_split_costs(dm: DeviceModel) -> DeviceModel:
    out = DeviceModel(dm.gpu, dm.sms, dm.clock_hz, dm.dram_bytes_per_s, configs=dm.configs,
                      cluster_slots=dm.cluster_slots)
    out.reduce_fixed_s = out.cluster_block_s = 0.0
    out.reduce_bytes_per_s = float("inf")
    return out


def _by_call(samples: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        if "error" not in s:
            out[_call_key(s)].append(s)
    return out


def _call_ms(s: dict, dm: DeviceModel) -> float:
    """What a caller waits for: the sweep's GPU time and the model's host time of the call (the
    medians over the sweep, plus a split's host extra: cost_model.split_host_s). Not each sample's own host time:
    one call timed on the host varies by +-5 us, which would pick the winners of small calls."""
    return s["gpu_ms"] + (dm.host_s + split_host_s(dm, s.get("reduce"))) * 1e3


def evaluate(dm: DeviceModel, samples: list[dict], dtype: str = "float32", c_bytes: int = 4,
             ab_bytes: int = 4) -> dict:
    """How the model's pick among each call's timed candidates compares with the best measured."""
    calls = _by_call(samples)
    ratios, misses = [], []
    for key, rows in calls.items():
        best = min(rows, key=lambda s: _call_ms(s, dm))
        s0 = rows[0]
        variant, m, n = _call_sizes(s0)
        factors = neighbour_factors(dm, s0["family"], variant, m, n, s0["k"], True)
        ests = [(factors.applied(estimate(_candidate(s), s["m"], s["n"], s["k"], dm, dtype, c_bytes, ab_bytes,
                                          _variant(s))), s) for s in rows]
        pick = min(ests, key=lambda t: rank_key(t[0]))[1]
        ratio = _call_ms(pick, dm) / _call_ms(best, dm)
        ratios.append(ratio)
        if ratio > 1 + WITHIN:
            misses.append({"call": key, "pick": pick["label"], "best": best["label"], "slower": round(ratio - 1, 4)})
    n = len(ratios)
    return {"calls": n, "within_5pct": sum(r <= 1 + WITHIN for r in ratios),
            "share_within_5pct": round(sum(r <= 1 + WITHIN for r in ratios) / n, 4) if n else None,
            "geomean_pick_over_best": round(math.exp(sum(math.log(r) for r in ratios) / n), 4) if n else None,
            "worst": sorted(misses, key=lambda m: -m["slower"])[:10]}


def usable_samples(docs: list[dict]) -> list[dict]:
    """The samples of sweep documents that a fit takes: none of a load variant the kernels no
    longer make (it timed code that no call runs now)."""
    every = [s for d in docs for s in d["samples"]]
    return [s for s in every if not RETIRED_VARIANT.search(_variant(s))
            and not RETIRED_VARIANT.search(s.get("call_variant") or "")]


def rebuild_residuals(db: dict, docs: list[dict]) -> tuple[dict, dict]:
    """(the database with its neighbours' residuals recomputed from the sweeps it was fitted on, at
    its own coefficients, none refitted; a report): for a database written before the residuals'
    present form (cost_model.residual_entry), or whose coefficients were kept when the fit's code
    moved on (the H100's: docs/log/dispatch.md). Every call of the stored residuals must be in the
    sweeps, and where the stored ones are of the earlier form (call times, "res") each must come
    out as stored, so that sweeps of another fit cannot pass for its own."""
    samples = usable_samples(docs)
    stored = {(r["family"], r["variant"], r["m"], r["n"], r["k"]): r for r in db["model"].get("residuals", [])}
    rebuilt, checked, worst = [], 0, 0.0
    for fam in db.get("families", []):
        dm = model_from(db, "rebuild", None, fam)
        for rows in _by_call([s for s in samples if s["family"] == fam]).values():
            s0 = rows[0]
            variant, m, n = _call_sizes(s0)
            old = stored.pop((fam, variant, m, n, s0["k"]), None)
            if old is None:
                raise AsmError(f"the sweeps time {fam} {variant} {m}x{n}x{s0['k']}, a call the database was not "
                               "fitted on: give the sweeps it was fitted on")
            if "res" in old:
                # the earlier form: log(call time measured / modelled), host time the model's; a
                # label timed twice (a call in two sweeps) keeps its last sample's, as _residuals does
                earlier = {s["label"]: math.log(_call_ms(s, dm) * 1e-3 / estimate(
                    _candidate(s), s["m"], s["n"], s["k"], dm, *_sizes(s), _variant(s)).call_s) for s in rows}
                for label, value in earlier.items():
                    worst = max(worst, abs(old["res"].get(label, math.inf) - value))
                    checked += 1
            rebuilt.extend(_residuals(dm, rows))
    if stored:
        family, variant, m, n, k = next(iter(stored))
        raise AsmError(f"{len(stored)} of the database's calls are in none of the sweeps (e.g. {family} {variant} "
                       f"{m}x{n}x{k}): give every sweep it was fitted on")
    if worst > 2e-4:
        raise AsmError(f"the sweeps do not give the database's stored residuals (off by up to {worst:.4g} in log): "
                       "they are not the samples these coefficients were fitted on")
    model = {**db["model"], "residuals": rebuilt}
    return {**db, "model": model}, {"calls": len(rebuilt), "residuals_checked": checked,
                                    "worst_log_difference": round(worst, 6)}


def make_database(docs: list[dict]) -> tuple[dict, dict]:
    """(the dispatch database, the fit report) from one GPU's sweep documents: the held-out check
    (fit on 3 of 4 calls, judged on the 4th), then the model refitted on every call, and the best
    measured configuration of each call as its exact hit."""
    gpus = {d["gpu"] for d in docs}
    if len(gpus) != 1:
        raise AsmError(f"the sweeps are of {len(gpus)} GPUs ({', '.join(sorted(gpus))}): fit one GPU at a time")
    doc = dict(docs[0])
    families = sorted({d["family"] for d in docs})
    every = [s for d in docs for s in d["samples"]]
    samples = usable_samples(docs)
    dtypes = {fam: _family_sizes(fam) for fam in families}
    train = [s for s in samples if not _held_out(_call_key(s))]
    test = [s for s in samples if _held_out(_call_key(s))]
    report = {"gpu": doc["gpu"], "families": families, "samples": len(samples), "retired": len(every) - len(samples),
              "errors": sum("error" in s for s in samples), "held_out": {}}
    for fam in families:
        fam_test = [s for s in test if s["family"] == fam]
        held = fit_model(doc, train)
        report["held_out"][fam] = evaluate(held, fam_test, *dtypes[fam])
    dm = fit_model(doc, samples)
    report["in_sample"] = {fam: evaluate(dm, [s for s in samples if s["family"] == fam], *dtypes[fam])
                           for fam in families}
    best = {key: min(rows, key=lambda s: _call_ms(s, dm))["label"] for key, rows in _by_call(samples).items()}
    db = {"format": FORMAT, "gpu": doc["gpu"], "target": doc["target"], "sms": doc["sms"],
          "clock_hz": doc["clock_hz"], "dram_bytes_per_s": doc["dram_bytes_per_s"], "families": families,
          "model": model_to_json(dm), "best": dict(sorted(best.items())),
          "fit": {"held_out": report["held_out"], "samples": len(samples)}}
    return db, report
