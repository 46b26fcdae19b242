"""The Locust side of a load ramp, run as a child process: ``python -m spoc_tui.load.runner``.

Locust monkey-patches the whole process with gevent on import, which breaks asyncio, so it
never runs in the Textual process. This child speaks JSON lines: the commands and events of
:mod:`spoc_tui.load.wire`, commands on stdin, events (a ``Sample`` per finished request) on stdout.

One Locust user is one conversation (with its history growing turn by turn); with
``--open-loop`` each user instead generates Poisson arrivals (:class:`RateUser`). Requests use
Locust's ``FastHttpUser`` (geventhttpclient: a third of the CPU per request that ``HttpUser``'s
requests/urllib3 takes, which a burst of 32 users starting requests at once queued ahead of the
last one's first byte) and SSE read line by line as each arrives, so every event is
timestamped when it is read.

With ``--expect-workers N`` it becomes a Locust master and the workers (``--worker``, local
or ``spoc load-worker --master HOST`` on other machines) send their samples to it over
Locust's own master/worker messages.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from typing import Any

from gevent import monkey

monkey.patch_all()

import gevent
import gevent.event
import gevent.pool
import gevent.ssl
from gevent.fileobject import FileObjectPosix
from locust import constant, task
from locust import runners as locust_runners
from locust.env import Environment
from locust.runners import MasterRunner

from spoc_tui.core.metrics.sse import StreamTally
from spoc_tui.core.ramp.steps import RequestSample
from spoc_tui.core.ramp.steps.client import SILENT_S
from spoc_tui.core.traces.read import TraceError, TraceRow, TraceSource
from spoc_tui.core.traces.replay import ReplayShare, release
from spoc_tui.load import wire
from spoc_tui.load.childstate import (
    OUT,
    Orphan,
    Replay,
    Shared,
    TraceJob,
    _Conversation,
    _StreamingUser,
    classify_error,
    emit,
    learn_lengths,
    orphaned,
    watch_parent,
    watch_self,
)
from spoc_tui.load.defaults import PoissonArrivals
from spoc_tui.workload import (
    TextMaker,
    TracePrompts,
    Workload,
    jitter,
    plan_conversation,
)


class Cohort:
    """``--arrivals lockstep``: each step restarts every user of this process at one instant, as
    the peers start every stream of a probe together (AIPerf, GuideLLM).

    At a step's command every user ends what it is doing: one thinking stops thinking, one with a
    request in flight lets it finish (never cut: an aborted request would count as an error). Each
    then waits at :meth:`join`; when every user of the process waits there (and the step's new
    users have all been spawned), all of them send their next turn at once. Without this, users
    added at a step started together but those of earlier steps kept their own phase, so the
    largest burst at 16 users was 8 (measured), where the peers' was 16. A drain that outlasts
    :data:`COHORT_DRAIN_S` (a request stuck minutes in a saturated server) releases the users that
    are waiting, and the rest join as their requests end."""

    gen = 0
    go = gevent.event.Event()
    """Set when the current step's cohort may start."""
    wake = gevent.event.Event()
    """Set at a step's command: wakes the users that are thinking."""
    waiting: set[int] = set()

    @classmethod
    def reset(cls) -> None:
        cls.gen, cls.waiting = 0, set()
        cls.go, cls.wake = gevent.event.Event(), gevent.event.Event()
        cls.go.set()

    @classmethod
    def next(cls, runner: Any, expected: int | None) -> None:
        """A new step: the users of this process restart together (``expected`` of them where this
        process runs all the users; a Locust worker does not know its share, and waits until the
        count of its users stops changing)."""
        cls.gen += 1
        cls.waiting = set()
        old, cls.go = cls.go, gevent.event.Event()
        old.set()  # users still waiting for the last step's start join this one's (join loops)
        cls.wake.set()
        cls.wake = gevent.event.Event()
        gevent.spawn(cls._release, runner, cls.gen, expected)

    @classmethod
    def _release(cls, runner: Any, gen: int, expected: int | None) -> None:
        started = seen_at = time.perf_counter()
        seen = -1
        while gen == cls.gen and not cls.go.is_set():
            gevent.sleep(COHORT_POLL_S)
            now = time.perf_counter()
            count = int(runner.user_count)
            if count != seen:
                seen, seen_at = count, now
            spawned = count == expected if expected is not None else now - seen_at >= COHORT_SETTLE_S
            if (spawned and count > 0 and len(cls.waiting) >= count) or now - started > COHORT_DRAIN_S:
                cls.go.set()

    @classmethod
    def join(cls, user_id: int) -> int:
        """Wait for this step's cohort to start; returns the step's generation. A step that
        begins while the last one's cohort still waits (its drain outlasted the step) takes the
        waiting users into its own."""
        while True:
            gen, go = cls.gen, cls.go
            cls.waiting.add(user_id)
            try:
                go.wait()
            finally:
                cls.waiting.discard(user_id)  # a user stopped while it waits is no longer counted
            if gen == cls.gen:
                return gen

    @classmethod
    def think(cls, seconds: float) -> None:
        """Think, unless a step's command restarts the users first."""
        if seconds > 0:
            cls.wake.wait(seconds)


