"""The headroom's ledger (issue 76): every minute the server served, predicted on the fit that was
current before it, beside what the server's own histograms then said of it.

A headroom is a prediction nobody checks: the knee it names is never run. But the twin that names
it predicts every minute of today's traffic too, and the server's histograms say what that minute
really was. :class:`Ledger` keeps each :data:`LEDGER_S` window the learner saw (its traffic, as
the counters and histograms give it, and the window's latency histograms for the SLA's metrics);
:func:`grade` replays that window's traffic on a fit made before it (:data:`REPLAYS` replays: the
fit and its bootstrap draws, each its own sample of the traffic, after :data:`LEAD_S` of the same
traffic so that the window opens on a busy server, as the real one did) and sets each SLA figure
the replays predict, with its 95 % prediction interval, beside the server's own figure (the
replays' step jitter spread over what the scrapes leave open, :data:`JITTER`). The
replays' figures are read as the server's are: their values counted into the server's own
buckets and interpolated as ``histogram_quantile`` does (what a Grafana panel of the server
shows). A figure is held where the server's lies inside the interval as far as its buckets can
tell: within the buckets the interval's ends fall in. Inside one bucket the interpolation is
the histogram's guess, not a measure: on the simulated A100 at a request a second the server's
gaps were 9.8-10.0 ms (p99 10.0) and the twin's 9.7-11.1 ms (p99 11.1), yet the 10-25 ms
bucket read them as p99 11.5 and 24.7 ms.

The ledger's verdict is the share of windows whose every figure fell inside its interval, and the
median error of the point per figure, over the last :data:`SPAN_S`: "predictions held 27 of 30
windows over 2 h".
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate

from spoc_tui.core.confidence import t_quantile
from spoc_tui.core.metrics.promparse import Exposition
from spoc_tui.core.metrics.stats import Histogram, bucket_quantile
from spoc_tui.core.metrics.vllm import (
    LATENCIES,
    REQUEST_GENERATION_TOKENS,
    REQUEST_PREFILL_COMPUTED,
    REQUEST_PROMPT_TOKENS,
    Scrape,
    server_view,
    windowed_histogram,
)
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.ramp.steps import RequestSample
from spoc_tui.twin.fleet import FleetSim
from spoc_tui.twin.model import ServerConfig, Twin
from spoc_tui.twin.passive import PassiveFit, PassiveWindow, fit_of, passive_twin
from spoc_tui.twin.traffic import Traffic, TrafficRows

LEDGER_S = 60.0
"""A graded window: the learner's windows two by two (a p99 over 30 s of a few requests a second
is its largest value or two)."""
LEAD_S = 30.0
"""Traffic replayed before a graded window, judged with it not: the real server met the window's
first requests busy, with those before in flight (a request lasts seconds)."""
REPLAYS = 6
"""Replays of a graded window: the fit and five of its bootstrap draws, each its own sample of the
window's traffic (its lengths and arrival times drawn again)."""
JITTER = (0.05, 0.0, 0.1, 0.025, 0.075, 0.0125, 0.0875, 0.0375, 0.0625)
"""The step jitter (its coefficient of variation) each replay of a window runs with, where no
calibrated twin measured it: the scrapes do not show it, and a p99 gap moves with it. On the
simulated L40S at a request a second (steps of 23 ms, no jitter) the passive twin's assumed 5 %
put 6 % of its gaps past the server's 25 ms bucket, where none of the server's were: its p99 read
44 ms in that bucket against the server's 24.9, held in none of ten windows. Spread over 0-10 %,
the interval holds what the scrapes leave open."""
STEP_FIGURE = Limit("itl", "mean", math.inf)
"""Graded beside the SLA's figures: the mean gap between tokens, the step time the fit is about
(the histogram's sum over its count, exact where a p99 is known to a bucket): a server that slowed
(throttled, other flags) shows in it first."""
MAD_SD = 1.4826
"""A normal spread's standard deviation over its median absolute deviation (the fit's residual)."""
MIN_REQUESTS = 10
"""Fewer requests finished in a window than this: not graded (its p99 says nothing)."""
DRIFT_WINDOWS = 2
"""Graded windows in a row whose same figure missed its interval the same way: the server is no
longer the one the fit learned (throttled, other flags, another model), and the learner forgets
the windows before the first of them. Two 95 % intervals missed by chance the same way: about
one pair in 1,600."""
SPAN_S = 7200.0
"""The windows the ledger's verdict counts: the last two hours."""
KEEP = 240
"""Windows kept, graded and not yet graded (four hours of minutes)."""


