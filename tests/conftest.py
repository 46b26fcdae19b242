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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (``make test`` runs two workers): a file's tests stay on one worker, so
    its module fixtures (a simulator, a server) start once; the real-engine tier is one group
    (tests/realengine/conftest.py), so its session server starts once and two vLLM CPU servers
    never compete."""
    for item in items:
        path = item.nodeid.split("::")[0]
        if path == "tests/e2e/test_benchmarks.py":  # no shared fixture: each benchmark may go to either worker
            item.add_marker(pytest.mark.xdist_group(item.nodeid))
            continue
        if path == "tests/e2e/test_twin.py":
            # the twin's predictions are seconds of pure CPU: never beside the ramp tests that time
            # a real-time server on the other worker (a knee search lost requests to them, CI13)
            path = "tests/e2e/test_ramp.py"
        item.add_marker(pytest.mark.xdist_group("realengine" if path.startswith("tests/realengine/") else path))


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