Cohort.reset()
WORKER_LIVENESS_BEATS = int(SILENT_S) + 5
"""Heartbeats (one a second) the master lets a worker miss before Locust drops it. Locust's own 3
dropped a worker its host starved for 4 s, and with the last one the whole test stopped: every
step after read 0 requests and the ramp passed. Longer than :data:`SILENT_S`, the parent's judge
of a silent process, so a stall that long ends the ramp with its reason."""
COHORT_POLL_S = 0.002
COHORT_SETTLE_S = 0.05
COHORT_DRAIN_S = 30.0


BACKOFF_S = (0.5, 30.0)
"""A failed request's conversation ends; its user waits 0.5 s, doubling with each failure in a row
up to 30 s, before the next conversation (so a dead server is not hammered)."""


MAX_IN_FLIGHT = 1024
"""Open loop: arrivals beyond this many requests in flight (per process) are not sent; each is
recorded as a failed request of kind ``client_limit`` (the server is far past its knee)."""


LAUNCH_WAIT_S = 0.005
"""How long a user that is about to plan and send a request waits, at most, for a quiet moment."""


def quiet_moment() -> None:
    """Wait (up to ``LAUNCH_WAIT_S``) until the event loop has read every stream whose bytes are
    waiting, and launch at most one request per turn of the loop.

    Planning a turn's text and sending it takes about 1 ms of this process's one core, and nothing
    else runs meanwhile. When 32 streams end in the same engine step, their users used to plan and
    send one after the other while the last ones' final tokens sat unread, which lengthened the
    ITL tail by milliseconds at every request end. Now the streams are read first, and one launch
    at a time lets the loop poll between two launches."""
    loop = gevent.get_hub().loop
    deadline = time.perf_counter() + LAUNCH_WAIT_S
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        with gevent.Timeout(left, False):
            gevent.idle()
        if loop.iteration != Shared.launched_in:
            Shared.launched_in = loop.iteration
            return


