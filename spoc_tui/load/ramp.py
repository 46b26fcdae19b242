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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, NoReturn

import httpx
import numpy as np

from spoc_tui.collectors.http import RedirectRefused, new_client, request, tls_env
from spoc_tui.collectors.poller import DcgmPoller, VllmPoller
from spoc_tui.collectors.scrape import base_url
from spoc_tui.core.errors import EXIT_USAGE, SpocError, first_line
from spoc_tui.core.files import write_atomic
from spoc_tui.core.inference import KneeEstimate, infer_knee
from spoc_tui.core.knee import (
    BisectSearch,
    FixedRates,
    FixedSpeeds,
    FixedUsers,
    Knee,
    KneeSearch,
    SaturationSearch,
    SpeedSearch,
    UserPlan,
    find_knee,
    measure_on,
    settle_due,
)
from spoc_tui.core.redact import redact_url
from spoc_tui.core.results import RampEnd, RampStatus, encode_ramp
from spoc_tui.core.sla import LevelUnit, Limit, level_text
from spoc_tui.core.steps import (
    EarlyStop,
    GpuWindow,
    RequestSample,
    ServerWindow,
    StepSummary,
    TraceFidelity,
    arrival_rate,
    badly_broken,
    client_health,
    queue_unbounded,
    summarize_step,
)
from spoc_tui.core.textsafe import safe
from spoc_tui.core.traces import TraceError, TraceRead, TraceSource
from spoc_tui.load import defaults, wire
from spoc_tui.load.defaults import (
    ABORT_FACTOR,
    ARRIVALS,
    DEFAULT_BUDGET_S,
    EXTEND_FACTOR,
    MAX_WORKERS,
    POLL_S,
    SEED,
    STEP_S,
    WARMUP_S,
    WORKERS,
    ArrivalMode,
)
from spoc_tui.load.workload import Workload
from spoc_tui.procs.group import kill_group
from spoc_tui.procs.lock import FolderLock
from spoc_tui.procs.ports import free_port

logger = logging.getLogger(__name__)

RampPhase = Literal["preflight", "starting", "warmup", "measuring", "extending", "step_done", "done"]


class RampError(SpocError):
    """A ramp that cannot start (exit code 2 for bad input, 1 otherwise) or whose server failed (1)."""


