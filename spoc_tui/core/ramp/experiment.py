"""One experiment, written once: hold a load level, measure it, judge it against the SLA, choose
the next level, infer the knee.

:class:`Driver` owns the plan loop and every rule of it (warm-up, the load budget, draining after
a step down, measuring an undecided step on, ending a knee search's step once its next level is
plain, the queue rule, the early stops, the knee inferred across steps, progress, stop reasons,
the status, the result file). It runs over a :class:`Backend`, which only holds load and reads
what it did:

- the **live** one (:class:`spoc_tui.load.ramp.LiveBackend`): the Locust load generator in a
  child process and the server's /metrics, on the wall clock (``spoc ramp``, the Load screen, a
  study's measured trials);
- the **virtual** one (:class:`spoc_tui.sim.backend.VirtualBackend`): the simulator's engine or
  the twin's under virtual users, in virtual time (``spoc twin predict``, a study's trials on the
  simulator or the twin, ``benchmarks/knee_search.py``).

So a measured ramp and a predicted one differ by the backend only. The driver is a coroutine;
over the virtual backend nothing in it ever waits, and :func:`run_now` runs it to its end
without an event loop (deterministic for a seed, seconds for a whole ramp).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

from spoc_tui.core.errors import EXIT_USAGE, SpocError
from spoc_tui.core.ramp.inference import Columns, KneeEstimate, infer_knee
from spoc_tui.core.ramp.knee import (
    Knee,
    KneeSearch,
    Listed,
    UserPlan,
    find_knee,
    measure_on,
    settle_due,
)
from spoc_tui.core.ramp.rules import StepRules, budget
from spoc_tui.core.ramp.sla import MOST_STEP_S, LevelUnit, Limit, level_text
from spoc_tui.core.ramp.status import RampEnd, RampStatus
from spoc_tui.core.ramp.steps import (
    QUEUE_MIN_POINTS,
    ClientHealth,
    EarlyStop,
    ReplaySent,
    RequestSample,
    ServerWindow,
    StepShadow,
    StepSummary,
    badly_broken,
    server_failed,
    summarize_step,
    trace_fidelity,
    unbounded_of,
)

T = TypeVar("T")
logger = logging.getLogger(__name__)

RampPhase = Literal["preflight", "starting", "warmup", "measuring", "extending", "step_done", "done"]

EARLY_CHECK_S = 5.0
"""A study's early stop is asked this often during a step's window, from a third of it on."""
EARLY_MIN_REQUESTS = 10
"""...and only once the window holds this many requests."""
TICK_S = 1.0
"""The longest the driver holds load without looking (progress, the settle and early-stop checks,
a dead load generator)."""
REPLAY_TICK_S = 0.5
"""...and during a replay step, which ends when its last request does."""


def poll_every(poll_s: float, window_s: float) -> float:
    """Seconds between two readings of the server over a window ``window_s`` long: about ten
    readings per window (the queue-growth rule needs eight), at most ``poll_s`` apart and never more
    than one a second."""
    return min(poll_s, max(1.0, window_s / 10))


class QueueWatch:
    """A window's queue readings: their mean, and whether the queue grows without bound
    (:func:`~spoc_tui.core.ramp.steps.queue_unbounded`; once it does, it stays so)."""

    def __init__(self) -> None:
        self.unbounded: str | None = None
        self._ts: list[float] = []
        self._ws: list[float] = []
        self._sum = 0.0
        self._rises = self._falls = 0
        """Kept as the readings come (a predicted step reads each virtual second: walking every
        reading at each made a ten-speed prediction of a long trace quadratic)."""

    @property
    def mean(self) -> float | None:
        return round(self._sum / len(self._ws), 2) if self._ws else None

    def see(self, t: float, server: ServerWindow) -> ServerWindow:
        """A reading ``t`` seconds into the window: ``server`` with the mean over every reading so far."""
        w = server.waiting
        if w is not None:
            if self._ws:
                last = self._ws[-1]
                self._rises += w > last
                self._falls += w < last
            self._ts.append(t)
            self._ws.append(w)
            self._sum += w
            if self.unbounded is None and len(self._ws) >= QUEUE_MIN_POINTS:
                self.unbounded = unbounded_of(self._ts, self._ws, self._rises, self._falls)
        return replace(server, waiting_mean=self.mean)


class ExperimentError(SpocError):
    """An experiment that cannot go on (the budget cannot hold a replay, the server failed)."""


@dataclass(frozen=True)
class Experiment:
    """What to run: the plan, the SLA and the step rules, resolved (its makers apply the defaults:
    :class:`~spoc_tui.load.ramp.RampConfig` and :class:`~spoc_tui.twin.predict.Prediction`)."""

    plan: UserPlan
    limits: tuple[Limit, ...]
    unit: LevelUnit
    rules: StepRules = field(default_factory=StepRules)
    """How the steps run (its step, warm-up, longest step, budget, pacing and seed)."""
    abort_factor: float = math.inf
    """A listed ramp stops once a step breaks a limit this many times over (:func:`badly_broken`)."""
    poll_s: float = 5.0
    """The longest between two readings of the server's figures during a window (``--poll-seconds``);
    a window shorter than 10 x this is read every tenth of it, at most once a second."""
    early_stop: Callable[[StepSummary], str | None] | None = field(default=None, repr=False, compare=False)
    """A study's: asked during a step's window with the window so far; a reason ends the step there."""
    replay_s: Callable[[float], float] | None = field(default=None, repr=False, compare=False)
    """A trace replay: a step's length at a speed (its steps are replays, not held levels)."""
    window_s: Callable[[int], float] | None = field(default=None, repr=False, compare=False)
    """Step ``idx``'s measured window, given (a prediction's draw: as long as the fit measured that
    step), never measured on; None: the rules' step less its warm-up, measured on while
    inconclusive."""
    intervals: bool = True
    """Each step's figures with their intervals; False: the figures alone (a draw, whose interval is
    the draws' spread: no resampling)."""
    replay_grace_s: float = math.inf
    """How long past its length a replay step may wait for its last requests to end before it
    ends without them (the live load generator's request timeout and some; a virtual replay always
    ends)."""
    settle: bool = True
    """A knee search's step ends once its next level is plain (:meth:`KneeSearch.settled`);
    False: every step runs its window (the knee benchmark's ``--no-settle``)."""
    error: type[SpocError] = ExperimentError
    """What the driver raises (its callers' own error type, so their messages and exit codes stay)."""
    shadow: Callable[[Sequence[StepSummary]], StepShadow | None] | None = field(default=None, repr=False, compare=False)
    """A twin's (``spoc ramp --twin``): given the steps measured so far, its prediction of the last,
    kept on that step (off the event loop, at the lowest CPU priority: the load generator's host
    is not slowed by it); one that fails leaves the step without it, never the ramp."""

    @property
    def step_s(self) -> float:
        return self.rules.step_s

    @property
    def warmup_s(self) -> float:
        return self.rules.warmup_s

    @property
    def step_limit_s(self) -> float:
        """A step still inconclusive at ``step_s`` is measured on up to this long."""
        return self.rules.step_limit_s

    @property
    def budget_s(self) -> float | None:
        """The most seconds of load (drains, warm-ups and extensions included); None: no budget."""
        return budget(self.plan, self.rules.budget_s)

    @property
    def seed(self) -> int:
        return self.rules.seed

    @property
    def open_loop(self) -> bool:
        return self.unit != "users"

    def budget_spent(self, knee: Knee | None) -> str:
        """Why a ramp stopped at its budget, with the interval it reached."""
        reached = knee.inferred.text if knee is not None and knee.inferred is not None else "no knee yet"
        return f"the budget ({(self.budget_s or 0) / 60:g} min of load) is spent; the knee so far: {reached}"


