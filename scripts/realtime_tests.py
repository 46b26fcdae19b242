"""A pytest plugin that lists the tests using a server that runs in real time (issue 55's count).

A test counts when it, or a fixture it uses, starts one of these:

- a child process living at least 1 s whose command line names a simulator, a study, a
  benchmark or vLLM (``sim``, ``demo``, ``serve``, ``tune``, ``spoc_tui.sim``, ``vllm``,
  ``benchmarks/``), unless it exited with code 2: a refusal starts nothing, however long a
  loaded host took to load the command (a ``python -c`` script's text is not read: it names
  what it imports);
- an aiohttp site or a socketserver.

"Starters" are the tests whose own set-up or body started one; the others use one a fixture
started. Servers started by grandchildren are not seen.

Usage, the suite's first part with the plugin loaded::

    PYTHONPATH=scripts COUNT_OUT=/tmp/rt .venv/bin/python -m pytest -p realtime_tests -n 4 \\
        --dist loadgroup --no-loadscope-reorder --ignore=tests/realengine tests
    cat /tmp/rt.gw* | sort -u | wc -l            # tests that use a real-time server
    cat /tmp/rt.starters.gw* | sort -u | wc -l   # tests that start one
"""

from __future__ import annotations

import os
import socketserver
import subprocess
import time
from typing import Any

import pytest
from aiohttp import web

SERVER_WORDS = {"sim", "demo", "serve", "tune"}
LIVES_S = 1.0

_fixtures: list[tuple[str, str]] = []
_phase: list[str | None] = [None]
_test: list[str | None] = [None]
_children: list[tuple[Any, tuple[str, str] | None, str | None]] = []
_fixture_servers: set[tuple[str, str]] = set()
_test_servers: set[str] = set()
_test_fixtures: dict[str, list[str]] = {}


def _context() -> tuple[tuple[str, str] | None, str | None]:
    fx = _fixtures[-1] if _phase[0] == "setup" and _fixtures else None
    return fx, _test[0]


_orig_exit = subprocess.Popen._handle_exitstatus  # type: ignore[attr-defined]
_orig_init = subprocess.Popen.__init__


def _handle_exitstatus(self: Any, *a: Any, **k: Any) -> Any:
    if getattr(self, "_rt_t1", None) is None:
        self._rt_t1 = time.monotonic()
    return _orig_exit(self, *a, **k)


def _init(self: Any, args: Any, *a: Any, **k: Any) -> None:
    _orig_init(self, args, *a, **k)
    argv = [str(x) for x in (args if isinstance(args, (list, tuple)) else str(args).split())]
    argv = [x for x in argv if "\n" not in x]  # a `python -c SCRIPT`'s text
    if "--help" in argv:
        return
    if SERVER_WORDS & set(argv) or any(w in x for x in argv for w in ("spoc_tui.sim", "vllm", "benchmarks/")):
        self._rt_t0 = time.monotonic()
        fx, test = _context()
        _children.append((self, fx, test))


def _mark_in_process() -> None:
    fx, test = _context()
    if fx:
        _fixture_servers.add(fx)
    if test:
        _test_servers.add(test)


_orig_start = web.BaseSite.start


async def _start(self: Any) -> None:
    await _orig_start(self)
    _mark_in_process()


_orig_bind = socketserver.TCPServer.server_bind


def _bind(self: Any) -> None:
    _orig_bind(self)
    _mark_in_process()


subprocess.Popen._handle_exitstatus = _handle_exitstatus  # type: ignore[attr-defined]
subprocess.Popen.__init__ = _init  # type: ignore[method-assign]
web.BaseSite.start = _start  # type: ignore[method-assign]
socketserver.TCPServer.server_bind = _bind  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Any:
    _fixtures.append((fixturedef.baseid, fixturedef.argname))
    yield
    _fixtures.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: Any) -> Any:
    _test[0], _phase[0] = item.nodeid, "setup"
    _test_fixtures[item.nodeid] = list(item.fixturenames)
    yield
    _phase[0] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    _phase[0] = "call"
    yield
    _phase[0] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: Any) -> Any:
    yield
    _test[0] = None


def pytest_sessionfinish(session: Any) -> None:
    now = time.monotonic()
    fixtures, tests = set(_fixture_servers), set(_test_servers)
    for proc, fx, test in _children:
        refused = proc.returncode == 2  # exit code 2: bad input, refused before anything started
        if not refused and (getattr(proc, "_rt_t1", None) or now) - proc._rt_t0 >= LIVES_S:
            if fx:
                fixtures.add(fx)
            if test:
                tests.add(test)
    starters = set(tests)
    for test, names in _test_fixtures.items():
        if any(name in names and test.startswith(base) for base, name in fixtures):
            tests.add(test)
    out = os.environ.get("COUNT_OUT", "/tmp/realtime_tests")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{out}.{worker}", "w") as f:
        f.write("\n".join(sorted(tests)))
    with open(f"{out}.starters.{worker}", "w") as f:
        f.write("\n".join(sorted(starters)))
