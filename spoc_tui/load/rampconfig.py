"""A ramp as ``spoc ramp``, the Load screen, a study's trial and a prediction ask for it
(:class:`RampConfig`: its defaults are theirs, its checks the one place a ramp is refused), and
the error a ramp that cannot run raises (:class:`RampError`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

from spoc_tui.core.errors import EXIT_USAGE, SpocError
from spoc_tui.core.ramp.experiment import Experiment, experiment_of
from spoc_tui.core.ramp.knee import (
    FixedRates,
    FixedSpeeds,
    SpeedSearch,
    UserPlan,
)
from spoc_tui.core.ramp.sla import LevelUnit, Limit
from spoc_tui.core.ramp.steps import StepShadow, StepSummary
from spoc_tui.core.redact import redact_url
from spoc_tui.core.results import RampHeader
from spoc_tui.core.traces.read import TraceSource
from spoc_tui.load import defaults
from spoc_tui.load.defaults import (
    ABORT_FACTOR,
    MAX_WORKERS,
    POLL_S,
    WORKERS,
    rules_error,
)
from spoc_tui.workload import Workload, WorkloadError, load_tokenizer


class RampError(SpocError):
    """A ramp that cannot start (exit code 2 for bad input, 1 otherwise) or whose server failed (1)."""


@dataclass(frozen=True)
class RampConfig(defaults.StepRules):
    """A ramp as ``spoc ramp`` and the Load screen ask for it: its step rules (declared once,
    :class:`~spoc_tui.core.ramp.rules.StepRules`: ``step_s``, ``warmup_s``, ``max_step_s``,
    ``budget_s``, ``spawn_rate``, ``arrivals`` (what each mode does: docs/ramps.md), ``seed``)
    and what it runs against; its defaults are theirs."""

    url: str
    workload: Workload
    plan: UserPlan
    """The levels: listed user counts, the knee search, a calibration, or open-loop rates."""
    limits: tuple[Limit, ...]
    out_dir: Path
    model: str | None = None
    abort_factor: float = ABORT_FACTOR
    workers: int = WORKERS
    tokenizer: str | None = None
    api_key: str | None = field(default=None, repr=False)
    dcgm_urls: list[str] = field(default_factory=list)
    request_timeout_s: float = 300.0
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

    shadow: Callable[[Sequence[StepSummary]], StepShadow | None] | None = field(default=None, repr=False)
    """``--twin``: the twin's prediction of each step as it is measured, kept on the step
    (:class:`~spoc_tui.twin.shadow.ShadowTwin`)."""

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

        if (why := rules_error(self, self.trace is not None)) is not None:
            bad(why)
        if not self.abort_factor > 1:  # a tuning study's inf: never stop early
            bad("--abort-factor must be a number above 1")
        if not 0.5 <= self.poll_s <= 60:
            bad("--poll-seconds must be between 0.5 and 60")
        if not 0 <= self.workers <= MAX_WORKERS:
            bad(f"--workers must be between 0 and {MAX_WORKERS}")
        if self.tokenizer and not Path(self.tokenizer).exists():
            bad(f"--tokenizer {self.tokenizer}: no such file or folder")
        if self.tokenizer:
            try:
                load_tokenizer(self.tokenizer)  # read here: a bad file is one line, not a failed load generator
            except WorkloadError as e:
                bad(str(e))
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

    def experiment(self, scan: TraceScan | None = None) -> Experiment:
        """The experiment the driver runs (``scan``: the trace a replay's steps send)."""
        return experiment_of(
            self,
            abort_factor=self.abort_factor,
            seed=self.seed,
            poll_s=self.poll_s,
            early_stop=self.early_stop,
            replay_s=scan.step_s if scan is not None else None,
            replay_grace_s=self.request_timeout_s + 30,
            error=RampError,
            shadow=self.shadow,
        )

    @property
    def unit(self) -> LevelUnit:
        if self.trace is not None:
            return "x"
        return "req/s" if self.open_loop else "users"


@dataclass(frozen=True, slots=True)
class TraceScan:
    """A trace read through once before any load: what each step will send."""

    rows: int
    span_s: float
    skipped: dict[str, int]

    def step_s(self, speed: float) -> float:
        return self.span_s / speed


def ramp_header(cfg: RampConfig, model: str, scan: TraceScan | None) -> RampHeader:
    """ramp.json's settings (before its steps): what was run, and how its figures are defined."""
    trace: dict[str, object] | None = None
    if cfg.trace is not None and scan is not None:
        trace = cfg.trace.header(scan.rows, scan.skipped, scan.span_s)
        profile: dict[str, object] = {"name": f"trace:{cfg.trace.path.name}"}
    elif cfg.workload.replay:
        profile = {"name": cfg.workload.name, "source": cfg.workload.source}
    else:
        profile = cfg.workload.as_dict()
    return replace(
        RampHeader.of_rules(cfg),
        url=redact_url(cfg.url),
        model=model,
        profile=profile,
        sla=tuple(str(lim) for lim in cfg.limits),
        users=cfg.plan.describe(),
        load=(
            "trace replay: every row sent at its timestamp divided by the step's speed (open loop), as a "
            "streamed completion of the row's input tokens with its output forced (ignore_eos); rows sharing "
            "hash ids share leading text; a turn waits for its parent's end plus its think time"
            if cfg.trace is not None
            else "open loop: Poisson arrivals at each step's rate; each arrival is the next turn of an idle "
            "conversation (or a new one), with no think time"
            if cfg.open_loop
            else "closed loop: each user is one conversation at a time, with the profile's think time"
        ),
        abort_factor=cfg.abort_factor,
        workers=cfg.workers,
        started_at=time.time(),
        intervals=(
            "95 %: order statistics for per-request percentiles (TTFT, TPOT, E2E), Poisson bootstrap by "
            "request for ITL, means and rates, Clopper-Pearson for the error rate; decision meets/breaks only "
            "when the interval lies wholly within/beyond the limit"
        ),
        metric_definitions=(
            "vllm bench serve: TTFT first event with choices; ITL pooled gaps between events with choices; "
            "E2E to the last such event; TPOT (E2E-TTFT)/(out-1); goodput per request"
        ),
        trace=trace,
    )
