"""Live headroom: how much more of today's traffic a server takes within the SLA (issue 52).

A :class:`HeadroomLearner` is fed every scrape the monitor makes of one server. From them it keeps

- the windows of :mod:`spoc_tui.twin.passive` (every ``window_s``, the counters' increase), which
  fit the twin's step time passively;
- the traffic of the last ``traffic_s`` (15 minutes by default): the arrival rate and how bursty
  it is (the index of dispersion of the requests finished per window: 1 is Poisson), the prompt
  and output length distributions (vLLM's per-request histograms) and the prefix-cache share;
- what the server's configuration shows of itself (the KV cache's size; the seats, once a queue
  formed while the KV cache had room: the most requests it then ran).

:meth:`HeadroomLearner.estimate` replays that traffic, drawn again as a trace, on the twin so
fitted at speed multiples: the knee search of ``spoc twin predict --trace --speed auto`` (the
experiment driver in virtual time), once on the fit and once per bootstrap draw of it. The
headroom is the speed multiple where the first SLA limit breaks, with the draws' 95 % interval
and the limit that binds first; or, where the windows cannot say, why not and what would settle
it, never a bare number.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from spoc_tui.core.metrics.promparse import Exposition
from spoc_tui.core.metrics.vllm import (
    PREFILL_TIME,
    REQUEST_GENERATION_TOKENS,
    REQUEST_PREFILL_COMPUTED,
    REQUEST_PROMPT_TOKENS,
    Scrape,
    cache_config,
    flow_now,
    kv_blocks,
    server_view,
    windowed_histogram,
)
from spoc_tui.core.ramp.knee import MIN_SPEED, SpeedSearch
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.tuning.engineflags import BLOCK_SIZES
from spoc_tui.twin.arrivals import FlowLog
from spoc_tui.twin.ledger import Graded, Ledger, LedgerSummary, Seen, grade_after
from spoc_tui.twin.model import ServerConfig, Twin
from spoc_tui.twin.oneserver import OneServer, QueueSeats, gauge_error
from spoc_tui.twin.passive import KvGauge, PassiveFit, PassiveWindow, fit_of, passive_twin, window_of
from spoc_tui.twin.replayed import (
    TOO_BIG_SHARE,
    beyond_the_cache,
    replay_peak,
    replays_median,
    seats_assumed,
    seats_range,
    with_scatter,
)
from spoc_tui.twin.traffic import (
    REPLAY_S,
    WINDOW_S,
    Traffic,
    TrafficRows,
    swells,
)

TRAFFIC_S = 900.0
"""How much of the recent traffic a headroom replays (the last 15 minutes)."""
KEEP_WINDOWS = 240
"""Windows kept for the fit (two hours of 30 s windows)."""
DEFAULT_SEATS = 256
"""vLLM's max-num-seqs default, assumed until a queue shows the server's own."""
SEATS_MARGIN = 1.1
"""Untold and unseen seats are replayed at the most requests seen running at once too where the
default's replay ran more than this many times that (plus one) up to its point."""
DEFAULT_BATCHED_TOKENS = 8192
"""vLLM's max-num-batched-tokens default for online serving, assumed."""
MAX_SPEED = 10.0
"""The fastest a headroom replays the traffic: more than this is said as "beyond x10" (a server
that idle needs no finer answer, and replays far past its knee took a minute of CPU each)."""
DRAWS_NEAR_KNEE = True
"""The fit's draws replay the traffic only at the speeds about the fit's knee (a headroom reads
their knees alone): on the benchmark's A100 its eight draws replayed 28 times where they
replayed 64, the same knees (:func:`~spoc_tui.twin.predict.draw_near_knee`)."""
SEARCH_STEPS = 6
"""Replays a headroom's knee search may run (each ``replay_s`` of virtual time, or to its last
answer): enough to double from x1 past :data:`MAX_SPEED` and then narrow the knee once or twice.
The default budget of ``spoc ramp``'s search (ten minutes of load) stopped it at x8 and said
"beyond x8" of a server whose knee was x9.8. Eight ran two more probes about the knee (x7 and x6.5
after x6.1, x6 and x5.9 on the benchmark's A100), the dearest replays, and moved neither the point
nor the draws' knees: 6 takes a fifth of an estimate's CPU less, its interval's top at the bracket."""
REFRESH_STEPS = 4
"""Replays after which a refresh's search stops where the last estimate was a crossing and the knee
is found again between the ends of its interval: those ends and its point first
(:func:`refresh_speeds`), then one more about the knee (the draws' spread, not the fit's bracket,
is most of an interval). A knee that moved out of it is searched for as from x1, up to
:data:`SEARCH_STEPS` replays."""
LEDGER_MIN = 5
"""Graded windows the ledger needs before its record widens an interval (:func:`widened_by_ledger`)."""
LEDGER_HELD = 0.9
"""The share of graded windows held under which the interval is widened."""
MIN_REQUESTS = 30
"""Fewer requests than this in the traffic window: too thin to replay."""
BINDS = {
    "kv_full": "KV cache",
    "batch_full": "the batch (max-num-seqs or max-num-batched-tokens)",
    "queue_unbounded": "the queue (arrivals outrun the engine)",
    "preempting": "KV cache (preemptions)",
    "decode_slows": "decode speed (the batch slows every token)",
    "throttled": "GPU throttling",
}
"""The knee's cause, as a headroom line says what binds first."""


