"""The exceptions that mean "the user gave us something we cannot use", and the CLI's exit codes.

The CLI turns each into one line `fp8probe: error: ...` and an exit code; library callers can catch them.

Exit codes (the README's table):

    0    success
    1    an internal error: a bug in fp8probe (the line asks for a report; --verbose shows the traceback)
    2    bad input, a missing optional dependency, or the environment refused (disk full, no permission)
    130  interrupted (SIGINT / SIGTERM); a sweep keeps its finished rows for --resume

`fp8probe check` exits 0 to admit, 1 to reject, 3 when the data cannot decide (UNCERTAIN), 2 on any error (an
internal one included).
"""

import errno

EXIT_OK = 0
EXIT_REJECT = 1  # `fp8probe check` only: the configuration exceeds the budget
EXIT_UNCERTAIN = 3  # `fp8probe check` only: the measured interval and the budget's overlap
EXIT_FINDINGS = 1  # `fp8probe audit` only: the export does not run the recipe as written
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class FP8ProbeError(Exception):
    """Bad input: a missing path, an unsupported model, an unknown scheme, ...

    The message says what is wrong and what to do instead.
    """


class MissingExtra(FP8ProbeError, ImportError):
    """An optional dependency is not installed; the message names the `pip install` that brings it."""

    def __init__(self, what: str, extra: str):
        super().__init__(f"{what} needs the optional extra [{extra}]: pip install 'fp8probe[{extra}]'")
        self.extra = extra


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message folded to one line (a dependency's multi-line refusal, shortened)."""
    text = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def with_resume_hint(message: str, e: BaseException) -> str:
    """`message`, plus where the finished part is kept when the failure left resume state (files.output_dir)."""
    where = getattr(e, "resumable_dir", None)
    if where and "resume" not in message:
        return f"{message}; the rows finished so far are kept in {where}: rerun with `resume` once fixed"
    return message


def os_error_line(e: OSError) -> str:
    """An OSError as one line that says what to do (a full disk, a refused permission, a missing path)."""
    where = f" ({e.filename})" if getattr(e, "filename", None) else ""
    if e.errno == errno.ENOSPC:
        return f"no space left on device{where}; earlier results are intact: free some space and rerun"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied{where}: {e.strerror}; choose another `out` or fix the permissions"
    return f"{e.strerror or e}{where}; check the path and rerun"
