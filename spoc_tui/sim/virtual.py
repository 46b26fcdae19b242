"""The simulated engine driven in simulated time: closed-loop users of a workload profile, with
no HTTP and no wall clock, so a minute of load costs a fraction of a second.

The same :class:`~spoc_tui.sim.engine.SimEngine` that serves ``spoc sim`` over HTTP runs here
iteration by iteration; time jumps to the end of each iteration (its duration from the
roofline), and requests join at the next iteration boundary, as they join vLLM's scheduler.
Users draw conversations from the profile as the load generator does (a shared system prompt,
a growing history, think time between turns), so prefix caching and queueing behave as under
a real ramp. The GPUs' thermal model is not stepped (clocks stay at their maximum).

What uses it: the knee-search benchmark (many seeds and profiles, each searched by the
inference-driven search and by the old doubling and bisection, against a long reference run).
"""

from __future__ import annotations

import heapq
import math
import operator
import random
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from spoc_tui.core.ramp.steps import RequestSample
from spoc_tui.sim.engine import EngineConfig, SimEngine, SimRequest, tokenize
from spoc_tui.sim.prefix import BlockHash
from spoc_tui.workload import Workload, jitter

TEMPLATE_TOKENS = 4
"""Chat-template tokens around each message (as the simulator's server counts them)."""


@dataclass(frozen=True, slots=True)
class SentRequest:
    """A request as a virtual server sent it, enough to send it again unchanged (a trace's row
    with its very tokens: the same prompt, prefix and all, the same answer)."""

    at: float
    """When it was sent (the server's clock)."""
    prompt: tuple[int, ...]
    max_tokens: int
    target_tokens: int
    out_seed: int
    conversation: str
    """Its conversation: a replay holds each turn until the one before has ended."""


@dataclass
class _Turn:
    user_tokens: int
    output_tokens: int
    think_s: float


@dataclass
class _User:
    idx: int
    rng: random.Random
    history: list[int] = field(default_factory=list)
    turns: list[_Turn] = field(default_factory=list)
    turn: int = 0
    conversation: int = 0
    start: float = 0.0
    tokens: list[float] = field(default_factory=list)
    busy: bool = False
    """A request in flight or a next turn scheduled."""
    last_s: float | None = None
    """How long its last request took (None before its first), for the ramp's jitter."""
    waited: bool = False
    """This turn's jitter is behind it."""
    open: bool = False
    """An open-loop conversation: its turns are sent at arrivals, not after think time."""
    in_flight: bool = False
    """Its request is on its way to the engine or in it."""
    answered: float | None = None
    """When its last answer ended (None before its first, or once stopped)."""
    asked: float = 0.0
    """The waits its profile asked since (think time, jitter)."""
    since: float | None = None
    asked_sent: float | None = None
    """Its request in flight: sent this long after its last answer, the profile having asked
    ``asked_sent`` of it (the sample's ``since_answer`` and ``asked_wait``)."""
    keys: list[BlockHash] | None = None
    """The prefix cache's keys of its conversation's leading blocks so far (its last turn's prompt
    and answer, which its next prompt begins with: :attr:`SimRequest.keys`)."""


def draw_turns(workload: Workload, rng: random.Random, context_len: int | None) -> tuple[int, list[_Turn]]:
    """One conversation drawn from a profile: its system prompt's length and its turns."""
    if workload.mix:
        x, acc = rng.random(), 0.0
        for sub, w in workload.mix:
            acc += w
            if x <= acc:
                return draw_turns(sub, rng, context_len)
        return draw_turns(workload.mix[-1][0], rng, context_len)
    if workload.replay:
        conv = rng.choice(workload.replay)
        out, think = workload.output_tokens, workload.think_s
        return 0, [_Turn(len(tokenize(u)), m or max(1, round(out.sample(rng))), think.sample(rng)) for u, m in conv]
    n = max(1, round(workload.turns.sample(rng)))
    turns = []
    for i in range(n):
        dist = workload.first_user_tokens if i == 0 and workload.first_user_tokens else workload.user_tokens
        turns.append(
            _Turn(
                max(1, round(dist.sample(rng, context_len))),
                max(1, round(workload.output_tokens.sample(rng, context_len))),
                workload.think_s.sample(rng),
            )
        )
    return workload.system_tokens, turns


