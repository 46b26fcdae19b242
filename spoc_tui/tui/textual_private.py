"""Every use of Textual's private API in spoc-tui, fenced in this one module (issue 51).

Textual is pinned at one patch release (pyproject.toml). What here reaches into its privates:

- **The lean compositor** (:class:`LeanCompositor`, :class:`LeanRefresh`, :class:`LeanStrip`):
  a partial repaint that renders only the lines that changed. Textual 8.2.8 repaints a partial
  update by cropping to the bounding box of every changed region, then asks *every* widget
  inside that box for all its visible lines, and uses only those on the changed lines. On the
  monitor the box is nearly the whole screen each second (a figure in the servers table at the
  top, a chart's title at the bottom): thirty widgets rendered, two dozen lines used. This
  compositor asks each widget only for the span of changed lines it overlaps, and skips the
  widgets that overlap none or whose every changed cell a widget in front covers; what reaches
  the terminal is the same, line for line (tests/tui/test_compositor.py compares it with
  Textual's own on the monitor). :class:`LeanRefresh` is its widgets' side: repaints requested
  without messages, plain lines framed without Textual's styles cache.
- **The fast truecolor filter** (:class:`FastTruecolor`, :class:`FastTruecolorApp`), swapped into
  the app's private filter list.
- **The quiet driver** (:class:`QuietDriver`): Textual's, with an input thread that sleeps while
  nothing is typed. Textual 8.2.8's input thread wakes ten times a second to ask whether a
  half-typed escape sequence (a lone Esc) has timed out and whether the app is closing: on the
  monitor at 160x48 that was 0.15 % of a core, a seventh of the whole process. Here it waits on
  the terminal and on a wake-up pipe, and polls at Textual's 0.1 s only while a sequence is
  pending; closing the app (the driver's exit event) writes to the pipe, so quitting is as prompt
  as before. A wait is still cut at :data:`IDLE_WAIT_S` in case anything else is ever waited
  for. The loop is Textual's own (``LinuxDriver.run_input_thread``, same parser, same decoding
  and dispatch) but for the wait.

:data:`PRIVATES` lists each private name used here and where Textual defines it;
tests/unit/test_textual_privates.py checks every one against the installed Textual, so an upgrade
that moves one fails a test, not a terminal. No other module of the package names a Textual
private (the same test checks that too).
"""

from __future__ import annotations

import os
import selectors
import threading
import time
from bisect import bisect_left
from codecs import getincrementaldecoder
from collections.abc import Iterable, Sequence
from threading import Event
from typing import Any, NamedTuple, Self

from rich.color import Color as RichColor
from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.terminal_theme import TerminalTheme
from textual._compositor import ChopsUpdate, Compositor, CompositorMap, ReflowResult
from textual._loop import loop_last
from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.app import App, ReturnType
from textual.cache import FIFOCache
from textual.color import Color
from textual.dom import NoScreen
from textual.drivers.linux_driver import LinuxDriver
from textual.filter import ANSIToTruecolor, LineFilter
from textual.geometry import Region, Size
from textual.screen import Screen
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.widget import Widget

_STRIP_CACHES = {
    "_divide_cache": 4,
    "_crop_cache": 16,
    "_style_cache": 16,
    "_filter_cache": 4,
    "_line_length_cache": 4,
    "_crop_extend_cache": 4,
    "_offsets_cache": 4,
}
"""Textual's ``Strip`` makes these seven caches (with their sizes) for every strip, used or not."""


class LeanStrip(Strip):
    """A ``Strip`` whose caches are made when first used: Textual makes seven for every strip,
    and most of the monitor's strips (a row, a plot line, a title) use one or none; making them
    was a fifth of the compositor's pass. Otherwise a ``Strip`` in every way."""

    __slots__ = ()

    def __init__(self, segments: Iterable[Segment], cell_length: int | None = None) -> None:
        self._segments = list(segments)
        self._cell_length = cell_length
        self._render_cache = None
        self._link_ids = None
        self._cell_count = None

    def __getattr__(self, name: str) -> FIFOCache[object, object]:
        size = _STRIP_CACHES.get(name)
        if size is None:
            raise AttributeError(name)
        cache: FIFOCache[object, object] = FIFOCache(size)
        setattr(self, name, cache)
        return cache


