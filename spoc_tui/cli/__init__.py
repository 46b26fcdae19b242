"""The ``spoc`` command line (click): flags -> a request object -> a service -> print."""

from spoc_tui.cli.main import cli, main

__all__ = ["cli", "main"]