@dataclass(slots=True)
class _Resent:
    """A request sent again (:meth:`VirtualServer.resend`): when it is due, when it went, its
    tokens as they come, and the next turn of its conversation, held until it ends."""

    sent: SentRequest
    index: int
    due: float
    start: float = 0.0
    tokens: list[float] = field(default_factory=list)
    child: _Resent | None = None
    slotted: bool = False
    """Sent at an instant of :meth:`VirtualServer.resend_as_users` (its ``due`` that instant)."""


def _linked(rows: Sequence[_Resent], turns_wait: bool = True) -> list[_Resent]:
    """Each conversation's turns in ``rows`` chained in their order (a turn the ``child`` of the
    one before it, sent when that one's answer ends); the rows that wait for none: every first
    turn, or every row where ``turns_wait`` is false."""
    latest: dict[str, _Resent] = {}
    free: list[_Resent] = []
    for row in rows:
        parent = latest.get(row.sent.conversation) if turns_wait else None
        if parent is not None:
            parent.child = row
        else:
            free.append(row)
        latest[row.sent.conversation] = row
    return free


def _token_ids(rng: random.Random, n: int) -> list[int]:
    """``n`` of ``rng.randrange(1 << 24)``, the same draws by the same steps (25 random bits,
    drawn again while over the range), without its two calls a draw: a user's new text was a
    tenth of a prediction's CPU."""
    bits = rng.getrandbits
    out = []
    for _ in range(n):
        r = bits(25)
        while r >= 16_777_216:
            r = bits(25)
        out.append(r)
    return out


def _checked() -> bool:
    a, b = random.Random(5), random.Random(5)
    return _token_ids(a, 64) == [b.randrange(1 << 24) for _ in range(64)] and a.random() == b.random()


token_ids = _token_ids if _checked() else (lambda rng, n: [rng.randrange(1 << 24) for _ in range(n)])
"""Random token ids for a user's text (:func:`_token_ids` where this Python's ``randrange`` draws
so; else ``randrange`` itself)."""


def gaps(times: list[float]) -> tuple[float, ...]:
    """The gaps between consecutive times (each ``b - a``, as floats: the same as NumPy's
    ``diff``, at half its cost for an answer's 170 tokens and a quarter for ten)."""
    return tuple(map(operator.sub, times[1:], times))


Answer = tuple[str | None, int, int, int]
"""A request's end as its figures: its finish reason, tokens generated, prompt tokens and cached
prompt tokens (a compiled replay's, :mod:`spoc_tui.twin.fastreplay`)."""


def client_sample(
    r: SimRequest | Answer,
    start: float,
    times: list[float],
    end: float,
    *,
    users: int,
    conversation: str,
    step: int = 0,
    turn: int = 0,
    last: bool | None = None,
    trace_index: int | None = None,
    scheduled: float | None = None,
    held_s: float | None = None,
    cut_counts: bool = True,
    since_answer: float | None = None,
    asked_wait: float | None = None,
    itl: tuple[float, ...] | None = None,
) -> RequestSample:
    """What a client saw of ``r`` (a request, or its :data:`Answer`), sent at ``start``, its tokens
    at ``times`` (``itl``: the gaps between them where worked out already), ended at ``end`` (an
    abort, or no token, is a failed request). A trace's row: ``trace_index``, its due time
    ``scheduled`` and ``held_s`` how long it waited for its previous turn. ``cut_counts``: an answer
    that reached ``max_tokens`` is counted cut; not where every answer is asked for exactly its
    length (a twin's replay), where reaching it says nothing."""
    if isinstance(r, SimRequest):
        finish_reason, generated, prompt_tokens, cached_tokens = (
            r.finish_reason,
            r.generated,
            len(r.prompt),
            r.cached_tokens,
        )
    else:
        finish_reason, generated, prompt_tokens, cached_tokens = r
    ok = finish_reason != "abort" and bool(times)
    return RequestSample(
        start=start,
        step=step,
        users=users,
        ok=ok,
        ttft=times[0] - start if ok else None,
        e2e=times[-1] - start if ok else None,
        itl=gaps(times) if itl is None else itl,
        output_tokens=generated,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        error=None if ok else "http_4xx",
        conversation=conversation,
        end=end,
        cut=(finish_reason == "length" if ok else None) if cut_counts else None,
        turn=turn,
        last=last,
        trace_index=trace_index,
        scheduled=scheduled,
        held_s=held_s,
        since_answer=since_answer,
        asked_wait=asked_wait,
    )


