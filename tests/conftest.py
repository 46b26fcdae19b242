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
    "tests/realengine/test_real_vllm.py::test_launcher_reports_a_configuration_vllm_refuses",
}
"""Real-engine tests that start their own servers rather than use the session's vLLM."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (``make test`` runs several workers): a file's tests stay on one worker,
    so its module fixtures (a simulator, a server) start once; the real-engine tier is one group
    (tests/realengine/conftest.py), so its session server starts once and two vLLM CPU servers
    never compete. First among the hooks: xdist's ``--dist loadgroup`` reads the marks in its own
    hook, and marks added after it are ignored (until this ran first, every file's tests were
    spread over the workers, each starting the file's fixtures again)."""
    for item in items:
        path = item.nodeid.split("::")[0]
        if path == "tests/e2e/test_benchmarks.py":  # no shared fixture: each benchmark may go to either worker
            item.add_marker(pytest.mark.xdist_group(item.nodeid))
            continue
        if path.startswith("tests/realengine/"):
            # two workers there: the tests of the session's vLLM server on one, those that start
            # their own servers (a tuning study's trials, a refused launch, PostgreSQL) on the other
            own = path in OWN_SERVERS or item.nodeid in OWN_SERVERS
            item.add_marker(pytest.mark.xdist_group("realengine-own" if own else "realengine"))
            continue
        item.add_marker(pytest.mark.xdist_group(path))


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
