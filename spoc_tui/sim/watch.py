"""The monitor's view of simulated servers on the virtual clock.

Each tick runs the simulated servers on by one interval, takes the ``/metrics`` text ``spoc sim``
would serve at that instant, parses it and windows it by the live poller's own rule
(:class:`~spoc_tui.core.metrics.vllm.ServerWindows`), and hands out the same :class:`VllmTick` the
poller does. What the monitor then makes of it (verdicts, alerts, events) is the monitor's code
(:class:`~spoc_tui.core.monitor.model.MonitorModel`), fed on the virtual clock: minutes of a scenario
in a second, the same for a seed every time. Only the HTTP between them is left out, which the
live tests cover.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from spoc_tui.core.metrics.promparse import Exposition, parse_text
from spoc_tui.core.metrics.vllm import ServerWindows, replicas_view
from spoc_tui.core.monitor.snapshots import VllmTick
from spoc_tui.sim.exposition import vllm_metrics
from spoc_tui.sim.virtual import VirtualServer


class VirtualWatch:
    """Simulated servers scraped every ``interval_s`` of virtual time, windowed over ``window_s``."""

    def __init__(
        self,
        servers: Sequence[VirtualServer],
        window_s: float = 60.0,
        interval_s: float = 1.0,
        names: Sequence[str] | None = None,
    ) -> None:
        if not servers:
            raise ValueError("a watch needs a server")
        if interval_s <= 0 or window_s <= 0:
            raise ValueError("the interval and the window must be positive")
        self.servers = tuple(servers)
        self.names = tuple(names) if names is not None else tuple(f"sim-{i}" for i in range(len(servers)))
        if len(self.names) != len(self.servers):
            raise ValueError("one name per server")
        self.interval_s = interval_s
        self.windows = ServerWindows(window_s)
        self.now = max(s.now for s in self.servers)
        self.expositions: tuple[Exposition, ...] = ()
        """The last tick's scrapes, one per server (what a passive learner reads)."""

    def tick(self) -> VllmTick:
        """Run every server on one interval and scrape it."""
        self.now += self.interval_s
        views, scrapes, exps = [], [], []
        for name, server in zip(self.names, self.servers, strict=True):
            server.advance(self.now)
            exp = parse_text(vllm_metrics(server.engine))
            view, scrape = self.windows.view(name, name, self.now, exp)
            views.append(view)
            scrapes.append(scrape)
            exps.append(exp)
        self.expositions = tuple(exps)
        total = replicas_view(scrapes) if len(scrapes) > 1 else None
        return VllmTick(tuple(views), total, frozenset(), (), ())

    def run(self, seconds: float, before: Callable[[float], None] | None = None) -> Iterator[VllmTick]:
        """Ticks for ``seconds`` of virtual time; ``before(t)`` is called ahead of each (to change
        the users, say)."""
        end = self.now + seconds - 1e-9
        while self.now < end:
            if before is not None:
                before(self.now)
            yield self.tick()
