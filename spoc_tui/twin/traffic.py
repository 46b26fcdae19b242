"""The traffic a server served, as its counters and histograms give it: what a headroom replays
and what its ledger grades (:mod:`spoc_tui.twin.headroom`, :mod:`spoc_tui.twin.ledger`)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from spoc_tui.core.metrics.stats import Histogram
from spoc_tui.core.traces.read import TraceRow
from spoc_tui.twin.arrivals import Evenness, gamma_times, poisson_windows, renewal_times
from spoc_tui.twin.lengths import Lengths
from spoc_tui.twin.model import ServerConfig
from spoc_tui.twin.predict import TraceRows

WINDOW_S = 30.0
"""A passive window's length (the fit's rows)."""
REPLAY_S = 120.0
"""Seconds of the traffic a replay at x1 runs (at speed s, s times as many requests)."""


@dataclass(frozen=True, slots=True)
class Traffic:
    """The last minutes of a server's traffic, as its counters and histograms give them."""

    seconds: float
    requests: float
    rate: float
    """Requests finished per second."""
    dispersion: float | None
    """How bursty the arrivals are: the Allan factor of the requests finished per window (1 is a
    Poisson stream, above it bursty); None with fewer than 4 windows."""
    prompt: Histogram | None
    output: Histogram | None
    prefix_share: float | None
    """The share of prompt tokens the prefix cache served."""
    estimated: tuple[str, ...] = ()
    """What is estimated rather than counted, in words."""
    computed: Histogram | None = None
    """Each prompt's tokens the engine computed, its prefix-cache hits left out (vLLM 0.13+'s
    ``request_prefill_kv_computed_tokens``); None where the server does not report it."""
    rates: tuple[float, ...] = ()
    """Requests finished per second in each window, oldest first (how the rate moved)."""
    window_s: float = WINDOW_S

    swing: float | None = None
    """How much the rate moved over the windows: the index of dispersion of the requests finished
    per window (their variance over their mean: 1 for a steady Poisson stream; a swell over
    minutes raises it, where the Allan factor, which compares neighbouring windows, hardly moves)."""
    evenness: Evenness | None = None
    """How even the arrivals came over 5-20 s (the requests finished plus the change in those
    inside, bin by bin: :mod:`spoc_tui.twin.arrivals`); None where too few or too thin."""

    def regularity(self) -> float:
        """The squared coefficient of variation of a swelling traffic's replayed intervals: the
        arrivals' evenness where it reads surely evener than Poisson, else 1 (Poisson)."""
        return self.evenness.cv2() if self.evenness is not None else 1.0

    def steady_cv2(self) -> float:
        """The squared coefficient of variation of a steady traffic's replayed intervals: its
        arrivals' evenness where it reads surely other than Poisson's either way, 1 where it does
        not, and where it could not be read the dispersion of the requests finished per window.
        That dispersion alone, over the 19 pairs of ten minutes' windows, is sure only to about
        +-40 %: on the simulator flat Poisson traffic read 0.69-0.86, was replayed that even, and
        the headroom read 11 % above the knee of the very traffic replayed."""
        if self.evenness is not None:
            return self.evenness.cv2(steady=True)
        return min(25.0, max(0.05, self.dispersion if self.dispersion is not None else 1.0))

    def profile(self) -> tuple[float, ...] | None:
        """The rate window by window, oldest first, where it moved more than a steady stream's
        counts would (:func:`swells`); None where it did not (its mean rate is the traffic), or
        with too few windows.

        The knee of a traffic that swells is where its busy minutes break the SLA, alongside its
        quiet ones, as the server's whole window of requests judged it: replaying the mean rate
        with the swings drawn as burstiness judged another load (on the simulated L40S, "beyond
        x10" of a knee at x4.9), and replaying the busiest two minutes alone judged only the peak
        (24-30 % low)."""
        if len(self.rates) < 4 or not swells(self.swing, len(self.rates)):
            return None
        return self.rates

    def as_dict(self) -> dict[str, object]:
        profile = self.profile()
        return {
            "seconds": round(self.seconds, 1),
            "requests": round(self.requests),
            "rate": round(self.rate, 4),
            "rate_peak": None if profile is None else round(max(profile), 4),
            "swing": None if self.swing is None else round(self.swing, 3),
            "dispersion": None if self.dispersion is None else round(self.dispersion, 3),
            "arrivals_evenness": None if self.evenness is None else round(self.evenness.factor, 3),
            "prompt_tokens_mean": _mean(self.prompt),
            "output_tokens_mean": _mean(self.output),
            "computed_prompt_tokens_mean": _mean(self.computed),
            "prefix_share": None if self.prefix_share is None else round(self.prefix_share, 4),
            "estimated": list(self.estimated),
        }


