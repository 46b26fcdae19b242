"""A trace replayed on a fleet of twins, in virtual time: how many replicas (or which autoscaling
policy) serve the traffic within the SLA, for how many replica-hours.

Each replica is a :class:`~spoc_tui.twin.engine.TwinEngine` (the calibrated server); one clock
drives them all (a discrete-event loop: the next row's arrival, the next step's end on any replica,
a request reaching its engine after its time outside it, the autoscaler's tick). The rows are sent
as ``spoc ramp --trace`` sends them: at ``t / speed``, their exact input and output lengths,
leading hash ids as shared leading blocks (so the prefix cache sees what production saw), a
follow-up waiting for its parent's end plus its think time. A router sends each request to the
ready replica with the fewest requests in flight (least outstanding requests), as an inference
gateway would.

The autoscaler reads what a real one reads, vLLM's ``num_requests_waiting`` averaged over the
ready replicas, every ``interval`` seconds: at or above its threshold it starts a replica (ready
after ``startup`` seconds of cold start, billed from its start), at zero for ``cooldown`` it
drains the least loaded one (no new requests; stopped once empty), between ``min`` and ``max``.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spoc_tui.core.errors import InputError
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.ramp.steps import RequestSample, StepSummary, summarize_step
from spoc_tui.core.traces.read import TraceRow
from spoc_tui.core.traces.replay import release
from spoc_tui.sim.engine import SimRequest
from spoc_tui.sim.virtual import client_sample
from spoc_tui.twin.engine import TwinEngine
from spoc_tui.twin.model import StepModel, Twin
from spoc_tui.twin.rowprompts import RowPrompts

if TYPE_CHECKING:
    from spoc_tui.twin.fastreplay import CompiledReplay


class PolicyError(InputError):
    """An ``--autoscale`` or ``--replicas`` that does not parse; the message says the form."""


@dataclass(frozen=True)
class Autoscale:
    """``num_requests_waiting>=N,cooldown=60s[,startup=60s][,interval=15s][,min=1][,max=8]``."""

    waiting: float
    cooldown_s: float = 60.0
    startup_s: float = 60.0
    interval_s: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 8

    def describe(self) -> str:
        return (
            f"num_requests_waiting>={self.waiting:g},cooldown={self.cooldown_s:g}s,startup={self.startup_s:g}s,"
            f"interval={self.interval_s:g}s,min={self.min_replicas},max={self.max_replicas}"
        )


def _secs(text: str, what: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min)?\s*", text)
    if not m:
        raise PolicyError(f"--autoscale {what}={text!r}: give seconds (60s, 2m)")
    v = float(m.group(1))
    return v * {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, None: 1.0}[m.group(2)]


def parse_autoscale(text: str) -> Autoscale:
    """Raises: PolicyError."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    m = re.fullmatch(r"num_requests_waiting\s*>=\s*([0-9]*\.?[0-9]+)", parts[0]) if parts else None
    if m is None:
        raise PolicyError(
            f"--autoscale {text!r}: start with num_requests_waiting>=N (vLLM's queue, averaged over replicas), "
            "then cooldown=60s, startup=60s, interval=15s, min=1, max=8"
        )
    kw: dict[str, float | int] = {}
    for p in parts[1:]:
        key, sep, value = p.partition("=")
        key = key.strip()
        if not sep:
            raise PolicyError(f"--autoscale {p!r}: give key=value")
        if key in ("cooldown", "startup", "interval"):
            kw[f"{key}_s"] = _secs(value, key)
        elif key in ("min", "max"):
            if not value.strip().isdigit():
                raise PolicyError(f"--autoscale {key}={value!r}: a whole number of replicas")
            kw[f"{key}_replicas"] = int(value)
        else:
            raise PolicyError(f"--autoscale {key!r}: known keys are cooldown, startup, interval, min, max")
    a = Autoscale(float(m.group(1)), **kw)  # type: ignore[arg-type]
    if not 1 <= a.min_replicas <= a.max_replicas <= 64:
        raise PolicyError(f"--autoscale: need 1 <= min ({a.min_replicas}) <= max ({a.max_replicas}) <= 64")
    if a.interval_s <= 0:
        raise PolicyError("--autoscale interval must be positive")
    return a