@dataclass(frozen=True, slots=True)
class Seen:
    """One window as the server served it."""

    t0: float
    t1: float
    traffic: Traffic
    histograms: tuple[tuple[str, Histogram], ...]
    """The window's latency histogram per metric the SLA names (``ttft``, ``itl``, ...)."""

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    def histogram(self, metric: str) -> Histogram | None:
        return next((h for m, h in self.histograms if m == metric), None)


@dataclass(frozen=True, slots=True)
class Figure:
    """One SLA figure of one window: the server's, and the replays' with their interval."""

    key: str
    """The limit's key: ``ttft_p99``."""
    observed: float
    predicted: float
    lo: float
    hi: float
    replays: int
    lo_edge: float
    hi_edge: float
    """The interval to the server's resolution: the lower edge of the bucket ``lo`` falls in and
    the upper edge of ``hi``'s (``lo`` and ``hi`` for a mean, which the histogram's sum gives
    exactly)."""

    @property
    def held(self) -> bool:
        return self.lo_edge <= self.observed <= self.hi_edge

    @property
    def error(self) -> float:
        """The point's error, a fraction of the server's figure (+: predicted too high)."""
        return (self.predicted - self.observed) / self.observed if self.observed > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "observed": round(self.observed, 6),
            "predicted": round(self.predicted, 6),
            "ci95": [round(self.lo, 6), round(self.hi, 6)],
            "ci95_to_buckets": [round(self.lo_edge, 6), round(self.hi_edge, 6)],
            "held": self.held,
            "error": round(self.error, 4),
        }


@dataclass(frozen=True, slots=True)
class Graded:
    """A window graded: each SLA figure predicted beside the server's."""

    t0: float
    t1: float
    requests: int
    """Requests the server finished in the window."""
    figures: tuple[Figure, ...]

    @property
    def held(self) -> bool:
        """Every figure inside its interval."""
        return all(f.held for f in self.figures)


def window_traffic(scrape: Scrape) -> Traffic | None:
    """The traffic of one window (a scrape differenced against an earlier one), as a headroom
    replays it; None where the scrape has no earlier one or the window is empty."""
    if scrape.then is None or scrape.t_then is None:
        return None
    secs = scrape.t_now - scrape.t_then
    view = server_view("server", scrape).total
    done = (view.request_rate or 0.0) * secs
    if secs <= 0 or done <= 0:
        return None
    return Traffic(
        seconds=secs,
        requests=done,
        rate=done / secs,
        dispersion=None,
        prompt=windowed_histogram(scrape, REQUEST_PROMPT_TOKENS),
        output=windowed_histogram(scrape, REQUEST_GENERATION_TOKENS),
        computed=windowed_histogram(scrape, REQUEST_PREFILL_COMPUTED),
        prefix_share=view.prefix_cache_hit_rate,
        window_s=secs,
    )


def seen_of(scrape: Scrape, limits: Sequence[Limit]) -> Seen | None:
    """The window ``scrape`` spans, as the ledger keeps it (its arrivals replayed as Poisson at its
    rate: a window's own two counts cannot say how even they came). None where the window has no
    traffic or lacks a histogram the SLA reads."""
    traffic = window_traffic(scrape)
    if traffic is None:
        return None
    hists: list[tuple[str, Histogram]] = []
    for metric in dict.fromkeys(lim.metric for lim in (*limits, STEP_FIGURE) if lim.metric in LATENCIES):
        h = windowed_histogram(scrape, LATENCIES[metric])
        if h is not None and h.complete and h.count:
            hists.append((metric, h))
        elif any(lim.metric == metric for lim in limits):
            return None
    assert scrape.t_then is not None
    return Seen(scrape.t_then, scrape.t_now, traffic, tuple(hists))


