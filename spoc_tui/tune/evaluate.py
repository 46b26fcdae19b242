"""Scoring one configuration: start the server with its flags, run the ramp, stop the server.

:class:`ServerEvaluator` is the real thing (a launch template for ``vllm serve`` or
``spoc sim``, the same Locust ramp as ``spoc ramp``). :class:`FastSimEvaluator` runs the
simulated engine in virtual time instead (no sockets, no sleeping: a trial takes a fraction of
a second), which the search-quality benchmark uses to try every configuration of a space.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

from spoc_tui.core.errors import SpocError
from spoc_tui.core.ramp.knee import Knee, UserPlan, find_knee
from spoc_tui.core.ramp.steps import EarlyStop, RequestSample, StepSummary
from spoc_tui.core.tuning.docs import TrialStatus
from spoc_tui.core.tuning.space import Config, command_line
from spoc_tui.load.ramp import RampConfig, RampError, RampProgress, RampResult, run_ramp
from spoc_tui.procs.ports import free_port
from spoc_tui.procs.server import LaunchError, ServerProcess
from spoc_tui.tune.events import EvaluatorEvent, ServerReady, ServerStarting, TrialRampProgressed

logger = logging.getLogger(__name__)
T = TypeVar("T")

INTERRUPT_STOP_S = 30.0
"""How long a cancelled ramp may take to stop its load generator and write its results after
Ctrl-C before the study stops waiting for it (the load generator notices its parent's end)."""


def _where_tasks_wait(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    """Say (terminal and spoc.log) that a cancelled ramp outlived its ``seconds``, with where
    every task of the loop waits: a defect, said where the user (and a test) sees it."""
    stacks = []
    for t in asyncio.all_tasks(loop):
        frames = t.get_stack(limit=8)
        where = " <- ".join(f"{f.f_code.co_name} ({Path(f.f_code.co_filename).name}:{f.f_lineno})" for f in frames)
        stacks.append(f"{t.get_name()}: {where or 'not started'}")
    text = f"the ramp did not stop within {seconds:.0f} s of the interrupt; its tasks wait in: {'; '.join(stacks)}"
    logger.warning("%s", text)
    print(f"spoc: {text}", file=sys.stderr)


def stop_within(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], seconds: float) -> None:
    """Run ``loop`` until the cancelled ``task`` has finished its clean-up, at most ``seconds``.
    A clean-up that outlives it is logged with where every task of the loop waits, and left: the
    interrupt goes on, the server is stopped, the process exits."""
    done, _ = loop.run_until_complete(asyncio.wait({task}, timeout=seconds))
    if task in done:
        with contextlib.suppress(asyncio.CancelledError, RampError):
            task.result()
        return
    _where_tasks_wait(loop, seconds)


def run_interruptible(loop: asyncio.AbstractEventLoop, task: asyncio.Task[T], stop_s: float) -> T:
    """Run ``task`` on ``loop``; Ctrl-C (and SIGTERM or SIGHUP, handed to it by
    :mod:`spoc_tui.cli.signals`) cancels it from inside the loop, waits at most ``stop_s`` for its
    clean-up, then raises ``KeyboardInterrupt``. A second Ctrl-C stops waiting.

    Not ``KeyboardInterrupt`` raised wherever the loop happens to be, as a plain
    ``run_until_complete`` under Python's default handler gets it: raised between a callback's
    removal from the loop's queue and its run, it loses that callback (a task's wake-up), and the
    cancelled ramp then waits for ever on an idle loop. That is how ``spoc tune`` beside a CPU hog
    hung after Ctrl-C with its load generator alive. This is what ``asyncio.run`` does for
    ``spoc ramp``, with the bound on the clean-up added. Off the main thread, or under a SIGINT
    handler someone else set, the loop runs as it is (a study in the TUI is stopped by
    :meth:`ServerEvaluator.stop` instead)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        try:
            return loop.run_until_complete(task)
        except KeyboardInterrupt:
            task.cancel()
            stop_within(loop, task, stop_s)
            raise
    interrupted = False
    late = False
    deadline: asyncio.TimerHandle | None = None

    def overdue() -> None:
        nonlocal late
        late = True
        _where_tasks_wait(loop, stop_s)
        loop.stop()

    def cancel() -> None:
        nonlocal deadline
        if task.done():
            return
        task.cancel()
        deadline = loop.call_later(stop_s, overdue)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        if interrupted:
            raise KeyboardInterrupt  # the second: stop waiting for the clean-up
        interrupted = True
        loop.call_soon_threadsafe(cancel)  # in the loop, between its callbacks

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        result = loop.run_until_complete(task)
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    except RuntimeError:
        if late:  # the loop was stopped with the clean-up still going
            raise KeyboardInterrupt from None
        raise
    except RampError:
        if interrupted:  # the ramp's failure while stopping: the interrupt is what the user asked
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        if deadline is not None:  # the loop runs on (a study's next trial): no stop left in it
            deadline.cancel()
    if interrupted:  # finished as the interrupt came: the study still stops
        raise KeyboardInterrupt
    return result


OnEvent = Callable[[EvaluatorEvent], None]


class TuneFatal(SpocError, RuntimeError):
    """Not the configuration's fault (the port is taken, the command does not exist): stop the study."""


@dataclass(frozen=True)
class TrialPlan:
    """What the study decided for one trial, handed to the evaluator with it: the levels its ramp
    steps (a calibration's :class:`SaturationSearch`, then the reference load) and what it asks
    during a step (whether the trial is already clearly dominated: a reason ends the step)."""

    plan: UserPlan
    early_stop: Callable[[StepSummary], str | None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class TrialRequest:
    """One trial as the study hands it to an :class:`Evaluator`: the configuration, its server
    flags, the folder for its files, where its progress goes, and what the study decided for it
    (None: the ramp's own levels, no early stop)."""

    config: Config
    flags: tuple[str, ...] = ()
    trial_dir: Path | None = None
    on_event: OnEvent | None = field(default=None, compare=False)
    plan: TrialPlan | None = None


class Evaluator(Protocol):
    """Scores one configuration: :class:`ServerEvaluator` (a real server and a ramp) or
    :class:`FastSimEvaluator` (the simulator in virtual time)."""

    ramp: RampConfig
    """The ramp every trial runs, as built: the study never changes it (its ``url`` and
    ``out_dir`` are each trial's, its levels each :class:`TrialPlan`'s)."""

    def evaluate(self, req: TrialRequest) -> TrialOutcome:
        """Run the request's configuration and say how it did (the configuration's own failures
        are ``infeasible`` outcomes, not exceptions).

        Raises:
            TuneFatal: a problem no configuration can get past (the port is taken...).
        """
        ...

    def stop(self) -> None:
        """Interrupt a running evaluation (thread-safe); it returns ``interrupted``."""
        ...


@dataclass
class TrialOutcome:
    status: TrialStatus
    steps: list[StepSummary] = field(default_factory=list)
    knee: Knee = field(default_factory=lambda: Knee(None, None, None))
    reason: str = ""
    log_tail: str = ""
    start_s: float | None = None
    kv_tokens: int | None = None
    max_model_len: int | None = None
    tokens_per_request: float | None = None
    """Mean prompt + output tokens of the measured requests (for the KV-derived seed)."""
    duration_s: float = 0.0
    early_stop: EarlyStop | None = None
    """The reference step stopped early, clearly dominated: ``reason`` and ``saved_s``."""


def tokens_per_request(samples: Sequence[RequestSample]) -> float | None:
    """Mean prompt + output tokens of the requests that succeeded (the KV-derived seed's unit)."""
    tot = [(s.prompt_tokens or 0) + (s.output_tokens or 0) for s in samples if s.ok]
    return sum(tot) / len(tot) if tot else None


_ERROR_LINE = re.compile(r"(Error|Exception|error:|refus|Illegal|Killed)", re.I)


def failure_reason(message: str, tail: str) -> str:
    """One line saying why a server failed: out of memory, or its last error line."""
    low = tail.lower()
    if "out of memory" in low or "outofmemoryerror" in low or "cannot allocate memory" in low:
        return f"out of memory ({message})"
    noise = ('File "', "For further information", "Traceback", "^", "~")
    lines = [
        ln.strip()
        for ln in tail.splitlines()
        if ln.strip() and _ERROR_LINE.search(ln) and not ln.strip().startswith(noise)
    ]
    if lines:
        line = re.sub(r"\s*\[type=.*$", "", lines[-1])  # pydantic's input dump
        return f"{message}: {line[:300]}"
    return message


class ServerEvaluator:
    """Launch template + ramp. Thread-safe ``stop()`` interrupts a running trial."""

    def __init__(
        self,
        template: Sequence[str],
        ramp: RampConfig,
        *,
        env: dict[str, str] | None = None,
        port: int | None = None,
        start_timeout: float = 600.0,
        marker: Path | None = None,
    ) -> None:
        self.template = list(template)
        self.ramp = ramp
        self.env = env or {}
        self.port = port
        self.start_timeout = start_timeout
        self.marker = marker
        self._server: ServerProcess | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)
        srv = self._server
        if srv is not None and srv.proc is not None and self._task is None:
            srv.stop(grace=5.0)  # still starting: the readiness loop sees it exit

    def evaluate(self, req: TrialRequest) -> TrialOutcome:
        if req.trial_dir is None:
            raise ValueError("a trial on a server needs a folder for its server log and ramp")
        flags, trial_dir = list(req.flags), req.trial_dir
        emit: OnEvent = req.on_event or (lambda ev: None)
        trial = req.plan or TrialPlan(self.ramp.plan)
        t0 = time.monotonic()
        port = self.port or free_port()
        argv = command_line(self.template, flags, port)
        trial_dir.mkdir(parents=True, exist_ok=True)
        server = ServerProcess(argv, port, trial_dir / "server.log", self.env, guard=True, marker=self.marker)
        self._server = server
        emit(ServerStarting(tuple(argv), port, str(server.log_path)))
        try:
            try:
                start_s = server.start(timeout=self.start_timeout)
            except LaunchError as e:
                if self._stopping.is_set():
                    return TrialOutcome(
                        "interrupted", reason="stopped while the server was starting", duration_s=time.monotonic() - t0
                    )
                if e.kind in ("port", "exec"):
                    raise TuneFatal(str(e)) from None
                return TrialOutcome(
                    "infeasible",
                    reason=failure_reason(f"server did not start ({e})", e.log_tail),
                    log_tail=e.log_tail,
                    duration_s=time.monotonic() - t0,
                )
            emit(ServerReady(start_s, server.url))
            kv_tokens = _kv_tokens(server.url)
            try:
                steps, knee, mml = self._run_ramp(server.url, trial_dir, emit, trial)
            except asyncio.CancelledError:
                return TrialOutcome(
                    "interrupted", reason="stopped during the ramp", start_s=start_s, duration_s=time.monotonic() - t0
                )
            except RampError as e:
                tail = server.log_tail()
                if not server.alive():
                    code = server.proc.returncode if server.proc else None
                    return TrialOutcome(
                        "infeasible",
                        reason=failure_reason(f"server exited under load (code {code})", tail),
                        log_tail=tail,
                        start_s=start_s,
                        duration_s=time.monotonic() - t0,
                    )
                return TrialOutcome(
                    "infeasible",
                    reason=f"ramp failed: {e}",
                    log_tail=tail,
                    start_s=start_s,
                    duration_s=time.monotonic() - t0,
                )
            if not server.alive():
                tail = server.log_tail()
                return TrialOutcome(
                    "infeasible",
                    reason=failure_reason("server exited during the ramp", tail),
                    log_tail=tail,
                    steps=steps,
                    knee=knee,
                    start_s=start_s,
                    duration_s=time.monotonic() - t0,
                )
            samples = _read_samples(trial_dir / "requests.jsonl")
            return TrialOutcome(
                "ok",
                steps,
                knee,
                early_stop=next((s.stopped_early for s in steps if s.stopped_early), None),
                start_s=start_s,
                kv_tokens=kv_tokens,
                max_model_len=mml,
                tokens_per_request=tokens_per_request(samples),
                duration_s=time.monotonic() - t0,
            )
        finally:
            server.stop()
            self._server = None

    def _run_ramp(
        self, url: str, trial_dir: Path, emit: OnEvent, trial: TrialPlan
    ) -> tuple[list[StepSummary], Knee, int | None]:
        cfg = replace(
            self.ramp,
            url=url,
            out_dir=trial_dir,
            plan=trial.plan,
            max_step_s=self.ramp.step_s,  # a trial's steps are not extended: its budget is the study's to spend
            early_stop=trial.early_stop,
            # a study's trial folders are <study>/trials/NNNN: its pareto.json gets a final status
            # even if the study is killed outright
            finalize=(trial_dir.parent.parent / "pareto.json",) if trial_dir.parent.name == "trials" else (),
        )

        def progress(p: RampProgress) -> None:
            emit(TrialRampProgressed(p))

        async def go() -> RampResult:
            self._task = asyncio.current_task()
            return await run_ramp(cfg, progress)

        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            if self._stopping.is_set():
                raise asyncio.CancelledError
            # Ctrl-C (or SIGTERM/SIGHUP, turned into it) cancels the ramp, which stops its load
            # generator and writes ramp.json as interrupted before the loop closes
            result = run_interruptible(loop, loop.create_task(go()), INTERRUPT_STOP_S)
        finally:
            self._task = None
            self._loop = None
            loop.close()
        return result.steps, result.knee, result.max_model_len


def _kv_tokens(url: str) -> int | None:
    import httpx

    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.core.metrics.vllm import cache_config

    try:
        r = httpx.get(url + "/metrics", timeout=5.0)
        cfg = cache_config(parse_text(r.text, r.headers.get("content-type")))
        return int(cfg["num_gpu_blocks"]) * int(cfg["block_size"])
    except (httpx.HTTPError, KeyError, ValueError, TypeError):
        return None


def _read_samples(path: Path) -> list[RequestSample]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(RequestSample.from_dict(json.loads(line)))
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError as e:  # no requests file (the ramp failed before any request): no samples
        logger.debug("no samples from %s: %s", path, e)
    return out


# -- the simulator in virtual time -----------------------------------------------------------

SIM_FLAGS = {
    "max-num-seqs": int,
    "max-num-batched-tokens": int,
    "enable-chunked-prefill": bool,
    "enable-prefix-caching": bool,
    "gpu-memory-utilization": float,
    "block-size": int,
    "max-model-len": int,
    "kv-cache-dtype": str,
    "quantization": str,
}


class FastSimEvaluator:
    """Every step of the ramp simulated in virtual time with closed-loop chat users.

    Deterministic for a given configuration and seed, so a whole space can be tabulated once.
    """

    def __init__(
        self, ramp: RampConfig, model: str = "llama-3.1-8b", gpu: str = "h100-80gb", fixed: Config | None = None
    ) -> None:
        if ramp.workload.mix or ramp.workload.replay:
            raise ValueError("the simulator's fast mode takes a simple profile (not a mix or a replay)")
        self.ramp = ramp
        self.model = model
        self.gpu = gpu
        self.fixed = fixed or {}

    def stop(self) -> None:
        pass

    def evaluate(self, req: TrialRequest) -> TrialOutcome:
        from spoc_tui.core.ramp.experiment import Driver, run_now
        from spoc_tui.sim.backend import VirtualBackend
        from spoc_tui.sim.engine import SimEngine
        from spoc_tui.sim.options import SimConfigError, SimOptions
        from spoc_tui.sim.run import build
        from spoc_tui.sim.virtual import VirtualServer

        config, trial = req.config, req.plan
        t0 = time.monotonic()
        kw: dict[str, Any] = {}
        for k, v in {**self.fixed, **config}.items():
            if k not in SIM_FLAGS:
                return TrialOutcome("infeasible", reason=f"the simulator has no --{k}")
            kw[k.replace("-", "_")] = v
        opts = SimOptions(model=self.model, gpu=self.gpu, seed=self.ramp.seed, dcgm_port=None, **kw)
        ramp = replace(self.ramp, plan=trial.plan) if trial is not None else self.ramp
        engines: list[SimEngine] = []

        def fresh(idx: int, users: int) -> VirtualServer:
            # each level on an engine of its own, its answers as long as the profile draws them
            # (the fast mode's rule since it was built)
            engine, _ = build(opts)
            engines.append(engine)
            return VirtualServer(
                engine, ramp.workload, users, seed=ramp.seed * 7_919 + idx, spread_s=1.0, ignore_eos=True
            )

        # the driver's loop, as a measured trial's, with no step measured on past its window and no
        # early stop (each level's figures are the trial's whole record)
        exp = ramp.experiment()
        exp = replace(exp, rules=replace(exp.rules, max_step_s=ramp.step_s), abort_factor=math.inf, early_stop=None)
        try:
            runs = run_now(Driver(exp, VirtualBackend(fresh=fresh), knee_each_step=False).run())
        except SimConfigError as e:
            return TrialOutcome(
                "infeasible", reason=f"server did not start: {e}", log_tail=str(e), duration_s=time.monotonic() - t0
            )
        steps = [r.step for r in runs]
        samples_all = [s for r in runs for s in r.window]
        assert engines, "a plan with no level"
        engine = engines[-1]
        return TrialOutcome(
            "ok",
            steps,
            find_knee(steps),
            start_s=0.0,
            kv_tokens=engine.plan.kv_cache_tokens,
            max_model_len=engine.max_len,
            tokens_per_request=tokens_per_request(samples_all),
            duration_s=time.monotonic() - t0,
        )
