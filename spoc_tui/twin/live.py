"""Live headroom: the scrapes a monitor makes feeding each server's passive learner
(:class:`spoc_tui.twin.headroom.HeadroomLearner`). :func:`watch_headroom` watches sources for a
while (``spoc inspect --headroom``); :class:`LiveHeadroom` is the monitor's, fed from its poller
and refreshed in a worker thread."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from spoc_tui.collectors.http import new_client
from spoc_tui.collectors.inspect import InspectResult, read_all, result_of
from spoc_tui.collectors.scrape import DEFAULT_TIMEOUT, Reading, SourceError
from spoc_tui.core.errors import first_line
from spoc_tui.core.metrics.promparse import Exposition
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.redact import redact_url
from spoc_tui.twin.headroom import Headroom, HeadroomLearner, LearnerState
from spoc_tui.twin.ledger import LEDGER_S, LedgerSummary, grade_after
from spoc_tui.twin.model import Twin
from spoc_tui.twin.passive import MIN_WINDOWS, PassiveFit
from spoc_tui.twin.traffic import REPLAY_S, WINDOW_S

logger = logging.getLogger(__name__)

HEADROOM_EVERY_S = 5.0
"""How often ``spoc inspect --headroom`` scrapes while it watches (the monitor's windows are 30 s)."""
INSPECT_GRADED = 10
"""The most windows ``spoc inspect --headroom`` grades at the end of its watch (the newest; about a
second of CPU each; through Prometheus, this many in all, split between the replicas)."""


async def watch_headroom(
    sources: list[str],
    seconds: float,
    limits: Sequence[Limit],
    api_key: str | None = None,
    prior: Twin | None = None,
    every_s: float = HEADROOM_EVERY_S,
    say: Callable[[str], None] = lambda _: None,
    seats: int | None = None,
) -> InspectResult:
    """Watch ``sources`` for ``seconds``, scraping every ``every_s``, each vLLM server's scrapes
    feeding a passive learner (:class:`spoc_tui.twin.headroom.HeadroomLearner`); then the last
    window's report, as ``inspect_sources`` gives it, with each server's headroom (worked out off
    the event loop). The report's window is the whole watch (the first reading against the last).
    Ctrl-C ends the watch early: what was seen is still reported, marked ``interrupted``. A
    source that fails a scrape is tried again at the next one; one whose first or last reading
    failed is reported as an error."""
    learners: dict[str, HeadroomLearner] = {}
    broken: dict[str, str] = {}
    first: list[Reading | SourceError] | None = None
    last: list[Reading | SourceError] | None = None
    t0 = time.monotonic()
    next_say = 60.0
    interrupted = False
    async with new_client(DEFAULT_TIMEOUT) as client:
        try:
            while True:
                got = await read_all(client, sources, api_key)
                first, last = (first or got), got
                for src, r in zip(sources, got, strict=True):
                    if isinstance(r, Reading) and r.kind == "vllm":
                        made = HeadroomLearner(limits, prior=prior, seats=seats)
                        learner = learners.setdefault(redact_url(src), made)
                        learn(learner, redact_url(src), r.taken_at, r.exposition, broken)
                elapsed = time.monotonic() - t0
                if elapsed >= seconds - 1e-6:
                    break
                if elapsed >= next_say:
                    say(f"watched {elapsed:.0f} of {seconds:.0f} s")
                    next_say += 60.0
                await asyncio.sleep(min(every_s, seconds - elapsed))
        except (KeyboardInterrupt, asyncio.CancelledError):
            interrupted = True
    watched = time.monotonic() - t0
    if first is None:  # interrupted before the first reading came back
        return InspectResult(watched_s=watched, interrupted=True)
    res = result_of(sources, first, last if last is not first else None)
    res.watched_s, res.interrupted = watched, interrupted
    if learners:
        say(
            f"watched {watched:.0f} s; working out the headroom of {len(learners)} server(s), then grading its "
            f"last {INSPECT_GRADED} minutes at most (the ledger)..."
        )
        for name, learner in learners.items():
            if res.interrupted:
                h = Headroom.none("not worked out: interrupted", limits)
            elif name in broken:
                h = Headroom.none(broken[name], limits)
            else:
                try:
                    h = await off_loop(partial(estimate_of, learner, limits))
                    h = replace(h, ledger=await off_loop(partial(graded_of, learner)))
                except (KeyboardInterrupt, asyncio.CancelledError):
                    res.interrupted = True
                    h = Headroom.none("not worked out: interrupted", limits)
            res.headroom[name] = (h.text(), h.as_dict())
    return res


def learn(learner: HeadroomLearner, source: str, t: float, exp: Exposition, broken: dict[str, str]) -> None:
    """One scrape of ``source`` into its learner. A scrape the learner cannot take (a defect, or a
    value no check caught) costs that source its headroom, its reason kept in ``broken`` (logged
    the first time), never the poller its view of every server (issue 74); one it takes clears it."""
    try:
        learner.add(t, exp)
    except Exception as e:
        if source not in broken:
            logger.exception("the headroom learner of %s", source)
        broken[source] = f"its scrapes could not be learned from ({first_line(e, 120)}); see spoc.log"
    else:
        broken.pop(source, None)


T = TypeVar("T")


async def off_loop(fn: Callable[[], T]) -> T:
    """``fn()`` in a daemon thread of its own, awaited: cancelled (Ctrl-C), the await ends at once
    and nothing waits for the thread (``asyncio.to_thread``'s executor is joined when
    ``asyncio.run`` ends: an estimate's tens of seconds, issue 74); it ends with the process."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def work() -> None:
        try:
            out: tuple[bool, Any] = (True, fn())
        except BaseException as e:  # handed to the awaiting task
            out = (False, e)
        try:
            loop.call_soon_threadsafe(settle, *out)
        except RuntimeError:  # the loop ended (interrupted): nobody waits for it
            pass

    threading.Thread(target=work, name="spoc-estimate", daemon=True).start()
    return await fut


def graded_of(learner: HeadroomLearner, most: int = INSPECT_GRADED, seed: int = 0) -> LedgerSummary:
    """The ledger of a watch: its ``most`` newest windows each graded on a fit of the windows
    before it (seconds of CPU each); a window that fails to grade (a defect) is said, not raised."""
    for seen in learner.ledger.take(most):
        fit: PassiveFit | None = None
        try:
            got, fit = learner.grade(seen, seed)
        except Exception as e:
            logger.exception("grading a window")
            got = f"could not be graded ({first_line(e, 120)}); see spoc.log"
        learner.graded(got, fit)
    return learner.ledger_summary()


def estimate_of(
    learner: HeadroomLearner | LearnerState,
    limits: Sequence[Limit],
    seed: int = 0,
    draws: int = 4,
    replay_s: float = REPLAY_S,
    last: Headroom | None = None,
) -> Headroom:
    """One server's estimate, whatever its scrapes held: an estimate that fails (a defect, or a
    value no check caught) is that server's "no number" with the error, logged, and costs no
    other server its own (issue 74). ``last``: its estimate before (a refresh's)."""
    try:
        return learner.estimate(seed, draws, replay_s, last)
    except Exception as e:
        logger.exception("working out a server's headroom")
        return Headroom.none(f"could not be worked out ({first_line(e, 120)}); see spoc.log", limits)


LIVE_REFRESH_S = 240.0
"""The soonest the monitor works out each server's headroom again (its fit's windows are 30 s):
four minutes, so that a number the CPU share allows as often (an estimate of 1.8 s or less at
the 0.75 % a monitor of one server leaves, :data:`LIVE_CPU_MOST`) is never more than five minutes
old (issue 73). Ten minutes before."""
LIVE_CPU_SHARE = 0.005
"""The most of one core the estimates may take over time where nothing measures the process's own
share (``spoc headroom``; the monitor: :data:`LIVE_CPU_MOST`): an estimate replays the traffic on
the twin, 1-25 s of CPU by the traffic's weight (benchmarks/README.md, live headroom), so the next
waits until the last one's CPU is this share of the time since it began (a 24 s estimate: the
next 80 minutes on), never sooner than :data:`LIVE_REFRESH_S`."""
LIVE_CPU_MOST = 0.008
"""The most the estimates may take where the monitor measures its own share (:attr:`LiveHeadroom.share`):
what its own work and the ledger's grading leave of :data:`TOTAL_CPU_SHARE`, up to this. Beside one
server's monitor (0.5-0.6 % of a core) that is about 0.75 %, where :data:`LIVE_CPU_SHARE` kept it to
0.5 %: the demo's refresh (about 2.2 s of CPU since the replays were compiled) every 5 minutes, not
every 7.5 (issue 73)."""
TOTAL_CPU_SHARE = 0.0145
"""The share of one core the monitor, its ledger's grading and its estimates take together: issue
52's and 75's 1.5 %, less 0.05 % for the meter's own spread over a couple of minutes. One
server's monitor takes 0.5-0.7 % (benchmarks/monitor_cpu.py), leaving the grading its
:data:`LEDGER_CPU_SHARE` and the estimates the rest, up to :data:`LIVE_CPU_MOST`; sixteen replicas
read through Prometheus about 0.85 %, leaving them less (:attr:`LiveHeadroom.share`)."""
MIN_CPU_SHARE = 0.0005
"""The least the estimates are kept to, however much the monitor's own work takes (they still
come, if rarely, and the total is then over :data:`TOTAL_CPU_SHARE`, which the note says)."""
GRADE_PART = 0.25
"""Of what the monitor leaves of :data:`TOTAL_CPU_SHARE`, the most the ledger's grading takes
(up to :data:`LEDGER_CPU_SHARE`); the estimates take the rest (up to :data:`LIVE_CPU_SHARE`)."""
LIVE_RETRY_S = 10.0
"""How soon the monitor works the headroom out again when no server's could say a number yet (too
few windows, too little variety: a fit without a replay, milliseconds of CPU), rather than
:data:`LIVE_REFRESH_S`: a third of its fit's window later, so that the number comes as the window
it waited for closes. (A user's run: the first estimate, at 4 minutes, found 7 windows of the 8 it
needs, and the next came 10 minutes later, after the traffic had ended; the demo's, 7 windows at
240 s, the 8th closing a second later, and the number a minute later with a retry of 60 s.)"""
LIVE_DRAWS = 4
"""Bootstrap draws of the fit an estimate replays beside the fit itself (in the monitor). Two said
little: the 95 % range of two draws is their mean +- 15.6 standard deviations
(:func:`~spoc_tui.twin.predict.draws_interval`); four, +- 3.6. The estimates' CPU budget is
unchanged (the next waits longer)."""
LIVE_REPLAY_S = 60.0
"""Seconds of traffic an estimate replays at x1 (in the monitor)."""
LEDGER_CPU_SHARE = 0.0015
"""The share of one core grading the ledger's windows may take over time, beside the estimates':
grading a minute replays a minute and a half of its traffic six times (about 1 s of CPU at a
couple of requests a second, benchmarks/README.md, the ledger), so the newest minute is graded
every ten minutes or so; a lighter traffic's, more often."""


class CpuMeter:
    """The process's own share of a core over its last :attr:`window_s` seconds, the spans while its
    estimates or gradings ran left out (their CPU is budgeted apart): sampled each tick, a syscall."""

    def __init__(
        self,
        window_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
    ) -> None:
        self.window_s, self.clock, self.cpu = window_s, clock, cpu
        self._last: tuple[float, float] | None = None
        self._spans: deque[tuple[float, float, float]] = deque()
        """(when, wall seconds, CPU seconds) of each quiet span sampled."""

    def sample(self, busy: bool) -> None:
        """A tick: the span since the last one counted, unless an estimate or a grading ran in it
        (``busy`` now, or it was at the last sample: the span is then the next one's start)."""
        now, cpu = self.clock(), self.cpu()
        last, self._last = self._last, None if busy else (now, cpu)
        if last is None or busy:
            return
        self._spans.append((now, now - last[0], max(0.0, cpu - last[1])))
        while self._spans and now - self._spans[0][0] > self.window_s:
            self._spans.popleft()

    def busy(self) -> None:
        """Work the meter leaves out (an estimate, a grading) begins: the span it starts in is not
        counted (a monitor reading Prometheus ticks every 15 s: a grading fell between two quiet
        samples and was read as the monitor's own 16.7 %)."""
        self._last = None

    def share(self) -> float | None:
        """The share of a core (0.012: 1.2 %) over the quiet spans of the window, None before a
        minute of them."""
        wall = sum(w for _, w, _ in self._spans)
        return sum(c for _, _, c in self._spans) / wall if wall >= 60.0 else None


class LiveHeadroom:
    """The monitor's headroom: each server's learner, fed from the poller's scrape thread
    (:meth:`add`), and its estimates, worked out every :data:`LIVE_REFRESH_S` by
    :meth:`refresh` in a worker thread of the caller's (never the UI's)."""

    def __init__(
        self,
        limits: Sequence[Limit],
        prior: Twin | None = None,
        refresh_s: float = LIVE_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
        seats: int | None = None,
        draws: int = LIVE_DRAWS,
        replay_s: float = LIVE_REPLAY_S,
    ) -> None:
        """``prior``: a calibrated twin; ``seats``: the servers' max-num-seqs where the operator
        told it (:class:`~spoc_tui.twin.headroom.HeadroomLearner`); ``draws`` and ``replay_s``:
        each estimate's (:meth:`HeadroomLearner.estimate`)."""
        self.draws, self.replay_s = draws, replay_s
        self.limits = tuple(limits)
        self.prior = prior
        self.seats = seats
        self.refresh_s = refresh_s
        self.clock = clock
        self._learners: dict[str, HeadroomLearner] = {}
        self._broken: dict[str, str] = {}
        """Sources whose last scrape the learner could not take, and why."""
        self._held: dict[str, str] = {}
        """Sources whose scrapes cannot give a number, and why (:meth:`hold`)."""
        self._span: dict[str, tuple[float, float]] = {}
        """Each source's first and last scrape (their clock)."""
        self._lock = threading.Lock()
        self._last: float | None = None
        self._started = clock()
        self._banked = 0.0
        """Seconds before the last refresh that count in its CPU share: for the first to say a
        number, the learning before it (no estimate ran in it, only tries of milliseconds), at most
        ``refresh_s``; none for the others."""
        self.cpu_s = 0.0
        """CPU seconds the last :meth:`refresh` took (its thread's own)."""
        self.grade_cpu_s = 0.0
        """CPU seconds the last :meth:`grade` took."""
        self._graded: float | None = None
        self.results: dict[str, Headroom] = {}
        """Each server's latest headroom, by its source as shown."""
        self.meter: CpuMeter | None = None
        """The process's own CPU share, the estimates and gradings left out (the monitor's, where it
        measures it: :attr:`share` then keeps the total within :data:`TOTAL_CPU_SHARE`)."""

    def add(self, source: str, t: float, exp: Exposition) -> None:
        """One scrape of ``source`` taken at ``t`` (any thread). A scrape the learner cannot take
        (a defect, or a value no check caught) costs that source its headroom, said with the
        error, never the poller its view of every server (issue 74)."""
        with self._lock:
            learner = self._learners.get(source)
            if learner is None:
                learner = self._learners[source] = HeadroomLearner(self.limits, prior=self.prior, seats=self.seats)
            learn(learner, source, t, exp, self._broken)
            first, _ = self._span.get(source, (t, t))
            self._span[source] = (min(first, t), t)

    def hold(self, source: str, why: str | None) -> None:
        """Say why ``source``'s scrapes cannot give a number (Prometheus holds them too far apart,
        or without a series the fit reads: :mod:`spoc_tui.twin.history`), or, with None, that
        they can again."""
        with self._lock:
            if why is None:
                self._held.pop(source, None)
            else:
                self._held[source] = why

    def learner(self, source: str) -> HeadroomLearner | None:
        """``source``'s learner (None before its first scrape)."""
        return self._learners.get(source)

    @property
    def seen_s(self) -> float:
        """The longest span of scrapes fed of one source (a history read at once spans an hour)."""
        with self._lock:
            return max((b - a for a, b in self._span.values()), default=0.0)

    @property
    def share(self) -> float:
        """The share of a core the estimates are kept to: what the process's own work (:attr:`meter`)
        and the ledger's grading (:attr:`grade_share`) leave of :data:`TOTAL_CPU_SHARE`, between
        :data:`MIN_CPU_SHARE` and :data:`LIVE_CPU_MOST`; :data:`LIVE_CPU_SHARE` where nothing
        measures it."""
        return self._shares()[0]

    @property
    def grade_share(self) -> float:
        """The share of a core the ledger's grading is kept to: :data:`LEDGER_CPU_SHARE`, or
        :data:`GRADE_PART` of what the monitor's own work leaves where that is less."""
        return self._shares()[1]

    def _shares(self) -> tuple[float, float]:
        """(the estimates' share, the grading's), from one reading of the process's own share."""
        own = self.meter.share() if self.meter is not None else None
        if own is None:
            return LIVE_CPU_SHARE, LEDGER_CPU_SHARE
        left = max(0.0, TOTAL_CPU_SHARE - own)
        grade = min(LEDGER_CPU_SHARE, max(MIN_CPU_SHARE / 5, GRADE_PART * left))
        return min(LIVE_CPU_MOST, max(MIN_CPU_SHARE, left - grade)), grade

    @property
    def interval_s(self) -> float:
        """Seconds from one refresh to the next: ``refresh_s`` (:data:`LIVE_RETRY_S` while no
        server's estimate could say a number), or longer where the last one's CPU would take more
        than :attr:`share` of a core over it (the first: over it and the learning before it, up to
        ``refresh_s`` of that, so that the demo's first estimate, 2.5 s of CPU, is followed four
        minutes later, not eight: the share over the time since the start the same)."""
        said = any(h.identified for h in self.results.values())
        base = self.refresh_s if said or not self.results else min(self.refresh_s, LIVE_RETRY_S)
        return max(base, self.cpu_s / self.share - (self._banked if said else 0.0))

    def due(self) -> bool:
        """Time for :meth:`refresh`: the first as soon as a server's fit has its windows (the scrape
        that closes the last of them: 3.5 minutes after the first at a scrape a second), or half a
        window after it could have (its windows did not close: no traffic, no decoding), then every
        :attr:`interval_s`."""
        now = self.clock()
        if self._last is None:
            if not self._learners:
                return False
            with self._lock:
                closed = max(len(learner.refused) for learner in self._learners.values())
            seen = max(now - self._started, self.seen_s)
            return closed >= MIN_WINDOWS or seen >= (MIN_WINDOWS + 0.5) * WINDOW_S
        return now - self._last >= self.interval_s

    def grade_due(self) -> bool:
        """Time for :meth:`grade`: once there are estimates to show it beside, a window waits and the
        last grading's CPU is within :data:`LEDGER_CPU_SHARE` of the time since it began."""
        if not self.results:
            return False
        if self._graded is not None:
            wait = max(LEDGER_S, self.grade_cpu_s / self.grade_share)
            if self.clock() - self._graded < wait:
                return False
        with self._lock:
            return any(learner.ledger.seen for learner in self._learners.values())

    def work_due(self) -> bool:
        """An estimate (:meth:`due`) or a grading (:meth:`grade_due`) is due: :meth:`work`."""
        return self.due() or self.grade_due()

    def work(self, seed: int = 0) -> tuple[dict[str, Headroom], bool]:
        """What is due (blocking, a worker thread's job): the newest window of each server graded
        where only that is due, else the estimates; then each server's headroom with its ledger,
        and whether the estimates are new."""
        fresh = self.due() or not self.grade_due()
        if fresh:
            self.refresh(seed)
        else:
            self.grade(seed)
        return self.shown(), fresh

    def grade(self, seed: int = 0) -> None:
        """Each server's newest window not yet graded, predicted on a fit of the windows before it
        and set beside what the server then said (:mod:`spoc_tui.twin.ledger`); the older ones
        waiting are dropped (blocking, seconds of CPU)."""
        self._graded = self.clock()
        cpu0 = time.thread_time()
        with self._lock:
            broken = {**self._broken, **self._held}
            todo = {
                src: (seen, tuple(lr.windows), lr.server(), lr.kv_bytes_per_token, lr.ledger.fit)
                for src, lr in self._learners.items()
                if src not in broken and (seen := lr.ledger.take_newest()) is not None
            }
        for src, (seen, windows, server, kv_bytes, last) in todo.items():
            fit: PassiveFit | None = None
            try:
                got, fit = grade_after(seen, windows, server, self.limits, self.prior, kv_bytes, seed, last)
            except Exception as e:  # a defect: that window's grade, said, never the monitor
                logger.exception("grading a window of %s", src)
                got = f"could not be graded ({first_line(e, 120)}); see spoc.log"
            with self._lock:
                learner = self._learners.get(src)
                if learner is not None:
                    learner.graded(got, fit)
        self.grade_cpu_s = time.thread_time() - cpu0

    def grade_recent(self, most: int = INSPECT_GRADED, seed: int = 0) -> dict[str, Headroom]:
        """A one-shot report's ledger (``spoc inspect --prometheus --headroom``): the newest of each
        server's windows graded, ``most`` in all, split between the servers (blocking); then each
        server's headroom with its ledger. Not for a monitor whose scrapes go on (:meth:`grade`)."""
        learners = [lr for src, lr in self._learners.items() if src not in self._broken and src not in self._held]
        for lr in learners:
            graded_of(lr, max(1, most // len(learners)), seed)
        return self.shown()

    def shown(self) -> dict[str, Headroom]:
        """Each server's latest headroom, with its ledger as it stands."""
        with self._lock:
            ledgers = {src: lr.ledger_summary() for src, lr in self._learners.items()}
        return {src: replace(h, ledger=ledgers.get(src)) for src, h in self.results.items()}

    def refresh(self, seed: int = 0) -> dict[str, Headroom]:
        """Every server's headroom now (blocking, seconds of CPU: a worker thread's job; its CPU
        time sets when the next is due)."""
        now = self.clock()
        first = not any(h.identified for h in self.results.values())  # the tries before cost milliseconds
        self._banked = min(self.refresh_s, max(0.0, now - self._started)) if first else 0.0
        self._last = now
        cpu0 = time.thread_time()
        with self._lock:
            broken = {**self._broken, **self._held}
            states = {src: learner.snapshot() for src, learner in self._learners.items() if src not in broken}
        out = {src: Headroom.none(why, self.limits) for src, why in broken.items()}
        last = self.results
        out.update(
            {
                src: estimate_of(st, self.limits, seed, self.draws, self.replay_s, last.get(src))
                for src, st in states.items()
            }
        )
        self.cpu_s = time.thread_time() - cpu0
        self.results = out
        return out

    def next_note(self) -> str:
        """What the monitor says of the next estimate when it comes sooner than ``refresh_s`` (no
        number yet) or its CPU put it off past it (empty otherwise)."""
        if self.interval_s < self.refresh_s:
            if self.interval_s < 60:
                return f"tried again in {self.interval_s:.0f} s"
            return f"tried again in {self.interval_s / 60:.0f} min"
        if self.interval_s <= self.refresh_s:
            return ""
        share = self.share
        most = LIVE_CPU_SHARE if self.meter is None or self.meter.share() is None else LIVE_CPU_MOST
        left = "" if share >= most else f", what the monitor's own work leaves of {TOTAL_CPU_SHARE * 100:g} %"
        return (
            f"next in {self.interval_s / 60:.0f} min (this one took {self.cpu_s:.0f} s of CPU; "
            f"estimates are kept to {share * 100:.2g} % of a core{left})"
        )

    def reset(self) -> None:
        """Forget every scrape (the monitor's windows were reset)."""
        with self._lock:
            self._learners.clear()
            self._broken.clear()
            self._held.clear()
            self._span.clear()
        self._last = self._graded = None
        self._started = self.clock()
        self.results = {}


class Publishing:
    """``spoc headroom``'s estimates: worked out off the event loop when due, then published and
    said; until a server's first, its "learning" line."""

    def __init__(
        self, live: LiveHeadroom, publish: Callable[[dict[str, Headroom], bool], None], say: Callable[[str], None]
    ):
        """``publish(results, fresh)``: ``fresh`` false where only the ledger moved (the estimate's age stands)."""
        self.live, self.publish, self.say = live, publish, say
        self.pending: asyncio.Future[tuple[dict[str, Headroom], bool]] | None = None
        self.announced: set[str] = set()
        self.said: dict[str, tuple[str, str]] = {}
        """Each server's lines last said (its headroom, its ledger): a line is said when it changes."""

    def learning(self, name: str, how: str) -> None:
        if name not in self.announced:  # its series exist from the first scrape
            self.announced.add(name)
            self.publish({name: Headroom.none(how, self.live.limits)}, True)

    def step(self) -> None:
        if self.pending is None and self.live.work_due():
            self.pending = asyncio.ensure_future(off_loop(self.live.work))
        if self.pending is not None and self.pending.done():
            (found, fresh), self.pending = self.pending.result(), None
            self.publish(found, fresh)
            for name, h in found.items():
                lines = (h.line(), h.ledger.line() if h.ledger is not None else "")
                for line in lines:
                    if line and line not in self.said.get(name, ()):
                        self.say(f"{name}: {line}")
                self.said[name] = lines


async def keep_headroom(
    sources: list[str],
    live: LiveHeadroom,
    publish: Callable[[dict[str, Headroom], bool], None],
    api_key: str | None = None,
    every_s: float = HEADROOM_EVERY_S,
    say: Callable[[str], None] = lambda _: None,
) -> None:
    """``spoc headroom``: scrape ``sources`` every ``every_s`` for as long as it runs, each vLLM
    server's scrapes feeding ``live``; when an estimate is due, work it out off the event loop and
    ``publish`` it (until the first, each server's "learning" line). Ends when cancelled."""
    out = Publishing(live, publish, say)
    failing: set[str] = set()
    async with new_client(DEFAULT_TIMEOUT) as client:
        while True:
            got = await read_all(client, sources, api_key)
            for src, r in zip(sources, got, strict=True):
                name = redact_url(src)
                if isinstance(r, Reading) and r.kind == "vllm":
                    failing.discard(name)
                    out.learning(name, "learning from the scrapes")
                    live.add(name, r.taken_at, r.exposition)
                elif isinstance(r, SourceError) and name not in failing:
                    failing.add(name)
                    say(f"{name}: {r} (tried again at each scrape)")
            out.step()
            await asyncio.sleep(every_s)