class ExperimentRequest(Protocol):
    """What a ramp's request says of its steps (:class:`~spoc_tui.load.ramp.RampConfig`,
    :class:`~spoc_tui.twin.predict.Prediction`), its defaults applied."""

    @property
    def plan(self) -> UserPlan: ...
    @property
    def limits(self) -> tuple[Limit, ...]: ...
    @property
    def unit(self) -> LevelUnit: ...
    def rules(self) -> StepRules: ...


def experiment_of(req: ExperimentRequest, seed: int | None = None, **rest: Any) -> Experiment:
    """The experiment ``req`` asks for (``seed``: another than its rules'); ``rest``: what only its
    maker knows (the error class, a replay's step lengths...)."""
    rules = req.rules() if seed is None else replace(req.rules(), seed=seed)
    return Experiment(plan=req.plan, limits=req.limits, unit=req.unit, rules=rules, **rest)


@dataclass(frozen=True, slots=True)
class RampProgress:
    phase: RampPhase
    step: int
    users: float
    """The step's level: users, or the arrival rate (req/s) of an open-loop ramp (``rate`` set)."""
    elapsed_s: float
    step_s: float
    samples: int
    steps: tuple[StepSummary, ...]
    knee: Knee | None
    message: str = ""
    open_loop: bool = False
    budget_left_s: float | None = None
    """Seconds of load left in the ramp's budget (None without one)."""
    unit: LevelUnit | None = None
    """What the steps' levels are (None: users, or req/s when ``open_loop``)."""

    @property
    def level_text(self) -> str:
        return level_text(self.users, self.unit or ("req/s" if self.open_loop else "users"))

    @property
    def badge(self) -> str:
        """The ramp in a few words for other screens' status lines: ``step 3 · 16 users ·
        knee so far 21.5 users (95 %: 19.9-23.1) · 6.2 min left``."""
        parts: list[str] = [f"step {self.step}", self.level_text] if self.step else [str(self.phase)]
        if self.knee is not None and self.knee.inferred is not None:
            parts.append(f"knee so far {self.knee.inferred.short}")
        if self.budget_left_s is not None:
            parts.append(f"{self.budget_left_s / 60:.1f} min left")
        return " · ".join(parts)

    @classmethod
    def before_load(cls, exp: Experiment, elapsed_s: float, message: str = "") -> RampProgress:
        """What a driver reports while its experiment gets ready (the preflight, a trace's scan):
        no step yet, the whole budget left."""
        return cls(
            "preflight", 0, 0, elapsed_s, exp.step_s, 0, (), None, message, exp.open_loop, exp.budget_s, exp.unit
        )


