"""The keys every work screen shares (Load, Tune, Capacity), declared once: back to the monitor,
the other screens' letters (while no text field has the focus), help and a screenshot."""

from __future__ import annotations

from textual.binding import Binding, BindingType

_SCREENS = (("l", "app.load", "Load"), ("t", "app.tune", "Tune"), ("c", "app.capacity", "Capacity"))


def work_screen_keys(*own: Binding, letters: str = "ltc") -> list[BindingType]:
    """The shared keys around a screen's ``own`` keys (before F8, so that the footer reads the
    same on every screen); ``letters``: the other screens' keys it takes."""
    return [
        Binding("m,escape,q", "app.monitor", "Monitor"),
        *(Binding(key, action, name, show=False) for key, action, name in _SCREENS if key in letters),
        Binding("question_mark", "app.push_screen('help')", "Help", show=False),
        *own,
        Binding("f8", "app.screenshot", "Screenshot"),
    ]
