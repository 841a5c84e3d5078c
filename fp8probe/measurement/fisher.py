"""The fast sensitivity estimate: every row of the sweep scored from one pass with backward.

For a small perturbation δ of a unit's output y (δ = y_fp8 − y, the same FP8 arithmetic the exact sweep
applies: weights as vLLM holds them, inputs quantized per token / group / static scale), the mismatch of
the next-token distribution p_t it causes is, to second order,

    KL(q_t ‖ p_t) ≈ KL(p_t ‖ q_t) ≈ ½ E_{ŷ ~ p_t}[ (∇_δ log p_t(ŷ) · δ)² ]          (the Fisher quadratic form)

The expectation is over labels ŷ sampled from the student itself (the model's own Fisher, not the data's
empirical one). One backward pass of Σ_t log p_t(ŷ_t), with one sampled ŷ_t per response-predicting
position, gives the gradient g of every unit's output at every position at once; each unit's dot product
d[b, s] = g[b, s] · δ[b, s] is taken in a tensor hook as the gradient arrives (δ is computed there from the
unit's saved input, once per batch: no copy of the model). Four estimators of the sum of the per-token KLs
come out of the same passes, divided by the number of response tokens and label draws so that they sit on
the scale of the exact sweep's `kl_q_p` column (mean per response token):

    sequence   ½ Σ_b (Σ_s D[b, s])²             unbiased for the whole quadratic form, but the cross terms
                                                between label positions (zero in expectation) make one draw
                                                noisy
    window     ½ Σ_b Σ_w (Σ_{s in w} D[b, s])²  the sum over windows of WINDOW positions: keeps the cross
                                                terms between nearby positions, drops the distant ones (the
                                                default: the best Spearman and top-10 overlap per second on the
                                                embedded student and the tiny models, benchmarks/fast_vs_exact.py)
    position   ½ Σ_b Σ_s D[b, s]²               the window of one position
    element    ½ Σ g² δ²                        the diagonal (ModelOpt auto_quantize's gradient score)

where D = Σ d over what the row perturbs (a fused group's units, a layer's K and V after RoPE, every unit
for the whole-model rows), so a row's estimate is not the sum of its members'. More label draws
(`samples`, two by default) average the noise away at one backward pass each; δ is kept for the batch's
later draws instead of recomputed. The lm_head and softmax run once per batch, in chunks of rows
(mismatch.CHUNK_ROWS, so a 150k vocabulary never holds more than one chunk of logits), and every draw's gradient
at the final hidden states is formed there by hand (_head_grads: one shared matmul per chunk, no autograd through
the head); one backward per draw then carries it through the decoder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..core.numerics import amax, fake_quant, sqnr_db_from_energy
from ..core.progress import bar_interval
from ..core.schemes import KVCacheScheme, QuantSpec, Scheme
from .attention import kv_scales, observe_kv
from .calibration import calibrate
from .mismatch import CHUNK_ROWS
from .quantize import fp8_forwards
from .scales import Calibration, without_padding

ESTIMATORS = ("window", "sequence", "position", "element")
DEFAULT_ESTIMATOR = "window"
WINDOW = 16  # positions per window of the window estimator
DEFAULT_SAMPLES = 2  # label draws per position


@dataclass(frozen=True)
class Draws:
    """The estimate's label draws: `samples` per position (each one more backward pass), from `seed` (repeatable)."""

    samples: int = DEFAULT_SAMPLES
    seed: int = 0


def _quantization(rows) -> tuple[Scheme, KVCacheScheme]:
    """The scheme of the rows' FP8 units and the KV-cache scheme of their KV layers (one each: a sweep's plan)."""
    schemes = {r.perturbation.scheme for r in rows if r.perturbation.units}
    kvs = {r.perturbation.kv for r in rows if r.perturbation.kv_layers}
    if len(schemes) > 1 or len(kvs) > 1:
        raise ValueError("fisher_rows estimates rows of one scheme and one KV-cache scheme (a sweep's plan)")
    return (schemes.pop() if schemes else Scheme.from_name("FP8_DYNAMIC")), (kvs.pop() if kvs else KVCacheScheme())