def send_chat(
    client: Any,
    messages: list[dict[str, str]],
    max_tokens: int,
    turn: int,
    conv_id: str,
    scheduled: float | None = None,
    last: bool | None = None,
    after: tuple[float, float | None] | None = None,
) -> tuple[str | None, float]:
    """One streamed chat request, every content chunk timestamped as it arrives; its sample goes to
    ``Shared.sink`` (``scheduled``: an open-loop arrival's time on its schedule, wall clock;
    ``last``: the conversation's last turn as planned; ``after``: a closed-loop user's previous
    answer's end, wall clock, and the wait its profile asked since, for the sample's
    ``since_answer`` and ``asked_wait``). Returns the answer's text (None when the request failed)
    and when its stream ended (wall clock)."""
    body = {
        "model": Shared.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if Shared.profile is not None and Shared.profile.ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension: every planned token, as vllm bench serve
    sample, answer = stream_request(client, "/v1/chat/completions", body, turn, conv_id)
    if scheduled is not None or last is not None or after is not None:
        since = sample.start - after[0] if after is not None else None
        asked = after[1] if after is not None else None
        sample = dataclasses.replace(sample, scheduled=scheduled, last=last, since_answer=since, asked_wait=asked)
    assert Shared.sink is not None
    Shared.sink(sample)
    usage_prompt = sample.prompt_tokens
    # (calibrate ignores exact lengths too; checked here first to skip counting the history's words)
    if sample.ok and usage_prompt and not Shared.maker.exact:
        planned = sum(len(m["content"].split()) for m in messages)
        Shared.maker.calibrate(planned, usage_prompt, overhead=4 * len(messages))
    return answer, sample.end if sample.end is not None else time.time()


def stream_request(
    client: Any, path: str, body: dict[str, Any], turn: int, conv_id: str
) -> tuple[RequestSample, str | None]:
    """One streamed request (chat or completions), every event with choices timestamped as it is
    read. Returns its sample and the answer's text (None when it failed)."""
    step = Shared.step
    Shared.in_flight[step] += 1
    try:
        return _stream_request(client, path, body, turn, conv_id)
    finally:
        Shared.in_flight[step] -= 1
        if not Shared.in_flight[step]:
            del Shared.in_flight[step]


def _stream_request(
    client: Any, path: str, body: dict[str, Any], turn: int, conv_id: str
) -> tuple[RequestSample, str | None]:
    # identity: a compressed stream would reach us in the compressor's blocks, not token by token
    headers = {"Accept-Encoding": "identity"}
    if Shared.api_key:
        headers["Authorization"] = f"Bearer {Shared.api_key}"
    step, users = Shared.step, Shared.users
    chat = path.endswith("chat/completions")
    wall0 = time.time()
    t0 = time.perf_counter()
    tally = StreamTally(chat=chat, keep_text=True)
    error: str | None = None
    try:
        with client.post(
            path,
            json=body,
            headers=headers,
            stream=True,
            catch_response=True,
            name="chat" if chat else "completions",
        ) as resp:
            if resp.status_code == 0:  # Locust's stand-in for a request that got no answer at all
                error = classify_error(resp.error) if resp.error is not None else "connect"
                resp.failure("no answer")
            elif resp.status_code != 200:
                error = f"http_{resp.status_code // 100}xx"
                resp.failure(f"HTTP {resp.status_code}")
            else:
                # geventhttpclient's response: readline hands back each line as soon as it is
                # complete, reading the socket only when no whole line is buffered
                raw = resp._response
                while True:
                    try:
                        line = raw.readline(b"\n")
                    except Exception as e:  # the connection broke or timed out mid-stream
                        error = "timeout" if classify_error(e) == "timeout" else "stream"
                        break
                    if not line:
                        break
                    # as vllm bench serve: every event with choices is a step of the stream (TTFT
                    # at the first, a gap at each next), text or not (:mod:`spoc_tui.core.metrics.sse`)
                    tally.feed(line, time.perf_counter())
                if error is not None:
                    resp.failure(f"stream broke: {error}")
                elif not tally.done:
                    error = "stream"
                    resp.failure("stream ended without [DONE]")
                else:
                    resp.success()
    except Exception as e:  # anything the client raised outside the stream
        error = classify_error(e)
    end = time.perf_counter()
    ok = error is None
    first, last = tally.first, tally.last
    sample = RequestSample(
        start=wall0,
        end=wall0 + (end - t0),
        step=step,
        users=users,
        # A stream that completed with no text (EOS first) is a finished request without a TTFT.
        ok=ok,
        error=error,
        ttft=(first - t0) if first is not None else None,
        e2e=(last if last is not None else end) - t0,  # to the last token event, as vllm bench serve
        itl=tally.gaps,
        output_tokens=tally.completion_tokens,
        prompt_tokens=tally.prompt_tokens,
        cached_tokens=tally.cached_tokens,
        request_id=tally.request_id,
        conversation=conv_id,
        turn=turn,
        cut=(tally.finish_reason == "length") if ok and tally.finish_reason else None,
    )
    return sample, (tally.text if ok else None)


class ChatUser(_StreamingUser):
    """One conversation: a system prompt, then turns whose history grows, with think time."""

    wait_time = constant(0)

    def on_start(self) -> None:
        Shared.counter += 1
        self.rng = random.Random(Shared.seed * 1_000_003 + Shared.counter + os.getpid())
        self.conv_id = f"{os.getpid()}-{Shared.counter}"
        self.failures = 0
        self.last_s: float | None = None
        """How long this user's last request took (None before its first: see :func:`jitter`)."""
        self.answered: float | None = None
        """When this user's last answer's stream ended (wall clock; None before its first)."""
        self.asked = 0.0
        """The waits its profile asked since (think time, jitter)."""
        self.gen = -1
        """The step whose cohort this user started with (``--arrivals lockstep``: :class:`Cohort`)."""

    @task
    def converse(self) -> None:
        assert Shared.profile is not None
        plan = plan_conversation(Shared.profile, self.rng, Shared.maker, Shared.context_len, Shared.system_cache)
        messages: list[dict[str, str]] = []
        if plan.system_text:
            messages.append({"role": "system", "content": plan.system_text})
        self.conv_id = f"{self.conv_id.split('#')[0]}#{self.rng.randrange(1 << 30):x}"
        for i, turn in enumerate(plan.turns):
            if Shared.lockstep:
                if self.gen != Cohort.gen:
                    self.gen = Cohort.join(id(self))
            else:
                wait = jitter(self.rng, self.last_s)
                self.asked += wait
                if wait:
                    gevent.sleep(wait)
            quiet_moment()
            messages.append({"role": "user", "content": turn.user_text})
            t0 = time.perf_counter()
            last = i == len(plan.turns) - 1
            after = (self.answered, None if Shared.lockstep else self.asked) if self.answered is not None else None
            answer, self.answered = send_chat(self.client, messages, turn.max_tokens, i, self.conv_id, last=last,
                                              after=after)  # fmt: skip
            self.asked = 0.0
            self.last_s = time.perf_counter() - t0
            if answer is None:  # a failed turn ends the conversation; back off, then start a new one
                self.failures += 1
                self.answered = None  # the back-off is not a wait the profile asked
                gevent.sleep(min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (self.failures - 1)))
                return
            self.failures = 0
            messages.append({"role": "assistant", "content": answer})
            self.asked += plan.think_s[i]
            if Shared.lockstep:
                Cohort.think(plan.think_s[i])
            else:
                gevent.sleep(plan.think_s[i])