class VirtualServer:
    """A simulated server under ``users`` closed-loop users, advanced in simulated time.

    Each :meth:`advance` runs on from where the last one stopped (the same users, the same warm
    prefix cache), so a step measured longer is the same step continued.
    """

    def __init__(
        self,
        engine: SimEngine | EngineConfig,
        workload: Workload,
        users: int,
        seed: int = 0,
        lockstep: bool = False,
        spread_s: float = 5.0,
        ignore_eos: bool | None = None,
        paced: bool = False,
        gpus: bool = False,
        record: bool = False,
    ) -> None:
        """
        Args:
            engine: a fresh engine (its clock is taken over), or the configuration of one.
            lockstep: every user restarts at once at each :meth:`set_users` (the peers' probes,
                ``spoc ramp --arrivals lockstep``: thinking stops, the requests in flight end,
                then all send their next turn together); else new users' starts are spread
                evenly over ``spread_s`` seconds, as a ramp spawns users in its warm-up.
            ignore_eos: every answer as long as the profile drew it (None: as the workload says;
                without it the simulated model stops early, as ``spoc sim`` does over HTTP).
            paced: each turn waits the load generator's jitter first, as ``spoc ramp``'s users do
                (:func:`~spoc_tui.workload.jitter`: up to a second before a user's first turn,
                a little before a turn without think time; none in lockstep).
            gpus: the simulated GPUs heat, draw power and count energy on the virtual clock, as
                ``spoc sim``'s do in real time (what a monitor reads of its exporter); off, they
                stay as built, as ramps and predictions have always run.
            record: keep every request sent (:attr:`sent`), for :meth:`resend` on another server
                (``spoc ramp --trace T --speed s`` of the traffic it served, in virtual time).
        """
        self.paced = paced
        self.gpus = gpus
        self.rate = 0.0
        self._next_arrival: float | None = None
        self._idle: list[_User] = []
        """Open loop: conversations with turns left and nothing in flight."""
        self._pending: list[tuple[float, int, SimRequest]] = []
        """Requests on their way to the engine (its time outside the engine, a twin's)."""
        self.now = 0.0
        self.engine = engine if isinstance(engine, SimEngine) else SimEngine(engine)
        self.engine.clock = lambda: self.now
        self.workload = workload
        self.ignore_eos = workload.ignore_eos if ignore_eos is None else ignore_eos
        self.rng = random.Random(seed * 1_000_003 + users)
        self.samples: list[RequestSample] = []
        self.sent: list[SentRequest] | None = [] if record else None
        """With ``record``: the requests sent, in order."""
        self._slots: deque[float] = deque()
        """:meth:`resend_as_users`: the instants still to come, each sending one request."""
        self._ready: list[tuple[int, _Resent]] = []
        """:meth:`resend_as_users`: the requests free to go (a first turn, or the next turn of a
        conversation whose last answer has ended), earliest in the trace first."""
        self._owed: deque[float] = deque()
        """:meth:`resend_as_users`: instants that came while no request was free to go."""
        self._heap: list[tuple[float, int, int]] = []
        self._seq = 0
        self._users: list[_User] = []
        self._active = 0
        self._system: dict[int, list[int]] = {}
        self._holding = False
        """Lockstep: a step's cohort waits for the requests in flight to end."""
        self._level_at = 0.0
        """When the load was last set (:meth:`stale`)."""
        self.lockstep = lockstep
        self.spread_s = spread_s
        self.set_users(users)

    @property
    def users(self) -> int:
        return self._active

    def set_users(self, n: int) -> None:
        """Change the number of users from now: new ones start spread over ``spread_s``; users
        beyond ``n`` stop after their request in flight. In lockstep every user restarts at once
        (as :class:`spoc_tui.load.runner.Cohort` restarts ``spoc ramp``'s)."""
        self._level_at = self.now
        while len(self._users) < n:
            self._users.append(_User(len(self._users), random.Random(self.rng.random())))
        if self.lockstep:
            self._active = n
            self._heap = []  # only closed-loop users wait in it: those thinking stop
            self._holding = True
            self._release()
            return
        starting = [u for u in self._users[:n] if not u.busy]
        for k, u in enumerate(starting):
            at = self.now + (0.0 if self.lockstep else self.spread_s * k / len(starting))
            u.busy = True
            self._push(at, u.idx)
        self._active = n

    def set_rate(self, rate: float) -> None:
        """Open loop from now (as ``spoc ramp --rate``): Poisson arrivals at ``rate`` requests/s,
        each the next turn of an idle conversation (picked at random) or of a new one, sent at
        once whatever is in flight; no think time, no jitter. 0 stops the arrivals."""
        self.rate = rate
        self._level_at = self.now
        self._next_arrival = self.now + self.rng.expovariate(rate) if rate > 0 else None

    def _release(self) -> None:
        """Lockstep: once nothing is in flight, every user sends its next turn now, together."""
        if not self._holding or any(u.in_flight for u in self._users):
            return
        self._holding = False
        for u in self._users:
            if u.open:
                continue
            if u.idx < self._active:
                u.busy = True
                self._push(self.now, u.idx)
            else:
                u.busy = False

    def _arrive(self, at: float) -> None:
        if self._idle:
            u = self._idle.pop(self.rng.randrange(len(self._idle)))
        else:
            u = _User(len(self._users), random.Random(self.rng.random()), open=True)
            self._users.append(u)
        u.busy = True
        self._send(u, at)

    def _push(self, at: float, idx: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, idx))

    def _system_ids(self, n: int) -> list[int]:
        if n not in self._system:
            r = random.Random(zlib.crc32(f"system:{n}".encode()))
            self._system[n] = token_ids(r, n)
        return self._system[n]

    def _send(self, u: _User, at: float) -> None:
        """``u``'s next turn, sent at ``at``: when its think time ended or its arrival was due, which
        may lie inside the engine step that just ran (the users are read between steps). The
        request counts from then, and reaches the engine its time outside later, at the step
        boundary after that: a request a real server is sent mid-step waits for the step to end
        (counted from the boundary instead, TTFT read that wait short, 13 ms against the real-time
        simulator's 25 ms on chat turns; and a twin's time outside, however short, then waited a
        whole step: 29 ms)."""
        if not u.open and u.idx >= self._active:  # stopped while thinking
            u.busy, u.answered = False, None
            return
        if u.turn >= len(u.turns):
            system, u.turns = draw_turns(self.workload, u.rng, self.engine.max_len)
            u.turn, u.conversation = 0, u.conversation + 1
            u.history = self._system_ids(system) + [0] * TEMPLATE_TOKENS if system else []
            u.keys = None
        t = u.turns[u.turn]
        if self.paced and not u.waited and not u.open:
            wait = jitter(u.rng, u.last_s, self.lockstep)
            if wait > 0:
                u.waited = True
                u.asked += wait
                self._push(at + wait, u.idx)
                return
        u.waited = False
        if u.open or u.answered is None:
            u.since = u.asked_sent = None
        else:  # as the load generator's users say it (a virtual client adds no delay of its own)
            u.since, u.asked_sent = at - u.answered, None if self.lockstep else u.asked
        u.history = u.history + token_ids(u.rng, t.user_tokens) + [0] * TEMPLATE_TOKENS
        room = self.engine.max_len - len(u.history) - 1
        if room < 1:  # the conversation outgrew the context: start a new one
            u.turn = len(u.turns)
            if u.open:
                self._send(u, at)
            else:
                self._push(at, u.idx)
            return
        max_tokens = min(t.output_tokens, room)
        u.start, u.tokens = at, []
        delay = self.engine.outside_s(len(u.history))
        req = SimRequest(
            rid=f"u{u.idx}-{u.conversation}-{u.turn}",
            prompt=list(u.history),
            keys=u.keys,
            max_tokens=max_tokens,
            target_tokens=max_tokens if self.ignore_eos else self.engine.sample_output_len(max_tokens),
            arrival=at + delay,
            times=u.tokens,
            on_finish=partial(self._finished, u),
            out_seed=u.rng.randrange(1 << 30),
        )
        if not u.open:
            u.in_flight = True
        if self.sent is not None:
            conv = f"u{u.idx}-{u.conversation}"
            self.sent.append(SentRequest(at, tuple(req.prompt), max_tokens, req.target_tokens, req.out_seed, conv))
        self._enqueue(req, at + delay)

    def _enqueue(self, req: SimRequest, arrival: float) -> None:
        if arrival > self.now:
            self._seq += 1
            heapq.heappush(self._pending, (arrival, self._seq, req))
        else:
            self.engine.add(req)

    def resend(self, requests: Sequence[SentRequest], speed: float = 1.0, turns_wait: bool = True) -> float:
        """Send ``requests`` (another server's :attr:`sent`) again from now, ``speed`` times as
        fast (each due at its time after the first's over ``speed``), as ``spoc ramp --trace T
        --speed s`` replays a trace. ``turns_wait``: a turn waits for its conversation's previous
        turn to end (its prompt holds that answer), then goes when due or at once if that has
        passed (the wait is its sample's ``held_s``), as a trace with sessions replays; else every
        request goes when due, as the rows of a trace without sessions do (the rate then ``speed``
        times the first's, whatever the server's pace). Returns when the last is due."""
        if speed <= 0:
            raise ValueError(f"speed must be above 0, got {speed}")
        t0 = requests[0].at if requests else 0.0
        rows = [_Resent(r, k, self.now + (r.at - t0) / speed) for k, r in enumerate(requests)]
        for row in _linked(rows, turns_wait):
            self._resend(row, row.due)
        return max((row.due for row in rows), default=self.now)

    def resend_as_users(self, requests: Sequence[SentRequest], speed: float = 1.0) -> float:
        """Send ``requests`` again from now as their users would send them ``speed`` times as
        often: the instants they were sent at, ``speed`` times closer, each sending one of them;
        at each instant the earliest (in the trace) that is free to go, a conversation's first
        turn or the next turn of one whose last answer has ended. So the rate is ``speed`` times
        the first's with the same bursts, the requests are these very ones (prompts, cached
        history, answers), and no turn goes before the answer it quotes has ended, as in the
        open-loop process that sent them (:meth:`set_rate`: an arrival is the next turn of an idle
        conversation, or a new one). An instant that finds none free waits for the next answer to
        end (the sample's ``held_s``). Returns the last instant."""
        if speed <= 0:
            raise ValueError(f"speed must be above 0, got {speed}")
        order = sorted(range(len(requests)), key=lambda k: requests[k].at)
        t0 = requests[order[0]].at if requests else 0.0
        rows = [_Resent(requests[k], k, self.now + (requests[k].at - t0) / speed, slotted=True) for k in order]
        self._slots.extend(row.due for row in rows)
        for row in _linked(rows):
            heapq.heappush(self._ready, (row.index, row))
        return self._slots[-1] if self._slots else self.now

    def _slot(self, at: float, late: bool = False) -> None:
        """An instant of :meth:`resend_as_users` (``at``): the earliest request free to go goes
        then (``late``: now, the instant having waited for an answer to end), or the instant
        waits for one."""
        if self._ready:
            _, row = heapq.heappop(self._ready)
            row.due = at
            self._resend(row, self.now if late else at)
        else:
            self._owed.append(at)

    def _resend(self, row: _Resent, at: float) -> None:
        r = row.sent
        row.start = at
        req = SimRequest(
            rid=f"r{row.index}",
            prompt=list(r.prompt),
            max_tokens=r.max_tokens,
            target_tokens=r.target_tokens,
            arrival=at + self.engine.outside_s(len(r.prompt)),
            times=row.tokens,
            on_finish=partial(self._resent, row),
            out_seed=r.out_seed,
        )
        self._seq += 1  # through the pending queue: an answer's end may send the next turn mid-step
        heapq.heappush(self._pending, (req.arrival, self._seq, req))

    def _resent(self, row: _Resent, r: SimRequest) -> None:
        held = row.start - row.due
        self.samples.append(
            client_sample(r, row.start, row.tokens, self.now, users=0, conversation=row.sent.conversation,
                          trace_index=row.index, scheduled=row.due, held_s=held if held > 0 else None)
        )  # fmt: skip
        child = row.child
        if child is None:
            return
        if not child.slotted:
            self._resend(child, max(self.now, child.due))
            return
        heapq.heappush(self._ready, (child.index, child))
        if self._owed:
            self._slot(self._owed.popleft(), late=True)

    def _finished(self, u: _User, r: SimRequest) -> None:
        self.samples.append(
            client_sample(r, u.start, u.tokens, self.now, users=self._active, conversation=f"u{u.idx}-{u.conversation}",
                          turn=u.turn, last=u.turn == len(u.turns) - 1, since_answer=u.since, asked_wait=u.asked_sent)
        )  # fmt: skip
        u.answered, u.asked = self.now, 0.0
        t = u.turns[u.turn]
        u.last_s = self.now - u.start
        u.history = u.history + r.output_ids() + [0] * TEMPLATE_TOKENS
        u.keys = r.keys  # its next prompt begins with this one and its answer
        u.turn += 1
        if u.open:
            u.busy = False
            if u.turn < len(u.turns):
                self._idle.append(u)
            return
        u.in_flight = False
        if self._holding:  # lockstep: this user waits for the step's cohort (_release starts it)
            self._release()
            return
        if u.idx >= self._active:
            u.busy, u.answered = False, None
            return
        # spoc ramp's users think after every turn, the last of a conversation too (paced); the
        # benchmark's plain users start their next conversation at once
        think = t.think_s if self.paced or u.turn < len(u.turns) else 0.0
        u.asked = think
        self._push(self.now + think, u.idx)

    def advance(self, until: float) -> None:
        """Run the engine and the users on to simulated time ``until``."""
        eng = self.engine
        while self.now < until:
            while self._heap and self._heap[0][0] <= self.now:
                at, _, idx = heapq.heappop(self._heap)
                self._send(self._users[idx], at)
            while self._next_arrival is not None and self._next_arrival <= self.now:
                self._arrive(self._next_arrival)
                self._next_arrival += self.rng.expovariate(self.rate)
            while self._slots and self._slots[0] <= self.now:
                self._slot(self._slots.popleft())
            while self._pending and self._pending[0][0] <= self.now:
                eng.add(heapq.heappop(self._pending)[2])
            if eng.idle():
                nxt = self._next_event()
                self._idle_to(until if nxt is None else min(until, max(self.now, nxt)))
                if nxt is None:
                    break
                continue
            if not self.gpus and eng.decode_run(until, self._horizon, self._clock_to).steps:
                continue  # the decode steps up to the next event, at once
            dur = eng.step()
            decodes, prefills = eng._pending
            if not eng.stepping():  # nothing could be scheduled: wait for the next arrival
                nxt = self._next_event()
                self._idle_to(min(until, nxt) if nxt is not None else until)
                continue
            self.now += dur
            eng.busy_s += dur
            eng.complete(decodes, prefills, self.now)
            if self.gpus:  # as the engine's real-time loop: a prefill-heavy step draws more power
                n_prefill = sum(n for _, n in prefills)
                eng.step_gpus(dur / eng.cfg.speed, 1.0, 0.72 + 0.28 * min(1.0, n_prefill / 2048))

    def _horizon(self) -> float:
        nxt = self._next_event()
        return math.inf if nxt is None else nxt

    def _clock_to(self, t: float) -> None:
        self.now = t

    def _idle_to(self, t: float) -> None:
        """Nothing to run until ``t``: the clock moves on, and the GPUs (when stepped) idle."""
        if self.gpus and t > self.now:
            self.engine.step_gpus((t - self.now) / self.engine.cfg.speed, 0.0, 0.0)
        self.now = t

    def stale(self) -> int:
        """Requests in flight that were sent before the load was last set."""
        return sum(1 for u in self._users if (u.in_flight or (u.open and u.busy)) and u.start < self._level_at)

    def drain(self, most_s: float) -> float:
        """After a step down, run on until the requests the earlier levels sent have ended (read
        once a second, as ``spoc ramp`` reads its load generator), at most ``most_s``: the
        seconds it took (as :func:`spoc_tui.load.ramp._drain` waits)."""
        t0 = self.now
        while self.stale() and self.now < t0 + most_s - 1e-9:
            self.advance(min(t0 + most_s, self.now + 1.0))
        return self.now - t0

    def _next_event(self) -> float | None:
        times = [h[0][0] for h in (self._heap, self._pending) if h]
        if self._slots:
            times.append(self._slots[0])
        if self._next_arrival is not None:
            times.append(self._next_arrival)
        return min(times) if times else None

    def window(self, start: float, end: float, sent_from: float = -math.inf) -> list[RequestSample]:
        """The requests that finished inside [start, end] (a step's window counts them so), of
        those sent at or after ``sent_from`` (a step's: when its level was set; a request the
        last level sent measures that level's load)."""
        return [s for s in self.samples if s.end is not None and start <= s.end <= end and s.start >= sent_from]
