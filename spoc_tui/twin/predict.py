"""A ramp predicted by the twin, in virtual time: the same experiment ``spoc ramp`` runs, on the
twin's engine instead of the server, in seconds rather than minutes.

The users start and pace as ``spoc ramp``'s do (:class:`~spoc_tui.sim.virtual.VirtualServer` with
the ramp's spawn rate, its jitter before turns, lockstep or staggered arrivals), each step warms
up and is measured for the same seconds, an inconclusive step is measured on by the same rule,
and the knee search chooses its levels from the same inference. Each step's figures are judged
exactly as a measured step's are (:func:`~spoc_tui.core.ramp.steps.summarize_step`).

How sure: the ramp runs once on the fit (the figures written), then again at the same levels once
per bootstrap draw of the fit (each with its own seed). A figure's prediction interval spans the
draws' figures (2.5 to 97.5 %) and the fit's own sampling interval; the knee's interval spans the
draws' knees and the fit's. Near saturation the draws spread (a step a few percent slower turns
a short queue into a long one): each step says how much of its window requests waited in the
queue or the batch was full, and the interval widens by itself.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from spoc_tui.core.confidence import Interval, t_quantile
from spoc_tui.core.ramp.experiment import (
    Driver,
    EngineShare,
    Experiment,
    Measured,
    RampProgress,
    experiment_of,
    immediately,
    run_now,
)
from spoc_tui.core.ramp.inference import KneeEstimate, Trend, infer_knee, level_margin, level_trend, shifted_knee
from spoc_tui.core.ramp.knee import FixedRates, FixedSpeeds, FixedUsers, Knee, SpeedSearch, UserPlan
from spoc_tui.core.ramp.sla import LevelUnit, Limit
from spoc_tui.core.ramp.steps import (
    ClientHealth,
    ReplaySent,
    RequestSample,
    ServerWindow,
    StepSummary,
    point_value,
)
from spoc_tui.core.traces.read import TraceError, TraceRow, TraceSource
from spoc_tui.core.traces.replay import ReplayShare
from spoc_tui.load import defaults
from spoc_tui.load.defaults import ABORT_FACTOR, spawn_rate
from spoc_tui.sim.backend import PollStats, VirtualBackend, counters
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.twin.engine import TwinEngine
from spoc_tui.twin.fleet import FleetSim
from spoc_tui.twin.model import StepModel, Twin, TwinError
from spoc_tui.workload import Workload

T = TypeVar("T")

DRAWS = 16
"""Runs on bootstrap draws of the fit beside the fit's own (the prediction interval's)."""
SATURATED = 0.25
"""A step whose requests waited (or whose batch was full) this share of its window is near
saturation: said with its interval. Not the engine's busy share: with continuous batching it
iterates whenever any request is in flight, 99 % busy far below its capacity."""

METRICS: tuple[tuple[str, str], ...] = (
    ("ttft", "p50"),
    ("ttft", "p90"),
    ("ttft", "p99"),
    ("itl", "p50"),
    ("itl", "p90"),
    ("itl", "p99"),
    ("e2e", "p50"),
    ("e2e", "p90"),
    ("output_tokens_per_s", ""),
    ("request_rate", ""),
)


def metric_key(metric: str, stat: str) -> str:
    return f"{metric}_{stat}" if stat else metric


def figure(step: StepSummary, metric: str, stat: str) -> float | None:
    """A step's figure: ``ttft`` ``p90`` -> its TTFT p90; ``output_tokens_per_s`` -> the total."""
    if not stat:
        v = getattr(step, metric)
        return float(v) if v is not None else None
    return step.latency.of(metric).stat(stat)


def figure_ci(step: StepSummary, metric: str, stat: str) -> Interval:
    if not stat:
        return getattr(step.ci95, metric)  # type: ignore[no-any-return]
    return step.latency.of(metric).interval(stat)


