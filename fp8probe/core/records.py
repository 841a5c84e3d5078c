"""The record of every versioned file fp8probe writes whose content is plain data (core/artifacts.py's table holds
their versions; Recipe, Budget and the calibration's Experiment are records too, beside the code that uses them).
Each is a frozen dataclass: its fields are the file's keys in the file's order; `write` and `read` are Record's."""

from __future__ import annotations

from dataclasses import dataclass

from .artifacts import Record, added, optional


@dataclass(frozen=True, kw_only=True)
class StudentRecord(Record):
    """student.json, written beside an export: the student it was made from (its name, content_hash of the weights as
    llm-compressor read them, and in words which weights those were); `audit` loads that student to check against."""

    KIND = "student.json"
    name: str
    sha256: str
    weights: str


@dataclass(frozen=True, kw_only=True)
class MismatchRecord(Record):
    """mismatch.json: the whole model's mismatch in one scheme (and KV cache), every metric, as `engine` computes it."""

    KIND = "mismatch.json"
    command: str
    model: str
    scheme: str
    engine: str
    kv_cache_dtype: str | None
    num_sequences: int
    num_response_tokens: int
    metrics: dict  # metric name -> value
    # the prefix shift: the candidate's own continuations, verl's metrics of them among its keys (added within 1)
    prefix_shift: dict | None = optional()
    arithmetic: dict  # core/artifacts.py arithmetic(): the torch and CPU facts the figures depend on
    seconds: float
    versions: dict[str, str]  # package -> version (core/artifacts.py versions())


@dataclass(frozen=True, kw_only=True)
class LadderRecord(Record):
    """ladder.json, beside ladder.csv: what the ladder measured (its sources, each with its kind and parts), on which
    rollouts and in which arithmetic."""

    KIND = "ladder.json"
    command: str
    model: str
    teacher: str | None
    engine: str
    sources: list  # {"name", "kind", "parts"} per rung, in the table's order
    num_sequences: int
    num_response_tokens: int
    noise_seed: int
    prefix_seed: int
    arithmetic: dict  # core/artifacts.py arithmetic()
    seconds: float
    versions: dict[str, str]  # package -> version


@dataclass(frozen=True, kw_only=True)
class PlanRecord(Record):
    """plan.json: each rollout configuration's measured cost, modelled throughput and time to quality (`rows`, the
    columns of plan.csv and more), with the device, lengths, train step, budget and calibration they were planned on."""

    KIND = "plan.json"
    command: str
    model: str
    gpu: str
    tensor_parallel_size: int
    modelled: str  # what is modelled, in words
    device: dict  # the device model's figures
    gpu_source: str
    rollout_batch: int
    lengths: str  # where the prompt and response lengths came from
    mean_prompt_len: float
    mean_response_len: float
    train_step_s: float
    train_step: str  # how the train step was had, in words
    teacher: dict | None = optional()  # OPD: the teacher's scoring pass, a stage of each step (MODELLED)
    budget: dict  # the budget it judged by: metric, value, interval, calibrated, source, student
    calibration: dict | None  # the learning curves' source, objective, steps, seeds, target and its rule
    assumed_steps: int | None
    arithmetic: dict | None = added()  # added within version 1
    verl_async: dict | None = optional()  # verl's fully-async keys and each regime's lags (`plan --verl-async`)
    rows: list  # one dict per configuration
    seconds: float
    versions: dict[str, str]  # package -> version


