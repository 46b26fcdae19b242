"""Files, read and written safely: a small text file the user named is read with a bound (a
replay, a trace or a saved exposition named as ``/dev/zero``, a FIFO or a multi-gigabyte file must
be refused, not read forever: issue 17, item 10), and a result file is written whole or not at all
(:func:`write_atomic`)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO

from spoc_tui.core.errors import InputError

MAX_FILE = 64 * 2**20


def _finite(text: str) -> float | None:
    v = float(text)
    return v if math.isfinite(v) else None


def _whole(text: str) -> int | None:
    # past a float's range (1.8e308) no figure is one; past 4,300 digits int() raises ValueError
    return int(text) if len(text.lstrip("-")) <= 308 else None


def _whole_or_infinite(text: str) -> int | float:
    return int(text) if len(text.lstrip("-")) <= 308 else (-math.inf if text.startswith("-") else math.inf)


def parse_json(text: str, keep_non_finite: bool = False) -> object:
    """``json.loads`` as every spoc file is read: a nesting too deep for Python's parser (``[`` x
    100,000 raised RecursionError, a traceback) as the ``json.JSONDecodeError`` every reader
    already handles; ``NaN``, ``Infinity`` and numbers past a float's range, which JSON does not
    have, read as null (as spoc writes them: :func:`~spoc_tui.core.jsonsafe.json_safe`), so a
    figure is n/a where it was not a number (in a ramp's knee, a step's rows, a recording's time
    they raised out of report, compare and replay: issue 74). ``keep_non_finite``: NaN and
    Infinity kept, a number past a float's range read as infinite, for a reader that refuses them
    naming the field (a hand-edited ``twin.json``: "b0 is 'nan'")."""
    try:
        if keep_non_finite:
            return json.loads(text, parse_int=_whole_or_infinite)
        return json.loads(text, parse_constant=lambda _: None, parse_float=_finite, parse_int=_whole)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None


class JsonLineError(ValueError):
    """A line of a JSON-lines file that is not JSON: its number (from 1), whether it is the last
    line (a write a crash cut short), and why, in ``json``'s words: ``msg`` alone, ``detail`` with
    the column."""

    def __init__(self, lineno: int, last: bool, error: json.JSONDecodeError) -> None:
        super().__init__(f"line {lineno}: {error.msg}")
        self.lineno = lineno
        self.last = last
        self.msg = error.msg
        self.detail = str(error)


def json_lines(lines: Iterable[str]) -> Iterator[tuple[int, object]]:
    """The number (from 1) and JSON value of each line that is not blank: the one reading of a
    JSON-lines file (trials, replays, traces, NVML recordings).

    Raises:
        JsonLineError: a line that is not JSON; nothing after it is read.
    """
    it = iter(lines)
    for lineno, line in enumerate(it, 1):
        if not line.strip():
            continue
        try:
            value = parse_json(line)
        except json.JSONDecodeError as e:
            raise JsonLineError(lineno, next(it, None) is None, e) from None
        yield lineno, value


class FileReadError(InputError):
    """The file cannot be read as bounded UTF-8 text; the message says why (without the path)."""


def not_a_file(path: str | Path) -> str | None:
    """Why ``path`` is not a regular file to read ("no such file", "not a regular file"), or None."""
    p = Path(path)
    return None if p.is_file() else "not a regular file" if p.exists() else "no such file"


def require_regular(path: str | Path) -> None:
    """Refuse a path that exists and is not a regular file before a reader streams it: a
    device (``/dev/zero`` never ends), a FIFO, a directory. A missing path is the reader's to name.

    Raises:
        FileReadError: "is a directory" or "not a regular file".
    """
    p = Path(path)
    if p.is_dir():
        raise FileReadError("is a directory")
    if p.exists() and not p.is_file():
        raise FileReadError("not a regular file")


def read_text_bounded(path: str | Path, limit: int = MAX_FILE) -> str:
    """The file's text, at most ``limit`` bytes of UTF-8 from a regular file.

    Raises:
        FileReadError: missing, a directory or device, too large, unreadable or not UTF-8.
    """
    p = Path(path)
    try:
        require_regular(p)
        with p.open("rb") as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        raise FileReadError("no such file") from None
    except OSError as e:
        raise FileReadError(f"cannot read ({e.strerror or e})") from None
    if len(raw) > limit:
        raise FileReadError(f"larger than {limit // 2**20} MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FileReadError("not UTF-8 text") from None


def write_atomic(path: str | Path, content: str | Callable[[TextIO], object]) -> None:
    """Write ``path`` whole or not at all: into a temporary file beside it, then renamed over it
    (a reader never sees half a file, a crash leaves the old one). ``content`` is the text, or a
    function that writes to the open file. No temporary file is left behind, whatever fails. A
    path that is a link to a file replaces the file, not the link; one that is not a regular file
    (``/dev/null``, ``/dev/stdout``, a pipe) is written to as it is: renamed over, a device node
    would have become a file.

    Raises:
        OSError: the folder cannot be written (the caller says which file, in its words).
    """
    p = Path(path)
    if p.is_symlink() or (p.exists() and not p.is_file()):
        if p.is_file():  # a link to a regular file: that file is replaced, the link kept
            p = p.resolve()
        else:  # a device, a pipe, /dev/stdout: written as it is, never renamed over
            with open(p, "w", encoding="utf-8") as f:
                _put(f, content)
            return
    fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            _put(f, content)
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _put(f: TextIO, content: str | Callable[[TextIO], object]) -> None:
    if isinstance(content, str):
        f.write(content)
    else:
        content(f)