@dataclass(frozen=True)
class Prediction(defaults.StepRules):
    """How to run the predicted ramp: the experiment of a ``spoc ramp`` command (its step rules,
    :class:`~spoc_tui.core.ramp.rules.StepRules`, and the twin it runs on)."""

    twin: Twin
    workload: Workload
    plan: UserPlan
    """Listed users or rates, the knee search, or (with ``trace``) speeds."""
    limits: tuple[Limit, ...]
    flags: Mapping[str, object] = field(default_factory=dict)
    draws: int = DRAWS
    trace: TraceRows | None = None
    """A trace replay (``--trace``): its steps are speeds (``plan`` a
    :class:`~spoc_tui.core.ramp.knee.FixedSpeeds` or :class:`~spoc_tui.core.ramp.knee.SpeedSearch`)."""
    draws_near_knee: bool = False
    """A trace's draws replay only the fit's levels around its knee, outward while a draw's knee
    lies past them, and none where the fit's knee lies beyond its levels (or it has none): a
    headroom reads the knee alone, and a bound's interval is the fit's own (the draws' knees widen
    a crossing's only). ``spoc twin predict`` gives every step's interval, which needs every level
    on every draw."""

    @property
    def open_loop(self) -> bool:
        """Steps of arrival rates (``--rate``) or of a trace's speed, not of users."""
        return isinstance(self.plan, FixedRates) or self.trace is not None

    @property
    def unit(self) -> LevelUnit:
        return "x" if self.trace is not None else "req/s" if self.open_loop else "users"

    def experiment(self, seed: int | None = None) -> Experiment:
        """The experiment ``spoc ramp`` would run, for the driver."""
        return experiment_of(
            self,
            abort_factor=ABORT_FACTOR,
            seed=self.seed if seed is None else seed,
            replay_s=self.trace.step_s if self.trace is not None else None,
            # a replay's queue read as often as its engine notes it (a ramp's polls otherwise)
            poll_s=POLL_S if self.trace is not None else defaults.POLL_S,
            error=TwinError,
        )

    def rate(self, change: int) -> float:
        """Users per second for a step that changes the count by ``change`` (as ``spoc ramp``)."""
        return spawn_rate(change, self.warmup_s, self.arrivals, self.spawn_rate)


def point_figures(window: Sequence[RequestSample], secs: float) -> dict[str, float | None]:
    """The figures of :data:`METRICS` over a window, as :func:`summarize_step` computes them."""
    out: dict[str, float | None] = {}
    for metric, stat in METRICS:
        key = metric_key(metric, stat)
        if stat:
            out[key] = point_value(window, metric, stat)
        elif metric == "request_rate":
            out[key] = len(window) / secs
        else:
            out[key] = sum(float(s.output_tokens or 0) for s in window if s.ok) / secs
    return out


def _virtual(
    p: Prediction, model: StepModel, seed: int, resample_answers: bool = False
) -> tuple[TwinEngine, VirtualServer]:
    """The twin's engine on ``model`` under ``p``'s virtual users (the engine's clock is the users'
    virtual time: the server takes it over). ``resample_answers``: the answers' lengths a
    bootstrap resample of those the twin learned (a draw's: a few dozen answers say their median
    within about 25 %, and E2E's interval carries that)."""
    lengths = p.twin.answer_lengths
    if resample_answers and lengths:
        pick = random.Random(seed * 31 + 7)
        lengths = tuple(pick.choice(lengths) for _ in lengths)
    eng = TwinEngine(p.twin, model, flags=p.flags, seed=seed, answer_lengths=lengths)
    eng.stats.unread()  # a prediction reads its requests and the engine's counters, never its /metrics
    # answers stop at EOS, as the profile's requests let the server, where the twin learned how
    # long they are (TwinEngine.sample_output_len); otherwise every one is as long as asked
    vs = VirtualServer(
        eng,
        p.workload,
        0,
        seed=seed,
        lockstep=p.arrivals == "lockstep",
        spread_s=0.0,
        ignore_eos=None if p.twin.answer_lengths else True,
        paced=True,
    )
    return eng, vs


def figures_of(run: Measured) -> dict[str, float | None]:
    """A step's figures of :data:`METRICS` (a draw's: its interval is the draws' spread)."""
    return point_figures(run.window, max(run.seconds, 1e-9))


def _draw_experiment(p: Prediction, seed: int, plan: UserPlan, windows: Sequence[float] | None = None) -> Experiment:
    """``p``'s experiment at the levels ``plan`` lists, step ``idx`` measured ``windows[idx - 1]``
    seconds (never on; a replay's length is the trace's), its figures without intervals, and no
    budget (the fit's run kept it)."""
    exp = p.experiment(seed)
    return replace(
        exp,
        plan=plan,
        rules=replace(exp.rules, budget_s=None),
        window_s=None if windows is None else lambda idx: windows[idx - 1],
        intervals=False,
        settle=False,
    )


