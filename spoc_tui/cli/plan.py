"""``spoc plan``: replicas and GPUs for N concurrent users from a ramp's knee, and the
autoscaling rule (KEDA ScaledObject, HPA external metric) on queue depth per replica."""

from __future__ import annotations

import json

import click

from spoc_tui.cli.types import FINITE
from spoc_tui.core.errors import InputError


@click.command("plan")
@click.option("--ramp", "ramp_path", required=True, help="A ramp result of one replica (folder or ramp.json).")
@click.option("--users", type=int, required=True, help="Concurrent users to plan for.")
@click.option("--headroom", type=FINITE, default=0.2, show_default=True, help="Share of each replica kept free.")
@click.option(
    "--gpus-per-replica",
    type=int,
    default=None,
    help="GPUs one replica uses [default: the GPUs the ramp saw beside the server, else 1].",
)
@click.option("--model", default=None, help="Refuse a ramp of another served model.")
@click.option(
    "--prometheus",
    default="http://prometheus.monitoring:9090",
    show_default=True,
    help="serverAddress of the KEDA trigger.",
)
@click.option("--deployment", default="vllm", show_default=True, help="The Deployment the autoscaler scales.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (with both manifests as text).")
def plan_cmd(
    ramp_path: str,
    users: int,
    headroom: float,
    gpus_per_replica: int | None,
    model: str | None,
    prometheus: str,
    deployment: str,
    as_json: bool,
) -> None:
    """How many replicas (and GPUs) serve --users concurrent users within the ramp's SLA, and the
    autoscaling rule: scale on requests waiting per replica, as a KEDA ScaledObject and an HPA."""
    from spoc_tui.core.fleetplan import hpa_yaml, keda_yaml, plan_from_ramp, plan_text
    from spoc_tui.core.results import read_ramp

    doc = read_ramp(ramp_path)
    if model is not None and doc.model != model:
        raise InputError(f"the ramp measured model {doc.model!r}, not {model!r}: ramp the model you plan for")
    p = plan_from_ramp(doc, users, headroom, gpus_per_replica)
    keda, hpa = keda_yaml(p, prometheus, deployment), hpa_yaml(p, deployment)
    if as_json:
        click.echo(json.dumps({**p.as_dict(), "keda_scaled_object": keda, "hpa": hpa}, indent=2))
        return
    click.echo(plan_text(p))
    click.echo("\n# KEDA ScaledObject\n" + keda)
    click.echo("# or an HPA on the external metric (prometheus-adapter)\n" + hpa)
