import time

import pytest

from spoc_tui.tui.textual_mode import STOCK

# the lean compositor's own tests compare spoc's fork with Textual's internals: nothing to test in
# the stock mode (SPOC_TEXTUAL=stock), which must not import the fork at all
collect_ignore = ["test_compositor.py"] if STOCK else []


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Event times print in UTC, so snapshots read the same on every machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
