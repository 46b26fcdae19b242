"""Fixtures of the real-engine tier: a real vLLM CPU server and a real Prometheus on loopback.

`make test` runs scripts/realengine_setup.sh first. Without that set-up these tests fail
(they never silently skip), unless SPOC_SKIP_REALENGINE=1 is set explicitly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from spoc_tui.procs.group import stop_process_group
from spoc_tui.procs.ports import free_ports
from spoc_tui.profile.capture import profiler_config
from spoc_tui.sim.process import start_sim

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from realengine import DIR, KV_GIB, MODEL, VENV, VLLM_ENV, guarded, ready, serve_command
from realengine import start_prometheus as _start_prometheus
from realengine import vllm_server as tiny_server  # this file's fixture is named vllm_server

__all__ = ["DIR", "KV_GIB", "MODEL", "VENV", "VLLM_ENV", "guarded", "serve_command", "tiny_server"]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.realengine)
            if os.environ.get("SPOC_SKIP_REALENGINE") == "1":
                item.add_marker(pytest.mark.skip(reason="SPOC_SKIP_REALENGINE=1"))


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    if not ready():
        pytest.fail(f"real-engine set-up missing in {DIR}: run `bash scripts/realengine_setup.sh` (make test does)")
    (port,) = free_ports(1)
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    # the torch profiler answers /start_profile (idle until asked) and the MFU counters move:
    # the profile and roofline tests need them, the others do not notice
    traces = tmp_path_factory.mktemp("traces")
    flags = ["--profiler-config", json.dumps(profiler_config(traces))]
    # guarded: a test run that is killed takes its server with it
    # prompt token details: answers say how many prompt tokens the prefix cache served (trace replay)
    # eager (no torch.compile at start): ready in 26 s where it took 42 (2026-12-07), on the tier's
    # critical path; no test here measures the compiled server's speed (the benchmarks' full runs do)
    server = tiny_server(log, port, *flags, "--enable-mfu-metrics", "--enable-prompt-tokens-details", "--enforce-eager",
                         guard=True)  # fmt: skip
    server.trace_dir = traces  # type: ignore[attr-defined]
    try:
        took = server.start(timeout=300)
    except Exception as e:
        tail = getattr(e, "log_tail", "")
        pytest.fail(f"vLLM did not start: {e}\n{tail}")
    print(f"\n[realengine] vLLM CPU server ready in {took:.1f} s on {server.url}")
    yield server
    server.stop()
    assert not server.alive()


@pytest.fixture(scope="session")
def sim_server():
    port, dport = free_ports(2)
    proc = start_sim(["--dcgm-port", str(dport), "--load-users", "4"], port)
    yield f"http://127.0.0.1:{port}", f"127.0.0.1:{dport}"
    proc.stop()


def start_prometheus(
    targets: dict[str, list[str]], blocks: Path | None = None
) -> tuple[str, subprocess.Popen[bytes], Path]:
    """A real Prometheus on loopback (:func:`realengine.start_prometheus`); fails the test when it
    is not installed or does not become ready."""
    try:
        return _start_prometheus(targets, blocks)
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def prometheus(vllm_server, sim_server):
    sim_url, dcgm_addr = sim_server
    url, proc, work = start_prometheus(
        {
            "vllm": [f"127.0.0.1:{vllm_server.port}", sim_url.removeprefix("http://")],
            "dcgm": [dcgm_addr],
        }
    )
    yield url
    stop_process_group(proc)
    shutil.rmtree(work, ignore_errors=True)


def _pg_bin(name: str) -> str | None:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(found[-1]) if found else shutil.which(name)


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway PostgreSQL cluster on loopback (password auth), for a study shared by workers.

    PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres` user the
    Debian package creates. Yields a URL with the password in it (which must never be written out).
    """
    initdb, postgres, isready = _pg_bin("initdb"), _pg_bin("postgres"), _pg_bin("pg_isready")
    if not (initdb and postgres and isready):
        pytest.fail("PostgreSQL is not installed: run `bash scripts/realengine_setup.sh` (make test does)")
    work = Path(tempfile.mkdtemp(prefix="spoc-pg-"))
    (port,) = free_ports(1)
    password = "pg-SECRET-never-written"
    (work / "pw").write_text(password + "\n")
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(work, "postgres")
        shutil.chown(work / "pw", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    log = open(work / "postgres.log", "wb")
    r = subprocess.run(
        [
            *as_user,
            initdb,
            "-D",
            str(work / "data"),
            "-U",
            "spoc",
            f"--pwfile={work / 'pw'}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.fail(f"initdb failed: {r.stderr[-2000:]}")
    proc = subprocess.Popen(
        [
            *guarded(),
            *as_user,
            postgres,
            "-D",
            str(work / "data"),
            "-p",
            str(port),
            "-k",
            str(work),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    ready = False
    while not ready and proc.poll() is None and time.monotonic() < deadline:
        ready = subprocess.run([isready, "-h", "127.0.0.1", "-p", str(port)], capture_output=True).returncode == 0
        if not ready:
            time.sleep(0.3)
    if not ready:
        stop_process_group(proc)
        log.close()
        pytest.fail("PostgreSQL did not become ready:\n" + (work / "postgres.log").read_text(errors="replace")[-2000:])
    yield f"postgresql://spoc:{password}@127.0.0.1:{port}/postgres"
    stop_process_group(proc)
    log.close()
    shutil.rmtree(work, ignore_errors=True)
