"""``spoc report``: one self-contained HTML page for a ramp, a study or a comparison of two ramps.

The page holds everything it shows (inline SVG charts, inline styles) and forbids itself any
request (its Content-Security-Policy allows no source at all): it opens from a ticket, a mail or a
file share with no server and no network. The same charts are written beside it as SVG files.
Every text passes the one redactor (:func:`spoc_tui.core.redact.redact_text`) and is escaped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from spoc_tui.core import fmt
from spoc_tui.core.analysis.compare import Comparison, comparison_text
from spoc_tui.core.ramp.sla import LevelUnit, Limit, parse_sla
from spoc_tui.core.ramp.steps import StepSummary
from spoc_tui.core.ramp.steps.sessions import share_text
from spoc_tui.core.ramp.text import check_lines, knee_sentence
from spoc_tui.core.redact import redact_text
from spoc_tui.core.results import RampDoc
from spoc_tui.core.textsafe import lines_safe
from spoc_tui.core.tuning.docs import MemberDoc, StudyDoc, TrialRecord
from spoc_tui.report.svg import PALETTE, Chart, Point, Series, render

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
"""Nothing may load: no script, no font, no image from anywhere (the page is whole as it is)."""

STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
th { background: #f0f0f0; } td.l, th.l { text-align: left; }
.headline { font-size: 16px; font-weight: bold; padding: 8px 12px; background: #fdf3e1;
  border-left: 4px solid #b9770e; }
.meets { color: #2e7d32; } .breaks { color: #c0392b; font-weight: bold; } .inconclusive { color: #8a6d1f; }
.note { color: #666; font-size: 12px; }
pre { font-size: 11px; background: #f7f7f7; padding: 8px; white-space: pre-wrap; }
.charts svg { margin: 6px 0; max-width: 100%; height: auto; }
"""


@dataclass
class Report:
    """A page and its charts (name -> SVG), ready to write."""

    title: str
    html: str
    charts: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.title = lines_safe(redact_text(self.title))  # as the page shows it: from files, made inert


def _t(text: object) -> str:
    """Text for the page: redacted, each line cut and its control characters and bidi overrides
    made visible (a U+202E reversed the title; NUL is no XML), then escaped."""
    return escape(lines_safe(redact_text(str(text))))


def _page(title: str, body: list[str]) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            f"<title>{_t(title)}</title><style>{STYLE}</style></head><body>",
            f"<h1>{_t(title)}</h1>",
            *body,
            f'<p class="note">Written by spoc-tui on {_t(stamp)}. Intervals are 95 %.</p>',
            "</body></html>",
        ]
    )