@dataclass
class RampConfig:
    """A ramp as ``spoc ramp`` and the Load screen ask for it; its defaults are theirs."""

    url: str
    workload: Workload
    plan: UserPlan
    """The levels: listed user counts, the knee search, a calibration, or open-loop rates."""
    limits: tuple[Limit, ...]
    out_dir: Path
    model: str | None = None
    step_s: float = STEP_S
    warmup_s: float = WARMUP_S
    abort_factor: float = ABORT_FACTOR
    workers: int = WORKERS
    seed: int = SEED
    tokenizer: str | None = None
    api_key: str | None = field(default=None, repr=False)
    dcgm_urls: list[str] = field(default_factory=list)
    request_timeout_s: float = 300.0
    max_step_s: float | None = None
    """A step still inconclusive at ``step_s`` is measured on up to this long [4 x step_s]."""
    spawn_rate: float | None = None
    """Users added (or stopped) per second between steps [see :func:`spawn_rate`]."""
    arrivals: ArrivalMode = ARRIVALS
    """``staggered``: users start spread over the warm-up, each waits up to a second before its
    first turn and, without think time, a little before each later one, so lockstep cannot
    persist; ``lockstep``: at each step every user (the earlier steps' too) restarts at one
    instant, once the requests in flight have ended, with no jitter (the worst case, and how
    AIPerf and GuideLLM start their probes' streams: :class:`~spoc_tui.load.runner.Cohort`)."""
    budget_s: float | None = None
    """The most seconds of load (warm-ups and extensions included) the ramp runs; no step starts
    once it is spent, and a step is measured on only while it lasts [the knee search:
    :data:`DEFAULT_BUDGET_S`; listed levels: none]."""
    early_stop: Callable[[StepSummary], str | None] | None = field(default=None, repr=False)
    """Tuning: asked every few seconds of a step's window (from a third of it on) with the window
    so far; a reason ends the step there (the trial is clearly dominated)."""

    poll_s: float = POLL_S
    """The longest time between two readings of the server's /metrics during a step's window (also
    read at its start and end; a window shorter than 10 x this is read every tenth of it, at most
    once a second).
    Not every second: vLLM renders /metrics in the process that streams the tokens (about 7 ms
    for 54 KB on the CPU build, idle), so a reading every second stalls every stream once a
    second and lengthens the ITL tail being measured (README: "The observer's cost")."""

    finalize: tuple[Path, ...] = ()
    """Other result files (a study's pareto.json) that the load generator marks ``interrupted``
    when this process dies while they still say ``running`` (ramp.json always is)."""

    trace: TraceSource | None = None
    """Replay this trace (``--trace``): each step sends its rows at a speed multiple of the plan
    (:class:`FixedSpeeds` or :class:`SpeedSearch`); the workload's profile is not used."""

    @property
    def open_loop(self) -> bool:
        """Steps of arrival rates (requests/s, Poisson) or of a trace's speed, rather than of
        concurrent users."""
        return isinstance(self.plan, FixedRates) or self.trace is not None

    def validate(self) -> None:
        """The one check of a ramp's settings, shared by ``spoc ramp``, the Load screen and a
        tuning study's trials.

        Raises:
            RampError: (exit code 2) naming the setting and what it must be.
        """

        def bad(msg: str) -> NoReturn:
            raise RampError(msg, exit_code=EXIT_USAGE)

        if not 0 < self.step_s < math.inf or not 0 <= self.warmup_s < self.step_s:
            bad("--warmup-seconds must be at least 0 and shorter than --step-seconds")
        if self.max_step_s is not None and not self.step_s <= self.max_step_s < math.inf:
            bad("--max-step-seconds must be at least --step-seconds")
        if self.budget_s is not None and not (0 if self.trace else self.step_s) < self.budget_s < math.inf:
            # (a replay's step is the trace's span over its speed: checked against the budget when it starts)
            bad("--budget must be at least one step (--step-seconds)")
        if self.arrivals not in ("staggered", "lockstep"):
            bad(f"--arrivals {self.arrivals!r}: staggered or lockstep")
        if self.spawn_rate is not None and not 0 < self.spawn_rate <= 1000:
            bad("--spawn-rate must be above 0 and at most 1000 users per second")
        if not self.abort_factor > 1:  # a tuning study's inf: never stop early
            bad("--abort-factor must be a number above 1")
        if not 0.5 <= self.poll_s <= 60:
            bad("--poll-seconds must be between 0.5 and 60")
        if not 0 <= self.workers <= MAX_WORKERS:
            bad(f"--workers must be between 0 and {MAX_WORKERS}")
        if self.tokenizer and not Path(self.tokenizer).exists():
            bad(f"--tokenizer {self.tokenizer}: no such file or folder")
        if not self.limits:
            bad("the SLA has no limit")
        speeds = isinstance(self.plan, (FixedSpeeds, SpeedSearch))
        if self.trace is not None and not speeds:
            bad("--trace replays at speed multiples: give --speed (e.g. 0.5,1,2 or auto), not --users or --rate")
        if self.trace is None and speeds:
            bad("--speed needs --trace (the trace whose timestamps it divides)")

    @property
    def generators(self) -> int:
        """Open loop: the Locust users that generate arrivals, one per worker process (or one)."""
        return max(1, self.workers)

    @property
    def step_limit_s(self) -> float:
        return self.max_step_s if self.max_step_s is not None else EXTEND_FACTOR * self.step_s

    @property
    def budget(self) -> float | None:
        """The load-time budget in force: ``budget_s``, else the knee search's default."""
        if self.budget_s is not None:
            return self.budget_s
        return DEFAULT_BUDGET_S if isinstance(self.plan, (KneeSearch, SpeedSearch)) else None

    @property
    def unit(self) -> LevelUnit:
        if self.trace is not None:
            return "x"
        return "req/s" if self.open_loop else "users"


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


