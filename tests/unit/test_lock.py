import json
import os
import subprocess
import sys

from spoc_tui.procs.lock import FolderLock, mark_interrupted


def test_one_process_at_a_time_and_free_after_release(tmp_path):
    a = FolderLock(tmp_path / "x.lock", "ramp").acquire()
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from spoc_tui.procs.lock import FolderLock; "
            "FolderLock(Path(sys.argv[1]), 'ramp').acquire()",
            str(tmp_path / "x.lock"),
        ],
        capture_output=True,
        text=True,
    )
    assert other.returncode == 1 and f"in use by another ramp (pid {os.getpid()})" in other.stderr
    b = FolderLock(tmp_path / "x.lock", "ramp").acquire()  # this process again (a screen reopening): allowed
    a.release()
    assert (tmp_path / "x.lock").exists()
    b.release()
    assert not (tmp_path / "x.lock").exists()
    FolderLock(tmp_path / "x.lock", "ramp").acquire().release()


def test_a_stale_lock_file_without_a_holder_is_taken(tmp_path):
    (tmp_path / "x.lock").write_text("999999:1")  # a killed process's file: no flock on it
    FolderLock(tmp_path / "x.lock", "ramp").acquire().release()


def test_only_a_running_result_is_marked_interrupted(tmp_path):
    f = tmp_path / "ramp.json"
    f.write_text(json.dumps({"status": "running", "steps": [{"users": 2}]}))
    assert mark_interrupted(f, "killed")
    d = json.loads(f.read_text())
    assert d == {"status": "interrupted", "stop_reason": "killed", "steps": [{"users": 2}]}
    assert not mark_interrupted(f, "again")
    f.write_text("{not json")
    assert not mark_interrupted(f, "x") and not mark_interrupted(tmp_path / "none.json", "x")


def test_a_full_disk_is_one_error_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import errno

    import pytest

    from spoc_tui.core.ramp.knee import Knee
    from spoc_tui.core.ramp.steps import RequestSample
    from spoc_tui.core.results import RampHeader
    from spoc_tui.load import ramp

    w = ramp.ResultWriter(tmp_path, RampHeader(url="u"))

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ramp.os, "fdopen", full)
    with pytest.raises(ramp.RampError, match=r"cannot write .*ramp.json \(No space left on device\)"):
        w.write([], Knee(None, None, None), "running")
    assert not list(tmp_path.glob(".ramp-*")), "a temporary file was left behind"
    monkeypatch.setattr(w.requests, "write", full)
    w.sample(RequestSample(start=0.0, step=1, users=1, ok=True))
    assert "No space left on device" in w.write_error  # the ramp ends after its step, saying why
    w.close()
    assert not (tmp_path / "ramp.lock").exists()