def replay_values(samples: Sequence[RequestSample], metric: str, t0: float, t1: float) -> list[float]:
    """The metric's values the replay's server would have observed in ``[t0, t1)``: a TTFT when
    the first token came, each gap between tokens when its token came, an end-to-end latency when
    the request ended (as vLLM observes them)."""
    out: list[float] = []
    for s in samples:
        if not s.ok or s.ttft is None:
            continue
        first = s.start + s.ttft
        if metric == "ttft":
            if t0 <= first < t1:
                out.append(s.ttft)
        elif metric == "itl":
            if first >= t1:
                continue
            for t, gap in zip(accumulate(s.itl, initial=first), s.itl, strict=False):
                at = t + gap
                if at >= t1:
                    break
                if at >= t0:
                    out.append(gap)
        elif metric in ("e2e", "tpot"):
            if s.end is not None and t0 <= s.end < t1:
                v = s.e2e if metric == "e2e" else s.tpot
                if v is not None:
                    out.append(v)
    return out


def as_server_reads(values: Sequence[float], like: Histogram, stat: str) -> float | None:
    """``values`` read as the server reads its own: counted into ``like``'s buckets, then its
    quantile interpolated as ``histogram_quantile`` does (``mean``: their mean)."""
    if not values:
        return None
    if stat == "mean":
        return statistics.fmean(values)
    q = float(stat[1:]) / 100.0
    counts = [0.0] * len(like.bounds)
    for v in values:
        for i, b in enumerate(like.bounds):
            if v <= b:
                counts[i] += 1
                break
    cum = tuple(accumulate(counts))
    return bucket_quantile(q, like.bounds, cum)


def server_reads(h: Histogram, stat: str) -> float | None:
    return h.mean() if stat == "mean" else h.quantile(float(stat[1:]) / 100.0)


def to_buckets(lo: float, hi: float, like: Histogram, stat: str) -> tuple[float, float]:
    """``[lo, hi]`` widened to the edges of the buckets they fall in (a mean's kept)."""
    if stat == "mean":
        return lo, hi
    finite = [b for b in like.bounds if math.isfinite(b)]
    lo_edge = max((b for b in finite if b < lo), default=0.0)
    hi_edge = min((b for b in finite if b >= hi), default=math.inf)
    return lo_edge, hi_edge


def prediction_interval(values: Sequence[float], scatter: float = 0.0) -> tuple[float, float, float]:
    """The point and 95 % prediction interval of one more figure like ``values`` (each replay's):
    their logs' mean, +- Student's t times their spread times sqrt(1 + 1/n) (a figure the server
    reads is one more sample of what the replays are many of), the fit's own ``scatter`` (a
    window's step about the model, a fraction's standard deviation) added in quadrature: the
    replays share the fit's step time, and a window's mean gap strays from it by that much (on
    the simulated A100 the replays alone put the mean gap at 10.0 ms +-1 % where the server's
    read 10.1 and 10.2 ms, outside, in two of 35 minutes)."""
    logs = [math.log(max(v, 1e-9)) for v in values]
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(m), math.exp(m), math.exp(m)
    sd = math.sqrt(statistics.variance(logs) * (1 + 1 / len(logs)) + math.log1p(scatter) ** 2)
    t = t_quantile(len(logs) - 1)
    return math.exp(m), math.exp(m - t * sd), math.exp(m + t * sd)


