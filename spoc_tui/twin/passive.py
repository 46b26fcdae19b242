"""The twin's step time learned passively, from the scrapes a monitor makes anyway (issue 52).

A calibration (:mod:`spoc_tui.twin.calibrate`) times chosen probes on an idle server. A server in
production cannot be probed, but its counters, differenced over a window, give the means of what
its engine did in that window:

- steps: ``vllm:iteration_tokens_total``'s count (one per engine step);
- the mean step a decoding sequence waited: the inter-token latency's mean (its histogram's sum
  over its count), the response;
- decoding sequences per step: generated tokens over steps (each decode makes one token a step),
  less each request's first token (its prefill made it): the share of inter-token gaps among
  the window's inter-token gaps and first tokens;
- new prompt tokens per step: prompt tokens (vLLM counts the whole prompt, cache hits included)
  less those the prefix cache served, over steps;
- decode context per step: the KV cache in use (``kv_cache_usage_perc`` of the blocks the
  server reports) in k-tokens;
- the share of steps carrying a prefill chunk: requests started over steps (at most 1).

The twin's step model is linear in these (:mod:`spoc_tui.twin.model`), so a window is one row of
a least-squares fit of its fixed cost ``b0``, per-sequence ``b_decode``, per-context-token
``b_context``, per-prefill-token ``b_prefill`` and mixed-step ``b_mixed`` terms, weighted by how
many inter-token gaps the window holds.

The inter-token gaps say little of the prefill terms: at a few requests a second a prefill rides
in one step of dozens, and the mean gap barely moves with its cost (on a simulated L40S at two
requests a second the fit put ``b_prefill`` at half its value in one seed of five, and the
headroom read twice the knee). Where the server reports the time its requests spent in prefill
(``vllm:request_prefill_time_seconds``: from first scheduled to the first token, one step for a
prompt that fits one chunk) and the prompt tokens each computed
(``vllm:request_prefill_kv_computed_tokens``), a window gives a second row: the mean prefill time
against the same step model with the request's new prompt tokens and a mixed step, weighted by
how many prefills it holds. Each kind of row has its own noise, estimated from the first fit's
residuals.

A GPU's step reads every weight once whatever it computes, so it computes its first prompt tokens
inside that time: the twin's ``ridge`` (:mod:`spoc_tui.twin.model`), past which each prompt token
costs ``b_prefill``. Means cannot show the bend (a linear fit puts the same mean on a cheaper
token from the first), yet the p99 gap the SLA holds comes from the big prefills past it: on the
simulated L40S the linear fit timed 3,000-token prefill steps at half their time and read the
headroom 40-90 % high. The roofline ties the two: at the ridge the compute takes as long as the
read, ``ridge = b0 / b_prefill`` (about 130 tokens for an 8B model on an A100). Where the server
reports the prompt tokens each request computed as a histogram, the fit takes the ridge at that
fixed point (each window's prefill columns then count only the tokens past it, from the
histogram, each bucket spread as the replay draws it: :mod:`spoc_tui.twin.lengths`); a
calibrated twin's ridge where one is given; else none. (A CPU has no ridge: there the
calibrated twin's 0 holds.)

Windows that differ (more users at one hour than at another) identify the terms; windows that
all look alike identify only their common value, and the fit says so instead of extrapolating.
The fit's uncertainty is a bootstrap over windows. A calibrated twin, when given, is the prior
(each term pulled towards it by its calibration's spread): the live fit tightens it, and says
which term the server has drifted from. Each draw also draws the prior from that spread (a
perturbed prior): drawn over the windows alone, a term the windows barely see stayed at the
prior's value in every draw, and the interval said the calibration was exact (on the real CPU
server x4.7 to x5.1 around a knee at x5.4).

What passive windows cannot identify: attention cost inside a prefill (``b_attn``), the shared
prefix saving (``b_shared``), the roofline's ridge and the time outside the engine (``a0``,
``a_prompt``): those come from the prior, or stay 0 and are named.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from spoc_tui.core.metrics.promparse import Exposition
from spoc_tui.core.metrics.stats import Histogram
from spoc_tui.core.metrics.vllm import EngineView, kv_reading
from spoc_tui.twin.lengths import Lengths
from spoc_tui.twin.model import PARAMS, ServerConfig, StepModel, Twin

TERMS = ("b0", "b_decode", "b_context", "b_prefill", "b_mixed")
"""The step terms windows of counters identify, in the fit's column order."""
NOT_PASSIVE = ("b_attn", "b_shared", "ridge", "a0", "a_prompt")
"""What passive windows cannot identify: from the prior, or 0."""
MIN_WINDOWS = 7
"""Fewer windows than this with decoding in them: too thin to say anything. A floor under the
identification (:func:`identified`: the step at the stretch point known within its spread), which
decides: seven of 30 s, so that the monitor's first number comes within four minutes of its start
(issue 73: with eight, the eighth window closed at 240 s and the number came at 4:21). The demo's
live scrapes read x4.8 (95 %: 4-6) from seven windows, x4.9 (95 %: 4-5.9) from eight."""
MIN_ITL_GAPS = 50
"""A window with fewer inter-token gaps than this is left out (its mean is noise)."""
MIN_PREFILLS = 3
"""A window's prefill row needs this many requests' prefill times."""
MAX_RIDGE = 1024.0
"""The most prompt tokens the roofline's fixed point may put inside a step's fixed cost."""
STRETCH = 3.0
"""How far past the busiest window a headroom looks: its batch and context times this."""
MAX_SPREAD = 0.30
"""Identified: the predicted step at the stretch point (:data:`STRETCH` times the busiest
window's batch and context) has a 95 % interval at most this wide, relative to the fit's."""
DRAWS = 200
"""Bootstrap draws over windows."""