def draw_ramp(p: Prediction, model: StepModel, seed: int, levels: Sequence[tuple[float, float]]) -> list[Measured]:
    """The ramp again on one draw of the fit (and on a resample of the answers' lengths), at the
    levels and lengths the fit's run chose: the driver over the draw's virtual users."""
    _eng, vs = _virtual(p, model, seed, resample_answers=True)
    plan: UserPlan = FixedRates([u for u, _ in levels]) if p.open_loop else FixedUsers([int(u) for u, _ in levels])
    exp = _draw_experiment(p, seed, plan, [secs for _, secs in levels])
    return run_now(Driver(exp, VirtualBackend(vs, spawn_rate=p.rate), knee_each_step=False).run())


def run_ramp(
    p: Prediction,
    model: StepModel,
    seed: int,
    progress: Callable[[str], None] | None = None,
) -> Ramped:
    """One predicted ramp on ``model``: the experiment driver's loop (``spoc ramp``'s own) over the
    twin's engine in virtual time, its levels as the plan chooses them."""
    _eng, vs = _virtual(p, model, seed)
    return _drive(p, VirtualBackend(vs, spawn_rate=p.rate), seed, progress)


@dataclass(frozen=True)
class Ramped:
    """A predicted ramp as the driver ran it: its steps, and the knee it inferred from them (once:
    the prediction takes it from here)."""

    runs: list[Measured]
    knee: Knee


def _drive(
    p: Prediction, backend: VirtualBackend | TraceBackend, seed: int, progress: Callable[[str], None] | None
) -> Ramped:
    def said(ev: RampProgress) -> None:
        if progress is not None and ev.phase == "step_done" and ev.steps:
            s = ev.steps[-1]
            progress(f"{s.level_text}: {s.requests} requests, {s.decision}")

    driver = Driver(p.experiment(seed), backend, on_progress=said, knee_each_step=False)
    runs = run_now(driver.run())
    busy, full, peaks = backend.busy, backend.saturated, backend.peaks
    out = []
    for r in runs:
        k = r.step.step
        out.append(replace(r, engine=EngineShare(busy.get(k, 0.0), full.get(k, 0.0), peaks.get(k))))
    return Ramped(out, driver.knee())


class DrawFigures(Mapping[int, Mapping[str, float | None]]):
    """A draw's figures at the levels it replayed, each worked out when first read (a headroom's
    draws near the knee: their figures are the steps' intervals, which a headroom never reads, and
    were a tenth of its CPU). Holds the replays' windows meanwhile: a few, near the knee."""

    def __init__(self, runs: Mapping[int, Measured]) -> None:
        self._runs = dict(runs)
        self._figures: dict[int, dict[str, float | None]] = {}

    def __getitem__(self, k: int) -> dict[str, float | None]:
        if k not in self._figures:
            self._figures[k] = figures_of(self._runs[k])
        return self._figures[k]

    def __iter__(self) -> Iterator[int]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)


@dataclass(frozen=True)
class Predicted:
    """The predicted ramp: the fit's steps and knee, and the intervals from the draws."""

    runs: list[Measured]
    knee: Knee
    draw_figures: list[Mapping[int, Mapping[str, float | None]]] = field(repr=False)
    """Per draw: the fit's step index -> the draw's figures at that level (every step, or a
    headroom's few near the knee: those worked out when read, :class:`DrawFigures`)."""
    draw_knees: list[float | None]
    draws: int
    notes: list[str]

    @cached_property
    def intervals(self) -> list[dict[str, Interval]]:
        """Per step: metric key -> prediction interval (the fit's own and its draws' figures).
        Worked out when read: a headroom reads the knee alone (a tenth of its CPU otherwise)."""
        per_draw = self.draw_figures
        out: list[dict[str, Interval]] = []
        for k, run in enumerate(self.runs):
            row: dict[str, Interval] = {}
            for metric, stat in METRICS:
                key = metric_key(metric, stat)
                vals = [d[k][key] for d in per_draw if k in d]
                own = figure_ci(run.step, metric, stat)
                v0 = figure(run.step, metric, stat)
                row[key] = _interval([v for v in [v0, *vals] if v is not None], own)
            out.append(row)
        return out

    @property
    def steps(self) -> list[StepSummary]:
        return [r.step for r in self.runs]

    def saturated(self, i: int) -> float:
        """Step ``i``'s share of polls with requests waiting or every seat taken."""
        engine = self.runs[i].engine
        return engine.saturated if engine is not None else 0.0

    def step_notes(self, i: int) -> str:
        u = self.saturated(i)
        if u >= SATURATED:
            return (
                f"near saturation (requests queued or every seat taken {100 * u:.0f} % of the window): a step a few "
                "percent slower or faster moves the queue a lot, so the interval is wide"
            )
        return ""


