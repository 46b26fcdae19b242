"""The running-work badge: one line above the footer of every screen but the monitor (whose
status line says it), naming a ramp, a study or a profile that runs while the operator looks
elsewhere, with where it is (issue 35)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class WorkBadge(Static):
    DEFAULT_CSS = """
    WorkBadge { dock: bottom; height: 1; width: 100%; background: $boost; color: $warning; display: none; }
    """

    def show(self, text: str) -> None:
        self.display = bool(text)
        self.update(Text("● " + text, style="bold") if text else "")
