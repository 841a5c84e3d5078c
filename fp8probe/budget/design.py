"""A calibration's runs as a design: quality per (level, seed), the response a budget is read on, the seed as a
random effect, and the two ways a table is redrawn (by seed, and from a fitted model).

The response of a run at a level (lower quality is worse or better by `higher`) against its mismatch-free twin:

    gain      (q_twin − q) / (q_twin − q_start): the share of what training gained that the mismatch cost (q_start
              the quality before training, the same for every run). A score's shared parts (its step-0
              evaluation, a constant offset) cancel; 0.05 means "5 % of the training gain lost".
    relative  (q_twin − q) / |q_twin| (higher is better; the other sign when lower is better): budget.json 3's
              response, diluted by whatever the score shares across runs.

q_twin is the same seed's mismatch-free run (`pairing` "seed") or the mean of every mismatch-free run ("mean").

The seed is a random effect. A run's quality is q = m_level + u_seed + e_run: u_seed what a seed does to every run
alike (its data order, its samples), e_run what its own trajectory does, with its own variance for the twins
(σ0²) and the perturbed runs (σ1²). Pairing removes u_seed but puts the twin's e into every level of that seed,
the same for each: the levels' losses are correlated through their shared twin, so an interval that redraws
each level's noise independently is too narrow (issue: GRPO's twin share of a paired loss's variance measured
0.52). Pairing also helps only where u_seed is large: trajectories part after the first different rollout, so
σ1² can dwarf it, and then the twins' mean is the better baseline (`choose_pairing`). The components are
estimated by moments (Henderson's method III on the two-way layout with missing cells, the residual variance
split between twins and perturbed runs), with generalized pivotal draws for their uncertainty: a parametric draw
does not pretend the variances of three seeds are known.

Two ways to redraw the table, each a [B, L, S] array of quality (NaN where a level has no run of that seed):

    by_seed     the seeds resampled with replacement, stratified by level (a level with m of the K seeds keeps m
                runs, each of its own seeds drawn with probability 1/m; levels with the same seeds drawn alike, so
                a seed's runs stay together: pairs stay pairs)
    parametric  every run drawn from the fitted model: the level means the fitted curve gives, a shared u per seed
                and a fresh e per run, with variances drawn from their pivotal distributions
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.errors import FP8ProbeError

RESPONSES = ("gain", "relative")
PAIRINGS = ("seed", "mean")


@dataclass(frozen=True)
class Design:
    """One objective's runs of some levels: `q` [L, S] quality (NaN where level l has no run of seed s), `doses` [L]
    with doses[0] == 0 the mismatch-free twins (every seed has one), `start` the quality before training (None when
    unknown: the gain response needs it), `higher` the quality's direction."""

    doses: np.ndarray
    q: np.ndarray
    seeds: tuple
    start: float | None
    higher: bool
    paired: bool = True  # column s is one seed at every level (False: a table without seeds, its runs numbered)

    def __post_init__(self):
        if self.doses[0] != 0 or (np.isnan(self.q[0]).any() if self.paired else np.isnan(self.q[0]).all()):
            raise FP8ProbeError(
                "internal: a design's first level holds the mismatch-free twins (every seed's, when paired)"
            )

    @property
    def present(self) -> np.ndarray:
        return ~np.isnan(self.q)

    def counts(self) -> np.ndarray:
        """Runs per level [L]."""
        return self.present.sum(axis=1)

    def rows(self, keep) -> Design:
        """The design with the twins and the levels `keep` (indices into doses, twins excluded)."""
        idx = [0] + [int(i) for i in keep]
        return Design(self.doses[idx], self.q[idx], self.seeds, self.start, self.higher, self.paired)


def response(q_twin, q, start, higher: bool, kind: str):
    """The quality loss of q against its twin's quality (module docstring; arrays broadcast)."""
    if kind == "gain":
        return (q_twin - q) / (q_twin - start)
    if kind == "relative":
        return ((q_twin - q) if higher else (q - q_twin)) / np.abs(q_twin)
    raise FP8ProbeError(f"`response` {kind}: one of {', '.join(RESPONSES)}")


