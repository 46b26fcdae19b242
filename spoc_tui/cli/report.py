"""``spoc report``: one self-contained HTML page (and its charts as SVG files) for a ramp, a
study, or two ramps compared."""

from __future__ import annotations

from pathlib import Path

import click

from spoc_tui.cli.options import file_option
from spoc_tui.core.files import write_atomic


def _kind(path: Path) -> str:
    """``ramp`` or ``study``, from what the path holds."""
    if path.is_dir():
        if (path / "ramp.json").exists():
            return "ramp"
        if (path / "pareto.json").exists():
            return "study"
        return ""
    return {"ramp.json": "ramp", "pareto.json": "study"}.get(path.name, "ramp" if path.suffix == ".json" else "")


def _write(path: Path, text: str) -> None:
    """Whole or not at all (a temporary file renamed)."""
    write_atomic(path, text)


@click.command("report")
@click.argument("paths", nargs=-1, required=True)
@file_option(
    "--out",
    "out",
    "The HTML file [default: report.html in the ramp's or study's folder; comparison.html here for two].",
)
def report_cmd(paths: tuple[str, ...], out: str | None) -> None:
    """One HTML page, whole by itself (no network, no server, no script), for a ramp folder
    (latency against load with intervals and the SLA lines, the knee with its interval and why,
    the server's view per step), a study folder (the front with intervals, each trial's flags),
    or two ramps (B against A). Its charts are written beside it as SVG files (OUT-charts/).
    Exit code 2 for a path that is not a result."""
    from spoc_tui.core.errors import InputError
    from spoc_tui.core.results import read_pareto, read_ramp, read_trials
    from spoc_tui.report.html import comparison_report, ramp_report, study_report

    if len(paths) > 2:
        raise InputError("give one result (a ramp or a study folder), or two ramps to compare")
    for p in paths:
        if not Path(p).exists():
            raise InputError(f"{p}: no such file or folder")
    if len(paths) == 2:
        from spoc_tui.core.analysis.compare import compare

        rep = comparison_report(compare(read_ramp(paths[0]), read_ramp(paths[1])))
        target = Path(out or "comparison.html")
    else:
        src = Path(paths[0])
        kind = _kind(src)
        folder = src if src.is_dir() else src.parent
        if kind == "ramp":
            rep = ramp_report(read_ramp(src))
        elif kind == "study":
            rep = study_report(read_pareto(src), read_trials(folder) if (folder / "trials.jsonl").exists() else [])
        else:
            raise InputError(f"{src}: neither a ramp (ramp.json) nor a study (pareto.json)")
        target = Path(out) if out else folder / "report.html"
    charts = target.with_name(target.stem + "-charts")
    stream = target.exists() and not target.is_file()  # /dev/stdout, a pipe: the page, no folder beside it
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _write(target, rep.html)
        if not stream:
            charts.mkdir(exist_ok=True)
            for name, svg in rep.charts.items():
                _write(charts / name, svg)
    except OSError as e:
        raise InputError(f"--out {target}: cannot write there ({e.strerror or e})") from None
    kept = "no chart files (--out is not a file)" if stream else f"{len(rep.charts)} chart(s) in {charts}/"
    click.echo(f"wrote {target} ({len(rep.html) / 1024:.0f} KB) and {kept}", err=stream)