STEP_RANGE_S = (1e-5, 60.0)
"""The mean step a window may show: 10 microseconds to a minute."""
MOST_PER_STEP = 1e9
"""The most sequences, prompt tokens or context tokens a window may show in one step."""


@dataclass(frozen=True, slots=True)
class PassiveWindow:
    """What one window's counters say the engine did, per step on average."""

    t: float
    """When the window ended (the monitor's clock)."""
    seconds: float
    step_s: float
    """The mean step a decoding sequence waited (the inter-token latency's mean), s."""
    gaps: float
    """Inter-token gaps the window holds (its weight)."""
    decodes: float
    """Decoding sequences per step."""
    context_k: float
    """Decode context per step, k-tokens (the KV cache in use)."""
    prefill: float
    """New prompt tokens per step (less those the prefix cache served)."""
    mixed: float
    """The share of steps that carry a prefill chunk (at most 1)."""
    read_bytes: float | None = None
    """Bytes a GPU read per step (vLLM 0.17+'s ``estimated_read_bytes_per_gpu_total``), where the
    server counts them."""
    prefill_s: float | None = None
    """The mean time the window's finished requests spent in prefill (first scheduled to first
    token), s, where the server reports it."""
    prefills: float = 0.0
    """How many requests' prefill times :attr:`prefill_s` averages."""
    prefill_tokens: float | None = None
    """The new prompt tokens (less the prefix cache's) a finished request computed, on average."""
    computed: Lengths | None = None
    """How those tokens spread over the window's requests, from their histogram (None where the
    server does not report them)."""

    def impossible(self) -> str | None:
        """Why no server's counters make this window (a figure infinite, a step of picoseconds,
        millions of sequences a step: a hostile or broken exporter, buckets counted 1e300 times),
        or None. Fitted, such a window broke the least squares (issue 74)."""
        figures = (self.step_s, self.gaps, self.decodes, self.context_k, self.prefill, self.mixed)
        extra = (self.read_bytes, self.prefill_s, self.prefill_tokens)
        if not all(math.isfinite(v) for v in (*figures, *(v for v in extra if v is not None))):
            return "a figure of its window is not a finite number"
        if not STEP_RANGE_S[0] <= self.step_s <= STEP_RANGE_S[1]:
            lo, hi = STEP_RANGE_S
            return f"a mean inter-token gap of {self.step_s:.3g} s (a server's lies within {lo:g}-{hi:g} s)"
        if self.decodes > MOST_PER_STEP or self.prefill > MOST_PER_STEP or self.context_k * 1000 > MOST_PER_STEP:
            return f"{max(self.decodes, self.prefill, self.context_k * 1000):.3g} sequences or tokens a step"
        return None

    def past_ridge(self, ridge: float, per_k: float = 0.0, decodes: float | None = None, context_k: float | None = None,
                   others: float = 0.0) -> float:  # fmt: skip
        """The share of a prefill's tokens past the room a step at ``ridge`` leaves (``ridge``,
        moved by ``per_k`` tokens a k-token of the window's decode context, less its decodes:
        :attr:`~spoc_tui.twin.model.StepModel.ridge_moves`), from the requests' histogram, each
        bucket's lengths spread as the headroom's replay draws them
        (:class:`~spoc_tui.twin.lengths.Lengths`: their mean the histogram's); 1 with no ridge or no
        histogram. ``decodes`` and ``context_k``: the step's, where not the window's mean;
        ``others``: prompt tokens of other requests in the step, ahead in the room.

        Spread log-uniform inside each bucket instead, a tail bucket's prompts lay towards its top,
        more of their tokens past the ridge than the server computed there, and the prefill term
        came out low: on the simulated L40S 0.0649 ms a token where the simulator's cost 0.0728
        (0.0696 with the replay's shape), and the headroom read its knee 25 % high."""
        room = self.room(ridge, per_k, decodes, context_k) - others
        if room <= 0 or self.computed is None:
            return 1.0
        mean = self.computed.mean()
        return self.computed.excess(room) / mean if mean > 0 else 1.0

    def room(
        self, ridge: float, per_k: float = 0.0, decodes: float | None = None, context_k: float | None = None
    ) -> float:
        """The prompt tokens a step computes inside its reads: ``ridge``, moved by ``per_k`` a
        k-token of decode context, less the decodes' own tokens (the window's means unless given)."""
        d = self.decodes if decodes is None else decodes
        c = self.context_k if context_k is None else context_k
        return max(0.0, ridge + per_k * c - d)

    def context_at(self, batch: float) -> float:
        """The decode context, k-tokens, of a step holding ``batch`` of the window's sequences."""
        return self.context_k * batch / self.decodes if self.decodes > 0 else self.context_k

    def row(self, ridge: float = 0.0, per_k: float = 0.0) -> tuple[float, ...]:
        """The fit's regressors, in :data:`TERMS` order (the prefill tokens past ``ridge``): the
        batch and context a decode's step holds (:func:`batch_seen`), as the inter-token gaps'
        mean weighs the steps; and the prefill tokens and mixed steps as that mean weighs them. It
        weighs a step by its decodes, and a prompt's prefill rides in the step it arrived at, with
        the sequences an arrival finds running (:func:`running_seen`), where the steps' mean holds
        :attr:`decodes`: a prompt that reaches an idle server stalls no gap. Counted at the steps'
        mean, the prefill and mixed columns ran 22 and 30 % over the gaps' own on the simulated
        A100 (more at the quieter windows, where more prompts find the server idle), and the fit
        took the excess from the fixed cost and gave it to each sequence: 0.091 ms where the
        simulator's is 0, the step at 44 sequences 13 % slow (weighed so, with :class:`KvGauge`'s
        context: 0.043 ms and 7 %; the headroom of seed 3's traffic 17 % low, 12 %)."""
        seen = batch_seen(self.decodes)
        found = running_seen(self.decodes) / self.decodes if self.decodes > 0 else 0.0
        prefill = self.prefill * self.past_ridge(ridge, per_k)
        return (1.0, seen, self.context_at(seen), prefill * found, self.mixed * found)

    def prefill_row(self, ridge: float = 0.0, per_k: float = 0.0) -> tuple[float, ...] | None:
        """The regressors of the window's prefill row (the step a prompt's prefill rode in: the
        decodes and context a prompt finds as it arrives, its new prompt tokens and those of the
        prompts that arrived with it, past ``ridge``, a mixed step), or None where it has none.

        The prompts beside it: a step's mean, :attr:`prefill` (arrivals do not time themselves by
        the steps). Left out, the prefill term took their tokens for the prompt's own: on the
        simulated A100's closed loop (6.5 requests a second) 17 % over the simulator's."""
        if self.prefill_s is None or self.prefill_s <= 0 or self.prefills < MIN_PREFILLS or not self.prefill_tokens:
            return None
        arrived = running_seen(self.decodes)  # the running a prompt finds as it arrives
        ctx, others = self.context_at(arrived), self.prefill
        mine = self.prefill_tokens * self.past_ridge(ridge, per_k, arrived, ctx, others)
        return (1.0, arrived, ctx, mine + max(0.0, others - self.room(ridge, per_k, arrived, ctx)), 1.0)


