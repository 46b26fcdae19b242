from __future__ import annotations

from pathlib import Path

import pytest

from tests.leftovers import describe, ensure_marker, marked, stop, wait_gone

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Config and data go to a temporary folder, never the user's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    for var in ("SPOC_VLLM_URL", "SPOC_DCGM_URL", "SPOC_API_KEY", "SPOC_PROMETHEUS_URL", "SPOC_CONFIG"):
        monkeypatch.delenv(var, raising=False)


def fixture_text(rel: str) -> str:
    return (FIXTURES / rel).read_text()


# Every process the suite starts carries this marker in its environment: at the end, none may be left.
_RUN = ensure_marker()


OWN_SERVERS = {
    "tests/realengine/test_tune_real.py",
    "tests/realengine/test_tune_postgres.py",
    "tests/realengine/test_benchmark_smoke.py",
}
"""Real-engine tests that start their own servers rather than use the session's vLLM."""


ALONE = {
    "tests/e2e/test_benchmarks.py",  # no shared fixture: each benchmark may go to any worker
    "tests/e2e/test_tune_cli.py",  # each study starts its own servers
    "tests/e2e/test_ramp.py::test_ramp_finds_the_knee_and_records_both_views",
    "tests/e2e/test_ramp.py::test_arrivals_are_measured_and_lockstep_is_chosen_not_stumbled_into",
}
"""Tests that form a group of their own (a file named: each of its tests): the longest of files
whose shared fixture is a simulator that starts in a second, so the workers share them out."""

HEAVY_S = {
    "tests/e2e/test_signals.py": 77,
    "tests/e2e/test_headroom_prometheus.py": 75,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[headroom_prometheus.py-through Prometheus x]": 25,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[monitor_cpu.py --prometheus-spoc monitor --prometheus over 16 replicas]": 12,
    "tests/e2e/test_ramp.py": 75,
    "tests/e2e/test_twin.py": 85,
    "tests/unit/test_ledger.py": 25,
    "tests/tui/test_tune_screen.py": 37,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[vs_peers_knee.py-flat 1000 in / 200 out]": 36,
    "tests/tui/test_operator.py": 34,
    "tests/e2e/test_supervise.py": 31,
    "tests/e2e/test_tune_cli.py::test_ctrl_c_stops_the_server_and_resume_finishes": 31,
    "tests/e2e/test_live_sim.py": 30,
    "tests/e2e/test_trace_replay.py": 26,
    "tests/unit/test_tune_study.py": 26,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[load_fidelity.py-]": 26,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[client_referee.py-]": 24,
    "tests/unit/test_config_cli.py": 23,
    "tests/tui/test_monitor.py": 23,
    "tests/e2e/test_ramp.py::test_arrivals_are_measured_and_lockstep_is_chosen_not_stumbled_into": 23,
    "tests/e2e/test_tune_cli.py::test_tune_three_trials_with_one_that_cannot_start": 22,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[tune_noise.py-]": 22,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[monitor_cpu.py-a bare Textual app]": 21,
    "tests/e2e/test_tune_cli.py::test_two_workers_share_one_study": 21,
    "tests/e2e/test_ramp.py::test_ramp_finds_the_knee_and_records_both_views": 21,
    "tests/unit/test_experiment.py": 20,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[sim_speed.py-its figures moved 0 % at most]": 30,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[headroom.py --cases=bursts-told max-num-seqs 24: headroom]": 30,
    "tests/unit/test_headroom.py": 20,
    "tests/unit/test_otel.py": 15,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[headroom.py-live headroom vs the measured knee]": 19,
    "tests/unit/test_twin_fit.py": 18,
    "tests/e2e/test_benchmarks.py::test_every_benchmark_runs_in_its_smoke_mode[tune_quality.py-hypervolume reached]": 17,
    "tests/e2e/test_benchmarks.py::test_knee_search_benchmark_smoke": 17,
}
"""Seconds the heaviest groups took (four workers, 2026-11-29; the last three and the second to
fourth 2026-12-06, the Prometheus ones estimated from their runs alone): ``make test`` passes
``--no-loadscope-reorder``, so xdist hands the groups out in collection order, and these are
collected first, longest first (the others after them, as collected). xdist's own order (the
groups of most tests first) had left the single-test benchmark groups for the end, one of them
running alone for its last 35 s. The figures order the groups; they decide nothing else."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (``make test`` runs several workers): a file's tests stay on one worker,
    so its module fixtures (a simulator, a server) start once, but for :data:`ALONE`; the
    real-engine tier is two groups (tests/realengine/conftest.py), so its session server starts
    once and two vLLM CPU servers never compete. First among the hooks: xdist's ``--dist
    loadgroup`` reads the marks in its own hook, and marks added after it are ignored (until this
    ran first, every file's tests were spread over the workers, each starting the file's fixtures
    again). Then the heaviest groups move to the front (:data:`HEAVY_S`), a group's own tests
    keeping their order."""
    groups: dict[str, str] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        test = item.nodeid.split("[")[0]
        if path.startswith("tests/realengine/"):
            # two workers there: the tests of the session's vLLM server on one, those that start
            # their own servers (a tuning study's trials, a refused launch, PostgreSQL) on the other
            own = path in OWN_SERVERS or item.nodeid in OWN_SERVERS
            group = "realengine-own" if own else "realengine"
        elif path in ALONE:
            group = item.nodeid
        elif test in ALONE:
            group = test
        else:
            group = path
        groups[item.nodeid] = group
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda it: -HEAVY_S.get(groups[it.nodeid], 0))  # stable: the rest keep their order


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the other worker's processes are alive; the controller checks at the end
    left = wait_gone(marked(_RUN), 15.0)
    if not left:
        return
    names = "\n  ".join(describe(p) for p in left)
    stop(left)
    session.config.get_terminal_writer().line(f"\nthe suite left {len(left)} process(es) running:\n  {names}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