def _table(head: Sequence[str], rows: Sequence[Sequence[object]], left: int = 1) -> str:
    out = ["<table><tr>" + "".join(f'<th class="{"l" if i < left else ""}">{_t(h)}</th>' for i, h in enumerate(head))]
    out[0] += "</tr>"
    for r in rows:
        cells = []
        for i, v in enumerate(r):
            cls = "l" if i < left else ""
            text = _t(v)
            if v in ("meets", "breaks", "inconclusive"):
                cls += f" {v}"
            cells.append(f'<td class="{cls.strip()}">{text}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _num(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "?"


def _unit_label(unit: LevelUnit) -> str:
    return {"users": "concurrent users", "req/s": "arrival rate (req/s)", "x": "speed (x the trace)"}[unit]


def _limits(doc: RampDoc) -> list[Limit]:
    try:
        return list(parse_sla(",".join(doc.sla))) if doc.sla else []
    except ValueError:
        return []


def ramp_charts(doc: RampDoc) -> dict[str, str]:
    """One chart per SLA limit (its figure against the level, with intervals, the limit and the
    knee's interval), and output tokens/s."""
    steps = sorted(doc.steps, key=lambda s: s.level)
    unit = doc.knee.unit
    inf = doc.knee.inferred
    band = inf.ci95 if inf is not None and inf.boundary != "bound" else None
    vline = (
        (f"knee {inf.estimate:.3g}", inf.estimate)
        if inf is not None and inf.estimate is not None and inf.boundary != "bound"
        else None
    )
    levels = [s.level for s in steps]
    log_x = bool(levels) and min(levels) > 0 and max(levels) / min(levels) >= 8
    charts: dict[str, str] = {}
    for i, lim in enumerate(_limits(doc)):
        pts = []
        for s in steps:
            lo, hi = s.interval(lim)
            pts.append(Point(s.level, s.value(lim), lo, hi))
        rate = lim.metric == "error_rate"
        chart = Chart(
            title=f"{lim.key} against load (limit {lim})",
            x_label=_unit_label(unit),
            y_label="error rate" if rate else f"{lim.metric.upper()} {lim.stat}",
            series=[Series(lim.key, pts, PALETTE[i % len(PALETTE)])],
            hlines=[(f"limit {lim}", lim.value)],
            band=band,
            vline=vline,
            log_x=log_x,
            y_fmt="n" if rate else "s",
        )
        charts[f"{lim.key}.svg"] = render(chart)
    tput = [
        Point(s.level, s.output_tokens_per_s, s.ci95.output_tokens_per_s[0], s.ci95.output_tokens_per_s[1])
        for s in steps
    ]
    charts["output_tokens_per_s.svg"] = render(
        Chart(
            "output tokens/s against load",
            _unit_label(unit),
            "output tokens/s",
            [Series("output tokens/s", tput, PALETTE[2])],
            band=band,
            vline=vline,
            log_x=log_x,
            y_fmt="n",
        )
    )
    return charts


def _server_row(s: StepSummary) -> list[object]:
    v = s.server
    hot = [g.gpu for g in v.gpus or () if g.throttle_reasons]
    return [
        s.level_text,
        fmt.num(v.waiting_max),
        fmt.num(v.running_max),
        fmt.pct(v.kv_cache_usage_max),
        fmt.num(v.preemptions_per_s),
        fmt.pct(v.prefix_cache_hit_rate),
        fmt.seconds(v.ttft_p99),
        ", ".join(hot) or ("none" if v.gpus else "n/a"),
    ]


SESSION_COLUMNS = ("level", "active", "started", "finished", "whole", "every call met (95 %)", "calls each",
                   "in the engine")  # fmt: skip


def _sessions_row(s: StepSummary) -> list[object]:
    ss = s.sessions
    assert ss is not None
    lo, hi = ss.all_met_ci95
    share = ss.all_met_share
    met = f"{ss.all_met} of {ss.whole}: {share_text(share)} ({share_text(lo)}-{share_text(hi)})" if ss.whole else "-"
    eng = ss.engine_share
    return [
        s.level_text,
        ss.active,
        ss.started,
        "?" if ss.finished is None else ss.finished,
        ss.whole,
        met,
        "-" if ss.calls is None else f"{ss.calls:.1f}",
        "-" if eng is None else f"{eng * 100:.0f} %",
    ]


def _shadow_section(doc: RampDoc) -> list[str]:
    """The twin beside each step, where the ramp ran with one (``spoc ramp --twin``): its
    prediction of each figure, made as the step was measured, and whether the interval held it."""
    rows, held, n = [], 0, 0
    for s in sorted(doc.steps, key=lambda s: s.step):
        for key, measured, predicted, (lo, hi) in s.beside_shadow():
            inside = None if measured is None or lo is None or hi is None else lo <= measured <= hi
            held, n = held + bool(inside), n + (inside is not None)
            seconds = key != "output_tokens_per_s"
            show = fmt.seconds if seconds else (lambda v: "-" if v is None else f"{v:,.0f}")
            iv = f"{show(lo)}-{show(hi)}" if lo is not None and hi is not None else "-"
            mark = "-" if inside is None else "yes" if inside else "NO"
            rows.append([s.level_text, key, show(measured), show(predicted), iv, mark])
    if not rows:
        return []
    twin = next(s.shadow.twin for s in doc.steps if s.shadow is not None)
    return [
        f"<h2>The twin beside each step ({_t(twin)}, predicted as the ramp ran)</h2>",
        f"<p>Its 95 % intervals held {held} of {n} measured figures.</p>",
        _table(["level", "figure", "measured", "predicted", "95 % interval", "held"], rows, left=2),
    ]


def ramp_report(doc: RampDoc) -> Report:
    title = f"Load ramp: {doc.model} at {doc.url}"
    knee, _ = knee_sentence(doc.knee)
    inf = doc.knee.inferred
    body = [f'<div class="headline">{_t(knee)}</div>']
    if inf is not None:
        body.append(f"<p><b>Knee across steps:</b> {_t(inf.text)}</p>")
    if doc.knee.reason:
        body.append(f"<p><b>Why:</b> {_t(doc.knee.reason)}</p>")
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(doc.started_at)) if doc.started_at else "?"
    body.append(
        f'<p class="note">Status {_t(doc.status)} · started {_t(started)} · levels {_t(doc.plan)} · '
        f"SLA {_t(', '.join(doc.sla))}" + (f" · stopped: {_t(doc.stop_reason)}" if doc.stop_reason else "") + "</p>"
    )
    charts = ramp_charts(doc)
    body.append('<h2>Latency against load</h2><div class="charts">')
    body += [svg for name, svg in charts.items()]
    body.append("</div>")
    rows = []
    for s in sorted(doc.steps, key=lambda s: s.step):
        lat = s.latency
        rows.append(
            [
                s.step,
                s.level_text,
                s.requests,
                f"{s.request_rate:.2f}",
                f"{s.output_tokens_per_s:,.0f}",
                f"{s.goodput:.2f}",
                fmt.seconds(lat.ttft.p50),
                fmt.seconds(lat.ttft.p99),
                fmt.seconds(lat.itl.p99),
                fmt.seconds(lat.e2e.p99),
                f"{s.error_rate * 100:.1f}",
                s.decision,
            ]
        )
    body.append("<h2>Steps</h2>")
    body.append(
        _table(
            [
                "step",
                "level",
                "requests",
                "req/s",
                "out tok/s",
                "goodput",
                "TTFT p50",
                "TTFT p99",
                "ITL p99",
                "E2E p99",
                "err %",
                "decision",
            ],
            rows,
            left=2,
        )
    )
    body.append("<h2>Each step's figures against the SLA, with their intervals</h2><pre>")
    body += [_t(line) for s in sorted(doc.steps, key=lambda s: s.step) for line in check_lines(s)]
    body.append("</pre>")
    body.append("<h2>The server's view of each step</h2>")
    body.append(
        _table(
            [
                "level",
                "waiting max",
                "running max",
                "KV max",
                "preemptions/s",
                "prefix hits",
                "TTFT p99 (server)",
                "GPUs throttled",
            ],
            [_server_row(s) for s in sorted(doc.steps, key=lambda s: s.step)],
        )
    )
    with_sessions = [s for s in sorted(doc.steps, key=lambda s: s.step) if s.sessions is not None]
    if with_sessions:
        body.append("<h2>Sessions: whole ones judged on every call</h2>")
        body.append(
            _table(
                SESSION_COLUMNS,
                [_sessions_row(s) for s in with_sessions],
            )
        )
    body += _shadow_section(doc)
    traced = [s for s in doc.steps if s.trace is not None]
    if traced:
        body.append("<h2>How faithfully each step replayed the trace</h2>")
        body.append(_table(["level", "fidelity"], [[s.level_text, s.trace.text if s.trace else ""] for s in traced], 2))
    return Report(title, _page(title, body), charts)


