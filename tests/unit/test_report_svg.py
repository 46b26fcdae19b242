"""spoc report's charts: pure SVG, escaped, with intervals, limits and the knee's band."""

import xml.etree.ElementTree as ET

from spoc_tui.report.svg import Chart, Point, Series, render


def test_a_chart_is_valid_svg_with_its_parts():
    c = Chart(
        "TTFT <p90> & more",
        "users",
        "TTFT p90",
        [Series("ttft_p90", [Point(1, 0.1, 0.08, 0.12), Point(8, 0.4, 0.3, None), Point(16, 1.2, 1.0, 1.4)])],
        hlines=[("limit 500ms", 0.5)],
        band=(6.0, 9.5),
        vline=("knee 7.8", 7.8),
        log_x=True,
    )
    svg = render(c)
    root = ET.fromstring(svg)  # well formed: the title's < and & are escaped
    assert root.tag.endswith("svg")
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "TTFT <p90> & more" in texts and "limit 500ms" in texts and "knee 7.8" in texts
    lines = list(root.iter("{http://www.w3.org/2000/svg}line"))
    assert any(ln.get("stroke-dasharray") == "2 2" for ln in lines)  # a side the sample cannot bound
    assert any(r.get("fill") == "#f2d7a6" for r in root.iter("{http://www.w3.org/2000/svg}rect"))  # the band
    assert len(list(root.iter("{http://www.w3.org/2000/svg}circle"))) == 3


def test_an_empty_chart_says_so():
    assert "no figures" in render(Chart("t", "x", "y", [Series("s", [])]))


def test_hostile_names_reach_the_page_and_its_charts_inert(tmp_path):
    """Issue 56 item 5: NUL, ESC and U+202E in a ramp's model name reached the HTML report raw
    (the title showed reversed); a 10 MB name is cut."""
    import json

    from spoc_tui.core.results import decode_ramp
    from spoc_tui.report.html import ramp_report
    from tests.e2e.test_report import write_ramp

    write_ramp(tmp_path / "r", 0.01)
    j = json.loads((tmp_path / "r" / "ramp.json").read_text())
    j["model"] = "m\x00\x1b[2J\u202eevil<script>" + "x" * 1_000_000
    rep = ramp_report(decode_ramp(j, str(tmp_path / "r")))
    for text in (rep.html, rep.title, *rep.charts.values()):
        assert not any(c in text for c in "\x00\x1b\u202e")
    assert "<script>" not in rep.html and not any("<script>" in svg for svg in rep.charts.values())
    assert "\\x00\\x1b[2J\\u202eevil&lt;script&gt;" in rep.html and len(rep.html) < 200_000
    assert "\u202e" not in render(Chart("t\u202e\x00", "x", "y", [Series("s\x1b", [Point(1, 1)])]))
