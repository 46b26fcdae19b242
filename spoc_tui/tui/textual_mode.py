"""Which Textual the TUI runs on (issue 78): the lean mode (the default) takes its compositor,
refresh, strips, truecolor filter and terminal driver from :mod:`spoc_tui.tui.textual_private`,
the fork of Textual's internals that makes the monitor cheap to keep open; ``SPOC_TEXTUAL=stock``
takes them from :mod:`spoc_tui.tui.textual_stock`, which is Textual's own code and nothing else.

The mode is read once, when this module is first imported. The widgets, screens and the app
import these names from here, never from either side directly. A value other than ``lean`` or
``stock`` runs the lean mode, and the full-screen commands refuse it
(:func:`spoc_tui.tui.terminal.require_terminal`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spoc_tui.core.errors import InputError
from spoc_tui.tui.terminal import textual_mode_of

try:
    MODE = textual_mode_of()
except InputError:
    MODE = "lean"  # refused, with its message, where a full-screen command starts
STOCK = MODE == "stock"

if TYPE_CHECKING or not STOCK:
    from spoc_tui.tui.textual_private import (
        FastTruecolorApp,
        LeanRefresh,
        LeanStrip,
        QuietDriver,
        use_lean_compositor,
    )
else:
    from spoc_tui.tui.textual_stock import (
        FastTruecolorApp,
        LeanRefresh,
        LeanStrip,
        QuietDriver,
        use_lean_compositor,
    )

__all__ = ["MODE", "STOCK", "FastTruecolorApp", "LeanRefresh", "LeanStrip", "QuietDriver", "use_lean_compositor"]
