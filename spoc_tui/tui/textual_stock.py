"""The stock mode's side of :mod:`spoc_tui.tui.textual_mode` (issue 78): the names the widgets,
screens and app take from :mod:`spoc_tui.tui.textual_private`, each as Textual itself does it.

Nothing here reaches into Textual's privates (tests/unit/test_textual_privates.py checks it) and
nothing imports the fork, so this mode runs on a Textual release the fork was never ported to:
``SPOC_TEXTUAL=stock`` is how a Textual upgrade is tried before the pin moves (``make
test-textual-latest``).
"""

from __future__ import annotations

from typing import Any

from rich.style import Style as RichStyle
from textual.app import App, ReturnType
from textual.drivers.linux_driver import LinuxDriver
from textual.geometry import Size
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget


class LeanStrip(Strip):
    """Textual's ``Strip``, as it is (the lean mode's makes its caches when first used)."""

    __slots__ = ()


class LeanRefresh(Widget):
    """A widget refreshed and framed by Textual itself; :meth:`own_style` and :meth:`paint_size`
    are the lean mode's names for what Textual gives."""

    def own_style(self) -> RichStyle:
        return self.rich_style

    def paint_size(self) -> Size:
        return self.size


class FastTruecolorApp(App[ReturnType]):
    """An app with Textual's own truecolor filter."""

    def install_fast_truecolor(self) -> None:
        """Nothing to install: Textual's filter stays."""


class QuietDriver(LinuxDriver):
    """Textual's Linux/macOS driver, as it is (its input thread wakes ten times a second, and a
    terminal that hangs up is left to Textual)."""


def use_lean_compositor(screen: Screen[Any]) -> None:
    """Nothing: the screen repaints with Textual's compositor."""
