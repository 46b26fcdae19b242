"""A trace file opened as text, with bounds: what every reader of :mod:`spoc_tui.core.traces.read`
reads through."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO, cast

from spoc_tui.core.errors import InputError
from spoc_tui.core.files import FileReadError, require_regular


class TraceError(InputError, ValueError):
    """A trace that cannot be read; the message names the file, the line and the field."""


def open_trace(path: Path) -> IO[str]:
    """The trace as text: UTF-8 with or without a byte-order mark, gzip-compressed or not (read
    from its first bytes, whatever the file's name).

    Raises:
        TraceError: a path that is not a regular file (``/dev/zero`` would be read for ever).
    """
    try:
        require_regular(path)
    except FileReadError as e:
        raise TraceError(f"{path}: {e}") from None
    with path.open("rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


MAX_LINE = 16 * 2**20
"""The longest line a trace may hold, in characters (a row with 20,000 hash ids is some 200 KB)."""
MAX_WHOLE = 512 * 2**20
"""The most text a trace read whole may hold (a WEKA array, an OTLP export), in characters."""


class _Bounded:
    """A trace's text read with bounds, the file's lines or the whole of it: a 400 KB gzip
    holding one 400 MB line took 866 MB to read (issue 74); a line past :data:`MAX_LINE` or a
    text past :data:`MAX_WHOLE` is refused once that much is read."""

    def __init__(self, f: IO[str], path: Path) -> None:
        self.f, self.path, self.lines = f, path, 0

    def __iter__(self) -> _Bounded:
        return self

    def __next__(self) -> str:
        line = self.f.readline(MAX_LINE + 1)
        if not line:
            raise StopIteration
        self.lines += 1
        if len(line) > MAX_LINE:
            raise TraceError(
                f"{self.path.name} line {self.lines}: longer than {MAX_LINE // 2**20} MiB, no trace's row: "
                "a file of one endless line?"
            )
        return line

    def seek(self, pos: int) -> int:
        self.lines = 0
        return self.f.seek(pos)

    def read(self, n: int = -1) -> str:
        if n >= 0:
            return self.f.read(n)
        text = self.f.read(MAX_WHOLE + 1)
        if len(text) > MAX_WHOLE:
            raise TraceError(f"{self.path.name}: more than {MAX_WHOLE // 2**20} MiB of text: export a shorter window")
        return text


def bounded(f: IO[str], path: Path) -> IO[str]:
    """``f`` read through :class:`_Bounded`."""
    return cast(IO[str], _Bounded(f, path))