async def preflight(url: str, model: str | None, api_key: str | None) -> tuple[str, int | None]:
    """Check the server and the model before any load; returns (model, max_model_len).

    Raises:
        RampError: unreachable server (1), unknown model (2), a server that fails a probe (1).
    """
    root = base_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with new_client(httpx.Timeout(30.0, connect=5.0)) as c:
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
    """``ramp.json`` (rewritten atomically after each step) and ``requests.jsonl`` (appended)."""

    def __init__(self, out_dir: Path, header: dict[str, Any]) -> None:
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
            self.requests = open(out_dir / "requests.jsonl", "w", buffering=1)
        except OSError as e:
            self.lock.release()
            raise RampError(f"--out {out_dir}: cannot write there ({e.strerror or e})", exit_code=EXIT_USAGE) from None

    def sample(self, s: RequestSample) -> None:
        if self.write_error:
            return
        try:
            self.requests.write(json.dumps(s.as_dict(), separators=(",", ":")) + "\n")
        except OSError as e:
            self.write_error = f"cannot write {self.out_dir}/requests.jsonl ({e.strerror or e})"

    def write(self, steps: list[StepSummary], knee: Knee, status: RampStatus) -> None:
        """Raises: RampError when the file cannot be written (no temporary file is left)."""
        text = encode_ramp(self.header, steps, knee, status, time.time())
        try:
            write_atomic(self.out_dir / "ramp.json", text)
        except OSError as e:
            raise RampError(f"cannot write {self.out_dir}/ramp.json ({e.strerror or e})") from None

    def close(self) -> None:
        try:
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
    """The highest queue, batch and KV-cache use the step's polls saw, and every queue reading
    (seconds into the window, requests waiting)."""

    def __init__(self) -> None:
        self.waiting: float | None = None
        self.running: float | None = None
        self.kv: float | None = None
        self.queue: list[tuple[float, float]] = []

    @staticmethod
    def _max(a: float | None, b: float | None) -> float | None:
        return b if a is None else a if b is None else max(a, b)

    def see(self, waiting: float | None, running: float | None, kv: float | None) -> None:
        self.waiting = self._max(self.waiting, waiting)
        self.running = self._max(self.running, running)
        self.kv = self._max(self.kv, kv)

    @property
    def waiting_mean(self) -> float | None:
        """The mean queue over the window: the autoscaling target `spoc plan` reads at the knee."""
        return round(sum(w for _, w in self.queue) / len(self.queue), 2) if self.queue else None


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
        out = replace(
            out,
            gpus=tuple(
                GpuWindow(
                    gpu=str(g.gpu),
                    uuid=g.uuid,
                    sm_clock_mhz=g.sm_clock_mhz,
                    sm_clock_max_mhz=g.sm_clock_max_mhz,
                    temp_c=g.temp_c,
                    power_w=g.power_w,
                    throttle_reasons=tuple(g.throttle_reasons or ()),
                    throttled_pct=tuple((g.throttled_pct or {}).items()),
                )
                for g in gt.gpus
            ),
        )
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


Report = Callable[[RampPhase, int, float, list[StepSummary], int, str], None]


DRAIN_READ_S = 1.5
"""A load generator's health report this long after a step's command has seen the new step."""
DRAIN_SILENT_S = 5.0
"""No health report at all for this long: the drain is not waited for."""


async def _drain(
    cfg: RampConfig,
    idx: int,
    level: float,
    steps: list[StepSummary],
    samples: list[RequestSample],
    health: list[wire.Health],
    report: Report,
    pump: asyncio.Task[None],
) -> float:
    """After a step down, wait until every load-generator process reports no request in flight
    that an earlier step sent, at most the step's limit (``--max-step-seconds``); the time it
    ended. The step then warms up and counts only the requests sent from then: the last level's
    backlog would queue them behind its load. (On the simulator's coding profile, 15 users after
    64 measured a TTFT p99 of 5.1 s where 15 users' own is 0.2 s, and the knee's interval left
    the truth out in 3 of 20 searches.)"""
    t0 = time.time()
    stale: int | None = None
    said = ""
    while time.time() - t0 < cfg.step_limit_s:
        if pump.done():
            raise RampError("the load generator exited; see runner.log in the output folder")
        seen = {h.process for h in health if h.t >= t0 - DRAIN_SILENT_S}
        latest = {h.process: h for h in health if h.t >= t0 + DRAIN_READ_S}
        if not seen and time.time() - t0 >= DRAIN_SILENT_S:
            break  # the load generator reports no health: nothing to wait for
        if seen and seen <= latest.keys():
            stale = sum(h.stale for h in latest.values())
            if stale == 0:
                break
        waiting = f"{stale} requests" if stale is not None else "the requests"
        note = f"waiting for {waiting} of the last level to end"
        if note != said:  # said once per change (the command line prints every report)
            report("warmup", idx, level, steps, len(samples), note)
            said = note
        await asyncio.sleep(0.5)
    return time.time()


