"""Reading many vLLM replicas and GPUs through a Prometheus server (PromQL).

Instant selectors of the raw series at "now" and at "now - window" are turned back into
expositions per scraped instance, so the same core derives the same figures as from
direct scrapes (buckets merged across replicas before the quantile).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from spoc_tui.collectors.scrape import SourceError
from spoc_tui.core.errors import first_line
from spoc_tui.core.metrics.promparse import Exposition, Labels
from spoc_tui.core.metrics.vllm import Scrape, is_vllm, replicas_view, server_view
from spoc_tui.core.monitor.snapshots import SourceStatus, VllmTick

# Prometheus asks for OpenMetrics, and prometheus_client >= 0.23 then writes `vllm_` for
# `vllm:` (reference/exposition_notes.md): select both and normalise back.
VLLM_SELECTOR = '{__name__=~"vllm[:_].*|http_requests_total"}'
DCGM_SELECTOR = '{__name__=~"DCGM_FI_.*|dcgm_.*"}'
_DROP = {"__name__", "job", "instance"}


def to_expositions(result: list[dict[str, Any]]) -> dict[str, Exposition]:
    """Prometheus vector results -> one Exposition per ``instance`` label."""
    out: dict[str, Exposition] = {}
    for item in result:
        metric = item.get("metric", {})
        value = item.get("value")
        if isinstance(value, (list, tuple)) and len(value) == 2:
            inst = metric.get("instance", "?")
            exp = out.get(inst)
            if exp is None:
                exp = out[inst] = Exposition()
            _put(exp, metric, value[1])
    return out


def _put(exp: Exposition, metric: dict[str, Any], value: Any) -> None:
    """One sample of a Prometheus answer into its instance's exposition (a read of 16 replicas
    is some 4,000 of them: nothing is built here that the sample does not need)."""
    name = metric.get("__name__")
    if not name:
        return
    try:
        v = float(value)
    except (TypeError, ValueError):
        return
    if not math.isfinite(v):  # "NaN", "+Inf": no data, as the exposition parser has it
        exp.nonfinite += 1
        return
    if name.startswith("vllm_"):
        name = "vllm:" + name[5:]
    labels: Labels = tuple(sorted([(k, str(x)) for k, x in metric.items() if k not in _DROP]))
    series = exp.samples.get(name)
    if series is None:
        series = exp.samples[name] = {}
    series[labels] = v


Scrapes = dict[str, list[tuple[float, Exposition]]]
"""Each instance's scrapes as Prometheus stored them: (the scrape's time, what it read), in order."""


def to_scrapes(result: list[dict[str, Any]], after: float = -math.inf, into: Scrapes | None = None) -> Scrapes:
    """Prometheus matrix results (raw samples of range selectors) -> each instance's scrapes,
    taken after ``after``: the samples one scrape read share its timestamp (Prometheus stamps a
    scrape's samples with its start), so grouped by it they are that scrape's exposition again.
    ``into``: scrapes already read (another slice of the same span), merged by timestamp."""
    found: dict[str, dict[float, Exposition]] = {inst: dict(rows) for inst, rows in (into or {}).items()}
    for item in result:
        metric = item.get("metric", {})
        by_t = found.setdefault(str(metric.get("instance", "?")), {})
        for row in item.get("values") or ():
            if not isinstance(row, (list, tuple)) or len(row) != 2:
                continue
            try:
                t = round(float(row[0]), 3)
            except (TypeError, ValueError):
                continue
            if t > after:
                exp = by_t.get(t)
                if exp is None:
                    exp = by_t[t] = Exposition()
                _put(exp, metric, row[1])
    return {inst: sorted(rows.items(), key=lambda r: r[0]) for inst, rows in found.items() if rows}


HISTORY_SLICE_S = 900
"""A history is read in slices of this many seconds (one range selector each), so that no one
answer holds an hour of every series of every replica."""
HISTORY_MOST_S = 6 * 3600
"""The longest history read (``--since``)."""


class PromQLCollector:
    """Queries a Prometheus server (prometheus-api-client; blocking, run it in a thread)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        from prometheus_api_client import PrometheusConnect

        self.url = url
        self._prom = PrometheusConnect(url=url, timeout=timeout)

    def query(self, selector: str, at: float | None = None) -> dict[str, Exposition]:
        return to_expositions(self._ask(selector, at))

    def stamps(self, at: float | None = None) -> dict[str, float]:
        """Each vLLM replica's last scrape (wall time) as of ``at`` (:data:`STAMPS`)."""
        out: dict[str, float] = {}
        for item in self._ask(STAMPS, at):
            inst = str(item.get("metric", {}).get("instance", "?"))
            try:
                out[inst] = max(out.get(inst, -math.inf), float(item["value"][1]))
            except (KeyError, IndexError, TypeError, ValueError):
                continue
        return out

    def scrapes(self, start: float, end: float) -> Scrapes:
        """Every vLLM instance's scrapes Prometheus holds after ``start`` up to ``end`` (wall
        times), as they were scraped: the raw samples of range selectors, a slice at a time.

        Raises:
            SourceError: Prometheus failed a query, or answered something else than samples.
        """
        out: Scrapes = {}
        t = end
        while t > start:
            span = min(float(HISTORY_SLICE_S), t - start)
            secs = max(1, math.ceil(span))
            out = to_scrapes(self._ask(f"{VLLM_SELECTOR}[{secs}s]", t), after=start, into=out)
            t -= span
        return out

    def promql(self, expr: str) -> list[dict[str, Any]]:
        """A raw PromQL query (instant vector)."""
        return self._ask(expr)

    def _ask(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """One query's result, at ``at`` (wall time; now where None).

        Raises:
            SourceError: requests' errors, bad JSON, Prometheus's own error answers, or an answer
                that is not a list of results.
        """
        params = {"time": f"{at:.3f}"} if at is not None else None
        try:
            result = self._prom.custom_query(expr, params=params)
        except Exception as e:
            raise SourceError(f"{self.url}: Prometheus query failed ({first_line(e, 160)})") from None
        if not isinstance(result, list):
            raise SourceError(f"{self.url}: Prometheus answered {type(result).__name__}, not samples")
        return result


CHECK_EVERY_S = 5.0
"""How often the monitor asks Prometheus whether its replicas were scraped again."""
READ_AT_LEAST_S = 60.0
"""The monitor reads every series again at least this often, new scrapes or not."""
STAMPS = 'timestamp({__name__=~"vllm[:_]num_requests_running"})'
"""Each replica's last scrape, as Prometheus stamped it (one small series per replica)."""


class PromQLPoller:
    """The monitor's view of every replica a Prometheus server scrapes (blocking: call it from a
    thread). Each :meth:`poll` (at most every ``check_every_s``; sooner, it returns nothing)
    asks first when each replica was last scraped, and reads every
    series again only once most replicas have a scrape the last read did not hold (Prometheus's
    figures change once a scrape, not once a second: a read of 16 replicas is about a tenth of a
    second of CPU, benchmarks/monitor_cpu.py --prometheus). A read's window is windowed exactly as
    for direct scrapes, against the newest earlier read at least ``window_s`` old (the first
    window: read at ``now - window_s``); status changes are reported once."""

    def __init__(
        self,
        collector: PromQLCollector,
        window_s: float,
        url: str,
        clock: Callable[[], float] = time.time,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.collector = collector
        self.check_every_s = check_every_s
        self.window_s = window_s
        self.url = url
        """The source name shown in statuses."""
        self.clock = clock
        self._up: bool | None = None
        self._seen: dict[str, float] = {}
        """Each replica's last scrape at the last read."""
        self._read_at = -math.inf
        self._checked_at = -math.inf
        self._reads: deque[tuple[float, dict[str, Exposition]]] = deque()
        """Earlier reads, the baselines of later windows."""
        self.on_scrape: Callable[[str, float, Exposition], None] | None = None
        """Called with each replica's latest scrape a read holds, stamped as Prometheus stamped it
        (the live headroom learns from them: :class:`spoc_tui.twin.history.PrometheusFeed`)."""

    def _moved(self, stamps: dict[str, float], now: float) -> bool:
        """Whether to read again: most replicas scraped since the last read, a replica come or
        gone, or :data:`READ_AT_LEAST_S` passed."""
        if set(stamps) != set(self._seen) or now - self._read_at >= READ_AT_LEAST_S:
            return True
        newer = sum(1 for inst, t in stamps.items() if t > self._seen[inst])
        return newer * 2 >= len(stamps)

    def poll(self) -> tuple[VllmTick | None, SourceStatus | None]:
        """(the servers' tick: None when Prometheus failed or holds nothing new since the last;
        the status change, if any)."""
        url = self.url
        t = self.clock()
        if t - self._checked_at < self.check_every_s:
            return None, None
        self._checked_at = t
        try:
            stamps = self.collector.stamps(t)
            if not self._moved(stamps, t):
                return None, self._status(SourceStatus(url, True, None, time.time()))
            now = self.collector.query(VLLM_SELECTOR, t)
            base = next((r for r in reversed(self._reads) if r[0] <= t - self.window_s + 1e-6), None)
            t_then, then = (
                base
                if base is not None
                else (t - self.window_s, self.collector.query(VLLM_SELECTOR, t - self.window_s))
            )
        except SourceError as e:
            return None, self._status(SourceStatus(url, False, str(e)))
        self._seen, self._read_at = stamps, t
        self._reads.append((t, now))
        while len(self._reads) > 1 and self._reads[1][0] <= t - self.window_s:
            self._reads.popleft()  # (the newest at least window_s old stays: the next baseline)
        status = SourceStatus(url, True, None, time.time())
        change = self._status(status)
        now = {inst: exp for inst, exp in now.items() if is_vllm(exp)}  # not every HTTP server is vLLM
        if self.on_scrape is not None:
            for inst, exp in now.items():
                if inst in stamps:
                    self.on_scrape(inst, round(stamps[inst], 3), exp)
        scrapes = {inst: Scrape(exp, t, then.get(inst), t_then if inst in then else None) for inst, exp in now.items()}
        views = tuple(server_view(inst, sc) for inst, sc in sorted(scrapes.items()))
        total = replicas_view(list(scrapes.values())) if len(scrapes) > 1 else None
        return VllmTick(views, total, frozenset(), (), (status,)), change

    def _status(self, status: SourceStatus) -> SourceStatus | None:
        """``status``, where it changed (up or down) since the last poll."""
        changed = self._up is not status.up
        self._up = status.up
        return status if changed else None