def _interval(values: Sequence[float], own: Interval) -> Interval:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return own
    lo, hi = float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))
    if own[0] is not None:
        lo = min(lo, own[0])
    if own[1] is not None:
        hi = max(hi, own[1])
    return (lo, hi)


def predict(p: Prediction, progress: Callable[[str], None] | None = None) -> Predicted:
    """The ramp on the fit, then on ``p.draws`` draws of it at the same levels."""
    say = progress or (lambda _m: None)
    ramp = run_trace_ramp if p.trace is not None else run_ramp
    draw = draw_replays if p.trace is not None else draw_ramp
    ramped = ramp(p, p.twin.fit, p.seed, progress=lambda m: say(f"fit: {m}"))
    central = ramped.runs
    if not central:
        from spoc_tui.twin.model import TwinError

        raise TwinError("no step fits the budget: lengthen --budget or shorten --step-seconds")
    unit = central[0].step.unit
    levels = [(r.step.level, r.seconds) for r in central]
    knee = ramped.knee  # the driver's, inferred across the fit's steps once
    inf = knee.inferred
    crossing = inf if inf is not None and inf.boundary != "bound" else None
    near_knee = p.draws_near_knee and p.trace is not None
    # a headroom's knee beyond the levels (or none): its interval is the fit's own, no draw's
    draws = [] if near_knee and crossing is None else list(p.twin.draws[: max(0, p.draws)])
    draw_figures: list[Mapping[int, Mapping[str, float | None]]] = []
    knees: list[float | None] = []
    trend: Trend | None = None  # the fit's, laid out once for every draw read at its knee
    for i, m in enumerate(draws):
        say(f"draw {i + 1}/{len(draws)} of the fit")
        if near_knee and crossing is not None:
            if trend is None:
                trend = level_trend([(r.step.level, r.window) for r in central], p.limits)
            runs, est = draw_at_knee(p, m, p.seed + 1000 * (i + 1), central, crossing, p.seed + i + 1, trend)
        else:
            runs = dict(enumerate(draw(p, m, p.seed + 1000 * (i + 1), levels)))
            # the draw's knee: its fit's crossing (no resampling: the draws' spread is the interval)
            est = draw_knee(runs, p.limits, unit, p.seed + i + 1)
        draw_figures.append(DrawFigures(runs) if near_knee else {k: figures_of(r) for k, r in runs.items()})
        knees.append(est.estimate if est is not None and est.boundary != "bound" else None)
    notes: list[str] = []
    if p.trace is None:  # a trace's rows carry their answers' lengths
        eos = "as long as asked (the profile sets ignore_eos)" if p.workload.ignore_eos else p.twin.answer_text()
        notes.append(f"answers: {eos}")
    if inf is not None and inf.boundary != "bound" and inf.estimate is not None:
        ests = [k for k in knees if k is not None]
        lo, hi = inf.ci95
        if ests:
            dlo, dhi = draws_interval(ests)
            lo = min(dlo, lo if lo is not None else math.inf)
            hi = max(dhi, hi if hi is not None else -math.inf)
        held = holding(inf.estimate, (lo, hi))
        if held != (lo, hi):
            lo, hi = held
            notes.append(WIDENED)
        bounded = sum(1 for k in knees if k is None)
        if bounded:
            notes.append(f"{bounded} of {len(knees)} draws put the knee beyond the levels run")
        knee = replace(knee, inferred=replace(inf, ci95=(lo, hi)))
    return Predicted(central, knee, draw_figures, knees, len(draws), notes)


FEW_DRAWS = 20
"""Under this many draws, their knees' 95 % range is a Student-t prediction interval, not their
percentiles."""


