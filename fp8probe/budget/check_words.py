"""`fp8probe check`'s report in words: the verdict line, what it was judged on, each kind's evidence, the notes, the
figures beside it (the other engine, the prefix shift, the OPD signal) and verl's fully-async lags."""

from __future__ import annotations

from ..core.records import CheckRecord
from .evidence import Verdict


def format_check(report: CheckRecord) -> str:
    engine, judged = report.engine, report.judged_engine
    as_run = "" if judged == "sim" else f" as {judged} runs it"
    v = report.verdict
    lo, hi = report.measured_interval
    figure = f"{v}: {report.configuration}{as_run}: {report.metric} {report.measured:.4g} [{lo:.4g}, {hi:.4g}]"
    rule = (report.decided_by or {}).get("rule", "ruler")
    calibrated = "calibrated" if report.budget_calibrated else "UNCALIBRATED"
    if rule == "ruler":
        b = f"budget {'> ' if report.budget_censored else ''}{report.budget:.4g}"
        if report.budget_interval:
            top = report.budget_interval[1]
            b += f" [{report.budget_interval[0]:.4g}, {'> ' if report.budget_interval_censored else ''}{top:.4g}]"
        sign = {Verdict.ADMIT: "<=", Verdict.REJECT: ">"}.get(v, "vs")
        lines = [f"{figure} {sign} {b} ({_margin(report)}; budget {calibrated}: {report.budget_source})"]
        if report.judged_on and report.judged_on != "the noise ruler":
            lines.append(f"judged on {report.judged_on}")
    else:
        margin = f" ({_margin(report)})" if report.margin is not None else ""
        lines = [f"{figure}: judged on {report.judged_on}{margin}; budget {calibrated}: {report.budget_source}"]
    if not report.budget_calibrated:
        lines.append(
            "note: a number is judged as the point it is; a calibrated budget.json judges against its interval's "
            "lower end (BMDL) and its levels' own losses"
        )
    for e in report.kind_evidence or []:
        if e.get("kind") == "none":
            continue
        elo, ehi = e["loss_interval"] or (float("nan"), float("nan"))
        reading = f"; the noise ruler: {e['reading']}" if e.get("reading") else ""
        lines.append(
            f"{e['kind']} as a calibration level ({e['level']}, dose {e['mismatch']:.4g}): lost "
            f"{e['loss']:+.1%} [{elo:+.1%}, {ehi:+.1%}] ({report.budget_response} loss, {e['seeds']} seeds){reading}"
        )
    lines += verl_async_lines(report)
    for note in (report.budget_student_note, report.budget_objective_note, report.scale_note):
        if note:
            lines.append(f"note: {note}")
    if report.undecided_because:
        lines.append(f"undecided: {report.undecided_because}")
    a = report.also_measured
    at_lag = f"at lag {report.verl_async['beside_at_lag']}, " if report.verl_async else ""
    if a and a.get("measured") is not None:
        why = (
            f"the verdict is on the {judged} figure: the budget's doses were measured in {judged}"
            if a["engine"] == engine and engine != judged
            else f"the verdict is on the {judged} figure"
        )
        lines.append(
            f"{at_lag}as {a['engine']} computes it: {report.metric} {a['measured']:.4g} [{a['interval'][0]:.4g}, "
            f"{a['interval'][1]:.4g}] ({why})"
        )
    elif a:
        lines.append(f"not measured as {a['engine']} computes it: {a['not_covered']}")
    s = report.prefix_shift
    lines.append(
        f"{at_lag}prefix shift: {s['diverged']:.0%} of continuations diverge"
        + (f" (first at token {s['first_div_mean']:.1f} on average)" if s["diverged"] else "")
        + f"; on its own samples kl_q_p {s['kl_q_p_own']:.4g}, k3 {s['k3_own']:.4g}"
        + (f" (>= {s['kl_top20_own']:.4g} from the engine's top-20 log-probs)" if "kl_top20_own" in s else "")
        + "; as verl logs it "
        + f"rollout_corr/kl {s['rollout_corr/kl']:.4g}, k3_kl {s['rollout_corr/k3_kl']:.4g}, "
        + f"{s['ppo_clip_share']:.1%} of tokens outside a PPO clip of 0.2 (pg_clipfrac about {s['pg_clipfrac']:.1%}: "
        + "the side the advantage binds)"
    )
    for sc in report.verl_screens or []:
        lines.append(screen_line(sc))
    if report.opd_signal:
        o = report.opd_signal
        lines.append(
            f"OPD signal: mean |Δreward| {o['mean_abs_reward_delta']:.4g} per token, corr "
            f"{o['reward_corr']:.4f} with the mismatch-free reward, sequence reverse-KL change "
            f"{o['seq_rkl_delta']:+.4g}; ratios beyond verl's 2.0: {o['ratio_out_verl']:.2%}, outside "
            f"OpenRLHF's [0.5, 5]: {o['ratio_out_openrlhf']:.2%}"
        )
    return "\n".join(lines)


