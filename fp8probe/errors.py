"""The one exception type that means "the user gave us something we cannot use".

The CLI turns it into a one-line message and exit code 2; library callers can catch it.
"""


class FP8ProbeError(Exception):
    """Bad input: a missing path, an unsupported model, an unknown scheme, ...

    The message says what is wrong and what to do instead.
    """