async def _run_step(
    cfg: RampConfig,
    idx: int,
    level: float,
    runner: RunnerProcess,
    pump: asyncio.Task[None],
    samples: list[RequestSample],
    health: list[wire.Health],
    poller: VllmPoller,
    dcgm: DcgmPoller | None,
    steps: list[StepSummary],
    report: Report,
    windows: dict[int, list[RequestSample]],
    budget_left_s: float | None = None,
) -> StepSummary:
    """One step: warm up, measure for ``step_s``, and while the verdict is inconclusive measure on
    (up to ``step_limit_s``), re-deciding over the whole window; a queue that grows without bound
    ends the step at once as a break. ``level`` is a user count, or an arrival rate in open loop."""
    if cfg.open_loop:
        users = cfg.generators
        await runner.send(wire.SetUsers(users, idx, 0.0, rate=level))
        note = ""
    else:
        users = int(level)
        change = users - (steps[-1].users if steps else 0)
        rate = spawn_rate(cfg, change)
        ramp_up = abs(change) / rate
        await runner.send(wire.SetUsers(users, idx, rate))
        long = ramp_up > cfg.warmup_s
        note = f"spawning {rate:g} users/s takes {ramp_up:.0f} s, longer than the warm-up" if long else ""
    sent_from, drained_s = -math.inf, 0.0
    if steps and level < steps[-1].level:
        t0 = time.time()
        sent_from = await _drain(cfg, idx, level, steps, samples, health, report, pump)
        drained_s = sent_from - t0
    report("warmup", idx, level, steps, len(samples), note)
    await asyncio.sleep(cfg.warmup_s)
    m_start = time.time()
    peaks = _Peaks()
    poller.reset()
    await _server_view(poller, dcgm, peaks)  # baseline scrape at the start of the window
    server = ServerWindow()
    planned = cfg.step_s - cfg.warmup_s
    limit = max(planned, cfg.step_limit_s - cfg.warmup_s)
    if budget_left_s is not None:  # measure on only while the budget lasts
        limit = max(planned, min(limit, budget_left_s - cfg.warmup_s))
    search = cfg.plan if isinstance(cfg.plan, (KneeSearch, BisectSearch)) else None
    target = planned
    phase: RampPhase = "measuring"
    unbounded: str | None = None
    next_check = planned / 3
    # a knee search's step ends once its next level is plain (KneeSearch.settled), checked as often
    settle = cfg.plan if isinstance(cfg.plan, KneeSearch) else None
    asked, settled = 0, None
    # about ten readings per window (the queue-growth rule needs eight), never more than one a second
    every = min(cfg.poll_s, max(1.0, planned / 10))
    polled = time.time()
    while True:
        while (left := target - (time.time() - m_start)) > 0:
            report(phase, idx, level, steps, len(samples), "")
            await asyncio.sleep(min(1.0, left))
            if pump.done():
                raise RampError("the load generator exited; see runner.log in the output folder")
            # every poll_s, and always at the window's end (its server-side figures end there)
            if time.time() - polled >= every - 0.05 or time.time() - m_start >= target:
                polled = time.time()
                server = await _server_view(poller, dcgm, peaks)
                if server.waiting is not None:
                    peaks.queue.append((time.time() - m_start, server.waiting))
                server = replace(server, waiting_mean=peaks.waiting_mean)  # over every reading so far
                if server.waiting is not None:
                    unbounded = queue_unbounded(peaks.queue)
                    if unbounded:
                        break
            if cfg.early_stop is not None and time.time() - m_start >= next_check:
                next_check += EARLY_CHECK_S
                if early := _early(cfg, idx, users, samples, m_start, target, server):
                    return early
            if settle is not None and settle_due(time.time() - m_start, planned, asked):
                asked += 1
                if settled := _settled(settle, steps, idx, level, samples, m_start, sent_from, target, cfg.limits):
                    break
        m_end = time.time()
        # the requests that ended in the window, of those this step sent: one the last level sent
        # (a slow one still queued after a step down) measures that level's load
        in_window = [
            s for s in samples if m_start <= (s.end or s.start) <= m_end and s.step == idx and s.start >= sent_from
        ]
        windows[idx] = in_window  # the knee's inference across steps resamples them
        summary = summarize_step(
            idx,
            users,
            in_window,
            m_end - m_start,
            cfg.limits,
            open_loop=cfg.open_loop,
            rate=level if cfg.open_loop else None,
            server=server,
            client=client_health(
                [(h.process, h.t, h.cpu_s, h.lags_ms) for h in health if m_start <= h.t <= m_end + 1.0], cfg.limits
            ),
            extended_s=max(0.0, (m_end - m_start) - planned),
            drained_s=drained_s,
            unbounded=unbounded,
        )
        if settled is not None:
            return replace(summary, settled_early=settled)
        if unbounded or summary.decision != "inconclusive" or target >= limit - 1e-6:
            return summary
        # a search measures on only near a limit, and the knee search only while the knee's interval
        # is wider than it asks
        if search is not None:
            levels = [(s.level, windows.get(s.step, [])) for s in [*steps, summary]]
            # off the event loop: the inference resamples every step (about a second), and the
            # screen that runs the ramp would freeze meanwhile
            if not await asyncio.to_thread(measure_on, search, steps, summary, levels, cfg.limits, cfg.unit, cfg.seed):
                return summary
        target = min(limit, target + planned)
        phase = "extending"
        report(phase, idx, level, steps, len(samples), f"inconclusive ({summary.verdict.reason}): measuring on")


