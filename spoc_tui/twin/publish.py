"""The live headroom published as Prometheus metrics (issue 75, point 2), with prometheus_client:
what a Grafana panel, an alert rule or KEDA reads, per server and for the fleet.

- ``spoc_headroom_ratio{server, bound}``: the estimate (``bound="estimate"``) and its 95 %
  interval's ends (``ci95_low``, ``ci95_high``; ``+Inf`` where every speed replayed met the SLA),
  in multiples of the server's recent traffic; absent where there is no number.
- ``spoc_headroom_identified{server}``: 1 where the estimate is a number, 0 where it could not say
  one (its reason in ``spoc_headroom_info``).
- ``spoc_headroom_age_seconds{server}``: since the estimate was worked out.
- ``spoc_headroom_info{server, binding_limit, reason}``: 1, with what binds first and why.

``server="fleet"`` is the weakest replica's (the traffic split evenly, the first to break the SLA
is where the fleet does), identified only where every replica is; with one server, that one's.
Served on loopback unless an address is given (:func:`parse_address`).
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from spoc_tui.core.errors import InputError
from spoc_tui.twin.headroom import Headroom

FLEET = "fleet"
REASON_MAX = 200
"""A reason label is cut to this many characters (a label is no place for a paragraph)."""
DEFAULT_ADDRESS = "127.0.0.1"


def parse_address(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT`` as (host, port); the host loopback unless given.

    Raises:
        InputError: not an address and a port from 1 to 65535.
    """
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if sep else DEFAULT_ADDRESS
    port = port if sep else text
    try:
        number = int(port)
    except ValueError:
        number = 0
    if not 1 <= number <= 65535:
        raise InputError(f"--serve-metrics {text!r}: give PORT or HOST:PORT, the port from 1 to 65535")
    if host not in ("localhost", ""):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InputError(f"--serve-metrics {text!r}: {host!r} is not an IP address (or localhost)") from None
    return host or DEFAULT_ADDRESS, number


class HeadroomCollector(Collector):
    """Each server's latest headroom, read by Prometheus at each scrape (any thread may
    :meth:`publish`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[Headroom, float]] = {}

    def publish(self, results: Mapping[str, Headroom], fresh: bool = True) -> None:
        """Servers' estimates just worked out (by source, as shown); ``fresh`` false where only
        their ledgers were graded again (each estimate keeps its age)."""
        now = self.clock()
        with self._lock:
            for src, h in results.items():
                prev = self._latest.get(src)
                self._latest[src] = (h, now if fresh or prev is None else prev[1])

    def servers(self) -> set[str]:
        """The servers published so far."""
        with self._lock:
            return set(self._latest)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            latest = dict(self._latest)
        now = self.clock()
        ratio = GaugeMetricFamily(
            "spoc_headroom_ratio",
            "How many times its recent traffic the server takes within the SLA: the estimate and its 95 % "
            "interval's ends (bound)",
            labels=["server", "bound"],
        )
        server = ["server"]
        identified = GaugeMetricFamily(
            "spoc_headroom_identified", "1 where the headroom is a number, 0 where it could not say one", labels=server
        )
        age = GaugeMetricFamily("spoc_headroom_age_seconds", "Seconds since the headroom was worked out", labels=server)
        info = GaugeMetricFamily(
            "spoc_headroom_info", "What binds first, and why (1)", labels=[*server, "binding_limit", "reason"]
        )
        windows = GaugeMetricFamily(
            "spoc_headroom_ledger_windows",
            "Minutes of the last two hours the twin predicted and the server's histograms then graded (the ledger)",
            labels=server,
        )
        held = GaugeMetricFamily(
            "spoc_headroom_ledger_held",
            "Of those minutes, how many the prediction's 95 % interval held every figure of",
            labels=server,
        )
        rows = {src: (h, now - at) for src, (h, at) in latest.items()}
        if rows:  # (one server: the fleet is that one; a KEDA trigger reads the fleet whatever its size)
            rows[FLEET] = _fleet(rows)
        for src, (h, secs) in rows.items():
            known = h.identified and h.estimate is not None
            identified.add_metric([src], 1.0 if known else 0.0)
            age.add_metric([src], max(0.0, secs))
            info.add_metric([src, h.binding_limit or "", h.reason[:REASON_MAX]], 1.0)
            if h.ledger is not None and src != FLEET:
                windows.add_metric([src], float(h.ledger.windows))
                held.add_metric([src], float(h.ledger.held))
            if known and h.estimate is not None:
                lo, hi = h.ci95
                ratio.add_metric([src, "estimate"], h.estimate)
                ratio.add_metric([src, "ci95_low"], lo if lo is not None else 0.0)
                ratio.add_metric([src, "ci95_high"], hi if hi is not None else math.inf)
        yield from (ratio, identified, age, info, windows, held)


def _fleet(rows: Mapping[str, tuple[Headroom, float]]) -> tuple[Headroom, float]:
    """The fleet's headroom (:func:`fleet_of`), as old as the oldest estimate."""
    oldest = max(secs for _, secs in rows.values())
    return fleet_of({src: h for src, (h, _) in rows.items()})[1], oldest


def fleet_of(results: Mapping[str, Headroom]) -> tuple[str | None, Headroom]:
    """The weakest replica and its headroom (as the monitor's fleet line: the traffic split
    evenly, the first replica to break the SLA is where the fleet does), or no number where a
    replica has none."""
    known = {src: h for src, h in results.items() if h.identified and h.estimate is not None}
    if len(known) < len(results):
        missing = len(results) - len(known)
        return None, Headroom.none(f"{missing} of {len(results)} replicas have no headroom yet")
    weakest = min(known, key=lambda src: known[src].estimate or 0.0)
    return weakest, known[weakest]


def serve_metrics(address: tuple[str, int], collector: HeadroomCollector) -> Callable[[], None]:
    """The collector served at ``address`` (a thread of prometheus_client's); returns its stop.

    Raises:
        InputError: the address cannot be bound (taken, not this host's).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    host, port = address
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise InputError(f"--serve-metrics {host}:{port}: cannot listen ({e.strerror or e})") from None

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
