"""``spoc inspect``: the command, and the text report of one (or two, windowed) readings of the
sources, or of a watch with each server's headroom (``--headroom``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from spoc_tui.cli.options import (
    api_key_options,
    from_config,
    json_option,
    seats_option,
    sla_option,
    tls_options,
    twin_option,
)
from spoc_tui.cli.types import FINITE
from spoc_tui.config import check_max_num_seqs
from spoc_tui.core import fmt
from spoc_tui.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, InputError
from spoc_tui.core.jsonsafe import json_safe
from spoc_tui.core.metrics.vllm import LATENCY_LABELS
from spoc_tui.core.ramp.sla import DEFAULT_SLA, Limit, parse_sla
from spoc_tui.core.textsafe import for_terminal

if TYPE_CHECKING:
    from spoc_tui.collectors.inspect import InspectResult
    from spoc_tui.twin.model import Twin


def render_text(res: InspectResult) -> str:
    lines: list[str] = []
    for s, v in zip(res.servers, res.verdicts(), strict=True):
        t = s.total
        sim = "  [SIMULATED]" if s.simulated else ""
        lines.append(f"vLLM {s.source}  engine {s.engine_version}  model {fmt.names(s.model_names)}{sim}")
        lines.append(f"  verdict: {v.text}" + "".join(f"\n    also {c}" for c in v.causes))
        if (h := res.headroom.get(s.source)) is not None:
            lines.append(f"  {h[0]}")
        lines.append(
            f"  running {fmt.num(t.running)}  waiting {fmt.num(t.waiting)}  KV cache "
            f"{fmt.pct(t.kv_cache_usage, digits=1)}"
            f"  prefix hits {fmt.pct(t.prefix_cache_hit_rate, digits=1)}  preemptions {fmt.count(t.preemptions_total)}"
        )
        lines.append(
            f"  tokens: prompt {fmt.count(t.prompt_tokens_total)} ({fmt.rate(t.prompt_tokens_rate, ' tok/s')})"
            f"  generation {fmt.count(t.generation_tokens_total)} ({fmt.rate(t.generation_tokens_rate, ' tok/s')})"
        )
        lines.append(f"  latency over {t.window}:       count      mean       p50       p90       p99")
        for key, label in LATENCY_LABELS.items():
            L = t.latency[key]
            lines.append(
                f"    {label:<6} {fmt.count(L.count):>20} {fmt.seconds(L.mean):>9}"
                + "".join(f" {fmt.seconds(getattr(L, p), L.is_bound(p)):>9}" for p in ("p50", "p90", "p99"))
            )
        if any(t.latency[key].bounded for key in LATENCY_LABELS):
            lines.append("    ≤: an upper bound, mean / (1 - q): the buckets are too coarse to interpolate in")
        if len(s.engines) > 1:
            for e in s.engines:
                lines.append(
                    f"  engine {e.engine}: running {fmt.num(e.running)} waiting {fmt.num(e.waiting)}"
                    f" KV {fmt.pct(e.kv_cache_usage, digits=1)} TTFT p99"
                    f" {fmt.seconds(e.latency['ttft'].p99, e.latency['ttft'].is_bound('p99'))}"
                )
    if res.fleet is not None:
        lines.append(res.fleet[0])
    for g in res.gpus:
        reasons = g.throttle_reasons
        thr = fmt.NA if reasons is None else (", ".join(reasons) or "none")
        lines.append(
            f"GPU {g.gpu} {g.model or ''} ({g.source}{', ' + g.hostname if g.hostname else ''}): "
            f"{fmt.num(g.temp_c, unit='C')} mem {fmt.num(g.mem_temp_c, unit='C')}  "
            f"SM {fmt.num(g.sm_clock_mhz)}/{fmt.num(g.sm_clock_max_mhz)} MHz  "
            f"{fmt.num(g.power_w)}/{fmt.num(g.power_limit_w)} W  util {fmt.pct(g.util_pct, fraction=False)}  "
            f"FB {fmt.num(g.fb_used_mib)} MiB  throttle: {thr}"
        )
    return "\n".join(lines)


def run_inspect(
    sources: list[str], interval: float | None, as_json: bool, api_key: str | None
) -> tuple[str, list[str]]:
    from spoc_tui.collectors.inspect import inspect_sources  # httpx: not loaded for `spoc --help`

    res = asyncio.run(inspect_sources(sources, interval, api_key))
    out = json.dumps(json_safe(res.as_dict()), indent=2, allow_nan=False) if as_json else render_text(res)
    return out, res.errors


def run_headroom(
    sources: list[str],
    seconds: float,
    limits: Sequence[Limit],
    as_json: bool,
    api_key: str | None,
    prior: Twin | None,
    seats: int | None = None,
) -> tuple[str, list[str], bool]:
    """``spoc inspect --headroom``: watch, then the report with each server's headroom; and
    whether Ctrl-C ended the watch early (what was seen is reported all the same)."""

    def say(text: str) -> None:
        print(f"spoc: {text}", file=sys.stderr, flush=True)

    from spoc_tui.twin.live import watch_headroom

    say(f"watching {len(sources)} source(s) for {seconds:.0f} s (Ctrl-C ends the watch early and reports)")
    res = asyncio.run(watch_headroom(sources, seconds, limits, api_key, prior, say=say, seats=seats))
    out = json.dumps(json_safe(res.as_dict()), indent=2, allow_nan=False) if as_json else render_text(res)
    return out, res.errors, res.interrupted


def run_history(
    prometheus_url: str,
    since_s: float,
    limits: Sequence[Limit],
    as_json: bool,
    prior: Twin | None,
    seats: int | None,
) -> tuple[str, list[str], bool]:
    """``spoc inspect --prometheus URL --headroom``: each replica's headroom, and the fleet's,
    learned from the last ``since_s`` of Prometheus's history (as :func:`run_headroom`)."""
    from spoc_tui.core.redact import redact_url
    from spoc_tui.twin.history import history_headroom
    from spoc_tui.twin.live import LiveHeadroom

    def say(text: str) -> None:
        print(f"spoc: {text}", file=sys.stderr, flush=True)

    say(f"reading the last {since_s / 60:.0f} min of {redact_url(prometheus_url)}'s vLLM series")
    live = LiveHeadroom(limits, prior, seats=seats)  # the monitor's estimate (60 s replays), as spoc headroom's
    res = asyncio.run(history_headroom(prometheus_url, since_s, live, say))
    out = json.dumps(json_safe(res.as_dict()), indent=2, allow_nan=False) if as_json else render_text(res)
    return out, res.errors, res.interrupted


