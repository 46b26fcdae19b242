"""``spoc headroom``: the live headroom without a terminal (issue 75, point 2), for a pod beside the
fleet: it scrapes the servers as the monitor does and serves each one's headroom, and the fleet's,
as Prometheus metrics (:mod:`spoc_tui.twin.publish`)."""

from __future__ import annotations

import os
import sys

import click

from spoc_tui.cli.options import (
    api_key_options,
    default_option,
    from_config,
    seats_option,
    sla_option,
    tls_options,
    twin_option,
)
from spoc_tui.core.errors import EXIT_INTERRUPTED, InputError
from spoc_tui.core.textsafe import for_terminal

DEFAULT_SERVE = "127.0.0.1:9464"


def since_seconds(text: str) -> float:
    """``--since`` in seconds: a duration up to the longest history read.

    Raises:
        InputError: not a duration, or past the longest.
    """
    from spoc_tui.collectors.promql import HISTORY_MOST_S
    from spoc_tui.core.durations import duration_s

    try:
        secs = duration_s(text)
    except ValueError:
        raise InputError(f"--since {text!r}: give a duration like 15m, 90s or 1h") from None
    if not 60 <= secs <= HISTORY_MOST_S:
        raise InputError(f"--since {text!r}: give from 1 minute to {HISTORY_MOST_S / 3600:.0f} hours")
    return secs


@click.command("headroom")
@click.option("--url", "urls", multiple=True, help="A vLLM server's base URL (repeat it for replicas).")
@click.option(
    "--prometheus",
    "prometheus_url",
    help="Learn every vLLM replica a Prometheus server scrapes, from its history (--since) and then "
    "each scrape it stores, instead of scraping --url.",
)
@default_option(
    "--since", "1h", "With --prometheus: how much history to learn from at the start (15m, 1h, ...; at most 6h)."
)
@default_option(
    "--serve-metrics",
    DEFAULT_SERVE,
    "Where Prometheus scrapes the headroom: PORT or HOST:PORT (loopback unless a host is given; "
    "0.0.0.0:PORT for every interface).",
    "serve",
)
@sla_option("The limits the headroom holds, as spoc ramp takes them", "ttft_p99<=2s,itl_p99<=100ms")
@twin_option("A calibrated twin.json (spoc twin calibrate): the prior.")
@seats_option(
    "The servers' max-num-seqs, which /metrics does not report (without it the interval covers "
    "the seats from the most seen running up to vLLM's 256).",
    "seats",
)
@default_option(
    "--every",
    5.0,
    "Seconds between scrapes (with --prometheus, between reads of what it stored: 15 at least).",
    type=click.FloatRange(1.0, 60.0),
)
@api_key_options("Bearer token for the servers (never printed).")
@tls_options
def headroom_cmd(
    urls: tuple[str, ...],
    prometheus_url: str | None,
    since: str,
    serve: str,
    sla: str | None,
    twin_path: str | None,
    seats: int | None,
    every: float,
    api_key: str | None,
) -> None:
    """Serve the live headroom of the vLLM servers at --url as Prometheus metrics, without a
    terminal: spoc_headroom_ratio{server,bound} (the estimate and its 95 % interval's ends, in
    multiples of the recent traffic), spoc_headroom_identified, spoc_headroom_age_seconds and
    spoc_headroom_info (what binds, or why there is no number), per server and for the fleet
    (server="fleet": its weakest replica). The first estimate comes once the scrapes identify the
    model (4 minutes or more; with --prometheus, from its history at once); each is said on
    stdout. Ctrl-C or SIGTERM ends it (docs/fleet.md)."""
    from spoc_tui.cli.signals import run_stoppable
    from spoc_tui.config import check_max_num_seqs
    from spoc_tui.core.ramp.sla import parse_sla
    from spoc_tui.twin.live import LiveHeadroom, keep_headroom
    from spoc_tui.twin.model import read_twin
    from spoc_tui.twin.publish import HeadroomCollector, parse_address, serve_metrics

    limits = parse_sla(from_config(sla, "sla", "--sla", default="ttft_p99<=2s,itl_p99<=100ms"))
    check_max_num_seqs(seats, "--max-num-seqs")
    if bool(urls) == bool(prometheus_url):
        raise InputError("give the servers' --url (one per replica) or --prometheus URL, not both")
    for u in [*urls, *([prometheus_url] if prometheus_url else [])]:
        if not u.startswith(("http://", "https://")):
            raise InputError(f"{'--prometheus' if u == prometheus_url else '--url'} {u!r}: give its http(s):// URL")
    history_s = since_seconds(since) if prometheus_url else None
    prior = read_twin(os.path.expanduser(twin_path)) if twin_path else None
    address = parse_address(serve)
    collector = HeadroomCollector()
    stop = serve_metrics(address, collector)
    live = LiveHeadroom(limits, prior, seats=seats)

    def say(text: str) -> None:
        click.echo(for_terminal(text))
        sys.stdout.flush()

    host, port = address
    if prometheus_url and history_s is not None:
        from spoc_tui.collectors.promql import PromQLCollector
        from spoc_tui.core.redact import redact_url
        from spoc_tui.twin.history import PrometheusFeed, keep_headroom_prometheus

        feed = PrometheusFeed(PromQLCollector(prometheus_url).scrapes, live, history_s)
        what = f"the vLLM replicas {redact_url(prometheus_url)} scrapes"
        keep = keep_headroom_prometheus(feed, live, collector.publish, max(every, 15.0), say)
    else:
        what = f"{len(urls)} server(s)"
        keep = keep_headroom(list(urls), live, collector.publish, api_key, every, say)
    say(f"serving the headroom of {what} at http://{host}:{port}/metrics (Ctrl-C ends it)")
    try:
        run_stoppable(keep)
    except KeyboardInterrupt:
        pass
    finally:
        stop()
    sys.exit(EXIT_INTERRUPTED)
