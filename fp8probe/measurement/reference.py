"""The reference pass over the rollouts, and candidate passes that reuse its prefix.

Perturbing one unit in block b leaves blocks 0..b-1 untouched, so the reference pass records the input
(and keyword arguments: masks, rotary embeddings) of every decoder block, and a candidate pass starts at
block b from that record. The lm_head runs only on the positions that predict response tokens, in chunks,
and the mismatch statistics are taken chunk by chunk against the reference log-probabilities:

    reference:  embed -> block 0 .. block L-1 -> norm -> lm_head[response rows] -> log_softmax  (kept)
    candidate:  cached input of block b -> block b .. L-1 -> norm -> lm_head[rows] -> stats vs reference

A candidate pass from block 0 with nothing perturbed reproduces the reference exactly (the sweep's
built-in sanity row), and one from block b equals a naive full forward (tests/sweeps/test_sweep.py).
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from ..core.errors import FP8ProbeError
from ..model.structure import decoder_layers
from .calibration import record_calibration
from .mismatch import CHUNK_ROWS, RefRows, chunked_token_stats, log_softmax32, response_logits
from .scales import Calibration


def final_norm(model: nn.Module) -> nn.Module:
    return model.model.norm


def _softcap(model) -> float | None:
    return getattr(model.config, "final_logit_softcapping", None) or None


class Reference:
    """Reference activations and log-probs of a student on a set of rollouts."""

    def __init__(
        self,
        student,
        rollouts,
        batch_size: int = 8,
        calibrate: bool = True,
        kv_strategy: str = "tensor",
        storage: str = "auto",
        per_sequence: bool = False,
    ):
        self.model = student.model
        self.storage = reference_storage(storage, student.model.config, rollouts.num_response_tokens)
        self.layers = decoder_layers(self.model)
        self.device = next(self.model.parameters()).device
        self.softcap = _softcap(self.model)
        self.batches = []  # per batch: {"inputs": [(args, kwargs)] per layer, "rows", "cols", "tokens"}
        logps, tokens, sequence, top1, token_logp = [], [], [], [], []
        names = list(student.unit_names) if calibrate else []
        t0 = time.perf_counter()
        kept = rollouts if per_sequence else None  # each sequence's amax too (what a sweep keeps)
        cal_ctx = record_calibration(self.model, names, kv_strategy, kept) if calibrate else contextlib.nullcontext()
        with torch.no_grad(), cal_ctx as cal:
            for ids, am, resp in rollouts.batches(batch_size):
                start = sum(len(b["ids"]) for b in self.batches)  # this batch's first sequence
                if cal is not None:
                    cal.valid = am.to(self.device).bool()
                    cal.sequences = torch.arange(start, start + len(ids))
                rec = self._record_pass(ids.to(self.device), am.to(self.device), resp)
                logps.append(rec.pop("kept"))
                top1.append(rec.pop("top1"))
                token_logp.append(rec.pop("token_logp"))
                tokens.append(rec["tokens"])
                sequence.append(rec["rows"].cpu() + start)
                self.batches.append(rec)
        self.calibration: Calibration | None = cal
        # [M, V] fp32 reference log-probs of the rows that predict response tokens, or [M, H] hidden states the same
        # log-probs are recomputed from, chunk by chunk as each batch was (bit for bit the same numbers)
        cat = torch.cat
        self.rows = RefRows(
            cat(logps) if self.storage == "logp" else None,
            cat(top1),
            cat(tokens),
            cat(token_logp),
            cat(logps) if self.storage == "hidden" else None,
            _Head(self.model, self.softcap),
        )
        self.sequence = torch.cat(sequence)  # [M] the rollout each row belongs to
        self.prompt = rollouts.prompt_groups()[self.sequence]  # [M] its prompt: what intervals resample
        if not self._finite:
            bad = self._bad_rows
            raise FP8ProbeError(
                f"the reference pass gives NaN/inf log-probabilities at {bad} of {len(self.rows)} "
                "response positions: the model overflows in this dtype or its weights are broken; "
                "try `dtype` float32, or fix the checkpoint"
            )
        self.num_tokens = int(rollouts.attention_mask.sum())
        self.seconds = time.perf_counter() - t0

    def _record_pass(self, ids, am, resp) -> dict:
        inputs: list = [None] * len(self.layers)
        handles = []
        for i, layer in enumerate(self.layers):

            def pre(mod, args, kwargs, _i=i):
                inputs[_i] = (args, kwargs)

            handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        final = {}
        handles.append(final_norm(self.model).register_forward_pre_hook(lambda m, a: final.setdefault("h", a[0])))
        try:
            self.model.model(input_ids=ids, attention_mask=am, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        rows, cols = torch.nonzero(resp[:, 1:], as_tuple=True)
        tokens = ids[rows, cols + 1].cpu()
        hsel = final_norm(self.model)(final["h"][rows, cols])  # [M_b, H]
        chunks = [
            log_softmax32(self._head(hsel[s : s + CHUNK_ROWS]), self.softcap)
            for s in range(0, hsel.shape[0], CHUNK_ROWS)
        ]
        logp = torch.cat(chunks) if chunks else torch.zeros(0, self._vocab(), device=hsel.device)
        self._finite = getattr(self, "_finite", True) and bool(torch.isfinite(logp).all())
        self._bad_rows = getattr(self, "_bad_rows", 0) + int((~torch.isfinite(logp).all(-1)).sum())
        top1 = logp.argmax(-1).cpu()
        tok_lp = logp.gather(-1, tokens[:, None].to(logp.device)).squeeze(-1).cpu()
        kept = logp.cpu() if self.storage == "logp" else hsel.float().cpu()
        return {
            "inputs": inputs,
            "rows": rows,
            "cols": cols,
            "tokens": tokens,
            "kept": kept,
            "top1": top1,
            "token_logp": tok_lp,
            "ids": ids,
            "am": am,
        }

    def _vocab(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(h)

    def _final_hidden(self, rec) -> torch.Tensor:
        """The final norm's input from a whole forward, embeddings included (for perturbed embeddings)."""
        box = {}
        handle = final_norm(self.model).register_forward_pre_hook(lambda m, a: box.setdefault("h", a[0]))
        try:
            self.model.model(input_ids=rec["ids"], attention_mask=rec["am"], use_cache=False)
        finally:
            handle.remove()
        return box["h"]

    @torch.no_grad()
    def candidate_stats(self, start_block: int = 0) -> dict[str, torch.Tensor]:
        """Per-token statistics of the model as it is now (perturbed by the caller) against the reference.

        start_block -1 runs the whole model from its embeddings (a perturbation that changes them)."""
        parts: dict[str, list] = {}
        offset = 0
        for rec in self.batches:
            if start_block < 0:
                h = self._final_hidden(rec)
            else:
                h = rec["inputs"][start_block][0][0]
                for i in range(start_block, len(self.layers)):
                    a, kw = rec["inputs"][i]
                    out = self.layers[i](h, *a[1:], **kw)
                    h = out[0] if isinstance(out, tuple) else out
            hsel = final_norm(self.model)(h[rec["rows"], rec["cols"]])
            m = hsel.shape[0]
            st = chunked_token_stats(
                self.rows.rows(offset, offset + m), lambda s, e: self._head(hsel[s:e]), softcap=self.softcap
            )
            # chunked_token_stats applies the softcap before log_softmax, as the model's forward does
            offset += m
            for k, v in st.items():
                parts.setdefault(k, []).append(v)
        return {k: torch.cat(v) for k, v in parts.items()}

    # shipping the reference to another process (scaleout.py): everything but the model travels

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["model"] = state["layers"] = None
        return state

    def bind(self, student) -> "Reference":
        """This reference for another replica of the same student (a worker's): its model, its device."""
        ref = object.__new__(Reference)
        ref.__dict__.update(self.__dict__)
        ref.model = student.model
        ref.layers = decoder_layers(student.model)
        ref.device = next(student.model.parameters()).device
        if self.batches and len(ref.layers) != len(self.batches[0]["inputs"]):
            raise FP8ProbeError("the worker's student has another number of blocks than the driver's")
        ref.batches = [_to(rec, ref.device) for rec in self.batches]
        ref.rows.head = _Head(student.model, self.softcap)
        return ref

    def nbytes(self) -> int:
        """Bytes of tensors a worker receives: recorded block inputs, reference log-probs, rollouts."""
        seen: dict[int, int] = {}
        _count(self.batches, seen)
        _count(self.rows.tensors(), seen)
        return sum(seen.values())


