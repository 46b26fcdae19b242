"""The one base of every error spoc-tui reports to a user.

Each error carries the exit code the command line ends with, so the CLI has one place that
turns an error into a message and a code (``spoc_tui.cli.main``). Bad input (a flag, a file,
a URL) is ``exit_code`` 2; a failure at run time (a server that died, a launch that cannot
happen) is 1. A class keeps its standard base (``ValueError``...) beside ``SpocError`` where
callers catch it as such.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
"""Something failed at run time (a server died, the load generator exited)."""
EXIT_USAGE = 2
"""Bad input: a flag, a config file, a URL, a search space."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT), after what was measured was kept."""


class SpocError(Exception):
    """An error with a one-line message for the user and the exit code it ends the CLI with."""

    exit_code: int = EXIT_FAILURE
    hint: str = ""
    """A second line for the user (where the finished results are), printed under the error."""

    def __init__(self, message: str, *, exit_code: int | None = None, hint: str = "") -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        if hint:
            self.hint = hint


class InputError(SpocError):
    """Bad input from the user (exit code 2)."""

    exit_code = EXIT_USAGE


def first_line(error: BaseException | str, limit: int = 200) -> str:
    """The first line of an error's text (its type name when it has none), at most ``limit`` chars."""
    text = str(error)
    if not text and isinstance(error, BaseException):
        text = type(error).__name__
    return text.splitlines()[0][:limit] if text else ""
