"""The live headroom learned through Prometheus (issue 75, point 1): each vLLM replica's scrapes
as Prometheus stored them (the raw samples of range selectors, a scrape's samples sharing its
timestamp), the last hour's at once and each new one after, into the same learners the monitor's
direct scrapes feed. The first estimate then comes as soon as the history identifies the model.

What Prometheus cannot give the fit is said for that replica, never filled in: scrapes too far
apart for the fit's 30 s windows, a series the fit reads that it does not hold (a relabelling
dropped it, or the server's vLLM does not report it). A replica that restarted shows as counters
going back, as for direct scrapes (:mod:`spoc_tui.twin.oneserver`).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import deque
from collections.abc import Callable

from spoc_tui.collectors.inspect import InspectResult
from spoc_tui.collectors.promql import Scrapes
from spoc_tui.collectors.scrape import SourceError
from spoc_tui.core.metrics.promparse import Exposition
from spoc_tui.core.metrics.vllm import (
    CACHE_CONFIG,
    ITERATION_TOKENS,
    KV_USAGE,
    LATENCIES,
    REQUEST_GENERATION_TOKENS,
    REQUEST_PROMPT_TOKENS,
    REQUEST_SUCCESS,
    Scrape,
    is_vllm,
    server_view,
)
from spoc_tui.core.redact import redact_url
from spoc_tui.twin.headroom import Headroom
from spoc_tui.twin.live import LiveHeadroom, Publishing, off_loop
from spoc_tui.twin.traffic import WINDOW_S

COARSEST_SCRAPE_S = WINDOW_S
"""The longest scrape interval the fit takes: a window is two scrapes at least ``WINDOW_S`` apart,
and its KV gauge their mean (Prometheus's default of 60 s makes every window a minute of one gauge
reading)."""
LATE_S = 30.0
"""How far before the last read each following read reaches back: a scrape stamped at its start
is stored once it is done (a slow server, a busy Prometheus)."""
PROMETHEUS_EVERY_S = 15.0
"""How often the headroom reads the scrapes Prometheus stored since its last read."""
HISTORY_S = 3600.0
"""The history the monitor and ``spoc headroom`` read at their start."""

NEEDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("its engine steps", tuple(f"{n}_count" for n in ITERATION_TOKENS)),
    ("its inter-token latency", tuple(f"{n}_bucket" for n in LATENCIES["itl"])),
    ("its KV cache's use", KV_USAGE),
    ("its KV cache's size", CACHE_CONFIG),
    ("its requests' prompt lengths", tuple(f"{n}_bucket" for n in REQUEST_PROMPT_TOKENS)),
    ("its requests' answer lengths", tuple(f"{n}_bucket" for n in REQUEST_GENERATION_TOKENS)),
    ("its requests finished", REQUEST_SUCCESS),
)
"""The series the fit and the traffic are read from, by what they say (any one name will do)."""


class ScrapeCheck:
    """One replica's scrapes as Prometheus holds them, checked for what the fit needs."""

    def __init__(self, keep: int = 16) -> None:
        self.gaps: deque[float] = deque(maxlen=keep)
        self.last: float | None = None
        self.seen: dict[str, float] = {}
        """What the fit needs, by what it says: when it was last held."""

    def see(self, t: float, exp: Exposition) -> None:
        if self.last is not None:
            self.gaps.append(t - self.last)
        self.last = t
        for what, names in NEEDS:
            if any(exp.has(n) for n in names):
                self.seen[what] = t

    @property
    def interval_s(self) -> float | None:
        """The replica's scrape interval (the median gap between its stored scrapes)."""
        return statistics.median(self.gaps) if self.gaps else None

    def problem(self, source: str) -> str | None:
        """Why this replica's headroom cannot be learned from Prometheus, or None."""
        every = self.interval_s
        if every is not None and every > COARSEST_SCRAPE_S * 1.1:
            return (
                f"Prometheus scrapes {source} every {every:.0f} s; the headroom needs a scrape every "
                f"{COARSEST_SCRAPE_S:.0f} s or less (its windows are {WINDOW_S:.0f} s): set its "
                "scrape_interval to 15s"
            )
        missing = [what for what, names in NEEDS if what not in self.seen]
        if missing and self.last is not None:
            names = ", ".join(dict(NEEDS)[what][0] for what in missing)
            return (
                f"Prometheus holds no {names} for {source} ({'; '.join(missing)}): a relabelling dropped "
                "it, or its vLLM does not report it"
            )
        return None