def parse_replicas(text: str) -> list[int]:
    """``4``, ``1-8`` or ``1,2,4``. Raises: PolicyError."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            raise PolicyError(f"--replicas {text!r}: give a count, a range (1-8) or a list (1,2,4)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if not 1 <= lo <= hi <= 64:
            raise PolicyError(f"--replicas {part!r}: between 1 and 64, low to high")
        out.extend(range(lo, hi + 1))
    return sorted(set(out))


@dataclass
class _Replica:
    idx: int
    engine: TwinEngine
    started: float
    ready_at: float
    stopped: float | None = None
    draining: bool = False
    step_end: float | None = None
    in_flight: int = 0

    def ready(self, now: float) -> bool:
        return self.stopped is None and not self.draining and now >= self.ready_at


@dataclass
class FleetRun:
    """One configuration over the trace."""

    label: str
    samples: list[RequestSample]
    replica_seconds: float
    span_s: float
    skipped: int
    peak_replicas: int
    timeline: list[tuple[float, int]] = field(default_factory=list)
    """(time, ready replicas) at each change."""

    @property
    def replica_hours(self) -> float:
        return self.replica_seconds / 3600


TIMERS = ("poll", "tick")
"""Events that only look at a replay (its polls, the autoscaler's ticks): none moves it on."""


class FleetSim:
    """The trace on a fleet of twins: fixed ``replicas``, or an ``autoscale`` policy."""

    def __init__(
        self,
        twin: Twin,
        rows: Sequence[TraceRow],
        speed: float = 1.0,
        *,
        replicas: int | None = None,
        autoscale: Autoscale | None = None,
        model: StepModel | None = None,
        seed: int = 0,
        flags: Mapping[str, object] | None = None,
        poll_s: float | None = None,
        step: int = 1,
    ) -> None:
        """
        Args:
            flags: a what-if for every replica (``spoc twin predict --set``).
            poll_s: note every replica's queue, running requests and KV use this often (virtual
                seconds) in :attr:`polls`, as a ramp polls /metrics.
            step: the step its requests' samples are of (a predicted ramp's replay: that step's).
        """
        self.step = step
        self.twin = twin
        self.flags = dict(flags or {})
        self.poll_s = poll_s
        self.polls: list[tuple[float, int, int, float]] = []
        """(time, requests waiting, running, KV use) over the ready replicas."""
        self.rows = rows
        self.speed = speed
        self.model = model
        self.seed = seed
        self.autoscale = autoscale
        self.fixed = replicas
        self.now = 0.0
        self.replicas: list[_Replica] = []
        self.samples: list[RequestSample] = []
        self.skipped = 0
        self.too_big = 0
        """Of :attr:`skipped`: rows longer than a replica's whole KV cache."""
        self.stalled = 0
        """Of :attr:`skipped`: requests still unanswered when nothing was left that could run them."""
        self._moving = 0
        """Events in the heap that move the replay on (all but :data:`TIMERS`)."""
        self._heap: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self._ends: dict[str, float] = {}
        self._children: dict[str, list[TraceRow]] = {}
        self._prompts = RowPrompts(rows, 1 << 24, twin.server.block_size)  # ids above the filler words'
        self.timeline: list[tuple[float, int]] = []
        self._last_change = -math.inf
        self._quiet_since: float | None = None
        self._over = False
        """Ended before its events ran out (requests that nothing left could ever run)."""
        self._fast: CompiledReplay | None = None
        """The replay as the compiled engine plays it (:mod:`~spoc_tui.twin.fastreplay`), where it can."""

    # -- events --------------------------------------------------------------------------
    def _push(self, at: float, kind: str, obj: object) -> None:
        self._seq += 1
        if kind not in TIMERS:
            self._moving += 1
        heapq.heappush(self._heap, (at, self._seq, kind, obj))

    def _start_replica(self, ready_in: float) -> None:
        i = len(self.replicas)
        eng = TwinEngine(self.twin, self.model, flags=self.flags, seed=self.seed * 101 + i, clock=lambda: self.now)
        eng.stats.unread()  # a replay is read by its requests and counters, never its /metrics
        self.replicas.append(_Replica(i, eng, self.now, self.now + ready_in))
        if ready_in > 0:
            self._push(self.now + ready_in, "ready", i)
        self._mark()

    def _mark(self) -> None:
        n = sum(1 for r in self.replicas if r.ready(self.now))
        if not self.timeline or self.timeline[-1][1] != n:
            self.timeline.append((self.now, n))

    def _send(self, row: TraceRow, held: float) -> None:
        """Send ``row`` now (its :func:`release`): recorded as the live replay records it,
        ``scheduled`` its due time and ``held_s`` how long the turn it followed held it."""
        scheduled = row.t / self.speed
        ready = [r for r in self.replicas if r.ready(self.now)]
        if not ready:  # every replica still starting: the nearest ready takes it
            ready = [min((r for r in self.replicas if r.stopped is None), key=lambda r: r.ready_at)]
        rep = min(ready, key=lambda r: (r.in_flight, r.idx))
        eng = rep.engine
        prompt, keys, own = self._prompts.take(row)
        if len(prompt) + row.output_tokens > eng.max_len:
            self.skipped += 1
            self._finish_row(row)
            return
        if eng._blocks_for(len(prompt) + max(1, row.output_tokens)) > eng.num_blocks:
            self.skipped += 1  # it can never run: the whole KV cache holds less (issue 74)
            self.too_big += 1
            self._finish_row(row)
            return
        times: list[float] = []
        start = self.now

        def on_finish(req: SimRequest) -> None:
            rep.in_flight -= 1
            self.samples.append(
                client_sample(req, start, times, self.now, step=self.step, users=1,
                              conversation=row.conversation or f"r{row.index}", turn=row.turn, last=row.last,
                              trace_index=row.index, scheduled=scheduled, held_s=held or None, cut_counts=False)
            )  # fmt: skip
            self._finish_row(row)

        req = SimRequest(
            rid=f"r{row.index}",
            prompt=prompt,
            keys=keys,
            own_from=None if own is None else own // eng.cfg.block_size,
            max_tokens=max(1, row.output_tokens),
            target_tokens=max(1, row.output_tokens),
            arrival=self.now,
            times=times,
            on_finish=on_finish,
        )
        rep.in_flight += 1
        at = max(self.now + eng.outside_s(len(prompt)), rep.ready_at)
        self._push(at, "add", (rep.idx, req))

    def _finish_row(self, row: TraceRow) -> None:
        if row.id is None:
            return
        self._ends[row.id] = self.now
        for child in self._children.pop(row.id, []):
            rel = release(child.t / self.speed, self.now, child.think_s or 0.0)
            self._push(rel.at, "row", (child, rel.held_s))

    def _kick(self, rep: _Replica) -> None:
        """Start the replica's next step if it is idle and has work."""
        if rep.step_end is not None or rep.engine.idle():
            return
        if len(self.replicas) == 1:  # one engine: the decode steps before the next event at once
            run = rep.engine.decode_run(math.inf, self._horizon, self._clock_to, strict=True)
            if run.pending_end is not None:
                rep.step_end = run.pending_end
                self._push(rep.step_end, "step", rep.idx)
                return
            if run.steps:
                self._stop_if_empty(rep)
                if rep.engine.idle():
                    return
        dur = rep.engine.step()
        if not rep.engine.stepping():
            return  # nothing schedulable until something ends (or arrives)
        rep.engine.busy_s += dur
        rep.step_end = self.now + dur
        self._push(rep.step_end, "step", rep.idx)

    def _horizon(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def _clock_to(self, t: float) -> None:
        self.now = t

    def _tick(self) -> None:
        a = self.autoscale
        assert a is not None
        ready = [r for r in self.replicas if r.ready(self.now)]
        live = [r for r in self.replicas if r.stopped is None and not r.draining]
        waiting = sum(len(r.engine.waiting) for r in ready) / max(1, len(ready))
        if waiting >= a.waiting:
            self._quiet_since = None
            if len(live) < a.max_replicas and self.now - self._last_change >= a.cooldown_s:
                self._start_replica(a.startup_s)
                self._last_change = self.now
        elif waiting == 0:
            if self._quiet_since is None:
                self._quiet_since = self.now
            quiet = self.now - self._quiet_since >= a.cooldown_s
            if quiet and len(live) > a.min_replicas and self.now - self._last_change >= a.cooldown_s:
                victim = min(live, key=lambda r: (r.in_flight, -r.idx))
                victim.draining = True
                self._last_change = self.now
                self._stop_if_empty(victim)
                self._mark()
        else:
            self._quiet_since = None

    def _stop_if_empty(self, rep: _Replica) -> None:
        if rep.draining and rep.in_flight == 0 and rep.engine.idle() and rep.stopped is None:
            rep.stopped = self.now
            self._mark()

    # -- the run ---------------------------------------------------------------------------
    def run(self, label: str = "", progress: Callable[[str], None] | None = None) -> FleetRun:
        """The whole trace, to its last answer."""
        self.start()
        self.run_until(math.inf, label, progress)
        return self.result(label)

    def start(self) -> None:
        """The first replicas started and the trace's first events laid out (:meth:`run_until`
        then plays them)."""
        first = self.autoscale.min_replicas if self.autoscale else (self.fixed or 1)
        for _ in range(first):
            self._start_replica(0.0)
        from spoc_tui.twin.fastreplay import compiled, compiled_replay  # NumPy: a run's, not the CLI's

        eng = self.replicas[0].engine
        if compiled(first, self.autoscale is not None):
            self._fast = compiled_replay(eng, self.rows, self.speed, self._prompts, self.poll_s)
            if self._fast is not None:
                return
            self._prompts = RowPrompts(self.rows, 1 << 24, self.twin.server.block_size)  # its rows taken afresh
        ids = {r.id for r in self.rows if r.id is not None}
        for row in self.rows:
            if row.parent is not None and row.parent in ids:
                self._children.setdefault(row.parent, []).append(row)
            else:
                self._push(row.t / self.speed, "row", (row, 0.0))
        if self.autoscale:
            self._push(self.autoscale.interval_s, "tick", None)
        if self.poll_s:
            self._push(self.poll_s, "poll", None)

    @property
    def done(self) -> bool:
        """Nothing left to play: every request answered or skipped (or never to be run)."""
        if self._fast is not None:
            return self._fast.over or not self._fast.events_left
        return self._over or not self._heap

    def run_until(self, until: float, label: str = "", progress: Callable[[str], None] | None = None) -> None:
        """Play the events due at or before ``until`` (virtual seconds): the same run, however
        it is cut, as every change comes from an event in its turn."""
        if self._fast is not None:
            self._run_compiled(until)
            return
        total = len(self.rows)
        while self._heap and not self._over and self._heap[0][0] <= until:
            at, _, kind, obj = heapq.heappop(self._heap)
            self.now = max(self.now, at)
            if kind not in TIMERS:
                self._moving -= 1
            if kind == "row":
                assert isinstance(obj, tuple)
                row, held = obj
                self._send(row, held)
            elif kind == "add":
                assert isinstance(obj, tuple)
                idx, req = obj
                rep = self.replicas[idx]
                rep.engine.add(req)
                self._kick(rep)
            elif kind == "step":
                assert isinstance(obj, int)
                rep = self.replicas[obj]
                rep.step_end = None
                eng = rep.engine
                decodes, prefills = eng._pending
                eng.complete(decodes, prefills, self.now)
                self._kick(rep)
                self._stop_if_empty(rep)
                for other in self.replicas:  # a finished request may release a follow-up elsewhere
                    if other is not rep:
                        self._kick(other)
            elif kind == "ready":
                assert isinstance(obj, int)
                self._mark()
                self._kick(self.replicas[obj])
            elif kind == "poll" and self.poll_s:
                ready = [r for r in self.replicas if r.ready(self.now)]
                self.polls.append(
                    (
                        self.now,
                        sum(len(r.engine.waiting) for r in ready),
                        sum(len(r.engine.running) for r in ready),
                        max((r.engine.kv_usage for r in ready), default=0.0),
                    )
                )
                left = total - len(self.samples) - self.skipped
                if left > 0 and not self._moving and all(r.step_end is None for r in self.replicas):
                    # nothing in flight, nothing to come, requests unanswered: they can never run,
                    # and waiting on them re-armed this poll for ever (issue 74)
                    self.stalled = left
                    self.skipped += left
                    self._over = True
                    break
                if left > 0:
                    self._push(self.now + self.poll_s, "poll", None)
            elif kind == "tick" and self.autoscale is not None:
                if len(self.samples) + self.skipped < total:
                    self._tick()
                    self._push(self.now + self.autoscale.interval_s, "tick", None)
                    if progress and int(self.now) % 300 < self.autoscale.interval_s:
                        progress(f"{label}: {self.now / 60:.0f} min of the trace")

    def _run_compiled(self, until: float) -> None:
        """:meth:`run_until` by the compiled engine: its samples, polls and counts where the
        Python loop would have put them."""
        fast = self._fast
        assert fast is not None
        if not fast.run_until(until):
            raise RuntimeError(
                "the compiled replay reached a state the engine cannot (a bug: SPOC_REPLAY_ENGINE=python)"
            )
        if fast.now > self.now:
            self.now = fast.now
        self.samples.extend(fast.new_samples(self.step))
        self.polls.extend(fast.new_polls())
        self.skipped, self.too_big, self.stalled = fast.counts()
        self._over = fast.over
        fast.counters()

    def result(self, label: str = "") -> FleetRun:
        """The run as played so far (its whole when :attr:`done`)."""
        end = self.now
        secs = sum((r.stopped if r.stopped is not None else end) - r.started for r in self.replicas)
        return FleetRun(
            label,
            self.samples,
            secs,
            end,
            self.skipped,
            max((n for _, n in self.timeline), default=0),
            self.timeline,
        )


@dataclass(frozen=True)
class FleetResult:
    run: FleetRun
    step: StepSummary
    """The whole trace judged as one open-loop step (figures with their intervals, the verdict)."""
    attainment: float | None
    """Share of requests that met every per-request limit (TTFT, E2E, TPOT)."""

    def as_dict(self) -> dict[str, object]:
        s = self.step
        return {
            "config": self.run.label,
            "requests": s.requests,
            "skipped": self.run.skipped,
            "decision": s.decision,
            "slo_attainment": self.attainment,
            "ttft_p50": s.latency.ttft.p50,
            "ttft_p99": s.latency.ttft.p99,
            "itl_p99": s.latency.itl.p99,
            "e2e_p99": s.latency.e2e.p99,
            "replica_hours": self.run.replica_hours,
            "peak_replicas": self.run.peak_replicas,
            "span_s": self.run.span_s,
            "timeline": [list(t) for t in self.run.timeline],
        }


def judge_run(run: FleetRun, limits: Sequence[Limit]) -> FleetResult:
    step = summarize_step(1, 1, run.samples, max(run.span_s, 1e-9), limits, open_loop=True)
    good = step.goodput * max(run.span_s, 1e-9)
    return FleetResult(run, step, good / step.requests if step.requests else None)


def cheapest(results: Sequence[FleetResult]) -> FleetResult | None:
    """The fewest replica-hours among the configurations whose whole-trace figures meet the SLA."""
    ok = [r for r in results if r.step.decision == "meets"]
    return min(ok, key=lambda r: r.run.replica_hours) if ok else None


@dataclass(frozen=True)
class FleetPlan:
    """A trace on fixed replica counts and autoscaling policies, each judged against the SLA
    (``spoc plan --twin --trace``)."""

    results: tuple[FleetResult, ...]
    best: FleetResult | None
    """:func:`cheapest` of them."""
    seconds: float
    """Wall time the predictions took."""


def plan_fleet(
    twin: Twin,
    rows: Sequence[TraceRow],
    speed: float,
    counts: Sequence[int],
    policies: Sequence[Autoscale],
    limits: Sequence[Limit],
    say: Callable[[str], None] | None = None,
) -> FleetPlan:
    """``rows`` at ``speed`` on ``counts`` replicas of ``twin``, then under each of ``policies``,
    judged against ``limits``; ``say``: the configuration about to run. (``spoc plan`` checks
    the speed before it reads the trace.)"""
    import time

    t0 = time.perf_counter()
    configs: list[tuple[str, int | None, Autoscale | None]] = [
        (f"{n} replica{'s' if n > 1 else ''}", n, None) for n in counts
    ]
    configs += [(f"autoscale {a.describe()}", None, a) for a in policies]
    results = []
    for label, n, policy in configs:
        if say is not None:
            say(label)
        run = FleetSim(twin, rows, speed, replicas=n, autoscale=policy).run(label)
        results.append(judge_run(run, limits))
    return FleetPlan(tuple(results), cheapest(results), time.perf_counter() - t0)
