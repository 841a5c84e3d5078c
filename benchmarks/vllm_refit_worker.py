"""Runs inside the vLLM venv (imports vllm, never fp8probe): the RL frameworks' refit path against the disk load, for
benchmarks/vllm_refit.py.

    python vllm_refit_worker.py SPEC.json

SPEC: {"model": dir, "max_model_len": int, "out": path, "score": [[ids]...]}. Loads the checkpoint from disk and
scores each sequence (prompt log-probs of every token); then starts another engine with `load_format="dummy"` (as
verl, NeMo-RL and slime start their rollout engine) and pushes the checkpoint's own tensors into it through the
worker's in-place reload (`model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)`,
vllm/model_executor/model_loader/reload/inplace.py), and scores again. Writes {"disk": [[logprob...]...],
"refit": [[...]...], "differing": {name: [disk value sum, refit value sum]}} (every parameter and buffer of the model
whose dtype, shape or sum of |values| differs between the two engines), and "restored": the refit engine's scores
again once its attention scale buffers are set to the disk load's 1.0, to SPEC["out"].
"""

import json
import os
import sys


def main():
    spec = json.load(open(sys.argv[1]))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: the tensors pass by reference
    from safetensors.torch import load_file
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    files = sorted(f for f in os.listdir(spec["model"]) if f.endswith(".safetensors"))
    weights = [kv for f in files for kv in load_file(os.path.join(spec["model"], f)).items()]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0)

    def score(llm):
        res = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in spec["score"]], params)
        return [
            [None if d is None else d[t].logprob for d, t in zip(r.prompt_logprobs, ids)]
            for r, ids in zip(res, spec["score"])
        ]

    def state(worker):
        m = worker.model_runner.get_model()
        named = [*m.named_parameters(), *(("buffer " + k, v) for k, v in m.named_buffers())]
        return {k: [str(v.dtype), list(v.shape), float(v.detach().float().abs().sum())] for k, v in named}

    def push(worker):
        worker.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)

    kwargs = dict(model=spec["model"], enforce_eager=True, max_model_len=spec["max_model_len"], seed=0)
    disk_llm = LLM(**kwargs)
    disk, disk_state = score(disk_llm), disk_llm.collective_rpc(state)[0]
    del disk_llm
    refit_llm = LLM(**kwargs, load_format="dummy")
    refit_llm.collective_rpc(push)
    refit, refit_state = score(refit_llm), refit_llm.collective_rpc(state)[0]

    def neutral_scales(worker):  # the attention scales as the disk load leaves them (1.0): is that all that differs?
        for k, v in worker.model_runner.get_model().named_buffers():
            if k.rsplit(".", 1)[-1] in ("_q_scale", "_k_scale", "_v_scale", "_prob_scale"):
                v.fill_(1.0)

    refit_llm.collective_rpc(neutral_scales)
    restored = score(refit_llm)
    differing = {
        k: [v[2], (refit_state.get(k) or [None, None, None])[2]]
        for k, v in disk_state.items()
        if refit_state.get(k) != v
    }
    with open(spec["out"], "w") as f:
        json.dump(
            {"disk": disk, "refit": refit, "restored": restored, "differing": differing, "tensors": len(disk_state)}, f
        )
        f.flush()
        os.fsync(f.fileno())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # vLLM's CPU engine can abort in its teardown after the results are on disk


if __name__ == "__main__":
    main()