class RateUser(_StreamingUser):
    """Open loop: Poisson arrivals at ``Shared.rate / Shared.users`` requests/s from this user (the
    users of all processes together make the step's rate). Each arrival is sent at once, whatever
    is in flight, as the next turn of an idle conversation (picked at random) or of a new one, so
    conversations still grow and share prefixes; there is no think time, the arrivals are the
    pacing. Arrival times follow an absolute schedule, so a late wake-up does not lower the rate."""

    wait_time = constant(0)
    concurrency = MAX_IN_FLIGHT  # connections: one per request in flight

    def on_start(self) -> None:
        Shared.counter += 1
        self.rng = random.Random(Shared.seed * 1_000_003 + Shared.counter + os.getpid())
        self.prefix = f"{os.getpid()}-{Shared.counter}"
        self.idle: list[_Conversation] = []
        self.in_flight = 0
        self.arrivals = PoissonArrivals(self.rng)

    @task
    def arrive(self) -> None:
        rate = Shared.rate
        if not rate:
            gevent.sleep(0.2)
            return
        now = time.perf_counter()
        next_at = self.arrivals.next(rate / max(1, Shared.users), now)
        scheduled = time.time() + (next_at - now)  # on the wall clock the samples' times use
        if next_at > now:
            gevent.sleep(next_at - now)
        if self.in_flight >= MAX_IN_FLIGHT:
            _refused(self.prefix)
            return
        self.in_flight += 1
        gevent.spawn(self._one, scheduled)

    def _one(self, scheduled: float) -> None:
        assert Shared.profile is not None
        try:
            quiet_moment()
            if self.idle:
                conv = self.idle.pop(self.rng.randrange(len(self.idle)))
            else:
                plan = plan_conversation(
                    Shared.profile, self.rng, Shared.maker, Shared.context_len, Shared.system_cache
                )
                conv = _Conversation(plan, f"{self.prefix}#{self.rng.randrange(1 << 30):x}")
            turn = conv.plan.turns[conv.turn]
            conv.messages.append({"role": "user", "content": turn.user_text})
            last = conv.turn == len(conv.plan.turns) - 1
            answer, _ = send_chat(self.client, conv.messages, turn.max_tokens, conv.turn, conv.conv_id, scheduled, last)
            if answer is not None:
                conv.messages.append({"role": "assistant", "content": answer})
                conv.turn += 1
                if conv.turn < len(conv.plan.turns):
                    self.idle.append(conv)
        finally:
            self.in_flight -= 1


# -- trace replay -------------------------------------------------------------------------------


LEAD_S = 0.25
"""A row's greenlet starts this long before its send time, to build its prompt off the moment."""


