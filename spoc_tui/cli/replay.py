"""``spoc replay FILE``: play back a recorded monitor session, or export it as CSV or JSON."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from spoc_tui.cli.options import default_option, file_option
from spoc_tui.core.errors import InputError


@click.command("replay")
@click.argument("file", type=click.Path(dir_okay=False))
@default_option(
    "--speed", 1.0, "Playback speed (changed at run time with + and -).", type=click.FloatRange(min=0.1, max=600)
)
@click.option(
    "--export",
    "export_fmt",
    type=click.Choice(["csv", "json"]),
    help="Write the recording as CSV (one row per server or GPU per refresh) or JSON instead of playing it.",
)
@file_option("--out", "out", "Where --export writes [default: standard output].")
def replay_cmd(file: str, speed: float, export_fmt: str | None, out: str | None) -> None:
    """Play back what `spoc monitor --record FILE` saw: space pauses, ←/→ seek 30 s (shift: 5 min),
    Home/End, + and - change the speed. With --export, write it as CSV or JSON instead."""
    from spoc_tui.core.monitor.recording import export, read_recording

    rec = read_recording(file)
    if rec.skipped:
        click.echo(f"spoc replay: {rec.skipped} unreadable line(s) skipped (a record cut short by a crash)", err=True)
    if export_fmt:
        text = export(rec, export_fmt)
        if out:
            try:
                Path(out).write_text(text)
            except OSError as e:
                raise InputError(f"--out {out}: cannot write ({e.strerror or e})") from None
            click.echo(f"wrote {len(rec.records)} records to {out}", err=True)
        else:
            click.echo(text, nl=False)
        return
    if out:
        raise InputError("--out goes with --export")
    from spoc_tui.tui.terminal import require_terminal

    require_terminal("spoc replay")  # before the app loads
    from spoc_tui.tui.replay import ReplayApp

    sys.exit(int(ReplayApp(rec, speed).run() or 0))