@dataclass
class FisherResult:
    """Per row (by its unit name): the estimate of each estimator (mean per response token) and the SQNR of
    the perturbed outputs; `seconds` includes the calibration pass when one was needed."""

    estimates: dict[str, dict[str, float]]  # estimator -> row -> estimate
    sqnr_db: dict[str, float]
    num_tokens: int
    seconds: float
    calibration_seconds: float = 0.0
    calibration: Calibration | None = None  # the static scales it ran with (per sequence where it made them)

    def column(self, estimator: str = DEFAULT_ESTIMATOR) -> dict[str, float]:
        return self.estimates[estimator]


class _Sums:
    """Per-batch dot products per perturbed thing, and the energies for the SQNR."""

    def __init__(self):
        self.d: dict[str, torch.Tensor] = {}  # key -> [B, S] g·δ per position (this batch, this label draw)
        self.elem: dict[str, float] = {}  # key -> Σ g²δ² (this batch, this label draw)
        self.signal: dict[str, float] = {}
        self.noise: dict[str, float] = {}

    def add(self, key, d, elem):
        self.d[key] = self.d[key] + d if key in self.d else d
        self.elem[key] = self.elem.get(key, 0.0) + elem

    def energy(self, key, y, delta):
        self.signal[key] = self.signal.get(key, 0.0) + _sumsq(y.float())
        self.noise[key] = self.noise.get(key, 0.0) + _sumsq(delta)


def fisher_rows(
    student,
    rollouts,
    rows,
    draws: Draws = Draws(),
    *,
    batch_size: int = 8,
    calibration: Calibration | None = None,
    fused: bool = False,
    progress: bool = False,
) -> FisherResult:
    """The estimates of every row of sweep.plan_rows (anything with `.unit` and `.perturbation`; their units in one
    scheme, their KV layers in one KV-cache scheme).

    `draws`: the label draws per position and their seed. Static input scales need a Calibration: `calibration`, or
    one more forward over the rollouts first. A calibrated KV cache without one is scored at the end: K, V and their
    gradients wait on the CPU (in the model's dtype) until the pass has seen every batch and the K/V amax is known,
    which costs memory instead of a second forward. `fused`: quantize a fused group's units with their shared
    per-tensor scale (group rows) instead of each unit alone (unit rows); only the per-tensor FP8 scheme differs."""
    from tqdm.auto import tqdm

    model = student.model
    scheme, kv = _quantization(rows)
    samples, seed = draws.samples, draws.seed
    t0 = time.perf_counter()
    units = sorted({u for r in rows for u in r.perturbation.units})
    kv_layers = sorted({i for r in rows for i in r.perturbation.kv_layers})
    cal_seconds = 0.0
    if calibration is None and scheme.static_input and units:
        calibration = calibrate(student, rollouts, units, kv.strategy, batch_size, per_sequence=True)
        cal_seconds = time.perf_counter() - t0
    fp = _Pass(
        model, fp8_forwards(model, units, scheme, calibration, fused=fused), kv, kv_layers, calibration, samples, seed
    )
    handles = [model.get_input_embeddings().register_forward_hook(_leaf)]
    handles += [model.get_submodule(n).register_forward_hook(fp.unit_hook(n)) for n in units]
    batches = list(rollouts.batches(batch_size))
    bar = tqdm(
        total=len(batches) * samples, desc="fisher", unit="pass", disable=not progress, mininterval=bar_interval()
    )
    grads = [p.requires_grad for p in model.parameters()]
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        with observe_kv(model, fp.kv_hook, kv_layers), torch.enable_grad():
            for batch in batches:
                fp.batch(*batch, on_draw=lambda: bar.update(1))
    finally:
        bar.close()
        for hd in handles:
            hd.remove()
        for p, g in zip(model.parameters(), grads):
            p.requires_grad_(g)
    fp.finish_kv()
    estimates, sqnr = fp.result(rows)
    return FisherResult(estimates, sqnr, fp.num_tokens, time.perf_counter() - t0, cal_seconds, calibration)


def _leaf(mod, args, out):  # the graph starts at the embeddings: no parameter needs a gradient
    return out.detach().requires_grad_(True)


