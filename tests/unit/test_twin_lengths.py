"""Token lengths from vLLM's histograms (``spoc_tui.twin.lengths``): one shape inside each bucket
for the replay's draws and for the passive fit's tokens past a GPU's ridge."""

from __future__ import annotations

import math
import random

import pytest

from spoc_tui.core.metrics.stats import Histogram
from spoc_tui.twin.lengths import Lengths

INF = math.inf
BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, INF)


def _sample(seed: int = 3, n: int = 3000) -> tuple[list[int], Histogram]:
    rng = random.Random(seed)  # the headroom benchmark's new prompt tokens: lognormal, a long tail
    values = [max(1, min(3000, round(rng.lognormvariate(math.log(300), 0.8)))) for _ in range(n)]
    counts = tuple(float(sum(1 for v in values if v <= b)) for b in BOUNDS)
    return values, Histogram(BOUNDS, counts, float(n), float(sum(values)))


def _log_uniform_excess(h: Histogram, room: float) -> float:
    """The excess with every bucket log-uniform (the passive fit's before 2026-11-30)."""
    out, lo, prev = 0.0, 0.0, 0.0
    for bound, cum in zip(h.bounds, h.counts, strict=True):
        hi = bound if math.isfinite(bound) else 2 * lo
        share = (cum - prev) / h.count
        if share > 0 and hi > room:
            a = max(lo, 1.0)
            c = max(a, room)
            out += share * ((hi - c) - room * math.log(hi / c)) / math.log(hi / a)
        lo, prev = hi, cum
    return out


def test_the_excess_is_what_the_draws_have_past_the_room():
    """``excess(room)`` integrates the very shape :meth:`Lengths.at` draws from: at 0 it is the
    mean; past the longest length, 0; between, the mean of ``max(0, x - room)`` over the draws."""
    _, h = _sample()
    lengths = Lengths.of(h)
    assert lengths is not None
    assert lengths.excess(0.0) == pytest.approx(lengths.mean(), rel=1e-9)
    assert lengths.excess(1e6) == 0.0
    qs = [(k + 0.5) / 20_000 for k in range(20_000)]
    for room in (50.0, 320.0, 700.0, 1500.0, 2600.0):
        drawn = sum(max(0, lengths.at(q) - room) for q in qs) / len(qs)
        assert lengths.excess(room) == pytest.approx(drawn, rel=0.02, abs=0.05), room
    rooms = [0.0, 100.0, 300.0, 1000.0, 3000.0]
    assert all(a > b for a, b in zip(map(lengths.excess, rooms), map(lengths.excess, rooms[1:]), strict=False))


def test_a_tail_buckets_tokens_past_the_ridge_as_the_sample_has_them():
    """Past a GPU's ridge (a few hundred tokens) the tokens are those of the tail buckets. The
    histogram's shape (its mean kept, each bucket tilted by its neighbours) gives them within 8 %
    of the sample's own a few hundred tokens in, within a quarter far out in the tail; every bucket
    log-uniform put a tail bucket's lengths towards its top and gave 16-77 % more, which the
    passive fit read as a cheaper prefill token."""
    for seed in (3, 4, 5):
        values, h = _sample(seed)
        lengths = Lengths.of(h)
        assert lengths is not None
        for room, within in ((322.0, 0.08), (700.0, 0.08), (1300.0, 0.25)):
            true = sum(max(0, v - room) for v in values) / len(values)
            off = lengths.excess(room) / true - 1
            assert abs(off) < within, (seed, room, off)
            assert _log_uniform_excess(h, room) / true - 1 > max(0.1, 2 * abs(off)), (seed, room)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lengths_drawn_many_at_once_are_those_drawn_one_by_one(monkeypatch, seed):
    """The replays' lengths, compiled (Lengths.at_many): the same ints as Lengths.at, at the
    buckets' edges, their middles and the ends of the range too."""
    from spoc_tui.twin.fastreplay import ENV

    _, h = _sample(seed)
    tilted = Lengths.of(h)
    assert tilted is not None
    rng = random.Random(seed)
    qs = [rng.random() for _ in range(5000)] + [0.0, 1.0, 1e-300, 1 - 1e-16] + list(tilted.cum)
    for lengths in (tilted, Lengths(tilted.edges, tilted.cum, tilted.shape, 0.0)):
        many = lengths.at_many(qs)
        assert many == [lengths.at(q) for q in qs]
        monkeypatch.setenv(ENV, "python")
        assert lengths.at_many(qs) == many
        monkeypatch.delenv(ENV)
