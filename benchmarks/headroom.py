"""Live headroom against the knee measured on the same server, in simulated time (issue 52).

For each GPU preset and seed, the simulator (``max-num-seqs`` 48, which the monitor is not told)
serves ten minutes of open-loop traffic whose rate wanders between 35 % and 100 % of a base rate
(a five-minute swell: the windows must differ for the passive fit to identify the step time).
The monitor's passive learner (``spoc_tui.twin.headroom``) reads the simulator's ``/metrics``
every 5 s as ``spoc monitor`` would (``spoc_tui.sim.watch``) and then says its headroom: the
speed multiple of that traffic where the first SLA limit breaks, with its 95 % interval.

A second case, closed loop: users that think 2-8 s between turns, swinging between 8 and 48
every five minutes on the A100; the knee is then the multiple of the users (8s to 48s) where the
SLA breaks, the unit a users search reads. A third, flat traffic (a constant rate), where the
learner must say it cannot identify the step time yet, or give an interval that holds the knee.

The L40S's base rate is 2 requests/s (it was 1 until 2026-11-29: its knee then lay at x9.4-9.8,
against the x10 a headroom says at most, so the case measured the cap more than the estimate).

The truth is measured on the simulator itself, not on any twin: the very requests the observed
server was sent (their prompts, cached history and answers) sent again to a fresh server as their
users would send them s times as often (``VirtualServer.resend_as_users``: the instants they were
sent at, s times closer, each sending the earliest request whose previous turn has ended, as the
open-loop process that drew them sends), the requests before the headroom's window warming the
server and the window's judged whole, as the headroom judges its own replay (doubling from x1,
then bisecting to 3 %); the knee is where the worse of TTFT p99 and ITL p99 over its limit
crosses 1. Beside it the two truths this benchmark used before (2026-11-30): the same requests
each when due, as ``spoc ramp --trace T --speed auto`` replays a trace without sessions, its first
minute left out (a follow-up turn then goes before the answer it quotes has ended and computes its
history again, a harder load than the traffic's; and the minute left out held one of the
window's two swells, an easier one); and the knee of the process the traffic was drawn from (ten
more minutes of it at s times its rate, another seed: ten minutes of traffic differ from their
process by a few per cent in rate and more in their tail of long prompts). The closed loop's
truth is a users search on the process, as before (the issue's "or a users search").

Printed per case and seed: the headroom, its interval, the measured knee, whether the interval
holds it and the point's error; then per preset the share held and the median error (targets:
the knee inside the interval, the point within 15 %). Then the error's budget: the requests the
server really served over the headroom's window (their prompts, cached parts, answers and times),
replayed on the same passive twin (``spoc twin predict --trace T --speed auto``), whose knee
splits the error in two: the headroom against it is what drawing the traffic from the counters
and histograms loses, it against the measured knee what the twin gets wrong (the closed loop's:
in the requests a second its users' knee sent). Then the flat case (a constant rate): the
learner must say it cannot identify the step time yet, or give an interval that holds the knee.

Then (``--cases=bursts``, issue 76) a server of 24 seats, untold, under traffic that swings
four-fold every two minutes with bursts at three times the rate: the headroom untold and told
(``--max-num-seqs 24``), each beside the knee its window's requests measure.

Then (``--cases=learner``, issue 73) the passive learner's own cost per scrape at 2 and at 40
requests a second: the scrape parsed and read, which must not grow with the traffic; and the CPU
of one estimate at each rate as the monitor makes it (goals: at most 3 and 10 s).

Usage: python benchmarks/headroom.py [--seeds=N] [--cases=open,closed,flat,learner,bursts] [--presets=l40s] (make
bench: 5 seeds, every case, both presets); ``--smoke``: one preset, one seed, a shorter observation (checks that it runs).
``--real [--seed=N]``: the real vLLM CPU server (half an hour; it keeps its scrapes);
``--again=DIR``: that run's headroom said again from its kept scrapes and twin.json, beside its knee.
``--told``: the open cases' headroom again with the seats told (``--max-num-seqs``), beside.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spoc_tui.core.metrics.promparse import Exposition  # noqa: E402
from spoc_tui.core.ramp.knee import SpeedSearch  # noqa: E402
from spoc_tui.core.ramp.sla import parse_sla  # noqa: E402
from spoc_tui.core.ramp.steps import RequestSample, summarize_step  # noqa: E402
from spoc_tui.core.traces.read import TraceRow  # noqa: E402
from spoc_tui.sim.options import SimOptions  # noqa: E402
from spoc_tui.sim.run import build  # noqa: E402
from spoc_tui.sim.virtual import SentRequest, VirtualServer  # noqa: E402
from spoc_tui.sim.watch import VirtualWatch  # noqa: E402
from spoc_tui.twin.headroom import (  # noqa: E402
    MAX_SPEED,
    SEARCH_STEPS,
    Headroom,
    HeadroomLearner,
)
from spoc_tui.twin.live import LIVE_DRAWS, LIVE_REFRESH_S, LIVE_REPLAY_S  # noqa: E402
from spoc_tui.twin.passive import passive_twin  # noqa: E402
from spoc_tui.twin.predict import Prediction, TraceRows, figure, predict  # noqa: E402
from spoc_tui.twin.traffic import prefix_ids  # noqa: E402
from spoc_tui.workload import Workload, load_workload  # noqa: E402

SLA = "ttft_p99<=2s,itl_p99<=100ms"
REAL_SLA = "ttft_p99<=500ms,itl_p99<=50ms"
"""The real case's SLA (the tiny model on two CPU cores)."""
SEATS = 48
PRESETS = {"a100-80gb": 2.0, "l40s": 2.0}
"""GPU preset -> base rate (requests/s) of the observed traffic."""
OBSERVE_S = 600.0
REFRESH_AFTER_S = LIVE_REFRESH_S
"""The monitor's refresh comes this long after the estimate before, at the soonest."""
TRUTH_S = 600.0
PROFILE = """
name = "headroom"
system_tokens = 300
turns = {dist = "uniform", min = 1, max = 3}
user_tokens = {dist = "lognormal", median = 300, sigma = 0.8, max = 3000}
output_tokens = {dist = "lognormal", median = 150, sigma = 0.6, max = 1000}
think_s = 0
"""