@dataclass(frozen=True, slots=True)
class TraceScan:
    """A trace read through once before any load: what each step will send."""

    rows: int
    span_s: float
    skipped: dict[str, int]

    def step_s(self, speed: float) -> float:
        return self.span_s / speed


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


def _three(values: list[float]) -> tuple[float | None, float | None, float | None]:
    if not values:
        return (None, None, None)
    p50, p99 = np.percentile(values, [50, 99])
    return (round(float(p50), 3), round(float(p99), 3), round(max(values), 3))


async def _run_trace_step(
    cfg: RampConfig,
    scan: TraceScan,
    idx: int,
    speed: float,
    runner: RunnerProcess,
    pump: asyncio.Task[None],
    samples: list[RequestSample],
    health: list[wire.Health],
    done: list[wire.TraceDone],
    poller: VllmPoller,
    dcgm: DcgmPoller | None,
    steps: list[StepSummary],
    report: Report,
    windows: dict[int, list[RequestSample]],
) -> StepSummary:
    """One replay of the trace at ``speed``: every row sent at its timestamp divided by the speed
    (open loop), the step ending when every process has sent its rows and their requests ended.
    Its figures are over all its requests (the replay is the measurement), and its ``trace``
    says how faithfully it kept the schedule."""
    t0 = time.time() + TRACE_START_S
    await runner.send(wire.SetUsers(cfg.generators, idx, 0.0, speed=speed, t0=t0))
    length = scan.step_s(speed)
    peaks = _Peaks()
    poller.reset()
    await _server_view(poller, dcgm, peaks)
    server = ServerWindow()
    every = min(cfg.poll_s, max(1.0, length / 10))
    polled = time.time()
    deadline = t0 + length + cfg.request_timeout_s + 30
    unbounded: str | None = None
    while len([d for d in done if d.step == idx]) < cfg.generators:
        if pump.done():
            raise RampError("the load generator exited; see runner.log in the output folder")
        if time.time() > deadline:
            logger.warning("trace step %d: not every process reported its end; the step ends at its deadline", idx)
            break
        sent_so_far = sum(1 for s in samples if s.step == idx)
        msg = f"x{speed:g}: {sent_so_far} of {scan.rows} rows answered"
        report("measuring", idx, speed, steps, len(samples), msg)
        await asyncio.sleep(0.5)
        if time.time() - polled >= every - 0.05:
            polled = time.time()
            server = await _server_view(poller, dcgm, peaks)
            if server.waiting is not None:
                peaks.queue.append((time.time() - t0, server.waiting))
                unbounded = unbounded or queue_unbounded(peaks.queue)
            server = replace(server, waiting_mean=peaks.waiting_mean)
    server = replace(await _server_view(poller, dcgm, peaks), waiting_mean=peaks.waiting_mean)
    m_end = time.time()
    mine = [s for s in samples if s.step == idx]
    windows[idx] = mine
    ends = [s.end or s.start for s in mine]
    duration = max(length, (max(ends) if ends else m_end) - t0, 1e-3)
    ours = [d for d in done if d.step == idx]
    skipped: dict[str, int] = {}
    for d in ours:
        for why, c in d.skipped.items():
            skipped[why] = skipped.get(why, 0) + c
    sent = [s for s in mine if s.scheduled is not None]
    starts = sorted(s.start for s in sent)
    prefix_in = sum(d.input_tokens for d in ours)
    fidelity = TraceFidelity(
        rows=sum(d.rows for d in ours) if ours else scan.rows,
        sent=sum(d.sent for d in ours) if ours else len(sent),
        skipped=skipped,
        lag_ms=_three([(s.start - s.scheduled - (s.held_s or 0.0)) * 1000 for s in sent if s.scheduled is not None]),
        held_back=sum(1 for s in sent if (s.held_s or 0.0) > 0.001),
        rate=arrival_rate(len(starts), starts[-1] - starts[0]) if starts else None,
        trace_rate=arrival_rate(scan.rows, length),
        prefix_share=round(sum(d.prefix_tokens for d in ours) / prefix_in, 4) if prefix_in else None,
        server_hit_rate=server.prefix_cache_hit_rate,
        length_error=_three(
            [
                float(abs(s.prompt_tokens - s.planned_input))
                for s in sent
                if s.ok and s.prompt_tokens is not None and s.planned_input is not None
            ]
        ),
    )
    summary = summarize_step(
        idx,
        cfg.generators,
        mine,
        duration,
        cfg.limits,
        open_loop=True,
        server=server,
        client=client_health(
            [(h.process, h.t, h.cpu_s, h.lags_ms) for h in health if t0 <= h.t <= m_end + 1.0], cfg.limits
        ),
        unbounded=unbounded,
    )
    return replace(summary, speed=speed, trace=replace(fidelity, cached_share=summary.cached_prompt_fraction))