def swells(swing: float | None, windows: int) -> bool:
    """Whether the requests per window moved more than a steady Poisson stream's would: their index
    of dispersion above 1 by more than twice its spread for that stream (about sqrt(2 / (windows -
    1)))."""
    if swing is None or windows < 4:
        return False
    return swing > 1.0 + 2.0 * math.sqrt(2.0 / (windows - 1))


def _mean(h: Histogram | None) -> float | None:
    m = h.mean() if h is not None else None
    return None if m is None else round(m, 1)


def synth_rows(
    traffic: Traffic,
    span_s: float,
    seed: int,
    block_tokens: int = 16,
    as_it_moved: bool = False,
    cv2: float | None = None,
    *,
    name_own: bool = True,
) -> tuple[TraceRow, ...]:
    """``span_s`` seconds of the traffic again, as trace rows: arrivals a renewal process of the
    traffic's rate and burstiness (:meth:`Traffic.steady_cv2`), lengths drawn from the histograms
    at stratified quantiles (:func:`strata`), and a leading prefix every request shares (one
    system prompt), served by the prefix cache after the first.

    The cached prefix: where the server reports what each prompt computed (``computed``), a
    prompt's length and its computed part are drawn from their own histograms (the longer is the
    prompt) and the rest is the shared prefix: a follow-up turn's long context but short new text
    keep their shape. Else every prompt has the prefix-cache share of its length cached.

    ``as_it_moved``: where the traffic swells (:meth:`Traffic.profile`), its windows one after the
    other at their rates, stretched over ``span_s`` (a replay at speed s asks for s times the span:
    the same windows, each at s times its rate once the replay divides its times by s), the
    arrivals as even as ``cv2`` says (the squared coefficient of variation of their intervals, 1:
    Poisson; None: as the traffic's own, :meth:`Traffic.regularity`).

    ``name_own``: each row names its own blocks too (ids no other row has: a trace file a ramp
    replays); without, only the shared ones (the twin's replays: the rest of a prompt is its own
    either way, and rows that name one chain are laid out at once,
    :func:`~spoc_tui.twin.rowprompts.block_layout`)."""
    rng = random.Random(seed)
    share = min(0.95, max(0.0, traffic.prefix_share or 0.0))
    prompt = Lengths.of(traffic.prompt) if traffic.prompt is not None else None
    output = Lengths.of(traffic.output) if traffic.output is not None else None
    computed = Lengths.of(traffic.computed) if traffic.computed is not None else None
    rows: list[TraceRow] = []
    times = list(_arrivals(traffic, span_s, as_it_moved, rng, traffic.regularity() if cv2 is None else cv2))
    asked, answered = strata(len(times), rng), strata(len(times), rng)
    ins = prompt.at_many(asked) if prompt is not None else [512] * len(times)
    outs = output.at_many(answered) if output is not None else [128] * len(times)
    # the computed part in step with the prompt (one quantile): drawn apart, the shorter prompt cut
    # the computed part's tail (on the A100 its p99 2,311 to 1,482)
    news = computed.at_many(asked) if computed is not None else None
    for i, t in enumerate(times):
        n_in, n_out = ins[i], outs[i]
        if news is not None:
            new = min(n_in, news[i])
            shared = (n_in - new) // block_tokens
        else:
            shared = int(share * n_in) // block_tokens
        if name_own:
            ids = prefix_ids(i, n_in, shared, block_tokens)
        else:
            ids = _CHAIN[:shared] if shared <= len(_CHAIN) else tuple(range(shared))
        rows.append(TraceRow(i, t, n_in, n_out, ids, block_tokens, line=i + 1))
    return tuple(rows)


_CHAIN = tuple(range(4096))
"""The shared blocks' ids (:func:`synth_rows`)."""


def prefix_ids(i: int, n_in: int, shared: int, block_tokens: int) -> tuple[int, ...]:
    """Row ``i``'s prefix blocks for a prompt of ``n_in`` tokens: ``shared`` leading blocks every
    row has (ids 0, 1, ...: the prefix cache serves them after the first), then blocks of its own
    (ids from 1,000,000 + 10,000 i, no other row's)."""
    own = max(0, math.ceil(n_in / block_tokens) - shared)
    return (*range(shared), *range(1_000_000 + 10_000 * i, 1_000_000 + 10_000 * i + own))


