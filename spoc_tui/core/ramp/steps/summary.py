"""A step summarised: its frozen figures, verdict, server window and health, from its requests."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain

import numpy as np

from spoc_tui.core.confidence import (
    Decision,
    Interval,
    Resampler,
    Values,
    decide,
    hull,
    min_samples_for_upper_bound,
    proportion_interval,
    quantile_interval,
)
from spoc_tui.core.ramp.sla import PERCENTILE_Q, LevelUnit, Limit, level_text
from spoc_tui.core.ramp.steps.arrivals import Arrivals, arrivals
from spoc_tui.core.ramp.steps.client import ClientHealth, with_sends
from spoc_tui.core.ramp.steps.codec import Json, _obj, json_float, json_int
from spoc_tui.core.ramp.steps.figures import Figures, Latency, Totals
from spoc_tui.core.ramp.steps.sample import RequestSample
from spoc_tui.core.ramp.steps.server import ServerWindow
from spoc_tui.core.ramp.steps.sessions import Sessions, sessions_of
from spoc_tui.core.ramp.steps.shadow import StepShadow
from spoc_tui.core.ramp.steps.trace import TraceFidelity
from spoc_tui.core.ramp.steps.verdict import Check, StepVerdict


@dataclass(frozen=True, slots=True)
class EarlyStop:
    """A step ended before its planned length: a tuning trial's, clearly dominated by the front
    (``stopped_early``: the trial ends), or a knee search's, its next level already plain
    (``settled_early``: the search goes on)."""

    reason: str
    saved_s: float
    """The planned measurement it did not spend."""

    def as_dict(self) -> dict[str, object]:
        return {"reason": self.reason, "saved_s": self.saved_s}


SHADOWED = ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "e2e_p50", "e2e_p90", "output_tokens_per_s")
"""The figures a shadow twin's prediction is set beside (``spoc twin check``'s)."""


@dataclass(frozen=True, slots=True)
class StepSummary:
    """One ramp step as measured, judged and seen by the server; nothing is set after it is built."""

    step: int
    users: int
    duration_s: float
    requests: int
    errors: int
    errors_by_kind: Mapping[str, int]
    request_rate: float
    output_tokens_per_s: float
    goodput: float
    latency: Latency
    cached_prompt_fraction: float | None
    verdict: StepVerdict = StepVerdict()
    server: ServerWindow = ServerWindow()
    ci95: Totals = Totals()
    extended_s: float = 0.0
    """Seconds the step was measured beyond its planned length to reach a decision."""
    drained_s: float = 0.0
    """After a step down: seconds the step waited, before its warm-up, for the requests the last
    level sent to end (they queue the new level's requests behind the last level's load)."""
    client: ClientHealth = ClientHealth()
    rate: float | None = None
    """Open-loop steps: the target arrival rate (requests/s, Poisson); ``users`` is then the number
    of arrival generators, not a concurrency."""
    stopped_early: EarlyStop | None = None
    settled_early: EarlyStop | None = None
    """A knee search's step ended before its planned window: far from every limit, more requests
    could not change the level the search runs next (:meth:`~spoc_tui.core.ramp.knee.KneeSearch.settled`)."""
    arrivals: Arrivals | None = None
    """How bunched the step's request arrivals were (lockstep moves TTFT); None in files written
    before it was measured."""
    speed: float | None = None
    """Trace replay: the speed multiple the trace was replayed at (its timestamps divided by it)."""
    trace: TraceFidelity | None = None
    """Trace replay: how faithfully the step kept the trace's schedule, lengths and prefixes."""
    sessions: Sessions | None = None
    """Multi-call sessions (agent sessions, conversations) in the window; None for single calls."""
    shadow: StepShadow | None = None
    """The twin's prediction of the step, made as the ramp ran (``spoc ramp --twin``); None without one."""

    @property
    def level(self) -> float:
        """What the ramp stepped: a trace's speed, the arrival rate of an open-loop step, else the
        user count."""
        if self.speed is not None:
            return self.speed
        return self.rate if self.rate is not None else self.users

    @property
    def unit(self) -> LevelUnit:
        if self.speed is not None:
            return "x"
        return "req/s" if self.rate is not None else "users"

    @property
    def level_text(self) -> str:
        """``8 users`` or ``4 req/s``."""
        return level_text(self.level, self.unit)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def value(self, lim: Limit) -> float | None:
        if lim.metric == "error_rate":
            return self.error_rate
        return self.latency.of(lim.metric).stat(lim.stat)

    def interval(self, lim: Limit) -> Interval:
        """The 95 % interval of the figure a limit is held against."""
        if lim.metric == "error_rate":
            return self.ci95.error_rate
        return self.latency.of(lim.metric).interval(lim.stat)

    @property
    def decision(self) -> Decision:
        return self.verdict.decision

    def beside_shadow(self) -> list[tuple[str, float | None, float | None, Interval]]:
        """The step's figures beside its shadow twin's (``spoc ramp --twin``): per figure the
        twin predicted (:data:`SHADOWED`), measured, predicted and its interval; empty without one."""
        if self.shadow is None:
            return []
        out = []
        for key in SHADOWED:
            if key not in self.shadow.figures:
                continue
            if key == "output_tokens_per_s":
                measured: float | None = self.output_tokens_per_s
            else:
                metric, stat = key.rsplit("_", 1)
                measured = self.latency.of(metric).stat(stat)
            out.append((key, measured, self.shadow.figures[key], self.shadow.intervals.get(key, (None, None))))
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "users": self.users,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "errors": self.errors,
            "errors_by_kind": dict(self.errors_by_kind),
            "error_rate": self.error_rate,
            "request_rate": self.request_rate,
            "output_tokens_per_s": self.output_tokens_per_s,
            "goodput": self.goodput,
            "latency": self.latency.as_dict(),
            "cached_prompt_fraction": self.cached_prompt_fraction,
            "ci95": self.ci95.as_dict(),
            "extended_s": self.extended_s,
            "rate": self.rate,
            "client": self.client.as_dict(),
            "verdict": self.verdict.as_dict(),
            "server": self.server.as_dict(),
            **({"drained_s": self.drained_s} if self.drained_s else {}),
            **({"arrivals": self.arrivals.as_dict()} if self.arrivals else {}),
            **({"speed": self.speed, "trace": self.trace.as_dict()} if self.trace is not None else {}),
            **({"stopped_early": self.stopped_early.as_dict()} if self.stopped_early else {}),
            **({"settled_early": self.settled_early.as_dict()} if self.settled_early else {}),
            **({"sessions": self.sessions.as_dict()} if self.sessions is not None else {}),
            **({"shadow": self.shadow.as_dict()} if self.shadow is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Json) -> StepSummary:
        """A step as ramp.json holds it (any version this project wrote); missing figures read as
        none measured."""
        errs = _obj(d.get("errors_by_kind"))
        early = _obj(d.get("stopped_early"))
        settled = _obj(d.get("settled_early"))
        return cls(
            step=json_int(d, "step") or 0,
            users=json_int(d, "users") or 0,
            duration_s=json_float(d, "duration_s") or 0.0,
            requests=json_int(d, "requests") or 0,
            errors=json_int(d, "errors") or 0,
            errors_by_kind={str(k): int(v) for k, v in errs.items() if isinstance(v, int)},
            request_rate=json_float(d, "request_rate") or 0.0,
            output_tokens_per_s=json_float(d, "output_tokens_per_s") or 0.0,
            goodput=json_float(d, "goodput") or 0.0,
            latency=Latency.from_dict(_obj(d.get("latency"))),
            cached_prompt_fraction=json_float(d, "cached_prompt_fraction"),
            verdict=StepVerdict.from_dict(_obj(d.get("verdict"))),
            server=ServerWindow.from_dict(_obj(d.get("server"))),
            ci95=Totals.from_dict(_obj(d.get("ci95"))),
            extended_s=json_float(d, "extended_s") or 0.0,
            drained_s=json_float(d, "drained_s") or 0.0,
            client=ClientHealth.from_dict(_obj(d.get("client"))),
            rate=json_float(d, "rate"),
            stopped_early=EarlyStop(str(early.get("reason", "")), json_float(early, "saved_s") or 0.0)
            if early
            else None,
            settled_early=EarlyStop(str(settled.get("reason", "")), json_float(settled, "saved_s") or 0.0)
            if settled
            else None,
            arrivals=Arrivals.from_dict(_obj(d["arrivals"])) if isinstance(d.get("arrivals"), dict) else None,
            speed=json_float(d, "speed"),
            trace=TraceFidelity.from_dict(_obj(d["trace"])) if isinstance(d.get("trace"), dict) else None,
            sessions=Sessions.from_dict(_obj(d["sessions"])) if isinstance(d.get("sessions"), dict) else None,
            shadow=StepShadow.from_dict(_obj(d["shadow"])) if isinstance(d.get("shadow"), dict) else None,
        )


