"""The simulated engine's counters and histograms, with vLLM's own buckets (what its ``/metrics``
exposes, :mod:`spoc_tui.sim.exposition`)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field, fields

import numpy as np

HIST_TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)


def hist_request_tokens(max_model_len: int) -> tuple[float, ...]:
    """vLLM's per-request token buckets (``request_prompt_tokens``, ``request_generation_tokens``):
    1, 2, 5, 10, 20, 50, ... up to the max-model-len."""
    out: list[float] = []
    mag = 1
    while True:
        for m in (1, 2, 5):
            v = m * mag
            if v > max_model_len:
                return tuple(out)
            out.append(float(v))
        mag *= 10


HIST_ITER_TOKENS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
"""vLLM's ``iteration_tokens_total`` buckets (V1 >= 0.8.5)."""
HIST_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
HIST_LATENCY = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Hist:
    """A cumulative-on-output histogram with fixed bounds (vLLM's own buckets).

    Observations in bulk (:meth:`observe_many`, a decode run's) wait in a list and are counted
    when the histogram is read (:attr:`counts`, :attr:`sum`, :attr:`n`): a run's three were most
    of what counting it cost."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._n = 0
        self._held: list[tuple[np.ndarray, np.ndarray | None]] = []
        self._one: list[float] = []
        self._times: list[int] = []

    def observe(self, v: float) -> None:
        self._counts[bisect_left(self.bounds, v) if v == v else len(self.bounds)] += 1
        self._sum += v
        self._n += 1

    def observe_many(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Each of ``values`` observed ``weights`` times (once each without): as many
        :meth:`observe` calls, but the sum added per value, not per observation."""
        self._held.append((values, weights))
        if len(self._held) >= 256:
            self._count_held()

    def observe_times(self, v: float, times: int) -> None:
        """``v`` observed ``times`` times (a step's gap, for each of its lazy decodes)."""
        self._one.append(v)
        self._times.append(times)
        if len(self._one) >= 4096:
            self._count_held()

    def _count_held(self) -> None:
        if self._one:
            self._held.append((np.asarray(self._one), np.asarray(self._times, float)))
            self._one, self._times = [], []
        held, self._held = self._held, []
        if not held:
            return
        values = np.concatenate([v for v, _ in held])
        w = np.concatenate([np.ones(len(v)) if m is None else m for v, m in held])
        idx = np.searchsorted(np.asarray(self.bounds), values, side="left")
        idx[np.isnan(values)] = len(self.bounds)
        for i, m in enumerate(np.bincount(idx, weights=w, minlength=len(self._counts)).tolist()):
            self._counts[i] += int(m)
        self._sum += float(np.dot(values, w))
        self._n += int(w.sum())

    @property
    def counts(self) -> list[int]:
        self._count_held()
        return self._counts

    @property
    def sum(self) -> float:
        self._count_held()
        return self._sum

    @property
    def n(self) -> int:
        self._count_held()
        return self._n

    def cumulative(self) -> list[int]:
        out, acc = [], 0
        for c in self.counts:
            acc += c
            out.append(acc)
        return out


class Unread(Hist):
    """A histogram nobody reads: a twin's replay, whose figures come from its requests and its
    counters (:func:`~spoc_tui.sim.backend.counters`), never from ``/metrics``. It counts nothing."""

    def __init__(self) -> None:
        super().__init__(())

    def observe(self, v: float) -> None:
        pass

    def observe_many(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        pass

    def observe_times(self, v: float, times: int) -> None:
        pass


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    success: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    ttft: Hist = field(default_factory=lambda: Hist(HIST_TTFT))
    itl: Hist = field(default_factory=lambda: Hist(HIST_ITL))
    tpot: Hist = field(default_factory=lambda: Hist(HIST_ITL))
    e2e: Hist = field(default_factory=lambda: Hist(HIST_LATENCY))
    queue: Hist = field(default_factory=lambda: Hist(HIST_LATENCY))
    prefill_time: Hist = field(default_factory=lambda: Hist(HIST_LATENCY))
    decode_time: Hist = field(default_factory=lambda: Hist(HIST_LATENCY))
    iterations: int = 0
    iteration_tokens: Hist = field(default_factory=lambda: Hist(HIST_ITER_TOKENS))
    request_prompt_tokens: Hist = field(default_factory=lambda: Hist(hist_request_tokens(2048)))
    request_generation_tokens: Hist = field(default_factory=lambda: Hist(hist_request_tokens(2048)))
    request_prefill_computed_tokens: Hist = field(default_factory=lambda: Hist(hist_request_tokens(2048)))
    """vLLM's ``request_prefill_kv_computed_tokens``: each prompt's tokens less the prefix cache's."""
    flops_per_gpu: float = 0.0
    """The cost model's FLOPs per GPU, as vLLM's ``estimated_flops_per_gpu_total`` counts them."""
    read_bytes_per_gpu: float = 0.0
    write_bytes_per_gpu: float = 0.0

    def unread(self) -> None:
        """Its histograms counted no more (:class:`Unread`): a twin's replay reads its requests and
        counters alone, and each request's eight observations were a few per cent of it."""
        for f in fields(self):
            if isinstance(getattr(self, f.name), Hist):
                setattr(self, f.name, Unread())