class LeanCompositor(Compositor):
    def __init__(self) -> None:
        super().__init__()
        self._laid_out: CompositorMap = {}
        """The map as of the last layout: the next layout is compared with it, whatever was
        arranged in between."""

    def update_widgets(self, widgets: set[Widget]) -> None:
        # Textual lays the whole screen out again at the next look-up whenever a widget to repaint
        # is off screen (meant for a widget just mounted); a chart below the fold is not new, so
        # only a widget the map does not hold yet is a reason to (that look-up had been a full
        # arrange of the monitor every second, and picked up sizes ahead of their layout)
        if not self._full_map_invalidated and not widgets.issubset(self._full_map.keys()):
            self._full_map_invalidated = True
        visible = self.visible_widgets
        regions: list[Region] = []
        for widget in visible.keys() & widgets:
            region, clip = visible[widget]
            offset = region.offset
            for dirty in widget._exchange_repaint_regions():
                if update := clip.intersection(dirty.translate(offset)):
                    regions.append(update)
        self._dirty_regions.update(regions)

    @property
    def full_map(self) -> CompositorMap:
        """As Textual's, and a map arranged again between layouts marks what moved for repaint (a
        look-up can arrange it while a widget's new size waits for its layout: Textual then
        compared the layout with that map, found nothing moved, and left the old lines on
        screen)."""
        if self.root is None or not self._full_map_invalidated:
            return super().full_map
        old = self._full_map
        new = super().full_map
        self._mark_moved(old, new)
        return new

    def reflow(self, parent: Widget, size: Size) -> ReflowResult:
        # compared with the last layout (not a map arranged since), so every widget moved or
        # resized since then is repainted and told of its new size
        if self._laid_out:
            self._full_map = self._laid_out
        result = super().reflow(parent, size)
        self._laid_out = self._full_map
        return result

    def _mark_moved(self, old: CompositorMap, new: CompositorMap) -> None:
        if self.size.region in self._dirty_regions:
            return
        for _, geometry in new.items() ^ old.items():
            if region := geometry.clip.intersection(geometry.region):
                self._dirty_regions.add(region)

    def render_partial_update(self) -> ChopsUpdate | None:
        if self.root is not None and self._full_map_invalidated and self._visible_map is None:
            # arranged before rendering, not by a widget's look-up halfway through (after a scroll
            # the visible map answers those look-ups)
            _ = self.full_map
        update_regions = self._dirty_regions.copy()
        self._dirty_regions.clear()
        if not update_regions:
            return None
        crop = Region.from_union(update_regions).intersection(self.size.region)
        spans = list(self._regions_to_spans(update_regions))
        changed: dict[int, list[tuple[int, int]]] = {}
        for y, x0, x1 in spans:
            changed.setdefault(y, []).append((x0, x1))
        lines = sorted(changed)
        chops = self._chops_on(crop, lines, changed)
        chop_ends = [cut_set[1:] for cut_set in self.cuts]
        return ChopsUpdate(chops, spans, chop_ends)

    def _chops_on(
        self, crop: Region, lines: list[int], changed: dict[int, list[tuple[int, int]]]
    ) -> list[dict[int, Strip | None]]:
        """As ``Compositor._render_chops`` for the given lines, each widget rendered over the
        changed lines it overlaps only (front to back: the first strip for a cut wins), and not at
        all where the widgets in front cover it (a panel's background under its table, the
        screen's under every panel, the scroll bar beside a changed row: most of what was rendered
        each second, to be discarded). ``changed``: each line's changed spans of columns. Only the
        changed lines get chops (the update reads no other); a widget's cuts on a line are found
        by bisection, not by scanning the line's every cut."""
        cuts = self.cuts
        unread: dict[int, Strip | None] = {}
        chops: list[dict[int, Strip | None]] = [unread] * len(cuts)
        for y in lines:
            chops[y] = dict.fromkeys(cuts[y][:-1])
        overlaps = crop.overlaps
        for widget, (region, clip) in self.visible_widgets.items():
            if not overlaps(clip):
                continue
            area = region.intersection(clip)
            if not area.width or not area.height:
                continue
            i, j = bisect_left(lines, area.y), bisect_left(lines, area.bottom)
            if i == j:
                continue
            x0 = area.x
            first_cut, last_cut = area.column_span
            container = bool(widget._nodes)
            for y0, y1 in _runs(lines, i, j):
                # each changed line here: its cuts within the widget, if any of its columns changed
                todo: dict[int, list[int]] = {}
                open_cell = not container
                for y in lines[bisect_left(lines, y0, i, j) : bisect_left(lines, y1, i, j)]:
                    spans = changed[y]
                    if not any(a < last_cut and b > first_cut for a, b in spans):
                        continue  # none of its columns changed on this line (the scroll bar)
                    line_cuts = cuts[y]
                    lo, hi = bisect_left(line_cuts, first_cut), bisect_left(line_cuts, last_cut)
                    todo[y] = line_cuts[lo : hi + 1]  # its cells' starts, and its end
                    if not open_cell:
                        got = chops[y].get
                        open_cell = any(
                            got(cut) is None and any(a < end and b > cut for a, b in spans)
                            for cut, end in zip(line_cuts[lo:hi], line_cuts[lo + 1 : hi + 1])
                        )
                if not todo or not open_cell:
                    continue  # a container whose every changed cell here is a child's
                lines_crop = Region(area.x - region.x, y0 - region.y, area.width, y1 - y0)
                if isinstance(widget, LeanRefresh):
                    strips = widget.render_lines(lines_crop, region.size)
                else:
                    strips = widget.render_lines(lines_crop)
                for y, mine in todo.items():
                    line = chops[y]
                    get = line.get
                    for cut, piece in zip(mine, strips[y - y0].divide([cut - x0 for cut in mine[1:]])):
                        if get(cut) is None:
                            line[cut] = piece
        return chops


