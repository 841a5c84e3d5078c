"""What a command runs on, as typed settings parsed once at the edge: the student (ModelSource) and its rollouts
(RolloutSettings). Validated on construction; an error names the field (`num_prompts`), which the CLI shows as
its flag (--num-prompts)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..core.errors import FP8ProbeError
from ..core.settings import Settings, opt


@dataclass(frozen=True)
class ModelSource(Settings):
    """A student and how to load it: a Hugging Face directory, a model id in the local HF cache, a .gguf file, or
    None for the embedded SmolLM2-135M-Instruct; fp32 on the CPU by default (bf16 is ~5x slower there)."""

    model: str | None = opt(
        None,
        "HF directory, model id in the local HF cache, .gguf file (capacity: also a bare "
        "config.json); default: the embedded SmolLM2-135M-Instruct",
        positional=True,
    )
    device: str = opt("cpu", "torch device: cpu, cuda, cuda:N, or auto (the model spread over this machine's GPUs)")
    dtype: str = opt("float32", "compute dtype (bf16 is ~5x slower on CPU)")
    trust_remote_code: bool = opt(False, "allow custom model code")
    allow_pickle: bool = opt(
        False,
        "load .bin/.pt weights with torch.load(weights_only=True); by default only "
        "safetensors and GGUF are read (never unpickled)",
    )

    @property
    def label(self) -> str:
        return self.model or "the embedded student (smollm2-135m)"

    def check(self):
        """The device and dtype exist here, the config is one fp8probe supports; returns the config."""
        from .devices import check_device, parse_dtype
        from .structure import check_supported

        check_device(self.device)
        parse_dtype(self.dtype)
        cfg = self.config()
        check_supported(cfg)
        return cfg

    def config(self):
        from .student import load_config

        return load_config(self.model, self.trust_remote_code, self.allow_pickle)

    def load(self):
        from .student import load_student

        return load_student(
            self.model,
            device=self.device,
            dtype=self.dtype,
            trust_remote_code=self.trust_remote_code,
            allow_pickle=self.allow_pickle,
        )


@dataclass(frozen=True)
class Sampling:
    """How rollouts are sampled: the first `num_prompts` prompts (None: all of them), `samples_per_prompt` responses
    each of at most `max_new_tokens` tokens, at `temperature` (0: greedy) and `top_p`, from `seed`, `batch_size`
    sequences at a time. The library's defaults; the CLI's are RolloutSettings' (RolloutSettings.sampling)."""

    num_prompts: int | None = None
    max_new_tokens: int = 64
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 8
    samples_per_prompt: int = 1
    chat_template_kwargs: dict | None = (
        None  # keywords of the tokenizer's chat template (verl's apply_chat_template_kwargs)
    )


@dataclass(frozen=True)
class RolloutSettings(Settings):
    """The student's own rollouts: sampled (`prompts` file or the built-in ones, the first `num_prompts`,
    `samples_per_prompt` each, up to `max_new_tokens` each, `seed`, `temperature`; 0 is greedy) or reused from a
    directory (`rollouts`)."""

    prompts: str | None = opt(
        None,
        "prompts file: text (one per line), JSONL with a 'prompt' field, or a parquet file as verl reads it (a column "
        "of chat messages or strings)",
    )
    prompt_key: str | None = opt(
        None,
        "the prompts file's field (column) holding each prompt (default: JSONL prompt/text/messages, parquet prompt)",
    )
    chat_template_kwargs: str | None = opt(
        None,
        "a JSON object of keywords for the tokenizer's chat template, as verl's data.apply_chat_template_kwargs "
        "(e.g. '{\"enable_thinking\": false}')",
    )
    num_prompts: int = opt(16, "use the first N prompts", low=1)
    samples_per_prompt: int = opt(1, "responses sampled per prompt (rollouts = prompts x this)", low=1)
    max_new_tokens: int = opt(48, "response length cap", low=1)
    seed: int = opt(0, "sampling seed", low=0)
    temperature: float = opt(1.0, "sampling temperature; 0 is greedy", low=0.0)
    batch_size: int = opt(8, "sequences per forward", low=1)
    rollouts: str | None = opt(None, "reuse the rollouts saved in this directory instead of sampling new ones")

    def __post_init__(self):
        super().__post_init__()
        self.template_kwargs  # a bad JSON object fails here, before any output

    @property
    def template_kwargs(self) -> dict | None:
        """`chat_template_kwargs` parsed (None: not given)."""
        if self.chat_template_kwargs is None:
            return None
        try:
            kw = json.loads(self.chat_template_kwargs)
        except json.JSONDecodeError as e:
            raise FP8ProbeError(
                f"`chat_template_kwargs` is not JSON ({e.msg}): give an object such as '{{\"enable_thinking\": false}}'"
            ) from e
        if not isinstance(kw, dict):
            raise FP8ProbeError(
                "`chat_template_kwargs` must be a JSON object of keywords, such as '{\"enable_thinking\": false}'"
            )
        return kw

    def sampling(self) -> Sampling:
        """How these settings sample new rollouts (make_rollouts)."""
        return Sampling(
            num_prompts=self.num_prompts,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            temperature=self.temperature,
            batch_size=self.batch_size,
            samples_per_prompt=self.samples_per_prompt,
            chat_template_kwargs=self.template_kwargs,
        )
