"""Running a load ramp: step the users, measure each step, find the knee.

Used by ``spoc ramp`` and the Load screen alike. It drives the Locust runner child over JSON
lines, keeps every request sample, records the server's own view of each step (queue, KV
use, preemptions, GPU clocks and throttling) next to the client's, and writes
``ramp.json`` and ``requests.jsonl`` as it goes: an interrupted ramp keeps every finished step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx

from spoc_tui.collectors.http import RedirectRefused, new_client, request, tls_env
from spoc_tui.collectors.poller import DcgmPoller, VllmPoller
from spoc_tui.collectors.scrape import base_url
from spoc_tui.core.errors import EXIT_USAGE, first_line
from spoc_tui.core.files import write_atomic
from spoc_tui.core.ramp.experiment import Driver
from spoc_tui.core.ramp.experiment import RampPhase as RampPhase  # re-exported: it lived here
from spoc_tui.core.ramp.experiment import RampProgress as RampProgress  # re-exported: it lived here
from spoc_tui.core.ramp.knee import (
    BisectSearch,
    FixedRates,
    FixedSpeeds,
    Knee,
    KneeSearch,
    SaturationSearch,
    SpeedSearch,
    UserPlan,
)
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.ramp.status import RampEnd, RampStatus
from spoc_tui.core.ramp.steps import (
    ClientHealth,
    GpuWindow,
    ReplaySent,
    RequestSample,
    ServerWindow,
    StepSummary,
    client_health,
)
from spoc_tui.core.ramp.steps.client import silent
from spoc_tui.core.redact import redact_url
from spoc_tui.core.results import RampHeader, encode_ramp
from spoc_tui.core.textsafe import safe
from spoc_tui.core.traces.read import TraceError, TraceRead, TraceSource
from spoc_tui.load import defaults, wire
from spoc_tui.load.rampconfig import RampConfig as RampConfig  # re-exported: it lived here
from spoc_tui.load.rampconfig import RampError as RampError  # re-exported: it lived here
from spoc_tui.load.rampconfig import TraceScan as TraceScan  # re-exported: it lived here
from spoc_tui.load.rampconfig import ramp_header as ramp_header  # re-exported: it lived here
from spoc_tui.procs.group import kill_group
from spoc_tui.procs.lock import FolderLock
from spoc_tui.procs.ports import free_port

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class RampResult:
    status: RampEnd
    steps: list[StepSummary]
    knee: Knee
    model: str
    out_dir: Path
    max_model_len: int | None = None
    stop_reason: str = ""
    """Why a ramp stopped early (which limit, how many times over)."""


async def preflight(
    url: str, model: str | None, api_key: str | None, transport: httpx.AsyncBaseTransport | None = None
) -> tuple[str, int | None]:
    """Check the server and the model before any load; returns (model, max_model_len).
    ``transport``: httpx's, where the answers come from (None: the network).

    Raises:
        RampError: unreachable server (1), unknown model (2), a server that fails a probe (1).
    """
    root = base_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with new_client(httpx.Timeout(30.0, connect=5.0), transport=transport) as c:
        try:
            r = await request(c, "GET", root + "/v1/models", headers=headers)
        except RedirectRefused as e:
            raise RampError(f"{redact_url(root)}/v1/models: {e}") from None
        except httpx.HTTPError as e:
            raise RampError(
                f"{root}: cannot reach the server ({type(e).__name__}: {first_line(e, 100) if str(e) else 'no answer'})"
            ) from None
        if r.status_code == 401:
            raise RampError(
                f"{root}: the server wants an API key (401); pass --api-key or set SPOC_API_KEY", exit_code=EXIT_USAGE
            )
        if r.status_code != 200:
            raise RampError(f"{root}/v1/models answered HTTP {r.status_code}")
        try:
            data = r.json()["data"]
            ids = {safe(str(m["id"])): m.get("max_model_len") for m in data}
        except (ValueError, KeyError, TypeError):
            raise RampError(f"{root}/v1/models did not return an OpenAI model list") from None
        if not ids:
            raise RampError(f"{root} serves no model")
        if model is None:
            model = next(iter(ids))
        elif model not in ids:
            raise RampError(
                f"model {model!r} is not served by {root}; it serves: {', '.join(ids)}", exit_code=EXIT_USAGE
            )
        body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        try:
            r = await request(c, "POST", root + "/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as e:
            raise RampError(f"{root}: probe request failed ({type(e).__name__})") from None
        if r.status_code != 200:
            try:
                msg = r.json().get("error", {}).get("message") or r.text[:200]
            except ValueError:
                msg = r.text[:200]
            raise RampError(f"{root}: a one-token probe request failed with HTTP {r.status_code}: {safe(str(msg))}")
    mml = ids[model]
    return model, int(mml) if isinstance(mml, int) else None


def keep_previous(out_dir: Path) -> str | None:
    """A folder that holds an earlier ramp's results: they are moved to ``previous-<time>/``
    inside it (nothing is lost, and the new ``requests.jsonl`` is not mixed with the old one).
    Returns the folder they went to, or None."""
    old = [out_dir / n for n in ("ramp.json", "requests.jsonl") if (out_dir / n).exists()]
    if not old:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(max(p.stat().st_mtime for p in old)))
    dest = out_dir / f"previous-{stamp}"
    n = 1
    while dest.exists():
        n += 1
        dest = out_dir / f"previous-{stamp}-{n}"
    dest.mkdir()
    for p in old:
        p.rename(dest / p.name)
    return dest.name


class ResultWriter:
    """``ramp.json`` (rewritten atomically after each step) and ``requests.jsonl`` (appended): a
    measured ramp's and a predicted one's (``spoc twin predict --out``, with no requests file)."""

    def __init__(self, out_dir: Path, header: RampHeader, requests: bool = True) -> None:
        """Raises: RampError (exit code 2) when the folder cannot be written."""
        self.out_dir = out_dir
        self.header = header
        self.lock = FolderLock(out_dir / "ramp.lock", "ramp")
        self.write_error = ""
        """Why requests.jsonl could not be written (a full disk): the ramp ends at its step's end."""
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()  # before anything in the folder moves (FolderBusy: another ramp writes there)
            self.kept = keep_previous(out_dir)
            self.requests = open(out_dir / "requests.jsonl", "w", buffering=1) if requests else None
        except OSError as e:
            self.lock.release()
            raise RampError(f"--out {out_dir}: cannot write there ({e.strerror or e})", exit_code=EXIT_USAGE) from None

    @property
    def kept_note(self) -> str:
        """Where the folder's earlier results went, in words ("" when there were none)."""
        return f"the folder's earlier results were moved to {self.kept}/" if self.kept else ""

    def sample(self, s: RequestSample) -> None:
        if self.write_error or self.requests is None:
            return
        try:
            self.requests.write(json.dumps(s.as_dict(), separators=(",", ":")) + "\n")
        except OSError as e:
            self.write_error = f"cannot write {self.out_dir}/requests.jsonl ({e.strerror or e})"

    def stopped(self, reason: str) -> None:
        self.header = replace(self.header, stop_reason=reason)

    def write(self, steps: list[StepSummary], knee: Knee, status: RampStatus) -> None:
        """Raises: RampError when the file cannot be written (no temporary file is left)."""
        text = encode_ramp(self.header, steps, knee, status, time.time())
        try:
            write_atomic(self.out_dir / "ramp.json", text)
        except OSError as e:
            raise RampError(f"cannot write {self.out_dir}/ramp.json ({e.strerror or e})") from None

    def close(self) -> None:
        try:
            if self.requests is not None:
                self.requests.close()
        except OSError as e:
            self.write_error = self.write_error or f"cannot write {self.out_dir}/requests.jsonl ({e.strerror or e})"
        finally:
            self.lock.release()


