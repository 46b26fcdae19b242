"""Form fields that leave the app's keys alone until the user edits.

Textual's Input selects its text when it gains focus, so the first letter typed replaces the
value (on the Tune screen ``m``, meant as "back to the monitor", replaced the launch command).
Here focusing does not select, fields are one row high (compact), and ``Esc`` leaves the field
(a second ``Esc`` then goes back to the monitor), so one-letter keys reach the screen whenever
no field is being edited.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Input, Label, Select

from spoc_tui.core.ramp.rules import declared, form_id, settings


class Field(Input):
    BINDINGS = [Binding("escape", "leave", "Leave the field", show=False)]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("select_on_focus", False)
        kwargs.setdefault("compact", True)  # one row, not three: the forms fit 80x24 with room for results
        super().__init__(*args, **kwargs)

    def action_leave(self) -> None:
        self.screen.set_focus(None)


def rule_field(name: str, value: object = None) -> Iterator[Widget]:
    """The form field of the step rule ``name`` (a field of
    :class:`~spoc_tui.core.ramp.rules.StepRules`), made from its declaration: its label, then the
    field with ``value`` (default: the rule's; a choice's: a list of its choices)."""
    setting, declared_default = declared(name)
    default = declared_default if value is None else value
    yield Label(setting.form)
    if setting.kind == "choice":
        yield Select([(c, c) for c in setting.choices], value=str(default), allow_blank=False, id=form_id(name),
                     compact=True, tooltip=setting.form_tip or None)  # fmt: skip
        return
    if value is None and setting.form_value is not None:
        text = setting.form_value
    else:
        text = "" if default is None else f"{default:g}"
    digits = r"[0-9]*" if setting.kind == "int" else r"[0-9.]*"
    yield Field(text, id=form_id(name), restrict=digits, tooltip=setting.form_tip or None)


def rule_fields(row: str) -> Iterator[Widget]:
    """The Load form's fields of the step rules of ``row`` (their ``form_row``), in their order."""
    for name, setting in settings():
        if setting.form_row == row:
            yield from rule_field(name)