def grade(
    seen: Seen,
    fit: PassiveFit,
    server: ServerConfig,
    limits: Sequence[Limit],
    prior: Twin | None = None,
    seed: int = 0,
    replays: int = REPLAYS,
) -> Graded | None:
    """``seen`` predicted on ``fit`` (made before it): its traffic replayed ``replays`` times at x1
    on the fit and its draws, each figure of the SLA read from the replays as the server reads it,
    beside the server's. None where no replay could read a figure."""
    twin = passive_twin(fit, server, prior, max(0, replays - 1))
    models = [fit.model, *fit.draws[: max(0, replays - 1)]]
    jitters = (
        [twin.step_cv] * len(models) if prior is not None else [JITTER[j % len(JITTER)] for j in range(len(models))]
    )
    span = LEAD_S + seen.seconds
    got: dict[str, list[float]] = {}
    latency = [lim for lim in (*limits, STEP_FIGURE) if lim.metric in LATENCIES and seen.histogram(lim.metric)]
    latency = list({lim.key: lim for lim in latency}.values())
    for j, (model, jitter) in enumerate(zip(models, jitters, strict=True)):
        rows = TrafficRows.of(seen.traffic, seed * 7919 + j, server, span).at(1.0)
        sim = FleetSim(replace(twin, step_cv=jitter), rows, 1.0, replicas=1, model=model, seed=seed * 7919 + j)
        sim.run()
        values = {m: replay_values(sim.samples, m, LEAD_S, span) for m in {lim.metric for lim in latency}}
        for lim in latency:
            like = seen.histogram(lim.metric)
            assert like is not None
            v = as_server_reads(values[lim.metric], like, lim.stat)
            if v is not None:
                got.setdefault(lim.key, []).append(v)
    figures = []
    for lim in latency:
        h = seen.histogram(lim.metric)
        observed = server_reads(h, lim.stat) if h is not None else None
        vals = got.get(lim.key, [])
        if observed is None or len(vals) < 2:
            continue
        point, lo, hi = prediction_interval(vals, MAD_SD * fit.residual_pct / 100.0)
        assert h is not None
        figures.append(Figure(lim.key, observed, point, lo, hi, len(vals), *to_buckets(lo, hi, h, lim.stat)))
    if not figures:
        return None
    return Graded(seen.t0, seen.t1, round(seen.traffic.requests), tuple(figures))


@dataclass(frozen=True, slots=True)
class LedgerSummary:
    """The ledger's verdict over its span."""

    windows: int
    held: int
    span_s: float
    median_error: float | None
    """The median over figures and windows of the point's absolute error (a fraction)."""
    by_metric: tuple[tuple[str, int, int, float], ...]
    """Per figure: windows, held, median absolute error."""
    waiting: int = 0
    """Windows seen and not graded yet."""
    reason: str = ""
    """Why there is nothing to show yet, or what the windows left out were."""

    def as_dict(self) -> dict[str, object]:
        return {
            "windows": self.windows,
            "held": self.held,
            "span_s": round(self.span_s),
            "median_error": None if self.median_error is None else round(self.median_error, 4),
            "by_metric": {k: {"windows": n, "held": h, "median_error": round(e, 4)} for k, n, h, e in self.by_metric},
            "waiting": self.waiting,
            "reason": self.reason,
        }

    def line(self) -> str:
        """``predictions held 27 of 30 windows over 2 h (median error 8 %)``, or why none yet."""
        if not self.windows:
            return f"predictions not graded yet: {self.reason}" if self.reason else "predictions not graded yet"
        span = f"{self.span_s / 3600:.1f} h" if self.span_s >= 5400 else f"{self.span_s / 60:.0f} min"
        err = f" (median error {self.median_error * 100:.0f} %)" if self.median_error is not None else ""
        return f"predictions held {self.held} of {self.windows} windows over {span}{err}"