def runner_argv(url: str, model: str, workload_json: Path, seed: int, *extra: str) -> list[str]:
    """The load generator's command line (a ramp's master and local workers, ``spoc load-worker``):
    the server's URL redacted (the real one, which may hold a password, goes by
    :func:`runner_env`), the model, the workload file and the seed, then ``extra``."""
    return [
        sys.executable,
        "-m",
        "spoc_tui.load.runner",
        "--url",
        redact_url(base_url(url)),
        "--model",
        model,
        "--profile-json",
        str(workload_json),
        "--seed",
        str(seed),
        *extra,
    ]


def runner_env(url: str) -> dict[str, str]:
    """The load generator's environment: the server's URL (it may hold a password, so never on a
    command line, where ``ps`` shows it to every user) and this process's TLS rule."""
    return {**os.environ, **tls_env(), "SPOC_RUNNER_URL": url}


class RunnerProcess:
    """The Locust child (and its local workers), talked to over :mod:`spoc_tui.load.wire`."""

    def __init__(self, cfg: RampConfig, model: str, context_len: int | None, log_dir: Path) -> None:
        self.cfg = cfg
        self.model = model
        self.context_len = context_len
        self.log_dir = log_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.workers: list[asyncio.subprocess.Process] = []
        self.events: asyncio.Queue[wire.Event] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self.lengths = ""
        """How the runner makes prompt lengths (from its Ready)."""

    def _argv(self, *extra: str) -> list[str]:
        argv = runner_argv(
            self.cfg.url,
            self.model,
            self.log_dir / "profile.json",
            self.cfg.seed,
            "--timeout",
            str(self.cfg.request_timeout_s),
        )
        if self.context_len:
            argv += ["--context-len", str(self.context_len)]
        if self.cfg.tokenizer:
            argv += ["--tokenizer", self.cfg.tokenizer]
        if self.cfg.trace is not None:
            argv += ["--trace-json", str(self.log_dir / "trace.json")]
        elif self.cfg.open_loop:
            argv += ["--open-loop"]
        argv += ["--arrivals", self.cfg.arrivals, "--parent-pid", str(os.getpid())]
        for path in (self.log_dir / "ramp.json", *self.cfg.finalize):
            argv += ["--finalize", str(path)]
        return argv + list(extra)

    async def start(self) -> None:
        (self.log_dir / "profile.json").write_text(json.dumps(self.cfg.workload.as_dict()))
        if self.cfg.trace is not None:
            # a salt of this ramp's own: its prompts share no text with an earlier ramp's on the same
            # server (whose prefix cache may still hold them); every process gets the same one
            spec = {
                "source": self.cfg.trace.as_dict(),
                "max_model_len": self.context_len,
                "salt": os.urandom(6).hex(),
            }
            (self.log_dir / "trace.json").write_text(json.dumps(spec))
        env = runner_env(base_url(self.cfg.url))
        if self.cfg.api_key:
            env["SPOC_API_KEY"] = self.cfg.api_key  # passed by environment, never on a command line
        extra: list[str] = []
        master_port = ""
        if self.cfg.workers:
            master_port = str(free_port())
            extra = ["--expect-workers", str(self.cfg.workers), "--master-bind-port", master_port]
        log = open(self.log_dir / "runner.log", "ab")
        self.proc = await asyncio.create_subprocess_exec(
            *self._argv(*extra),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,
        )
        for _ in range(self.cfg.workers):
            self.workers.append(
                await asyncio.create_subprocess_exec(
                    *self._argv("--worker", "--master-port", master_port),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                    start_new_session=True,
                )
            )
        self._reader = asyncio.create_task(self._read())
        ready = await self.wait_for(wire.Ready, 90.0)
        if not isinstance(ready, wire.Ready):
            raise RampError("the load generator did not start; see runner.log in the output folder")
        self.lengths = ready.lengths

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                await self.events.put(wire.Exited())
                return
            try:
                await self.events.put(wire.decode_event(line))
            except wire.WireError as e:  # a stray line (a library printing to stdout): not ours
                logger.debug("runner: %s", e)

    async def wait_for(self, kind: type[wire.Event], timeout: float) -> wire.Event | None:
        """The next event of type ``kind``, or None when the runner failed, exited or timed out."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                ev = await asyncio.wait_for(self.events.get(), left)
            except TimeoutError:
                return None
            if isinstance(ev, kind):
                return ev
            if isinstance(ev, (wire.Exited, wire.RunnerFailed)):
                return None
        return None

    async def send(self, cmd: wire.Command) -> None:
        if self.proc is None or self.proc.stdin is None or self.proc.returncode is not None:
            return
        self.proc.stdin.write((wire.encode(cmd) + "\n").encode())
        try:
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            logger.debug("runner: stdin closed before %s", cmd)

    async def stop(self) -> None:
        await self.send(wire.Stop())
        for p in [self.proc, *self.workers]:
            if p is None:
                continue
            try:
                await asyncio.wait_for(p.wait(), 10.0)
            except TimeoutError:
                kill_group(p.pid, signal.SIGKILL)
                await p.wait()
        if self._reader:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)  # never "Task was destroyed"


class _Peaks:
    """The highest queue, batch and KV-cache use a step's polls saw."""

    def __init__(self) -> None:
        self.waiting: float | None = None
        self.running: float | None = None
        self.kv: float | None = None

    @staticmethod
    def _max(a: float | None, b: float | None) -> float | None:
        return b if a is None else a if b is None else max(a, b)

    def see(self, waiting: float | None, running: float | None, kv: float | None) -> None:
        self.waiting = self._max(self.waiting, waiting)
        self.running = self._max(self.running, running)
        self.kv = self._max(self.kv, kv)