def draws_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95 % range of the knee over the fit's draws. With many draws, their 2.5 and 97.5
    percentiles. With few, those percentiles are about the extremes, and the extremes of n draws
    hold a further one only (n - 1) / (n + 1) of the time (3 times in 5 for the headroom's four):
    a prediction interval instead, their mean +- t(n - 1) x sd x sqrt(1 + 1 / n), which holds a
    further draw 95 % of the time where the knees spread about normally: on their logarithms, as a
    knee is a multiple (a speed, a count) that is as likely half as twice (a draw whose step time
    is 10 % slower puts it so many per cent lower), and the interval then never reaches 0.

    Taken on the knees themselves it did: four draws that spread wide put the lower end at a clamp
    at 0, not a knee (two users' runs read "x6.0 (95 %: 0-11.3)" and "x5.3 (95 %: 0-13)")."""
    vals = [float(v) for v in values]
    if len(vals) >= FEW_DRAWS or len(vals) < 2:
        return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))
    n = len(vals)
    t = t_quantile(n - 1)
    if min(vals) > 0:
        logs = [math.log(v) for v in vals]
        mean, sd = statistics.fmean(logs), statistics.stdev(logs)
        half = t * sd * math.sqrt(1 + 1 / n)
        return math.exp(mean - half), math.exp(mean + half)
    mean, sd = statistics.fmean(vals), statistics.stdev(vals)
    half = t * sd * math.sqrt(1 + 1 / n)
    return max(0.0, mean - half), mean + half


WIDENED = "the fit's draws put the knee apart from the fit's own: the interval is widened to hold both"


def holding(estimate: float, ci: tuple[float | None, float | None]) -> tuple[float | None, float | None]:
    """``ci`` widened to hold ``estimate``. The knee's interval comes from the fit's bootstrap
    draws, its point from the fit: where the draws disagree with it (a term the data barely
    identify, one way in most draws and the other in the fit) the point fell outside its own
    interval (a headroom printed "x8.7 (95 %: 3.6-6.9)"); a reader takes the interval as where the
    knee can be, so it holds both."""
    lo, hi = ci
    return (min(lo, estimate) if lo is not None else None, max(hi, estimate) if hi is not None else None)


def knee_of(est: KneeEstimate | None) -> float | None:
    return est.estimate if est is not None else None


@dataclass(frozen=True)
class AtLevels:
    """The twin's figures at given levels (another ramp's): the fit's, and each one's interval."""

    levels: list[tuple[float, float]]
    figures: list[dict[str, float | None]]
    intervals: list[dict[str, Interval]]
    draws: int


def predict_at(
    p: Prediction, levels: Sequence[tuple[float, float]], progress: Callable[[str], None] | None = None
) -> AtLevels:
    """The ramp at ``levels`` ((users or rate, measured seconds) per step), on the fit and its draws."""
    say = progress or (lambda _m: None)
    draw = draw_replays if p.trace is not None else draw_ramp
    say("the fit")
    central = [figures_of(r) for r in draw(p, p.twin.fit, p.seed, levels)]
    draws = list(p.twin.draws[: max(0, p.draws)])
    per_draw: list[list[dict[str, float | None]]] = []
    for i, m in enumerate(draws):
        say(f"draw {i + 1}/{len(draws)} of the fit")
        per_draw.append([figures_of(r) for r in draw(p, m, p.seed + 1000 * (i + 1), levels)])
    intervals: list[dict[str, Interval]] = []
    for k, figures in enumerate(central):
        row: dict[str, Interval] = {}
        for key, v0 in figures.items():
            vals = [v for d in per_draw if (v := d[k].get(key)) is not None]
            row[key] = _interval([v for v in [v0, *vals] if v is not None], (None, None))
        intervals.append(row)
    return AtLevels(list(levels), central, intervals, len(draws))


# -- a trace replay ------------------------------------------------------------------------------


POLL_S = 1.0
"""How often a predicted replay notes the engine's queue (a ramp polls /metrics about so)."""


@dataclass(frozen=True)
class TraceRows:
    """A trace's rows as ``spoc ramp --trace`` sends them (read once): the window's rows less
    those longer than the server's max-model-len, and what the reading found."""

    rows: tuple[TraceRow, ...]
    read: int
    """Rows in the window (sent or skipped)."""
    skipped: dict[str, int]
    span_s: float
    """From the first row's timestamp to the last's: a step at speed s sends for span / s."""
    prefix_share: float | None
    """The share of input tokens in blocks an earlier row had (what a perfect cache would hit)."""
    think_scaled: bool = False
    """``--trace-think scaled``: a turn's wait after the answer it follows divided by the speed."""

    def step_s(self, speed: float) -> float:
        return self.span_s / speed

    def at(self, speed: float) -> tuple[TraceRow, ...]:
        """The rows a replay at ``speed`` sends (a file's: the same at every speed, their waits
        after the answers they follow scaled with it under ``--trace-think scaled``; a synthetic
        traffic's may draw as many as the step needs)."""
        if not self.think_scaled or speed == 1.0:
            return self.rows
        return tuple(replace(r, think_s=r.think_s / speed) if r.think_s else r for r in self.rows)

    def redrawn(self, seed: int) -> TraceRows:
        """The rows a draw of the fit replays: a file's are the file's; a synthetic traffic's are
        drawn again with ``seed`` (its sampling is then in the draws' interval too)."""
        return self