class TraceUser(_StreamingUser):
    """Trace replay: one per process. Each step it sends its share of the trace's rows on an
    absolute schedule (the row's timestamp divided by the speed, from the step's ``t0``),
    whatever is in flight (open loop), each as a streamed completion with the row's exact input
    length, its output length forced (``max_tokens`` with ``ignore_eos``), and text shared where
    the rows share hash ids. A turn whose parent has not finished waits for it (and its think
    time); how long is recorded."""

    wait_time = constant(0)
    concurrency = MAX_IN_FLIGHT

    def on_start(self) -> None:
        self.done_step = 0

    @task
    def replay(self) -> None:
        job = Replay.job
        if job is None or job.step <= self.done_step:
            gevent.sleep(0.02)
            return
        self.done_step = job.step
        done = replay_step(self.client, job)
        if Replay.done is not None:
            Replay.done(done)


def replay_step(client: Any, job: TraceJob) -> wire.TraceDone:
    src = Replay.source
    assert src is not None
    share = ReplayShare(src, Replay.part, Replay.max_model_len)
    prompts = TracePrompts(Shared.maker, f"{Replay.salt}:{Shared.seed}:{job.step}")
    group = gevent.pool.Group()
    ends: dict[str, float] = {}
    waiting: dict[str, gevent.event.Event] = {}
    sent = 0
    try:
        for row in share:
            at = job.t0 + row.t / job.speed
            wait = at - LEAD_S - time.time()
            if wait > 0:
                gevent.sleep(wait)
            if Replay.job is not job:  # the step was ended (the ramp stopped)
                share.skipped["the step ended first"] += 1
                continue
            if len(group) >= MAX_IN_FLIGHT:
                _refused(row.conversation or "trace")
                share.skipped["client_limit"] += 1
                continue
            if row.id is not None:
                waiting[row.id] = gevent.event.Event()
            group.spawn(_send_row, client, row, at, src.think_s(row, job.speed), prompts, ends, waiting)
            sent += 1
    except TraceError as e:
        emit(wire.RunnerFailed(f"trace: {e}"))
    group.join(timeout=_StreamingUser.network_timeout + 10)
    group.kill(block=False)
    return wire.TraceDone(job.step, share.rows, sent, dict(share.skipped), share.prefix_tokens, share.prefix_input)