def check_response(design: Design, kind: str, where: str) -> None:
    """Refuse a response the runs cannot give, in one line."""
    if kind not in RESPONSES:
        raise FP8ProbeError(f"`response` {kind}: one of {', '.join(RESPONSES)}")
    twins = design.q[0]
    if kind == "relative" and (twins == 0).any():
        raise FP8ProbeError(
            f"{where}: a mismatch-free run's quality is 0; a relative loss needs another scale (try the gain response)"
        )
    if kind == "gain":
        if design.start is None or not math.isfinite(design.start):
            raise FP8ProbeError(
                f"{where} has no quality before training (a `quality_start` column): the gain "
                "response needs it; add it, or pass the relative response"
            )
        gained = (twins - design.start) * (1 if design.higher else -1)
        gained = gained[~np.isnan(gained)]  # unpaired: a level may hold more runs than there are twins
        if not gained.size or not (gained > 0).all():
            raise FP8ProbeError(
                f"{where}: a mismatch-free run did not improve on the quality before training "
                f"({design.start:.4g}): there is no training gain to lose; train longer, or pass the "
                "relative response"
            )


def twins_of(q: np.ndarray) -> np.ndarray:
    """Each cell's own seed's twin where the table keeps seeds in their columns (the data, a parametric draw)."""
    return np.broadcast_to(q[..., :1, :], q.shape)


def losses(design: Design, q: np.ndarray, tw: np.ndarray, kind: str, pairing: str) -> np.ndarray:
    """The responses of a (redrawn) table q [..., L, S] against its twins: [..., L, S], NaN where no run. `tw` each
    cell's own seed's twin (twins_of, or by_seed's second table); row 0 of q holds the twins themselves (0 when
    paired by seed)."""
    if pairing == "seed":
        base = tw
    elif pairing == "mean":
        base = np.nanmean(q[..., :1, :], axis=-1, keepdims=True)
    else:
        raise FP8ProbeError(f"`pairing` {pairing}: one of {', '.join(PAIRINGS)}")
    return response(base, q, design.start, design.higher, kind)


def level_means(y: np.ndarray) -> np.ndarray:
    """Each level's mean response [..., L] from responses [..., L, S] (NaN cells left out)."""
    return np.nanmean(y, axis=-1)


# -- the seed as a random effect ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Components:
    """Variance components of quality: `seed` (u, shared by a seed's runs), `twin` and `run` (e of the twins and of
    the perturbed runs), each with the degrees of freedom its estimate has; `c_seed` and `e_seed` what a draw of the
    seed component needs (the reduction's coefficient of σ_u² and its expected part from the residuals)."""

    seed: float
    twin: float
    run: float
    df_seed: float
    df_twin: float
    df_run: float
    ss_seed: float = 0.0
    c_seed: float = 0.0
    resid_in_seed: tuple[float, float] = (0.0, 0.0)  # coefficients of (σ0², σ1²) in E[reduction]
    raw: tuple[float, float, float] | None = None  # the moments before clipping at 0 (unbiased; they can be < 0)

    def twin_share(self) -> float:
        """The share of a seed-paired loss's variance that its twin puts there: σ0² / (σ0² + σ1²)."""
        total = self.twin + self.run
        return self.twin / total if total > 0 else 0.0

    def seed_share(self) -> float:
        """The seed effect's share of one run's variance, σ_u² / (σ_u² + σ1²)."""
        total = self.seed + self.run
        return self.seed / total if total > 0 else 0.0


def _projection(X: np.ndarray) -> np.ndarray:
    return X @ np.linalg.pinv(X)


