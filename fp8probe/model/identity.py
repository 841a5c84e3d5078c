"""Which student a file was made for: a name and a content hash of its config and weights.

A budget belongs to the student it was calibrated on (a depth-pruned copy's FP8 mismatch was 118x the full
student's on the demo), so budget.json records its student and `check`, `recipe --budget` and `plan` refuse to judge
another one. The name alone cannot say it (a path moves, a model id is re-uploaded, a directory is trained further),
so the hash is over what the model computes with:

    sha256( the config's JSON (sorted keys, without the keys that name or place it: _name_or_path, dtype,
            torch_dtype, transformers_version, architectures) ‖ for every tensor of the state dict, in name
            order: its name, its shape, its values as little-endian float32 )

float32 values, whatever dtype the model was loaded in: a BF16 checkpoint loaded in float32 or in bfloat16 hashes
alike (bf16 → fp32 is exact), and the hash does not depend on the device or on how the file was sharded.
"""

from __future__ import annotations

import hashlib
import json

VOLATILE = ("_name_or_path", "dtype", "torch_dtype", "transformers_version", "architectures", "_commit_hash")
SHORT = 12  # hex digits shown in messages


def content_hash(model, round_to=None) -> str:
    """The sha256 of `model`'s config and weights (module docstring); `round_to` (a torch dtype) rounds each weight to
    it first: an export hashes the bfloat16 weights llm-compressor starts from, and an fp32-loaded student of a BF16
    checkpoint rounds back to the very same values."""
    import torch

    h = hashlib.sha256()
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in VOLATILE}
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(json.dumps(list(t.shape)).encode())
        t = t.detach().to("cpu")
        if round_to is not None and t.is_floating_point():
            t = t.to(round_to)
        h.update(t.to(torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes())
    return h.hexdigest()


def identity(student) -> dict:
    """What budget.json records of a student: its name (what the user asked for) and its content hash."""
    return {"name": str(student.name), "sha256": content_hash(student.model)}


def same_student(recorded: dict | None, student) -> bool | None:
    """Whether `student` is the one `recorded` names (by content hash); None when nothing was recorded."""
    if not recorded or not recorded.get("sha256"):
        return None
    return content_hash(student.model) == recorded["sha256"]