def study_report(pareto: StudyDoc, trials: list[TrialRecord]) -> Report:
    names = [o.name for o in pareto.objectives]
    labels = {o.name: o.label for o in pareto.objectives}
    title = f"Tuning study {pareto.study or '?'}"
    front = pareto.pareto
    body = [
        f'<div class="headline">{len(front)} configuration(s) on the Pareto front of '
        f"{_t(', '.join(labels.values()))} after {_t(pareto.trials_run)} trials "
        f"({_t(pareto.feasible)} within the SLA)</div>",
        f'<p class="note">Status {_t(pareto.status)} · SLA {_t(", ".join(pareto.sla))}'
        f" · hypervolume {_t(_num(pareto.hypervolume))}</p>",
    ]
    charts: dict[str, str] = {}
    if len(names) >= 2:
        xn, yn = names[0], names[1]

        def ci(m: MemberDoc, n: str) -> tuple[float | None, float | None]:
            lo, hi = m.ci95.get(n, (None, None))
            return lo, hi

        ok = [Point(x, t.objectives.get(yn)) for t in trials if t.feasible and (x := t.objectives.get(xn)) is not None]
        bad = [
            Point(x, t.objectives.get(yn)) for t in trials if not t.feasible and (x := t.objectives.get(xn)) is not None
        ]
        best = [Point(x, p.objectives.get(yn), *ci(p, yn)) for p in front if (x := p.objectives.get(xn)) is not None]
        y_is_time = yn.startswith(("ttft", "itl", "tpot", "e2e"))
        charts["pareto.svg"] = render(
            Chart(
                f"{labels[yn]} against {labels[xn]}: every trial and the front",
                labels[xn],
                labels[yn],
                [
                    Series("trials within the SLA", ok, PALETTE[0], joined=False),
                    Series("trials that miss it", bad, "#aaaaaa", joined=False),
                    Series("Pareto front (95 % intervals)", best, PALETTE[1], joined=True),
                ],
                y_fmt="s" if y_is_time else "n",
            )
        )
        body.append('<h2>The front</h2><div class="charts">' + charts["pareto.svg"] + "</div>")
    rows = []
    for p in front:
        cells: list[object] = [p.number, p.status]
        for n in names:
            lo, hi = p.ci95.get(n, (None, None))
            cells.append(f"{_num(p.objectives.get(n))} [{_num(lo)}, {_num(hi)}]")
        cells += [p.runs, p.command or " ".join(p.flags)]
        rows.append(cells)
    body.append("<h2>Pareto set</h2>")
    body.append(_table(["#", "front", *(labels[n] for n in names), "runs", "command"], rows, left=2))
    trows = [
        [
            t.number,
            t.status,
            *(_num(t.objectives.get(n)) for n in names),
            "yes" if t.feasible else "no",
            " ".join(t.flags),
            t.reason,
        ]
        for t in trials
    ]
    body.append("<h2>Every trial</h2>")
    body.append(_table(["#", "status", *(labels[n] for n in names), "within SLA", "flags", "note"], trows, left=2))
    return Report(title, _page(title, body), charts)


def comparison_report(c: Comparison) -> Report:
    title = f"Comparison: B against A ({c.verdict})"
    body = [f'<div class="headline">B against A: {_t(c.verdict)}</div>', f"<pre>{_t(comparison_text(c))}</pre>"]
    charts: dict[str, str] = {}
    lims = _limits(c.a)
    if lims:
        lim = lims[0]
        series = []
        for label, doc, color in (("A", c.a, PALETTE[0]), ("B", c.b, PALETTE[1])):
            pts = []
            for s in sorted(doc.steps, key=lambda s: s.level):
                lo, hi = s.interval(lim)
                pts.append(Point(s.level, s.value(lim), lo, hi))
            series.append(Series(f"{label}: {doc.path}", pts, color))
        charts[f"compare-{lim.key}.svg"] = render(
            Chart(
                f"{lim.key} against load, A and B",
                _unit_label(c.a.knee.unit),
                f"{lim.metric.upper()} {lim.stat}",
                series,
                hlines=[(f"limit {lim}", lim.value)],
                y_fmt="n" if lim.metric == "error_rate" else "s",
            )
        )
        body.append('<div class="charts">' + "".join(charts.values()) + "</div>")
    return Report(title, _page(title, body), charts)