class Backend(Protocol):
    """Where the load is held: the driver's only way to the server (live or virtual)."""

    generators: int
    """The load generator's users of an open-loop step (one per process)."""

    def now(self) -> float:
        """The backend's clock, in seconds (the wall clock, or virtual time)."""
        ...

    def samples(self) -> int:
        """Requests answered so far (for progress)."""
        ...

    async def advance(self, until: float) -> None:
        """Hold the load until ``until`` on :meth:`now`'s clock. Raises the experiment's error when
        the load generator is gone."""
        ...

    async def set_level(self, idx: int, level: float, prev: float, open_loop: bool) -> str:
        """Start step ``idx`` at ``level`` (users, spawned from ``prev``, or a rate): what to say of it."""
        ...

    async def drain(self, most_s: float, say: Callable[[str], None]) -> float:
        """After a step down: wait (at most ``most_s``) for the requests the earlier levels sent to
        end; the time it ended (the step counts only what is sent from then)."""
        ...

    async def begin_window(self) -> None:
        """A step's measured window starts now (the server's own figures count from here)."""
        ...

    async def poll(self) -> ServerWindow:
        """The server's view of the window so far (its peaks over every poll of the window)."""
        ...

    def window(self, idx: int, start: float, end: float, sent_from: float) -> list[RequestSample]:
        """Step ``idx``'s requests that ended in [start, end], of those sent from ``sent_from``."""
        ...

    def client(self, start: float, end: float, limits: Sequence[Limit]) -> ClientHealth:
        """How the load generator fared over [start, end]."""
        ...

    async def start_replay(self, idx: int, speed: float) -> float:
        """Start step ``idx``: the trace sent at ``speed``, every row at its time over the speed.
        Returns when its first row is due, on the clock of the step's requests (their ``start``)."""
        ...

    def replayed(self, idx: int) -> ReplaySent:
        """What the load generator says of step ``idx``'s replay so far (``complete`` once every
        row is sent and every request it sent has ended)."""
        ...

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a slow pure computation (the knee's inference) without freezing a live screen."""
        ...

    async def stop(self) -> None:
        """Stop the load and release what the backend holds."""
        ...


class Sink(Protocol):
    """The result file (``ramp.json``): rewritten after each step, once more at the end."""

    write_error: str

    def stopped(self, reason: str) -> None:
        """The ramp ended, for ``reason`` ("" where it ran its plan out): said in the file from now."""

    def write(self, steps: list[StepSummary], knee: Knee, status: RampStatus) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineShare:
    """A simulated engine's own view of a step (a predicted one's), which /metrics cannot give."""

    busy: float
    """Share of the window the engine was stepping."""
    saturated: float
    """Share of the window's polls with requests waiting or every seat taken."""
    running_peak: int | None = None
    """The most requests the engine ran at once (seats at or above it would not have changed
    the step)."""


@dataclass(frozen=True)
class Measured:
    """A step as it was measured, with its requests (the knee's inference resamples them): the
    one record of a step and its requests, measured or predicted."""

    step: StepSummary
    window: list[RequestSample]
    seconds: float
    """Seconds of its measured window (a replay: its whole length)."""
    engine: EngineShare | None = None
    """A predicted step's engine (None where measured)."""


@dataclass(slots=True)
class _Step:
    """A held level's state across the driver's ticks (:meth:`Driver._step`)."""

    idx: int
    level: float
    users: int
    """The users the step holds (an open loop's: its generators)."""
    sent_from: float
    """Requests sent from this moment are the step's (after a step down: once the last level's drained)."""
    drained_s: float
    m_start: float
    """When the measured window began."""
    planned: float
    """The window's planned length (the step less its warm-up)."""
    limit: float
    """The longest the window may grow to (the longest step, the budget)."""
    target: float
    """The window's length so far asked: the planned one, then more while inconclusive."""
    next_check: float
    """When the study's early stop is next asked (seconds into the window)."""
    every: float
    """Seconds between polls of the server."""
    polled: float
    phase: RampPhase = "measuring"
    server: ServerWindow = field(default_factory=ServerWindow)
    queue: QueueWatch = field(default_factory=QueueWatch)
    asked: int = 0
    """How often the knee search was asked whether the step settled."""
    settled: EarlyStop | None = None


class Driver:
    """The plan loop over a backend. Use :meth:`run` once; its state (steps, status, stop reason,
    knee) is readable at any time, also after an interruption."""

    def __init__(
        self,
        exp: Experiment,
        backend: Backend,
        sink: Sink | None = None,
        on_progress: Callable[[RampProgress], None] | None = None,
        knee_each_step: bool = True,
        t0: float | None = None,
    ) -> None:
        """
        Args:
            knee_each_step: infer the knee after every step (for progress and the result file);
                False: only where the plan chooses levels from it (a prediction's listed levels).
            t0: when the experiment began on the backend's clock (its progress's elapsed time
                counts from it; None: now). A live ramp's preflight comes before its driver.
        """
        self.exp = exp
        self.backend = backend
        self.sink = sink
        self.on_progress = on_progress
        self._knee_each_step = knee_each_step or not isinstance(exp.plan, Listed)
        """Infer the knee after every step: asked, or the plan chooses its levels from it."""
        self.runs: list[Measured] = []
        self.status: RampEnd = "interrupted"
        self.stop_reason = ""
        self._knees: dict[int, Knee] = {}
        self._columns = Columns()
        """The steps' requests as the inference lays them out, once each (:meth:`_inferred`)."""
        self._t0 = backend.now() if t0 is None else t0
        self._load_started: float | None = None

    # -- state ----------------------------------------------------------------------------------

    @property
    def steps(self) -> list[StepSummary]:
        return [r.step for r in self.runs]

    def _levels(self, runs: Sequence[Measured]) -> list[tuple[float, list[RequestSample]]]:
        return [(r.step.level, r.window) for r in runs]

    def _inferred(self, runs: Sequence[Measured]) -> KneeEstimate | None:
        return infer_knee(self._levels(runs), self.exp.limits, self.exp.unit, seed=self.exp.seed, columns=self._columns)

    def knee(self) -> Knee:
        """The knee from the steps' decisions, inferred across every step's requests so far."""
        n = len(self.runs)
        if n not in self._knees:
            self._knees[n] = find_knee(self.steps, self._inferred(self.runs))
        return self._knees[n]

    async def _infer(self) -> None:
        """:meth:`knee` computed off the event loop (it resamples every step's requests)."""
        n = len(self.runs)
        if n not in self._knees:
            self._knees[n] = find_knee(self.steps, await self.backend.offload(self._inferred, list(self.runs)))

    def _plan_knee(self) -> Knee | None:
        """The knee the plan chooses its next level from (None before any step)."""
        return self.knee() if self.runs and self._knee_each_step else None

    def budget_left(self) -> float | None:
        b = self.exp.budget_s
        if b is None:
            return None
        return b if self._load_started is None else max(0.0, b - (self.backend.now() - self._load_started))

    def report(self, phase: RampPhase, step: int, level: float, message: str = "") -> None:
        if self.on_progress is None:
            return
        n = len(self.runs)
        self.on_progress(
            RampProgress(
                phase=phase,
                step=step,
                users=level,
                elapsed_s=self.backend.now() - self._t0,
                step_s=self.exp.step_s,
                samples=self.backend.samples(),
                steps=tuple(self.steps),
                knee=self._knees.get(n) if n else None,
                message=message,
                open_loop=self.exp.open_loop,
                budget_left_s=self.budget_left(),
                unit=self.exp.unit,
            )
        )

    def _say(self, phase: RampPhase, step: int, level: float) -> Callable[[str], None]:
        return lambda message: self.report(phase, step, level, message)

    def write(self, status: RampStatus) -> None:
        if self.sink is not None:
            self.sink.write(self.steps, self.knee(), status)

    # -- the loop -------------------------------------------------------------------------------

    async def run(self, start: Callable[[], Awaitable[None]] | None = None) -> list[Measured]:
        """Run the plan to its end (or its budget, or a stop); the backend is stopped and the
        result written whatever ends it, ``start`` (the backend's start, when it has one)
        included. Raises the experiment's error when it cannot go on."""
        try:
            if start is not None:
                await start()
            await self._loop()
            self.status = "complete" if self.status == "interrupted" else self.status
            plan = self.exp.plan
            if self.status == "complete" and not self.stop_reason and isinstance(plan, KneeSearch):
                self.stop_reason = plan.stop_reason(self.steps, self.knee() if self.runs else None)
        finally:
            try:
                await self.backend.stop()
            finally:
                if self.sink is not None:
                    self.sink.stopped(self.stop_reason)
                    self.write(self.status)
        self.report("done", len(self.runs), self.runs[-1].step.level if self.runs else 0)
        return self.runs

    async def _loop(self) -> None:
        exp, plan = self.exp, self.exp.plan
        idx = 0
        while (level := plan.next(self.steps, self._plan_knee())) is not None:
            left = self.budget_left()
            step_len = exp.replay_s(level) if exp.replay_s is not None else exp.step_s
            if step_len > MOST_STEP_S:  # a replay's span over its speed (--step-seconds is checked)
                too_long = (
                    f"a replay at x{level:g} lasts {step_len / 86_400:,.3g} days of the trace's time; a step is at "
                    "most a day: give a faster --speed, or a shorter --trace-window"
                )
                if not self.runs:
                    raise exp.error(too_long, exit_code=EXIT_USAGE)
                self.stop_reason = too_long
                return
            if left is not None and left < step_len:
                if exp.replay_s is not None and not self.runs:
                    raise exp.error(
                        f"a replay at x{level:g} takes {step_len / 60:.1f} min, more than the budget "
                        f"({left / 60:g} min): give a larger --budget, or a shorter --trace-window",
                        exit_code=EXIT_USAGE,
                    )
                self.stop_reason = exp.budget_spent(self.knee() if self.runs else None)
                return
            if self._load_started is None:
                self._load_started = self.backend.now()
            idx += 1
            if exp.replay_s is not None:
                run = await self._replay(idx, level, step_len)
            else:
                run = await self._step(idx, level, left)
            if exp.shadow is not None:
                run = await self._shadowed(run)
            self.runs.append(run)
            summary = run.step
            if self._knee_each_step:
                await self._infer()
            self.write("running")
            self.report("step_done", idx, level)
            if self.sink is not None and self.sink.write_error:
                raise exp.error(f"{self.sink.write_error}: the ramp stopped after step {idx}")
            if why := server_failed(summary, run.window):
                self.status = "server_failed"
                raise exp.error(f"{why}: the server failed")
            if summary.stopped_early:
                self.status, self.stop_reason = "stopped_early", summary.stopped_early.reason
                return
            why = badly_broken(summary, exp.abort_factor)
            if why and isinstance(plan, Listed) and plan.next(self.steps) is not None:
                self.status, self.stop_reason = "stopped_early", why
                return

    async def _shadowed(self, run: Measured) -> Measured:
        """``run`` with the twin's prediction of it (:attr:`Experiment.shadow`)."""
        assert self.exp.shadow is not None
        try:
            shadow = await self.backend.offload(self.exp.shadow, [*self.steps, run.step])
        except Exception:  # the measurement stands without it
            logger.exception("the shadow twin's prediction of step %d", run.step.step)
            return run
        return replace(run, step=replace(run.step, shadow=shadow)) if shadow is not None else run

    async def _replay(self, idx: int, speed: float, length: float) -> Measured:
        """One replay of the trace at ``speed``, ``length`` seconds of rows (open loop): the step
        ends once every row is sent and its request ended (or ``replay_grace_s`` after its length),
        its figures over all its requests (the replay is the measurement), and its ``trace``
        saying how faithfully it kept the schedule."""
        exp, be = self.exp, self.backend
        t0 = await be.start_replay(idx, speed)
        await be.begin_window()
        m_start, answered = be.now(), be.samples()
        queue, every, polled = QueueWatch(), poll_every(exp.poll_s, length), m_start
        while not (sent := be.replayed(idx)).complete:
            if be.now() - m_start > length + exp.replay_grace_s:
                logger.warning("trace step %d: not every process reported its end; the step ends at its deadline", idx)
                break
            self.report("measuring", idx, speed, f"x{speed:g}: {be.samples() - answered} of {sent.due} rows answered")
            await be.advance(be.now() + REPLAY_TICK_S)
            if be.now() - polled >= every - 0.05:
                polled = be.now()
                queue.see(polled - m_start, await be.poll())
        server = replace(await be.poll(), waiting_mean=queue.mean)
        m_end = t0 + (be.now() - m_start)  # on the requests' clock
        window = be.window(idx, -math.inf, math.inf, -math.inf)
        ends = [s.end or s.start for s in window]
        duration = max(length, (max(ends) if ends else m_end) - t0, 1e-3)
        summary = summarize_step(
            idx,
            be.generators,
            window,
            duration,
            exp.limits,
            open_loop=True,
            server=server,
            client=be.client(t0, m_end, exp.limits),
            unbounded=queue.unbounded,
            intervals=exp.intervals,
        )
        cached = summary.cached_prompt_fraction
        fidelity = trace_fidelity(sent, window, length, server.prefix_cache_hit_rate, cached)
        return Measured(replace(summary, speed=speed, trace=fidelity), window, duration)

    async def _step(self, idx: int, level: float, budget_left: float | None) -> Measured:
        """One held level: warm up, measure for the step's window, and while the verdict is
        inconclusive measure on (up to the step's limit, re-deciding over the whole window); a
        queue growing without bound ends the step at once as a break."""
        st = await self._begin(idx, level, budget_left)
        while True:
            early = await self._measure(st)
            if early is not None:
                return early
            done = await self._decide(st)
            if done is not None:
                return done

    async def _begin(self, idx: int, level: float, budget_left: float | None) -> _Step:
        """The level set (the last level's requests drained first on a step down), the warm-up
        held, the window begun: the step's state."""
        exp, be = self.exp, self.backend
        prev = self.runs[-1].step.level if self.runs else 0.0
        users = be.generators if exp.open_loop else int(level)
        note = await be.set_level(idx, level, prev, exp.open_loop)
        sent_from, drained_s = -math.inf, 0.0
        if self.runs and level < prev:
            t0 = be.now()
            sent_from = await be.drain(exp.step_limit_s, self._say("warmup", idx, level))
            drained_s = sent_from - t0
        self.report("warmup", idx, level, note)
        await be.advance(be.now() + exp.warmup_s)
        m_start = be.now()
        await be.begin_window()
        planned = exp.step_s - exp.warmup_s
        limit = max(planned, exp.step_limit_s - exp.warmup_s)
        if budget_left is not None:  # measure on only while the budget lasts
            limit = max(planned, min(limit, budget_left - exp.warmup_s))
        if exp.window_s is not None:
            planned = limit = exp.window_s(idx)
        return _Step(
            idx=idx,
            level=level,
            users=users,
            sent_from=sent_from,
            drained_s=drained_s,
            m_start=m_start,
            planned=planned,
            limit=limit,
            target=planned,
            next_check=planned / 3,
            every=poll_every(exp.poll_s, planned),
            polled=m_start,
        )

    async def _measure(self, st: _Step) -> Measured | None:
        """Tick until the window reaches its target: the server polled, the study's early stop
        and the knee search's settling asked on their clocks. A step the early stop ends, as
        measured so far; None once the window is done (or the queue grows without bound, or the
        search settled)."""
        exp, be = self.exp, self.backend
        settle = exp.plan if isinstance(exp.plan, KneeSearch) and exp.settle else None
        while (left := st.target - (be.now() - st.m_start)) > 1e-6:  # (virtual time: no float dust)
            self.report(st.phase, st.idx, st.level)
            await be.advance(be.now() + min(TICK_S, left))
            now = be.now()
            # every poll interval, and always at the window's end (its server-side figures end there)
            if now - st.polled >= st.every - 0.05 or now - st.m_start >= st.target:
                st.polled = now
                st.server = st.queue.see(now - st.m_start, await be.poll())
                if st.queue.unbounded:
                    return None
            if exp.early_stop is not None and now - st.m_start >= st.next_check:
                st.next_check += EARLY_CHECK_S
                if early := self._early(st):
                    return Measured(early, [], now - st.m_start)
            if settle is not None and settle_due(now - st.m_start, st.planned, st.asked):
                st.asked += 1
                window = be.window(st.idx, st.m_start, now, st.sent_from)
                if why := settle.settled(self.steps, st.level, window, exp.limits):
                    st.settled = EarlyStop(why, round(max(0.0, st.target - (now - st.m_start)), 1))
                    return None
        return None

    async def _decide(self, st: _Step) -> Measured | None:
        """The window so far summarized and decided: the step, unless it is inconclusive and may
        measure on (then its target moves on and None)."""
        exp, be = self.exp, self.backend
        m_end = be.now()
        # the requests that ended in the window, of those this step sent: one the last level
        # sent (a slow one still queued after a step down) measures that level's load
        window = be.window(st.idx, st.m_start, m_end, st.sent_from)
        summary = summarize_step(
            st.idx,
            st.users,
            window,
            m_end - st.m_start,
            exp.limits,
            open_loop=exp.open_loop,
            rate=st.level if exp.open_loop else None,
            server=st.server,
            client=be.client(st.m_start, m_end, exp.limits),
            extended_s=max(0.0, (m_end - st.m_start) - st.planned),
            drained_s=st.drained_s,
            unbounded=st.queue.unbounded,
            intervals=exp.intervals,
        )
        if st.settled is not None:
            return Measured(replace(summary, settled_early=st.settled), window, m_end - st.m_start)
        if st.queue.unbounded or summary.decision != "inconclusive" or st.target >= st.limit - 1e-6:
            return Measured(summary, window, m_end - st.m_start)
        # a search measures on only near a limit, and the knee search only while the knee's
        # interval is wider than it asks (off the event loop: the inference resamples every step)
        levels = [*self._levels(self.runs), (st.level, window)]
        if not await be.offload(measure_on, exp.plan, self.steps, summary, levels, exp.limits, exp.unit, exp.seed):
            return Measured(summary, window, m_end - st.m_start)
        st.target = min(st.limit, st.target + st.planned)
        st.phase = "extending"
        self.report(st.phase, st.idx, st.level, f"inconclusive ({summary.verdict.reason}): measuring on")
        return None

    def _early(self, st: _Step) -> StepSummary | None:
        """The window so far, when the study's early stop says the trial is clearly dominated, with
        at least :data:`EARLY_MIN_REQUESTS` requests."""
        exp = self.exp
        assert exp.early_stop is not None
        now = self.backend.now()
        elapsed = now - st.m_start
        window = self.backend.window(st.idx, st.m_start, now, st.sent_from)
        if len(window) < EARLY_MIN_REQUESTS:
            return None
        summary = summarize_step(
            st.idx, st.users, window, elapsed, exp.limits, open_loop=exp.open_loop, server=st.server
        )
        reason = exp.early_stop(summary)
        if not reason:
            return None
        return replace(summary, stopped_early=EarlyStop(reason, round(max(0.0, st.target - elapsed), 1)))


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits (the driver over the virtual backend) to its end, here and
    now, without an event loop (so also from inside a running one).

    Raises:
        RuntimeError: the coroutine waited on something (a live backend given by mistake).
    """
    try:
        coro.send(None)
    except StopIteration as e:
        return e.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("run_now: the coroutine waited (a virtual backend never does)")


async def immediately(fn: Callable[..., T], *args: Any) -> T:
    """A virtual backend's :meth:`Backend.offload`: the computation, here and now."""
    return fn(*args)