@dataclass(frozen=True)
class Headroom:
    """How much more of the recent traffic the server takes within the SLA."""

    estimate: float | None
    ci95: tuple[float | None, float | None]
    binding_limit: str | None
    binds: str | None
    """What binds first, in words (the knee's cause)."""
    identified: bool
    reason: str
    """Why there is no number (``identified`` false), or what it rests on."""
    windows: int
    traffic: Traffic | None
    fit: PassiveFit | None = field(default=None, compare=False)
    sla: tuple[str, ...] = ()
    unit: str = "x"
    assumed: tuple[str, ...] = ()
    """What the number rests on that the scrapes did not show (``max-num-seqs 256``)."""
    seats_peak: int | None = field(default=None, compare=False)
    """With the seats assumed: the most requests the replay ran at once up to its point."""
    ledger: LedgerSummary | None = field(default=None, compare=False)
    """How the twin's predictions of the minutes since held (:mod:`spoc_tui.twin.ledger`), where kept."""
    beyond_top: bool = field(default=False, compare=False)
    """Its point's replay met the SLA at :data:`MAX_SPEED` (a bound: "beyond x10"): the next
    estimate's search replays that speed first (:meth:`LearnerState.estimate`)."""
    parts: tuple[Headroom, ...] = field(default=(), compare=False)
    """With the seats unseen and untold, the two searches it spans (vLLM's default seats, the most
    seen running): the next estimate starts each from its own (:func:`refresh_speeds`)."""

    def as_dict(self) -> dict[str, object]:
        lo, hi = self.ci95
        return {
            "estimate": None if self.estimate is None else round(self.estimate, 3),
            "ci95": [None if lo is None else round(lo, 3), None if hi is None else round(hi, 3)],
            "unit": self.unit,
            "binding_limit": self.binding_limit,
            "binds": self.binds,
            "identified": self.identified,
            "reason": self.reason,
            "windows": self.windows,
            "traffic": self.traffic.as_dict() if self.traffic is not None else None,
            "sla": list(self.sla),
            "assumed": list(self.assumed),
            **({"ledger": self.ledger.as_dict()} if self.ledger is not None else {}),
        }

    @classmethod
    def none(cls, reason: str, limits: Sequence[Limit] = ()) -> Headroom:
        """No number, and why (a source whose scrapes or estimate failed, one estimate not run)."""
        return cls(None, (None, None), None, None, False, reason, 0, None, None, tuple(str(x) for x in limits))

    def text(self) -> str:
        """The line, and under it the ledger's where one is kept (``spoc inspect --headroom``)."""
        return self.line() + (f"\n  {self.ledger.line()}" if self.ledger is not None else "")

    def line(self) -> str:
        """One line, as the servers panel and ``spoc inspect --headroom`` say it."""
        if not self.identified or self.estimate is None:
            return f"headroom: {self.reason}"
        lo, hi = self.ci95
        mins = round((self.traffic.seconds if self.traffic else TRAFFIC_S) / 60)
        within = f" within {','.join(self.sla)}" if self.sla else ""
        assumes = f"; assumes {', '.join(self.assumed)} (not seen)" if self.assumed else ""
        if hi is None:  # every speed replayed met the SLA: a bound, not a point
            beyond = _x(lo if lo is not None else self.estimate)
            return f"headroom beyond x{beyond} of the last {mins} min of traffic{within}{assumes}"
        ci = f" (95 %: {_x(lo)}-{_x(hi)})"
        binds = f"; binds first: {self.binds}" if self.binds else ""
        return f"headroom x{self.estimate:.2g}{ci} of the last {mins} min of traffic{within}{binds}{assumes}"


