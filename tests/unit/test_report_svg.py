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
