"""Whether a full-screen command has a terminal on both ends. Light to import (no Textual): a
command refused for want of one answers at once, before the app, the simulator or NVML load."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from spoc_tui.core.errors import InputError


def require_terminal(command: str) -> None:
    """A full-screen app needs a terminal on both ends: with stdout a pipe or a file (``spoc
    monitor | head``, ``> f``) it would write escape codes there, and with no terminal on stdin
    it would wait for keys forever.

    Raises:
        InputError: (exit code 2) saying which end is not a terminal and what to use instead,
            or that ``SPOC_TEXTUAL`` names no mode of the TUI.
    """
    textual_mode_of()
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


TEXTUAL_MODES = ("lean", "stock")
"""The TUI's modes (:mod:`spoc_tui.tui.textual_mode`): on spoc's fork of Textual's compositor,
refresh and driver (lean, the default), or on Textual's own (stock)."""


def textual_mode_of(environ: Mapping[str, str] | None = None) -> str:
    """The mode ``SPOC_TEXTUAL`` asks for (``lean`` where it is unset or empty).

    Raises:
        InputError: (exit code 2) a value that is not a mode, with the modes there are.
    """
    env = os.environ if environ is None else environ
    value = env.get("SPOC_TEXTUAL", "").strip()
    mode = value.lower() or "lean"
    if mode not in TEXTUAL_MODES:
        raise InputError(
            f"SPOC_TEXTUAL={value!r} is not a mode of the TUI; use lean (the default: spoc's own "
            "compositor and driver) or stock (Textual's own)"
        )
    return mode