class KvGauge:
    """The KV cache's gauge over a window's scrapes, for the window's decode context.

    The gauge is one instant a scrape. Over the window it is read two ways: its mean weighted by
    the engine steps since the scrape before (an idle stretch weighs nothing; without a steps
    counter, every scrape alike), and the share of the cache one running request holds (the
    gauge over the requests running, summed over the scrapes that found any). The second is the
    one the fit takes where the server reports its running requests: at a few requests a second a
    scrape often finds the server idle between requests and reads 0, yet it still weighs by the
    steps before it. On the simulated A100 read every 5 s, the first put a window's decode context
    20 % under the steps' own on average (each window's off by 33 %, sd), and the context term
    came out at 0.033 ms a k-token where the simulator's is 0.076; the second, 7 % over (sd 18 %),
    0.055 (0.058 with the prefill columns weighed: :meth:`PassiveWindow.row`). Read every second,
    as ``spoc monitor`` reads: -4 % (10 %) and +6 % (7 %)."""

    def __init__(self) -> None:
        self._steps: float | None = None
        self._acc = [0.0] * 6

    def add(self, exp: Exposition) -> None:
        """One scrape."""
        kv, kv_sum, steps, running = kv_reading(exp)
        last, self._steps = self._steps, steps
        if kv is None:
            return
        w = steps - last if steps is not None and last is not None and steps >= last else 0.0
        busy = running is not None and running > 0 and kv_sum is not None
        for k, v in enumerate((kv * w, w, kv, 1.0, kv_sum if busy else 0.0, running if busy else 0.0)):
            self._acc[k] += v or 0.0

    def close(self) -> tuple[float | None, float | None]:
        """The window just closed, then a fresh one: the gauge over its steps (without steps, its
        scrapes), and the share of the cache a running request held (None where no scrape found
        one running, or the server reports no running count)."""
        kvw, w, kv, n, busy_kv, running = self._acc
        self._acc = [0.0] * 6
        mean = kvw / w if w > 0 else kv / n if n else None
        return mean, (busy_kv / running if running > 0 else None)


