"""fp8probe's command line: flags into the library's typed settings, its entry points called, one summary printed.
Whatever goes wrong is one line, `fp8probe: error: ...`, with core/errors.py's exit codes; the library's field names
(`num_prompts`) become the flags that set them (--num-prompts); the traceback only with --verbose."""

from __future__ import annotations

import logging
import re
import signal
import sys
import time
import traceback

from ..apps import admission, calibrate, capacity, inputs, measure, plan, recipe, sources, sweep, training
from ..core.errors import (EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, FP8ProbeError, one_line, os_error_line,
                           with_resume_hint)
from ..core.progress import quiet_dependencies
from ..deploy.serving import Serving
from ..model.settings import ModelSource, RolloutSettings
from .options import settings_from
from .parser import build_parser, flags_of

log = logging.getLogger("fp8probe")
OOM = "out of memory; use a smaller `batch_size`, fewer prompts or a machine with more memory"


def _inputs(a):
    return settings_from(ModelSource, a), settings_from(RolloutSettings, a)


def cmd_sweep(a, t0):
    res = sweep.run_sweep(*_inputs(a), settings_from(sweep.SweepSettings, a), a.out, a.resume, a.progress)
    return sweep.describe(res, time.perf_counter() - t0)


def cmd_measure(a, t0):
    doc = measure.run_measure(*_inputs(a), settings_from(measure.MeasureSettings, a), a.out, a.progress)
    return measure.describe(doc, a.out, time.perf_counter() - t0)


def cmd_rollouts(a, t0):
    r, secs = inputs.run_rollouts(*_inputs(a), a.out, a.progress)
    return f"rollouts: {r.num_sequences} sequences, {r.num_response_tokens} response tokens in {secs:.0f} s -> {a.out}"


def cmd_recipe(a, t0):
    s = settings_from(recipe.RecipeSettings, a)
    r, secs = recipe.run_recipe(a.sweep_dir, s, a.out, a.device, a.trust_remote_code, a.allow_pickle)
    return recipe.describe(r, s, a.out, secs)


def cmd_export(a, t0):
    from ..deploy.export import export
    from ..model.rollouts import load_rollouts

    done = export(a.model, a.recipe, a.out, rollouts=load_rollouts(a.rollouts) if a.rollouts else None,
                  max_model_len=a.max_model_len, trust_remote_code=a.trust_remote_code, allow_pickle=a.allow_pickle,
                  targets=a.target)
    for w in done.warnings():
        log.warning("%s", w)
    return done.describe(time.perf_counter() - t0)


def cmd_capacity(a, t0):
    from ..deploy.capacity import format_report

    rep = capacity.run_capacity(a.model, settings_from(capacity.CapacitySettings, a), settings_from(Serving, a), a.out, a.plot,
                       a.trust_remote_code, a.allow_pickle)
    return format_report(rep) + (f"\ncapacity: -> {a.out}/capacity.json" if a.out else "")


def cmd_units(a, t0):
    return inputs.run_units(settings_from(ModelSource, a))


def cmd_ladder(a, t0):
    s = settings_from(sources.LadderSettings, a, shortcuts=settings_from(sources.Shortcuts, a))
    df = sources.run_ladder(*_inputs(a), s, a.out, a.progress)
    return sources.describe(df, a.out, time.perf_counter() - t0)


def cmd_check(a, t0):
    s = settings_from(admission.CheckSettings, a, shortcuts=settings_from(sources.Shortcuts, a))
    report = admission.run_check(*_inputs(a), s, a.out, a.progress)
    return admission.format_check(report), admission.exit_code(report)


def cmd_plan(a, t0):
    doc = plan.run_plan(*_inputs(a), settings_from(plan.PlanSettings, a), settings_from(Serving, a), a.out, a.progress)
    return plan.describe(doc, a.out, time.perf_counter() - t0)


def cmd_budget(a, t0):
    return capacity.describe_budget(capacity.run_budget(a.runs, a.out, settings_from(capacity.BudgetSettings, a)), a.out)


def cmd_calibrate(a, t0):
    c = settings_from(training.CalibrateSettings, a)
    s = calibrate.prepare(c, settings_from(training.TrainSettings, a))
    res = calibrate.run_calibrate(s, a.out, a.resume, c.device, a.progress, c.mark, log.info)
    return calibrate.describe(res, s, a.out, time.perf_counter() - t0)


def cmd_plot(a, t0):
    from ..plots import plot_run
    written = plot_run(a.run_dir, a.out, a.format)
    return f"plot: {len(written)} figures ({', '.join(written)}) -> {next(iter(written.values())).parent}"


# each returns what it prints: a text (exit 0) or (text, exit code)
COMMANDS = {name[4:]: fn for name, fn in globals().items() if name.startswith("cmd_")}


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help()
        return EXIT_USAGE
    flags = args.flags = flags_of(ap, args.command)
    _setup_logging(args)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        done = COMMANDS[args.command](args, time.perf_counter())  # its summary, or (summary, exit code)
        print(done[0] if isinstance(done, tuple) else done)
        return done[1] if isinstance(done, tuple) else EXIT_OK
    except KeyboardInterrupt as e:
        where = getattr(e, "resumable_dir", None)
        tail = (f"finished rows are kept in {where}: rerun the same command with --resume to continue"
                if where else "nothing was written")
        return _fail(args, f"interrupted; {tail}", EXIT_INTERRUPTED, flags, show_traceback=False)
    except (FP8ProbeError, OSError, MemoryError) as e:  # bad input, a refusing environment
        msg = os_error_line(e) if isinstance(e, OSError) else str(e) if isinstance(e, FP8ProbeError) else OOM
        return _fail(args, with_resume_hint(msg, e), EXIT_USAGE, flags)
    except Exception as e:  # a bug: say so, briefly; --verbose has the traceback
        return _fail(args, with_resume_hint(
            f"internal error ({type(e).__name__}: {one_line(e)}); this is a bug in fp8probe: please report it "
            "with the output of the same command run with --verbose", e),
            EXIT_USAGE if args.command == "check" else EXIT_INTERNAL, flags)  # check's 1 means REJECT
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum, frame):  # SIGTERM stops as cleanly as Ctrl-C: resume state kept, the rest removed
    raise KeyboardInterrupt


def _fail(args, message: str, code: int, flags: dict, show_traceback: bool = True) -> int:
    if show_traceback and getattr(args, "verbose", False):
        traceback.print_exc()
    print(f"fp8probe: error: {as_flags(message, flags)}", file=sys.stderr)
    return code


def as_flags(message: str, flags: dict) -> str:  # the library's fields -> the command's flags
    return re.sub(r"`(\w+)`", lambda m: flags.get(m.group(1), m.group(0)), message)


_FLAGS: dict = {}  # this command's fields -> flags, for the log lines


def _fields_as_flags(record: logging.LogRecord) -> bool:  # a handler filter: log lines name fields, users read flags
    if record.name.startswith("fp8probe") and "`" in (message := record.getMessage()):
        record.msg, record.args = as_flags(message, _FLAGS), ()
    return True


def _setup_logging(args) -> None:
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    _FLAGS.clear(), _FLAGS.update(args.flags)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_fields_as_flags)
    logging.getLogger("fp8probe").setLevel(level)
    args.progress = not args.quiet
    if not args.verbose:
        quiet_dependencies()

