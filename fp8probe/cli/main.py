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

from ..core.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    FP8ProbeError,
    one_line,
    os_error_line,
    with_resume_hint,
)
from ..core.progress import quiet_dependencies
from .commands import COMMANDS
from .parser import build_parser, flags_of

OOM = "out of memory; use a smaller `batch_size`, fewer prompts or a machine with more memory"


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
        t0 = time.perf_counter()
        result = COMMANDS[args.command].run(args)  # core/results.Result: what it made, says and exits with
        print(result.describe(time.perf_counter() - t0))
        return result.exit_code
    except KeyboardInterrupt as e:
        where = getattr(e, "resumable_dir", None)
        tail = (
            f"finished rows are kept in {where}: rerun the same command with --resume to continue"
            if where
            else "nothing was written"
        )
        return _fail(args, f"interrupted; {tail}", EXIT_INTERRUPTED, flags, show_traceback=False)
    except (FP8ProbeError, OSError, MemoryError) as e:  # bad input, a refusing environment
        msg = os_error_line(e) if isinstance(e, OSError) else str(e) if isinstance(e, FP8ProbeError) else OOM
        return _fail(args, with_resume_hint(msg, e), EXIT_USAGE, flags)
    except Exception as e:  # a bug: say so, briefly; --verbose has the traceback
        return _fail(
            args,
            with_resume_hint(
                f"internal error ({type(e).__name__}: {one_line(e)}); this is a bug in fp8probe: please report it "
                "with the output of the same command run with --verbose",
                e,
            ),
            EXIT_USAGE if args.command == "check" else EXIT_INTERNAL,
            flags,
        )  # check's 1 means REJECT
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