USERS = (8, 48)
"""The closed-loop case: users swing between these over five minutes (they think between turns)."""


def workload(think: bool = False) -> Workload:
    """The profile; ``think``: the closed-loop case's users think 2-8 s after each answer."""
    path = Path(__file__).with_name(".headroom_profile.toml")
    text = PROFILE.replace("think_s = 0", 'think_s = {dist = "uniform", min = 2, max = 8}') if think else PROFILE
    path.write_text(text)
    try:
        return load_workload(str(path))
    finally:
        path.unlink()


BURSTS_SEATS = 24
"""The bursts case's server: max-num-seqs well under vLLM's 256, which the monitor is not told."""
BURSTS_BASE = 0.5
"""The bursts case's base rate, of the preset's: its bursts do not fill the seats (no queue shows them)."""
CASE = {"seats": SEATS, "bursts": False}
"""The case under way: its server's seats, and whether its traffic bursts (:func:`bursts`)."""


def server(gpu: str, seed: int, work: Workload, record: bool = False) -> VirtualServer:
    engine, _ = build(SimOptions(gpu=gpu, max_num_seqs=int(CASE["seats"]), dcgm_port=None, seed=seed))
    return VirtualServer(engine, work, 0, seed=seed, record=record)


def swell(base: float, flat: bool) -> Callable[[float], float]:
    if flat:
        return lambda t: base
    return lambda t: base * (0.35 + 0.65 * (0.5 + 0.5 * math.sin(2 * math.pi * t / 300.0)))


def users_swing(t: float) -> float:
    """The closed-loop case's users at ``t``: from 8 up to 48 and back every five minutes."""
    lo, hi = USERS
    return lo + (hi - lo) * (0.5 - 0.5 * math.cos(2 * math.pi * t / 300.0))


def set_load(vs: VirtualServer, closed: bool, level: float) -> None:
    """The load at ``level``: that many users (closed loop), or that arrival rate (open)."""
    if closed:
        vs.set_users(max(1, round(level)))
    else:
        vs.set_rate(level)


def drive(vs: VirtualServer, load: Callable[[float], float], seconds: float, closed: bool, every: float = 10.0) -> None:
    """The load set every ``every`` seconds as the process says (no scrape)."""
    t = vs.now
    while t < seconds - 1e-9:
        set_load(vs, closed, load(t))
        t = min(seconds, t + every)
        vs.advance(t)