def running_seen(decodes: float) -> float:
    """The decoding sequences running at a moment chosen at random, from ``decodes``, their mean
    over the engine's steps: the running count Poisson (an open stream's requests in service), of
    mean ``lam``, and the engine stepping only while one runs, ``decodes = lam / (1 - exp(-lam))``
    solved for ``lam``."""
    if decodes <= 1.0:
        return 0.0
    lo, hi = 0.0, decodes
    for _ in range(60):
        lam = (lo + hi) / 2
        if lam / -math.expm1(-lam) < decodes:
            lo = lam
        else:
            hi = lam
    return (lo + hi) / 2


def batch_seen(decodes: float) -> float:
    """The batch a decode's step holds on average (what the inter-token gaps' mean weighs each
    step by): itself and the others running, ``1 + lam`` (:func:`running_seen`). The steps' mean,
    ``decodes``, is less: on the simulated A100 at 1.4-3.3 sequences the gaps' batch ran 15-47 %
    above it (the zero-truncated Poisson said within 0.1 of each window), the context with it, and
    the fit read that excess as a cost a sequence: 0.132 ms each at 1,150 tokens of context where
    the simulator's cost 0.087 (0.102 with the batch a gap sees)."""
    return 1.0 + running_seen(decodes)


def window_of(
    view: EngineView,
    seconds: float,
    t: float,
    kv_tokens: int | None,
    kv_use: float | None = None,
    prefill_time: Histogram | None = None,
    computed: Histogram | None = None,
    kv_per_running: float | None = None,
) -> PassiveWindow | None:
    """One window from a server's windowed view, or None when it cannot be one: no steps or no
    inter-token gaps in it (an idle window says nothing of the step time), too few gaps, or a
    server that does not report its steps or its KV cache's size.

    Args:
        seconds: the window's length.
        kv_tokens: the KV cache's size in tokens (``num_gpu_blocks x block_size`` of
            ``vllm:cache_config_info``).
        kv_use: the KV cache's use over the window's steps (0-1), where the caller averaged it
            over the window's scrapes; else the view's, the gauge at the window's end: one
            instant, whose noise dilutes the context term towards 0 (at a few sequences the
            gauge reads 0 whenever the scrape lands between requests).
        prefill_time: ``vllm:request_prefill_time_seconds``'s increase over the window.
        computed: ``vllm:request_prefill_kv_computed_tokens``'s increase over the window (the
            new prompt tokens of the same finished requests); without it, the prompt tokens less
            the prefix cache's share, over the requests finished.
        kv_per_running: the share of the cache a running request held over the window's scrapes
            (:class:`KvGauge`): the decode context is then that a sequence, where given.
    """
    itl = view.latency.get("itl")
    steps_rate, gen_rate = view.steps_rate, view.generation_tokens_rate
    if itl is None or itl.mean is None or not itl.count or itl.count < MIN_ITL_GAPS:
        return None
    kv = kv_use if kv_use is not None else view.kv_cache_usage
    if not steps_rate or steps_rate <= 0 or gen_rate is None or not kv_tokens or kv is None:
        return None
    # the tokens generated less each request's first (its prefill made it, not a decode step):
    # the inter-token gaps against the first tokens in the window
    ttft = view.latency.get("ttft")
    firsts = ttft.count if ttft is not None and ttft.count else 0
    decode_share = itl.count / (itl.count + firsts)
    decodes = gen_rate * decode_share / steps_rate
    hit = view.prefix_cache_hit_rate or 0.0
    new_rate = (view.prompt_tokens_rate or 0.0) * (1.0 - min(1.0, max(0.0, hit)))
    requests = view.request_rate or 0.0
    read = view.read_bytes_per_gpu_rate
    prefills = prefill_time.count if prefill_time is not None else None
    prefill_s = prefill_time.mean() if prefill_time is not None else None
    per_request = computed.mean() if computed is not None else None
    if per_request is None and requests > 0:
        per_request = new_rate / requests
    return PassiveWindow(
        t=t,
        seconds=seconds,
        step_s=itl.mean,
        gaps=itl.count,
        decodes=decodes,
        context_k=(kv if kv_per_running is None else kv_per_running * decodes) * kv_tokens / 1000.0,
        prefill=new_rate / steps_rate,
        mixed=min(1.0, requests / steps_rate),
        read_bytes=read / steps_rate if read else None,
        prefill_s=prefill_s,
        prefills=prefills or 0.0,
        prefill_tokens=per_request,
        computed=Lengths.of(computed) if computed is not None and computed.complete else None,
    )


