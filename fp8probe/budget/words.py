"""A budget in words: the lines `fp8probe budget`, `calibrate` and `check` print about it (budget.json's figures,
censored ends as "> x", which bootstrap set each end, whose student it is)."""

from __future__ import annotations


def budget_text(b) -> str:
    """The budget as printed: "<= v (90 % interval lo .. hi, xR ...)", "> v" where the curve never reached the
    tolerance within the tested doses, an upper end censored there shown as "> hi"."""
    if b.censored:
        return (
            f"> {b.value:.4g} (the fitted curve stays within the tolerance up to the highest tested dose; "
            f"90 % lower end {b.interval[0]:.4g})"
            if b.interval
            else f"> {b.value:.4g}"
        )
    if not b.interval:
        return f"<= {b.value:.4g}"
    lo, hi = b.interval
    top = f"> {hi:.4g}" if b.interval_censored else f"{hi:.4g}"
    width = "" if b.interval_censored or lo <= 0 else f", x{hi / lo:.2g}"
    return f"<= {b.value:.4g} (90 % interval {lo:.4g} .. {top}{width}; {interval_words(b)})"


def loss_words(b) -> str:
    """What the tolerance bounds, in words."""
    if b.response == "gain":
        return f"a loss of {b.tolerance:.1%} of the training gain"
    return f"a relative quality loss <= {b.tolerance:g}"


def interval_words(b) -> str:
    """What the budget's interval is, in the printed line: which bootstrap set each end."""
    noise = ((b.dose_response or {}).get("rulers") or {}).get("noise") or {}
    if b.method != "benchmark dose":
        return f"{'paired ' if b.paired else ''}bootstrap"
    if "low_from" in noise:
        ends = {noise["low_from"], noise["high_from"]}
        return (
            f"both ends from the {ends.pop()}"
            if len(ends) == 1
            else f"low end from the {noise['low_from']}, high end from the {noise['high_from']}"
        )
    return f"{'paired ' if b.paired else ''}bootstrap and parametric"


def fit_lines(b) -> list[str]:
    """How the budget was read: whose it is, the baseline, the benchmark dose's families (weight, parameters off
    their bounds, lack-of-fit p, each one's dose), the BMDs at other responses, BMDS's flags, the other rulers, the
    kinds read against the noise ruler, and beneficial low doses; or why the isotonic fit was used."""
    rulers = (b.dose_response or {}).get("rulers", {})
    noise = rulers.get("noise", {})
    lines = []
    if b.student:
        who = f"  for {b.student['name']} (sha256 {b.student['sha256'][:12]})"
        if b.teacher:
            who += f" taught by {b.teacher['name']}"
        loss = f" ({b.loss})" if b.loss else ""
        lines.append(who + (f", objective {b.objective}{loss}" if b.objective else ""))
    if b.dose:
        lines.append(f"  dose: {b.dose}")
    if b.method != "benchmark dose":
        why = (
            "no noise levels (no ruler): the calibrated levels themselves, every kind at its dose"
            if not (b.levels and len(b.levels) > 1) and b.other_levels
            else "no dose–response family fits the noise levels (every lack-of-fit p < 0.1)"
            if noise.get("fits") is False
            else "asked for"
            if b.dose_response is None
            else "too few levels for a curve"
        )
        return lines + [f"  read off the isotonic fit: {why}"]
    r = noise.get("response", {})
    if r:
        comp = noise.get("components")
        runs = f"; the perturbed runs' own noise σ1² {comp['run']:.3g}" if comp else ""
        lines.append(f"  baseline: {r['pairing_reason']}{runs}")
    families = ", ".join(
        f"{m['name']} w {m['weight']:.2f} ({m.get('parameters_off_bounds', '?')} off bounds) p "
        f"{_p(m['p'])} dose {m['bmd']:.3g}"
        for m in noise["models"]
    )
    lines.append(f"  benchmark dose of the averaged curve ({families})")
    others = noise.get("other_responses") or {}
    if others:
        lines.append(
            "  beside it: " + "; ".join(f"at {_tolerance_words(name, x)} {_dose_text(x)}" for name, x in others.items())
        )
    for w in (noise.get("flags") or {}).get("warnings", []):
        lines.append(f"  flag: {w}")
    if noise.get("hormesis", {}).get("supported"):
        low = ", ".join(f"{x:.3g}" for x in noise["hormesis"]["levels"])
        lines.append(
            f"  beneficial low levels (mean loss below 0, one-sided t test at 5 %): {low}; the curve is "
            "fitted above them"
        )
    for kind, rr in rulers.items():
        if kind != "noise" and "bmd" in rr:
            if rr.get("fits") is not True:
                lines.append(
                    f"  {kind} ruler: no family fits its levels (or none could be tested): no curve of its "
                    "own; its levels are shown, not used"
                )
                continue
            lines.append(f"  {kind} ruler: its own curve reaches the tolerance at {_dose_text(rr)}")
    for name, p in noise.get("predictions", {}).items():
        di = p["difference_interval"] or (float("nan"), float("nan"))
        lines.append(
            f"  {name} at {p['mismatch']:.4g}: measured loss {p.get('measured', float('nan')):+.2%}; the "
            f"noise ruler predicts {p['predicted']:+.2%}; measured minus predicted [{di[0]:+.2%}, "
            f"{di[1]:+.2%}]: {p['reading']}"
            f"{' (beyond the tested levels: extrapolated)' if p['beyond_tested'] else ''}"
        )
    return lines


def _tolerance_words(name: str, x: dict) -> str:
    return f"one control SD ({x['tolerance']:.1%})" if name == "one control sd" else f"{x['tolerance']:.0%}"


def _dose_text(x: dict) -> str:
    """A BMD with its interval, censored ends as "> x"."""
    if x.get("above_range"):
        return f"> {x['bmd']:.3g}"
    lo, hi = x.get("interval") or (float("nan"), float("nan"))
    return f"{x['bmd']:.3g} [{lo:.3g}, {'> ' if x.get('interval_censored') else ''}{hi:.3g}]"


def _p(p) -> str:
    return "untested" if p is None else f"{p:.2f}"
