"""Path attributions: every group's share of a recipe's mismatch with the other groups partly in FP8 (Aumann–Shapley).
Out of the package with `sweep --method path` (docs/modelopt.md: no better than the default at any size measured on
either student); used by path_sweep.py, pricing.py's `path` prices and damage_model.py's path prior, beside this file.

A single-group row of the sweep prices a group with every other group BF16; inside a recipe the others are FP8 too,
and the group's cost there differs (the interactions refinement chases one leave-one-out at a time). The path
attribution prices every group of a set G at once along the straight path from BF16 to G in FP8: each unit u of each
group g computes

    y_u(t) = y_u + t_g · (y_u^fp8 − y_u)                 (its FP8 output as vLLM computes it, on its actual input)

with all t_g = t, and the mismatch L(t) (mean per-token KL(q‖p) of the response tokens against the BF16 reference) is
differentiated with respect to each t_g at a few points of the path:

    A_g = ∫₀¹ ∂L/∂t_g (t, …, t) dt ≈ Σ_k w_k ∂L/∂t_g(t_k)     (Gauss–Legendre nodes t_k on [0, 1], weights w_k)

By the fundamental theorem of calculus Σ_g A_g = L(1) − L(0) = the measured mismatch of G (completeness: `total`
against `measured`, the quadrature's error beside it), and a pair of groups that cost little alone and much together
splits its interaction between the two, where single rows see neither. ModelOpt's saturation-aware AutoQuantize
(`aumann_shapley`, NVIDIA Model-Optimizer PR #2183) scores layers the same way; here the loss is the rollout mismatch
itself, not a training loss. Cost: one forward and one backward over the rollouts per node (each backward only into
the scalar t_g, no weight gradients), the same arithmetic as the sweep's simulation (fp8_forwards). Weights only: the
FP8 KV cache is not on the path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from fp8probe.core.schemes import Scheme
from fp8probe.measurement.mismatch import CHUNK_ROWS, log_softmax32
from fp8probe.measurement.quantize import fp8_forwards
from fp8probe.measurement.reference import Reference

DEFAULT_NODES = 4


@dataclass
class Attribution:
    """Each group's path attribution (mean per response token, the scale of `kl_q_p`), their sum, the mismatch of
    the whole set measured at the path's nodes, and the time it took."""

    shares: dict[str, float]
    total: float  # Σ shares
    path: list[tuple[float, float]]  # (t_k, L(t_k))
    seconds: float

    def to_json(self) -> dict:
        return {"shares": self.shares, "total": self.total, "path": self.path, "seconds": self.seconds}


def gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n nodes and weights of the Gauss–Legendre rule on [0, 1]."""
    if n < 1:
        raise ValueError("path attribution: at least one node")
    x, w = np.polynomial.legendre.leggauss(n)
    return (x + 1) / 2, w / 2


def path_integral(grad_at, nodes: int = DEFAULT_NODES) -> tuple[np.ndarray, list]:
    """Σ_k w_k grad_at(t_k): grad_at(t) -> (the gradient vector over the groups at (t, …, t), the loss there)."""
    ts, ws = gauss_legendre(nodes)
    total, losses = None, []
    for t, w in zip(ts, ws):
        g, loss = grad_at(float(t))
        g = np.asarray(g, dtype=float)
        total = w * g if total is None else total + w * g
        losses.append((float(t), float(loss)))
    return total, losses


def path_attribution(
    student,
    rollouts,
    reference: Reference,
    groups: dict[str, list[str]],
    scheme: Scheme,
    nodes: int = DEFAULT_NODES,
    batch_size: int = 8,
    fixed: dict[str, list[str]] | None = None,
) -> Attribution:
    """The path attribution of every group in `groups` (group -> its unit names) in `scheme`, on `rollouts` (those
    `reference` was made on, with the same batch size; static input scales from its calibration). `fixed` groups
    are in FP8 all along the path (t = 1, not attributed): the shares are then what `groups` add to the mismatch of
    `fixed` in FP8, in that context (they sum to m(fixed ∪ groups) − m(fixed))."""
    model = student.model
    device = next(model.parameters()).device
    fixed = dict(fixed or {})
    overlap = set(fixed) & set(groups)
    if overlap:
        raise ValueError(f"path attribution: {sorted(overlap)[0]} is both fixed and on the path")
    members = {**groups, **fixed}
    names = list(members)  # the path's groups first, then the fixed ones
    on_path = len(groups)
    units = [u for g in names for u in members[g]]
    fwd = fp8_forwards(
        model, units, scheme, reference.calibration if scheme.static_input else None, fused=True, straight_through=True
    )
    t0 = time.perf_counter()
    head = model.get_output_embeddings()
    softcap = reference.softcap
    num = max(len(reference.rows), 1)
    state: dict = {}

    def hook_for(unit, g):
        fn = fwd[unit]

        def hook(mod, args, out):
            return out + (state["t"][g] if g < on_path else 1.0) * (fn(*args) - out)

        return hook

    handles = [
        model.get_submodule(u).register_forward_hook(hook_for(u, i)) for i, g in enumerate(names) for u in members[g]
    ]
    grads = [p.requires_grad for p in model.parameters()]

    def grad_at(t: float):
        state["t"] = [torch.tensor(t, requires_grad=True) for _ in range(on_path)]
        loss_sum = 0.0
        offset = 0
        for ids, am, resp in rollouts.batches(batch_size):
            h = model.model(input_ids=ids.to(device), attention_mask=am.to(device), use_cache=False).last_hidden_state
            rows, cols = torch.nonzero(resp[:, 1:], as_tuple=True)
            hsel = h[rows.to(device), cols.to(device)]
            hl = hsel.detach().requires_grad_(True)
            for s in range(0, hl.shape[0], CHUNK_ROWS):
                e = min(s + CHUNK_ROWS, hl.shape[0])
                q = log_softmax32(head(hl[s:e]), softcap)
                p = reference.rows.rows(offset + s, offset + e).to(q.device).logp
                kl = (q.exp() * (q - p)).sum() / num
                kl.backward()
                loss_sum += float(kl.detach())
            offset += hl.shape[0]
            if hl.grad is not None:
                hsel.backward(hl.grad)
        g = [float(x.grad) if x.grad is not None else 0.0 for x in state["t"]]
        return g, loss_sum

    try:
        for p in model.parameters():
            p.requires_grad_(False)
        with torch.enable_grad():
            shares, path = path_integral(grad_at, nodes)
    finally:
        for hd in handles:
            hd.remove()
        for p, g in zip(model.parameters(), grads):
            p.requires_grad_(g)
    return Attribution(
        dict(zip(names[:on_path], map(float, shares))), float(np.sum(shares)), path, time.perf_counter() - t0
    )