@dataclass(frozen=True, slots=True)
class PassiveFit:
    """The step model as the windows give it, with how sure it is."""

    model: StepModel
    """The fit: :data:`TERMS` from the windows (and the prior), the rest from the prior or 0."""
    draws: tuple[StepModel, ...]
    """Bootstrap draws (windows resampled), for intervals."""
    windows: int
    batch: tuple[float, float]
    """The fewest and most decoding sequences per step over the windows."""
    identified: bool
    reason: str
    """Why not (``identified`` false), or what identified it."""
    residual_pct: float
    """The windows' median absolute residual, % of their step time."""
    drift: tuple[str, ...] = ()
    """Terms the server has moved from the prior beyond both their spreads, in words."""

    def interval(self, term: str) -> tuple[float, float]:
        """The term's 95 % interval over the draws."""
        vals = sorted(getattr(d, term) for d in self.draws)
        if not vals:
            v = getattr(self.model, term)
            return v, v
        return vals[int(0.025 * (len(vals) - 1))], vals[math.ceil(0.975 * (len(vals) - 1))]

    def step_s(self, decodes: float, context_k: float, prefill: float = 0.0, mixed: float = 0.0) -> float:
        m = self.model
        return m.b0 + m.b_decode * decodes + m.b_context * context_k + m.b_prefill * prefill + m.b_mixed * mixed