GAP = 10
"""Changed lines this close are rendered in one call: a call costs about what fifteen cached lines
do (measured on the monitor), so only a long gap is worth a second call."""


def _runs(lines: list[int], i: int, j: int) -> list[tuple[int, int]]:
    """The changed lines ``lines[i:j]`` (sorted) as spans ``[y0, y1)`` to render: a widget whose
    first and last changed lines are far apart (the charts' grid, with a title row changing at
    its top and another at its bottom) renders those, not every line between."""
    runs: list[tuple[int, int]] = []
    y0 = prev = lines[i]
    for y in lines[i + 1 : j]:
        if y - prev > GAP:
            runs.append((y0, prev + 1))
            y0 = y
        prev = y
    runs.append((y0, prev + 1))
    return runs


class _Frame(NamedTuple):
    """What a plain widget's lines are framed with (see :meth:`LeanRefresh.render_lines`)."""

    outer: Size
    key: tuple[object, ...]
    content_width: int
    content_height: int
    pad_left: int
    pad_right: int
    inner: RichStyle
    background: Color


class LeanRefresh(Widget):
    """A widget whose repaints go straight to its screen's list of dirty widgets, and whose lines,
    when it has no border, outline, vertical padding, tint, opacity or title, are framed here
    rather than by Textual's styles cache.

    Textual's ``refresh`` marks the widget dirty, then wakes the widget's own message loop (a
    Prompt) so that, when idle, it posts an Update to its screen, which wakes the screen's loop to
    note it: two messages and two task switches per widget per repaint. The monitor repaints about
    fifteen widgets a second, so those messages cost more than drawing the lines. This does what
    the screen's Update handler does, at once; a re-layout, a recompose, a widget not yet mounted
    or hidden, or a screen not yet laid out take Textual's own path.
    """

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False) -> Self:
        if repaint and not (layout or recompose or self._closing) and self._is_mounted and self.display:
            try:
                screen = self.screen
            except NoScreen:
                pass
            else:
                if screen in screen._compositor:
                    self._layout_cache.clear()
                    self._set_dirty(*regions)
                    self.clear_cached_dimensions()
                    self._rich_style_cache.clear()
                    screen._dirty_widgets.add(self)
                    screen.check_idle()
                    return self
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    _own_style: RichStyle | None = None

    def own_style(self) -> RichStyle:
        """The widget's style (worked out from every ancestor), kept until its styles change: it
        cost as much as laying out the row or the title drawn with it."""
        style = self._own_style
        if style is None:
            style = self._own_style = self.rich_style
        return style

    _frame: _Frame | None = None

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._frame = None
        self._own_style = None

    def render_lines(self, crop: Region, outer: Size | None = None) -> list[Strip]:
        """As Textual's styles cache renders a widget's lines (content, side padding, the app's
        filters), for a plain widget: the cache works out every ancestor's background, size and
        opacity, and makes four strips a line, each time a line changes (a fifth of the
        monitor's repaint). ``outer``: the widget's size in the map the caller holds (None: looked
        up)."""
        frame = self._frame
        if outer is None:
            outer = self.region.size
        key = (self.app.theme, self.app.ansi_color)
        if frame is None or frame.outer != outer or frame.key != key:
            frame = self._frame = self._plain_frame(outer, key)
        if frame is None or (self.auto_links and self.hover_style._link_id):
            return super().render_lines(crop)
        width = frame.outer.width
        inner, background = frame.inner, frame.background
        filters = self.app.get_line_filters()
        render_line = self.render_line
        # filtered before it is padded: a line the widget keeps (a table's row, a chart's plot)
        # is then filtered once, not each time it is painted; the padding is filtered once a frame
        # (every filter maps each segment on its own, so the result is the same)
        pads = self._pads(frame, filters)
        strips: list[Strip] = []
        self._painting = Size(frame.content_width, frame.content_height)
        try:
            for y in crop.line_range:
                if y < frame.content_height:
                    line = render_line(y).adjust_cell_length(frame.content_width, inner)
                else:
                    line = Strip.blank(frame.content_width, inner)
                for line_filter in filters:  # as Strip.apply_filter, into a lean strip
                    cache = line._filter_cache
                    filtered = cache.get((line_filter, background))
                    if filtered is None:
                        filtered = LeanStrip(line_filter.apply(line._segments, background), line._cell_length)
                        cache[(line_filter, background)] = filtered
                    line = filtered
                if pads is not None:
                    line = LeanStrip([*pads[0], *line._segments, *pads[1]], width)
                strips.append(line)
        finally:
            self._painting = None
        if crop.column_span != (0, width):
            x1, x2 = crop.column_span
            strips = [strip.crop(x1, x2) for strip in strips]
        return strips

    _painting: Size | None = None

    def paint_size(self) -> Size:
        """The content's size: while its lines are painted here, as the frame has it (``size``
        looks the widget up in the screen's map, on every line)."""
        return self._painting or self.size

    _padding: tuple[_Frame, list[LineFilter], tuple[list[Segment], list[Segment]]] | None = None

    def _pads(self, frame: _Frame, filters: Sequence[LineFilter]) -> tuple[list[Segment], list[Segment]] | None:
        """The side padding's segments as filtered (None: no padding), worked out once a frame."""
        if not frame.pad_left and not frame.pad_right:
            return None
        kept = self._padding
        if kept is not None and kept[0] is frame and kept[1] == list(filters):
            return kept[2]
        # as Textual pads a line (textual._segment_tools.line_pad)
        left = Strip([Segment(" " * frame.pad_left, frame.inner)] if frame.pad_left else [])
        right = Strip([Segment(" " * frame.pad_right, frame.inner)] if frame.pad_right else [])
        for line_filter in filters:
            left = left.apply_filter(line_filter, frame.background)
            right = right.apply_filter(line_filter, frame.background)
        pads = (list(left), list(right))
        self._padding = (frame, list(filters), pads)
        return pads

    def _plain_frame(self, outer: Size, key: tuple[object, ...]) -> _Frame | None:
        """This widget's frame, or None where Textual's own rendering is needed."""
        styles = self.styles
        pad_top, pad_right, pad_bottom, pad_left = styles.padding
        if (
            self.BLANK
            or pad_top
            or pad_bottom
            or any(edge for edge, _ in styles.border)
            or any(edge for edge, _ in styles.outline)
            or styles.tint.a
            or styles.text_opacity != 1.0
            or styles.has_rule("hatch")
            or self.opacity != 1.0
            or self._border_title is not None
            or self._border_subtitle is not None
        ):
            return None
        base_background, background = self.background_colors
        inner = TextualStyle(background=base_background + background).rich_style
        return _Frame(
            outer, key, outer.width - pad_left - pad_right, outer.height, pad_left, pad_right, inner, background
        )