def run_prometheus(prometheus_url: str, interval: float | None, as_json: bool) -> tuple[str, list[str]]:
    """``spoc inspect --prometheus URL``: each replica it scrapes, windowed over ``interval``
    (60 s if not given) as the monitor reads them."""
    from spoc_tui.collectors.inspect import InspectResult
    from spoc_tui.collectors.promql import PromQLCollector, PromQLPoller
    from spoc_tui.core.redact import redact_url

    shown = redact_url(prometheus_url)
    tick, change = PromQLPoller(PromQLCollector(prometheus_url), interval or 60.0, shown).poll()
    res = InspectResult(servers=list(tick.servers) if tick is not None else [])
    if tick is None:
        res.errors.append(change.reason if change is not None and change.reason else f"{shown}: no answer")
    elif not tick.servers:
        res.errors.append(f"{shown}: Prometheus holds no vLLM series")
    out = json.dumps(json_safe(res.as_dict()), indent=2, allow_nan=False) if as_json else render_text(res)
    return out, res.errors


@click.command("inspect")
@click.argument("sources", nargs=-1)
@click.option(
    "--prometheus",
    "prometheus_url",
    help="Read every vLLM replica a Prometheus server scrapes instead of SOURCES; with --headroom, "
    "learned from its history (--since).",
)
@click.option(
    "--since",
    help="With --prometheus --headroom: how much of its history to learn from (15m, 1h, ...; 1h if not "
    "given, at most 6h).",
)
@click.option(
    "--interval",
    type=FINITE,
    help="Scrape twice this many seconds apart for windowed percentiles and rates; with --headroom, "
    "how long to watch (600 s if not given).",
)
@json_option()
@click.option(
    "--headroom",
    is_flag=True,
    help="Watch the servers for --interval seconds and say how much more of that traffic each takes "
    "within --sla, learned from the scrapes alone (docs/headroom.md).",
)
@sla_option("With --headroom: the limits, as spoc ramp takes them", DEFAULT_SLA)
@twin_option("With --headroom: a calibrated twin.json (spoc twin calibrate) as the fit's prior.")
@seats_option(
    "With --headroom: the servers' max-num-seqs (vLLM's flag), which /metrics does not report; "
    "without it the headroom assumes 256 until a queue shows the seats.",
    "seats",
)
@api_key_options("Bearer token for the servers (never printed).")
@tls_options
def inspect_cmd(
    sources: tuple[str, ...],
    prometheus_url: str | None,
    since: str | None,
    interval: float | None,
    as_json: bool,
    headroom: bool,
    sla: str | None,
    twin_path: str | None,
    seats: int | None,
    api_key: str | None,
) -> None:
    """Read vLLM and dcgm-exporter SOURCES (URLs or saved /metrics files) once and report.

    The kind of each source is recognised from its content. A source that cannot be read
    is reported on stderr and makes the exit code 2; the others are still reported.
    With --prometheus, the replicas a Prometheus server scrapes are read through it instead.
    """
    if bool(sources) == bool(prometheus_url):
        raise InputError("give SOURCES (URLs or saved /metrics files) or --prometheus URL, not both")
    if since is not None and not (prometheus_url and headroom):
        raise InputError("--since goes with --prometheus URL --headroom")
    if prometheus_url and not prometheus_url.startswith(("http://", "https://")):
        raise InputError(f"--prometheus {prometheus_url!r}: give its http(s):// URL")
    if headroom and prometheus_url:
        if interval is not None:
            raise InputError("with --prometheus, --headroom learns from its history: give --since, not --interval")
        from spoc_tui.cli.headroom_cmd import since_seconds

        history_s = since_seconds(since or "1h")
    if headroom:
        from spoc_tui.twin.model import read_twin

        seconds = 600.0 if interval is None else interval
        if not 0 < seconds <= 86_400:
            raise InputError("--interval must be between 0 and 86400 seconds with --headroom")
        limits = parse_sla(from_config(sla, "sla", "--sla", default=DEFAULT_SLA))
        check_max_num_seqs(seats, "--max-num-seqs")
        prior = read_twin(os.path.expanduser(twin_path)) if twin_path else None
        if prometheus_url:
            out, errors, interrupted = run_history(prometheus_url, history_s, limits, as_json, prior, seats)
        else:
            out, errors, interrupted = run_headroom(list(sources), seconds, limits, as_json, api_key, prior, seats)
        click.echo(out)
        for e in errors:
            click.echo(f"spoc: error: {for_terminal(str(e))}", err=True)
        sys.exit(EXIT_INTERRUPTED if interrupted else EXIT_USAGE if errors else EXIT_OK)
    given = click.get_current_context().get_parameter_source("sla") is click.core.ParameterSource.COMMANDLINE
    if given or twin_path is not None:  # (an SPOC_SLA the shell exports is not an --sla given here)
        raise InputError("--sla and --twin are for --headroom")
    if seats is not None:
        raise InputError("--max-num-seqs is for --headroom")
    if interval is not None and not 0 < interval <= 3600:
        raise InputError("--interval must be between 0 and 3600 seconds")
    if prometheus_url:
        out, errors = run_prometheus(prometheus_url, interval, as_json)
    else:
        out, errors = run_inspect(list(sources), interval, as_json, api_key)
    click.echo(out)
    for e in errors:
        click.echo(f"spoc: error: {for_terminal(str(e))}", err=True)
    sys.exit(EXIT_USAGE if errors else EXIT_OK)
