"""Whatever stops `spoc ramp` or `spoc tune` (Ctrl-C, a dropped SSH session, `kill`, `kill -9`),
nothing it started is left running, and its results hold every finished step with a final status."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spoc_tui.procs.lock import FolderLock
from spoc_tui.procs.ports import free_ports
from spoc_tui.sim.process import start_sim
from tests.e2e.test_tune_cli import FAST, files, tune_argv  # noqa: F401 (a fixture)
from tests.leftovers import TRACEBACKS_ENV, communicate_or_show_where, descendants, describe, interruptible, wait_gone

SIGNALS = [signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGKILL]


@pytest.fixture(scope="module")
def sim():
    port, dport = free_ports(2)
    proc = start_sim(["--gpu", "a100-40gb", "--max-num-seqs", "8", "--dcgm-port", str(dport)], port)
    yield f"http://127.0.0.1:{port}"
    proc.stop()


def _status_is_final(path) -> str:
    """ramp.json / pareto.json, once the runner had its second to notice: the status written."""
    deadline = time.time() + 10
    while True:
        status = json.loads(path.read_text())["status"]
        if status != "running" or time.time() > deadline:
            return status
        time.sleep(0.2)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signalled_ramp_leaves_nothing_and_a_final_status(sim, tmp_path, sig):
    (tmp_path / "fast.toml").write_text(FAST)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "spoc_tui.cli", "ramp", "--url", sim.replace("http://", "http://ops:pw123@")]
    argv += [
        "--profile",
        str(tmp_path / "fast.toml"),
        "--users",
        "2,4,8",
        "--step-seconds",
        "3",
        "--max-step-seconds",
        "3",
    ]
    argv += ["--warmup-seconds", "1", "--sla", "ttft_p99<=5s", "--out", str(out)]
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=interruptible,
        env={**os.environ, **TRACEBACKS_ENV},
    )
    deadline = time.time() + 60
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("step 1: 2 users ") and "req/s" in line:
            break
        assert time.time() < deadline, "no step finished"
    ours = descendants(p.pid)
    assert ours, "no load generator running"
    for pid in ours:  # the URL's password is never on a command line (`ps` shows it to every user)
        assert b"pw123" not in open(f"/proc/{pid}/cmdline", "rb").read()
        assert b"***@127.0.0.1" in open(f"/proc/{pid}/cmdline", "rb").read()
    p.send_signal(sig)
    _, err = communicate_or_show_where(p, 60)
    assert p.returncode == (-9 if sig == signal.SIGKILL else 130), err
    assert "Traceback" not in err, err
    if sig == signal.SIGINT:
        assert "finished steps are in" in err
    left = wait_gone(ours, 30)
    assert not left, "left running: " + "; ".join(map(describe, left))
    d = json.loads((out / "ramp.json").read_text())
    assert _status_is_final(out / "ramp.json") == "interrupted"
    assert len(d["steps"]) >= 1 and d["steps"][0]["users"] == 2
    assert not list(out.glob(".ramp-*"))
    FolderLock(out / "ramp.lock", "ramp").acquire().release()  # the folder is free again (the kernel dropped the lock)


def test_a_ramp_killed_in_its_first_step_leaves_a_ramp_json_saying_interrupted(sim, tmp_path):
    """Issue 56 item 6: kill -9 during step 1 left no ramp.json (report and compare: "no such
    file"); it is written from the start, saying running, and the load generator marks it."""
    (tmp_path / "fast.toml").write_text(FAST)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "spoc_tui.cli", "ramp", "--url", sim, "--profile", str(tmp_path / "fast.toml")]
    argv += ["--users", "2,4", "--step-seconds", "30", "--warmup-seconds", "1", "--sla", "ttft_p99<=5s"]
    p = subprocess.Popen([*argv, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)  # fmt: skip
    deadline = time.time() + 60
    while not (ours := descendants(p.pid)) and time.time() < deadline:
        time.sleep(0.1)
    assert ours, "no load generator running"
    time.sleep(2)  # in step 1
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert not wait_gone(ours, 30)
    assert _status_is_final(out / "ramp.json") == "interrupted"
    assert json.loads((out / "ramp.json").read_text())["steps"] == []
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "compare", str(out), str(out)], capture_output=True, text=True
    )
    assert r.returncode == 0 and "no such file" not in r.stderr


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signalled_study_leaves_nothing_and_a_final_status(files, sig):  # noqa: F811
    p = subprocess.Popen(
        tune_argv(files, trials=3),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=interruptible,
    )
    study = files / "out"
    deadline = time.time() + 120
    # signalled during its second trial's ramp: the first trial is finished, the second under way
    while time.time() < deadline and not list((study / "trials").glob("0001/requests.jsonl")):
        assert p.poll() is None, p.communicate()
        time.sleep(0.2)
    time.sleep(1.0)
    ours = descendants(p.pid)
    assert len(ours) >= 2, "no server or load generator running"
    p.send_signal(sig)
    _, err = p.communicate(timeout=90)
    assert p.returncode == (-9 if sig == signal.SIGKILL else 130), err
    assert "Traceback" not in err and "Event loop is closed" not in err and "never awaited" not in err, err
    left = wait_gone(ours, 30)
    assert not left, "left running: " + "; ".join(map(describe, left))
    recs = [json.loads(x) for x in (study / "trials.jsonl").read_text().splitlines()]
    assert recs[0]["status"] == "ok"
    assert _status_is_final(study / "pareto.json") == "interrupted"
    second = study / "trials" / "0001" / "ramp.json"
    if second.exists():
        assert _status_is_final(second) == "interrupted"
    if sig != signal.SIGKILL:  # a clean stop also records the trial it cut short
        assert [r["status"] for r in recs] == ["ok", "interrupted"], recs


def test_a_second_ramp_into_a_folder_in_use_is_refused_naming_the_owner(sim, tmp_path):
    (tmp_path / "fast.toml").write_text(FAST)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "spoc_tui.cli", "ramp", "--url", sim, "--profile", str(tmp_path / "fast.toml")]
    argv += ["--step-seconds", "3", "--warmup-seconds", "1", "--sla", "ttft_p99<=5s", "--out", str(out)]
    first = subprocess.Popen([*argv, "--users", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (out / "requests.jsonl").exists():
            assert time.time() < deadline and first.poll() is None
            time.sleep(0.1)
        second = subprocess.run([*argv, "--users", "1"], capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        assert f"is in use by another ramp (pid {first.pid})" in second.stderr, second.stderr
        assert first.wait(timeout=60) == 0
    finally:
        if first.poll() is None:
            first.kill()
    d = json.loads((out / "ramp.json").read_text())
    assert d["status"] == "complete" and [s["users"] for s in d["steps"]] == [2]
    assert not list(out.glob("previous-*")), "the refused ramp moved the first one's results"
