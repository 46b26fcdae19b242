"""The TUI's two modes (issue 78): lean, on spoc's fork of Textual's compositor, refresh and
driver; stock (``SPOC_TEXTUAL=stock``), on Textual's own. Every TUI test runs in both (``make
test`` runs this folder again in the stock mode); here, that each mode is what it says."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from textual.drivers.linux_driver import LinuxDriver

from spoc_tui.core.errors import InputError
from spoc_tui.tui.ascii import AsciiDriver
from spoc_tui.tui.terminal import textual_mode_of
from spoc_tui.tui.textual_mode import MODE, STOCK
from tests.tui.helpers import gpu_tick, make_app, server_tick


def test_the_mode_is_read_from_spoc_textual_and_a_wrong_one_names_the_modes():
    assert textual_mode_of({}) == "lean"
    assert textual_mode_of({"SPOC_TEXTUAL": ""}) == "lean"
    assert textual_mode_of({"SPOC_TEXTUAL": " Stock "}) == "stock"
    with pytest.raises(InputError, match=r"SPOC_TEXTUAL='stockk' is not a mode of the TUI; use lean .* or stock"):
        textual_mode_of({"SPOC_TEXTUAL": "stockk"})
    assert MODE == textual_mode_of()


def test_a_full_screen_command_refuses_a_wrong_mode_before_it_starts():
    env = dict(os.environ, SPOC_TEXTUAL="fast")
    r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", "demo"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "SPOC_TEXTUAL='fast' is not a mode of the TUI" in r.stderr and "Traceback" not in r.stderr


async def test_the_monitor_runs_on_the_modes_compositor_and_driver():
    from spoc_tui.tui.messages import ServersSampled

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        app.post_message(gpu_tick())
        await pilot.pause()
        compositor = type(app.monitor._compositor)
    if STOCK:
        # Textual's own compositor, the fork never imported
        assert compositor.__module__ == "textual._compositor", compositor
        assert "spoc_tui.tui.textual_private" not in sys.modules
        assert AsciiDriver.__mro__[1].__module__ == "spoc_tui.tui.textual_stock"
        assert AsciiDriver.__mro__[2] is LinuxDriver  # Textual's own, nothing overridden
    else:
        assert compositor.__name__ == "LeanCompositor" and compositor.__module__ == "spoc_tui.tui.textual_private"
        assert AsciiDriver.__mro__[1].__name__ == "QuietDriver"
        assert AsciiDriver.__mro__[1].__module__ == "spoc_tui.tui.textual_private"
