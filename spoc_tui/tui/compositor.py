"""A partial repaint that renders only the lines that changed (the live screens' compositor).

Textual 8.2.8 repaints a partial update by cropping to the bounding box of every changed region,
then asks *every* widget inside that box for all its visible lines, and uses only those on the
changed lines. On the monitor the box is nearly the whole screen each second (a figure in the
servers table at the top, a chart's title at the bottom): thirty widgets rendered, two dozen
lines used. This compositor asks each widget only for the span of changed lines it overlaps, and
skips the widgets that overlap none; what reaches the terminal is the same, line for line
(tests/tui/test_compositor.py compares it with Textual's own on the monitor).

It overrides one method of Textual's private ``Compositor``; the package pins Textual's version,
and the test above fails if that method's shape changes under an upgrade.
"""

from __future__ import annotations

from bisect import bisect_left

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.strip import Strip


class LeanCompositor(Compositor):
    def render_partial_update(self) -> ChopsUpdate | None:
        update_regions = self._dirty_regions.copy()
        self._dirty_regions.clear()
        if not update_regions:
            return None
        crop = Region.from_union(update_regions).intersection(self.size.region)
        spans = list(self._regions_to_spans(update_regions))
        lines = sorted({y for y, _, _ in spans})
        chops = self._chops_on(crop, lines)
        chop_ends = [cut_set[1:] for cut_set in self.cuts]
        return ChopsUpdate(chops, spans, chop_ends)

    def _chops_on(self, crop: Region, lines: list[int]) -> list[dict[int, Strip | None]]:
        """As ``Compositor._render_chops`` for the given lines, each widget rendered over the
        changed lines it overlaps only (front to back: the first strip for a cut wins)."""
        cuts = self.cuts
        chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
        rendered = set(lines)
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
            for y0, y1 in _runs(lines, i, j):
                strips = widget.render_lines(Region(area.x - region.x, y0 - region.y, area.width, y1 - y0))
                for y, strip in zip(range(y0, y1), strips):
                    if y not in rendered:
                        continue
                    line = chops[y]
                    final_cuts = [cut for cut in cuts[y] if last_cut >= cut >= first_cut]
                    get = line.get
                    for cut, piece in zip(final_cuts, strip.divide([cut - x0 for cut in final_cuts[1:]])):
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