def bursts(base: float) -> Callable[[float], float]:
    """Issue 76's traffic: the rate swings four-fold every two minutes (x0.5, then x2 of ``base``),
    with a 20 s burst at three times the rate every two and a half minutes."""
    return lambda t: base * (0.5 if (t // 120) % 2 == 0 else 2.0) * (3.0 if t % 150 < 20 else 1.0)


def process(base: float, flat: bool, closed: bool) -> Callable[[float], float]:
    """The observed load over time: users for the closed loop, else the arrival rate."""
    if closed:
        return users_swing
    return bursts(base) if CASE["bursts"] else swell(base, flat)


SEATS_CASE: dict[str, list[tuple[bool, float]]] = {}
"""The bursts case: per telling (untold, told), each seed's (interval holds the knee, point error %)."""


def bursts_case(gpu: str, seed: int, base: float, work: Workload, smoke: bool, observe_s: float) -> None:
    """Issue 76's case: a server of :data:`BURSTS_SEATS` seats, untold, under traffic that swings
    and bursts; its headroom untold and told (``--max-num-seqs``), from the same scrapes, beside
    the knee of the window's requests sent again as their users would send them."""
    CASE.update(seats=BURSTS_SEATS, bursts=True)
    try:
        sent: list[SentRequest] = []
        learner = observe(gpu, seed, base, False, observe_s, work, False, sent)
        draws, replay_s = (1, 30.0) if smoke else (4, 120.0)
        t0 = time.process_time()
        untold = learner.estimate(seed=seed, draws=draws, replay_s=replay_s)
        cost = time.process_time() - t0
        learner.told_seats = BURSTS_SEATS
        told = learner.estimate(seed=seed, draws=draws, replay_s=replay_s)
        since = observe_s - (untold.traffic.seconds if untold.traffic is not None else observe_s)
        truth = users_knee(gpu, seed, sent, since) if not smoke else math.nan
    finally:
        CASE.update(seats=SEATS, bursts=False)
    print(f"  bursts, {BURSTS_SEATS} seats, seed {seed}: untold: {untold.line()} ({cost:.1f} s of CPU)")
    print(f"    told max-num-seqs {BURSTS_SEATS}: {told.line()}")
    for name, h in (("untold", untold), ("told", told)):
        SEATS_CASE.setdefault(name, []).append(judged(h, truth))
    widths = [h.ci95[1] / h.ci95[0] if h.ci95[0] and h.ci95[1] else math.inf for h in (untold, told)]
    print(f"    measured knee x{truth:.3g}; inside: untold {SEATS_CASE['untold'][-1][0]}, told "
          f"{SEATS_CASE['told'][-1][0]}; interval hi/lo: untold {widths[0]:.2f}, told {widths[1]:.2f}")  # fmt: skip


def observe(gpu: str, seed: int, base: float, flat: bool, seconds: float, work: Workload,
            closed: bool = False, sent: list[SentRequest] | None = None,
            served: list[RequestSample] | None = None,
            then: tuple[float, Callable[[HeadroomLearner], None]] | None = None) -> HeadroomLearner:  # fmt: skip
    """The learner after ``seconds`` of the load, read every 5 s; ``sent``: filled with the requests
    the server was sent (the trace ``spoc ramp --trace T`` would replay); ``served``: with what the
    server made of them (each one's prompt, cached and answer tokens); ``then``: at that many
    seconds, the learner handed to that function (an estimate a refresh starts from)."""
    vs = server(gpu, seed, work, record=sent is not None)
    watch = VirtualWatch([vs], window_s=60.0, interval_s=5.0)
    learner = HeadroomLearner(tuple(parse_sla(SLA)))
    load = process(base, flat, closed)
    for _ in watch.run(seconds, before=lambda t: set_load(vs, closed, load(t)) if round(t) % 10 == 0 else None):
        learner.add(watch.now, watch.expositions[0])
        if then is not None and abs(watch.now - then[0]) < 1e-6:
            then[1](learner)
    if sent is not None and vs.sent is not None:
        sent.extend(vs.sent)
    if served is not None:
        served.extend(vs.samples)
    return learner


TRUTHS: dict[tuple[object, ...], tuple[float, float]] = {}
"""Truth runs already made: (preset, seed, base, flat, speed, closed, workload) -> their figures."""


def truth_at(gpu: str, seed: int, base: float, flat: bool, speed: float, work: Workload,
             closed: bool = False) -> tuple[float, float]:  # fmt: skip
    """The traffic at ``speed`` times its rate (closed loop: ``speed`` times the users) on a fresh
    server, over the window after the first minute: the worse of TTFT p99 and ITL p99 over their
    limits (inf where it did not finish 90 % of what it was sent), and the requests a second it was
    sent. Each run once (the closed loop's rate at x1 is the knee search's first step)."""
    key = (gpu, seed, base, flat, speed, closed, id(work))
    if key in TRUTHS:
        return TRUTHS[key]
    vs = server(gpu, seed + 7919, work)
    load = process(base, flat, closed)
    drive(vs, lambda t: speed * load(t), TRUTH_S, closed)
    window = vs.window(60.0, TRUTH_S)
    sent = sum(1 for s in vs.samples if s.start >= 60.0)
    # a server that did not finish what it was sent is past its knee
    worst = math.inf if sent and len(window) < 0.9 * sent else worst_of(window, TRUTH_S - 60.0)
    TRUTHS[key] = worst, sent / (TRUTH_S - 60.0)
    return TRUTHS[key]


def worst_of(window: list[RequestSample], seconds: float) -> float:
    """The worse of TTFT p99 and ITL p99 over their limits, of the requests finished in
    ``window`` over ``seconds`` (inf where a figure is missing)."""
    limits = tuple(parse_sla(SLA))
    step = summarize_step(1, 1, window, max(1e-9, seconds), limits, open_loop=True)
    ratios = [figure(step, lim.metric, lim.stat) for lim in limits]
    return max(math.inf if v is None else v / lim.value for v, lim in zip(ratios, limits, strict=True))


def worst_ratio(gpu: str, seed: int, base: float, flat: bool, speed: float, work: Workload,
                closed: bool = False) -> float:  # fmt: skip
    """The worse of TTFT p99 and ITL p99 over their limits at ``speed`` (:func:`truth_at`)."""
    return truth_at(gpu, seed, base, flat, speed, work, closed)[0]


def measured_knee(gpu: str, seed: int, base: float, flat: bool, work: Workload, closed: bool = False) -> float:
    """The knee of the load's process: ten minutes of it at each speed, on a fresh server."""
    return knee_of(lambda speed: worst_ratio(gpu, seed, base, flat, speed, work, closed))


WARMUP_S = 60.0
"""Trace seconds a replay's judgement leaves out at its start (a fresh server's first minute)."""


def replayed_ratio(gpu: str, seed: int, sent: list[SentRequest], speed: float) -> float:
    """The requests the observed server was sent, sent again ``speed`` times as fast to a fresh
    server (``spoc ramp --trace T --speed s`` of the traffic the headroom read, its very prompts and
    answers): the worse of TTFT p99 and ITL p99 over their limits, the requests sent in the first
    :data:`WARMUP_S` of the trace left out (inf where it did not finish 90 % of the rest within
    five minutes of the last being due)."""
    vs = server(gpu, seed + 7919, load_workload("chatbot"))  # no users: the profile is never drawn
    # each request when due, as a trace's rows without sessions go (the traffic the headroom writes
    # for a ramp to confirm it has none): the rate is then x speed, the headroom's unit; held for
    # their previous turns, a replay's turns came slower than x speed past the knee, and the knee
    # read 11-19 % above the process's
    last = vs.resend(sent, speed, turns_wait=False)
    vs.advance(last + 300.0)
    start = WARMUP_S / speed
    window = [r for r in vs.samples if r.start >= start]
    due = sum(1 for r in sent if (r.at - sent[0].at) / speed >= start)
    return math.inf if due and len(window) < 0.9 * due else worst_of(window, last - start)


def replayed_knee(gpu: str, seed: int, sent: list[SentRequest]) -> float:
    """The knee of the very traffic observed, replayed at speeds (:func:`replayed_ratio`)."""
    return knee_of(lambda speed: replayed_ratio(gpu, seed, sent, speed))


def users_ratio(gpu: str, seed: int, sent: list[SentRequest], since: float, speed: float,
                make: Callable[[], VirtualServer] | None = None) -> float:  # fmt: skip
    """Every request the observed server was sent, sent again to a fresh server as their users
    would send them ``speed`` times as often (:meth:`VirtualServer.resend_as_users`: the instants
    they were sent at, ``speed`` times closer, each sending the earliest request whose previous
    turn has ended): the worse of TTFT p99 and ITL p99 over their limits, of the requests of the
    headroom's window (sent at or after ``since``), all of them (inf where it did not finish 90 %
    of them within five minutes of the last instant). The requests before the window warm the
    server as they warmed the observed one (its prefix cache holds the history the window's
    follow-up turns quote), where the sessionless replay leaves out its first minute instead.
    ``make``: the fresh server (benchmarks/ledger.py's throttled one), where not the preset's."""
    # no users: the profile is never drawn
    vs = make() if make is not None else server(gpu, seed + 7919, load_workload("chatbot"))
    last = vs.resend_as_users(sent, speed)
    vs.advance(last + 300.0)
    mine = {k for k, r in enumerate(sent) if r.at >= since}
    window = [r for r in vs.samples if r.trace_index in mine]
    start = (min((r.at for r in sent if r.at >= since), default=since) - sent[0].at) / speed
    return math.inf if mine and len(window) < 0.9 * len(mine) else worst_of(window, last - start)


def users_knee(gpu: str, seed: int, sent: list[SentRequest], since: float,
               make: Callable[[], VirtualServer] | None = None) -> float:  # fmt: skip
    """The knee of the window's requests sent as their users would send them (:func:`users_ratio`)."""
    return knee_of(lambda speed: users_ratio(gpu, seed, sent, since, speed, make))


def served_rows(served: list[RequestSample], since: float, block: int) -> tuple[TraceRow, ...]:
    """The requests the observed server served from ``since``, as trace rows the twin replays: each
    one's prompt, the part its prefix cache served (as the headroom's rows have it: a prefix every
    row shares) and its answer's length, each when it came."""
    done = sorted((r for r in served if r.start >= since and r.ok), key=lambda r: r.start)
    rows = []
    for i, r in enumerate(done):
        n_in = r.prompt_tokens or 0
        ids = prefix_ids(i, n_in, min(n_in, r.cached_tokens or 0) // block, block)
        rows.append(TraceRow(i, r.start - done[0].start, n_in, r.output_tokens, ids, block, line=i + 1))
    return tuple(rows)


def served_knee(
    learner: HeadroomLearner, h: Headroom, served: list[RequestSample], since: float, max_speed: float
) -> float:
    """The knee of the requests really served over the headroom's window, replayed on the same
    passive twin (``spoc twin predict --trace T --speed auto`` with the twin the live fit makes):
    the headroom replays a traffic drawn from the counters instead, so the two knees differ by what
    drawing it loses, and this knee differs from the measured one by what the twin gets wrong."""
    if h.fit is None:
        return math.nan
    server = learner.server()
    rows = served_rows(served, since, server.block_size)
    if len(rows) < 2:
        return math.nan
    trace = TraceRows(rows, len(rows), {}, rows[-1].t, None)
    p = Prediction(twin=passive_twin(h.fit, server), workload=load_workload("chatbot"),
                   plan=SpeedSearch(max_speed=max_speed, start=1.0), limits=tuple(parse_sla(SLA)), seed=1,
                   draws=0, trace=trace, budget_s=SEARCH_STEPS * trace.span_s)  # fmt: skip
    inf = predict(p).knee.inferred
    if inf is None or inf.estimate is None:
        return math.nan
    return inf.estimate if inf.boundary != "bound" else math.inf


def knee_of(ratio: Callable[[float], float]) -> float:
    """Where ``ratio`` (the worse figure over its limit, at a speed) crosses 1: doubling from x1,
    then bisecting on a log scale to 3 %; inf where x64 holds."""
    lo, hi = None, None
    s = 1.0
    while s <= 64:
        if ratio(s) <= 1.0:
            lo = s
            s *= 2
        else:
            hi = s
            break
    if hi is None:
        return math.inf
    if lo is None:
        lo = hi / 2
        while lo > 1 / 64 and ratio(lo) > 1.0:
            hi, lo = lo, lo / 2
    while hi / lo > 1.03:
        mid = math.sqrt(lo * hi)
        if ratio(mid) <= 1.0:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


PROCESS: dict[str, list[tuple[bool, float]]] = {}
"""The open cases judged against their process's knee too (interval holds it, point error %)."""
SESSIONLESS: dict[str, list[tuple[bool, float]]] = {}
"""The open cases judged against their requests replayed without sessions, each when due (the
measured knee until 2026-11-30: :func:`replayed_knee`)."""
CLOSED_RATES: list[tuple[bool, float]] = []
"""The closed loop's seeds judged in the headroom's own unit (requests a second), beside the users."""
REFRESHED: dict[str, list[tuple[bool, float]]] = {}
"""The open and closed cases' headroom as the monitor's refresh makes it (from the estimate 4
minutes before: :func:`~spoc_tui.twin.headroom.refresh_speeds`), judged against the same knee."""
TOLD: dict[str, list[tuple[bool, float]]] = {}
"""With ``--told``: the open cases' headroom again with the seats told (what ``--max-num-seqs 48``
does), from the same scrapes, judged against the same knee."""


def judged(h: Headroom, knee: float) -> tuple[bool, float]:
    """Whether the headroom's interval holds ``knee``, and its point's error against it (%)."""
    lo, hi = h.ci95
    inside = h.identified and math.isfinite(knee) and (lo is None or lo <= knee) and (hi is None or knee <= hi)
    err = abs(h.estimate - knee) / knee * 100 if h.estimate and knee and math.isfinite(knee) else math.nan
    return inside, err


def one(gpu: str, seed: int, base: float, work: Workload, smoke: bool, observe_s: float, closed: bool = False,
        flat: bool = False) -> tuple[bool, float]:  # fmt: skip
    """One case on one seed: the headroom after ``observe_s`` of the load, then the knee measured;
    printed, and (interval holds the knee, point error %) returned."""
    t0 = time.process_time()
    sent: list[SentRequest] = []
    served: list[RequestSample] = []
    before: list[Headroom] = []  # the estimate the monitor's refresh starts from, 4 minutes before
    then = (observe_s - REFRESH_AFTER_S, lambda lr: before.append(lr.estimate(seed=seed, draws=4, replay_s=120.0)))
    learner = observe(gpu, seed, base, flat, observe_s, work, closed, sent, served, None if smoke else then)
    fed = time.process_time() - t0
    t0 = time.process_time()
    if smoke:  # told the seats: one replay where untold is two (the untold path: the bursts case's smoke)
        learner.told_seats = SEATS
    h = learner.estimate(seed=seed, draws=1 if smoke else 4, replay_s=30.0 if smoke else 120.0)
    learner.told_seats = None
    cost = time.process_time() - t0
    # the traffic the headroom read (its windows', the first left out)
    since = observe_s - (h.traffic.seconds if h.traffic is not None else observe_s)
    trace = [r for r in sent if r.at >= since]
    if closed:  # a users search: the knee in multiples of the users, on the process itself
        truth = measured_knee(gpu, seed, base, flat, work, closed) if not smoke else math.nan
    else:  # the window's requests sent again as their users would send them, s times as often
        truth = users_knee(gpu, seed, sent, since) if trace and not smoke else math.nan
    inside, err = judged(h, truth)
    what = "closed loop, users x" if closed else "flat traffic" if flat else gpu
    print(f"  {what} seed {seed}: {h.line()}")
    if before and not flat:  # the monitor's refresh: from the estimate 4 minutes before
        c0 = time.process_time()
        again = learner.estimate(seed=seed, draws=4, replay_s=120.0, last=before[0])
        took = time.process_time() - c0
        held_again = judged(again, truth)
        REFRESHED.setdefault("closed loop" if closed else gpu, []).append(held_again)
        print(f"    refreshed from the estimate {REFRESH_AFTER_S / 60:.0f} min before ({before[0].line()}): {again.line()}; "
              f"inside: {held_again[0]}; {took:.1f} s of CPU")  # fmt: skip
    if "--told" in sys.argv and not closed and not flat:  # the same scrapes, the seats told
        learner.told_seats = SEATS
        told = learner.estimate(seed=seed, draws=1 if smoke else 4, replay_s=30.0 if smoke else 120.0)
        learner.told_seats = None
        TOLD.setdefault(gpu, []).append(judged(told, truth))
        print(f"    told max-num-seqs {SEATS}: {told.line()}; error {TOLD[gpu][-1][1]:.0f} %")
    how = (
        "the users search's"
        if closed
        else f"the window's {len(trace)} requests as their users would send them, the ones before it warming"
    )
    print(f"    measured knee ({how}) x{truth:.3g}; inside: {inside}; error {err:.0f} %; seats seen {learner.seats}; "
          f"CPU: {fed:.1f} s to read {observe_s:.0f} s of scrapes, {cost:.1f} s for the headroom")  # fmt: skip
    if not closed and not smoke:  # beside it, the two knees this benchmark measured before
        name = gpu if not flat else "flat"
        bare = replayed_knee(gpu, seed, trace)
        SESSIONLESS.setdefault(name, []).append(judged(h, bare))
        print(f"    the same requests each when due, as a trace without sessions replays (the first minute left out) "
              f"x{bare:.3g}: x{bare / truth:.2f} of the knee; the headroom's error against it "
              f"{SESSIONLESS[name][-1][1]:.0f} %")  # fmt: skip
        process = measured_knee(gpu, seed, base, flat, work)
        PROCESS.setdefault(name, []).append(judged(h, process))
        print(f"    the process's knee (ten minutes more of it at each speed, another seed) x{process:.3g}: "
              f"the observed traffic's knee x{truth / process:.2f} of it; the headroom's error against it "
              f"{PROCESS[name][-1][1]:.0f} %")  # fmt: skip
    if closed and not smoke and math.isfinite(truth):
        # the headroom replays the traffic open loop, so its unit is the requests a second; a closed
        # loop's users slow as the server does, so x users is less than x of the requests
        rate = (
            truth_at(gpu, seed, base, flat, truth, work, True)[1] / truth_at(gpu, seed, base, flat, 1.0, work, True)[1]
        )
        held, off = judged(h, rate)
        CLOSED_RATES.append((held, off))
        print(f"    in requests a second: the knee's users sent x{rate:.3g} of the requests; inside: {held}; "
              f"error {off:.0f} %")  # fmt: skip
    else:
        rate = truth
    if h.identified and h.estimate is not None and (smoke or math.isfinite(rate)):  # (the smoke: that it runs)
        # the smoke replays the last minute up to x2 only: it checks that the split runs (the whole
        # window's search took 20 s of CPU, beside a real-time test on the suite's other worker)
        since_b, top = (observe_s - 60.0, 2.0) if smoke else (since, MAX_SPEED)
        seen = served_knee(learner, h, served, since_b, top)
        budget(what if not closed else "closed loop", h.estimate, seen, rate)
    return inside, err


BUDGET: dict[str, list[tuple[float, float]]] = {}
"""Per case, each seed's error split in two (signed, per cent): the headroom against the knee of
the requests really served replayed on the same passive twin (what drawing the traffic from the
counters loses), and that knee against the measured one (what the twin gets wrong)."""


def budget(case: str, estimate: float, served: float, measured: float) -> None:
    """Print and keep one seed's error budget (:data:`BUDGET`); ``measured`` in the headroom's unit
    (the closed loop's: the requests a second its users' knee sent)."""
    if not (math.isfinite(served) and math.isfinite(measured) and served > 0 and measured > 0):
        print(f"    error budget: the served requests' knee on the twin x{served:.3g} (no split)")
        return
    drawn, twin = 100 * (estimate / served - 1), 100 * (served / measured - 1)
    BUDGET.setdefault(case, []).append((drawn, twin))
    print(
        f"    error budget: the requests served, replayed on the same passive twin, x{served:.3g}: the "
        f"traffic drawn from the counters {drawn:+.0f} %, the twin against the measured knee {twin:+.0f} %"
    )


REAL_SEATS = 8
"""The real case's max-num-seqs (not told to the learner)."""
REAL_PERIOD_S = 120.0
"""The real case's swell: one period every two minutes, so a 120 s step of the knee search covers
a whole period at any speed from x1."""


def real_trace(path: Path, base: float, seconds: float, seed: int) -> Path:
    """The real case's traffic as a spoc trace: Poisson arrivals at a rate swelling between 35 % and
    100 % of ``base`` every :data:`REAL_PERIOD_S`, prompts and answers lognormal (medians 200 and
    64 tokens), no shared prefix."""
    import json
    import random

    rng = random.Random(seed)

    def rate(t: float) -> float:
        return base * (0.35 + 0.65 * (0.5 + 0.5 * math.sin(2 * math.pi * t / REAL_PERIOD_S)))

    t, rows = 0.0, [json.dumps({"spoc_trace": 1})]
    while True:
        t += rng.expovariate(base)
        if t >= seconds:
            break
        if rng.random() > rate(t) / base:  # thinning: a Poisson process of the swelling rate
            continue
        n_in = max(8, min(1500, round(rng.lognormvariate(math.log(200), 0.5))))
        n_out = max(4, min(400, round(rng.lognormvariate(math.log(64), 0.5))))
        rows.append(json.dumps({"t": round(t, 3), "input_tokens": n_in, "output_tokens": n_out}))
    path.write_text("\n".join(rows) + "\n")
    return path


def real(seed: int, base: float, sla: str, observe_s: float, step_s: float, budget: str, calibrate: bool = True) -> int:
    """The same on the real-engine tier's vLLM CPU server (tiny Llama, max-num-seqs
    :data:`REAL_SEATS`): ``observe_s`` of the swelling trace replayed at x1 (``spoc ramp --trace T
    --speed 1``) while the learner reads ``/metrics`` every 5 s in real time; the headroom; then
    ``spoc ramp --trace T --speed auto`` measures the knee in the same unit. The host's own drift
    beside it: one fixed request's decode gap before the observation, after it and after the knee
    search. The server runs on core 0, the load generator and the learner on core 1. With
    ``calibrate``, after the observation ``spoc twin calibrate`` (180 s) gives the learner its prior
    and the headroom is said again (the figures compared are then the prior's, where it identifies
    the model and the windows alone did not)."""
    import tempfile

    import httpx

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from realengine import NOT_SET_UP, ready, vllm_server

    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.procs.ports import free_ports

    if not ready():
        print(NOT_SET_UP, file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="headroom-real-"))
    (port,) = free_ports(1)
    # the server on core 0, everything else on core 1 (as twin_accuracy.py): the load generator's
    # CPU would otherwise slow the server it measures, and an OpenMP thread descheduled stalls a step
    server = vllm_server(work / "vllm.log", port, "--max-num-seqs", str(REAL_SEATS), core=0, guard=True)
    server.start(timeout=300)
    os.sched_setaffinity(0, {1})
    url = f"http://127.0.0.1:{port}"
    spoc = ["taskset", "-c", "1", sys.executable, "-m", "spoc_tui.cli"]
    try:
        trace = real_trace(work / "traffic.jsonl", base, observe_s + 60.0, seed)
        drift = [reference(url)]
        learner = HeadroomLearner(tuple(parse_sla(sla)), max_model_len=2048)
        observed = subprocess.Popen(
            [*spoc, "ramp", "--url", url, "--trace", str(trace), "--speed", "1", "--step-seconds", str(observe_s),
             "--warmup-seconds", "10", "--sla", sla, "--out", str(work / "observed")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        t0 = time.monotonic()
        fed = 0.0
        missed = 0
        # every scrape kept, so that `--again=DIR` says the headroom again from the same inputs
        (work / "run.json").write_text(json.dumps({"seed": seed, "sla": sla}))
        with httpx.Client(timeout=5.0) as client, (work / "scrapes.jsonl").open("w") as kept:
            while observed.poll() is None:
                t = time.monotonic() - t0
                c0 = time.process_time()
                try:  # uvicorn closes a connection idle 5 s: one every 5 s may meet it closing
                    text = client.get(f"{url}/metrics").text
                except httpx.TransportError:
                    try:
                        text = client.get(f"{url}/metrics").text
                    except httpx.TransportError:
                        text, missed = "", missed + 1
                if text:
                    learner.add(t, parse_text(text))
                fed += time.process_time() - c0
                if text:
                    kept.write(json.dumps({"t": round(t, 3), "text": text}) + "\n")
                time.sleep(max(0.0, 5.0 - (time.monotonic() - t0 - t)))
        if observed.returncode:
            print(f"spoc ramp --speed 1 failed:\n{(observed.stderr.read() if observed.stderr else '')[-2000:]}")
            return 1
        drift.append(reference(url))
        c0 = time.process_time()
        h = learner.estimate(seed=seed)
        cost = time.process_time() - c0
        print(f"  real vLLM CPU seed {seed}: {h.line()}", flush=True)
        if calibrate:  # the operator's twin.json as the prior: what the line says would settle it
            twin = work / "twin.json"
            r = calibrate(spoc, url, twin)
            if r.returncode:
                print(f"spoc twin calibrate failed:\n{r.stderr[-2000:]}")
                return 1
            h = with_prior(learner, twin, seed, h)
        # the knee search replays two periods of the very traffic observed, from its second minute
        # (inside the windows the headroom read): a trace step replays its whole trace at the step's
        # speed, and the observation's eleven minutes took eleven at x1, more than the budget
        # (until 2026-11-30 two periods of the same process, drawn again)
        window = f"60:{2 * REAL_PERIOD_S:.0f}"
        r = subprocess.run(
            [*spoc, "ramp", "--url", url, "--trace", str(trace), "--trace-window", window, "--speed", "auto",
             "--step-seconds", str(step_s), "--warmup-seconds", "10", "--budget", budget, "--sla", sla,
             "--out", str(work / "knee")],
            capture_output=True, text=True,
        )  # fmt: skip
        drift.append(reference(url))
        if r.returncode not in (0, 1):
            print(f"spoc ramp --speed auto failed:\n{r.stderr[-2000:]}")
            return 1
        how = (f"the host's drift (one request's decode gap, {drift[0] * 1e3:.2f} ms before): "
               f"{', '.join(f'{100 * (d / drift[0] - 1):+.0f} %' for d in drift[1:])} after the observation "
               f"and after the knee search; CPU {fed:.1f} s to read the scrapes, {cost:.1f} s for the headroom; "
               f"{missed} scrapes missed")  # fmt: skip
        print(f"    {beside_knee(h, work, learner.seats)}; {how}; files in {work}")
    finally:
        server.stop()
    return 0


def calibrate(spoc: list[str], url: str, out: Path) -> subprocess.CompletedProcess[str]:
    """``spoc twin calibrate`` (180 s) of the real server at ``url`` into ``out``, as an operator
    makes the twin.json the monitor takes as its prior (``spoc`` runs the CLI, on its core)."""
    return subprocess.run(
        [*spoc, "twin", "calibrate", "--url", url, "--budget", "180", "--endpoint", "completions",
         "--engine-flag", f"max-num-seqs={REAL_SEATS}", "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip


def with_prior(learner: HeadroomLearner, twin: Path, seed: int, alone: Headroom) -> Headroom:
    """The headroom said again with the calibrated ``twin`` as the learner's prior, printed; the
    figure compared is then the prior's where it identifies the model (else ``alone``'s)."""
    from spoc_tui.twin.model import read_twin

    learner.prior = read_twin(twin)
    h = learner.estimate(seed=seed)
    print(f"    with a calibrated twin as the prior: {h.line()}", flush=True)
    return h if h.identified else alone


def beside_knee(h: Headroom, work: Path, seats: int | None) -> str:
    """The headroom beside the knee measured in ``work/knee``: inside or not, and the point's error."""
    from spoc_tui.core.results import read_ramp

    inferred = read_ramp(work / "knee").knee.inferred
    m, (mlo, mhi) = (inferred.estimate, inferred.ci95) if inferred is not None else (None, (None, None))
    lo, hi = h.ci95
    inside = h.identified and m is not None and (lo is None or lo <= m) and (hi is None or m <= hi)
    err = abs(h.estimate - m) / m * 100 if h.estimate and m else math.nan

    def x(v: float | None) -> str:
        return "?" if v is None else f"{v:.3g}"

    return f"measured knee x{x(m)} (95 %: {x(mlo)}-{x(mhi)}); inside: {inside}; error {err:.0f} %; seats seen {seats}"


def again(work: Path, seed: int | None, sla: str | None) -> int:
    """The real case's headroom said again from a run's kept scrapes (``work/scrapes.jsonl``) and its
    calibrated twin, beside the knee that run measured: what a change to the learner does to the
    same inputs, without the half hour of the real server. The seed and the SLA are the run's
    (``work/run.json``) unless given."""

    kept = work / "scrapes.jsonl"
    if not kept.exists():
        print(f"--again: {kept}: no such file (a run of --real keeps its scrapes there)", file=sys.stderr)
        return 2
    run = json.loads((work / "run.json").read_text()) if (work / "run.json").exists() else {}
    seed = seed if seed is not None else int(run.get("seed", 1))
    sla = sla or str(run.get("sla", REAL_SLA))
    learner = HeadroomLearner(tuple(parse_sla(sla)), max_model_len=2048)
    rows = kept_scrapes(kept)
    if isinstance(rows, str):
        print(f"--again: {rows}", file=sys.stderr)
        return 2
    for t, exp in rows:
        learner.add(t, exp)
    h = learner.estimate(seed=seed)
    print(f"  real vLLM CPU seed {seed}, again from {work}: {h.line()}", flush=True)
    if (work / "twin.json").exists():
        h = with_prior(learner, work / "twin.json", seed, h)
    print(f"    {beside_knee(h, work, learner.seats)} (that run's knee)")
    return 0


def kept_scrapes(kept: Path) -> list[tuple[float, Exposition]] | str:
    """A real run's kept scrapes (``{"t": seconds, "text": /metrics}`` a line), parsed, in order;
    or, where a line is not one, which."""
    from spoc_tui.core.metrics.promparse import parse_text

    rows = []
    for n, line in enumerate(kept.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            rows.append((float(row["t"]), parse_text(str(row["text"]))))
        except (ValueError, TypeError, KeyError):
            return f'{kept}, line {n}: not a kept scrape ({{"t": seconds, "text": /metrics}})'
    return rows


def reference(url: str) -> float:
    """One fixed request's mean decode gap (64 tokens of a 32-token prompt, alone), seconds."""
    import httpx

    body = {"model": "tiny", "prompt": "hello " * 32, "max_tokens": 64, "ignore_eos": True, "stream": True,
            "temperature": 0}  # fmt: skip
    gaps: list[float] = []
    last = None
    with httpx.Client(timeout=60.0) as client, client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
    return statistics.median(gaps) if gaps else math.nan


OPTIONS = ("--smoke", "--told", "--real", "--seeds", "--cases", "--presets", "--seed", "--base", "--sla", "--observe",
           "--step", "--budget", "--again")  # fmt: skip


LEARNER_RATES = (2.0, 40.0)
"""The learner-cost case's traffic: the demo's rate, and an H100 at 40 requests a second (issue 73)."""
ESTIMATE_CPU_GOAL = {2.0: 3.0, 40.0: 10.0}
"""Issue 73: an estimate's CPU seconds at most, at the demo's traffic and at 40 requests a second."""


def learner_cost(smoke: bool) -> None:
    """Issue 73, point 4: what the passive learner costs the monitor per scrape (the exposition
    parsed, then read by :meth:`HeadroomLearner.add`), at 2 and at 40 requests a second on the
    simulated H100, a scrape a second as the monitor scrapes: it differences counters and
    histograms and holds no request, so the cost is that of the exposition, whose size does not
    grow with the traffic."""
    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.sim.exposition import vllm_metrics

    seconds = 30.0 if smoke else 600.0
    print(f"the passive learner's cost per scrape (a scrape a second for {seconds:.0f} s, the simulated H100; "
          "the two rates' scrapes taken in turn, so that the host's drift falls on both):")  # fmt: skip
    runs = []
    for rate in LEARNER_RATES:
        engine, _ = build(SimOptions(gpu="h100-80gb", dcgm_port=None, seed=1))
        vs = VirtualServer(engine, workload(), 0, seed=1)
        vs.set_rate(rate)
        runs.append({"vs": vs, "learner": HeadroomLearner(tuple(parse_sla(SLA))), "parse": 0.0, "add": 0.0, "size": 0})
    t, n = 0.0, 0
    while t < seconds:
        t, n = t + 1.0, n + 1
        if t == seconds - REFRESH_AFTER_S:  # the estimate a refresh starts from, as the monitor's
            for r in runs:
                r["learner"].told_seats = r["vs"].engine.cfg.max_num_seqs
                r["last"] = r["learner"].estimate(seed=1, draws=LIVE_DRAWS, replay_s=LIVE_REPLAY_S)
        for r in runs:
            r["vs"].advance(t)
            text = vllm_metrics(r["vs"].engine)
            c0 = time.process_time()
            exp = parse_text(text)
            c1 = time.process_time()
            r["learner"].add(t, exp)
            r["add"] += time.process_time() - c1
            r["parse"] += c1 - c0
            r["size"] = max(r["size"], len(text))
    for rate, r in zip(LEARNER_RATES, runs, strict=True):
        print(f"  {rate:g} requests/s ({len(r['vs'].samples):,} answered): {1e3 * r['parse'] / n:.2f} ms to parse the "
              f"scrape ({r['size'] / 1024:.0f} KB at most), {1e3 * r['add'] / n:.2f} ms for the learner; "
              f"{1e3 * (r['parse'] + r['add']) / n:.2f} ms a scrape")  # fmt: skip
    cost = [r["parse"] + r["add"] for r in runs]
    print(f"  at {LEARNER_RATES[-1]:g} requests/s, x{cost[-1] / cost[0]:.2f} the cost at {LEARNER_RATES[0]:g}")
    print(f"an estimate as the monitor makes it ({LIVE_DRAWS} draws, {LIVE_REPLAY_S:.0f} s replays, the seats told as "
          "make demo tells them), CPU s:")  # fmt: skip
    for rate, r in zip(LEARNER_RATES, runs, strict=True):
        learner = r["learner"]
        learner.told_seats = r["vs"].engine.cfg.max_num_seqs
        c0 = time.process_time()
        h = learner.estimate(seed=1, draws=LIVE_DRAWS, replay_s=LIVE_REPLAY_S)
        took = time.process_time() - c0
        goal = ESTIMATE_CPU_GOAL[rate]
        verdict = "" if smoke else (" (goal met)" if took <= goal else " (goal MISSED)")
        print(f"  {rate:g} requests/s: {took:.1f} s, goal at most {goal:g}{verdict}: {h.line()}")
        if (last := r.get("last")) is not None:
            c0 = time.process_time()
            again = learner.estimate(seed=1, draws=LIVE_DRAWS, replay_s=LIVE_REPLAY_S, last=last)
            took = time.process_time() - c0
            print(f"    its refresh from the estimate {REFRESH_AFTER_S / 60:.0f} min before ({last.line()}): "
                  f"{took:.1f} s: {again.line()}")  # fmt: skip


def main() -> int:
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        return 0
    if bad := [a for a in sys.argv[1:] if a.split("=")[0] not in OPTIONS]:
        print(f"headroom.py: unknown option {bad[0]} (--help says which it takes)", file=sys.stderr)
        return 2
    smoke = "--smoke" in sys.argv
    arg = {a.split("=")[0]: a.split("=", 1)[1] for a in sys.argv if "=" in a}
    if "--again" in arg:  # a --real run's headroom said again from its kept scrapes
        seed = int(arg["--seed"]) if "--seed" in arg else None
        return again(Path(arg["--again"]), seed, arg.get("--sla"))
    if "--real" in sys.argv:  # make bench only: half an hour of the real server in real time
        return real(int(arg.get("--seed", "1")), float(arg.get("--base", "5")), arg.get("--sla", REAL_SLA),
                    float(arg.get("--observe", str(OBSERVE_S))), float(arg.get("--step", "120")),
                    arg.get("--budget", "20m"))  # fmt: skip
    seeds = 1 if smoke else next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--seeds=")), 5)
    cases = next(
        (a.split("=")[1].split(",") for a in sys.argv if a.startswith("--cases=")),
        ["open", "closed", "flat", "learner"] + ([] if smoke else ["bursts"]),  # the smoke's bursts: a test of its own
    )
    if "learner" in cases:
        learner_cost(smoke)
    presets = dict(list(PRESETS.items())[:1]) if smoke else PRESETS
    only = next((a.split("=")[1].split(",") for a in sys.argv if a.startswith("--presets=")), None)
    if only is not None:
        if unknown := set(only) - set(PRESETS):
            raise SystemExit(f"--presets: no preset {', '.join(sorted(unknown))}; known: {', '.join(PRESETS)}")
        presets = {g: b for g, b in PRESETS.items() if g in only}
    observe_s = 330.0 if smoke else OBSERVE_S
    work, closed_work = workload(), workload(think=True)
    print(f"live headroom vs the measured knee: SLA {SLA}, max-num-seqs {SEATS} (not told), {observe_s:.0f} s observed")
    summary: dict[str, list[tuple[bool, float]]] = {}
    if "open" in cases:
        for gpu, base in presets.items():
            for seed in range(1, seeds + 1):
                summary.setdefault(gpu, []).append(one(gpu, seed, base, work, smoke, observe_s))
    gpu, base = next(iter(PRESETS.items()))
    if "closed" in cases:  # users swinging 8-48, thinking 2-8 s; the knee in multiples of the users
        for seed in range(1, seeds + 1):
            summary.setdefault(f"{gpu}, closed loop", []).append(
                one(gpu, seed, base, closed_work, smoke, observe_s, True)
            )
    if "bursts" in cases:  # issue 76: seats well under 256, untold, traffic that swings and bursts
        for seed in range(1, seeds + 1):
            bursts_case(gpu, seed, base * BURSTS_BASE, work, smoke, observe_s)
        for name, rows in SEATS_CASE.items():
            summary[f"{gpu}, bursts, {BURSTS_SEATS} seats {name}"] = rows
    if CLOSED_RATES:
        summary[f"{gpu}, closed loop, in requests a second"] = CLOSED_RATES
    for name, rows in PROCESS.items():
        summary[f"{name}, against the process's knee"] = rows
    for name, rows in SESSIONLESS.items():
        summary[f"{name}, against the sessionless replay's knee"] = rows
    for name, rows in TOLD.items():
        summary[f"{name}, told max-num-seqs {SEATS}"] = rows
    for name, rows in REFRESHED.items():
        summary[f"{name}, refreshed {REFRESH_AFTER_S / 60:.0f} min on"] = rows
    if not smoke:
        for name, rows in summary.items():
            held = sum(1 for ok, _ in rows if ok)
            errs = [e for _, e in rows if math.isfinite(e)]
            med = statistics.median(errs) if errs else math.nan
            print(f"{name}: interval holds the measured knee {held}/{len(rows)}; median point error {med:.0f} %")
        if "flat" in cases:
            one(gpu, 1, base, work, smoke, OBSERVE_S, flat=True)
        for name, rows in BUDGET.items():
            drawn, twin = statistics.median(d for d, _ in rows), statistics.median(t for _, t in rows)
            print(
                f"{name}, error budget (median of {len(rows)}): the traffic drawn from the counters "
                f"{drawn:+.0f} %, the twin {twin:+.0f} %"
            )
    return 0


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()
    sys.exit(main())
