"""The knee of a ramp (where the SLA stops holding), why it is there, and which level to run next.

The knee is read from the steps' decisions by level (probes may run in any order); its reason is
a typed value built from the breaking step's server window and client health, so a reader asks
``knee.why.cause`` rather than searching a sentence.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

from spoc_tui.core import fmt
from spoc_tui.core.ramp.inference import KneeEstimate, infer_knee
from spoc_tui.core.ramp.sla import (
    MAX_SPEED,
    MAX_USERS,
    LevelUnit,
    Limit,
    UsersError,
    level_text,
    parse_rates,
    parse_speeds,
    parse_users,
)
from spoc_tui.core.ramp.steps import Json, RequestSample, StepSummary, json_float, point_value

Cause = Literal[
    "queue_unbounded",
    "throttled",
    "preempting",
    "kv_full",
    "batch_full",
    "decode_slows",
    "client",
    "lockstep",
    "none_seen",
    "no_view",
]
"""What held the knee where it is, from the server's view of the breaking step (first match):
the queue grew without bound; a GPU throttled; preemptions; the KV cache full with a queue; a
queue with the cache not full (the batch at its seat or token limit); an inter-token limit
broken with no queue; no server-side cause seen (``lockstep`` when the step's arrivals came in
bursts, ``client`` when the load generator was saturated, else ``none_seen``); no server-side
view recorded. Arrivals in lockstep are also said after any server-side cause."""

KV_FULL = 0.9
"""KV-cache use at or above which a queue is put down to the cache (as the monitor's alert)."""


@dataclass(frozen=True, slots=True)
class KneeWhy:
    """Why the SLA broke where it did: the cause, and the sentence with the figures it rests on."""

    cause: Cause
    text: str
    client_saturated: bool = False
    """The load generator was saturated during the breaking step (its latencies read high)."""


def knee_why(step: StepSummary) -> KneeWhy:
    """The server-side reason a step broke the SLA (see :data:`Cause`), with the client's
    saturation said after it (or instead of "no server-side cause")."""
    cause, text = _server_reason(step)
    if step.arrivals is not None and step.arrivals.lockstep:
        if cause in ("none_seen", "no_view"):
            cause, text = "lockstep", f"{step.arrivals.text}: the prefills of users that start together collide"
        else:
            text = f"{text}; {step.arrivals.text}"
    sat = step.client.saturated_text
    if sat is None:
        return KneeWhy(cause, text)
    if cause in ("none_seen", "no_view"):
        return KneeWhy("client", sat, True)
    return KneeWhy(cause, f"{text}; and the {sat}", True)


def _server_reason(step: StepSummary) -> tuple[Cause, str]:
    srv = step.server
    v = step.verdict
    limit = v.broken_limit or ""
    if limit == "queue_unbounded":
        return "queue_unbounded", v.reason or "the queue grew without bound"
    throttled = [g for g in srv.gpus or () if g.throttled]
    waiting, running, kv, pre = srv.waiting_max, srv.running_max, srv.kv_cache_usage_max, srv.preemptions_per_s
    if throttled:
        g = throttled[0]
        return "throttled", (
            f"GPU {g.gpu} throttled ({', '.join(g.throttle_reasons)}) at "
            f"{fmt.num(g.sm_clock_mhz)}/{fmt.num(g.sm_clock_max_mhz)} MHz, {fmt.num(g.temp_c, unit='C')}"
        )
    if pre:
        return "preempting", (
            f"preemptions ({pre:.2f}/s): the KV cache ran out and running requests were evicted (KV {fmt.pct(kv)})"
        )
    if waiting and kv is not None and kv >= KV_FULL:
        return "kv_full", (
            f"KV cache full ({fmt.pct(kv)}) and requests queue (up to {fmt.num(waiting)} waiting, "
            f"{fmt.num(running)} running)"
        )
    if waiting:
        return "batch_full", (
            f"the batch is full: {fmt.num(running)} running, up to {fmt.num(waiting)} waiting with the KV cache at "
            f"{fmt.pct(kv)} (max-num-seqs or max-num-batched-tokens)"
        )
    if limit.startswith(("itl", "tpot")):
        return "decode_slows", (
            f"no queue, but each step of decoding slows as the batch grows ({fmt.num(running)} running): "
            "prefills stall decodes, or the GPU is saturated"
        )
    if srv.seen or srv.gpus:
        return "none_seen", (
            f"no server-side cause seen ({fmt.num(running)} running, no queue, KV {fmt.pct(kv)}): "
            "the client may be the limit (try --workers)"
        )
    return "no_view", "no server-side view was recorded for the step"


@dataclass(frozen=True, slots=True)
class Knee:
    """Where the SLA stops holding: the highest level (a user count, or an arrival rate when
    ``unit`` is req/s) a decided step met it with, below the lowest level a decided step broke it
    with. Undecided and contradicting steps are named, not hidden."""

    meets_level: float | None
    """The highest level that met the SLA below the break."""
    breaks_level: float | None
    """The lowest level that broke it."""
    broken_limit: str | None
    inconclusive: tuple[float, ...] = ()
    """Levels whose steps stayed inconclusive."""
    contradicted: tuple[float, ...] = ()
    """Levels that met the SLA above one that broke it (noise, or a server that warmed up): the
    knee below them stands, but it is not the whole story."""
    why: KneeWhy | None = None
    """Why it broke there, from the breaking step's server view (None before any break)."""
    unit: LevelUnit = "users"
    inferred: KneeEstimate | None = None
    """The knee inferred across every step's figures, with its 95 % interval
    (:mod:`spoc_tui.core.ramp.inference`); None before any step measured a figure."""

    @property
    def reason(self) -> str:
        return self.why.text if self.why else ""

    @property
    def meets_text(self) -> str:
        return level_text(self.meets_level, self.unit)

    @property
    def breaks_text(self) -> str:
        return level_text(self.breaks_level, self.unit)

    def as_dict(self) -> dict[str, object]:
        key = _LEVEL_KEY[self.unit]
        return {
            f"max_{key}_within_sla": self.meets_level,
            f"first_failing_{key}": self.breaks_level,
            "unit": self.unit,
            "broken_limit": self.broken_limit,
            "inconclusive": list(self.inconclusive),
            "contradicted": list(self.contradicted),
            "reason": self.reason,
            "cause": self.why.cause if self.why else None,
            "client_saturated": self.why.client_saturated if self.why else False,
            **(self.inferred.as_dict() if self.inferred else {}),
        }

    @classmethod
    def from_dict(cls, d: Json, steps: Sequence[StepSummary] = ()) -> Knee:
        """The knee as a file holds it. Its ``why`` is rebuilt from the breaking step (files of
        schema 1 hold only the sentence), else kept as the file says it."""
        u = d.get("unit")
        unit: LevelUnit = "req/s" if u == "req/s" else "x" if u == "x" else "users"
        key = _LEVEL_KEY[unit]

        def levels(k: str) -> tuple[float, ...]:
            v = d.get(k)
            return tuple(float(x) for x in v if isinstance(x, (int, float))) if isinstance(v, list) else ()

        meets, breaks = json_float(d, f"max_{key}_within_sla"), json_float(d, f"first_failing_{key}")
        b = d.get("broken_limit")
        breaking = [s for s in steps if s.decision == "breaks" and s.level == breaks]
        why: KneeWhy | None = knee_why(breaking[0]) if breaking else None
        if why is None and d.get("reason"):
            cause = d.get("cause")
            text = str(d["reason"])
            # schema 1 said the client's saturation only in the sentence (its one carrier then)
            saturated = d.get("client_saturated", "client saturated" in text)
            why = KneeWhy(_cause(cause) if isinstance(cause, str) else "none_seen", text, bool(saturated))
        inferred = KneeEstimate.from_dict(d, unit)
        return cls(
            meets, breaks, str(b) if b else None, levels("inconclusive"), levels("contradicted"), why, unit, inferred
        )


_LEVEL_KEY: dict[LevelUnit, str] = {"users": "users", "req/s": "rate", "x": "speed"}
"""ramp.json's knee names its levels ``max_users_within_sla``, ``max_rate_...`` or ``max_speed_...``."""


def _cause(name: str) -> Cause:
    for c in get_args(Cause):
        if c == name:
            return c  # type: ignore[no-any-return]
    return "none_seen"


def find_knee(steps: Sequence[StepSummary], inferred: KneeEstimate | None = None) -> Knee:
    """The knee from the steps' decisions, by level (probes may run in any order), with the
    reason the first breaking step gives, and the knee ``inferred`` across the steps' figures."""
    unit: LevelUnit = steps[0].unit if steps else "users"
    breaks = [s for s in steps if s.decision == "breaks"]
    first = min(breaks, key=lambda s: s.level) if breaks else None
    meets = [s.level for s in steps if s.decision == "meets"]
    below = [u for u in meets if first is None or u < first.level]
    contradicted = tuple(sorted({u for u in meets if first is not None and u > first.level}))
    undecided = tuple(
        sorted({s.level for s in steps if s.decision == "inconclusive"} - set(meets) - {s.level for s in breaks})
    )
    if inferred is not None and first is not None and inferred.boundary != "bound" and inferred.ci95[1] is None:
        # the knee is the lowest crossing: a level that surely broke the SLA (on any limit) bounds it
        # from above where the fit's resampling left the high end open
        inferred = dataclasses.replace(inferred, ci95=(inferred.ci95[0], first.level))
    return Knee(
        max(below) if below else None,
        first.level if first else None,
        first.verdict.broken_limit if first else None,
        undecided,
        contradicted,
        knee_why(first) if first else None,
        unit=unit,
        inferred=inferred,
    )


# -- which user count to run next -------------------------------------------------------------

KNEE_TOLERANCE = 0.05
"""The knee search stops when the bracket is adjacent counts, or narrower than 5 % of the count
that meets (64 vs 67 users is pinned; bisecting further costs a step per halving)."""


class Listed:
    """Levels the operator listed, run in order: such a plan chooses no level from the knee.
    Each kind names its levels (``users``, ``rates``, ``speeds``) and :attr:`PREFIX` its
    ``describe()``."""

    __slots__ = ()
    PREFIX: ClassVar[str] = ""

    @property
    def levels(self) -> Sequence[float]:
        raise NotImplementedError

    def next(self, steps: Sequence[StepSummary], knee: Knee | None = None) -> float | None:
        return self.levels[len(steps)] if len(steps) < len(self.levels) else None

    def describe(self) -> str:
        return self.PREFIX + ",".join(str(v) if isinstance(v, int) else f"{v:g}" for v in self.levels)


@dataclass(frozen=True)
class FixedUsers(Listed):
    """The user counts the operator listed, in order."""

    users: list[int]

    @property
    def levels(self) -> Sequence[int]:
        return self.users


@dataclass(frozen=True)
class BisectSearch:
    """The knee search before inference (kept as the benchmark's baseline): double from
    ``start`` until a step does not meet the SLA (or MAX), then bisect over whole user counts
    between the last count that met it and the first that did not, until they are adjacent or
    within :data:`KNEE_TOLERANCE`. A step that stays inconclusive after its extensions bounds
    the search like a break."""

    max_users: int = 1024
    start: int = 1

    def next(self, steps: Sequence[StepSummary], knee: Knee | None = None) -> int | None:
        if not steps:
            return self.start
        tried = {s.users for s in steps}
        meets = [s.users for s in steps if s.decision == "meets"]
        fails = [s.users for s in steps if s.decision != "meets"]
        hi = min(fails) if fails else None
        lo = max([u for u in meets if hi is None or u < hi], default=0)
        if hi is None:  # still doubling
            nxt = min(max(tried) * 2, self.max_users)
            return None if nxt in tried else nxt
        if hi - lo <= max(1, int(lo * KNEE_TOLERANCE)):
            return None
        nxt = (lo + hi) // 2 if lo else max(1, hi // 2)
        return None if nxt in tried else nxt

    def describe(self) -> str:
        return f"bisect:{self.max_users}"

    def extend(self, step: StepSummary) -> bool:
        """Measure an inconclusive step on (up to the step's limit), whatever its figures."""
        return True


MAX_SEARCH_STEPS = 24
"""The knee search stops after this many steps whatever its interval (the budget usually first)."""
REPEATS_AT_A_LEVEL = 3
"""The knee search measures one level at most this many times (more time there narrows the
interval no further than the fit between levels allows); 1 user, where every level broke, is
measured until its requests show it surely (no lower level can)."""
NEAR_LIMIT = 1.5
"""An inconclusive step is measured on only when a figure's point estimate is within this
factor of its limit (a p99 of 60 ms against 400 ms is far under it, bounded or not: the
inference uses the point, and extending it would not move the knee)."""
FAR_UNDER = 2.0
"""A knee search's step ends early (:meth:`KneeSearch.settled`) while the search is still doubling
and every figure is under its limit by this factor."""
SETTLE_MIN_REQUESTS = 20
"""A step is not settled early on fewer requests than this (at least a third of its window runs)."""
SETTLE_EVERY_S = 5.0
"""A knee search's step is asked whether it has settled every this many seconds, from a third of
its planned window on (:func:`settle_due`)."""


def settle_due(elapsed_s: float, planned_s: float, asked: int) -> bool:
    """Whether a step ``elapsed_s`` into its measured window, asked ``asked`` times so far, is due
    to be asked again whether it has settled (the ramp, the twin and the knee benchmark alike)."""
    return elapsed_s < planned_s and elapsed_s >= planned_s / 3 + asked * SETTLE_EVERY_S


def _ratio(step: StepSummary) -> float:
    """A step's largest figure as a share of its limit (0 with none)."""
    return max((c.value / c.limit for c in step.verdict.checks if c.limit and c.value is not None), default=0.0)


@dataclass(frozen=True)
class KneeSearch:
    """``--users auto[:MAX]``: the search that uses the knee inferred across steps
    (:mod:`spoc_tui.core.ramp.inference`).

    Doubles from ``start`` while no level broke the SLA (halves while every level did), then
    probes inside the knee's interval, nearest the estimate, where it narrows most; it stops
    when the interval is within :data:`KNEE_TOLERANCE` of the estimate either side or spans
    adjacent user counts, at MAX with no break, below 1 with every level broken, or after
    :data:`MAX_SEARCH_STEPS` (the ramp's ``--budget`` stops it too). An inconclusive step is
    measured on only when its figure is near a limit (:meth:`extend`)."""

    max_users: int = 1024
    start: int = 1

    def next(self, steps: Sequence[StepSummary], knee: Knee | None = None) -> int | None:
        return self._decide(steps, knee)[0]

    def stop_reason(self, steps: Sequence[StepSummary], knee: Knee | None) -> str:
        """Why :meth:`next` ended the search, in words (for ramp.json's ``stop_reason``); "" while
        it goes on. The same decision as :meth:`next`: the reason is the branch that stopped it."""
        return self._decide(steps, knee)[1]

    def _decide(self, steps: Sequence[StepSummary], knee: Knee | None) -> tuple[int | None, str]:
        """The next level, or None with why the search ends."""
        if not steps:
            return self.start, ""
        if len(steps) >= MAX_SEARCH_STEPS:
            return None, f"the search ran its most steps ({MAX_SEARCH_STEPS})"
        tried = sorted({s.users for s in steps})
        inferred = knee.inferred if knee else None
        ceiling = self._ceiling(steps)
        close = self._close_high_end(steps, tried, inferred) if ceiling is None else None
        if close is not None:
            return close, ""
        if inferred is None or inferred.boundary == "bound":
            below = inferred is not None and inferred.estimate is None  # even the lowest level broke
            if below:
                low = tried[0]
                if low > 1:
                    return max(1, low // 2), ""
                # at 1 user: measure it again until its requests say so surely (the budget or the
                # most steps end it otherwise: three steps of 2-3 requests each at 1 user, on the
                # simulator's logs profile, ended a search at 2.7 of its 10 minutes with no answer)
                sure = inferred is not None and inferred.ci95[1] is not None and inferred.ci95[1] <= 1
                if sure:
                    return None, "even 1 user breaks the SLA"
                return 1, ""
            top = tried[-1]
            if top >= self.max_users:
                return None, f"no level up to {self.max_users} users broke the SLA (raise MAX in --users auto:MAX)"
            return min(top * 2, self.max_users), ""
        est = inferred.estimate if inferred.estimate is not None else 0.0
        lo, hi = inferred.ci95
        if lo is not None and hi is not None and self.answered(knee):
            return None, self._narrow(lo, hi, est)
        if inferred.boundary == "cliff" and lo is not None and hi is not None:  # the interval is the bracket: bisect it
            a, b = int(lo), int(hi)
            # the middle count first; measured already (its step could not settle which side it
            # is on: CI31 stopped there, silently, with a bracket of 3 counts), the inside count
            # nearest the middle not yet measured, else the one measured fewest times
            return self._pick(steps, range(a + 1, b), (a + b) / 2)
        # a cliff whose resampling left an end open (some replicate never crossed: CI16 stopped
        # there with no answer) is probed as a smooth interval is, the open side half as far again;
        # probe inside the interval (a side the steps cannot bound yet: half as far again as the
        # estimate), nearest the estimate: a fresh count first, else one measured fewest times
        high = min(self.max_users, math.floor(hi if hi is not None else est * 1.5))
        if ceiling is not None and (lo is None or hi is None):
            # an end is open under a level that surely broke: split what is still unknown, the
            # counts between the highest that surely met (or the interval's low end) and that
            # level, in the middle (walking down from it one count a step, each breaking, left
            # 8-14 unmeasured beside the peers)
            met = [s.users for s in steps if s.decision == "meets" and s.users < ceiling]
            floor_ = max([*met, math.floor(lo) if lo is not None else 0])
            if ceiling - floor_ <= 1:
                return None, f"between {floor_} and {ceiling} users, adjacent counts: one met the SLA, one broke it"
            if ceiling - floor_ > 2:
                return self._pick(steps, range(floor_ + 1, ceiling), (floor_ + ceiling) / 2)
        low = max(1, math.ceil(lo if lo is not None else est / 1.5))
        centre = max(1, round(est))
        if ceiling is not None:
            high, centre = min(high, ceiling - 1), min(centre, ceiling - 1)
        return self._pick(steps, {*range(low, max(low, high) + 1), centre}, est)

    @staticmethod
    def _ceiling(steps: Sequence[StepSummary]) -> int | None:
        """The lowest count a step surely broke the SLA at (any limit), else None. The knee is the
        lowest crossing: nothing above it is measured to bound another limit's crossing (a search
        broken on ITL at 128 users measured 256 and 160 to bound a TTFT crossing that could not
        bind)."""
        broke = [s.users for s in steps if s.decision == "breaks"]
        return min(broke) if broke else None

    def _close_high_end(
        self, steps: Sequence[StepSummary], tried: Sequence[int], inferred: KneeEstimate | None
    ) -> int | None:
        """A level above every one measured when some level broke the SLA but none surely did
        (the interval has no high end), else None: an answer with one end ("fewer than 16
        users") comes before a better estimate with none. On the simulator's logs profile, whose
        TTFT is a cache hit's 14 ms or a long prompt's 1-3 s, a p50 limit of 500 ms kept one
        user, and then 4-8, inside the limit in some resamples: 8 of 20 searches spent their 10
        minutes narrowing below 8 users and ended with both ends open. Twice the highest level
        breaks the limit surely within a step; at MAX the highest level is measured again."""
        if inferred is None or inferred.ci95[1] is not None:
            return None
        if inferred.boundary == "bound" and inferred.estimate is not None:
            return None  # no level broke yet: the doubling goes up anyway
        top = tried[-1]
        if top < self.max_users:
            return min(2 * top, self.max_users)
        return top if self._measured(steps, top) < REPEATS_AT_A_LEVEL else None

    @staticmethod
    def answered(knee: Knee | None) -> bool:
        """The knee's interval is as narrow as the search asks: within :data:`KNEE_TOLERANCE` of
        its estimate either side, or between adjacent user counts (a cliff's bracket, or a smooth
        interval); a bound, or an interval with an open end, is not."""
        inferred = knee.inferred if knee else None
        if inferred is None or inferred.boundary == "bound":
            return False
        lo, hi = inferred.ci95
        if lo is None or hi is None:
            return False
        if inferred.boundary == "cliff":
            return int(hi) - int(lo) <= 1
        est = inferred.estimate if inferred.estimate is not None else 0.0
        return hi - lo <= 2 * KNEE_TOLERANCE * est or math.ceil(hi) - math.floor(lo) <= 1

    @staticmethod
    def closes_low_end(step: StepSummary, knee: Knee | None) -> bool:
        """The knee's interval has no low end (no level has shown it is within the limit: a p99
        far under its limit over 80 requests shows nothing yet) and this step, at or below the
        estimate and not far below it, is where more requests can show it: measure it on. (A p99
        of 107 ms against 400 ms at 87 users was not measured on, being far under its limit, and
        the search spent its budget on fresh counts of 80 requests each.)"""
        inferred = knee.inferred if knee else None
        if inferred is None or inferred.boundary == "bound" or inferred.estimate is None:
            return False
        if inferred.ci95[0] is not None:
            return False
        return inferred.estimate / NEAR_LIMIT <= step.users <= inferred.estimate

    @staticmethod
    def _narrow(lo: float, hi: float, est: float) -> str:
        """Why an interval this narrow ends the search."""
        if hi - lo <= 2 * KNEE_TOLERANCE * est:
            return f"the knee's interval is within {100 * KNEE_TOLERANCE:g} % of its estimate"
        return "the knee lies between adjacent user counts"

    def _pick(self, steps: Sequence[StepSummary], candidates: Iterable[int], centre: float) -> tuple[int | None, str]:
        """Of ``candidates``, the count nearest ``centre`` not yet measured, else the one measured
        fewest times (under :data:`REPEATS_AT_A_LEVEL`), else None: every one has its repeats."""
        near = sorted(set(candidates), key=lambda u: (abs(u - centre), u))
        tried = {s.users for s in steps}
        fresh = [u for u in near if u not in tried]
        if fresh:
            return fresh[0], ""
        counts = {u: self._measured(steps, u) for u in near}
        again = [u for u in near if counts[u] < REPEATS_AT_A_LEVEL]
        if again:
            return min(again, key=lambda u: (counts[u], abs(u - centre))), ""
        return None, (
            f"every user count inside the knee's interval was measured {REPEATS_AT_A_LEVEL} times "
            "and it did not narrow further (the figure is too noisy there for these steps: longer steps narrow it)"
        )

    @staticmethod
    def _measured(steps: Sequence[StepSummary], level: int) -> int:
        return sum(1 for s in steps if s.users == level)

    def describe(self) -> str:
        return f"auto:{self.max_users}"

    def settled(
        self, steps: Sequence[StepSummary], level: float, window: Sequence[RequestSample], limits: Sequence[Limit]
    ) -> str | None:
        """Why a step at ``level``, ``window`` its requests so far, can end before its planned
        length, or None: while the search still doubles (no level has come near a limit, none
        at or above this one ran) and every figure of this one is under half its limit
        (:data:`FAR_UNDER`), more requests could not change where it goes next. A step near a
        limit runs its window: the knee's interval is made of those. (Beside AIPerf and
        GuideLLM, the steps at 1, 2 and 4 users, their TTFT p99 a fifth of the limit, took half
        the search's minutes.) The figures' points decide (milliseconds; a step's summary with
        its intervals takes most of a second on a few hundred requests).

        A step surely broken far over a limit is not ended early: tried (ended from a third of
        its window on at 1.5x), it saved another 0.4 load-minutes a search in
        ``benchmarks/knee_search.py`` but its intervals held the truth in 163 of 180 searches
        against 167: cut short while the queue still grows, such a step reads less latency
        than its level's."""
        if len(window) < SETTLE_MIN_REQUESTS:
            return None
        if any(s.level >= level for s in steps) or any(_ratio(s) > 1 / FAR_UNDER for s in steps):
            return None
        for lim in limits:
            v = point_value(window, lim.metric, lim.stat)
            if v is None or lim.value <= 0 or v / lim.value > 1 / FAR_UNDER:
                return None
        return "every figure under half its limit: the search doubles"

    def extend(self, step: StepSummary) -> bool:
        """Measure an inconclusive step on only when some undecided figure is near its limit, or
        when it has no figure to judge: no request it sent ended in its window (a long profile's
        requests under load outlast a step; on the simulator's logs profile nothing ended in 30 s
        at 16 users, and the search, seeing no break, doubled to 256 with nothing to show)."""
        if not step.verdict.checks or any(c.value is None for c in step.verdict.checks):
            return True
        for c in step.verdict.checks:
            if c.decision != "inconclusive" or c.value is None or not c.limit:
                continue
            if c.is_rate or c.value <= 0:
                return True
            if 1 / NEAR_LIMIT <= c.value / c.limit <= NEAR_LIMIT:
                return True
        return False


def measure_on(
    plan: object,
    steps: Sequence[StepSummary],
    step: StepSummary,
    levels: Sequence[tuple[float, Sequence[RequestSample]]],
    limits: Sequence[Limit],
    unit: LevelUnit = "users",
    seed: int = 0,
) -> bool:
    """Whether an inconclusive step is measured on (its caller has checked it may be): a list of
    levels, always; a search as it says (:meth:`KneeSearch.extend`: only near a limit), and the
    knee search not once the knee inferred with this step so far (``levels``: every step's level
    and requests, this one's last) is as narrow as it asks, since measuring on could not end the
    search sooner. (Beside AIPerf and GuideLLM, a search spent 3 of its 9 minutes deciding its
    last step, at 15 users, when the knee already lay between 15 and 16.)"""
    extend = getattr(plan, "extend", None)
    if extend is None:
        return True
    if isinstance(plan, KneeSearch):
        knee = find_knee([*steps, step], infer_knee(levels, limits, unit, seed=seed))
        if plan.answered(knee):
            return False
        return extend(step) or plan.closes_low_end(step, knee)
    return bool(extend(step))


SATURATION_GAIN = 1.10
"""Calibration: a doubling of users that adds less than 10 % output tokens/s means saturation."""
SATURATION_SHARE = 0.90
"""Calibration: the reference load is the fewest users that reach 90 % of the best tokens/s."""


@dataclass(frozen=True)
class SaturationSearch:
    """A tuning study's calibration (``spoc tune --users auto``): double the users from ``start``
    until output tokens/s grows by less than :data:`SATURATION_GAIN` per doubling, a step clearly
    breaks the SLA, or ``max_users``. Unlike the knee search it needs no conclusive SLA verdict at
    light load (a p99 over a handful of requests has none), only throughput, which every step
    measures well."""

    max_users: int = 1024
    start: int = 2

    def next(self, steps: Sequence[StepSummary], knee: Knee | None = None) -> int | None:
        if not steps:
            return min(self.start, self.max_users)
        last = steps[-1]
        if last.decision == "breaks" or last.users >= self.max_users:
            return None
        if len(steps) >= 2 and last.output_tokens_per_s < SATURATION_GAIN * steps[-2].output_tokens_per_s:
            return None
        return min(last.users * 2, self.max_users)

    def describe(self) -> str:
        return f"auto:{self.max_users} (calibration: double until tokens/s saturates)"


def reference_load(steps: Sequence[StepSummary]) -> tuple[int, str] | None:
    """The reference load a calibration found: the fewest users whose output tokens/s reach
    :data:`SATURATION_SHARE` of the best among steps that did not clearly break the SLA, and
    why, in words. None without such a step."""
    ok = [s for s in steps if s.decision != "breaks" and s.requests]
    if not ok:
        return None
    best = max(s.output_tokens_per_s for s in ok)
    pick = min((s for s in ok if s.output_tokens_per_s >= SATURATION_SHARE * best), key=lambda s: s.users)
    broke = [s.users for s in steps if s.decision == "breaks"]
    tail = f"; the SLA breaks at {min(broke)} users" if broke else ""
    return pick.users, (
        f"reaches {pick.output_tokens_per_s:,.0f} of the best {best:,.0f} output tokens/s at {pick.users} users "
        f"(tried {', '.join(str(s.users) for s in steps)}{tail})"
    )


@dataclass(frozen=True)
class FixedRates(Listed):
    """``--rate 1,2,4``: open-loop steps at these arrival rates (requests/s, Poisson), in order."""

    PREFIX = "rate:"
    rates: list[float]

    @property
    def levels(self) -> Sequence[float]:
        return self.rates


@dataclass(frozen=True)
class FixedSpeeds(Listed):
    """``--speed 0.5,1,2``: a trace replayed at these speed multiples, in order."""

    PREFIX = "speed:"
    speeds: list[float]

    @property
    def levels(self) -> Sequence[float]:
        return self.speeds


MIN_SPEED = 1 / 64
"""The speed search halves no further: the host takes less than 1/64 of the traffic."""


def _round_speed(v: float) -> float:
    """A speed to probe, to two significant digits (x2.63 and x2.6 are the same experiment)."""
    if v <= 0:
        return MIN_SPEED
    digits = 1 - math.floor(math.log10(v))
    return round(v, digits)


@dataclass(frozen=True)
class SpeedSearch:
    """``--speed auto[:MAX]``: the knee search over a trace's speed multiple, from x1: doubles
    while no speed broke the SLA, halves while every one did, then probes inside the knee's
    interval nearest the estimate (a speed is continuous: the interval narrows to 5 % either
    side, or after :data:`MAX_SEARCH_STEPS`)."""

    max_speed: float = 64.0
    start: float = 1.0
    first: tuple[float, ...] = ()
    """Speeds replayed first, in their order, before the search goes on from what they found (a
    live headroom's refresh: the last estimate's interval and point); ``start`` then unused."""
    settled: int = MAX_SEARCH_STEPS
    """With ``first``: the steps after which the search stops once the knee is a crossing between
    the first speeds' ends (found where it was looked for; elsewhere it goes on as any search)."""

    def next(self, steps: Sequence[StepSummary], knee: Knee | None = None) -> float | None:
        if len(steps) < len(self.first):
            return self.first[len(steps)]
        if not steps:
            return self.start
        if len(steps) >= MAX_SEARCH_STEPS:
            return None
        tried = sorted({s.level for s in steps})
        inferred = knee.inferred if knee else None
        if self.first and len(steps) >= self.settled and inferred is not None and inferred.boundary != "bound":
            if inferred.estimate is not None and min(self.first) <= inferred.estimate <= max(self.first):
                return None
        if inferred is None or inferred.boundary == "bound":
            if inferred is not None and inferred.estimate is None:  # even the slowest broke
                low = tried[0]
                return None if low <= MIN_SPEED else max(MIN_SPEED, _round_speed(low / 2))
            top = tried[-1]
            return None if top >= self.max_speed else min(self.max_speed, top * 2)
        est = inferred.estimate if inferred.estimate is not None else tried[0]
        lo, hi = inferred.ci95
        lo = lo if lo is not None else est / 1.5
        hi = hi if hi is not None else min(self.max_speed, est * 1.5)
        if hi - lo <= 2 * KNEE_TOLERANCE * est:
            return None
        if inferred.boundary == "cliff":  # the widest part of the bracket the speeds tried leave, halved
            ends = sorted({max(lo, MIN_SPEED), hi, *(t for t in tried if lo < t < hi)})
            for a, b in sorted(zip(ends, ends[1:], strict=False), key=lambda ab: ab[0] / ab[1]):
                mid = _round_speed(math.sqrt(a * b))
                if b - a > 2 * KNEE_TOLERANCE * est and not any(abs(mid - t) <= 0.01 * mid for t in tried):
                    return mid
            return None
        for v in (est, (lo + est) / 2, (est + hi) / 2):
            cand = _round_speed(v)
            if lo <= cand <= hi and not any(abs(cand - t) <= 0.01 * cand for t in tried):
                return cand
        counts = {t: sum(1 for s in steps if s.level == t) for t in tried if lo <= t <= hi}
        again = [t for t, n in counts.items() if n < REPEATS_AT_A_LEVEL]
        return min(again, key=lambda t: (counts[t], abs(t - est)), default=None)

    def describe(self) -> str:
        return f"speed:auto:{self.max_speed:g}"


def parse_speed_plan(text: str) -> FixedSpeeds | SpeedSearch:
    """``--speed 0.5,1,2,4``, ``auto`` or ``auto:MAX``.

    Raises:
        UsersError: with the accepted forms.
    """
    t = text.strip().lower()
    if t == "auto":
        return SpeedSearch()
    if t.startswith("auto:"):
        try:
            top = float(t[5:])
        except ValueError:
            raise UsersError(f"bad --speed {text!r}: auto:MAX takes a number, e.g. auto:16") from None
        if not 1 <= top <= MAX_SPEED:
            raise UsersError(f"bad --speed {text!r}: MAX must be between 1 and {MAX_SPEED:g}")
        return SpeedSearch(max_speed=top)
    return FixedSpeeds(parse_speeds(text))


UserPlan = FixedUsers | KneeSearch | BisectSearch | FixedRates | SaturationSearch | FixedSpeeds | SpeedSearch


def plan_text(plan: UserPlan) -> str:
    """``1,2,4 users``, ``knee search to 256 users``, ``1,2 req/s`` or the calibration, in words."""
    if isinstance(plan, FixedSpeeds):
        return "trace at " + ", ".join(f"x{v:g}" for v in plan.speeds)
    if isinstance(plan, SpeedSearch):
        return f"knee search over the trace's speed to x{plan.max_speed:g}"
    if isinstance(plan, FixedRates):
        return ",".join(f"{r:g}" for r in plan.rates) + " req/s"
    if isinstance(plan, FixedUsers):
        return ",".join(map(str, plan.users)) + " users"
    if isinstance(plan, KneeSearch):
        return f"knee search to {plan.max_users} users"
    if isinstance(plan, BisectSearch):
        return f"bisection to {plan.max_users} users"
    return f"calibration to {plan.max_users} users"


def parse_levels(text: str) -> UserPlan:
    """A Load form's levels: ``rate:1,2,4`` (open loop), or what ``--users`` takes.

    Raises:
        UsersError: with the accepted forms.
    """
    t = text.strip()
    if t.lower().startswith("rate:"):
        return FixedRates(parse_rates(t[5:]))
    return parse_user_plan(t)


def parse_user_plan(text: str) -> FixedUsers | KneeSearch:
    """``1,2,4,8``, ``geom:1:64``, ``auto`` or ``auto:MAX``.

    Raises:
        UsersError: with the accepted forms.
    """
    t = text.strip().lower()
    if t == "auto" or t.startswith("auto:"):
        if t == "auto":
            return KneeSearch()
        try:
            top = int(t[5:])
        except ValueError:
            raise UsersError(f"bad --users {text!r}: auto:MAX takes a whole number, e.g. auto:256") from None
        if not 1 <= top <= MAX_USERS:
            raise UsersError(f"bad --users {text!r}: MAX must be between 1 and {MAX_USERS}")
        return KneeSearch(max_users=top)
    return FixedUsers(parse_users(text))
