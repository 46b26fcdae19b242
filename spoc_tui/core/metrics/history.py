"""Per-source scrape history: picks the baseline scrape for windowed figures."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class ScrapeHistory(Generic[T]):
    """Keeps timestamped scrapes just long enough to difference over ``window_s``.

    The baseline is the newest scrape at least ``window_s - slack_s`` old; until one exists, the
    oldest scrape kept (the window is then shorter, and labelled with its real length). A slack
    (the monitor's servers: half a second) keeps ticks a second apart, arriving a few milliseconds
    early or late, from swapping the baseline for the one before it: the window read 60 s and 61 s
    by turns, and every panel titled with it was redrawn each time.
    """

    def __init__(self, window_s: float = 60.0, slack_s: float = 0.0) -> None:
        if window_s <= 0:
            raise ValueError("window must be positive")
        self.window_s = window_s
        self.slack_s = min(slack_s, window_s / 10)
        self._items: deque[tuple[float, T]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, t: float, item: T) -> tuple[float, T] | None:
        """Record a scrape and return the baseline ``(t, item)`` for it, or None."""
        items = self._items
        if items and t <= items[-1][0]:
            items.clear()  # clock went backwards: start again rather than divide by <= 0
        # Drop entries older than the newest one that is already a full window old.
        while len(items) >= 2 and t - items[1][0] >= self.window_s - self.slack_s:
            items.popleft()
        base = items[0] if items else None
        items.append((t, item))
        return base

    def clear(self) -> None:
        self._items.clear()
