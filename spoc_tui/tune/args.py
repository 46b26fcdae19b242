"""A tuning study's request (:class:`TuneArgs`): what ``spoc tune`` and the Tune screen both fill
in, with every default once. Light on purpose: ``spoc --help`` reads its defaults without loading
Optuna (:mod:`spoc_tui.tune.setup` checks it and makes the study)."""

from __future__ import annotations

from dataclasses import dataclass, field

from spoc_tui.core.ramp.rules import StepRules

DEFAULT_OBJECTIVES = "max:out_tok_s,min:ttft_p99"
TUNE_PROFILE = "tuning"
"""The chatbot's conversations without think time: every user has a request in flight, so the
calibration reaches saturation and trials measure the server, not the workload's randomness."""
SIM_LAUNCH = "spoc sim llama-3.1-8b --port {port} --dcgm-port 0 {flags}"
VLLM_LAUNCH = "vllm serve MODEL --port {port} {flags}"
TUNE_RULES = StepRules(step_s=30.0, warmup_s=5.0)
"""A trial's step rules unless told: shorter steps than a ramp's (a study runs many)."""


@dataclass
class TuneArgs:
    launch: str
    sla: str
    out_dir: str
    space: str | None = None
    objectives: str = DEFAULT_OBJECTIVES
    trials: int = 20
    storage: str | None = None
    study: str = "spoc"
    resume: bool = False
    worker: bool = False
    profile: str = TUNE_PROFILE
    users: str = "auto:256"
    """``auto[:MAX]``: a calibration knee search on the first trial sets the reference load (see
    :meth:`TuneSession._calibrate`); or explicit counts, the last the reference load."""
    ref_users: int | None = None
    rules: StepRules = TUNE_RULES
    """Each trial's step rules (``--step-seconds``, ``--warmup-seconds``; ``--seed`` the sampler's
    too)."""
    population: int = 8
    screen_pool: int = 32
    tries: tuple[str, ...] = ()
    repeat_pareto: int = 0
    profile_best: bool = False
    rerun_share: float = 0.1
    env: tuple[str, ...] = ()
    port: int | None = None
    start_timeout: float = 600.0
    model: str | None = None
    tokenizer: str | None = None
    workers: int = 0
    api_key: str | None = field(default=None, repr=False)
    trace: str | None = None
    """Score flags on this traffic trace, replayed at ``speed`` in each trial (one step)."""
    speed: float = 1.0
    trace_format: str | None = None
    trace_window: str | None = None
    trace_max_rows: int | None = None
