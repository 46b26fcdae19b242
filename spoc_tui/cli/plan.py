"""``spoc plan``: replicas and GPUs for N concurrent users from a ramp's knee, and the
autoscaling rule (KEDA ScaledObject, HPA external metric) on queue depth per replica."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from spoc_tui.cli.options import default_option, json_option, sla_option, twin_option
from spoc_tui.cli.types import FINITE, trace_selection
from spoc_tui.core.errors import InputError
from spoc_tui.core.ramp.sla import DEFAULT_SLA

if TYPE_CHECKING:
    from spoc_tui.core.traces.read import TraceSource


@click.command("plan")
@click.option("--ramp", "ramp_path", help="A ramp result of one replica (folder or ramp.json).")
@click.option("--users", type=int, help="Concurrent users to plan for (with --ramp), 1 to 10,000,000.")
@twin_option(
    "Instead of a ramp: replay --trace on a fleet of this calibrated twin (spoc twin calibrate), in virtual time."
)
@click.option("--trace", "trace_path", help="With --twin: the traffic to serve (a trace file).")
@trace_selection()
@default_option("--speed", 1.0, "With --twin: replay at this speed multiple.", type=FINITE)
@click.option("--replicas", "replicas_spec", help="With --twin: fixed replica counts, 1-8 or 1,2,4.")
@click.option(
    "--autoscale",
    "autoscale_specs",
    multiple=True,
    help='With --twin: a policy, "num_requests_waiting>=4,cooldown=60s[,startup=60s,interval=15s,min=1,max=8]" '
    "(repeatable).",
)
@sla_option("With --twin: the limits the trace is judged on", DEFAULT_SLA)
@default_option("--headroom", 0.2, "Share of each replica kept free.", type=FINITE)
@click.option(
    "--gpus-per-replica",
    type=int,
    help="GPUs one replica uses [default: the GPUs the ramp saw beside the server, else 1].",
)
@click.option("--model", help="Refuse a ramp of another served model.")
@default_option("--prometheus", "http://prometheus.monitoring:9090", "serverAddress of the KEDA trigger.")
@default_option("--deployment", "vllm", "The Deployment the autoscaler scales.")
@click.option(
    "--keda-headroom",
    type=FINITE,
    help="Also scale out when the fleet's headroom (spoc headroom --serve-metrics, docs/fleet.md) falls "
    "under this multiple of today's traffic, e.g. 1.3: a second KEDA trigger, before requests wait.",
)
@json_option("Print one JSON object (with both manifests as text).")
def plan_cmd(
    ramp_path: str | None,
    users: int | None,
    twin_path: str | None,
    trace_path: str | None,
    trace_format: str | None,
    trace_filters: tuple[str, ...],
    trace_window: str | None,
    trace_max_rows: int | None,
    speed: float,
    replicas_spec: str | None,
    autoscale_specs: tuple[str, ...],
    sla: str | None,
    headroom: float,
    gpus_per_replica: int | None,
    model: str | None,
    prometheus: str,
    deployment: str,
    keda_headroom: float | None,
    as_json: bool,
) -> None:
    """How many replicas (and GPUs) serve --users concurrent users within the ramp's SLA, and the
    autoscaling rule: scale on requests waiting per replica, as a KEDA ScaledObject and an HPA
    (with --keda-headroom, the ScaledObject also scales out on the fleet's live headroom).

    With --twin and --trace: the trace served by 1 to N replicas of the twin or by autoscaling
    policies, in virtual time: SLO attainment, p99s and replica-hours of each, and the cheapest that
    meets the SLA."""
    if twin_path is not None:
        if ramp_path is not None or users is not None:
            raise InputError("--twin plans from a trace: give --twin and --trace, or --ramp and --users")
        if trace_path is None:
            raise InputError("--twin needs --trace FILE: the traffic to serve")
        from spoc_tui.core.traces.read import trace_source

        if keda_headroom is not None:
            raise InputError("--keda-headroom goes with --ramp and --users (the plan that writes a ScaledObject)")
        source = functools.partial(trace_source, trace_path, trace_format, trace_filters, trace_window, trace_max_rows)
        fleet_plan(twin_path, source, speed, replicas_spec, autoscale_specs, sla, as_json)
        return
    if ramp_path is None or users is None:
        raise InputError("give --ramp and --users (or --twin and --trace)")
    from spoc_tui.core.analysis.fleetplan import check_target, hpa_yaml, keda_yaml, plan_from_ramp, plan_text
    from spoc_tui.core.results import read_ramp

    check_target(deployment, prometheus)

    doc = read_ramp(ramp_path)
    if model is not None and doc.model != model:
        raise InputError(f"the ramp measured model {doc.model!r}, not {model!r}: ramp the model you plan for")
    p = plan_from_ramp(doc, users, headroom, gpus_per_replica)
    keda, hpa = keda_yaml(p, prometheus, deployment, keda_headroom), hpa_yaml(p, deployment)
    if as_json:
        click.echo(json.dumps({**p.as_dict(), "keda_scaled_object": keda, "hpa": hpa}, indent=2))
        return
    click.echo(plan_text(p))
    click.echo("\n# KEDA ScaledObject\n" + keda)
    click.echo("# or an HPA on the external metric (prometheus-adapter)\n" + hpa)


def fleet_plan(
    twin_path: str,
    source: Callable[[], TraceSource],
    speed: float,
    replicas_spec: str | None,
    autoscale_specs: tuple[str, ...],
    sla: str | None,
    as_json: bool,
) -> None:
    """``spoc plan --twin --trace``: the trace (``source()`` reads the options that pick it) on
    fixed replica counts and autoscaling policies."""
    import sys

    from spoc_tui.cli.options import from_config
    from spoc_tui.core.ramp.sla import parse_sla
    from spoc_tui.core.traces.read import TraceRead
    from spoc_tui.twin.fleet import parse_autoscale, parse_replicas, plan_fleet
    from spoc_tui.twin.model import read_twin

    twin = read_twin(twin_path)
    limits = parse_sla(from_config(sla, "sla", "--sla", default=DEFAULT_SLA))
    if not 0 < speed <= 1000:
        raise InputError("--speed must be a positive multiple (at most 1000)")
    counts = parse_replicas(replicas_spec) if replicas_spec else ([] if autoscale_specs else [1, 2, 4])
    policies = [parse_autoscale(a) for a in autoscale_specs]
    src = source()
    read = TraceRead()
    rows = list(src.rows(read))
    if not rows:
        raise InputError(f"--trace {src.path}: no rows in the window")
    quiet = as_json or not sys.stderr.isatty()

    def say(label: str) -> None:
        click.echo(f"\r\033[Kplanning: {label}", nl=False, err=True)

    plan = plan_fleet(twin, rows, speed, counts, policies, limits, None if quiet else say)
    if not quiet:
        click.echo("", err=True)
    results, best, took = plan.results, plan.best, plan.seconds
    doc = {
        "twin": twin_path,
        "trace": src.header(len(rows), read.skipped),
        "speed": speed,
        "sla": [str(lim) for lim in limits],
        "router": "least outstanding requests",
        "configs": [r.as_dict() for r in results],
        "cheapest": best.run.label if best else None,
        "seconds": round(took, 2),
        "predicted": True,
    }
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(
        f"the trace {src.path.name} ({len(rows)} rows, x{speed:g}) on the twin of {twin.server.model}, "
        f"predicted in {took:.1f} s; SLA {', '.join(map(str, limits))}"
    )
    click.echo(f"{'configuration':<44} {'SLA':<12} {'attained':>8} {'TTFT p99':>9} {'ITL p99':>8} {'replica-h':>9}")
    for r in results:
        s = r.step
        att = "-" if r.attainment is None else f"{100 * r.attainment:.1f} %"

        def sec(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:.0f}ms" if v < 10 else f"{v:.0f}s"

        click.echo(
            f"{r.run.label[:44]:<44} {s.decision:<12} {att:>8} {sec(s.latency.ttft.p99):>9} "
            f"{sec(s.latency.itl.p99):>8} {r.run.replica_hours:>9.2f}"
        )
    if best is not None:
        click.echo(f"cheapest within the SLA: {best.run.label} ({best.run.replica_hours:.2f} replica-hours)")
    else:
        click.echo("none of these meets the SLA over the whole trace: try more replicas or a lower threshold")