def _nonneg(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient at least 0: a term that comes out negative is held at
    0 and the rest refitted (an active set, enough for five terms)."""
    n_terms = a.shape[1]
    free = list(range(n_terms))
    out = np.zeros(n_terms)
    while free:
        coef, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        neg = [free[k] for k, c in enumerate(coef) if c < 0]
        if not neg:
            out[free] = coef
            break
        free = [j for j in free if j not in neg]
    return out


def _solve(
    x: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    prior: np.ndarray | None,
    prior_sd: np.ndarray | None,
    kind: np.ndarray | None = None,
) -> np.ndarray:
    """The posterior's mode: each row's mean has the noise of what it averages (variance
    sigma^2 / w), each kind of row (``kind``: 0 the inter-token gaps, 1 the prefill times) its own
    sigma from the residuals of the fit before (three rounds, so that a kind the first fit got
    wrong is not discounted for it), each term a normal prior where one is given (a whisper of
    ridge otherwise, so a column the windows never vary stays solvable)."""
    n, k = x.shape
    kinds = kind if kind is not None else np.zeros(n, dtype=int)
    scale = np.ones(n)
    coef = np.zeros(k)
    for _ in range(3 if (kinds != 0).any() else 1):
        sw = np.sqrt(w / scale)
        coef = _nonneg(np.vstack([x * sw[:, None], np.eye(k) * 1e-9]), np.concatenate([y * sw, np.zeros(k)]))
        resid = y - x @ coef
        for g in np.unique(kinds):
            m = kinds == g
            dof = m.sum() * (1.0 - k / n) if n > k else 0.0
            s2 = float((w[m] * resid[m] ** 2).sum()) / dof if dof > 0 else 0.0
            scale[m] = max(s2, float((0.01 * y[m].mean()) ** 2 * w[m].mean()))  # never certain beyond 1 %
    sw = np.sqrt(w / scale)
    a, b = x * sw[:, None], y * sw
    if prior is not None and prior_sd is not None:
        a = np.vstack([a, np.diag(1.0 / prior_sd)])
        b = np.concatenate([b, prior / prior_sd])
    else:
        a = np.vstack([a, np.eye(k) * 1e-9])
        b = np.concatenate([b, np.zeros(k)])
    return _nonneg(a, b)


@dataclass(frozen=True, slots=True)
class _WindowRows:
    """One window's rows of the fit at a ridge: its gap row, and its prefill row where it has one,
    each with its response and weight."""

    gap: tuple[tuple[float, ...], float, float]
    prefill: tuple[tuple[float, ...], float, float] | None

    @classmethod
    def of(cls, w: PassiveWindow, ridge: float, per_k: float) -> _WindowRows:
        pre, secs = w.prefill_row(ridge, per_k), w.prefill_s
        return cls(
            (w.row(ridge, per_k), w.step_s, min(w.gaps, 20_000.0)),
            (pre, secs, min(w.prefills, 20_000.0)) if pre is not None and secs is not None else None,
        )


def _window_rows(wins: Sequence[PassiveWindow], ridge: float = 0.0, per_k: float = 0.0) -> list[_WindowRows]:
    """Every window's rows, the prefill tokens counted past ``ridge`` (moved by ``per_k`` a
    k-token of context): worked out once for the fit and all its bootstrap draws."""
    return [_WindowRows.of(w, ridge, per_k) for w in wins]


def _rows(
    per_window: Sequence[_WindowRows], idx: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fit's rows for the windows ``idx`` (a resample repeats some): each window's gap row,
    then the prefill rows of those that have one; with their responses, weights and kinds."""
    picked = [per_window[i].gap for i in idx]
    kinds = [0] * len(picked)
    for i in idx:
        pre = per_window[i].prefill
        if pre is not None:
            picked.append(pre)
            kinds.append(1)
    return (
        np.array([r for r, _, _ in picked], dtype=float),
        np.array([y for _, y, _ in picked], dtype=float),
        np.array([w for _, _, w in picked], dtype=float),
        np.array(kinds, dtype=int),
    )


