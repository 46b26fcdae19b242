"""The ``spoc`` command line: click only. Each command turns its flags into a request object,
calls the service that does the work (the same one the TUI calls) and prints the result.

Errors: every error a service raises is a :class:`~spoc_tui.core.errors.SpocError` with its exit
code; :func:`main` prints it as one line (``spoc: error: ...``) and exits with that code, so no
command needs its own handling for errors it does not word itself.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from spoc_tui import __version__
from spoc_tui.cli.monitor_cmd import monitor
from spoc_tui.config import config_path, data_dir
from spoc_tui.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, SpocError
from spoc_tui.core.redact import RedactingFormatter
from spoc_tui.core.textsafe import for_terminal

# The heavy modules (the ramp's machinery, Optuna, numpy, httpx) are imported by the commands
# that use them, not here: `spoc --help` and a bad flag answer at once (issue 35).

F = TypeVar("F", bound=Callable[..., Any])
"""Local Locust worker processes: each takes a core; more than this is a typo."""


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="spoc")
@click.pass_context
def cli(ctx: click.Context) -> None:  # the commands: _register()
    """spoc-tui: what limits your vLLM server, live, over SSH.

    Without a command, opens the monitor (same as `spoc monitor`).
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(monitor)


@cli.command()
@click.argument("what", type=click.Choice(["config", "data"]))
def locate(what: str) -> None:
    """Print where spoc-tui keeps its config file or its data."""
    click.echo(str(config_path() if what == "config" else data_dir()))


def _register() -> None:
    from spoc_tui.cli.capacity_cmd import capacity
    from spoc_tui.cli.compare import compare_cmd
    from spoc_tui.cli.demo import demo_cmd
    from spoc_tui.cli.headroom_cmd import headroom_cmd
    from spoc_tui.cli.inspect import inspect_cmd
    from spoc_tui.cli.load_worker import load_worker
    from spoc_tui.cli.plan import plan_cmd
    from spoc_tui.cli.profile import profile_cmd
    from spoc_tui.cli.ramp_cmd import ramp_cmd
    from spoc_tui.cli.replay import replay_cmd
    from spoc_tui.cli.report import report_cmd
    from spoc_tui.cli.sim_cmd import sim
    from spoc_tui.cli.trace import trace_cmd
    from spoc_tui.cli.tune_cmd import tune
    from spoc_tui.cli.twin import twin_cmd

    for cmd in (sim, demo_cmd, monitor, tune, load_worker, capacity):
        cli.add_command(cmd)
    cli.add_command(inspect_cmd)
    cli.add_command(headroom_cmd)
    cli.add_command(ramp_cmd)
    cli.add_command(report_cmd)
    cli.add_command(profile_cmd)
    cli.add_command(trace_cmd)
    cli.add_command(plan_cmd)
    cli.add_command(replay_cmd)
    cli.add_command(compare_cmd)
    cli.add_command(twin_cmd)


_register()

LOG_LEVEL_ENV = "SPOC_LOG_LEVEL"


class _LogFile(logging.FileHandler):
    """A log file whose folder (and the file) is made only when a first record is written."""

    def _open(self) -> Any:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def configure_logging() -> None:
    """Each module logs to its own logger (``spoc_tui.<module>``); here they go to one file in the
    data folder, never to the terminal the TUI draws on. WARNING and above by default
    (``SPOC_LOG_LEVEL=DEBUG`` for more); the file is only created once something is logged."""
    level = os.environ.get(LOG_LEVEL_ENV, "WARNING").upper()
    handler = _LogFile(data_dir() / "spoc.log", delay=True)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("spoc_tui")
    root.addHandler(handler)
    root.setLevel(level if level in logging.getLevelNamesMapping() else logging.WARNING)
    root.propagate = False


def main() -> None:
    """The ``spoc`` entry point: a :class:`SpocError` is one line on stderr and its exit code."""
    configure_logging()
    try:
        rc = cli(standalone_mode=False)
    except SpocError as e:
        click.echo(f"spoc: error: {for_terminal(str(e))}", err=True)
        if e.hint:
            click.echo(for_terminal(e.hint), err=True)
        sys.exit(e.exit_code)
    except click.UsageError as e:  # a bad flag or value: the same one-line prefix as every other error
        cmd = e.ctx.command_path if e.ctx is not None else "spoc"
        click.echo(f"spoc: error: {for_terminal(e.format_message())} (see {cmd} --help)", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        click.echo(f"spoc: error: {for_terminal(e.format_message())}", err=True)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, click.Abort):
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(rc if isinstance(rc, int) else EXIT_OK)