def point_value(window: Sequence[RequestSample], metric: str, stat: str) -> float | None:
    """A figure over ``window`` (``ttft`` ``p99``, ``itl`` ``mean``, ``error_rate``), as
    :func:`summarize_step` computes it but without its interval (milliseconds, where the
    summary's resampling takes most of a second on a few hundred requests); None with nothing
    to compute it from."""
    if metric == "error_rate":
        return sum(1 for s in window if not s.ok) / len(window) if window else None
    ok = [s for s in window if s.ok]
    if metric == "itl":
        vals: list[float] = [g for s in ok for g in s.itl]
    else:
        vals = [v for s in ok if (v := getattr(s, metric)) is not None]
    if not vals:
        return None
    if stat == "mean":
        return float(np.mean(vals))
    return float(np.percentile(vals, float(stat[1:])))


def stats(values: Values) -> Figures:
    """Percentiles (numpy's linear interpolation, as ``vllm bench serve``), mean and count."""
    if len(values) == 0:
        return Figures()
    a = np.asarray(values, dtype=float)
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    return Figures(float(p50), float(p90), float(p95), float(p99), float(a.mean()), int(a.size), int(a.size))


def _per_request(per_request: Sequence[float | None], rs: Resampler) -> Figures:
    """Figures of a per-request metric (``None`` for a request without one) with their intervals:
    each percentile's is the hull of the order-statistic interval (which says when the sample is
    too small to bound a side) and the block bootstrap's (which widens it where requests of the
    same moment move together); the mean's is the block bootstrap's."""
    owner = [i for i, v in enumerate(per_request) if v is not None]
    values = [v for v in per_request if v is not None]
    boot = rs.pooled_quantiles(values, owner, list(PERCENTILE_Q.values()))
    ci: list[tuple[str, Interval]] = [
        (name, hull(quantile_interval(values, q), b)) for (name, q), b in zip(PERCENTILE_Q.items(), boot, strict=True)
    ]
    ci.append(("mean", rs.pooled_mean(values, owner, len(per_request)) if values else (None, None)))
    return replace(stats(values), ci95=tuple(ci))