def verl_async_lines(report: CheckRecord) -> list[str]:
    """check.json's `verl_async` in words: each regime's lags and mixture, every lag's own figure, what is modelled."""
    a = report.verl_async
    if not a:
        return []
    out = [f"verl async ({a['keys']}):"]
    for regime, r in a["regimes"].items():
        lo, hi = r["interval"]
        out.append(
            f"  {regime}: mean {r['mean']:.2f}, p50 {r['p50']}, p90 {r['p90']}, max {r['max']}; the mixture's "
            f"{report.metric} {r['measured']:.4g} [{lo:.4g}, {hi:.4g}]" + (" (judged)" if regime == a["judged"] else "")
        )
    if a.get("dropped"):
        out.append(f"  {a['dropped']:.1%} of finished prompt groups dropped as spanning more than max_off_policy steps")
    each = ", ".join(f"{k}: {v['measured']:.4g}" for k, v in a["lags"].items())
    out.append(f"  each lag's own {report.metric}: {each}; beside the verdict: lag {a['beside_at_lag']}'s figures")
    st = a.get("straddle")
    if st:
        lo, hi = st["interval"]
        out.append(
            f"  a response straddling a sync (resumed after it): {report.metric} {st['measured']:.4g} [{lo:.4g}, "
            f"{hi:.4g}]; {st['how']}"
        )
    if a["path"]:
        out.append(f"  {a['path']}")
    return out


def _margin(report: CheckRecord) -> str:
    """The margin to the number the rule compared with, named."""
    d = report.decided_by or {}
    name, threshold = d.get("threshold_name") or "the budget", d.get("threshold")
    at = f" {threshold:.4g}" if threshold is not None else ""
    return f"margin to {name}{at}: {report.margin:+.3g}"


def screen_line(sc: dict) -> str:
    """One of verl's screens on the configuration's own samples, as verl would log it."""
    if "rollout_rs_seq_masked_fraction" in sc:
        lo, hi = sc["seq_masked_interval"]
        keep = sc.get("threshold_to_keep")
        to_keep = f"; {sc['keep']:.0%} of sequences kept at a threshold of {keep:.3g}" if keep is not None else ""
        return (
            f"verl's {sc['screen']}: masks {sc['rollout_rs_seq_masked_fraction']:.0%} [{lo:.0%}, {hi:.0%}] of the "
            f"sequences, {sc['rollout_rs_masked_fraction']:.0%} of the tokens, of its own samples{to_keep}"
        )
    return (
        f"verl's {sc['screen']}: mean weight {sc['rollout_is_mean']:.3f}, {sc['rollout_is_ratio_fraction_high']:.1%} "
        f"of tokens above the threshold and {sc['rollout_is_ratio_fraction_low']:.1%} below its reciprocal, effective "
        f"sample size {sc['rollout_is_eff_sample_size']:.2f}"
    )