def fit_passive(
    windows: Sequence[PassiveWindow],
    prior: StepModel | None = None,
    prior_sd: StepModel | None = None,
    seed: int = 0,
    draws: int = DRAWS,
    kv_bytes_per_token: float | None = None,
) -> PassiveFit:
    """The step model the windows identify, with its bootstrap spread; ``prior`` (a calibrated
    twin's fit, with its spread ``prior_sd``) pulls each term towards it.

    Without a calibrated twin, where the server says how many bytes a token's KV takes on a GPU
    (``kv_bytes_per_token``) and how many bytes its steps read (:attr:`PassiveWindow.read_bytes`),
    the context term has a physical prior (:func:`context_prior`): at the rates a production server
    runs, the decode context moves a few k-tokens, a few tenths of a millisecond a step, too little
    for the windows to see, and the fit held it at 0 (every draw too) and read a headroom 41 % high.

    Never a bare number where the windows cannot say: ``identified`` is false, with the reason
    and what would settle it, when there are too few windows or they do not vary enough.
    """
    base = prior if prior is not None else StepModel(0, 0, 0, 0, 0, 0, 0, 0)
    wins = [w for w in windows if w.gaps >= MIN_ITL_GAPS and w.step_s > 0]
    if not wins:
        why = f"too little traffic yet: no window with decoding in it (needs {MIN_WINDOWS})"
        return PassiveFit(base, (), 0, (0.0, 0.0), False, why, math.nan)
    batch = (min(w.decodes for w in wins), max(w.decodes for w in wins))
    n = len(wins)
    p = np.array([getattr(base, t) for t in TERMS], dtype=float) if prior is not None else None
    psd = None
    physical = context_prior(wins, kv_bytes_per_token) if prior is None else None
    if prior is not None:
        sd = prior_sd if prior_sd is not None else replace(prior)
        psd = np.array([max(abs(getattr(sd, t)), 0.05 * abs(getattr(prior, t)), 1e-7) for t in TERMS], dtype=float)
    elif physical is not None:  # the context term alone; the others free (a prior of no weight)
        k = TERMS.index("b_context")
        p, psd = np.zeros(len(TERMS)), np.full(len(TERMS), 1e6)
        p[k], psd[k] = physical
    per_k = 0.0
    if prior is None and any(w.computed is not None for w in wins):
        ridge, per_k, coef = _roofline(wins, p, psd)
    else:
        ridge = prior.ridge if prior is not None else 0.0
        coef = _fit_at(wins, ridge, p, psd)
    moves = ridge > 0 and per_k > 0
    per_window = _window_rows(wins, ridge, per_k)
    xa, ya, _, ka = _rows(per_window, range(n))
    x, y = xa[:n], ya[:n]  # the gap rows (the prefill rows follow them)
    rng = random.Random(seed)
    drawn: list[np.ndarray] = []
    for _ in range(draws if n >= 3 else 0):
        idx = [rng.randrange(n) for _ in range(n)]
        pk = p
        if physical is not None and p is not None:  # the prior's own spread in the draws (perturbed prior)
            pk = p.copy()
            pk[TERMS.index("b_context")] = max(0.0, rng.gauss(*physical))
        elif p is not None and psd is not None:  # a calibrated twin's: each term drawn from its spread
            pk = np.maximum(0.0, p + psd * np.array([rng.gauss(0.0, 1.0) for _ in TERMS]))
        xs, ys, ws, ks = _rows(per_window, idx)
        drawn.append(_solve(xs, ys, ws, pk, psd, ks))
    model = replace(base, ridge=ridge, ridge_moves=moves, **{t: float(c) for t, c in zip(TERMS, coef, strict=True)})
    models = tuple(
        replace(base, ridge=ridge, ridge_moves=moves, **{t: float(c) for t, c in zip(TERMS, d, strict=True)})
        for d in drawn
    )
    resid = np.abs(x @ coef - y) / y
    residual_pct = float(np.median(resid) * 100)
    how = "the windows and the calibrated twin" if prior is not None else "the windows"
    if physical is not None:
        how = f"the windows and the KV cache's read cost ({physical[0] * 1000:.3g} ms a k-token of context)"
    if (ka == 1).any():
        how = how.replace("the windows", "the windows (their gaps and prefill times)", 1)
    if ridge > 0 and prior is None:
        how += f", a GPU's roofline ({ridge:.0f} prompt tokens inside a step's fixed cost)"
    identified, reason = _identified(wins, x, coef, drawn, batch, how, prior is not None)
    fit = PassiveFit(model, models, n, batch, identified, reason, residual_pct)
    if prior is not None and prior_sd is not None and models:
        fit = replace(fit, drift=_drift(fit, prior, prior_sd))
    return fit


def _fit_at(
    wins: Sequence[PassiveWindow], ridge: float, p: np.ndarray | None, psd: np.ndarray | None, per_k: float = 0.0
) -> np.ndarray:
    """The fit of every window's rows, the prefill tokens counted past ``ridge`` (moved by
    ``per_k`` a k-token of context)."""
    xa, ya, wa, ka = _rows(_window_rows(wins, ridge, per_k), range(len(wins)))
    return _solve(xa, ya, wa, p, psd, ka)


def _roofline(
    wins: Sequence[PassiveWindow], p: np.ndarray | None, psd: np.ndarray | None
) -> tuple[float, float, np.ndarray]:
    """The ridge at the roofline's fixed point, ``ridge = b0 / b_prefill`` (the prompt tokens a
    step computes while it reads the weights), how far the decode context's read moves it,
    ``per_k = b_context / b_prefill`` tokens a k-token (:attr:`StepModel.ridge_moves`), and the
    fit at them: from no ridge, refitted until both move less than 2 % (at most eight rounds;
    none without a prefill cost)."""
    ridge = per_k = 0.0
    coef = _fit_at(wins, ridge, p, psd)
    b0, bp, bc = TERMS.index("b0"), TERMS.index("b_prefill"), TERMS.index("b_context")
    for _ in range(8):
        if coef[bp] <= 0:
            break
        nxt = min(MAX_RIDGE, float(coef[b0] / coef[bp]))
        nxt_k = min(MAX_RIDGE, float(coef[bc] / coef[bp]))
        if abs(nxt - ridge) <= 0.02 * max(nxt, 1.0) and abs(nxt_k - per_k) <= 0.02 * max(nxt_k, 1.0):
            break
        ridge, per_k = nxt, nxt_k
        coef = _fit_at(wins, ridge, p, psd, per_k)
    return ridge, per_k, coef