def _pooled_gaps(samples: Sequence[RequestSample]) -> tuple[np.ndarray, np.ndarray, int]:
    """The ITL gaps of the step's answered requests, pooled in their order, each one's request (its
    place among ``samples``), and how many requests have any: as arrays, laid out once (a step of a
    headroom's replay holds half a million gaps, and each list was copied into an array by every
    figure that read it)."""
    ok = [i for i, s in enumerate(samples) if s.ok]
    lens = np.fromiter((len(samples[i].itl) for i in ok), np.intp, len(ok))
    gaps = np.fromiter(chain.from_iterable(samples[i].itl for i in ok), float, int(lens.sum()))
    return gaps, np.repeat(np.asarray(ok, np.intp), lens), int(np.count_nonzero(lens))


def _pooled(values: np.ndarray, owner: np.ndarray, n_requests: int, rs: Resampler, requests: int) -> Figures:
    """Figures of a pooled metric (ITL gaps) with intervals from the bootstrap by request;
    ``requests``: how many requests the values come from."""
    names = list(PERCENTILE_Q)
    qs = [PERCENTILE_Q[n] for n in names]
    boot = rs.pooled_quantiles(values, owner, qs)
    wood = rs.woodruff(values, owner, qs)
    ci: list[tuple[str, Interval]] = [(n, hull(w, b)) for n, w, b in zip(names, wood, boot, strict=True)]
    ci.append(("mean", rs.pooled_mean(values, owner, n_requests) if len(values) else (None, None)))
    return replace(stats(values), requests=requests, ci95=tuple(ci))


