"""How many replicas for N concurrent users, from a ramp's knee, and the autoscaling rule.

The ramp measured one replica: ``K`` users met the SLA and ``F`` users broke it, so one
replica's capacity lies in ``[K, F)``. With headroom ``h`` (the share of each replica kept free
for bursts), a replica is planned at ``K·(1 − h)`` users: ``ceil(N / (K·(1 − h)))`` replicas.
That is the plan; the interval next to it is what the bracket allows: had the capacity been just
under ``F``, ``ceil(N / ((F − 1)·(1 − h)))`` would do. A knee-search ramp narrows the bracket
(``--users auto``).

Autoscaling scales on queue depth per replica, not CPU: the target is the requests waiting on a
replica at the knee step (its mean over the step's window when the ramp recorded it, else the
peak), at least 1, so a replica is added once its queue holds more than a replica at the knee
did. It is printed as a KEDA ScaledObject (Prometheus trigger on ``vllm:num_requests_waiting``,
``AverageValue``: desired replicas = ceil(sum waiting / target)) and as an HPA external-metric
target (through prometheus-adapter).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from spoc_tui.core.errors import InputError
from spoc_tui.core.results import RampDoc
from spoc_tui.core.textsafe import safe

MAX_PLAN_USERS = 10_000_000
"""Ten million concurrent users: far past any fleet planned from one replica's ramp (10^15 answered
625,000,000,000,000 replicas with exit code 0)."""


MAX_MODEL_NAME = 1_024
"""The longest model name planned for (a served model's name is a path or a repository id)."""


class PlanError(InputError):
    """A ramp that cannot be planned from, or bad numbers (exit code 2)."""


@dataclass(frozen=True, slots=True)
class FleetPlan:
    users: int
    headroom: float
    model: str
    knee_users: float
    first_failing_users: float | None
    replicas: int
    replicas_low: int
    """Fewest replicas the knee's bracket allows (capacity just under the first failing level)."""
    gpus_per_replica: int
    target_waiting: float
    waiting_basis: str
    broken_limit: str | None
    notes: list[str] = field(default_factory=list)
    replicas_ci95: tuple[int | None, int | None] = (None, None)
    """Replicas for the ends of the knee's 95 % interval (fewest, most); a side None where the knee
    is not bounded."""
    at_most: bool = False
    """No level broke the SLA: ``replicas`` is an upper bound, not a size."""

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def users_per_replica(self) -> float:
        return self.knee_users * (1 - self.headroom)

    def as_dict(self) -> dict[str, Any]:
        return {
            "users": self.users,
            "headroom": self.headroom,
            "model": self.model,
            "knee_users_per_replica": self.knee_users,
            "first_failing_users_per_replica": self.first_failing_users,
            "planned_users_per_replica": self.users_per_replica,
            "replicas": self.replicas,
            "replicas_ci95": list(self.replicas_ci95),
            "replicas_at_most": self.at_most,
            "replicas_interval": [self.replicas_low, self.replicas],
            "gpus_per_replica": self.gpus_per_replica,
            "gpus": self.gpus,
            "autoscaling": {
                "metric": "vllm:num_requests_waiting",
                "target_waiting_per_replica": self.target_waiting,
                "basis": self.waiting_basis,
                "min_replicas": 1,
                "max_replicas": self.replicas,
            },
            "broken_limit": self.broken_limit,
            "notes": self.notes,
        }


def plan_from_ramp(doc: RampDoc, users: int, headroom: float = 0.2, gpus_per_replica: int | None = None) -> FleetPlan:
    """The plan for ``users`` concurrent users from a ramp result (:func:`~spoc_tui.core.results.read_ramp`).

    Raises:
        PlanError: users <= 0, headroom outside [0, 0.9], a ramp with no knee or of request rates.
    """
    if users <= 0:
        raise PlanError(f"--users must be at least 1, got {users}")
    if users > MAX_PLAN_USERS:
        raise PlanError(f"--users {users:,}: at most {MAX_PLAN_USERS:,} concurrent users are planned for")
    if not 0 <= headroom <= 0.9:
        raise PlanError(f"--headroom must be between 0 and 0.9, got {headroom:g}")
    if len(doc.model) > MAX_MODEL_NAME:
        # pasted whole into the autoscaler's query (it must match the label exactly): refused, not cut
        raise PlanError(f"the ramp's model name is {len(doc.model):,} characters long: not a served model's name")
    knee = doc.knee
    if knee.unit == "req/s":
        raise PlanError("the ramp stepped request rates (--rate): plan from a ramp of users")
    k, f = knee.meets_level, knee.breaks_level
    inferred = knee.inferred
    notes: list[str] = []
    at_most = False
    interval: tuple[int | None, int | None] = (None, None)
    if inferred is not None and inferred.boundary == "bound" and inferred.estimate is None:
        lowest = inferred.ci95[1] or 1
        raise PlanError(
            f"the ramp has no knee to plan from: even {lowest:g} users broke the SLA ({inferred.binding_limit}); "
            f"{_lower_levels(lowest)}"
        )
    if inferred is not None and inferred.estimate is not None:
        k = inferred.estimate
        lo, hi = inferred.ci95
        if inferred.boundary == "bound":
            if lo is None:
                raise PlanError(
                    "the ramp has no knee to plan from: no level broke the SLA, but its steps rest on too few "
                    "requests to say one replica takes even the lowest; ramp longer steps (--step-seconds)"
                )
            k = lo  # one replica surely takes more than this (the highest level run, or less if noisy)
            at_most = True
            notes.append(
                f"no level broke the SLA up to {k:g} users: one replica takes more, so this is at most how many "
                f"replicas it needs (ramp higher to size it: --users auto:{int(k) * 4})"
            )
        else:
            interval = (_replicas(users, hi, headroom), _replicas(users, lo, headroom))
            notes.append(
                f"knee {inferred.text} across {inferred.levels} levels"
                + (f"; decided steps: {knee.meets_text} met, {f:g} broke" if f is not None and knee.meets_level else "")
            )
    elif k is None or k <= 0:
        why = f"even {f:g} users broke the SLA ({knee.broken_limit})" if f is not None else "no step met the SLA"
        hint = _lower_levels(f) if f is not None else "ramp lower user counts (--users auto)"
        raise PlanError(f"the ramp has no knee to plan from: {why}; {hint}")
    elif f is None:
        at_most = True
        notes.append(f"no step broke the SLA: one replica holds at least {k:g} users, so this is at most how many")
    assert k is not None
    per = k * (1 - headroom)
    if per < 1:
        raise PlanError(f"with {headroom:.0%} headroom a replica holds under one user ({k:g} at the knee)")
    replicas = math.ceil(users / per)
    bracket_low = replicas
    if inferred is None and f is not None:  # schema 1: the decided bracket, not an interval
        bracket_low = max(1, math.ceil(users / (max(k, f - 1) * (1 - headroom))))
    if at_most:
        interval = (None, replicas)
    gpus = gpus_per_replica if gpus_per_replica is not None else (doc.gpus or 1)
    if gpus < 1:
        raise PlanError("--gpus-per-replica must be at least 1")
    at_knee = [s.users for s in doc.steps if s.users <= k]
    target, basis = _target_waiting(doc, max(at_knee) if at_knee else k)
    if knee.why is not None and knee.why.client_saturated:
        notes.append("the ramp's load generator was saturated: its latencies read high, the knee may lie higher")
    if knee.inconclusive:
        notes.append(f"undecided levels {_levels(knee.inconclusive)}: the knee could lie higher")
    if knee.contradicted:
        notes.append(f"levels above the failing one met the SLA {_levels(knee.contradicted)}: noise or warm-up")
    low = interval[0] if interval[0] is not None else bracket_low
    return FleetPlan(
        users=users,
        headroom=headroom,
        model=doc.model,
        knee_users=float(k),
        first_failing_users=None if f is None else float(f),
        replicas=replicas,
        replicas_low=min(low, replicas),
        gpus_per_replica=gpus,
        target_waiting=target,
        waiting_basis=basis,
        broken_limit=inferred.binding_limit if inferred is not None and inferred.binding_limit else knee.broken_limit,
        notes=notes,
        replicas_ci95=interval,
        at_most=at_most,
    )


def _replicas(users: int, per_replica: float | None, headroom: float) -> int | None:
    """Replicas for ``users`` when one replica takes ``per_replica`` users (None: unknown)."""
    if per_replica is None or per_replica * (1 - headroom) <= 0:
        return None
    return max(1, math.ceil(users / (per_replica * (1 - headroom))))


def _lower_levels(broke: float) -> str:
    """What to ramp when even the lowest level broke: three lower user counts, by halving."""
    below = sorted({max(1, int(broke // d)) for d in (8, 4, 2)} - {int(broke)})
    if not below:
        return "one user already breaks it: no lower load meets this SLA on this server (loosen the SLA?)"
    return f"ramp lower user counts, e.g. --users {','.join(map(str, below))}"


def _levels(levels: tuple[float, ...]) -> str:
    """``[4, 8]`` as the files of schema 1 printed it (whole counts without a decimal point)."""
    return "[" + ", ".join(f"{v:g}" for v in levels) + "]"


def _target_waiting(doc: RampDoc, knee_users: float) -> tuple[float, str]:
    at_knee = [s for s in doc.steps if s.users == knee_users]
    if at_knee:
        server = at_knee[-1].server
        for v, basis in (
            (server.waiting_mean, "mean waiting at the knee"),
            (server.waiting_max, "peak waiting at the knee"),
        ):
            if v is not None and v >= 1:
                return float(round(v, 1)), basis
    return 1.0, "the queue was empty at the knee: scale out as soon as requests wait"


def _name(model: str) -> str:
    n = re.sub(r"[^a-z0-9-]+", "-", model.lower().rsplit("/", 1)[-1]).strip("-")
    return (n or "model")[:40]


_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A Deployment's name: an RFC 1123 subdomain (lower-case letters, digits, '-' and '.')."""
_SERVER = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/%-]*)?")


def check_deployment(name: str) -> None:
    """Refuse a ``--deployment`` that is not one Kubernetes name: pasted into the manifests, a crafted
    one added YAML keys.

    Raises:
        PlanError: naming the option and what it may hold.
    """
    if not _K8S_NAME.fullmatch(name):
        raise PlanError(f"--deployment {name[:80]!r}: not a Kubernetes name (lower-case letters, digits, '-' and '.')")


def check_prometheus(url: str) -> None:
    """Refuse a ``--prometheus`` that is not one plain URL (it is pasted into the KEDA manifest).

    Raises:
        PlanError: naming the option and what it may hold.
    """
    if not _SERVER.fullmatch(url):
        raise PlanError(f"--prometheus {url[:80]!r}: not a plain http(s)://host[:port][/path] URL")


def check_target(deployment: str, prometheus: str) -> None:
    """Both of :func:`check_deployment` and :func:`check_prometheus`, before any file is read."""
    check_deployment(deployment)
    check_prometheus(prometheus)


def promql_string(text: str) -> str:
    """``text`` as a PromQL double-quoted string (its escapes are Go's: backslash, quote, newline)."""
    return json.dumps(text)


_YAML_PLAIN = re.compile(r"[A-Za-z0-9][\x21-\x7e]*(?: [\x21-\x7e]+)*")


def yaml_string(text: str) -> str:
    """``text`` as one YAML scalar: as it is where a plain scalar holds it unchanged (printable
    ASCII, no ``: `` or `` #``, not ending in ``:``: the manifests read as before), else double-quoted
    (JSON's string syntax is YAML's): nothing in it can end the value or add a key."""
    if _YAML_PLAIN.fullmatch(text) and ": " not in text and " #" not in text and not text.endswith(":"):
        return text
    return json.dumps(text)


def waiting_query(model: str) -> str:
    """The PromQL the autoscaler reads: requests waiting for this model, summed over replicas."""
    return f"sum(vllm:num_requests_waiting{{model_name={promql_string(model)}}})"


HEADROOM_FRESH_S = 3600
"""The oldest fleet headroom the autoscaler acts on (an estimate every 10 to 80 minutes)."""


def headroom_query(fresh_s: int = HEADROOM_FRESH_S) -> str:
    """The PromQL of the headroom trigger: the replicas spoc watches over the fleet's headroom
    (``spoc headroom --serve-metrics``'s series, docs/fleet.md), so that ``ceil(value /
    threshold)`` with a threshold of ``1 / H`` is the replicas that keep the headroom at ``H``:
    ``N * H / h``. 0 (asks for nothing: the queue rule decides) where the fleet has no number or
    its estimate is older than ``fresh_s``."""
    fleet = 'server="fleet"'
    return (
        f'(count(spoc_headroom_identified{{server!="fleet"}}) / on() (spoc_headroom_ratio{{{fleet},bound="estimate"}}'
        f" and on() spoc_headroom_age_seconds{{{fleet}}} < {fresh_s})) or on() vector(0)"
    )


def keda_yaml(
    p: FleetPlan,
    prometheus: str = "http://prometheus.monitoring:9090",
    target: str = "vllm",
    headroom_under: float | None = None,
) -> str:
    """The KEDA ScaledObject: scale on requests waiting per replica; with ``headroom_under``, also
    out as soon as the fleet's headroom (``spoc headroom``) falls under it, before a queue forms
    (the HPA takes the larger of the two triggers' replicas)."""
    check_target(target, prometheus)
    q = yaml_string(waiting_query(p.model))
    extra = ""
    if headroom_under is not None:
        if not 1.0 < headroom_under <= 10.0:
            raise PlanError(
                f"--keda-headroom {headroom_under:g}: give a multiple of today's traffic above 1, at most 10"
            )
        extra = f"""    - type: prometheus          # out before a queue forms: headroom under x{headroom_under:g}
      metricType: AverageValue  # desired replicas = ceil(replicas x {headroom_under:g} / headroom)
      metadata:
        serverAddress: {yaml_string(prometheus)}
        query: {yaml_string(headroom_query())}
        threshold: "{1.0 / headroom_under:.4g}"
"""
    return f"""apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: vllm-{_name(p.model)}
spec:
  scaleTargetRef:
    name: {target}              # the vLLM Deployment
  minReplicaCount: 1
  maxReplicaCount: {p.replicas}
  cooldownPeriod: 300           # model load takes minutes: scale in slowly
  triggers:
    - type: prometheus
      metricType: AverageValue  # desired replicas = ceil(waiting / threshold)
      metadata:
        serverAddress: {yaml_string(prometheus)}
        query: {q}
        threshold: "{p.target_waiting:g}"
{extra}"""


def hpa_yaml(p: FleetPlan, target: str = "vllm") -> str:
    check_deployment(target)
    return f"""apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: vllm-{_name(p.model)}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {target}
  minReplicas: 1
  maxReplicas: {p.replicas}
  metrics:
    - type: External
      external:
        metric:
          name: vllm:num_requests_waiting   # as prometheus-adapter exposes it
          selector:
            matchLabels:
              model_name: {json.dumps(p.model)}
        target:
          type: AverageValue
          averageValue: "{p.target_waiting:g}"
"""


def _range_text(p: FleetPlan) -> str:
    lo, hi = p.replicas_ci95
    if p.at_most:
        return ""
    if lo is not None or hi is not None:
        return f" (95 %: {lo if lo is not None else '?'}-{hi if hi is not None else '?'})"
    return f" (the knee's bracket allows {p.replicas_low}..{p.replicas})" if p.replicas_low != p.replicas else ""


def plan_text(p: FleetPlan) -> str:
    lines = [
        f"{p.users:,} concurrent users of {safe(p.model)}:",
        f"  one replica met the SLA at {f'{p.knee_users:,.1f}'.removesuffix('.0')} users"
        + (f" and broke it at {p.first_failing_users:g} ({p.broken_limit})" if p.first_failing_users else ""),
        f"  planned at {p.users_per_replica:.1f} users per replica ({p.headroom:.0%} headroom)",
        (f"  replicas: at most {p.replicas}" if p.at_most else f"  replicas: {p.replicas}")
        + _range_text(p)
        + f", GPUs: {'at most ' if p.at_most else ''}{p.gpus} ({p.gpus_per_replica} per replica)",
        f"  autoscale on vllm:num_requests_waiting, target {p.target_waiting:g} per replica ({p.waiting_basis})",
    ]
    lines += [f"  note: {n}" for n in p.notes]
    return "\n".join(lines)