def read_rows(source: TraceSource, max_model_len: int) -> TraceRows:
    """The replay's rows, read as the load generator reads them (:class:`ReplayShare`).

    Raises:
        TwinError: (exit code 2) the trace's error, naming the line; a window with no row to send.
    """
    share = ReplayShare(source, (0, 1), max_model_len)
    try:
        rows = tuple(share)
    except TraceError as e:
        raise TwinError(f"--trace: {e}") from None
    if not rows:
        why = f" ({', '.join(f'{c} {k}' for k, c in share.skipped.items())})" if share.skipped else ""
        raise TwinError(f"--trace {source.path}: no row to send in the window{why}")
    ts = [r.t for r in rows]
    return TraceRows(
        rows,
        share.rows,
        dict(share.skipped),
        max(ts) - min(ts),
        round(share.prefix_tokens / share.prefix_input, 4) if share.prefix_input else None,
        source.think_scaled,
    )


class TraceBackend:
    """The driver's backend for a predicted trace replay: each step the trace at its speed on a
    fresh twin (each step of ``spoc ramp --trace`` sends text of its own, so no step finds an
    earlier one's prefixes cached), played in virtual time as the driver holds it. Each step's
    requests and polls are on its own clock from 0; the driver's clock runs on across the steps."""

    generators = 1

    def __init__(self, p: Prediction, model: StepModel, seed: int, seed_of: Callable[[int], int] | None = None) -> None:
        """``seed_of``: step ``idx``'s replay's seed (``seed + idx - 1`` where not given)."""
        assert p.trace is not None
        self.p, self.model = p, model
        self.seed_of = seed_of or (lambda idx: seed + idx - 1)
        self.sim: FleetSim | None = None
        self.clock = 0.0
        self.offset = 0.0
        """Where the step's own clock began, on the driver's."""
        self._speed = 1.0
        self._answered = 0
        self.busy: dict[int, float] = {}
        """Per step: the share of its replay the engine was stepping."""
        self.saturated: dict[int, float] = {}
        """Per step: the share of its polls with requests waiting or every seat taken."""
        self.peaks: dict[int, int] = {}
        """Per step: the most requests the engine ran at once."""
        self._polled = PollStats()
        """The replay's polls read so far."""
        self._ends = (0, 0.0)
        """The replay's samples read so far, and the latest end among them."""

    def _sim(self) -> FleetSim:
        if self.sim is None:
            raise RuntimeError("a trace replay's backend holds no level but a replay's")
        return self.sim

    def now(self) -> float:
        return self.clock

    def samples(self) -> int:
        return self._answered + (len(self.sim.samples) if self.sim is not None else 0)

    async def start_replay(self, idx: int, speed: float) -> float:
        tr = self.p.trace
        assert tr is not None
        if self.sim is not None:
            self._answered += len(self.sim.samples)
        self.offset, self._speed = self.clock, speed
        self._polled, self._ends = PollStats(), (0, 0.0)
        p = self.p
        self.sim = FleetSim(
            p.twin, tr.at(speed), speed, replicas=1, model=self.model, seed=self.seed_of(idx), flags=p.flags,
            poll_s=POLL_S, step=idx,
        )  # fmt: skip
        self.sim.start()
        return 0.0

    def replayed(self, idx: int) -> ReplaySent:
        sim, tr = self._sim(), self.p.trace
        assert tr is not None
        skipped = dict(tr.skipped)
        if sim.stalled:
            skipped["never scheduled (nothing left could run them)"] = sim.stalled
        if too_long := sim.skipped - sim.too_big - sim.stalled:
            skipped["longer than max-model-len"] = skipped.get("longer than max-model-len", 0) + too_long
        if sim.too_big:
            skipped["longer than the whole KV cache"] = skipped.get("longer than the whole KV cache", 0) + sim.too_big
        return ReplaySent(tr.read, len(sim.samples), skipped, len(tr.rows), tr.prefix_share, sim.done, exact=True)

    async def advance(self, until: float) -> None:
        self._sim().run_until(until - self.offset)
        self.clock = max(self.clock, until)

    async def set_level(self, idx: int, level: float, prev: float, open_loop: bool) -> str:
        raise RuntimeError("a trace replay's steps are replays (start_replay), not levels")

    async def drain(self, most_s: float, say: Callable[[str], None]) -> float:
        return self.clock

    async def begin_window(self) -> None:
        pass

    def _secs(self) -> float:
        """The replay's length: its rows' span over the speed, or to its last answer if later."""
        tr = self.p.trace
        assert tr is not None
        samples, (read, last) = self._sim().samples, self._ends
        ends = [s.end for s in samples[read:] if s.end is not None]  # those since the last call
        self._ends = (len(samples), max(last, *ends) if ends else last)
        return max(tr.step_s(self._speed), self._ends[1], 1e-3)

    async def poll(self) -> ServerWindow:
        """The engine's figures over every poll of the replay so far, as /metrics would show them."""
        sim = self._sim()
        zero = dict.fromkeys(("preemptions", "generation", "prefix_queries", "prefix_hits", "busy"), 0.0)
        stats = self._polled
        for _, w, r, k in sim.polls[stats.n :]:
            stats.add(w, r, k)
        return stats.window(zero, counters(sim.replicas[0].engine), self._secs())

    def window(self, idx: int, start: float, end: float, sent_from: float) -> list[RequestSample]:
        """Every request of the replay (its whole is the measurement); the engine's share of it
        busy, its polls saturated and its most running noted for the step."""
        sim = self._sim()
        eng, secs = sim.replicas[0].engine, self._secs()
        polls = sim.polls
        seats = eng.cfg.max_num_seqs
        self.busy[idx] = min(1.0, eng.busy_s / secs)
        self.saturated[idx] = sum(1 for _, w, r, _ in polls if w > 0 or r >= seats) / len(polls) if polls else 0.0
        self.peaks[idx] = eng.running_peak
        assert sim.step == idx, (sim.step, idx)
        return list(sim.samples)  # of step ``idx`` already (FleetSim's ``step``)

    def client(self, start: float, end: float, limits: Sequence[Limit]) -> ClientHealth:
        return ClientHealth()

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        return await immediately(fn, *args)

    async def stop(self) -> None:
        pass