class FastTruecolor(ANSIToTruecolor):
    """Textual's ANSI-to-truecolor filter (every line painted passes through it), with each
    style's conversion looked up in a plain dictionary and a segment whose style it leaves alone
    kept as it is: a third of the filter's cost, the same segments out. Installed by
    :func:`install_fast_truecolor`."""

    MEMO = 4096

    def __init__(self, terminal_theme: TerminalTheme, enabled: bool = True) -> None:
        super().__init__(terminal_theme, enabled=enabled)
        self._memo: dict[RichColor, dict[RichStyle, RichStyle]] = {}

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        bg = background.rich_color
        memo = self._memo.get(bg)
        if memo is None or len(memo) > self.MEMO:
            memo = self._memo[bg] = {}
        convert = self.truecolor_style
        out: list[Segment] = []
        append = out.append
        for segment in segments:
            text, style, control = segment
            if style is None:
                append(segment if control is None else Segment(text))
                continue
            new = memo.get(style)
            if new is None:
                new = memo[style] = convert(style, bg)
            append(segment if new is style and control is None else Segment(text, new))
        return out


def install_fast_truecolor(filters: list[LineFilter]) -> None:
    """Swap Textual's ANSI-to-truecolor filter in an app's filter list (``App._filters``) for
    :class:`FastTruecolor`, keeping its theme and whether it is enabled."""
    for i, line_filter in enumerate(filters):
        if type(line_filter) is ANSIToTruecolor:
            filters[i] = FastTruecolor(line_filter._terminal_theme, enabled=line_filter.enabled)


