"""``spoc compare A B``: two ramps (before/after a flag change or an upgrade) side by side."""

from __future__ import annotations

import json

import click

from spoc_tui.cli.options import json_option


@click.command("compare")
@click.argument("a")
@click.argument("b")
@json_option()
def compare_cmd(a: str, b: str, as_json: bool) -> None:
    """Compare ramp B against ramp A (folders or ramp.json files): the knee's difference with its
    95 % interval, each common level's SLA figures and output tokens/s with theirs, and a verdict:
    better, worse or within noise. Exit code 0 whatever the verdict, 2 for a file that cannot be read."""
    from spoc_tui.core.analysis.compare import compare, comparison_text
    from spoc_tui.core.results import read_ramp

    c = compare(read_ramp(a), read_ramp(b))
    click.echo(json.dumps(c.as_dict(), indent=2) if as_json else comparison_text(c))
