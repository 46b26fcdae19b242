"""``spoc headroom``: the live headroom without a terminal (issue 75, point 2), for a pod beside the
fleet: it scrapes the servers as the monitor does and serves each one's headroom, and the fleet's,
as Prometheus metrics (:mod:`spoc_tui.twin.publish`)."""

from __future__ import annotations

import asyncio
import os
import sys

import click

from spoc_tui.cli.options import api_key_options, from_config, sla_option, tls_options
from spoc_tui.core.errors import EXIT_INTERRUPTED, InputError
from spoc_tui.core.textsafe import for_terminal

DEFAULT_SERVE = "127.0.0.1:9464"


@click.command("headroom")
@click.option("--url", "urls", multiple=True, required=True, help="A vLLM server's base URL (repeat it for replicas).")
@click.option(
    "--serve-metrics",
    "serve",
    default=DEFAULT_SERVE,
    show_default=True,
    help="Where Prometheus scrapes the headroom: PORT or HOST:PORT (loopback unless a host is given; "
    "0.0.0.0:PORT for every interface).",
)
@sla_option("The limits the headroom holds, as spoc ramp takes them", "ttft_p99<=2s,itl_p99<=100ms")
@click.option("--twin", "twin_path", default=None, help="A calibrated twin.json (spoc twin calibrate): the prior.")
@click.option(
    "--max-num-seqs",
    "seats",
    type=int,
    default=None,
    help="The servers' max-num-seqs, which /metrics does not report (without it the interval covers "
    "the seats from the most seen running up to vLLM's 256).",
)
@click.option(
    "--every", type=click.FloatRange(1.0, 60.0), default=5.0, show_default=True, help="Seconds between scrapes."
)
@api_key_options("Bearer token for the servers (never printed).")
@tls_options
def headroom_cmd(
    urls: tuple[str, ...],
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
    model (4 minutes or more); each is said on stdout. Ctrl-C or SIGTERM ends it (docs/fleet.md)."""
    from spoc_tui.cli.signals import stop_signals_interrupt
    from spoc_tui.config import check_max_num_seqs
    from spoc_tui.core.ramp.sla import parse_sla
    from spoc_tui.twin.live import LiveHeadroom, keep_headroom
    from spoc_tui.twin.model import read_twin
    from spoc_tui.twin.publish import HeadroomCollector, parse_address, serve_metrics

    limits = parse_sla(from_config(sla, "sla", "--sla", default="ttft_p99<=2s,itl_p99<=100ms"))
    check_max_num_seqs(seats, "--max-num-seqs")
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise InputError(f"--url {u!r}: give the server's http(s):// URL")
    prior = read_twin(os.path.expanduser(twin_path)) if twin_path else None
    address = parse_address(serve)
    collector = HeadroomCollector()
    stop = serve_metrics(address, collector)
    live = LiveHeadroom(limits, prior, seats=seats)

    def say(text: str) -> None:
        click.echo(for_terminal(text))
        sys.stdout.flush()

    host, port = address
    say(f"serving the headroom of {len(urls)} server(s) at http://{host}:{port}/metrics (Ctrl-C ends it)")
    try:
        with stop_signals_interrupt():
            asyncio.run(keep_headroom(list(urls), live, collector.publish, api_key, every, say))
    except KeyboardInterrupt:
        pass
    finally:
        stop()
    sys.exit(EXIT_INTERRUPTED)