class _Head:
    """Hidden states [m, H] -> fp32 log-probs [m, V]: the student's lm_head, softcap and log_softmax (what the
    reference pass computed). Pickled without the model; Reference.bind gives a worker's copy its own."""

    def __init__(self, model, softcap):
        self.model, self.softcap = model, softcap

    @torch.no_grad()
    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        out = self.model.get_output_embeddings()
        return log_softmax32(out(h.to(out.weight.device, out.weight.dtype)), self.softcap)

    def __getstate__(self) -> dict:
        return {"model": None, "softcap": self.softcap}


# Above this many bytes of fp32 reference log-probs (response tokens x vocabulary x 4), storage "auto" keeps the
# hidden states instead (benchmarks/reference_storage.py measured both: identical rows, and the time it costs)
HIDDEN_ABOVE_BYTES = 1 << 30
STORAGES = ("auto", "logp", "hidden")


def reference_storage(storage: str, config, response_tokens: int) -> str:
    """ "logp" or "hidden" for `storage` ("auto": hidden when the log-prob table would exceed HIDDEN_ABOVE_BYTES)."""
    from ..model.structure import text_config

    if storage not in STORAGES:
        raise FP8ProbeError(f"unknown reference storage {storage!r}; one of {', '.join(STORAGES)}")
    if storage != "auto":
        return storage
    return "hidden" if response_tokens * text_config(config).vocab_size * 4 > HIDDEN_ABOVE_BYTES else "logp"


@torch.no_grad()
def response_rows(model, rollouts, batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """A plain forward of `model` (as it is now) over the rollouts: the fp32 logits [M, V] of the positions that
    predict the response tokens and those tokens [M], in the reference's row order."""
    dev = next(model.parameters()).device
    rows, toks = [], []
    for ids, am, resp in rollouts.batches(batch_size):
        ids, am, resp = ids.to(dev), am.to(dev), resp.to(dev)
        r, t = response_logits(model(input_ids=ids, attention_mask=am, use_cache=False).logits, ids, resp)
        rows.append(r.float())
        toks.append(t)
    return torch.cat(rows), torch.cat(toks)


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def _count(obj, seen: dict) -> None:
    if isinstance(obj, torch.Tensor):
        seen[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
    elif isinstance(obj, dict):
        for v in obj.values():
            _count(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _count(v, seen)