async def _server_view(poller: VllmPoller, dcgm: DcgmPoller | None, peaks: _Peaks) -> ServerWindow:
    tick = await poller.poll()
    out = ServerWindow()
    if tick.servers:
        v = tick.servers[0].total
        peaks.see(v.waiting, v.running, v.kv_cache_usage)
        out = ServerWindow(
            seen=True,
            waiting=v.waiting,
            waiting_max=peaks.waiting,
            running_max=peaks.running,
            kv_cache_usage_max=peaks.kv,
            preemptions_per_s=v.preemptions_rate,
            generation_tokens_per_s=v.generation_tokens_rate,
            prefix_cache_hit_rate=v.prefix_cache_hit_rate,
            ttft_p99=v.latency["ttft"].p99,
            itl_p99=v.latency["itl"].p99,
            # which of the two are upper bounds from the histogram's mean, not interpolations
            bounded=tuple(f"{m}_p99" for m in ("ttft", "itl") if v.latency[m].is_bound("p99")),
            window=v.window,
        )
    if dcgm is not None:
        gt = await dcgm.poll()
        gpus = tuple(
            GpuWindow(gpu=str(g.gpu), uuid=g.uuid, sm_clock_mhz=g.sm_clock_mhz, sm_clock_max_mhz=g.sm_clock_max_mhz,
                      temp_c=g.temp_c, power_w=g.power_w, throttle_reasons=tuple(g.throttle_reasons or ()),
                      throttled_pct=tuple((g.throttled_pct or {}).items()))
            for g in gt.gpus
        )  # fmt: skip
        out = replace(out, gpus=gpus)
    return out