class _Pass:
    """One pass with backward over the rollouts: the hooks that take each unit's (and K/V's) g·δ as the gradient
    arrives, the label draws, and the sums every estimator is formed from."""

    def __init__(self, model, forwards, kv: KVCacheScheme, kv_layers, calibration, samples: int, seed: int):
        self.model, self.forwards, self.kv, self.kv_layers, self.samples = model, forwards, kv, kv_layers, samples
        self.device = next(model.parameters()).device
        self.defer = calibration is None and bool(kv_layers) and kv.scale == "calibrated"
        self.scales = {} if self.defer else {i: kv_scales(kv, i, calibration) for i in kv_layers}
        self.kv_amax = Calibration({}, {}, {})
        self.kv_spec = QuantSpec(kv.strategy)
        self.energy = _Sums()  # SQNR energies, once per batch
        self.draws: list[_Sums] = []  # per batch and label draw: the dot products, kept until every row is formed
        self.deferred: list[tuple] = []  # (draw index, layer, side, K or V, its gradient) waiting for the KV scales
        self.num_tokens = 0
        self.gen = torch.Generator().manual_seed(seed)
        self.softcap = getattr(model.config, "final_logit_softcapping", None) or None
        self.mask = None  # the running batch's attention mask [B, S] (expert outputs are flattened over tokens)
        self.first_draw = True  # energies are counted once per batch, not once per label draw
        self.kept: dict[str, torch.Tensor] = {}  # δ per unit for the batch's later label draws

    def unit_hook(self, name):
        fn = self.forwards[name]

        def fwd(mod, args, out):
            x = args  # not detached: q/k/v share one input object, whose quantization fp8_forwards caches
            y = out.detach()

            def on_grad(g):
                with torch.no_grad():
                    delta = self.kept.get(name)
                    if delta is None:
                        delta = fn(*x).float() - y.float()
                        if self.samples > 1:
                            self.kept[name] = delta
                    gd = g.float() * delta
                    self.draws[-1].add(name, gd.sum(-1).reshape(self.mask.shape), _sumsq(gd))
                    if self.first_draw:
                        self.energy.energy(name, y, delta)

            out.register_hook(on_grad)

        return fwd

    def kv_hook(self, i, k, v):
        if self.defer:
            for d, t in ((self.kv_amax.k_amax, k), (self.kv_amax.v_amax, v)):
                a = amax(without_padding(t.detach(), self.mask, "kv"), self.kv_spec).float().cpu()
                d[i] = a if i not in d else torch.maximum(d[i], a)
        for t, side in ((k, 0), (v, 1)):

            def on_grad(g, t=t.detach(), side=side):
                with torch.no_grad():
                    if self.defer:
                        self.deferred.append((len(self.draws) - 1, i, side, t.cpu(), g.cpu()))
                    else:
                        _kv_dot(
                            self.draws[-1],
                            self.energy if self.first_draw else None,
                            i,
                            t,
                            g,
                            self.scales[i][side],
                            self.kv.spec,
                        )

            t.register_hook(on_grad)
        return k, v

    def batch(self, ids, am, resp, on_draw=None) -> None:
        """One forward, then one backward per label draw (labels sampled from the student, chunk by chunk)."""
        ids, am = ids.to(self.device), am.to(self.device)
        self.mask = am.bool()
        h = self.model.model(input_ids=ids, attention_mask=am, use_cache=False).last_hidden_state
        rows_b, cols_b = torch.nonzero(resp[:, 1:], as_tuple=True)
        hsel = h[rows_b.to(self.device), cols_b.to(self.device)]
        self.num_tokens += hsel.shape[0]
        grads = _head_grads(self.model.get_output_embeddings(), hsel.detach(), self.samples, self.softcap, self.gen)
        for draw in range(self.samples):
            self.first_draw = draw == 0
            self.draws.append(_Sums())
            if hsel.shape[0]:  # a batch with no response tokens has nothing to score
                hsel.backward(grads[draw], retain_graph=draw < self.samples - 1)
            if on_draw is not None:
                on_draw()
        self.kept.clear()

    def finish_kv(self) -> None:
        """A calibrated KV cache's rows, now that every batch has been seen and the K/V amax is known."""
        if not self.defer:
            return
        self.scales = {i: kv_scales(self.kv, i, self.kv_amax) for i in self.kv_layers}
        for n, i, side, t, g in self.deferred:
            first = n % self.samples == 0
            _kv_dot(self.draws[n], self.energy if first else None, i, t, g, self.scales[i][side], self.kv.spec)

    def result(self, rows) -> tuple[dict, dict]:
        """(estimator -> row -> estimate, row -> SQNR in dB)."""
        totals = {e: {r.unit: 0.0 for r in rows} for e in ESTIMATORS}
        for sums in self.draws:
            _accumulate(rows, sums, totals)
        norm = 0.5 / max(self.num_tokens, 1) / self.samples
        estimates = {e: {r: v * norm for r, v in col.items()} for e, col in totals.items()}
        sqnr = {}
        for r in rows:
            keys = [*r.perturbation.units, *(f"kv:{i}" for i in r.perturbation.kv_layers)]
            sig = sum(self.energy.signal.get(k, 0.0) for k in keys)
            noi = sum(self.energy.noise.get(k, 0.0) for k in keys)
            sqnr[r.unit] = sqnr_db_from_energy(sig, noi) if keys else float("nan")
        return estimates, sqnr


