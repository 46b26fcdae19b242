"""The Locust child's shared state and plumbing (:mod:`spoc_tui.load.runner` runs it): the
JSON-lines channel to the parent (:data:`OUT`, :func:`emit`), the state its users share
(:class:`Shared`, :class:`Replay`), the streaming user's base, how a request's failure is named,
the parent-death watch and the server's own token counts. Imported by the runner after gevent
has patched the process (as every module the runner loads)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import gevent.pool
import gevent.ssl
from gevent.fileobject import FileObjectPosix
from locust.contrib.fasthttp import FastHttpUser
from urllib3 import PoolManager

from spoc_tui.collectors.http import tls
from spoc_tui.core.ramp.steps import RequestSample
from spoc_tui.core.traces.read import TraceSource
from spoc_tui.load import wire
from spoc_tui.procs.lock import mark_interrupted
from spoc_tui.workload import (
    ConversationPlan,
    TextMaker,
    Workload,
)


class _Out:
    """Events to the parent, off the timing path.

    A finished request's sample is queued, not written: one greenlet encodes the queue, yielding
    between two events so that a stream whose bytes are waiting is read (and timestamped) between
    two encodings rather than after all of them, and writes the batch in one go to a pipe it never
    blocks on (gevent's cooperative file object: a full pipe, a parent slow to read, parks this
    greenlet, not the loop that timestamps every stream). When 32 users finish in the same engine
    step, writing each sample at once used to delay the other streams' next tokens by milliseconds.
    """

    def __init__(self) -> None:
        self.queue: list[wire.Event] = []
        self.wake = gevent.event.Event()
        self.busy = False
        self.pipe: Any = None
        self.writer: gevent.Greenlet[[], None] | None = None
        self.closed = False
        """The parent stopped reading (its end of the pipe is closed): nothing more can be written."""

    def put(self, msg: wire.Event) -> None:
        if self.closed:
            return
        self.queue.append(msg)
        if self.writer is None:
            self.pipe = FileObjectPosix(sys.stdout.fileno(), "wb", close=False)
            self.writer = gevent.spawn(self._run)
        self.wake.set()

    def _run(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            self.busy = True
            try:
                while self.queue:
                    batch, self.queue = self.queue, []
                    lines = []
                    for msg in batch:
                        lines.append(wire.encode(msg))
                        gevent.sleep(0)
                    self.pipe.write(("\n".join(lines) + "\n").encode())
                    self.pipe.flush()
            except OSError:  # EPIPE: the parent is gone; what is queued has no reader
                self.closed = True
                self.queue = []
                return
            finally:
                self.busy = False

    def flush(self, timeout: float = 10.0) -> None:
        """Before the process ends: returns once everything queued is written, the pipe is closed
        or ``timeout`` passed (a parent that stopped reading must not keep this process alive)."""
        deadline = time.monotonic() + timeout
        while self.writer is not None and not self.writer.dead and (self.queue or self.busy):
            if time.monotonic() > deadline:
                return
            gevent.sleep(0.005)


OUT = _Out()


def emit(msg: wire.Event) -> None:
    OUT.put(msg)


class Shared:
    """What every user of this process shares (set up in ``main``)."""

    url = ""
    model = ""
    api_key: str | None = None
    profile: Workload | None = None
    maker = TextMaker()
    context_len: int | None = None
    step = 0
    users = 0
    seed = 0
    system_cache: dict[str, str] = {}
    rate: float | None = None
    """Open loop: the arrival rate (requests/s) all users together generate."""
    lengths = ""
    """How prompt lengths are made (:func:`learn_lengths`)."""
    sink: Callable[[RequestSample], None] | None = None
    """Where samples go: emitted by a master/local runner, batched to the master on a worker."""
    in_flight: Counter[int] = Counter()
    """Requests in flight by the step that sent them (:func:`stale_in_flight`)."""
    counter = 0
    launched_in = -1
    """The event loop's iteration in which the last request was launched (:func:`quiet_moment`)."""
    lockstep = False
    """``--arrivals lockstep``: no jitter, and every step restarts all users together (:class:`Cohort`)."""


def classify_error(exc: BaseException) -> str:
    name = type(exc).__name__.lower()
    if "timeout" in name:
        return "timeout"
    if "connect" in name:
        return "connect"
    return "stream"


CONNECT_TIMEOUT_S = 10.0


def stale_in_flight() -> int:
    """Requests this process has in flight that a step before the current one sent: after a
    step down the ramp waits for them before it warms up (they queue the new level's requests
    behind the last level's load)."""
    return sum(n for step, n in Shared.in_flight.items() if step < Shared.step)


def _private_ca_context() -> Any:
    """An SSL context that trusts the CA bundle the parent was given (--ca-bundle)."""
    return gevent.ssl.create_default_context(cafile=tls().ca_bundle)


class _StreamingUser(FastHttpUser):
    """What both kinds of user share: geventhttpclient's connect and read timeouts."""

    abstract = True
    connection_timeout = CONNECT_TIMEOUT_S
    network_timeout = 300.0  # each read; --timeout sets it (_configure)
    # TLS as every spoc client does it (collectors.http: the parent hands its rule down by
    # environment); Locust's own default skips verification
    insecure = tls().insecure
    ssl_context_factory = staticmethod(_private_ca_context) if tls().ca_bundle else None


