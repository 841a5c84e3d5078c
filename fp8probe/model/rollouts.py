"""The student's own rollouts: prompts -> sampled responses, as token tensors saved once and reused.

Every later measurement scores the same tokens, so they are sampled once from the BF16 (here: fp32)
student, like RL rollouts (temperature 1.0, no top-k / top-p by default), with a fixed seed, and saved:

    rollouts.safetensors   input_ids [N, T] int64      prompt + response, right-padded with pad_token_id
                           attention_mask [N, T] int64  1 on real tokens
                           response_mask [N, T] int64   1 where input_ids[i, t] is a sampled response token
                                                        (the closing EOS included when it was sampled)
    rollouts.json          schema_version, model, prompts, sampling settings, seed, token counts

No pickle anywhere: safetensors and JSON only.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import __version__
from ..core.artifacts import SCHEMA_KEY
from ..core.errors import FP8ProbeError, one_line
from ..core.files import atomic_write_bytes
from ..core.progress import bar_interval
from ..core.records import RolloutsRecord
from .prompts import BUILTIN_PROMPTS
from .settings import Sampling

log = logging.getLogger(__name__)

SCHEMA_VERSION = RolloutsRecord.VERSION
TENSORS = "rollouts.safetensors"
META = RolloutsRecord.KIND


@dataclass
class Rollouts:
    input_ids: torch.Tensor  # [N, T] int64
    attention_mask: torch.Tensor  # [N, T] int64
    response_mask: torch.Tensor  # [N, T] int64
    meta: RolloutsRecord | None = None  # rollouts.json: how they were sampled (None: made in memory)

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum())

    @classmethod
    def from_sequences(
        cls, prompts: list[list[int]], responses: list[list[int]], pad: int, meta: RolloutsRecord | None = None
    ) -> "Rollouts":
        """Token tensors from prompt and response ids: prompt + response, right-padded with `pad`."""
        t_max = max(len(p) + len(r) for p, r in zip(prompts, responses))
        n = len(prompts)
        input_ids = torch.full((n, t_max), pad, dtype=torch.int64)
        attention_mask = torch.zeros((n, t_max), dtype=torch.int64)
        response_mask = torch.zeros((n, t_max), dtype=torch.int64)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            input_ids[i, : len(p) + len(r)] = torch.tensor(p + r)
            attention_mask[i, : len(p) + len(r)] = 1
            response_mask[i, len(p) : len(p) + len(r)] = 1
        return cls(input_ids, attention_mask, response_mask, meta)

    def prompt_groups(self) -> torch.Tensor:
        """[N] one label per distinct prompt (its token ids), in order of first appearance. Several samples of one
        prompt are not independent draws of the prompt distribution, so intervals resample prompts."""
        keys: dict[tuple, int] = {}
        prompt = (self.attention_mask == 1) & (self.response_mask == 0)
        return torch.tensor(
            [
                keys.setdefault(tuple(self.input_ids[i][prompt[i]].tolist()), len(keys))
                for i in range(self.num_sequences)
            ],
            dtype=torch.int64,
        )

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_groups().max()) + 1 if self.num_sequences else 0

    def can_split(self, holdout_every: int) -> bool:
        """Whether holding out every k-th prompt leaves two prompts or more on each side."""
        n = self.num_prompts
        return holdout_every >= 2 and n // holdout_every >= 2 and n - n // holdout_every >= 2

    def digest(self) -> str:
        """sha256 of the token, attention and response tensors: the same rollouts on every machine, nothing else."""
        import hashlib

        h = hashlib.sha256()
        for x in (self.input_ids, self.attention_mask, self.response_mask):
            h.update(str(tuple(x.shape)).encode())
            h.update(x.contiguous().numpy().tobytes())
        return h.hexdigest()

    def subset(self, sequences) -> "Rollouts":
        """The rollouts at these sequence indices, in their order (tensors trimmed to the longest kept sequence)."""
        idx = torch.as_tensor(list(sequences), dtype=torch.int64)
        am = self.attention_mask[idx]
        t = int(am.sum(1).max()) if len(idx) else 0
        return Rollouts(
            self.input_ids[idx, :t].clone(), am[:, :t].clone(), self.response_mask[idx, :t].clone(), self.meta
        )

    def split(self, holdout_every: int) -> tuple["Rollouts", "Rollouts", dict]:
        """(search, held out, the split as recorded): every `holdout_every`-th distinct prompt (0-based prompt
        k with k % holdout_every == holdout_every - 1), with all of its samples, is held out; the rest is the search
        set. Deterministic: the same rollouts split the same way on every machine."""
        if holdout_every < 2:
            raise FP8ProbeError(f"`holdout` {holdout_every}: hold out every k-th prompt with k >= 2 (0: no split)")
        if not self.can_split(holdout_every):
            raise FP8ProbeError(
                f"the rollouts hold {self.num_prompts} distinct prompts: too few to hold out every "
                f"k-th (k = {holdout_every}) and keep two on each side; sample more (`num_prompts`) "
                "or pass `holdout` 0"
            )
        groups = self.prompt_groups()
        held = [i for i, g in enumerate(groups.tolist()) if g % holdout_every == holdout_every - 1]
        search = [i for i, g in enumerate(groups.tolist()) if g % holdout_every != holdout_every - 1]
        a, b = self.subset(search), self.subset(held)
        doc = {
            "holdout_every": holdout_every,
            "search_sequences": search,
            "heldout_sequences": held,
            "search_prompts": len({int(groups[i]) for i in search}),
            "heldout_prompts": len({int(groups[i]) for i in held}),
            "search_tokens": a.num_response_tokens,
            "heldout_tokens": b.num_response_tokens,
        }
        return a, b, doc

    def check_fits(self, config, where: str = "the rollouts") -> None:
        """Refuse rollouts that this model cannot score: token ids past its vocabulary, sequences past its
        context (they were sampled from another model, or the file was edited)."""
        vocab = getattr(config, "vocab_size", None)
        if vocab is None and hasattr(config, "get_text_config"):
            vocab = config.get_text_config().vocab_size
        top = int(self.input_ids.max()) if self.input_ids.numel() else 0
        if vocab is not None and top >= vocab:
            source = self.meta.model if self.meta else None
            raise FP8ProbeError(
                f"{where} hold token id {top}, past this model's vocabulary of {vocab}: they "
                f"come from another model ({source}); sample new ones for this model"
            )
        ctx = context_length(config)
        longest = int(self.attention_mask.sum(1).max()) if self.num_sequences else 0
        if ctx and longest > ctx:
            raise FP8ProbeError(
                f"{where} hold a sequence of {longest} tokens, longer than this model's context "
                f"of {ctx}; sample new ones for this model"
            )

    def batches(self, batch_size: int):
        """Row slices of at most batch_size sequences, each trimmed to its longest sequence."""
        for s in range(0, self.num_sequences, batch_size):
            am = self.attention_mask[s : s + batch_size]
            t = int(am.sum(1).max())
            yield (self.input_ids[s : s + batch_size, :t], am[:, :t], self.response_mask[s : s + batch_size, :t])


def context_length(config) -> int | None:
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(cfg, "max_position_embeddings", None)


def _is_prompt(val) -> bool:
    """A prompt fp8probe samples from: a string, or chat messages ({"role": str, "content": str} each)."""
    return isinstance(val, str) or (
        isinstance(val, list)
        and bool(val)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in val
        )
    )


def _parquet_prompts(p: Path, key: str | None) -> list:
    """Prompts from a parquet file as verl's RLHFDataset reads it: the `key` column (verl's data.prompt_key,
    default "prompt"), each row chat messages or a string."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise FP8ProbeError(f"reading {p} needs pyarrow (verl installs it): pip install pyarrow") from e
    key = key or "prompt"
    try:
        table = pq.read_table(p)
    except Exception as e:  # pyarrow's errors have no common base: a file that is not parquet
        raise FP8ProbeError(f"{p} is not a readable parquet file ({one_line(e)})") from e
    if key not in table.column_names:
        raise FP8ProbeError(
            f"{p} has no column {key!r} (it has {', '.join(table.column_names)}): name the prompts' column with "
            "`prompt_key`, as verl's data.prompt_key"
        )
    out = table.column(key).to_pylist()
    for i, val in enumerate(out):
        if isinstance(val, list):  # parquet keeps a struct's every field: drop the ones a message leaves empty
            val = [{k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in val]
            out[i] = val
        if not _is_prompt(val):
            raise FP8ProbeError(
                f"{p} row {i}: {key!r} must be a string or chat messages with string content (multimodal prompts "
                "are not sampled here)"
            )
    if not out:
        raise FP8ProbeError(f"{p} holds no rows")
    return out


def read_prompts(path: str | Path, key: str | None = None) -> list:
    """Prompts from a text file (one per line), JSONL (the `key` field, else "prompt", "text" or "messages") or a
    parquet file as verl reads it (the `key` column, default "prompt"): strings, or chat messages."""
    p = Path(path)
    if p.is_dir():
        raise FP8ProbeError(
            f"`prompts` {path} is a directory; pass a text file (one prompt per line), JSONL or parquet"
        )
    if not p.is_file():
        raise FP8ProbeError(f"no such prompts file: {path}")
    if p.suffix == ".parquet":
        return _parquet_prompts(p, key)
    try:
        lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except UnicodeDecodeError as e:
        raise FP8ProbeError(f"{path} is not a UTF-8 text or JSONL prompts file") from e
    if not lines:
        raise FP8ProbeError(f"prompts file {path} is empty: give one prompt per line, or JSONL with a 'prompt' field")
    if p.suffix == ".jsonl":
        out = []
        for i, ln in enumerate(lines, 1):
            try:
                rec = json.loads(ln)
            except json.JSONDecodeError as e:
                raise FP8ProbeError(f"{path}:{i} is not valid JSON ({e.msg})") from e
            if key is not None:
                val = rec.get(key) if isinstance(rec, dict) else None
                if not val:
                    raise FP8ProbeError(f"{path}:{i} has no {key!r} field (`prompt_key`)")
            else:
                val = rec.get("prompt", rec.get("text", rec.get("messages"))) if isinstance(rec, dict) else rec
                if not val:
                    raise FP8ProbeError(f"{path}:{i} has no 'prompt', 'text' or 'messages' field")
            if not _is_prompt(val):
                raise FP8ProbeError(
                    f"{path}:{i}: a prompt must be a string, or 'messages' a list of "
                    '{"role": ..., "content": ...} objects'
                )
            out.append(val)
        return out
    return [ln.strip() for ln in lines]


def encode_prompt(tokenizer, prompt, template_kwargs: dict | None = None) -> list[int]:
    """The prompt's token ids as the chat template writes it (with `template_kwargs`, as verl passes its
    apply_chat_template_kwargs), or its text where the tokenizer has no template."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **(template_kwargs or {})
        )
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return list(ids)
    text = "\n".join(m["content"] for m in messages)
    return tokenizer(text)["input_ids"]


@torch.no_grad()
def make_rollouts(
    student,
    prompts: list | str | Path | None = None,
    sampling: Sampling | None = None,
    *,
    progress: bool = False,
    **fields,
) -> Rollouts:
    """Sample the student's responses to the prompts (built-in ones by default) as `sampling` says, with `fields`
    (Sampling's, e.g. num_prompts=4, max_new_tokens=16) changed; the samples of one prompt are consecutive
    sequences."""
    unknown = sorted(set(fields) - set(Sampling.__dataclass_fields__))
    if unknown:
        raise TypeError(f"make_rollouts() got an unexpected keyword argument {unknown[0]!r}")
    how = replace(sampling or Sampling(), **fields)
    num_prompts, max_new_tokens, seed, temperature = how.num_prompts, how.max_new_tokens, how.seed, how.temperature
    top_p, batch_size, samples_per_prompt = how.top_p, how.batch_size, how.samples_per_prompt
    template_kwargs = how.chat_template_kwargs
    if isinstance(prompts, (str, Path)):
        prompts = read_prompts(prompts)
    prompts = list(BUILTIN_PROMPTS if prompts is None else prompts)
    if num_prompts is not None:
        if num_prompts < 1:
            raise FP8ProbeError("`num_prompts` must be at least 1")
        prompts = prompts[:num_prompts]
    if not prompts:
        raise FP8ProbeError("no prompts given: pass a prompts file with at least one prompt")
    if samples_per_prompt < 1:
        raise FP8ProbeError("`samples_per_prompt` must be at least 1")
    if max_new_tokens < 1:
        raise FP8ProbeError("`max_new_tokens` must be at least 1")
    model, tok = student.model, student.tokenizer
    device = next(model.parameters()).device
    eos = eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    encoded = [encode_prompt(tok, p, template_kwargs) for p in prompts for _ in range(samples_per_prompt)]
    ctx = context_length(model.config)
    for i, ids in enumerate(encoded):
        if ctx and len(ids) + max_new_tokens > ctx:
            raise FP8ProbeError(
                f"prompt {i + 1} is {len(ids)} tokens; with `max_new_tokens` {max_new_tokens} that "
                f"exceeds the model's context of {ctx}: shorten it or lower `max_new_tokens`"
            )
    seqs: list[tuple[list[int], list[int]]] = []
    from tqdm.auto import tqdm

    bar = tqdm(total=len(encoded), desc="rollouts", unit="prompt", disable=not progress, mininterval=bar_interval())
    for bi, s in enumerate(range(0, len(encoded), batch_size)):
        batch = encoded[s : s + batch_size]
        width = max(len(x) for x in batch)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch], device=device)  # left-padded
        am = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch], device=device)
        gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + bi)
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
        out = model.generate(
            input_ids=ids,
            attention_mask=am,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=top_p,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
        )
        for row, prompt_ids in enumerate(batch):
            resp = out[row, width:].tolist()
            for i, t in enumerate(resp):
                if t in eos:
                    resp = resp[: i + 1]
                    break
            seqs.append((prompt_ids, resp))
        bar.update(len(batch))
    bar.close()
    out = Rollouts.from_sequences([p for p, _ in seqs], [resp for _, resp in seqs], pad)
    out.meta = RolloutsRecord(
        fp8probe_version=__version__,
        model=student.name,
        model_path=student.path,
        prompts=prompts,
        sampling={
            "temperature": temperature,
            "top_p": top_p,
            "top_k": 0,
            "max_new_tokens": max_new_tokens,
            "batch_size": batch_size,
            "eos_token_ids": eos,
            "samples_per_prompt": samples_per_prompt,
            # only where given: rollouts.json without it reads as before (the template's defaults)
            **({"chat_template_kwargs": template_kwargs} if template_kwargs else {}),
        },
        seed=seed,
        num_sequences=out.num_sequences,
        num_tokens=int(out.attention_mask.sum()),
        num_response_tokens=out.num_response_tokens,
    )
    return out


def eos_ids(model, tok) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tok.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    return [int(e) for e in eos if e is not None]


def save_rollouts(r: Rollouts, out_dir: str | Path) -> None:
    from safetensors.torch import save

    out = Path(out_dir)
    data = save(
        {
            "input_ids": r.input_ids.contiguous(),
            "attention_mask": r.attention_mask.contiguous(),
            "response_mask": r.response_mask.contiguous(),
        },
        metadata={SCHEMA_KEY: str(SCHEMA_VERSION)},
    )
    atomic_write_bytes(out / TENSORS, data)
    (r.meta or RolloutsRecord()).write(out / META)


def load_rollouts(directory: str | Path) -> Rollouts:
    """Rollouts saved by save_rollouts (or `fp8probe rollouts` / `fp8probe sweep`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(directory)
    if not (d / TENSORS).is_file() or not (d / META).is_file():
        raise FP8ProbeError(
            f"{directory} holds no rollouts ({TENSORS} and {META}); create them with `fp8probe rollouts`"
        )
    try:
        t = load_file(str(d / TENSORS))
    except (SafetensorError, OSError) as e:
        raise FP8ProbeError(f"rollouts in {directory} are unreadable ({e}); create them again") from e
    meta = RolloutsRecord.read(d / META, "create them again with `fp8probe rollouts`")
    missing = {"input_ids", "attention_mask", "response_mask"} - set(t)
    if missing:
        raise FP8ProbeError(f"rollouts in {directory} lack {', '.join(sorted(missing))}")
    r = Rollouts(t["input_ids"], t["attention_mask"], t["response_mask"], meta)
    _check_tensors(r, directory)
    return r


def _check_tensors(r: Rollouts, where) -> None:
    """Shapes, dtypes and masks as save_rollouts writes them; anything else was not written by fp8probe."""

    def bad(what):
        raise FP8ProbeError(f"rollouts in {where}: {what}; create them again with `fp8probe rollouts`")

    tensors = {"input_ids": r.input_ids, "attention_mask": r.attention_mask, "response_mask": r.response_mask}
    for name, x in tensors.items():
        if x.dtype != torch.int64 or x.ndim != 2:
            bad(f"{name} must be a 2-D int64 tensor, not {x.ndim}-D {x.dtype}")
        if x.shape != r.input_ids.shape:
            bad(f"{name} has shape {tuple(x.shape)}, input_ids {tuple(r.input_ids.shape)}")
    if r.num_sequences == 0:
        bad("no sequences")
    if int(r.input_ids.min()) < 0:
        bad("negative token ids")
    for name in ("attention_mask", "response_mask"):
        if not bool(((tensors[name] == 0) | (tensors[name] == 1)).all()):
            bad(f"{name} holds values other than 0 and 1")
    if bool((r.response_mask > r.attention_mask).any()):
        bad("response tokens outside the attention mask")
    if r.num_response_tokens == 0:
        bad("no response tokens")
    if bool((r.response_mask[:, 0] == 1).any()):
        bad("a response token at position 0 (nothing predicts it)")