class Ledger:
    """One server's windows: each :data:`LEDGER_S` window the learner closes (:meth:`see`), kept
    until graded (:meth:`next_to_grade`, :meth:`add`), and the graded ones' verdict
    (:meth:`summary`)."""

    def __init__(self, limits: Sequence[Limit], window_s: float = LEDGER_S) -> None:
        self.limits = tuple(limits)
        self.window_s = window_s
        self._mark: tuple[float, Exposition] | None = None
        self.seen: deque[Seen] = deque(maxlen=KEEP)
        self.graded: deque[Graded] = deque(maxlen=KEEP)
        self.skipped: dict[str, int] = {}
        """Windows not graded, by why."""
        self.fit: PassiveFit | None = None
        """The newest fit a window was graded on (:func:`grade_after`'s ``last``)."""

    def see(self, t: float, exp: Exposition) -> None:
        """A scrape at ``t``: every ``window_s`` one closes a window (the learner calls it at each of
        its own windows' scrapes)."""
        if self._mark is not None and t - self._mark[0] < self.window_s - 1e-6:
            return
        if self._mark is not None:
            t_last, last = self._mark
            seen = seen_of(Scrape(exp, t, last, t_last), self.limits)
            if seen is not None:
                self.seen.append(seen)
            else:
                self._skip("no traffic or no latency histogram in the window")
        self._mark = (t, exp)

    def restart(self) -> None:
        """The server's counters went back: the window under way is lost (not its graded ones), and
        the fit of before grades nothing of the server since (the learner learns it again)."""
        self._mark = None
        self.fit = None

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def take(self, most: int) -> list[Seen]:
        """The ``most`` newest windows not graded yet, oldest first, taken off (the older dropped)."""
        out = list(self.seen)[-most:] if most > 0 else []
        self.seen.clear()
        return out

    def take_newest(self) -> Seen | None:
        """The newest window not graded yet, taken off; the older ones are dropped (grading is kept
        to a CPU share, and the newest is what an operator reads)."""
        return next(iter(self.take(1)), None)

    def add(self, graded: Graded | str) -> None:
        """A window graded, or why it could not be."""
        if isinstance(graded, str):
            self._skip(graded)
        else:
            self.graded.append(graded)

    def drift(self) -> tuple[float, str] | None:
        """Where the last :data:`DRIFT_WINDOWS` graded windows missed the same figure the same way:
        when the first of them began, and what they said (``itl_p99 38 % and 41 % high``)."""
        last = list(self.graded)[-DRIFT_WINDOWS:]
        if len(last) < DRIFT_WINDOWS:
            return None
        for key in (f.key for f in last[0].figures):
            figs = [next((f for f in g.figures if f.key == key), None) for g in last]
            if any(f is None or f.held for f in figs):
                continue
            errors = [f.error for f in figs if f is not None]
            if all(e > 0 for e in errors) or all(e < 0 for e in errors):
                way = "high" if errors[0] > 0 else "low"
                said = " and ".join(f"{abs(e) * 100:.0f} %" for e in errors)
                return last[0].t0, f"{key} predicted {said} {way}, outside the intervals"
        return None

    def summary(self, now: float, span_s: float = SPAN_S) -> LedgerSummary:
        recent = [g for g in self.graded if g.t1 >= now - span_s]
        by: dict[str, list[Figure]] = {}
        for g in recent:
            for f in g.figures:
                by.setdefault(f.key, []).append(f)
        rows = tuple(
            (k, len(fs), sum(f.held for f in fs), statistics.median(abs(f.error) for f in fs)) for k, fs in by.items()
        )
        errors = [abs(f.error) for fs in by.values() for f in fs]
        reason = "; ".join(f"{n} windows skipped: {why}" for why, n in self.skipped.items())
        if not recent and not reason:
            reason = "a window is graded once a fit made before it can predict it"
        return LedgerSummary(
            windows=len(recent),
            held=sum(g.held for g in recent),
            span_s=min(span_s, max((g.t1 for g in recent), default=now) - min((g.t0 for g in recent), default=now)),
            median_error=statistics.median(errors) if errors else None,
            by_metric=rows,
            waiting=len(self.seen),
            reason=reason,
        )


def grade_after(
    seen: Seen,
    windows: Sequence[PassiveWindow],
    server: ServerConfig,
    limits: Sequence[Limit],
    prior: Twin | None = None,
    kv_bytes_per_token: float | None = None,
    seed: int = 0,
    last: PassiveFit | None = None,
) -> tuple[Graded | str, PassiveFit | None]:
    """``seen`` graded on the fit of the passive windows that ended before it began (the fit that
    was current before it: it never saw the window), or why it cannot be; and the fit it was
    graded on. Where those windows no longer identify the step time (a server that changed
    mixes two step times in them), ``last``, the newest fit that did, grades it: its misses are
    what tells the change (:meth:`Ledger.drift`)."""
    if seen.traffic.requests < MIN_REQUESTS:
        return f"fewer than {MIN_REQUESTS} requests finished", None
    fit = fit_of([w for w in windows if w.t <= seen.t0 + 1e-6], prior, kv_bytes_per_token, seed)
    if not fit.identified:
        if last is None:
            return "the fit before it could not say the step time yet", None
        fit = last
    return grade(seen, fit, server, limits, prior, seed) or "no replay read a figure", fit