def components(design: Design) -> Components:
    """σ_u², σ0², σ1² by Henderson's method III on the two-way layout (levels fixed, seeds random) with missing
    cells: the residuals of the additive fit give σ0² and σ1² (their expected squares are linear in both, through
    the residual-maker's squared entries), the reduction in the residual sum of squares that the seeds bring gives
    σ_u². The moments are unbiased (`raw`); a variance is clipped at 0, which raises its mean where the raw moment
    is often negative (a twin's σ0² from four degrees of freedom: a third of the time), erring wide. Degrees of
    freedom: the residual-maker's trace over each group; S − 1 for the seeds. Unpaired (no seeds): no seed effect;
    σ0² the twins' variance, σ1² the levels' pooled variance."""
    if not design.paired:
        q0 = design.q[0][~np.isnan(design.q[0])]
        rest = [r[~np.isnan(r)] for r in design.q[1:]]
        df1 = float(sum(len(r) - 1 for r in rest if len(r) > 1))
        run = float(sum(((r - r.mean()) ** 2).sum() for r in rest if len(r) > 1) / df1) if df1 > 0 else 0.0
        return Components(
            0.0, float(np.var(q0, ddof=1)) if len(q0) > 1 else 0.0, run, 0.0, float(max(len(q0) - 1, 0)), df1
        )
    cells = np.argwhere(design.present)  # [N, 2] (level, seed)
    y = design.q[cells[:, 0], cells[:, 1]]
    L, S = design.q.shape
    X = np.eye(L)[cells[:, 0]]
    Z = np.eye(S)[cells[:, 1]]
    N = len(y)
    M = np.eye(N) - _projection(np.hstack([X, Z]))
    twin = cells[:, 0] == 0
    r = M @ y
    # E[Σ_g r_i²] = Σ_{i in g} Σ_j M_ij² σ²_{group(j)}: two equations in (σ0², σ1²)
    M2 = M * M
    A = np.array([[M2[np.ix_(g, h)].sum() for h in (twin, ~twin)] for g in (twin, ~twin)])
    b = np.array([float((r[twin] ** 2).sum()), float((r[~twin] ** 2).sum())])
    unclipped = np.linalg.lstsq(A, b, rcond=None)[0]
    sig = _nonnegative_solve(A, b)
    df = (np.diag(M)[twin].sum(), np.diag(M)[~twin].sum())
    Px = _projection(X)
    R = _projection(np.hstack([X, Z])) - Px  # the seeds' reduction
    ss_seed = float(y @ R @ y)
    c = float(np.trace(R @ Z @ Z.T))
    coef = (float(np.diag(R)[twin].sum()), float(np.diag(R)[~twin].sum()))
    seed = max(0.0, (ss_seed - coef[0] * sig[0] - coef[1] * sig[1]) / c) if c > 1e-12 else 0.0
    raw_seed = (ss_seed - coef[0] * unclipped[0] - coef[1] * unclipped[1]) / c if c > 1e-12 else 0.0
    return Components(
        seed,
        float(sig[0]),
        float(sig[1]),
        float(max(S - 1, 0)),
        float(df[0]),
        float(df[1]),
        ss_seed,
        c,
        coef,
        (float(raw_seed), float(unclipped[0]), float(unclipped[1])),
    )