@dataclass(frozen=True, kw_only=True)
class RecipeRecord(Record):
    """recipe.json, beside recipe.yaml: how a recipe was chosen (recipe/recipe.py's Recipe holds the same figures and
    writes this). Versions 1 and 2 read too: a key they lack is None."""

    KIND = "recipe.json"
    model: str | None = None
    scheme: str | None = None
    kv_cache_scheme: str | None = None  # the FP8 KV cache's name (Recipe.kv_cache_dtype), None: the model's
    budget: float | None = None
    metric: str | None = None
    predicted: float | None = None
    measured: float | None = None  # on the held-out prompts where there was a split
    measured_metrics: dict[str, float] | None = None  # metric name -> the recipe's measured value
    bytes_saved: int | None = None
    kept: list[str] | None = None  # the units kept BF16
    quantized: list[str] | None = None  # the units in FP8
    kept_scores: list | None = None  # per kept group: its name, score and bytes (recipe/selection.py)
    group_units: dict[str, list[str]] | None = None  # fused group -> its units
    search: list | None = None  # the search's moves, each with its outcome
    sweep: str | None = None
    form: str | None = None
    target: str | None = None
    kv_scale: str | None = None
    memory_target: dict | None = None  # recipe/settings.py MemoryTarget's fields, when one was asked for
    fp8_share: float | None = None
    effective_bits: float | None = None
    measured_search: float | None = None
    measured_interval: list[float] | None = None  # [low, high], 90 %, on the held-out prompts
    split: dict | None = None  # the search and held-out prompts: how many, which (recipe/refine.py)
    measured_engine: dict | None = None  # the held-out figure as another engine computes it: engine, value, interval
    kv_skip_layers: list | None = optional()  # layers whose KV cache stays in the model dtype (a per-layer KV map)
    kv_tokens: int | None = optional()  # the KV tokens in flight a per-layer KV map was chosen at
    kv_context: int | None = optional()  # one sequence's tokens among them (sliding-window layers priced at min(., W))
    costs: dict | None = optional()  # written by recipes priced with the former `--costs` (now benchmarks/pricing.py)


@dataclass(frozen=True, kw_only=True)
class AgreementRecord(Record):
    """agreement.json, beside a fast sweep: how its estimates agree with an exact sweep's rows on the same rollouts
    (rank correlation, top-10 overlap, median scale) and the two recipes each table makes at one budget, measured."""

    KIND = "agreement.json"
    rows: int
    spearman: float
    top10_overlap: int
    scale: float  # median estimate / exact
    budget: dict  # {"metric", "value", "whole_model_exact"}
    recipes: dict  # {"exact": ..., "fast": ..., "same": bool}
    exact_sweep: str | None = optional()  # the exact sweep's directory


@dataclass(frozen=True, kw_only=True)
class SweepRunRecord(Record):
    """run.json, beside sensitivity.csv: what a sweep measured (the student, scheme, granularity, method, rollouts and
    arithmetic), the whole model's rows and the time each stage took. Sweeps written before `arithmetic`,
    `whole_model` or the workers were recorded read with those None."""

    KIND = "run.json"
    command: str | None = None
    model: str
    model_path: str
    model_type: str | None = None
    scheme: str
    granularity: str | None = None
    include_kv: bool | None = None
    kv_cache_dtype: str | None = None
    seed: int | None = None
    method: dict | None = None  # SweepSettings.recorded
    exact_rows: int | None = None
    workers: dict | None = None  # the Ray row workers' statistics (sweeps/scaleout.py), or {'workers': 1}
    device: str | None = None
    dtype: str | None = None
    batch_size: int
    arithmetic: dict | None = added()  # added within version 1
    num_sequences: int | None = None
    num_tokens: int | None = None
    num_response_tokens: int | None = None
    rows: int | None = None
    whole_model: dict | None = added()  # added within version 1
    seconds: dict | None = added()  # (the golden sweep leaves the times and versions out)
    versions: dict[str, str] | None = added()  # package -> version