USERS_PER_PROCESS = 64
"""--workers auto: a load-generator process per this many concurrent streams (above it one
process's event loop timestamps chunks late on these machines: benchmarks/load_fidelity.py)."""
SECONDS_PER_REQUEST = 4.0
"""--workers auto with --rate: concurrency is taken as rate x this (a chat answer's length)."""


def auto_workers(plan: UserPlan, cores: int) -> int:
    """``--workers auto``: one process per :data:`USERS_PER_PROCESS` streams at the plan's highest
    level, at most one per core but one (kept for the master and the system); 0 (a single
    process) when that comes to one or fewer."""
    if isinstance(plan, (FixedSpeeds, SpeedSearch)):
        return 0  # a trace's rate is known once it is read: give --workers for a heavy one
    if isinstance(plan, FixedRates):
        streams = max(plan.rates) * SECONDS_PER_REQUEST
    elif isinstance(plan, (KneeSearch, BisectSearch, SaturationSearch)):
        streams = float(plan.max_users)
    else:
        streams = float(max(plan.users))
    n = min(math.ceil(streams / USERS_PER_PROCESS), max(0, cores - 1))
    return n if n > 1 else 0


def spawn_rate(cfg: RampConfig, change: int) -> float:
    """Users per second for a step that changes the user count by ``change`` (see
    :func:`spoc_tui.load.defaults.spawn_rate`); a ramp-up longer than the warm-up is said in the step."""
    return defaults.spawn_rate(change, cfg.warmup_s, cfg.arrivals, cfg.spawn_rate)


