"""Tables that diff their rows instead of clearing and rebuilding them."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

Cell = str | Text


class DiffTable(DataTable[Cell]):
    """A DataTable fed with whole snapshots: only changed cells are updated."""

    DEFAULT_CSS = """
    DiffTable { height: auto; max-height: 100%; }
    """

    def __init__(self, columns: list[tuple[str, str, int]], *, name: str | None = None, id: str | None = None, classes: str | None = None, disabled: bool = False) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled, cursor_type="row", zebra_stripes=False, show_cursor=False)
        self._columns = columns
        self._rows: dict[str, list[Cell]] = {}

    def on_mount(self) -> None:
        for key, label, width in self._columns:
            self.add_column(label, key=key, width=width)

    def sync(self, rows: dict[str, list[Cell]]) -> None:
        """Show exactly ``rows`` (key -> cells), touching only what changed."""
        col_keys = [k for k, _, _ in self._columns]
        stale = [k for k in self._rows if k not in rows]
        if stale and len(stale) > len(self._rows) // 2:
            self.clear()
            self._rows.clear()
        else:
            for k in stale:
                self.remove_row(k)
                del self._rows[k]
        for key, cells in rows.items():
            old = self._rows.get(key)
            if old is None:
                self.add_row(*cells, key=key)
            else:
                for ck, a, b in zip(col_keys, old, cells):
                    if _sig(a) != _sig(b):
                        self.update_cell(key, ck, b)
            self._rows[key] = list(cells)


def _sig(cell: Cell) -> object:
    if isinstance(cell, Text):
        return (cell.plain, str(cell.style), tuple(cell.spans))
    return cell