@dataclass(frozen=True, kw_only=True)
class RolloutsRecord(Record):
    """rollouts.json, beside rollouts.safetensors: how the rollouts were sampled (the student, the prompts, the
    sampling settings and seed) and their size. A Rollouts made in memory (a trainer's completions, prefix-shift
    samples) has none."""

    KIND = "rollouts.json"
    fp8probe_version: str | None = None
    model: str | None = None
    model_path: str | None = None
    prompts: list[str] | None = None  # the prompts, in order
    sampling: dict | None = None  # temperature, top_p, top_k, max_new_tokens, batch_size, eos_token_ids, samples
    seed: int | None = None
    num_sequences: int | None = None
    num_tokens: int | None = None
    num_response_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class CapacityRecord(Record):
    """capacity.json: BF16 (auto KV) against a candidate (a recipe's FP8 units, an FP8 KV cache), each side's
    weights, KV layout and KV pool as vLLM sizes them, and the two ratios. `model` and `recipe` are what the command
    was given (None from the library)."""

    KIND = "capacity.json"
    vllm_version: str
    model_type: str
    max_model_len: int
    block_size: int
    tensor_parallel_size: int
    gpu: str | None  # None: a fixed KV memory was given
    gpu_memory_utilization: float
    baseline: dict  # deploy/capacity.py kv_pool(): weights, KV bytes, blocks, tokens, concurrency
    candidate: dict  # the same for the recipe's configuration
    ratio_kv_tokens: float
    ratio_concurrency: float
    model: str | None = None
    recipe: str | None = None


@dataclass(frozen=True, kw_only=True)
class AuditRecord(Record):
    """audit.json: whether an export holds what its recipe says (`clean`), every finding ({"kind", "where",
    "message"}), what was checked (counts per check), which student the weights were checked against, and with
    `--vllm` what vLLM-CPU realised."""

    KIND = "audit.json"
    clean: bool
    findings: list  # each deploy/audit.py Finding's fields: kind, where, message
    checked: dict  # what each check covered, by check name (counts and lists)
    student: dict | None = None  # StudentRecord's fields (student.json), where the weights were compared
    vllm: dict | None = optional()  # the engine check (--vllm): vLLM-CPU's figures against fp8probe's prediction


@dataclass(frozen=True, kw_only=True)
class CheckRecord(Record):
    """check.json: the verdict on one rollout configuration (ADMIT, REJECT or UNCERTAIN) and everything behind it: the
    figure measured with its interval, the budget (ruler) it was judged against with its interval and source, the
    calibration levels read for its kinds, how many prompts would decide it, what else was measured (another
    engine's figure, the prefix shift, the OPD signal), the rollouts and the arithmetic."""

    KIND = "check.json"
    verdict: str
    configuration: str
    config: str  # the configuration as a budget's levels name it (sources/config.py RolloutConfig)
    engine: str  # the engine the check was asked for (the prefix shift's and the OPD signal's)
    judged_engine: str  # the engine the verdict's figure was measured in: the budget's scale (sim when calibrated)
    metric: str
    measured: float
    measured_interval: list[float]  # [low, high], 90 %
    interval_level: float
    budget: float
    margin: float | None  # the distance to `decided_by`'s threshold, positive on the admitting side
    decided_by: dict  # rule (level | levels | ruler), threshold and its name, seeds_to_decide
    budget_calibrated: bool
    budget_source: str
    budget_interval: list[float] | None  # [low, high], 90 %
    budget_censored: bool
    budget_interval_censored: bool
    judged_on: str
    kind_evidence: list  # budget/admission.py Judgement.evidence: per calibrated level, its reading
    budget_student: dict | None  # the student the budget was calibrated on: name, hash, and the note
    budget_objective: str | None
    budget_response: str | None
    budget_tolerance: float | None
    prompts_to_decide: int | None
    undecided_because: str | None
    metrics: dict[str, float]  # metric name -> value
    also_measured: dict | None  # the same configuration as the other engine computes it: engine, metrics
    prefix_shift: dict  # measurement/prefix.py: the candidate's own continuations' figures
    opd_signal: dict | None  # measurement/opd.py: what the mismatch does to OPD's per-token signal
    num_prompts: int
    num_sequences: int
    num_response_tokens: int
    arithmetic: dict  # core/artifacts.py arithmetic()
    budget_student_note: str | None = None  # what check_student said of a budget calibrated on another student
    budget_objective_note: str | None = optional()  # the budget's objective is not the one named (`objective`)
    scale_note: str | None = optional()  # judged on rollouts of another scale than the budget's doses (other_scale)
    verl_screens: list | None = optional()  # what verl's screens would do to the candidate's own samples (screens.py)
    verl_async: dict | None = optional()  # verl's fully-async lags: both regimes' mixtures, every lag's figure


