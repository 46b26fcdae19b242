"""Where a study lives: its Optuna storage (SQLite by default, a journal file, PostgreSQL for
several machines), who works on it, and the folder lock that keeps one process per study folder."""

from __future__ import annotations

import os
import re
import socket
import warnings
from pathlib import Path
from typing import Any

from spoc_tui.core.errors import EXIT_USAGE, InputError, first_line
from spoc_tui.core.redact import redact_url
from spoc_tui.procs.leftovers import StudyRunning
from spoc_tui.procs.lock import FolderBusy, FolderLock


class TuneError(InputError):
    """A study that cannot start or go on; the message says what to change."""


def open_storage(url: str | None, out_dir: Path) -> tuple[Any, str]:
    """Optuna storage for ``url`` (default: SQLite in the output folder); returns (storage, url).

    Raises:
        TuneError: unknown scheme, missing database driver, unreachable database.
    """
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if url is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{(out_dir / 'study.db').resolve()}"
    shown = redact_url(url)
    if url.startswith("journal:") or url.endswith((".journal", ".log")):
        path = Path(url.removeprefix("journal:"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(path))), url
        except OSError as e:
            raise TuneError(f"--storage {shown}: {e.strerror or e}") from None
    if not re.match(r"^(sqlite|postgresql|mysql)(\+\w+)?://", url):
        raise TuneError(
            f"--storage {shown}: expected sqlite:///FILE, postgresql://USER@HOST/DB, journal:FILE or a FILE.journal"
        )
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine_url = url
    if url.startswith("postgresql://"):
        # SQLAlchemy's default PostgreSQL driver is psycopg2 up to 2.0 and psycopg (3) from 2.1:
        # name the one spoc-tui[postgresql] installs, when it is there
        import importlib.util

        if importlib.util.find_spec("psycopg") is not None:
            engine_url = "postgresql+psycopg://" + url.split("://", 1)[1]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.storages.RDBStorage(engine_url, heartbeat_interval=None), url
    except ImportError as e:  # Optuna's "Failed to import DB access module", or the driver's own
        what = (
            f"the database driver {e.name!r} is not installed" if e.name else "no database driver for it is installed"
        )
        raise TuneError(
            f"--storage {shown}: {what} (for PostgreSQL: pip install 'spoc-tui[postgresql]', which brings psycopg)"
        ) from None
    except Exception as e:  # sqlalchemy's OperationalError and friends: the database said no
        raise TuneError(f"--storage {shown}: cannot open the database: {redact_url(first_line(e))}") from None


def worker_id() -> str:
    """This process as a study's worker: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def take_study_lock(out_dir: Path) -> FolderLock:
    """``study.lock`` (an flock the kernel drops when the process ends) names the process
    running the study in this folder; a second run of the same folder (``--resume`` while it
    still runs) is refused instead of disturbing it.

    Raises:
        StudyRunning: another live spoc process holds the lock.
    """
    lock = FolderLock(out_dir / "study.lock", "study")
    try:
        return lock.acquire()
    except FolderBusy as e:
        raise StudyRunning(
            f"the study in {out_dir} is still running (pid {e.owner_pid}): stop it first (Ctrl-C), "
            "or use another --out",
            exit_code=EXIT_USAGE,
        ) from None
