"""Which student a file was made for: a name and a content hash of what it computes with.

A budget belongs to the student it was calibrated on (a depth-pruned copy's FP8 mismatch was 118x the full
student's on the demo), so budget.json records its student and `check`, `recipe --budget` and `plan` refuse to judge
another one. The name alone cannot say it (a path moves, a model id is re-uploaded, a directory is trained further),
so the hash is over what the model computes with (version 2, `HASH`):

    sha256( the config's JSON (sorted keys) without the keys that name or place it or only say how it is run
            (RUNTIME: _name_or_path, dtype, use_cache, return_dict, output_*, token ids, label maps, ...)
            ‖ for every tensor of the state dict, in name order: its name, its shape, its values as little-endian
            float32 ‖ the tokenizer's vocabulary (token -> id, sorted) when the student has one )

A trainer's save with `use_cache: false` or another `_name_or_path` is the same student; other weights, another
architecture field (hidden size, rope theta, ...) or another vocabulary are not. Version 1 (budget.json files written
before it: no `hash` key) hashed every config key but a few, so runtime flags changed it; a recorded version-1 hash is
compared with version 1.

float32 values, whatever dtype the model was loaded in: a BF16 checkpoint loaded in float32 or in bfloat16 hashes
alike (bf16 → fp32 is exact), and the hash does not depend on the device or on how the file was sharded.
"""

from __future__ import annotations

import hashlib
import json

VOLATILE = ("_name_or_path", "dtype", "torch_dtype", "transformers_version", "architectures", "_commit_hash")
# config keys that say how a model is run, named or labelled, not what it computes (left out of the version-2 hash)
RUNTIME = (
    *VOLATILE,
    "_model_name_or_path",
    "use_cache",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "output_router_logits",
    "torchscript",
    "use_bfloat16",
    "tf_legacy_loss",
    "chunk_size_feed_forward",
    "id2label",
    "label2id",
    "problem_type",
    "finetuning_task",
    "task_specific_params",
    "tokenizer_class",
    "prefix",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sep_token_id",
    "decoder_start_token_id",
    "_attn_implementation",
    "_attn_implementation_autoset",
    "attn_implementation",
    "max_length",
)
HASH = 2  # the content hash's version (module docstring)
SHORT = 12  # hex digits shown in messages


def content_hash(model, round_to=None, tokenizer=None, version: int = HASH) -> str:
    """The sha256 of what `model` computes with (module docstring; `version` 1 for a hash recorded before version 2);
    `round_to` (a torch dtype) rounds each weight to it first: an export hashes the bfloat16 weights llm-compressor
    starts from, and an fp32-loaded student of a BF16 checkpoint rounds back to the very same values."""
    import torch

    h = hashlib.sha256()
    left_out = VOLATILE if version == 1 else RUNTIME
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in left_out}
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(json.dumps(list(t.shape)).encode())
        t = t.detach().to("cpu")
        if round_to is not None and t.is_floating_point():
            t = t.to(round_to)
        h.update(t.to(torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes())
    if version >= 2 and tokenizer is not None:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    return h.hexdigest()


def identity(student) -> dict:
    """What budget.json records of a student: its name (what the user asked for) and its content hash (`hash`: its
    version)."""
    sha = content_hash(student.model, tokenizer=getattr(student, "tokenizer", None))
    return {"name": str(student.name), "sha256": sha, "hash": HASH}


def hash_as_recorded(recorded: dict, student) -> str:
    """`student`'s content hash in the version `recorded` (an identity() dict; no `hash` key: version 1) was made in."""
    version = int(recorded.get("hash", 1))
    return content_hash(student.model, tokenizer=getattr(student, "tokenizer", None), version=version)


def same_student(recorded: dict | None, student) -> bool | None:
    """Whether `student` is the one `recorded` names (by content hash); None when nothing was recorded."""
    if not recorded or not recorded.get("sha256"):
        return None
    return hash_as_recorded(recorded, student) == recorded["sha256"]


def same_architecture(a, b) -> bool:
    """Whether two students could be one trained from the other: the same config (RUNTIME keys aside), the same
    weight names and shapes, the same vocabulary."""
    ca = {k: v for k, v in a.model.config.to_dict().items() if k not in RUNTIME}
    cb = {k: v for k, v in b.model.config.to_dict().items() if k not in RUNTIME}
    shapes = [{n: tuple(t.shape) for n, t in s.model.state_dict().items()} for s in (a, b)]
    return ca == cb and shapes[0] == shapes[1] and a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
