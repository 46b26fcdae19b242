"""spoc compare: the knee's difference with its interval, per-level differences, a plain verdict."""

import json
import subprocess
import sys

from spoc_tui.core.analysis.compare import compare, comparison_text, difference
from spoc_tui.core.ramp.inference import infer_knee
from spoc_tui.core.ramp.knee import find_knee
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import summarize_step
from spoc_tui.core.results import RampHeader, decode_ramp, encode_ramp
from tests.unit.test_inference import _step

SLA = "ttft_p50<=200ms"


def _ramp(tmp_path, name, scale):
    """A ramp whose TTFT median grows as ``0.02 * exp(level / scale)``: the knee lies at scale x 2.3."""
    import math

    lims = parse_sla(SLA)
    levels = [(x, _step(x, 150, 0.02 * math.exp(x / scale), seed=x + int(scale))) for x in (4, 8, 16, 24, 32)]
    steps = [summarize_step(i, x, s, 60.0, lims) for i, (x, s) in enumerate(levels, 1)]
    knee = find_knee(steps, infer_knee(levels, lims))
    text = encode_ramp(RampHeader(model="m", url="http://h", sla=(SLA,)), steps, knee, "complete", 1.0)
    path = tmp_path / name
    path.mkdir()
    (path / "ramp.json").write_text(text)
    return path


def test_a_higher_knee_is_better_with_an_interval_that_excludes_zero(tmp_path):
    a, b = _ramp(tmp_path, "a", 6.0), _ramp(tmp_path, "b", 9.0)  # knees near 13.8 and 20.7 users
    c = compare(decode_ramp(json.loads((a / "ramp.json").read_text()), str(a)),
                decode_ramp(json.loads((b / "ramp.json").read_text()), str(b)))  # fmt: skip
    assert c.verdict == "better" and c.knee.diff is not None and 4 < c.knee.diff < 10
    lo, hi = c.knee.ci95
    assert lo is not None and hi is not None and 0 < lo < c.knee.diff < hi
    at16 = dict(c.levels)[16.0]
    ttft = next(d for d in at16 if d.name == "ttft_p50")
    assert ttft.diff < 0 and ttft.verdict == "better"  # lower latency at the same load
    assert compare(c.b, c.a).verdict == "worse"
    assert compare(c.a, c.a).verdict == "within noise"
    text = comparison_text(c)
    assert text.startswith("B against A: better") and "at 16 users:" in text
    r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", "compare", str(a), str(b), "--json"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "better"
    r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", "compare", str(a), str(tmp_path / "nothing")],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_an_open_side_keeps_the_difference_open():
    d = difference("x", 10.0, (8.0, 12.0), 15.0, (13.0, None), True)
    assert d.ci95[1] is None and d.ci95[0] is not None and d.verdict == "better"
    assert difference("x", None, (None, None), 1.0, (0.5, 1.5), True).verdict == "not comparable"


def _doc(path):
    return decode_ramp(json.loads((path / "ramp.json").read_text()), str(path))


def test_a_ramp_by_users_and_one_by_trace_speed_do_not_compare_level_by_level(tmp_path):
    """Issue 56 item 6: level 1 of a ramp by users was matched against speed 1 of a trace ramp."""
    a = _ramp(tmp_path, "a", 6.0)
    b = _ramp(tmp_path, "b", 9.0)
    j = json.loads((b / "ramp.json").read_text())
    j["knee"]["unit"] = "x"  # a trace replayed at speeds
    (b / "ramp.json").write_text(json.dumps(j))
    c = compare(_doc(a), _doc(b))
    assert c.levels == () and c.knee.verdict == "not comparable" and c.verdict == "not comparable"
    assert "do not compare" in comparison_text(c)


def test_a_nan_figure_is_not_comparable_not_within_noise():
    assert difference("x", float("nan"), (None, None), 1.0, (0.5, 1.5), True).verdict == "not comparable"
    assert difference("x", 1.0, (0.5, 1.5), float("inf"), (None, None), False).verdict == "not comparable"
    d = difference("x", 1.0, (float("nan"), 1.5), 3.0, (2.5, float("inf")), True)
    assert d.diff == 2.0 and d.ci95[1] is None and d.ci95[0] is not None  # the infinite and NaN ends: open


def test_model_names_reach_the_terminal_inert_and_cut(tmp_path):
    a = _ramp(tmp_path, "a", 6.0)
    b = _ramp(tmp_path, "b", 9.0)
    j = json.loads((b / "ramp.json").read_text())
    j["model"] = "evil\x1b]0;pwned\x07\u202e" + "m" * 100_000
    (b / "ramp.json").write_text(json.dumps(j))
    text = comparison_text(compare(_doc(a), _doc(b)))
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b]0;pwned\\x07\\u202e" in text
    assert "more characters)" in text and len(text) < 20_000