def _x(v: float | None) -> str:
    return "?" if v is None else f"{v:.2g}"


class HeadroomLearner:
    """One server's scrapes, kept as the passive fit's windows and the recent traffic."""

    def __init__(
        self,
        limits: Sequence[Limit],
        prior: Twin | None = None,
        window_s: float = WINDOW_S,
        traffic_s: float = TRAFFIC_S,
        max_model_len: int | None = None,
        seats: int | None = None,
    ) -> None:
        """``seats``: the server's max-num-seqs where the operator told it (vLLM's ``/metrics``
        does not say it; else a queue shows it, a prior twin has it, or it is assumed)."""
        if window_s <= 0 or traffic_s < window_s:
            raise ValueError("the traffic must span at least one window")
        if seats is not None and seats < 1:
            raise ValueError(f"max-num-seqs must be at least 1, got {seats}")
        self.told_seats = seats
        self.limits = tuple(limits)
        self.prior = prior
        self.window_s = window_s
        self.traffic_s = traffic_s
        self.max_model_len = max_model_len
        self.windows: deque[PassiveWindow] = deque(maxlen=KEEP_WINDOWS)
        self._marks: deque[tuple[float, Exposition]] = deque()
        """A scrape every window_s, back over the traffic's span (and one before it)."""
        self._counts: deque[float] = deque(maxlen=max(4, int(traffic_s / window_s)))
        """Requests finished in each recent window (the arrivals' burstiness)."""
        self._flow = FlowLog(traffic_s)
        """Every scrape's requests finished and inside, over the traffic's span (how even the
        arrivals came)."""
        self._now = 0.0
        self.one = OneServer(traffic_s)
        """Whether the scrapes are one server's (counters that go back, models that change)."""
        self._queue = QueueSeats()
        self._most: deque[float] = deque([0.0], maxlen=max(2, int(traffic_s / window_s) + 1))
        """The most requests in the server at one scrape, window by window over the traffic's span
        (the last: the window under way)."""
        self.kv = KvGauge()
        """The KV gauge over the window's scrapes (its decode context)."""
        self.kv_tokens: int | None = None
        self.refused: deque[str | None] = deque(maxlen=KEEP_WINDOWS)
        """Each recent window's reason for being refused (impossible figures), None where it was taken."""
        self.kv_bad: str | None = None
        """Why the server's last report of its KV cache cannot be taken (an impossible label)."""
        self.kv_bytes_per_token: float | None = None
        """A token's KV on one GPU, bytes (``kv_cache_memory_bytes`` over the cache's tokens)."""
        self.block_size: int = 16
        self.model: str = ""
        self.engine_version: str = ""
        self.prefix_caching: bool | None = None
        self.ledger = Ledger(limits)
        self.relearning: tuple[float, str] | None = None
        """Since when the fit learns again, and why: its predictions of the windows since missed the
        server (:meth:`graded`)."""
        """Each minute the server served, kept to be predicted and graded (:mod:`spoc_tui.twin.ledger`)."""

    def add(self, t: float, exp: Exposition) -> None:
        """One scrape of the server at ``t`` (the monitor's clock). Only one every ``window_s`` is
        read (the monitor scrapes every second; the others cost a comparison). Counters that went
        back (a restart, another server at the URL) start the learning over (issue 76)."""
        self._now = t
        done, inside = flow_now(exp)
        if self.one.see(t, done):
            self._start_over()
        self.kv.add(exp)
        self._flow.add(t, done, inside)
        if inside is not None:
            self._most[-1] = max(self._most[-1], inside)
        if self._marks and t - self._marks[-1][0] < self.window_s - 1e-6:
            return
        self._most.append(0.0)  # the next window's most
        self.ledger.see(t, exp)
        cc = cache_config(exp)
        reported = kv_blocks(cc)
        self.kv_bad = reported if isinstance(reported, str) else None
        if isinstance(reported, tuple):
            self.kv_tokens, self.block_size = reported[0] * reported[1], reported[1]
        try:  # per GPU, where the server was given it (vLLM's --kv-cache-memory; "None" otherwise)
            mem = float(cc["kv_cache_memory_bytes"])
            ok = self.kv_tokens and math.isfinite(mem) and mem > 0
            self.kv_bytes_per_token = mem / self.kv_tokens if ok and self.kv_tokens else None
        except (KeyError, ValueError):
            pass
        if "enable_prefix_caching" in cc:
            self.prefix_caching = cc["enable_prefix_caching"].lower() == "true"
        if not self._marks:
            self._marks.append((t, exp))
            return
        t_last, last = self._marks[-1]
        scrape = Scrape(exp, t, last, t_last)
        view = server_view("server", scrape)
        if self.one.models(t, tuple(sorted(view.model_names))):  # another server's model: start over
            self._start_over()
            self._marks.append((t, exp))
            return
        total = view.total
        self.model = self.model or next(iter(view.model_names), "")
        self.engine_version = view.engine_version or self.engine_version
        kv_mean, kv_per_running = self.kv.close()
        win = window_of(
            total,
            t - t_last,
            t,
            self.kv_tokens,
            kv_mean,
            windowed_histogram(scrape, PREFILL_TIME),
            windowed_histogram(scrape, REQUEST_PREFILL_COMPUTED),
            kv_per_running,
        )
        running, waiting, kv = total.running, total.waiting, total.kv_cache_usage
        kv_most = max((k for k in (kv, kv_mean) if k is not None), default=None)
        if win is not None and (why := gauge_error(running, kv_most, self.told_seats) or win.impossible()):
            self.refused.append(why)  # not fitted: no server reports it (issues 74, 76)
        elif win is not None:
            self.windows.append(win)
            self.refused.append(None)
        if total.request_rate is not None:  # requests finished in the window (a restart's reset counted)
            self._counts.append(total.request_rate * (t - t_last))
        self._queue.see(running, waiting, kv)  # a queue while the KV cache has room: at the seats
        self._marks.append((t, exp))
        while len(self._marks) > 2 and t - self._marks[1][0] >= self.traffic_s - 1e-6:
            self._marks.popleft()

    def ledger_summary(self) -> LedgerSummary:
        """The ledger's verdict as of the last scrape."""
        return self.ledger.summary(self._now)

    def graded(self, got: Graded | str, fit: PassiveFit | None = None) -> None:
        """One of :attr:`ledger`'s windows graded (or why not): where the last ones missed the same
        way (:meth:`~spoc_tui.twin.ledger.Ledger.drift`), the server moved from what the fit
        learned: the windows before the first of them are forgotten and the fit learns again."""
        self.ledger.add(got)
        self.ledger.fit = fit or self.ledger.fit
        drift = self.ledger.drift()
        if drift is not None and (self.relearning is None or drift[0] > self.relearning[0]):
            since, what = drift
            self.relearning = (since, what)
            kept = [w for w in self.windows if w.t - w.seconds >= since - 1e-6]
            self.windows.clear()
            self.windows.extend(kept)
            self.ledger.fit = None  # the fit of before grades nothing more: the next is the new windows'

    def grade(self, seen: Seen, seed: int = 0) -> tuple[Graded | str, PassiveFit | None]:
        """``seen`` (one of :attr:`ledger`'s windows) graded on a fit of the windows before it
        (:func:`~spoc_tui.twin.ledger.grade_after`; seconds of CPU), and the fit it was graded on."""
        windows, server, kv_bytes, last = tuple(self.windows), self.server(), self.kv_bytes_per_token, self.ledger.fit
        return grade_after(seen, windows, server, self.limits, self.prior, kv_bytes, seed, last)

    @property
    def seats(self) -> int | None:
        """The server's max-num-seqs, once a queue at them showed it."""
        return self._queue.seats

    def _start_over(self) -> None:
        """Forget what was learned: another server's scrapes, or this one's before it restarted."""
        self.windows.clear()
        self.refused.clear()
        self._marks.clear()
        self._counts.clear()
        self._flow = FlowLog(self.traffic_s)
        self.kv = KvGauge()
        self._queue = QueueSeats()
        self._most = deque([0.0], maxlen=self._most.maxlen)
        self.ledger.restart()
        self.relearning = None

    def fit(self, seed: int = 0) -> PassiveFit:
        return fit_of(self.windows, self.prior, self.kv_bytes_per_token, seed)

    def traffic(self) -> Traffic | None:
        """The traffic since the oldest scrape kept (about ``traffic_s``), or None before a window."""
        if len(self._marks) < 2:
            return None
        (t0, first), (t1, last) = self._marks[0], self._marks[-1]
        scrape = Scrape(last, t1, first, t0)
        view = server_view("server", scrape).total
        secs = t1 - t0
        done = (view.request_rate or 0.0) * secs
        counts = list(self._counts)
        disp = swing = None
        if len(counts) >= 4 and statistics.fmean(counts) > 0:
            swing = statistics.variance(counts) / statistics.fmean(counts)
            # the Allan factor: half the mean squared change between consecutive windows over the
            # mean (1 for a Poisson stream); a slow trend (the day's rise) is not burstiness
            steps = [(b - a) ** 2 for a, b in zip(counts, counts[1:], strict=False)]
            disp = statistics.fmean(steps) / (2 * statistics.fmean(counts))
        estimated = ["prompt and output lengths: drawn from vLLM's histogram buckets, their mean the histogram's"]
        ev = self._flow.evenness()
        steady = not swells(swing, len(counts))
        poisson = "Poisson at the rate" if steady else "each window's rate in turn, Poisson within it"
        if ev is None:
            how = "gamma intervals of the rate and dispersion" if steady else poisson
        elif ev.cv2(steady=steady) == 1.0:  # as the replay decides it, not decided again here
            how = f"{poisson}: their evenness {ev.text()}" if steady else poisson
        elif steady:
            how = f"renewal intervals of the rate, as they came: {ev.text()}, Poisson 1"
        else:
            how = f"each window's rate in turn, as even as they came: {ev.text()}, Poisson 1"
        estimated.append(f"arrivals: from requests finished per {self.window_s:.0f} s ({how})")
        return Traffic(
            seconds=secs,
            requests=max(0.0, done),
            rate=max(0.0, done) / secs if secs > 0 else 0.0,
            dispersion=disp,
            prompt=windowed_histogram(scrape, REQUEST_PROMPT_TOKENS),
            output=windowed_histogram(scrape, REQUEST_GENERATION_TOKENS),
            computed=windowed_histogram(scrape, REQUEST_PREFILL_COMPUTED),
            prefix_share=view.prefix_cache_hit_rate,
            estimated=tuple(estimated),
            rates=tuple(c / self.window_s for c in counts),
            window_s=self.window_s,
            swing=swing,
            evenness=ev,
        )

    def server(self) -> ServerConfig:
        """What the twin is told of the server: reported, seen, from the prior, or assumed."""
        p = self.prior.server if self.prior is not None else None
        sources: dict[str, str] = {}
        if self.told_seats is not None:
            seats, sources["max_num_seqs"] = self.told_seats, "told"
        elif self.seats is not None:
            seats, sources["max_num_seqs"] = self.seats, "inferred"
        elif p is not None:
            seats, sources["max_num_seqs"] = p.max_num_seqs, "twin"
        else:
            seats, sources["max_num_seqs"] = DEFAULT_SEATS, "assumed"
        blocks = (self.kv_tokens // self.block_size) if self.kv_tokens else (p.num_gpu_blocks if p else 0)
        sources["num_gpu_blocks"] = "reported" if self.kv_tokens else "twin"
        return ServerConfig(
            model=self.model or (p.model if p else "model"),
            max_model_len=self.max_model_len or (p.max_model_len if p else 32_768),
            block_size=self.block_size,
            num_gpu_blocks=max(1, blocks),
            enable_prefix_caching=self.prefix_caching if self.prefix_caching is not None else True,
            gpu_memory_utilization=None,
            max_num_seqs=seats,
            max_num_batched_tokens=p.max_num_batched_tokens if p else DEFAULT_BATCHED_TOKENS,
            enable_chunked_prefill=True,
            sources=sources,
            engine_version=self.engine_version,
        )

    def estimate(
        self, seed: int = 0, draws: int = 4, replay_s: float = REPLAY_S, last: Headroom | None = None
    ) -> Headroom:
        """The headroom for the recent traffic (seconds of CPU: run it off the UI thread); ``last``:
        the estimate before it (:meth:`LearnerState.estimate`)."""
        return self.snapshot().estimate(seed, draws, replay_s, last)

    def snapshot(self) -> LearnerState:
        """What an estimate needs, copied (cheap: the monitor's scrape thread may go on feeding
        the learner while the estimate runs in another)."""
        now = self._now
        return LearnerState(
            tuple(self.limits),
            tuple(self.windows),
            self.traffic(),
            self.server(),
            self.prior,
            self.kv_tokens is not None,
            self.kv_bytes_per_token,
            self.kv_bad,
            tuple(self.refused),
            self.one.mixed(now),
            self.one.restarted(now),
            self._queue.odd if self.told_seats is None else None,
            max(self._most) or None,  # none seen: no seats to replay at
            self._relearned(now),
            self.ledger.summary(now),
        )

    def _relearned(self, now: float) -> str | None:
        """What to say of a re-learning within the traffic's span (:meth:`graded`), or None."""
        if self.relearning is None or now - self.relearning[0] >= self.traffic_s:
            return None
        since, what = self.relearning
        return (
            f"re-learning since {max(0.0, now - since) / 60:.0f} min ago, the server no longer the one its "
            f"windows showed ({what}): the windows before forgotten"
        )


@dataclass(frozen=True)
class LearnerState:
    """A learner's windows, traffic and server as they were: an estimate's inputs."""

    limits: tuple[Limit, ...]
    windows: tuple[PassiveWindow, ...]
    traffic: Traffic | None
    server: ServerConfig
    prior: Twin | None
    kv_reported: bool
    kv_bytes_per_token: float | None = None
    kv_bad: str | None = None
    refused: tuple[str | None, ...] = ()
    """The recent windows' reasons for being refused (None: taken)."""
    not_one: str | None = None
    """Why the scrapes are not one server's (issue 76), or None."""
    restarted: str | None = None
    """What to say of a restart within the traffic's span, or None."""
    queue_odd: str | None = None
    """Why a queue seen was not taken as the seats, or None."""
    running_most: float | None = None
    """The most requests seen in the server at once over the traffic's span (running and waiting)."""
    relearned: str | None = None
    """What to say of the fit learning again since its predictions missed (the ledger's drift)."""
    ledger: LedgerSummary | None = None

    def estimate(
        self, seed: int = 0, draws: int = 4, replay_s: float = REPLAY_S, last: Headroom | None = None
    ) -> Headroom:
        """The headroom. ``last``: this server's estimate before it (the monitor's refresh): where
        that one was beyond the fastest speed a headroom replays, the search starts there, and one
        replay that meets the SLA again says so (issue 73: the demo's refresh 0.9 s of CPU where
        its first search, x1 to x10, takes 2.2; one that breaks goes down from there as any
        search does)."""
        sla = tuple(str(lim) for lim in self.limits)
        traffic = self.traffic
        fit = fit_of(self.windows, self.prior, self.kv_bytes_per_token, seed)
        n = fit.windows

        def none(reason: str) -> Headroom:
            return Headroom(None, (None, None), None, None, False, reason, n, traffic, fit, sla)

        if not self.limits:
            return none("no SLA to hold: give --sla")
        if self.not_one is not None:
            return none(self.not_one)
        if self.kv_bad is not None:
            return none(f"the server's KV cache cannot be taken as reported: {self.kv_bad}")
        if not self.kv_reported and self.prior is None:
            return none("the server does not report its KV cache's size (vllm:cache_config_info)")
        if self.server.block_size not in BLOCK_SIZES:
            sizes = ", ".join(map(str, BLOCK_SIZES))
            return none(f"its KV blocks of {self.server.block_size} tokens are not one the twin models ({sizes})")
        bad = [why for why in self.refused if why is not None]
        if len(bad) * 2 > len(self.refused):  # most windows impossible: its counters are not a server's
            return none(
                f"{len(bad)} of its last {len(self.refused)} windows refused, their counters no server's: {bad[-1]}"
            )
        if not fit.identified:
            said = self.restarted or self.relearned
            first = f"{said}: " if said else ""
            return none(first + fit.reason + (f"; {len(bad)} windows refused: {bad[-1]}" if bad else ""))
        if traffic is None or traffic.requests < MIN_REQUESTS or traffic.rate <= 0:
            got = 0 if traffic is None else round(traffic.requests)
            return none(f"too little traffic to replay: {got} requests in the window (needs {MIN_REQUESTS})")
        last_default, last_seen = last.parts if last is not None and len(last.parts) == 2 else (last, None)
        args = (traffic, self.limits, seed, draws, self.prior, replay_s)
        h = headroom_of(fit, self.server, *args, *_refresh(last_default))
        seen = self.running_most
        if h.seats_peak is not None and seen is not None and h.seats_peak > SEATS_MARGIN * seen + 1:
            # the replay ran more at once than the server was ever seen to: its seats may bind
            # sooner than the default's; replayed with the most seen too, the interval holds both
            low = max(1, math.ceil(seen))
            at_seen = replace(self.server, max_num_seqs=low, sources={**self.server.sources, "max_num_seqs": "seen"})
            h_seen = headroom_of(fit, at_seen, *args, *_refresh(last_seen))
            h = replace(seats_range(h, h_seen, low, self.server.max_num_seqs), parts=(h, h_seen))
        if self.queue_odd and h.assumed:
            h = replace(h, assumed=(*h.assumed, self.queue_odd))
        if self.relearned and h.identified:
            h = replace(h, reason=f"{h.reason}; {self.relearned}")
        return widened_by_ledger(h, self.ledger)


def _refresh(last: Headroom | None) -> tuple[float, tuple[float, ...]]:
    """A search's start and first speeds after ``last`` (one search's estimate, or None)."""
    return (MAX_SPEED if last is not None and last.beyond_top else 1.0), refresh_speeds(last)


def refresh_speeds(last: Headroom | None) -> tuple[float, ...]:
    """Where to start the search again from ``last``, the estimate before (the monitor's refresh,
    a few minutes on): where that was one search's crossing (not a span of two searches' with the
    seats unseen: each of those starts from its own part), the ends of its interval and its point,
    which a traffic that has not moved much brackets again at once; else none (the search from
    x1, or from beyond x10)."""
    if last is None or not last.identified or last.estimate is None or last.parts or last.beyond_top:
        return ()
    lo, hi = last.ci95
    if lo is None or hi is None:
        return ()
    speeds = sorted({round(v, 2) for v in (lo, last.estimate, hi) if MIN_SPEED <= v <= MAX_SPEED})
    return tuple(speeds)


def widened_by_ledger(h: Headroom, ledger: LedgerSummary | None) -> Headroom:
    """``h``'s interval widened by the twin's median error over the ledger's windows, where its
    predictions held fewer than :data:`LEDGER_HELD` of at least :data:`LEDGER_MIN` windows: the
    replays' interval holds the twin's sampling, not a twin that is wrong, and the ledger
    measured how wrong it has been."""
    if ledger is None or h.estimate is None or ledger.median_error is None or ledger.windows < LEDGER_MIN:
        return h
    if ledger.held >= LEDGER_HELD * ledger.windows:
        return h
    k = 1.0 + ledger.median_error
    lo, hi = h.ci95
    ci95 = (None if lo is None else lo / k, None if hi is None else hi * k)
    why = (
        f"; the interval widened by the twin's median error over its last {ledger.windows} windows "
        f"({ledger.median_error * 100:.0f} %: its predictions held {ledger.held} of them)"
    )
    return replace(h, ci95=ci95, reason=h.reason + why)


def headroom_of(
    fit: PassiveFit,
    server: ServerConfig,
    traffic: Traffic,
    limits: Sequence[Limit],
    seed: int = 0,
    draws: int = 4,
    prior: Twin | None = None,
    replay_s: float = REPLAY_S,
    start: float = 1.0,
    first: tuple[float, ...] = (),
) -> Headroom:
    """The traffic replayed on the fitted twin at speed multiples (the knee search of ``spoc twin
    predict --trace --speed auto``, from ``start``, or ``first`` those speeds in turn: a refresh,
    :data:`REFRESH_STEPS`), on the fit and ``draws`` of its bootstrap draws."""
    from spoc_tui.twin.predict import WIDENED, Prediction, holding, predict
    from spoc_tui.workload import load_workload

    sla = tuple(str(lim) for lim in limits)
    trace = TrafficRows.of(traffic, seed, server, replay_s)
    if len(trace.rows) < 2:
        return Headroom(None, (None, None), None, None, False, "too little traffic to replay", fit.windows, traffic,
                        fit, sla)  # fmt: skip
    big, drawn = beyond_the_cache(trace.at(1.0), server)
    if big > TOO_BIG_SHARE * drawn:
        why = (
            f"{big} of the {drawn} requests drawn from its traffic are longer than its whole KV cache as "
            f"reported ({server.num_gpu_blocks * server.block_size:,} tokens): no replay can run them"
        )
        return Headroom(None, (None, None), None, None, False, why, fit.windows, traffic, fit, sla)
    p = Prediction(
        twin=passive_twin(fit, server, prior, draws),
        workload=load_workload("chatbot"),
        plan=SpeedSearch(max_speed=MAX_SPEED, start=start, first=first, settled=REFRESH_STEPS),
        limits=tuple(limits),
        seed=seed,
        draws=draws,
        trace=trace,
        budget_s=SEARCH_STEPS * replay_s * 1.25,
        draws_near_knee=DRAWS_NEAR_KNEE,
    )
    predicted = predict(p)
    knee = predicted.knee
    inf = knee.inferred
    binds = BINDS.get(knee.why.cause) if knee.why is not None else None
    if inf is None or inf.estimate is None:
        return Headroom(None, (None, None), None, binds, False, "the replay found no knee", fit.windows, traffic,
                        fit, sla)  # fmt: skip
    # every assumption the number rests on is said with it (the seats show only once a queue forms)
    assumed: tuple[str, ...] = ()
    peak = None
    if server.sources.get("max_num_seqs") == "assumed":
        assumed = (seats_assumed(server.max_num_seqs, predicted.runs, inf.estimate),)
        peak = replay_peak(predicted.runs, inf.estimate)
    if inf.boundary == "bound":
        lo = inf.ci95[0]
        what = f"beyond x{_x(lo)}" if lo is not None else "beyond the speeds replayed"
        return Headroom(inf.estimate, inf.ci95, None, None, True, f"every speed replayed met the SLA: {what}",
                        fit.windows, traffic, fit, sla, assumed=assumed, seats_peak=peak,
                        beyond_top=inf.estimate >= MAX_SPEED)  # fmt: skip
    why = fit.reason + (f"; the server moved from its twin: {'; '.join(fit.drift)}" if fit.drift else "")
    if big:
        why += f"; {big} of {drawn} requests drawn longer than the whole KV cache were left out"
    if WIDENED in predicted.notes:
        why += f"; {WIDENED}"
    point, replays = replays_median(inf.estimate, predicted.draw_knees)
    if replays > 1:
        why += f"; the median of {replays} replays' knees (the fit's and its draws', each a sample of the traffic)"
    ci95, scatter = with_scatter(point, holding(point, inf.ci95), fit.residual_pct)
    if scatter:
        why += f"; the interval holds the windows' own scatter about the model (+-{scatter:.0f} % a step)"
    return Headroom(point, ci95, inf.binding_limit, binds, True, why, fit.windows, traffic, fit, sla,
                    assumed=assumed, seats_peak=peak)  # fmt: skip
