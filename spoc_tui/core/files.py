"""Reading a small text file the user named, with a bound: a replay, a trace or a saved
exposition named as ``/dev/zero``, a FIFO or a multi-gigabyte file must be refused, not read
forever (issue 17, item 10)."""

from __future__ import annotations

from pathlib import Path

from spoc_tui.core.errors import InputError

MAX_FILE = 64 * 2**20


class FileReadError(InputError):
    """The file cannot be read as bounded UTF-8 text; the message says why (without the path)."""


def read_text_bounded(path: str | Path, limit: int = MAX_FILE) -> str:
    """The file's text, at most ``limit`` bytes of UTF-8 from a regular file.

    Raises:
        FileReadError: missing, a directory or device, too large, unreadable or not UTF-8.
    """
    p = Path(path)
    try:
        if p.is_dir():
            raise FileReadError("is a directory")
        if p.exists() and not p.is_file():
            raise FileReadError("not a regular file")
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