def _kv_dot(sums: _Sums, energy: _Sums | None, layer: int, t, g, scale, spec) -> None:
    """One side (K or V, [B, H, S, D]) of a layer's KV row: g·δ per position, and its energies."""
    delta = fake_quant(t, spec, scale=scale.to(t.device)).float() - t.float()
    gd = g.float() * delta
    sums.add(f"kv:{layer}", gd.sum((1, 3)), _sumsq(gd))
    if energy is not None:
        energy.energy(f"kv:{layer}", t, delta)


def _sumsq(x: torch.Tensor) -> float:
    """Σ x² without an x² temporary."""
    flat = x.reshape(-1)
    return float(torch.dot(flat, flat))


def _head_grads(head, h: torch.Tensor, samples: int, softcap: float | None, gen: torch.Generator) -> torch.Tensor:
    """The gradient of Σ_rows log p(ŷ) with respect to the final hidden states h [M, H], for each of `samples` label
    draws ([samples, M, H]), by hand rather than by autograd: with logits z = W h (softcapped: c·tanh(z / c)),
    ∂ log p(ŷ) / ∂h = s_ŷ W_ŷ − (p ⊙ s) W, s the softcap's derivative (1 without one). The logits, p and its CDF are
    formed once per chunk of rows (mismatch.CHUNK_ROWS, so a large vocabulary never holds more) and the (p ⊙ s) W
    product is shared by every draw: one matmul per chunk instead of a forward and a backward per draw. The labels
    are drawn chunk by chunk, every draw of a chunk before the next (one seeded uniform per row and draw)."""
    w = head.weight  # [V, H] (a bias moves the logits, not their gradient)
    out = torch.zeros(samples, *h.shape, dtype=torch.float32, device=h.device)
    with torch.no_grad():
        for s in range(0, h.shape[0], CHUNK_ROWS):
            z = head(h[s : s + CHUNK_ROWS]).float()
            slope = None
            if softcap:
                t = torch.tanh(z / softcap)
                z, slope = t * softcap, 1 - t * t
            p = torch.softmax(z, dim=-1)
            cdf = p.cumsum(-1)
            shared = ((p if slope is None else p * slope).to(w.dtype) @ w).float()  # [m, H]
            for d in range(samples):
                y = _sample(cdf, gen)  # [m, 1]
                own = w[y[:, 0]].float()
                if slope is not None:
                    own = own * slope.gather(-1, y)
                out[d, s : s + CHUNK_ROWS] = own - shared
    return out.to(h.dtype)


def _sample(cdf: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One label per row drawn from a distribution given by its CDF over the vocabulary ([M, V]) by inverting it with
    one seeded uniform per row ([M, 1])."""
    u = torch.rand(cdf.shape[0], 1, generator=gen).to(cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).clamp_max(cdf.shape[-1] - 1)


def _accumulate(rows, sums: _Sums, totals) -> None:
    """Add one batch's (one label draw's) squares to every row's three estimators."""
    for r in rows:
        keys = [*r.perturbation.units, *(f"kv:{i}" for i in r.perturbation.kv_layers)]
        keys = [k for k in keys if k in sums.d]
        if not keys:
            continue
        d = sums.d[keys[0]] if len(keys) == 1 else torch.stack([sums.d[k] for k in keys]).sum(0)
        totals["position"][r.unit] += float(d.pow(2).sum())
        windows = torch.nn.functional.pad(d, (0, (-d.shape[1]) % WINDOW)).reshape(d.shape[0], -1, WINDOW).sum(-1)
        totals["window"][r.unit] += float(windows.pow(2).sum())
        totals["sequence"][r.unit] += float(d.sum(1).pow(2).sum())
        totals["element"][r.unit] += sum(sums.elem[k] for k in keys)