DRAIN_READ_S = 1.5
"""A load generator's health report this long after a step's command has seen the new step."""
DRAIN_SILENT_S = 5.0
"""No health report at all for this long: the drain is not waited for."""


async def _drain(
    most_s: float,
    health: list[wire.Health],
    say: Callable[[str], None],
    pump: asyncio.Future[None],
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> float:
    """After a step down, wait until every load-generator process reports no request in flight
    that an earlier step sent, at most ``most_s`` (the step's limit, ``--max-step-seconds``); the
    time it ended. The step then warms up and counts only the requests sent from then: the last
    level's backlog would queue them behind its load. (On the simulator's coding profile, 15 users
    after 64 measured a TTFT p99 of 5.1 s where 15 users' own is 0.2 s, and the knee's interval
    left the truth out in 3 of 20 searches.) ``clock`` and ``sleep``: the health reports' clock
    (the wall clock) and the wait between looks at them."""
    t0 = clock()
    stale: int | None = None
    said = ""
    while clock() - t0 < most_s:
        if pump.done():
            raise RampError("the load generator exited; see runner.log in the output folder")
        seen = {h.process for h in health if h.t >= t0 - DRAIN_SILENT_S}
        latest = {h.process: h for h in health if h.t >= t0 + DRAIN_READ_S}
        if not seen and clock() - t0 >= DRAIN_SILENT_S:
            break  # the load generator reports no health: nothing to wait for
        if seen and seen <= latest.keys():
            stale = sum(h.stale for h in latest.values())
            if stale == 0:
                break
        waiting = f"{stale} requests" if stale is not None else "the requests"
        note = f"waiting for {waiting} of the last level to end"
        if note != said:  # said once per change (the command line prints every report)
            say(note)
            said = note
        await sleep(0.5)
    return clock()


def scan_trace(source: TraceSource) -> TraceScan:
    """Read the replay's rows once (streamed), so a bad row stops the ramp before any load.

    Raises:
        RampError: (exit code 2) the trace's error, naming the line; a window with no row.
    """
    read = TraceRead()
    n = 0
    first = last = 0.0
    try:
        for row in source.rows(read):
            if n == 0:
                first = row.t
            first, last = min(first, row.t), max(last, row.t)
            n += 1
    except TraceError as e:
        raise RampError(f"--trace: {e}", exit_code=EXIT_USAGE) from None
    if n == 0:
        why = f" ({', '.join(f'{c} {k}' for k, c in read.skipped.items())})" if read.skipped else ""
        raise RampError(f"--trace {source.path}: no row to send in the window{why}", exit_code=EXIT_USAGE)
    return TraceScan(n, last - first, dict(read.skipped))


TRACE_START_S = 0.5
"""A replay step's clock starts this long after its command is sent (every process gets it first)."""


class LiveBackend:
    """The experiment driver's live backend: the Locust load generator in a child process (over
    :mod:`spoc_tui.load.wire`) and the server's /metrics (and DCGM's), on the wall clock."""

    def __init__(
        self,
        cfg: RampConfig,
        writer: ResultWriter | None,
        model: str,
        context_len: int | None,
        scan: TraceScan | None = None,
    ) -> None:
        """``model``, ``context_len``: the server's, as the preflight found them; ``scan``: the
        trace's (a replay)."""
        self.cfg = cfg
        self.writer = writer
        self.scan = scan
        self.generators = cfg.generators
        self.model = model
        self.context_len = context_len
        self.runner: RunnerProcess | None = None
        self.pump: asyncio.Task[None] | None = None
        self.answered: list[RequestSample] = []
        self.health: list[wire.Health] = []
        self.heard: dict[str, float] = {}  # each generator process's last health report (monotonic)
        self.failed: str | None = None  # what the load generator said failed once it was running
        self.trace_done: list[wire.TraceDone] = []
        self.poller: VllmPoller | None = None
        self.dcgm: DcgmPoller | None = None
        self.peaks = _Peaks()

    def now(self) -> float:
        return time.time()

    def samples(self) -> int:
        return len(self.answered)

    async def start(self) -> None:
        """Start the load generator (the server's model and context as the preflight found them)."""
        cfg = self.cfg
        self.poller = VllmPoller([cfg.url], window_s=max(1.0, cfg.step_limit_s), api_key=cfg.api_key)
        self.dcgm = DcgmPoller(cfg.dcgm_urls, window_s=cfg.step_s) if cfg.dcgm_urls else None
        self.runner = RunnerProcess(cfg, self.model, self.context_len, cfg.out_dir)
        await self.runner.start()
        if self.runner.lengths and self.writer is not None:
            self.writer.header = replace(self.writer.header, prompt_lengths=self.runner.lengths)
        self.pump = asyncio.create_task(self._pump(self.runner))

    async def _pump(self, runner: RunnerProcess) -> None:
        while True:
            ev = await runner.events.get()
            if isinstance(ev, wire.Sample):
                self.answered.append(ev.sample)
                if self.writer is not None:
                    self.writer.sample(ev.sample)
            elif isinstance(ev, wire.Health):
                self.health.append(ev)
                self.heard[ev.process] = time.monotonic()
            elif isinstance(ev, wire.TraceDone):
                self.trace_done.append(ev)
            elif isinstance(ev, wire.RunnerFailed):
                logger.warning("load generator: %s", ev.message)
                self.failed = self.failed or ev.message
            elif isinstance(ev, wire.Exited):
                return

    def _alive(self) -> asyncio.Task[None]:
        if self.pump is None or self.pump.done():
            raise RampError("the load generator exited; see runner.log in the output folder")
        if self.failed is not None:
            raise RampError(f"the load generator failed: {self.failed}; see runner.log in the output folder")
        if (why := silent(self.heard, time.monotonic())) is not None:
            raise RampError(why)
        return self.pump

    async def advance(self, until: float) -> None:
        self._alive()
        if (left := until - time.time()) > 0:
            await asyncio.sleep(left)
        self._alive()

    async def _send(self, cmd: wire.Command) -> None:
        assert self.runner is not None
        await self.runner.send(cmd)

    async def set_level(self, idx: int, level: float, prev: float, open_loop: bool) -> str:
        if open_loop:
            await self._send(wire.SetUsers(self.generators, idx, 0.0, rate=level))
            return ""
        users = int(level)
        change = users - int(prev)
        rate = spawn_rate(self.cfg, change)
        ramp_up = abs(change) / rate
        await self._send(wire.SetUsers(users, idx, rate))
        if ramp_up > self.cfg.warmup_s:
            return f"spawning {rate:g} users/s takes {ramp_up:.0f} s, longer than the warm-up"
        return ""

    async def drain(self, most_s: float, say: Callable[[str], None]) -> float:
        return await _drain(most_s, self.health, say, self._alive())

    async def begin_window(self) -> None:
        assert self.poller is not None
        self.peaks = _Peaks()
        self.poller.reset()
        await _server_view(self.poller, self.dcgm, self.peaks)  # baseline scrape at the window's start

    async def poll(self) -> ServerWindow:
        assert self.poller is not None
        return await _server_view(self.poller, self.dcgm, self.peaks)

    def window(self, idx: int, start: float, end: float, sent_from: float) -> list[RequestSample]:
        return [
            s for s in self.answered if start <= (s.end or s.start) <= end and s.step == idx and s.start >= sent_from
        ]

    def client(self, start: float, end: float, limits: Sequence[Limit]) -> ClientHealth:
        points = [(h.process, h.t, h.cpu_s, h.lags_ms) for h in self.health if start <= h.t <= end + 1.0]
        expected = self.cfg.workers + 1 if self.cfg.workers else 1  # the workers and their master
        return client_health(points, limits, (start, end), tuple(self.heard), expected)

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def start_replay(self, idx: int, speed: float) -> float:
        """The trace's rows sent at ``speed`` from :data:`TRACE_START_S` from now (every process
        gets the command first): that moment."""
        t0 = time.time() + TRACE_START_S
        await self._send(wire.SetUsers(self.cfg.generators, idx, 0.0, speed=speed, t0=t0))
        return t0

    def replayed(self, idx: int) -> ReplaySent:
        """Every process's report of the step (:class:`wire.TraceDone`), summed; complete once each
        has reported. Before any has: the trace's rows, and the requests sent so far."""
        scan = self.scan
        assert scan is not None
        ours = [d for d in self.trace_done if d.step == idx]
        skipped: dict[str, int] = {}
        for d in ours:
            for why, c in d.skipped.items():
                skipped[why] = skipped.get(why, 0) + c
        prefix_in = sum(d.input_tokens for d in ours)
        if ours:
            sent = sum(d.sent for d in ours)
        else:  # no report yet: the requests sent so far (walked only until one comes)
            sent = sum(1 for s in self.answered if s.step == idx and s.scheduled is not None)
        return ReplaySent(
            rows=sum(d.rows for d in ours) if ours else scan.rows,
            sent=sent,
            skipped=skipped,
            due=scan.rows,
            prefix_share=round(sum(d.prefix_tokens for d in ours) / prefix_in, 4) if prefix_in else None,
            complete=len(ours) >= self.cfg.generators,
        )

    async def stop(self) -> None:
        try:
            if self.runner is not None:
                await self.runner.stop()
        finally:
            if self.pump is not None:
                self.pump.cancel()
                await asyncio.gather(self.pump, return_exceptions=True)
            if self.poller is not None:
                await self.poller.aclose()
            if self.dcgm is not None:
                await self.dcgm.aclose()


async def run_ramp(cfg: RampConfig, on_progress: Callable[[RampProgress], None] | None = None) -> RampResult:
    """Run the whole ramp: the experiment driver over the live backend. Cancelling it (Ctrl-C)
    stops the load and keeps what finished.

    Raises:
        RampError: before any load (bad model, unreachable server) or when the server fails.
    """
    t0 = time.time()  # the live backend's clock
    exp = cfg.experiment()  # its settings checked before anything is asked of the server

    def preflight_step(message: str = "") -> None:
        if on_progress is not None:
            on_progress(RampProgress.before_load(exp, time.time() - t0, message))

    preflight_step()
    scan = None
    if cfg.trace is not None:
        preflight_step(f"reading the trace {cfg.trace.path.name}...")
        scan = await asyncio.to_thread(scan_trace, cfg.trace)
    model, context_len = await preflight(cfg.url, cfg.model, cfg.api_key)
    writer = ResultWriter(cfg.out_dir, ramp_header(cfg, model, scan))
    backend = LiveBackend(cfg, writer, model, context_len, scan)
    driver = Driver(exp if scan is None else cfg.experiment(scan), backend, writer, on_progress, t0=t0)
    try:
        driver.report("starting", 0, 0, writer.kept_note)
        # ramp.json from the start, saying running: a ramp killed (-9) in its first step leaves a file
        # that report and compare read (its runner marks it interrupted), not "no such file"
        driver.write("running")
        await driver.run(backend.start)
    finally:
        writer.close()
    return RampResult(driver.status, driver.steps, driver.knee(), model, cfg.out_dir, context_len, driver.stop_reason)
