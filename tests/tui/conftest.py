import time

import pytest


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Event times print in UTC, so snapshots read the same on every machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