def _identified(
    wins: Sequence[PassiveWindow],
    x: np.ndarray,
    coef: np.ndarray,
    drawn: Sequence[np.ndarray],
    batch: tuple[float, float],
    how: str,
    has_prior: bool,
) -> tuple[bool, str]:
    lo, hi = batch
    variety = f"{len(wins)} windows, batch {lo:.0f}-{hi:.0f}"
    if len(wins) < MIN_WINDOWS:
        return False, f"too little traffic yet: {variety} (needs {MIN_WINDOWS} windows with decoding)"
    # the stretch point: STRETCH times the busiest window's batch and context, as a headroom asks
    # (its prefills scaled too made the spread relative to a larger step: windows of a constant few
    # users read identified)
    busiest = max(range(len(wins)), key=lambda i: wins[i].decodes)
    stretch = x[busiest].copy()
    stretch[1:3] *= STRETCH
    preds = sorted(float(stretch @ d) for d in drawn)
    mid = float(stretch @ coef)
    if not preds or mid <= 0:
        return False, f"not enough variety yet: {variety}"
    spread = (preds[math.ceil(0.975 * (len(preds) - 1))] - preds[int(0.025 * (len(preds) - 1))]) / mid
    if spread <= MAX_SPREAD:
        return True, f"identified by {how}: {variety}; a step at {STRETCH:g}x the batch within +-{spread * 50:.0f} %"
    hint = "" if has_prior else "; or calibrate: `spoc twin calibrate`"
    return False, (
        f"not enough variety yet: {variety} (a step at {STRETCH:g}x the batch is known only within "
        f"+-{spread * 50:.0f} %): busier and quieter minutes settle it{hint}"
    )


CONTEXT_PRIOR_CV = 0.3
"""The physical context prior's spread, relative: the bandwidth is read from whole steps (their
fixed cost counted as reading), so the prior leans high, a little slower than the server."""


def context_prior(windows: Sequence[PassiveWindow], kv_bytes_per_token: float | None) -> tuple[float, float] | None:
    """The context term from what the server reports, without load: a k-token of decode context
    reads ``kv_bytes_per_token`` x 1000 bytes, at the bandwidth its steps show (the most bytes read
    per second of step over the windows: the busiest, where the fixed cost weighs least). (mean,
    sd) in seconds a k-token, or None where the server reports either not (vLLM before 0.17, its
    read-bytes counter off, or ``kv_cache_memory_bytes`` unset)."""
    if not kv_bytes_per_token or kv_bytes_per_token <= 0:
        return None
    rates = [w.read_bytes / w.step_s for w in windows if w.read_bytes and w.step_s > 0]
    if not rates:
        return None
    mean = kv_bytes_per_token * 1000.0 / max(rates)
    return mean, CONTEXT_PRIOR_CV * mean


def _drift(fit: PassiveFit, prior: StepModel, prior_sd: StepModel) -> tuple[str, ...]:
    """Terms whose live interval and the prior's (2 sd) do not overlap."""
    out: list[str] = []
    for t in TERMS:
        lo, hi = fit.interval(t)
        p, sd = getattr(prior, t), abs(getattr(prior_sd, t))
        if hi < p - 2 * sd or lo > p + 2 * sd:
            now = getattr(fit.model, t)
            out.append(f"{t} {now:.3g} against the twin's {p:.3g} (+-{2 * sd:.2g})")
    return tuple(out)


def fit_of(
    windows: Sequence[PassiveWindow], prior: Twin | None, kv_bytes_per_token: float | None, seed: int
) -> PassiveFit:
    """The passive fit of ``windows``: a calibrated twin, where given, its prior; else the KV cache's
    read cost, where the server reports it (:func:`~spoc_tui.twin.passive.context_prior`)."""
    return fit_passive(
        list(windows),
        prior.fit if prior is not None else None,
        prior.sd if prior is not None else None,
        seed=seed,
        kv_bytes_per_token=kv_bytes_per_token,
    )


def passive_twin(fit: PassiveFit, server: ServerConfig, prior: Twin | None = None, draws: int = 0) -> Twin:
    """The twin the live fit makes: its step model, ``draws`` of its bootstrap draws, the server
    as the learner knows it (what :func:`headroom_of` replays the traffic on)."""
    keep = fit.draws[: max(0, draws)]
    sd = StepModel(
        *(statistics.pstdev([getattr(d, k) for d in fit.draws]) if len(fit.draws) > 1 else 0.0 for k in PARAMS),
    )
    step_cv = prior.step_cv if prior is not None else 0.05
    return Twin(fit.model, sd, keep, step_cv, server, notes=("learned passively from the monitor's scrapes",))