def budget_spent(cfg: RampConfig, knee: Knee | None) -> str:
    """Why a ramp stopped at its budget, with the interval it reached."""
    reached = knee.inferred.text if knee is not None and knee.inferred is not None else "no knee yet"
    return f"the budget ({(cfg.budget or 0) / 60:g} min of load) is spent; the knee so far: {reached}"


EARLY_CHECK_S = 5.0
EARLY_MIN_REQUESTS = 10


def _early(
    cfg: RampConfig,
    idx: int,
    users: int,
    samples: list[RequestSample],
    m_start: float,
    target: float,
    server: ServerWindow,
) -> StepSummary | None:
    """The window so far, when ``cfg.early_stop`` says the trial is clearly dominated (asked
    every :data:`EARLY_CHECK_S` seconds from a third of the planned window on), with at least
    :data:`EARLY_MIN_REQUESTS` requests."""
    now = time.time()
    elapsed = now - m_start
    if cfg.early_stop is None:
        return None
    window = [s for s in samples if m_start <= (s.end or s.start) <= now]
    if len(window) < EARLY_MIN_REQUESTS:
        return None
    summary = summarize_step(idx, users, window, elapsed, cfg.limits, open_loop=cfg.open_loop, server=server)
    reason = cfg.early_stop(summary)
    if not reason:
        return None
    return replace(summary, stopped_early=EarlyStop(reason, round(max(0.0, target - elapsed), 1)))


def _settled(
    search: KneeSearch,
    steps: list[StepSummary],
    idx: int,
    level: float,
    samples: list[RequestSample],
    m_start: float,
    sent_from: float,
    target: float,
    limits: tuple[Limit, ...],
) -> EarlyStop | None:
    """Why the knee search's step can end now, its next level being plain from the window so far
    (:meth:`KneeSearch.settled`), and the planned seconds it saves; else None."""
    now = time.time()
    window = [s for s in samples if m_start <= (s.end or s.start) <= now and s.step == idx and s.start >= sent_from]
    why = search.settled(steps, level, window, limits)
    return EarlyStop(why, round(max(0.0, target - (now - m_start)), 1)) if why else None