def _nonnegative_solve(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The 2-vector x ≥ 0 closest to solving A x = b (a negative component set to 0 and the other refitted)."""
    x = np.linalg.lstsq(A, b, rcond=None)[0]
    if (x >= 0).all():
        return x
    best = None
    for j in (0, 1):
        col = A[:, j]
        v = max(0.0, float(col @ b / max(col @ col, 1e-300)))
        cand = np.zeros(2)
        cand[j] = v
        err = float(((A @ cand - b) ** 2).sum())
        if best is None or err < best[0]:
            best = (err, cand)
    return best[1]


def choose_pairing(comp: Components, twins: int, paired: bool = True) -> tuple[str, str]:
    """Which baseline gives a level's loss the smaller variance: each seed's own twin (σ1² + σ0²: its e and the
    twin's, the seed effect cancelled) or the twins' mean (σ_u² + σ1² of the run, plus the mean's own share); and
    why, in words for budget.json."""
    if not paired:
        return "mean", "the twins' mean: the runs carry no seeds to pair by"
    paired = comp.run + comp.twin
    unpaired = comp.seed + comp.run + (comp.seed + comp.twin) / max(twins, 1)
    if paired <= unpaired:
        return "seed", (
            f"each seed's own twin: the seed effect it removes (σ_u² {comp.seed:.3g}) is at least the "
            f"noise it adds (a twin's own, σ0² {comp.twin:.3g})"
        )
    return "mean", (
        f"the twins' mean: pairing would add a twin's run noise (σ0² {comp.twin:.3g}) larger than the seed "
        f"effect it removes (σ_u² {comp.seed:.3g})"
    )


# -- redrawing the table -------------------------------------------------------------------------------------------


def by_seed(design: Design, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """`n` tables [n, L, S] with the seeds resampled (module docstring: stratified by level, pairs kept), and for
    each level's slots the twin of the very seed drawn there [n, L, S] (a slot may hold a replacement seed: its
    loss is still taken against its own seed's twin)."""
    L, S = design.q.shape
    if not design.paired:  # runs resampled within each level; the twins' mean is the only baseline
        q = np.full((n, L, S), np.nan)
        for lv in range(L):
            have = np.flatnonzero(design.present[lv])
            q[:, lv, : len(have)] = design.q[lv][have][rng.integers(0, len(have), size=(n, len(have)))]
        return q, np.full((n, L, S), np.nan)
    own = [tuple(np.flatnonzero(design.present[lv])) for lv in range(L)]
    pick = rng.integers(0, S, size=(n, S))
    q = np.full((n, L, S), np.nan)
    tw = np.full((n, L, S), np.nan)
    instead: dict = {}
    for lv in range(L):
        seeds = np.array(own[lv])
        m = len(seeds)
        if m == 0:
            continue
        slots = pick[:, :m]
        if own[lv] not in instead:
            instead[own[lv]] = seeds[rng.integers(0, m, size=(n, m))]
        idx = np.where(np.isin(slots, seeds), slots, instead[own[lv]])
        q[:, lv, :m] = design.q[lv][idx]
        tw[:, lv, :m] = design.q[0][idx]
    return q, tw


def parametric(design: Design, means: np.ndarray, comp: Components, n: int, rng) -> np.ndarray:
    """`n` tables [n, L, S] drawn from the model: level means `means` [L] (quality), a shared u per seed, a fresh e
    per run; each draw's variances from their generalized pivotal distributions (σ² = SS / χ², the seed component
    from its reduction less the residuals' expected part), so few seeds draw wide."""
    L, S = design.q.shape

    def pivot(value, df):
        if df <= 0 or value <= 0:
            return np.full(n, max(value, 0.0))
        return value * df / rng.chisquare(df, size=n)

    twin = pivot(comp.twin, comp.df_twin)
    run = pivot(comp.run, comp.df_run)
    if comp.df_seed > 0 and comp.c_seed > 0 and comp.ss_seed > 0:
        reduction = comp.ss_seed * comp.df_seed / rng.chisquare(comp.df_seed, size=n)  # E[reduction] redrawn
        seed = np.maximum(0.0, (reduction - comp.resid_in_seed[0] * twin - comp.resid_in_seed[1] * run) / comp.c_seed)
    else:
        seed = np.full(n, comp.seed)
    u = rng.standard_normal((n, 1, S)) * np.sqrt(seed)[:, None, None]
    sd = np.where(np.arange(L)[None, :, None] == 0, np.sqrt(twin)[:, None, None], np.sqrt(run)[:, None, None])
    e = rng.standard_normal((n, L, S)) * sd
    q = means[None, :, None] + u + e
    return np.where(design.present[None], q, np.nan)