class PrometheusFeed:
    """Each vLLM replica Prometheus scrapes, fed to ``live``: its history first (``since_s``), then
    at each :meth:`read` the scrapes stored since (blocking: call it from a thread)."""

    def __init__(
        self,
        scrapes: Callable[[float, float], Scrapes],
        live: LiveHeadroom,
        since_s: float = HISTORY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``scrapes``: (start, end) -> each instance's scrapes stored in it
        (:meth:`spoc_tui.collectors.promql.PromQLCollector.scrapes`)."""
        self.scrapes = scrapes
        self.live = live
        self.since_s = since_s
        self.clock = clock
        self.checks: dict[str, ScrapeCheck] = {}
        self._read_to: float | None = None
        self.ends: dict[str, tuple[tuple[float, Exposition], tuple[float, Exposition]]] = {}
        """Each replica's first scrape read and its last."""

    def read(self) -> int:
        """The scrapes stored since the last read (the first: the history), into the learners;
        how many were new.

        Raises:
            SourceError: Prometheus failed (the next read reaches back over the gap).
        """
        now = self.clock()
        start = now - self.since_s
        if self._read_to is not None:  # from the oldest of the replicas' last scrapes read (one not
            # yet stored then is stamped after it), and no further back than LATE_S before the last read
            oldest = min((last[0] for _, last in self.ends.values()), default=self._read_to)
            start = max(start, min(oldest, self._read_to) - 1e-3, self._read_to - LATE_S)
        got = self.scrapes(start, now)
        self._read_to = now
        new = 0
        for inst, rows in sorted(got.items()):
            if not rows or not any(is_vllm(exp) for _, exp in rows[-3:]):
                continue  # not every server Prometheus scrapes is vLLM
            new += sum(self._add(inst, t, exp) for t, exp in rows)
            self.live.hold(inst, self.checks[inst].problem(inst))
        return new

    def add(self, inst: str, t: float, exp: Exposition) -> None:
        """One scrape of ``inst`` stamped ``t`` read otherwise (the monitor's own reads of
        Prometheus, :class:`~spoc_tui.collectors.promql.PromQLPoller`'s ``on_scrape``): learned
        where it is newer than the last, and checked."""
        if is_vllm(exp) and self._add(inst, t, exp):
            self.live.hold(inst, self.checks[inst].problem(inst))

    def _add(self, inst: str, t: float, exp: Exposition) -> bool:
        first, last = self.ends.get(inst, ((t, exp), (-math.inf, exp)))
        if not t > last[0]:
            return False
        self.checks.setdefault(inst, ScrapeCheck()).see(t, exp)
        self.live.add(inst, t, exp)
        self.ends[inst] = (first, (t, exp))
        return True


async def history_headroom(
    prometheus_url: str,
    since_s: float,
    live: LiveHeadroom,
    say: Callable[[str], None] = lambda _: None,
) -> InspectResult:
    """``spoc inspect --prometheus URL --headroom --since``: every vLLM replica Prometheus scraped
    over the last ``since_s``, learned from its stored scrapes into ``live``; the report of that
    span with each replica's headroom and the fleet's (its weakest replica's). Ctrl-C while the
    estimates run: what was read is reported, marked ``interrupted``."""
    from spoc_tui.collectors.promql import PromQLCollector
    from spoc_tui.twin.publish import fleet_of

    res = InspectResult(history_s=since_s)
    feed = PrometheusFeed(PromQLCollector(prometheus_url).scrapes, live, since_s)
    try:
        n = await off_loop(feed.read)
    except SourceError as e:
        res.errors.append(str(e))
        return res
    except (KeyboardInterrupt, asyncio.CancelledError):
        res.interrupted = True
        return res
    for inst, ((t0, first), (t1, last)) in sorted(feed.ends.items()):
        res.servers.append(server_view(inst, Scrape(last, t1, first, t0) if t1 > t0 else Scrape(last, t1)))
    if not feed.ends:
        res.errors.append(
            f"{redact_url(prometheus_url)}: Prometheus holds no vLLM series over the last {since_s:.0f} s"
        )
        return res
    say(f"read {n} scrapes of {len(feed.ends)} replica(s); working out their headroom, then their ledgers...")
    try:
        await off_loop(live.refresh)
        found = await off_loop(live.grade_recent)
    except (KeyboardInterrupt, asyncio.CancelledError):
        res.interrupted = True
        found = {inst: Headroom.none("not worked out: interrupted", live.limits) for inst in feed.ends}
    for inst, h in found.items():
        res.headroom[inst] = (h.text(), h.as_dict())
    if len(found) > 1:
        weakest, h = fleet_of(found)
        line = f"fleet: {h.line()}" + (f" (its weakest replica, {weakest})" if weakest else "")
        res.fleet = (line, {"replica": weakest, "headroom": h.as_dict()})
    return res


async def keep_headroom_prometheus(
    feed: PrometheusFeed,
    live: LiveHeadroom,
    publish: Callable[[dict[str, Headroom], bool], None],
    every_s: float = PROMETHEUS_EVERY_S,
    say: Callable[[str], None] = lambda _: None,
) -> None:
    """``spoc headroom --prometheus``: every replica's history from Prometheus, then the scrapes it
    stores every ``every_s``, into ``live`` (``feed``'s); estimates published as
    :func:`keep_headroom`'s. Ends when cancelled."""
    out = Publishing(live, publish, say)
    failed = False
    first = True
    while True:
        try:
            n = await off_loop(feed.read)
        except SourceError as e:
            if not failed:
                say(f"{e} (tried again every {every_s:.0f} s)")
            failed = True
        else:
            failed = False
            if first:
                say(f"read {n} scrapes of {len(feed.checks)} vLLM replica(s) from the last {feed.since_s / 60:.0f} min")
                first = False
            for name in feed.checks:
                out.learning(name, "learning from Prometheus")
        out.step()
        await asyncio.sleep(every_s)