def _send_row(
    client: Any,
    row: TraceRow,
    at: float,
    think_s: float,
    prompts: TracePrompts,
    ends: dict[str, float],
    waiting: dict[str, gevent.event.Event],
) -> None:
    try:
        text = prompts.prompt(row.index, row.input_tokens, row.hash_ids, row.block_tokens, row.scope)
        parent_end = None
        if row.parent is not None:
            ev = waiting.get(row.parent)
            if ev is not None:
                ev.wait(timeout=_StreamingUser.network_timeout + 10)
            parent_end = ends.get(row.parent)  # None: a parent outside the replay holds nothing
        rel = release(at, parent_end, think_s)
        held = rel.held_s
        wait = rel.at - time.time()
        if wait > 0:
            gevent.sleep(wait)
        body = {
            "model": Shared.model,
            "prompt": text,
            "max_tokens": row.output_tokens,
            "ignore_eos": True,  # vLLM's extension: the row's output length, not where EOS falls
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        sample, _ = stream_request(client, "/v1/completions", body, row.turn, row.conversation or "")
        assert Shared.sink is not None
        Shared.sink(
            dataclasses.replace(
                sample,
                trace_index=row.index,
                scheduled=at,
                planned_input=row.input_tokens,
                held_s=held or None,
                last=row.last,
            )
        )
    finally:
        if row.id is not None:
            ends[row.id] = time.time()
            ev = waiting.pop(row.id, None)
            if ev is not None:
                ev.set()
            # a finished turn's children look its end up; the event is needed no more


def _refused(prefix: str) -> None:
    now = time.time()
    assert Shared.sink is not None
    Shared.sink(
        RequestSample(
            start=now,
            end=now,
            step=Shared.step,
            users=Shared.users,
            ok=False,
            error="client_limit",
            conversation=prefix,
        )
    )


def _read_commands(env: Environment) -> None:
    stdin = FileObjectPosix(sys.stdin.fileno(), "rb")
    runner = env.runner
    assert runner is not None
    for raw in stdin:
        try:
            cmd = wire.decode_command(raw)
        except wire.WireError as e:
            emit(wire.RunnerFailed(f"bad command: {e}"))
            continue
        if isinstance(cmd, wire.SetUsers):
            Shared.step, Shared.users, Shared.rate = cmd.step, cmd.n, cmd.rate
            if cmd.speed is not None and cmd.t0 is not None:
                Replay.job = TraceJob(cmd.step, cmd.speed, cmd.t0)
            if isinstance(runner, MasterRunner):
                runner.send_message(
                    "spoc_step",
                    {"step": cmd.step, "users": cmd.n, "rate": cmd.rate, "speed": cmd.speed, "t0": cmd.t0},
                )
            if Shared.lockstep and not cmd.rate and Replay.job is None and not isinstance(runner, MasterRunner):
                Cohort.next(runner, cmd.n)  # with --workers, each worker restarts its own users
            runner.start(cmd.n, spawn_rate=cmd.spawn_rate or max(1, cmd.n), wait=False)
            emit(wire.UsersSet(cmd.n, cmd.step))
        elif isinstance(cmd, wire.Stop):
            Replay.job = None
            break
    else:  # end of input without a Stop: the parent died (its end of the pipe closed with it)
        runner.quit()
        orphaned()
    runner.quit()
    emit(wire.Stopped())


def _configure(args: argparse.Namespace) -> None:
    with open(args.profile_json) as f:
        Shared.profile = Workload.from_dict(json.load(f))
    Shared.url = args.url
    Shared.model = args.model
    Shared.api_key = os.environ.get("SPOC_API_KEY") or None
    Shared.context_len = args.context_len
    Shared.seed = args.seed
    Shared.lockstep = args.arrivals == "lockstep"
    _StreamingUser.network_timeout = args.timeout
    if args.trace_json:
        with open(args.trace_json) as f:
            spec = json.load(f)
        Replay.source = TraceSource.from_dict(spec["source"])
        Replay.max_model_len = spec.get("max_model_len")
        Replay.salt = str(spec.get("salt", ""))
    Shared.maker = TextMaker(args.tokenizer)
    Shared.lengths = learn_lengths(Shared.maker, args.url, args.model, Shared.api_key)
    sys.stderr.write(f"prompt lengths: {Shared.lengths}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spoc_tui.load.runner")
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile-json", required=True)
    ap.add_argument("--context-len", type=int, default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--expect-workers", type=int, default=0)
    ap.add_argument("--master-bind-host", default="127.0.0.1")
    ap.add_argument("--master-bind-port", type=int, default=5557)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--open-loop", action="store_true", help="Poisson arrivals at the rate each step sets")
    ap.add_argument(
        "--arrivals",
        choices=("staggered", "lockstep"),
        default="staggered",
        help="staggered: starts and turns jittered (default); lockstep: none, each step restarts every user at once",
    )
    ap.add_argument("--trace-json", default=None, help="replay a trace: its source and the server's max-model-len")
    ap.add_argument("--master-host", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, default=5557)
    ap.add_argument(
        "--parent-pid", type=int, default=None, help="end when this process ends (default: the one that started us)"
    )
    ap.add_argument(
        "--finalize",
        action="append",
        default=[],
        help="a result file to mark interrupted if the parent dies while it says running (repeatable)",
    )
    args = ap.parse_args(argv)
    # the URL on the command line is redacted (``ps`` shows it to every user); the real one,
    # which may carry a password, comes by environment, as the API key does
    args.url = os.environ.get("SPOC_RUNNER_URL") or args.url
    Orphan.parent, Orphan.results = args.parent_pid or os.getppid(), list(args.finalize)
    gevent.spawn(watch_parent)
    _configure(args)
    user_class: type[_StreamingUser] = TraceUser if args.trace_json else RateUser if args.open_loop else ChatUser
    env = Environment(user_classes=[user_class], host=args.url, catch_exceptions=True)
    return _work(env, args) if args.worker else _serve(env, args)


def _work(env: Environment, args: argparse.Namespace) -> int:
    """A Locust worker: its samples go to the master in batches."""
    batch: list[dict[str, object]] = []
    Shared.sink = lambda s: batch.append(s.as_dict())
    runner = env.create_worker_runner(args.master_host, args.master_port)

    def on_step(msg: Any, **_kw: Any) -> None:
        Shared.step = int(msg.data.get("step", 0))
        Shared.users = int(msg.data.get("users", 0))
        rate = msg.data.get("rate")
        Shared.rate = float(rate) if isinstance(rate, (int, float)) and rate > 0 else None
        speed, t0 = msg.data.get("speed"), msg.data.get("t0")
        if isinstance(speed, (int, float)) and isinstance(t0, (int, float)):
            # rows are split by conversation over the processes (one trace user in each)
            Replay.part = (runner.worker_index, max(1, Shared.users))
            Replay.job = TraceJob(Shared.step, float(speed), float(t0))
        elif Shared.lockstep and Shared.rate is None:
            Cohort.next(runner, None)

    runner.register_message("spoc_step", on_step)

    def trace_done(d: wire.TraceDone) -> None:
        batch_now = batch[:]  # the samples first: the master ends the step on this message
        del batch[:]
        if batch_now:
            runner.send_message("spoc_samples", batch_now)  # type: ignore[arg-type]
        payload = {**json.loads(wire.encode(d)), "process": f"worker {runner.worker_index}"}
        runner.send_message("spoc_trace_done", payload)

    Replay.done = trace_done

    def send_health(h: wire.Health) -> None:
        # Locust types the payload as a dict; its messages carry any msgpack-able data
        runner.send_message("spoc_health", {"t": h.t, "cpu_s": h.cpu_s, "lags_ms": list(h.lags_ms), "stale": h.stale})

    gevent.spawn(watch_self, send_health)

    def flush() -> None:
        while True:
            gevent.sleep(0.25)
            if batch:
                out = batch[:]
                del batch[:]
                # Locust types the payload as a dict; its messages carry any msgpack-able data
                runner.send_message("spoc_samples", out)  # type: ignore[arg-type]

    gevent.spawn(flush)
    runner.greenlet.join()
    return 0


def _watch_workers(runner: MasterRunner, expected: int) -> None:
    """Says once that a worker went missing (Locust has dropped it and moved or stopped its users):
    the parent ends the ramp on it rather than measure steps without that worker's load."""
    while True:
        gevent.sleep(1.0)
        if missing := len(runner.clients.missing):
            emit(
                wire.RunnerFailed(
                    f"{missing} of {expected} load-generator workers stopped answering (no heartbeat for "
                    f"{WORKER_LIVENESS_BEATS} s): their host is overloaded or they died"
                )
            )
            return


def _serve(env: Environment, args: argparse.Namespace) -> int:
    """The master (with workers) or the local runner: emits samples, takes commands."""

    def emit_sample(sample: RequestSample) -> None:
        emit(wire.Sample(sample))

    Shared.sink = emit_sample
    if args.expect_workers:
        locust_runners.HEARTBEAT_LIVENESS = WORKER_LIVENESS_BEATS  # read as each worker joins and beats
        runner = env.create_master_runner(args.master_bind_host, args.master_bind_port)

        def on_samples(msg: Any, **_kw: Any) -> None:
            for s in msg.data:
                emit_sample(RequestSample.from_dict(s))

        runner.register_message("spoc_samples", on_samples)

        def on_health(msg: Any, **_kw: Any) -> None:
            d = msg.data
            stale = int(d.get("stale", 0))
            emit(wire.Health(float(d["t"]), float(d["cpu_s"]), tuple(d["lags_ms"]), f"worker {msg.node_id}", stale))

        runner.register_message("spoc_health", on_health)

        def on_trace_done(msg: Any, **_kw: Any) -> None:
            d = wire.decode_event(json.dumps(msg.data))
            if isinstance(d, wire.TraceDone):
                emit(d)

        runner.register_message("spoc_trace_done", on_trace_done)
        deadline = time.time() + 60
        while runner.worker_count < args.expect_workers:
            if time.time() > deadline:
                emit(wire.RunnerFailed(f"only {runner.worker_count} of {args.expect_workers} workers joined"))
                OUT.flush()
                return 1
            gevent.sleep(0.1)
        gevent.spawn(_watch_workers, runner, args.expect_workers)
    else:
        env.create_local_runner()
    Replay.done = emit
    emit(wire.Ready(args.expect_workers, Shared.lengths))
    gevent.spawn(watch_self, emit)
    _read_commands(env)
    OUT.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
