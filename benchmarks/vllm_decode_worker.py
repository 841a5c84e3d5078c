"""Runs inside the vLLM venv (imports vllm, never fp8probe): times vLLM-CPU's generation at several batch sizes and
response lengths, for benchmarks/plan_model.py.

    python vllm_decode_worker.py SPEC.json

SPEC: {"model": dir, "max_model_len": int, "out": path, "prompt": [ids], "runs": [[batch, max_tokens], ...],
"repeat": int, "engine_kwargs": {...}}. Every request is the same prompt, generates exactly max_tokens tokens
(ignore_eos) greedily; a run's seconds are the best of `repeat` timings of one llm.generate over `batch` requests.
Writes {"runs": [{"batch", "max_tokens", "seconds", "tokens"}]} to SPEC["out"]; vLLM's log lines go to stderr.
"""

import json
import os
import sys
import time


def main():
    spec = json.load(open(sys.argv[1]))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        enforce_eager=True,
        max_model_len=spec["max_model_len"],
        seed=0,
        **spec.get("engine_kwargs", {}),
    )
    prompt = TokensPrompt(prompt_token_ids=spec["prompt"])
    llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
    out = []
    for batch, max_tokens in spec["runs"]:
        best = None
        for _ in range(int(spec.get("repeat", 1))):
            t = time.perf_counter()
            res = llm.generate(
                [prompt] * batch,
                SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                use_tqdm=False,
            )
            s = time.perf_counter() - t
            best = s if best is None else min(best, s)
        out.append(
            {
                "batch": batch,
                "max_tokens": max_tokens,
                "seconds": best,
                "tokens": sum(len(r.outputs[0].token_ids) for r in res),
            }
        )
        print(f"run batch {batch} x {max_tokens} tokens: {best:.3f} s", file=sys.stderr, flush=True)
    with open(spec["out"], "w") as f:
        json.dump({"runs": out}, f)
        f.flush()
        os.fsync(f.fileno())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # vLLM's CPU engine can abort in its thread teardown at exit; the results are on disk


if __name__ == "__main__":
    main()
