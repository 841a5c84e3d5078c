"""Runs inside a separate vLLM virtual environment (it imports vllm, never fp8probe).

    python vllm_worker.py SPEC.json

SPEC: {"model": dir, "max_model_len": int, "out": path, "generate": [[ids]...] (greedy), "score": [[ids]...]
(prompt logprobs of every token), "prompt_topk": K (optional: also the K most likely tokens per position),
"engine_kwargs": {...}}. Writes {"generated": [...], "generated_ids": [[ids]...],
"prompt_logprobs": [[logprob or null per position]...], "prompt_topk": [[{token: logprob} or null per position]...]}
to SPEC["out"]. vLLM's own log lines (the KV-cache size among them)
go to stderr, where the caller reads them.
"""

import json
import os
import sys


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
    out = {}
    if spec.get("generate"):
        res = llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in spec["generate"]],
            SamplingParams(max_tokens=spec.get("max_tokens", 24), temperature=0.0),
        )
        out["generated"] = [r.outputs[0].text for r in res]
        out["generated_ids"] = [list(r.outputs[0].token_ids) for r in res]
    if spec.get("score"):
        k = int(spec.get("prompt_topk", 0))
        res = llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in spec["score"]],
            SamplingParams(max_tokens=1, prompt_logprobs=k),
        )
        out["prompt_logprobs"] = [
            [None if d is None else d[tok].logprob for d, tok in zip(r.prompt_logprobs, ids)]
            for r, ids in zip(res, spec["score"])
        ]
        if k:
            # the K highest by rank (the sampled token is added to each dict too, with its own rank)
            out["prompt_topk"] = [
                [
                    None
                    if d is None
                    else {str(t): lp.logprob for t, lp in d.items() if lp.rank is not None and lp.rank <= k}
                    for d in r.prompt_logprobs
                ]
                for r in res
            ]
    with open(spec["out"], "w") as f:
        json.dump(out, f)
        f.flush()
        os.fsync(f.fileno())
    # vLLM's CPU engine can abort in its thread teardown at interpreter exit ("terminate called without
    # an active exception") after all work is done; the results are on disk, so leave without teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
