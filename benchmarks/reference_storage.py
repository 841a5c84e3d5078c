"""How the reference is kept: fp32 log-probs [tokens x vocabulary] or the hidden states they are recomputed from.

    python benchmarks/reference_storage.py [--models smollm2-135m gemma3-270m] [--num-prompts 8] [--max-new-tokens 32]

For each real student, on its own sampled rollouts: the bytes each storage holds (Reference.nbytes: block inputs,
the reference rows, the rollouts) and the reference rows alone, the seconds of the reference pass and of a set of
candidate passes (the whole model in FP8_DYNAMIC, its FP8 KV cache, and six single units spread over the depth),
and the largest change any of those rows' metrics makes between the two (the recomputation chunks rows as the
reference pass did, so 0 is expected). Both storages measured side by side in one run, one after the other.
"""

from __future__ import annotations

import argparse
import sys
import time

from fp8probe import load_student, make_rollouts
from fp8probe.core.metrics import METRICS
from fp8probe.core.schemes import KVCacheScheme, Scheme
from fp8probe.core.units import GiB
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.measurement.reference import Reference


def candidates(student) -> dict[str, Perturbation]:
    units = student.unit_names
    pick = [units[i] for i in range(0, len(units), max(1, len(units) // 6))][:6]
    out = {
        "fp8_all": Perturbation(tuple(units), Scheme.from_name("FP8_DYNAMIC")),
        "kv_all": Perturbation(kv_layers=student.layers, kv=KVCacheScheme()),
    }
    out.update({u: Perturbation((u,), Scheme.from_name("FP8_DYNAMIC")) for u in pick})
    return out


def run(model: str, num_prompts: int, max_new_tokens: int) -> dict:
    from fp8probe.measurement.measure import measure

    student = load_student(model)
    r = make_rollouts(student, num_prompts=num_prompts, max_new_tokens=max_new_tokens, seed=0)
    got = {}
    for storage in ("logp", "hidden"):
        t = time.perf_counter()
        ref = Reference(student, r, 8, storage=storage)
        t_ref = time.perf_counter() - t
        t = time.perf_counter()
        bench = Bench.around(ref, student, r)
        rows = {name: measure(bench, p).metrics for name, p in candidates(student).items()}
        got[storage] = {
            "reference_s": t_ref,
            "candidates_s": time.perf_counter() - t,
            "rows": rows,
            "nbytes": ref.nbytes(),
            "rows_bytes": sum(x.numel() * x.element_size() for x in ref.rows.tensors()),
        }
    worst = max(
        abs(got["hidden"]["rows"][n][m] - got["logp"]["rows"][n][m]) / max(abs(got["logp"]["rows"][n][m]), 1e-30)
        for n in got["logp"]["rows"]
        for m in METRICS
        if m in got["logp"]["rows"][n]
    )
    return {
        "model": model,
        "vocab": student.model.config.get_text_config().vocab_size,
        "response_tokens": r.num_response_tokens,
        "largest_relative_change": worst,
        **got,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    a = ap.parse_args(argv)
    print(
        f"{'model':<14}{'vocab':>8}{'tokens':>8}{'storage':>9}{'rows MiB':>10}{'all MiB':>10}{'reference s':>13}"
        f"{'8 candidates s':>16}{'largest change':>16}"
    )
    for m in a.models:
        res = run(m, a.num_prompts, a.max_new_tokens)
        for s in ("logp", "hidden"):
            g = res[s]
            print(
                f"{m:<14}{res['vocab']:>8}{res['response_tokens']:>8}{s:>9}{g['rows_bytes'] / 2**20:>10.2f}"
                f"{g['nbytes'] / 2**20:>10.1f}{g['reference_s']:>13.2f}{g['candidates_s']:>16.2f}"
                f"{res['largest_relative_change'] if s == 'hidden' else 0:>16.3g}"
            )
        per_token = {s: res[s]["rows_bytes"] / res["response_tokens"] for s in ("logp", "hidden")}
        print(
            f"  per response token: {per_token['logp'] / 1024:.1f} KiB as log-probs, "
            f"{per_token['hidden'] / 1024:.2f} KiB as hidden states; 16 x 512 tokens would hold "
            f"{16 * 512 * per_token['logp'] / GiB:.2f} GiB vs "
            f"{16 * 512 * per_token['hidden'] / GiB:.3f} GiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