class FastTruecolorApp(App[ReturnType]):
    """An app whose truecolor filter is :class:`FastTruecolor` (installed now, and again when
    Textual puts a filter of its own back on a theme change)."""

    def install_fast_truecolor(self) -> None:
        install_fast_truecolor(self._filters)

    def _refresh_truecolor_filter(self, theme: TerminalTheme) -> None:
        super()._refresh_truecolor_filter(theme)
        install_fast_truecolor(self._filters)


def use_lean_compositor(screen: Screen[Any]) -> None:
    """``screen`` repaints with :class:`LeanCompositor` (only the changed lines), from now on."""
    screen._compositor = LeanCompositor()


PRIVATES: dict[str, tuple[str, ...]] = {
    # module -> private names imported from it
    "textual._compositor": ("ChopsUpdate", "Compositor", "CompositorMap", "ReflowResult"),
    "textual._loop": ("loop_last",),
    "textual._parser": ("ParseError",),
    "textual._xterm_parser": ("XTermParser",),
    # class -> private attributes and methods this module reads, sets or overrides
    "textual._compositor.Compositor": (
        "_full_map", "_full_map_invalidated", "_visible_map", "_dirty_regions", "_regions_to_spans", "_render_chops",
    ),
    "textual.widget.Widget": (
        "_exchange_repaint_regions", "_nodes", "_closing", "_is_mounted", "_layout_cache", "_set_dirty",
        "_rich_style_cache", "_border_title", "_border_subtitle", "_render_cache",
    ),
    "textual.screen.Screen": ("_compositor", "_dirty_widgets"),
    "textual.strip.Strip": ("_segments", "_cell_length", "_cell_count", "_link_ids", *_STRIP_CACHES),
    "textual.filter.ANSIToTruecolor": ("_terminal_theme",),
    "textual.app.App": ("_filters", "_refresh_truecolor_filter"),
    "textual.driver.Driver": ("_app", "_debug"),
    "textual.drivers.linux_driver.LinuxDriver": ("_writer_thread", "run_input_thread"),
    "textual._parser.Parser": ("_timeout_time",),
    "textual.drivers._writer_thread.WriterThread": ("_queue",),
    "rich.style.Style": ("_link_id",),
}  # fmt: skip
"""Each Textual private this module uses, by where Textual defines it (pinned by
tests/unit/test_textual_privates.py)."""


# -- the quiet driver ----------------------------------------------------------------------

HANGUP_GRACE_S = 5.0
"""How long the app has to exit by itself once its terminal is gone, before the process ends."""
IDLE_WAIT_S = 1.0
"""The longest wait with nothing typed and nothing pending."""
PENDING_WAIT_S = 0.1
"""The wait while an escape sequence is pending (Textual's)."""


class _WakingEvent(Event):
    """An Event whose ``set`` also wakes a thread waiting on :attr:`read_fd`."""

    def __init__(self) -> None:
        super().__init__()
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)

    def set(self) -> None:
        super().set()
        try:
            os.write(self._write_fd, b"x")
        except (BlockingIOError, OSError):
            pass  # full (already woken) or closed: the wait is bounded anyway

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        """Close the pipe, once (a second close could hit a descriptor since reused)."""
        fds, self.read_fd, self._write_fd = (self.read_fd, self._write_fd), -1, -1
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


