"""The baseline a windowed figure is differenced against."""

import random

from spoc_tui.core.metrics.history import ScrapeHistory


def _spans(slack_s: float) -> set[int]:
    """The window lengths (rounded, as the panels' titles show them) over ticks a second apart,
    each read a few milliseconds early or late."""
    rnd = random.Random(3)
    h: ScrapeHistory[int] = ScrapeHistory(60.0, slack_s=slack_s)
    spans = set()
    for i in range(300):
        t = i + rnd.uniform(-0.005, 0.005)
        base = h.add(t, i)
        if i > 70 and base is not None:
            spans.add(round(t - base[0]))
    return spans


def test_a_slack_keeps_the_window_from_flipping_with_the_ticks_jitter():
    assert _spans(0.0) == {60, 61}  # exactly "at least 60 s old": the baseline swaps back and forth
    assert _spans(0.5) == {60}


def test_without_slack_the_baseline_is_the_newest_a_whole_window_old():
    h: ScrapeHistory[str] = ScrapeHistory(30.0)
    for t in range(40):
        base = h.add(float(t), str(t))
    assert base == (9.0, "9")  # at t=39: 30 s old exactly
    assert ScrapeHistory(5.0, slack_s=2.0).slack_s == 0.5  # at most a tenth of the window
