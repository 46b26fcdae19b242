"""Whether a full-screen command has a terminal on both ends. Light to import (no Textual): a
command refused for want of one answers at once, before the app, the simulator or NVML load."""

from __future__ import annotations

import sys

from spoc_tui.core.errors import InputError


def require_terminal(command: str) -> None:
    """A full-screen app needs a terminal on both ends: with stdout a pipe or a file (``spoc
    monitor | head``, ``> f``) it would write escape codes there, and with no terminal on stdin
    it would wait for keys forever.

    Raises:
        InputError: (exit code 2) saying which end is not a terminal and what to use instead.
    """
    ends = [name for name, f in (("stdout", sys.stdout), ("stdin", sys.stdin)) if not _is_tty(f)]
    if ends:
        raise InputError(
            f"{command} is a full-screen terminal app and {' and '.join(ends)} "
            f"{'is' if len(ends) == 1 else 'are'} not a terminal; for readings in a pipe or a file use "
            "`spoc inspect` (--json for machines)"
        )


def _is_tty(f: object) -> bool:
    try:
        return bool(f is not None and f.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False