class QuietDriver(LinuxDriver):
    """Textual's Linux/macOS driver whose input thread sleeps while nothing is typed."""

    exit_event: _WakingEvent

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.exit_event = _WakingEvent()

    def close(self) -> None:
        super().close()
        self.exit_event.close()

    def terminal_gone(self) -> None:
        """The terminal hung up (its other side closed: a pseudo-terminal that was not our controlling
        terminal sends no SIGHUP). The app exits as on ``q``; should it not within
        :data:`HANGUP_GRACE_S` (a write to the dead terminal blocking), the process ends as a
        hang-up ends it. Before this, the input thread read end-of-file in a loop at 90 % of a core."""

        def last_resort() -> None:
            time.sleep(HANGUP_GRACE_S)
            os._exit(129)  # 128 + SIGHUP, as a hang-up ends a process

        threading.Thread(target=last_resort, name="spoc-hangup", daemon=True).start()
        self._quiet_dead_terminal()
        app = self._app

        def ask_exit() -> None:
            try:
                app.call_from_thread(app.exit)
            except RuntimeError:  # the app is not running (any more): nothing to stop
                pass

        # from a thread of its own: the app's exit joins this input thread, which must not wait on it
        threading.Thread(target=ask_exit, name="spoc-exit", daemon=True).start()

    def _quiet_dead_terminal(self) -> None:
        """Let the app's last writes go nowhere instead of failing: the standard output and error
        that are the dead terminal now write to /dev/null, and should Textual's writer thread have
        died of a write to it (EIO), its queue is emptied (else the app blocks on a full queue and
        cannot exit)."""
        try:
            tty = os.fstat(self.fileno)
            null = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            return
        try:
            for fd in (1, 2):
                try:
                    st = os.fstat(fd)
                except OSError:
                    continue
                if st.st_rdev == tty.st_rdev and st.st_ino == tty.st_ino and st.st_dev == tty.st_dev:
                    os.dup2(null, fd)
        finally:
            os.close(null)
        writer = getattr(self, "_writer_thread", None)  # Textual's (pinned) LinuxDriver keeps it so
        queue = getattr(writer, "_queue", None)
        if writer is None or queue is None:
            return

        def drain() -> None:
            writer.join()  # ended: of the failed write, or as the app stopped it
            while True:
                queue.get()

        threading.Thread(target=drain, name="spoc-drain", daemon=True).start()

    def run_input_thread(self) -> None:
        """Wait for input and dispatch events (Textual's loop; only the wait and the end of the
        input differ)."""
        exit_event = self.exit_event
        exit_event.drain()  # a wake-up left from the last time input was stopped
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        selector.register(exit_event.read_fd, selectors.EVENT_READ)

        fileno = self.fileno
        is_terminal = os.isatty(fileno)
        reading = [True]
        EVENT_READ = selectors.EVENT_READ
        parser = XTermParser(self._debug)
        feed = parser.feed
        tick = parser.tick
        decode = getincrementaldecoder("utf-8")().decode
        read = os.read

        def process_selector_events(
            selector_events: list[tuple[selectors.SelectorKey, int]], final: bool = False
        ) -> None:
            typed = [(key, mask) for key, mask in selector_events if key.fd == fileno]
            for last, (_key, mask) in loop_last(typed):
                if mask & EVENT_READ:
                    try:
                        raw = read(fileno, 1024 * 4)
                    except OSError:  # EIO: the terminal's other side is closed
                        raw = b""
                    if not raw:
                        # the end of the input: stop watching it (it reads as ready for ever); a
                        # terminal that hung up ends the app, a closed pipe leaves it running
                        selector.unregister(fileno)
                        reading[0] = False
                        if is_terminal:
                            self.terminal_gone()
                        break
                    unicode_data = decode(raw, final=final and last)
                    for event in feed(unicode_data):
                        self.process_message(event)
            for event in tick():
                self.process_message(event)

        def wait() -> float:
            return PENDING_WAIT_S if parser._timeout_time is not None else IDLE_WAIT_S

        try:
            while not exit_event.is_set():
                process_selector_events(selector.select(wait()))
            if reading[0]:
                selector.unregister(self.fileno)
                process_selector_events(selector.select(PENDING_WAIT_S), final=True)
        finally:
            selector.close()
            try:
                for _event in feed(""):
                    pass
            except (EOFError, ParseError):
                pass
