"""The monitor's lean compositor paints, update after update, exactly what a full repaint shows."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from rich.segment import ControlType
from textual._compositor import ChopsUpdate, Compositor, LayoutUpdate
from textual.app import App
from textual.containers import Vertical
from textual.geometry import Region
from textual.screen import Screen
from textual.widgets import Static

from spoc_tui.tui import textual_private
from spoc_tui.tui.messages import GpusSampled, ServersSampled
from spoc_tui.tui.textual_private import LeanCompositor
from tests.tui.helpers import gpu_tick, make_app, server_tick


class Terminal:
    """What the terminal holds: a (character, style) per cell, painted from the updates."""

    def __init__(self, width: int, height: int) -> None:
        self.cells = [[(" ", None)] * width for _ in range(height)]

    def paint(self, update: object) -> None:
        x = y = 0
        if isinstance(update, LayoutUpdate):
            for y, strips in enumerate(update.strips):
                x = 0
                for strip in strips:
                    for seg in strip:
                        x = self._write(x, y, seg.text, seg.style)
            return
        assert isinstance(update, ChopsUpdate)
        for seg in update.__rich_console__(None, None):  # type: ignore[arg-type]
            if seg.control:
                for code in seg.control:
                    if code[0] == ControlType.CURSOR_MOVE_TO:
                        x, y = code[1], code[2]
                continue
            if seg.text != "\n":
                x = self._write(x, y, seg.text, seg.style)

    def _write(self, x: int, y: int, text: str, style: object) -> int:
        row = self.cells[y]
        for ch in text:
            if x < len(row):
                row[x] = (ch, style)
            x += 1
        return x


def _cells(compositor: Compositor, width: int, height: int) -> list[list[tuple[str, object]]]:
    t = Terminal(width, height)
    for y, strip in enumerate(compositor.render_strips()):
        x = 0
        for seg in strip:
            x = t._write(x, y, seg.text, seg.style)
    return t.cells


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_lean_partial_updates_paint_what_a_full_repaint_shows(monkeypatch, size):
    painted: list[object] = []

    class Tapped(LeanCompositor):
        def render_update(self, full: bool = False, screen_stack=None, simplify: bool = False):
            update = super().render_update(full, screen_stack, simplify)
            if update is not None:
                painted.append(update)
            return update

    monkeypatch.setattr(textual_private, "LeanCompositor", Tapped)
    app = make_app()
    rnd = random.Random(7)
    width, height = size
    async with app.run_test(size=size) as pilot:
        term = Terminal(width, height)
        clock = [1_795_000_000.0]
        app.monitor.clock = lambda: clock[0]
        partial = 0
        for step in range(14):
            clock[0] += 1.0 if step % 4 else 7.0  # now and then far enough for a chart to move
            app.post_message(ServersSampled(server_tick(up=step != 9)))
            g = gpu_tick()
            gpus = tuple(
                replace(
                    s, temp_c=(s.temp_c or 60) + rnd.randint(-3, 3), power_w=(s.power_w or 300) + rnd.randint(-40, 40)
                )
                for s in g.tick.gpus
            )
            app.post_message(GpusSampled(replace(g.tick, gpus=gpus), g.groups))
            await pilot.pause()
            await pilot.pause()
            for update in painted:
                partial += isinstance(update, ChopsUpdate)
                term.paint(update)
            painted.clear()
            compositor = app.monitor._compositor
            assert isinstance(compositor, LeanCompositor)
            assert term.cells == _cells(compositor, width, height), f"step {step}"
        assert partial >= 10  # the steps were painted as partial updates, not full repaints


class _Lean(Screen[None]):
    """A column: a panel of text that grows and shrinks, a panel below it, rows below the fold."""

    CSS = "#header { height: 1; } #column { height: 8; }"

    def __init__(self) -> None:
        super().__init__()
        self._compositor = LeanCompositor()

    def compose(self):
        yield Static("a header", id="header")
        with Vertical(id="column"):
            yield Static("one line", id="top")
            yield Static("the panel below", id="below")
            for i in range(30):  # below the fold
                yield Static(f"row {i}", id=f"r{i}")


async def test_a_layout_repaints_what_moved_even_after_a_look_up_arranged_the_map():
    """Textual arranges a stale map again at a widget's look-up, picking up a new height before
    its layout; the layout then found nothing moved, and the lines of what moved stayed as they
    were on screen. The lean compositor compares a layout with the last layout, and marks for
    repaint what a look-up moved."""

    class Host(App[None]):
        def on_mount(self) -> None:
            self.push_screen(_Lean())

    app = Host()
    async with app.run_test(size=(40, 10)) as pilot:
        await pilot.pause()
        screen = app.screen
        compositor = screen._compositor
        assert isinstance(compositor, LeanCompositor)
        top, below = screen.query_one("#top", Static), screen.query_one("#below", Static)
        for text in ("three\nlines\nnow", "one again"):
            was = compositor.find_widget(below).region
            top.update(text)
            top._check_refresh()  # its idle: the arrangement caches cleared, the layout posted
            compositor._dirty_regions.clear()
            compositor._full_map_invalidated = True  # as a repaint of a widget off screen left it
            compositor.find_widget(screen.query_one("#r29"))  # a look-up arranges the map now
            moved = compositor.find_widget(below).region
            assert moved != was
            compositor.reflow(screen, screen.size)  # the layout the screen runs next
            dirty = Region.from_union(list(compositor._dirty_regions))
            assert dirty.contains_region(was) and dirty.contains_region(moved), text
            await pilot.pause()


def test_the_fast_truecolor_filter_gives_textuals_segments():
    """FastTruecolor (every line painted passes through it) against Textual's own filter, on
    random segments: named, dim, background and truecolor styles, no style, control codes."""
    import random

    from rich.segment import Segment
    from rich.style import Style
    from rich.terminal_theme import MONOKAI
    from textual.color import Color
    from textual.filter import ANSIToTruecolor

    from spoc_tui.tui.textual_private import FastTruecolor

    textual_filter, fast = ANSIToTruecolor(MONOKAI), FastTruecolor(MONOKAI)
    styles = [
        None,
        Style(color="green"),
        Style(color="red", dim=True),
        Style(bgcolor="blue"),
        Style(color="#102030"),
        Style(bold=True),
        Style.parse("dim"),
        Style(color="bright_cyan", bgcolor="grey15"),
        Style(color="rgb(1,2,3)", dim=True),
    ]
    rnd = random.Random(7)
    for _ in range(500):
        segments = [
            Segment(rnd.choice(["ab", " ", "x"]), rnd.choice(styles), rnd.choice([None, None, [(1,)]]))
            for _ in range(rnd.randint(0, 12))
        ]
        background = rnd.choice([Color(0, 0, 0), Color(30, 40, 50)])
        assert fast.apply(segments, background) == textual_filter.apply(segments, background)


def test_a_lean_strip_is_a_strip_in_every_way():
    from rich.console import Console
    from rich.segment import Segment
    from rich.style import Style
    from textual.strip import Strip

    from spoc_tui.tui.textual_private import LeanStrip

    segments = [Segment("hello ", Style(color="red")), Segment("world", None)]
    lean, strip = LeanStrip(segments), Strip(segments)
    assert lean.cell_length == strip.cell_length == 11
    assert list(lean.crop(1, 7)) == list(strip.crop(1, 7))
    assert [list(p) for p in lean.divide([3, 8, 11])] == [list(p) for p in strip.divide([3, 8, 11])]
    assert list(lean.adjust_cell_length(20)) == list(strip.adjust_cell_length(20))
    assert list(lean.apply_style(Style(bold=True))) == list(strip.apply_style(Style(bold=True)))
    assert lean.render(Console()) == strip.render(Console())
    assert lean.crop(1, 7) is lean.crop(1, 7)  # its caches work once made
    with pytest.raises(AttributeError):
        _ = lean.no_such_attribute  # type: ignore[attr-defined]
