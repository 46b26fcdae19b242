"""Form fields that leave the app's keys alone until the user edits.

Textual's Input selects its text when it gains focus, so the first letter typed replaces the
value (on the Tune screen ``m``, meant as "back to the monitor", replaced the launch command).
Here focusing does not select, fields are one row high (compact), and ``Esc`` leaves the field
(a second ``Esc`` then goes back to the monitor), so one-letter keys reach the screen whenever
no field is being edited.
"""

from __future__ import annotations

from typing import Any

from textual.binding import Binding
from textual.widgets import Input


class Field(Input):
    BINDINGS = [Binding("escape", "leave", "Leave the field", show=False)]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("select_on_focus", False)
        kwargs.setdefault("compact", True)  # one row, not three: the forms fit 80x24 with room for results
        super().__init__(*args, **kwargs)

    def action_leave(self) -> None:
        self.screen.set_focus(None)
