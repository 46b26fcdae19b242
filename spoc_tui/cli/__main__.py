"""``python -m spoc_tui.cli``: the ``spoc`` command (servers and tests start ``spoc sim`` so)."""

from spoc_tui.cli.main import main

main()