def _meets(sample: RequestSample, limits: Iterable[Limit]) -> bool:
    if not sample.ok:
        return False
    for lim in limits:
        first = sample.ttft if sample.ttft is not None else sample.e2e  # no text at all: the answer ended
        if lim.metric == "ttft" and (first is None or first > lim.value):
            return False
        if lim.metric in ("tpot", "itl"):
            t = sample.tpot
            if t is not None and t > lim.value:
                return False
        if lim.metric == "e2e" and (sample.e2e is None or sample.e2e > lim.value):
            return False
    return True


BLOCKS = 20
"""The measured window is cut into this many blocks of time (at least 1 s each) for the bootstrap."""


def time_blocks(samples: Sequence[RequestSample], duration_s: float) -> list[int]:
    """Each request's block of time (by when it finished) within the step's window."""
    ends = [s.end if s.end is not None else s.start for s in samples]
    if not ends:
        return []
    t0 = min(ends)
    width = max(1.0, duration_s / BLOCKS)
    return [int((e - t0) // width) for e in ends]


USER_UNITS_MIN = 8
"""Closed-loop totals are resampled by user when the step has at least this many users."""


def user_units(samples: Sequence[RequestSample]) -> list[int] | None:
    """Each request's user (``user#conversation`` ids, as the runner and the simulator name
    them), or None when a request has no such id or there are fewer than
    :data:`USER_UNITS_MIN` users."""
    ids: dict[str, int] = {}
    out: list[int] = []
    for s in samples:
        user, sep, _ = s.conversation.partition("#")
        if not sep:
            return None
        out.append(ids.setdefault(user, len(ids)))
    return out if len(ids) >= USER_UNITS_MIN else None


def summarize_step(
    step: int,
    users: int,
    samples: Sequence[RequestSample],
    duration_s: float,
    limits: Sequence[Limit],
    open_loop: bool = False,
    *,
    rate: float | None = None,
    server: ServerWindow = ServerWindow(),
    client: ClientHealth = ClientHealth(),
    extended_s: float = 0.0,
    drained_s: float = 0.0,
    unbounded: str | None = None,
    intervals: bool = True,
) -> StepSummary:
    """Figures of one step from the requests that finished inside its measured window, each with
    its sample size and 95 % interval (:mod:`spoc_tui.core.confidence`), and the verdict (broken
    by the queue rule when ``unbounded`` says why). ``intervals=False``: the figures alone, no
    interval resampled (a prediction's draw, whose interval is the draws' spread); its verdict
    then decides nothing but what the figures alone say.

    Totals over the window (request rate, output tokens/s, goodput) of a closed loop are
    resampled by user: a closed-loop user is a renewal process whose count in a window is
    regulated (a long answer delays the next request), so blocks of time are negatively
    correlated and treating them as independent made those intervals 3-4x too wide; users are
    the independent units. An open loop (Poisson arrivals), or a step with few users, keeps the
    time blocks."""
    n = len(samples)
    ok = [s for s in samples if s.ok]
    errs: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            errs[s.error or "error"] = errs.get(s.error or "error", 0) + 1
    d = max(duration_s, 1e-9)
    gaps, owner, with_gaps = _pooled_gaps(samples)
    per_request = {m: [getattr(s, m) if s.ok else None for s in samples] for m in ("ttft", "tpot", "e2e")}
    if intervals:
        rs = Resampler.for_blocks(time_blocks(samples, duration_s), seed=step * 1_000_003 + users * 7_919 + n)
        lat = Latency(
            ttft=_per_request(per_request["ttft"], rs),
            itl=_pooled(gaps, owner, n, rs, with_gaps),
            tpot=_per_request(per_request["tpot"], rs),
            e2e=_per_request(per_request["e2e"], rs),
        )
    else:
        lat = Latency(
            ttft=stats([v for v in per_request["ttft"] if v is not None]),
            itl=replace(stats(gaps), requests=with_gaps),
            tpot=stats([v for v in per_request["tpot"] if v is not None]),
            e2e=stats([v for v in per_request["e2e"] if v is not None]),
        )
    out_tokens = [float(s.output_tokens or 0) if s.ok else 0.0 for s in samples]
    good = [1.0 if _meets(s, limits) else 0.0 for s in samples]
    prompt = sum(s.prompt_tokens or 0 for s in ok)
    cached = [s.cached_tokens for s in ok if s.cached_tokens is not None]
    none: Interval = (None, None)
    if intervals:
        units = None if open_loop else user_units(samples)
        totals = rs if units is None else Resampler.for_blocks(units, seed=step * 1_000_003 + users * 7_919 + n + 1)
        ci95 = Totals(
            request_rate=totals.total([1.0] * n, 1 / d) if n else none,
            output_tokens_per_s=totals.total(out_tokens, 1 / d) if n else none,
            goodput=totals.total(good, 1 / d) if n else none,
            error_rate=proportion_interval(n - len(ok), n),
        )
    else:
        ci95 = Totals(request_rate=none, output_tokens_per_s=none, goodput=none, error_rate=none)
    figures = StepSummary(
        step=step,
        users=users,
        duration_s=duration_s,
        requests=n,
        errors=n - len(ok),
        errors_by_kind=errs,
        request_rate=n / d,
        output_tokens_per_s=sum(out_tokens) / d,
        goodput=sum(good) / d,
        latency=lat,
        cached_prompt_fraction=(sum(cached) / prompt) if cached and prompt else None,
        ci95=ci95,
        server=server,
        client=with_sends(client, samples),
        rate=rate,
        extended_s=extended_s,
        drained_s=drained_s,
        arrivals=arrivals([s.start for s in samples]),
        sessions=sessions_of(samples, lambda s: _meets(s, limits)),
    )
    verdict = judge(figures, limits)
    if unbounded:
        verdict = verdict.broken_by_queue(unbounded)
    return replace(figures, verdict=verdict)


def judge(step: StepSummary, limits: Sequence[Limit]) -> StepVerdict:
    """The step's decision on the SLA: ``meets`` when every limit's interval lies within it,
    ``breaks`` when some limit's interval lies wholly beyond it, else ``inconclusive`` (an
    interval straddles its limit, or the sample is too small to bound it) with the reason.
    Most requests surely failing breaks it whatever the latency limits say."""
    if step.requests == 0:
        if step.client.saturated:  # a stalled load generator, not a short step (issue 74's stopped worker)
            return StepVerdict(reason=f"no request finished in the step: {step.client.saturated_text}")
        return StepVerdict(
            reason="no request finished in the step: the step is too short for this profile (raise --step-seconds)"
        )
    checks: list[Check] = []
    worst: tuple[float, str] | None = None
    undecided: list[str] = []
    for lim in limits:
        v = step.value(lim)
        lo, hi = step.interval(lim)
        dec = decide(v, (lo, hi), lim.value)
        checks.append(Check(lim.key, v, lim.value, (lo, hi), dec))
        if dec == "breaks" and lo is not None:
            ratio = lo / lim.value if lim.value else math.inf
            if worst is None or ratio > worst[0]:
                worst = (ratio, lim.key)
        elif dec == "inconclusive":
            undecided.append(_why_undecided(step, lim, v, lo, hi))
    err_lo = step.ci95.error_rate[0]
    if err_lo is not None and err_lo >= 0.5 and all(c.key != "error_rate" for c in checks):
        # most requests surely failed: no latency SLA is met by requests that never finish
        checks.append(Check("error_rate", step.error_rate, 0.5, step.ci95.error_rate, "breaks"))
        if worst is None:
            worst = (err_lo / 0.5, "error_rate")
    decisions = [c.decision for c in checks]
    decision: Decision = (
        "breaks" if "breaks" in decisions else ("meets" if all(x == "meets" for x in decisions) else "inconclusive")
    )
    return StepVerdict(
        decision=decision,
        checks=tuple(checks),
        broken_limit=worst[1] if worst else None,
        worst_ratio=None if worst is None or math.isinf(worst[0]) else worst[0],
        reason="; ".join(undecided) if decision == "inconclusive" else "",
    )


def _why_undecided(step: StepSummary, lim: Limit, v: float | None, lo: float | None, hi: float | None) -> str:
    if v is None:
        return f"{lim.key}: no value (no request finished)"
    q = PERCENTILE_Q.get(lim.stat)
    n = step.latency.of(lim.metric).n if lim.metric != "error_rate" else step.requests
    if hi is None and q is not None and lim.metric == "itl":
        # the gaps of one request move together: the requests are the independent units
        requests = step.latency.itl.requests
        return (
            f"{lim.key}: {n} gaps from {requests} request{'s' if requests != 1 else ''} cannot bound a {lim.stat} "
            "from above (a request's gaps move together, so it is the requests that count: measure longer with "
            "--max-step-seconds, or hold a lower percentile)"
        )
    if hi is None and q is not None:
        return (
            f"{lim.key}: {n} requests cannot bound a {lim.stat} from above (it takes {min_samples_for_upper_bound(q)}: "
            "measure longer with --max-step-seconds, or hold a lower percentile)"
        )
    if hi is None:
        return f"{lim.key}: too few samples to bound it"
    return (
        f"{lim.key}: its interval {_fmt(lo)}-{_fmt(hi)} straddles the limit {_fmt(lim.value)}"
        if lim.metric != "error_rate"
        else (
            f"error_rate: its interval {(lo or 0) * 100:.1f}-{hi * 100:.1f}% straddles the limit {lim.value * 100:g}%"
        )
    )


def _fmt(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v * 1000:.1f}ms" if v < 1 else f"{v:.2f}s"


def badly_broken(step: StepSummary, abort_factor: float) -> str | None:
    """Why to stop the ramp early, or None: a limit surely exceeded ``abort_factor`` times (the
    low end of its interval), or most requests surely failing. A step where nothing finished
    is inconclusive, never a reason to stop."""
    if step.decision != "breaks":
        return None
    err_lo = step.ci95.error_rate[0]
    if err_lo is not None and err_lo >= 0.5:
        return f"step {step.step} ({step.level_text}): at least {err_lo:.0%} of requests failed"
    ratio = step.verdict.worst_ratio
    if ratio is not None and ratio >= abort_factor:
        return (
            f"step {step.step} ({step.level_text}): {step.verdict.broken_limit} at least {ratio:.1f}x "
            f"its limit (abort factor {abort_factor:g})"
        )
    return None


GONE_AFTER = 3
"""A step's last requests that must all have failed, one refused, for the server to count as gone
(:func:`went_away`)."""
SERVER_GONE = frozenset({"connect", "http_5xx", "stream"})
"""What a request of a server that went away fails with: refused, answered 5xx, its stream cut."""


def server_failed(step: StepSummary, samples: Sequence[RequestSample]) -> str | None:
    """Why ``step`` (of ``samples``) says the server failed, or None: every request failed,
    refused or answered 5xx; or the server went away within it (:func:`went_away`)."""
    if step.requests and step.errors == step.requests and set(step.errors_by_kind) <= {"connect", "http_5xx"}:
        return f"every request of step {step.step} failed ({', '.join(step.errors_by_kind)})"
    if gone := went_away(samples):
        return (
            f"the last {gone[0]} requests of step {step.step} failed ({', '.join(gone[1])}), none answered after them"
        )
    return None


def went_away(samples: Sequence[RequestSample]) -> tuple[int, list[str]] | None:
    """Whether the server went away within the step: its requests from the last one answered on
    (by when each ended) all failed, at least :data:`GONE_AFTER` of them, each refused, answered
    5xx or cut, and one refused (the server no longer takes connections). How many, and their
    kinds; None otherwise. (A server that died a few seconds into a step, whose first requests were
    answered, read as a step that broke its SLA badly: the ramp stopped early with exit 0.)"""

    def when(s: RequestSample) -> float:
        return s.end if s.end is not None else s.start

    last_ok = max((when(s) for s in samples if s.ok), default=-math.inf)
    after = [s for s in samples if not s.ok and when(s) > last_ok]
    kinds = sorted({s.error or "error" for s in after})
    if len(after) < GONE_AFTER or "connect" not in kinds or not set(kinds) <= SERVER_GONE:
        return None
    return len(after), kinds


# -- a queue that does not stop growing -------------------------------------------------------
