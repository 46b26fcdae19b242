"""The monitor's chart history: arrays, not a tuple per point, read in place."""

from __future__ import annotations

import gc
import random

from spoc_tui.core.monitor.series import History, SeriesStore, Window, columns, last_value


def _points(n: int, seed: int = 0) -> list[tuple[float, float | None]]:
    rnd = random.Random(seed)
    out: list[tuple[float, float | None]] = []
    t = 1000.0
    for _ in range(n):
        t += rnd.uniform(0.5, 1.5)
        out.append((t, None if rnd.random() < 0.1 else rnd.uniform(0, 100)))
    return out


def test_a_window_reads_what_the_points_it_holds_give():
    pts = _points(600)
    store = SeriesStore(keep_s=3600)
    for t, v in pts:
        store.add("k", t, v)
    for since in (pts[0][0] - 1, pts[200][0], pts[-1][0] + 1):
        w = store.window("k", since)
        held = [p for p in pts if p[0] >= since]
        assert w.points() == held
        assert last_value(w) == last_value(held)
        t0, t1 = since, pts[-1][0]
        for n in (1, 37, 300):
            assert columns(w, t0, t1, n) == columns(held, t0, t1, n)


def test_history_keeps_its_span_and_no_object_per_point():
    store = SeriesStore(keep_s=100)
    for i in range(5000):
        store.add("k", float(i), float(i) if i % 7 else None)
    w = store.window("k", 0.0)
    pts = w.points()
    assert pts[0][0] == 4899.0 and pts[-1] == (4999.0, 4999.0) and len(pts) == 101
    h = store._data["k"]
    assert len(h) == 101 and len(h.t) < 101 + History.TRIM  # the expired front was cut
    # doubles in place: the collector walks two arrays (their type only), never a point
    assert [r for a in (h.t, h.v) for r in gc.get_referents(a)] == [type(h.t)] * 2
    assert store.latest("k") == 4999.0
    store.add("k", 5000.0, float("inf"))  # not finite: a gap
    assert store.latest("k") is None and last_value(store.window("k", 0.0)) == 4999.0


def test_an_unknown_key_is_an_empty_window():
    w = SeriesStore().window("nothing", 0.0)
    assert isinstance(w, Window) and w.points() == [] and w.last() is None
    assert w.columns(0.0, 10.0, 4) == [None] * 4 and w.columns(0.0, 10.0, 0) == []


def test_a_clock_stepping_back_starts_the_history_again():
    store = SeriesStore()
    for t in (100.0, 101.0, 102.0):
        store.add("k", t, t)
    store.add("k", 50.0, 1.0)  # the wall clock stepped back
    assert store.window("k", 0.0).points() == [(50.0, 1.0)]