def strata(n: int, rng: random.Random) -> list[float]:
    """``n`` quantiles (0-1), one inside each of ``n`` equal strata, in a random order: lengths
    drawn at them hold every part of their histogram in its share. Drawn independently, the count
    of a replay's long prompts was left to chance, and the p99 gap comes from them: on the
    simulated L40S 4 % of prompts computed more than 1,300 tokens, about 22 in a two-minute replay
    at x3.3, give or take 5, and the replay's p99 gap moved with them."""
    order = list(range(n))
    rng.shuffle(order)
    return [(k + rng.random()) / n for k in order]


def _arrivals(traffic: Traffic, span_s: float, as_it_moved: bool, rng: random.Random, cv2: float) -> Iterator[float]:
    """Arrival times over ``span_s``: a traffic that swells, its windows stretched over the span at
    their rates, Poisson within each, or where ``cv2`` is not 1 a renewal process that even across
    them; else a renewal process of the traffic's rate (:meth:`Traffic.steady_cv2`)."""
    profile = traffic.profile() if as_it_moved else None
    if profile is None:
        return gamma_times(traffic.rate, span_s, traffic.steady_cv2(), rng)
    return renewal_times(profile, span_s, cv2, rng) if cv2 != 1.0 else poisson_windows(profile, span_s, rng)


@dataclass(frozen=True)
class TrafficRows(TraceRows):
    """The traffic as a trace a replay at any speed finds long enough: at speed s, ``REPLAY_S``
    seconds of it at s times its rate (a file's rows would last span / s, too short to build a
    queue at the speeds a headroom asks of)."""

    traffic: Traffic | None = None
    seed: int = 0
    block_tokens: int = 16
    max_model_len: int = 1 << 30
    replay_s: float = REPLAY_S
    cv2: float = 1.0
    """How even this replay's arrivals are (:meth:`Traffic.regularity`; a draw's, drawn)."""
    _cache: dict[float, tuple[TraceRow, ...]] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, traffic: Traffic, seed: int, server: ServerConfig, replay_s: float = REPLAY_S) -> TrafficRows:
        cv2 = traffic.regularity()
        rows = _fitting(synth_rows(traffic, replay_s, seed, server.block_size, True, cv2, name_own=False),
                        server.max_model_len)  # fmt: skip
        return cls(rows, len(rows), {}, replay_s, traffic.prefix_share, traffic=traffic, seed=seed,
                   block_tokens=server.block_size, max_model_len=server.max_model_len, replay_s=replay_s,
                   cv2=cv2)  # fmt: skip

    def step_s(self, speed: float) -> float:
        return self.replay_s

    def redrawn(self, seed: int) -> TrafficRows:
        """The traffic drawn again with ``seed``: a draw of the fit replays a sample of its own, so
        that the knee's interval holds the replay's own sampling. With one sample for all, the
        draws differed only in the fit's terms: on the simulated L40S x3.3 (95 %: 3.2-3.9) of a
        knee at x4.81, where that sample replayed on the simulator's own step time read ITL p99
        124 ms at x4 and the server 89; with a sample a draw, x3.3 (95 %: 2-4.9). Where the
        arrivals came evener than Poisson, as even as a value drawn from what the counts leave
        open (:attr:`spoc_tui.twin.arrivals.Evenness.spread`)."""
        if self.traffic is None:
            return self
        ev = self.traffic.evenness
        cv2 = ev.cv2(random.Random(seed)) if ev is not None else self.cv2
        return replace(self, seed=seed, cv2=cv2, _cache={})

    def at(self, speed: float) -> tuple[TraceRow, ...]:
        if self.traffic is None:
            return self.rows
        hit = self._cache.get(speed)
        if hit is None:
            rows = synth_rows(
                self.traffic, self.replay_s * speed, self.seed, self.block_tokens, True, self.cv2, name_own=False
            )
            hit = _fitting(rows, self.max_model_len)
            self._cache[speed] = hit
        return hit


def _fitting(rows: tuple[TraceRow, ...], max_model_len: int) -> tuple[TraceRow, ...]:
    return tuple(r for r in rows if r.input_tokens + r.output_tokens <= max_model_len)