@dataclass(frozen=True, kw_only=True)
class SeriesRecord(Record):
    """series.json: one configuration at a series of checkpoints of the student (each its figure, interval and
    verdict on rollouts re-sampled from it), the trend (last / first, with its interval) and the first checkpoint
    outside the budget."""

    KIND = "series.json"
    configuration: str
    engine: str
    metric: str
    budget: float
    budget_interval: list[float] | None  # [low, high], 90 %
    budget_source: str
    budget_student_note: str | None
    checkpoints: list  # one dict per checkpoint, in order
    trend: dict  # budget/series.py: last / first with its interval, the first checkpoint outside
    first_outside: str | None
    first_uncertain: str | None


@dataclass(frozen=True, kw_only=True)
class CalibrationRecord(Record):
    """calibrate.json (and calibrate.partial.json while runs are missing): the calibration as it was asked for (the
    pair, the ladder, the seeds, one run's training settings, the prompt split, how the budget is read; a resume
    must match it) and, once it ends, what it did (the objectives fitted, the levels it added, the runs it allocated,
    the budgets' ratios, the dose and its mapping). Version 2 reads too: a key it lacks takes its default."""

    KIND = "calibrate.json"
    teacher: str | None = None
    student: str | None = None
    levels: list[str] | None = None  # the ladder's levels, as sources/sources.py names them
    seeds: int | None = None
    train: dict | None = None  # training/settings.py's TrainSettings
    train_prompts: list[str] | None = None
    heldout_prompts: list[str] | None = None
    objectives: list[str] | None = None
    tolerance: float = 0.02
    quality: str = "auc"
    bracket: float = 2.0
    max_added: int = 3
    max_runs: int = 0
    max_hours: float = 0.0
    response: str = "relative"  # before budget.json 4 every loss was relative
    save_checkpoints: bool = False
    pilot: str | None = optional()  # the budget.json whose variance components sized the design
    added_levels: dict[str, list[str]] | None = optional()  # objective -> the levels the ladder added
    allocated: dict | None = optional()  # objective -> the runs added where they narrowed the interval most
    ratios: list | None = optional()  # per objective after the first: its budget over the first's, with interval
    kept_objectives: list[str] | None = optional()
    dose: str | None = optional()
    dose_mapping: list | None = optional()  # per level: its run-mean mismatch beside its dose on check's scale
    sizing: list | None = optional()  # what the design could decide, MODELLED before training (budget/sizing.py)


@dataclass(frozen=True, kw_only=True)
class TrainingRunRecord(Record):
    """A calibration run's run.json (runs/<objective>/<level>-seed<k>/, versioned with calibrate.json): its
    objective, level and seed, the mismatch its rollouts carried, its held-out quality before and after, and its
    losses."""

    KIND = "calibration run.json"
    objective: str
    level: str
    kind: str
    value: float | None  # the level's number (σ, the stale lag); None where it has none (0, fp8, kv)
    scheme: str | None
    seed: int
    steps: int
    seconds: float
    mismatch: dict  # kl_q_p, k3, tokens: the token-weighted mean over the run's rollouts
    quality_start: dict[str, float]  # held-out quality before training, by measure
    quality_end: dict[str, float]  # held-out quality after training, by measure
    quality: dict  # the run's quality: final, auc and how they were read
    losses: list[float]  # the training loss per step
    copied_from: str | None = optional()  # a run copied from another calibration (benchmarks/rl_collapse.py)
