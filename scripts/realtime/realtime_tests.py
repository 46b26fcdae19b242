"""A pytest plugin that lists the tests using a server that runs in real time (issue 55's count).

A test counts when it, or a fixture it uses, makes a process listen on a TCP socket: the test's
own process (an aiohttp site, a socketserver), a child (a simulator, ``vllm serve``) or any
descendant (a study's servers, a benchmark's simulator). ``sitecustomize.py`` beside this file
records each listen in every Python process started with this folder on PYTHONPATH, with the
context (a fixture's set-up or a test) this plugin had put in the environment when that process,
or the ancestor that started it, was started. A refusal that exits before it listens starts
nothing, however long a loaded host took to load the command.

"Starters" are the tests whose own set-up or body made something listen; the others use a server
a fixture started.

Usage, the suite's first part with the plugin loaded::

    D=$(mktemp -d) PYTHONPATH=scripts/realtime SPOC_RT_DIR=$D COUNT_OUT=/tmp/rt \\
        SPOC_SKIP_REALENGINE=1 .venv/bin/python -m pytest -p realtime_tests -n 4 \\
        --dist loadgroup --no-loadscope-reorder --ignore=tests/realengine tests
    cat /tmp/rt.users          # the tests that use a real-time server, one a line
    cat /tmp/rt.starters       # the tests that start one

(Set SPOC_RT_DIR on the command line: every process must see it from its start.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

_stack: list[str] = []
_test_fixtures: dict[str, list[str]] = {}


def _set(ctx: str) -> None:
    os.environ["SPOC_RT_CTX"] = ctx


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Any:
    _stack.append(json.dumps(["F", fixturedef.baseid, fixturedef.argname]))
    _set(_stack[-1])
    yield
    _stack.pop()
    _set(_stack[-1] if _stack else "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: Any) -> Any:
    _test_fixtures[item.nodeid] = list(item.fixturenames)
    _stack[:] = [json.dumps(["T", item.nodeid])]
    _set(_stack[0])
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    _set(json.dumps(["T", item.nodeid]))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: Any) -> Any:
    _set("")
    yield
    _stack.clear()


def pytest_sessionfinish(session: Any) -> None:
    rt_dir = os.environ.get("SPOC_RT_DIR")
    if not rt_dir:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(rt_dir, f"fixtures.{worker}.json").write_text(json.dumps(_test_fixtures))
    if worker == "main":  # the last to finish: alone, or xdist's controller after its workers
        _summarise(Path(rt_dir), os.environ.get("COUNT_OUT", "/tmp/realtime_tests"))


def _summarise(rt_dir: Path, out: str) -> None:
    """Every worker's records (again by hand: ``python realtime_tests.py DIR OUT``)."""
    fixtures: set[tuple[str, str]] = set()
    starters: set[str] = set()
    for f in rt_dir.glob("listen.*"):
        for line in f.read_text().splitlines():
            if not line:
                continue
            kind, *rest = json.loads(line)
            if kind == "F":
                fixtures.add((rest[0], rest[1]))
            else:
                starters.add(rest[0])
    users = set(starters)
    for f in rt_dir.glob("fixtures.*.json"):
        for test, names in json.loads(f.read_text()).items():
            if any(name in names and test.startswith(base) for base, name in fixtures):
                users.add(test)
    Path(f"{out}.users").write_text("".join(t + "\n" for t in sorted(users)))
    Path(f"{out}.starters").write_text("".join(t + "\n" for t in sorted(starters)))


if __name__ == "__main__":
    import sys

    _summarise(Path(sys.argv[1]), sys.argv[2])