def run_trace_ramp(
    p: Prediction,
    model: StepModel,
    seed: int,
    progress: Callable[[str], None] | None = None,
) -> Ramped:
    """The replay steps on ``model``, their speeds as the plan chooses them (the speed search from
    the knee inferred so far), within the budget as ``spoc ramp --trace`` keeps it: the driver's
    loop, each step a replay on a fresh twin."""
    assert p.trace is not None
    if not isinstance(p.plan, (FixedSpeeds, SpeedSearch)):
        raise TwinError("a trace replay steps in speed multiples: give --speed (e.g. 0.5,1,2 or auto)")
    return _drive(p, TraceBackend(p, model, seed), seed, progress)


def draw_replays(
    p: Prediction, model: StepModel, seed: int, levels: Sequence[tuple[float, float]], only: Sequence[int] | None = None
) -> list[Measured]:
    """The replay again on one draw of the fit, at the speeds the fit's run chose (``only``: at
    those of them; a synthetic traffic's rows drawn again for the draw: :meth:`TraceRows.redrawn`):
    the driver over the draw's replays. The k-th level's replay is the same whichever others run
    beside it (its seed is the level's)."""
    assert p.trace is not None
    chosen = list(range(len(levels))) if only is None else list(only)
    drawn = replace(p, trace=p.trace.redrawn(seed))
    exp = _draw_experiment(drawn, seed, FixedSpeeds([levels[k][0] for k in chosen]))
    backend = TraceBackend(drawn, model, seed, seed_of=lambda idx: seed + chosen[idx - 1])
    return run_now(Driver(exp, backend, knee_each_step=False).run())


def draw_knee(runs: Mapping[int, Measured], limits: Sequence[Limit], unit: LevelUnit, seed: int) -> KneeEstimate | None:
    """A draw's knee: its fit's crossing over the levels it ran (no resampling: the draws'
    spread is the interval)."""
    levels = [(r.step.level, r.window) for _, r in sorted(runs.items())]
    return infer_knee(levels, limits, unit, replicates=0, seed=seed)


NEAR_BELOW, NEAR_ABOVE = 2, 1
"""A draw near the fit's knee first replays this many of the fit's levels below it and above it:
two below, as a cliff is told from the trend of the two levels under its jump
(:func:`~spoc_tui.core.ramp.inference.infer_knee`); with one, a draw's cliff at x5.7 read as a
crossing at x7.5."""


