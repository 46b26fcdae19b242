"""Issue 55's count, in every Python process the suite starts (on PYTHONPATH only while counting):
a TCP socket put to listen is recorded with the test or fixture that was running when the process
(or the ancestor that started it) was started. See realtime_tests.py.

The socket module is patched when something imports it, not imported here: a process that never
touches the network stays so (tests check that ``spoc_tui.core`` imports none)."""

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

_DIR = os.environ.get("SPOC_RT_DIR")


def _patch(socket: Any) -> None:
    listen = socket.socket.listen

    def recorded_listen(self: Any, *args: int) -> None:
        listen(self, *args)
        if _DIR and self.family in (socket.AF_INET, socket.AF_INET6):
            try:
                with open(os.path.join(_DIR, f"listen.{os.getpid()}"), "a") as f:
                    f.write(os.environ.get("SPOC_RT_CTX", "") + "\n")
            except OSError:
                pass

    socket.socket.listen = recorded_listen


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "socket":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if _DIR:
    if "socket" in sys.modules:
        _patch(sys.modules["socket"])
    else:
        sys.meta_path.insert(0, _Finder())