async def run_ramp(cfg: RampConfig, on_progress: Callable[[RampProgress], None] | None = None) -> RampResult:
    """Run the whole ramp. Cancelling it (Ctrl-C) stops the load and keeps what finished.

    Raises:
        RampError: before any load (bad model, unreachable server) or when the server fails.
    """
    t_start = time.monotonic()
    load_started: float | None = None
    """When the first step's load began (the budget counts from there)."""

    def budget_left() -> float | None:
        b = cfg.budget
        if b is None:
            return None
        return b if load_started is None else max(0.0, b - (time.monotonic() - load_started))

    knees: dict[int, Knee] = {}
    """The knee after each step, computed once (its inference resamples every step's requests)."""

    def report(
        phase: RampPhase, step: int, users: float, steps: list[StepSummary], samples: int, message: str = ""
    ) -> None:
        if on_progress:
            on_progress(
                RampProgress(
                    phase=phase,
                    step=step,
                    users=users,
                    elapsed_s=time.monotonic() - t_start,
                    step_s=cfg.step_s,
                    samples=samples,
                    steps=tuple(steps),
                    knee=knees.get(len(steps)) if steps else None,
                    message=message,
                    open_loop=cfg.open_loop,
                    budget_left_s=budget_left(),
                    unit=cfg.unit,
                )
            )

    report("preflight", 0, 0, [], 0)
    scan: TraceScan | None = None
    if cfg.trace is not None:
        report("preflight", 0, 0, [], 0, f"reading the trace {cfg.trace.path.name}...")
        scan = await asyncio.to_thread(scan_trace, cfg.trace)
    model, context_len = await preflight(cfg.url, cfg.model, cfg.api_key)
    header = {
        "url": redact_url(cfg.url),
        "model": model,
        "profile": cfg.workload.as_dict()
        if not cfg.workload.replay
        else {"name": cfg.workload.name, "source": cfg.workload.source},
        "sla": [str(lim) for lim in cfg.limits],
        "users": cfg.plan.describe(),
        "load": (
            "trace replay: every row sent at its timestamp divided by the step's speed (open loop), as a "
            "streamed completion of the row's input tokens with its output forced (ignore_eos); rows sharing "
            "hash ids share leading text; a turn waits for its parent's end plus its think time"
            if cfg.trace is not None
            else "open loop: Poisson arrivals at each step's rate; each arrival is the next turn of an idle "
            "conversation (or a new one), with no think time"
            if cfg.open_loop
            else "closed loop: each user is one conversation at a time, with the profile's think time"
        ),
        "step_seconds": cfg.step_s,
        "max_step_seconds": cfg.step_limit_s,
        "warmup_seconds": cfg.warmup_s,
        "abort_factor": cfg.abort_factor,
        "workers": cfg.workers,
        "spawn_rate": cfg.spawn_rate or "auto: within half the warm-up, 1-100 users/s",
        "arrivals": cfg.arrivals,
        "budget_seconds": cfg.budget,
        "seed": cfg.seed,
        "started_at": time.time(),
        "intervals": (
            "95 %: order statistics for per-request percentiles (TTFT, TPOT, E2E), Poisson bootstrap by "
            "request for ITL, means and rates, Clopper-Pearson for the error rate; decision meets/breaks only "
            "when the interval lies wholly within/beyond the limit"
        ),
        "metric_definitions": (
            "vllm bench serve: TTFT first event with choices; ITL pooled gaps between events with choices; "
            "E2E to the last such event; TPOT (E2E-TTFT)/(out-1); goodput per request"
        ),
    }
    if cfg.trace is not None and scan is not None:
        header["trace"] = cfg.trace.header(scan.rows, scan.skipped, scan.span_s)
        header["profile"] = {"name": f"trace:{cfg.trace.path.name}"}
    writer = ResultWriter(cfg.out_dir, header)
    runner = RunnerProcess(cfg, model, context_len, cfg.out_dir)
    samples: list[RequestSample] = []
    health: list[wire.Health] = []
    trace_done: list[wire.TraceDone] = []
    steps: list[StepSummary] = []
    windows: dict[int, list[RequestSample]] = {}

    def inferred(steps: list[StepSummary]) -> KneeEstimate | None:
        levels = [(s.level, windows.get(s.step, [])) for s in steps]
        return infer_knee(levels, cfg.limits, cfg.unit, seed=cfg.seed)

    def knee_of(steps: list[StepSummary]) -> Knee:
        """The knee from the decisions, and inferred across every step's requests so far."""
        if len(steps) not in knees:
            knees[len(steps)] = find_knee(steps, inferred(steps))
        return knees[len(steps)]

    async def infer(steps: list[StepSummary]) -> None:
        """:func:`knee_of` for these steps computed off the event loop (it resamples every step's
        requests, about a second), so the screen running the ramp stays live."""
        if len(steps) not in knees:
            knees[len(steps)] = find_knee(steps, await asyncio.to_thread(inferred, steps))

    status: RampEnd = "interrupted"
    stop_reason = ""
    poller = VllmPoller([cfg.url], window_s=max(1.0, cfg.step_limit_s), api_key=cfg.api_key)
    dcgm = DcgmPoller(cfg.dcgm_urls, window_s=cfg.step_s) if cfg.dcgm_urls else None
    pump: asyncio.Task[None] | None = None
    try:
        kept = f"the folder's earlier results were moved to {writer.kept}/" if writer.kept else ""
        report("starting", 0, 0, steps, 0, kept)
        # ramp.json from the start, saying running: a ramp killed (-9) in its first step leaves a file
        # that report and compare read (its runner marks it interrupted), not "no such file"
        writer.write(steps, knee_of(steps), "running")
        await runner.start()
        if runner.lengths:
            writer.header["prompt_lengths"] = runner.lengths

        async def pump_samples() -> None:
            while True:
                ev = await runner.events.get()
                if isinstance(ev, wire.Sample):
                    samples.append(ev.sample)
                    writer.sample(ev.sample)
                elif isinstance(ev, wire.Health):
                    health.append(ev)
                elif isinstance(ev, wire.TraceDone):
                    trace_done.append(ev)
                elif isinstance(ev, wire.RunnerFailed):
                    logger.warning("load generator: %s", ev.message)
                elif isinstance(ev, wire.Exited):
                    return

        pump = asyncio.create_task(pump_samples())
        plan = cfg.plan
        idx = 0
        while (level := plan.next(steps, knee_of(steps) if steps else None)) is not None:
            left = budget_left()
            step_len = scan.step_s(level) if scan is not None else cfg.step_s
            if left is not None and left < step_len:
                if scan is not None and not steps:
                    raise RampError(
                        f"a replay at x{level:g} takes {step_len / 60:.1f} min, more than the budget "
                        f"({left / 60:g} min): give a larger --budget, or a shorter --trace-window",
                        exit_code=EXIT_USAGE,
                    )
                stop_reason = budget_spent(cfg, knee_of(steps) if steps else None)
                break
            if load_started is None:
                load_started = time.monotonic()
            idx += 1
            if scan is not None:
                summary = await _run_trace_step(
                    cfg,
                    scan,
                    idx,
                    level,
                    runner,
                    pump,
                    samples,
                    health,
                    trace_done,
                    poller,
                    dcgm,
                    steps,
                    report,
                    windows,
                )
            else:
                summary = await _run_step(
                    cfg, idx, level, runner, pump, samples, health, poller, dcgm, steps, report, windows, budget_left()
                )
            steps.append(summary)
            await infer(steps)
            writer.write(steps, knee_of(steps), "running")
            report("step_done", idx, level, steps, len(samples))
            if writer.write_error:
                raise RampError(f"{writer.write_error}: the ramp stopped after step {idx}")
            if (
                summary.requests
                and summary.errors == summary.requests
                and set(summary.errors_by_kind) <= {"connect", "http_5xx"}
            ):
                status = "server_failed"
                raise RampError(
                    f"every request of step {idx} failed ({', '.join(summary.errors_by_kind)}): the server failed"
                )
            if summary.stopped_early:
                status, stop_reason = "stopped_early", summary.stopped_early.reason
                break
            why = badly_broken(summary, cfg.abort_factor)
            if why and isinstance(plan, (FixedUsers, FixedRates, FixedSpeeds)) and plan.next(steps) is not None:
                status, stop_reason = "stopped_early", why
                break
        status = "complete" if status == "interrupted" else status
        if status == "complete" and not stop_reason and isinstance(plan, KneeSearch):
            stop_reason = plan.stop_reason(steps, knee_of(steps) if steps else None)
    finally:
        knee = knee_of(steps)
        writer.header["stop_reason"] = stop_reason
        try:
            await runner.stop()
        finally:
            if pump is not None:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
            try:
                writer.write(steps, knee, status)
            finally:
                writer.close()
                await poller.aclose()
                if dcgm is not None:
                    await dcgm.aclose()
    report("done", len(steps), steps[-1].level if steps else 0, steps, len(samples))
    return RampResult(status, steps, knee, model, cfg.out_dir, context_len, stop_reason)
