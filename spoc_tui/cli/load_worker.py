"""``spoc load-worker``: a Locust worker joining ``spoc ramp --workers N`` from another machine."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from spoc_tui.cli.options import default_option, tls_options
from spoc_tui.load.defaults import DEFAULT_PROFILE

F = TypeVar("F", bound=Callable[..., Any])


@click.command("load-worker")
@click.option("--master", required=True, help="Host of the machine running `spoc ramp --workers N`.")
@default_option("--master-port", 5557, "The master's Locust port.", type=int)
@click.option("--url", required=True, help="The server under test (as the master has it).")
@click.option("--model", required=True, help="Served model name (as the master has it).")
@default_option("--profile", DEFAULT_PROFILE, "The master's load profile.")
@default_option("--seed", 0, "Random seed of this worker's users.", type=int)
@tls_options
def load_worker(master: str, master_port: int, url: str, model: str, profile: str, seed: int) -> None:
    """Join a ramp from another machine as a Locust worker (Locust's master/worker protocol)."""
    from spoc_tui.load.ramp import runner_argv, runner_env
    from spoc_tui.workload import load_workload

    prof = load_workload(profile)
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prof.as_dict(), f)
    argv = runner_argv(
        url, model, Path(f.name), seed, "--worker", "--master-host", master, "--master-port", str(master_port)
    )
    sys.exit(subprocess.call(argv, env=runner_env(url)))