def draw_at_knee(
    p: Prediction,
    model: StepModel,
    seed: int,
    central: Sequence[Measured],
    knee: KneeEstimate,
    infer_seed: int,
    trend: Trend,
) -> tuple[dict[int, Measured], KneeEstimate | None]:
    """One draw's knee from one replay at the fit's knee, where the fit's is a crossing between two
    of its levels: the fit's ``trend`` across its levels moved to the draw's own figures there
    (:func:`~spoc_tui.core.ramp.inference.shifted_knee`). Where that cannot say (a cliff; a draw
    whose moved trend crosses below the fit's slowest level or past its fastest, or that breaks
    a limit the fit's trend does not rise through), the draw's levels about the knee as
    :func:`draw_near_knee` replays them, this replay one of them."""
    levels = [(r.step.level, r.seconds) for r in central]
    unit = central[0].step.unit
    est = knee.estimate
    assert est is not None
    speeds = [lv for lv, _ in levels]
    if knee.boundary != "smooth" or not min(speeds) < est < max(speeds):
        return draw_near_knee(p, model, seed, levels, est, unit, infer_seed, cliff=knee.boundary == "cliff")
    at = len(levels)
    grown = [*levels, (est, levels[0][1])]
    run = draw_replays(p, model, seed, grown, [at])[0]
    got = shifted_knee(trend, (est, run.window), p.limits)
    if got is None:
        return draw_near_knee(p, model, seed, grown, est, unit, infer_seed, {at: run})
    return {at: run}, KneeEstimate(got[0], (None, None), got[1], "smooth", unit, levels=1)


def _same_cliff(below: Measured, above: Measured, limits: Sequence[Limit]) -> str | None:
    """The limit a draw breaks at ``above`` having met every limit at ``below`` (its cliff lies
    between them: the one it breaks furthest), or None where it does not so."""
    if not all((m := level_margin(below.window, lim)) is not None and m <= 0 for lim in limits):
        return None
    broken = max(((m, lim.key) for lim in limits if (m := level_margin(above.window, lim)) is not None), default=None)
    return broken[1] if broken is not None and broken[0] > 0 else None


def draw_near_knee(
    p: Prediction,
    model: StepModel,
    seed: int,
    levels: Sequence[tuple[float, float]],
    knee: float,
    unit: LevelUnit,
    infer_seed: int,
    have: Mapping[int, Measured] | None = None,
    *,
    cliff: bool = False,
) -> tuple[dict[int, Measured], KneeEstimate | None]:
    """One draw replayed at the fit's levels nearest its knee (:data:`NEAR_BELOW` below it,
    :data:`NEAR_ABOVE` above), then one level further out at a time on the side a draw's knee lies
    past (every level met its limits: above; every level broke one: below), until it crosses
    inside or no level is left: each replay is the one the whole run makes at that level, and a
    crossing's fit reads the levels about it, so the draw's knee is the whole run's for a fraction
    of the replays. ``cliff``: the fit's knee is a cliff (a jump the trend does not explain): the
    draw replays the fit's bracket first, and where it meets every limit at the lower speed and
    breaks one at the upper, its cliff is that bracket's and its knee the lower end, as the fit's
    (two replays where three); otherwise it goes on as above."""
    order = sorted(range(len(levels)), key=lambda k: levels[k][0])
    below = [k for k in order if levels[k][0] <= knee]
    above = [k for k in order if levels[k][0] > knee]
    runs = dict(have or {})
    if cliff and below and above:  # the fit's bracket first: the same cliff is the fit's point
        lo, hi = below[-1], above[0]
        runs.update(zip((lo, hi), draw_replays(p, model, seed, levels, [lo, hi]), strict=True))
        binds = _same_cliff(runs[lo], runs[hi], p.limits)
        if binds is not None:
            return runs, KneeEstimate(levels[lo][0], (None, None), binds, "cliff", unit, levels=2)
    chosen = below[-NEAR_BELOW:] + above[:NEAR_ABOVE]
    below, above = below[:-NEAR_BELOW] if len(below) > NEAR_BELOW else [], above[NEAR_ABOVE:]
    todo = [k for k in chosen if k not in runs]
    runs.update(zip(todo, draw_replays(p, model, seed, levels, todo), strict=True))
    while True:
        est = draw_knee(runs, p.limits, unit, infer_seed)
        if est is None or est.boundary != "bound":
            return runs, est
        side = above if est.estimate is not None else below  # all met: further up; all broke: down
        if not side:
            return runs, est
        k = side.pop(0) if side is above else side.pop()
        runs[k] = draw_replays(p, model, seed, levels, [k])[0]