class _Conversation:
    """An open-loop conversation between arrivals: its messages so far and its remaining turns."""

    __slots__ = ("conv_id", "messages", "plan", "turn")

    def __init__(self, plan: ConversationPlan, conv_id: str) -> None:
        self.plan = plan
        self.conv_id = conv_id
        self.turn = 0
        self.messages: list[dict[str, str]] = []
        if plan.system_text:
            self.messages.append({"role": "system", "content": plan.system_text})


class TraceJob:
    """One step of a trace replay: its index, speed and the wall time of the trace's 0."""

    __slots__ = ("speed", "step", "t0")

    def __init__(self, step: int, speed: float, t0: float) -> None:
        self.step, self.speed, self.t0 = step, speed, t0


class Replay:
    """What every process's trace replay shares (set up in ``main`` with ``--trace-json``)."""

    source: TraceSource | None = None
    job: TraceJob | None = None
    part: tuple[int, int] = (0, 1)
    """This process's share of the rows: (its index, of how many processes)."""
    max_model_len: int | None = None
    salt = ""
    """The ramp's own (the same in every process): with the step, it seeds every prompt's text."""
    done: Callable[[wire.TraceDone], None] | None = None


LAG_TICK_S = 0.05


def watch_self(sink: Callable[[wire.Health], None]) -> None:
    """Forever: sleep 50 ms at a time, note how late each wake-up is (the event loop's lag: a
    loop busy with other users' chunks or starved of CPU timestamps late), and once a second hand
    the lags and the process's CPU time to ``sink``."""
    lags: list[float] = []
    last = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        gevent.sleep(LAG_TICK_S)
        lags.append(max(0.0, (time.perf_counter() - t0 - LAG_TICK_S) * 1000))
        if time.perf_counter() - last >= 1.0:
            lagged = tuple(round(x, 3) for x in lags)
            sink(wire.Health(time.time(), time.process_time(), lagged, stale=stale_in_flight()))
            lags = []
            last = time.perf_counter()


PARENT_POLL_S = 0.5


class Orphan:
    """Whose child this process is, and the result files to finalize if that process dies."""

    parent = 0
    results: list[str] = []
    ending = False


def watch_parent() -> None:
    """Forever: end this process within a second of the process that started it dying, however it
    died (SIGKILL and a dropped SSH session included: the runner runs in a session of its own,
    so no terminal signal reaches it). Before ending, a result file the parent left saying
    ``running`` (ramp.json, a study's pareto.json) is marked ``interrupted``."""
    while os.getppid() == Orphan.parent:
        gevent.sleep(PARENT_POLL_S)
    orphaned()


def orphaned() -> None:
    """The parent is gone (or closed our stdin without a Stop): finalize its results and end."""
    if Orphan.ending:  # the parent watch and the end of stdin both noticed
        return
    Orphan.ending = True
    reason = f"the spoc process running this (pid {Orphan.parent}) ended without finishing it"
    for path in Orphan.results:
        mark_interrupted(Path(path), reason)
    sys.stderr.write(f"load generator: {reason}; stopping\n")
    sys.stderr.flush()
    os._exit(3)


class NoTokenize(Exception):
    """The server cannot count tokens for us (no /tokenize, or an answer we cannot read)."""


def server_counter(url: str, model: str, api_key: str | None) -> Callable[[str], int]:
    """Count tokens with the server's own tokenizer: vLLM's ``POST /tokenize`` (the simulator's
    too), without special tokens, as the chat template's text around a message is not ours."""
    rule = tls()
    pool = PoolManager(
        maxsize=1, cert_reqs="CERT_NONE" if rule.insecure else "CERT_REQUIRED", ca_certs=rule.ca_bundle or None
    )
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def count(text: str) -> int:
        body = json.dumps({"model": model, "prompt": text, "add_special_tokens": False})
        try:
            r = pool.request("POST", url + "/tokenize", body=body, headers=headers, timeout=10.0, retries=False)
        except Exception as e:
            raise NoTokenize(f"/tokenize: {type(e).__name__}") from None
        if r.status != 200:
            raise NoTokenize(f"/tokenize answered HTTP {r.status}")
        try:
            n = json.loads(r.data)["count"]
        except (ValueError, KeyError, TypeError):
            raise NoTokenize("/tokenize answered without a token count") from None
        if isinstance(n, bool) or not isinstance(n, int):
            raise NoTokenize("/tokenize answered without a token count")
        return n

    return count


def learn_lengths(maker: TextMaker, url: str, model: str, api_key: str | None) -> str:
    """Make prompt lengths exact before any request is timed: with the local tokenizer when there
    is one, else with the server's /tokenize (about 150 short calls, once per process). Returns
    how lengths are made, for the results' header."""
    if maker.tokenizer is not None:
        return "exact: the local tokenizer" if maker.additive else "exact: the local tokenizer (encode and cut)"
    try:
        if maker.learn(server_counter(url, model, api_key)):
            return "exact: the server's /tokenize"
        why = "its token counts do not add up word by word"
    except NoTokenize as e:
        why = str(e)
    return f"approximate: words per token calibrated from the server's usage (the server's tokenizer: {why})"
