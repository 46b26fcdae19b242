import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spoc_tui.core.metrics import promparse
from spoc_tui.core.metrics.promparse import is_sentinel, parse_text

FIX = Path(__file__).parents[1] / "fixtures"
ALL = sorted(p for d in ("vllm", "dcgm", "exposition") for p in (FIX / d).glob("*.txt"))


def test_import_core_pulls_in_no_textual_rich_or_network():
    code = (
        "import sys, spoc_tui.core.metrics.promparse, spoc_tui.core.metrics.vllm, spoc_tui.core.hardware.gpu, spoc_tui.core.metrics.stats, "
        "spoc_tui.core.hardware.capacity, spoc_tui.core.hardware.presets, spoc_tui.core.monitor.alerts, spoc_tui.core.fmt, spoc_tui.core.metrics.history\n"
        "bad = [m for m in ('textual', 'rich', 'httpx', 'aiohttp', 'socket') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_every_capture_parses_without_raising(path):
    exp = parse_text(path.read_text())
    assert exp.samples or exp.types


def test_prometheus_client_agrees_on_full_capture():
    from prometheus_client.parser import text_string_to_metric_families

    text = (FIX / "vllm/vllm_0.32_cpu_full_load.txt").read_text()
    ours = parse_text(text)
    theirs = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            theirs[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    mine = {(n, lbls): v for n, series in ours.samples.items() for lbls, v in series.items()}
    assert mine == theirs


def test_edge_cases_escapes_trailing_comma_and_values():
    exp = parse_text((FIX / "exposition/edge_01.txt").read_text())
    assert not exp.errors
    # every label value that prometheus_client reads, we read identically, made safe for a
    # terminal (a newline in a value shows as the exposition wrote it, \n)
    from prometheus_client.parser import text_string_to_metric_families

    from spoc_tui.core.textsafe import safe

    for fam in text_string_to_metric_families((FIX / "exposition/edge_01.txt").read_text()):
        for s in fam.samples:
            got = exp.get(s.name).get(tuple(sorted((k, safe(v)) for k, v in s.labels.items())))
            if not math.isfinite(s.value):  # NaN and ±Inf are dropped at the parser: "n/a", never "inf"
                assert got is None, s
                continue
            assert got is not None, s
            assert got == float(s.value)


def test_openmetrics_mangled_vllm_names_are_restored():
    exp = parse_text((FIX / "exposition/edge_03.txt").read_text(), "application/openmetrics-text; version=1.0.0")
    assert any(n.startswith("vllm:") for n in exp.samples)
    assert not any(n.startswith("vllm_") for n in exp.samples)


def test_openmetrics_exemplars_are_stripped():
    exp = parse_text((FIX / "exposition/edge_02.txt").read_text())
    assert exp.openmetrics
    assert not exp.errors


def test_created_series_dropped_and_bad_lines_recorded():
    text = (
        "# TYPE a_total counter\na_total 3\n# TYPE a_created gauge\na_created 1.7e9\n"
        'b{x=1} 2\nc 0x1p-2\n...\nd{y="ok"} 4\n'
    )
    exp = parse_text(text)
    assert "a_created" not in exp.samples
    assert exp.get("a_total")[()] == 3
    assert exp.get("d")[(("y", "ok"),)] == 4
    assert len(exp.errors) == 3


def test_dcgm_sentinels():
    assert is_sentinel(9223372036854775794)
    assert is_sentinel(float("nan"))
    assert not is_sentinel(72.0)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parser_never_raises_on_any_text(text):
    parse_text(text)


line = st.builds(
    lambda n, k, v, val: f'{n}{{{k}="{v}"}} {val}',
    st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True),
    st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True),
    st.text(alphabet=st.characters(blacklist_characters='"\\\n'), max_size=12),
    st.floats(allow_nan=False),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(line, max_size=20))
def test_valid_lines_round_trip(lines):
    exp = parse_text("\n".join(lines) + "\n")
    assert not exp.errors


def test_control_characters_from_a_server_never_reach_the_terminal():
    """A crafted label value (tmux title, clear screen, OSC 52 clipboard write, bidi override)
    is kept readable and inert."""
    evil = "\x1b]2;pwned\x07\x1b[2J\x1b]52;c;ZWNobyBoaQ==\x07\u202e"
    exp = parse_text(f'vllm:num_requests_running{{model_name="m{evil}"}} 1\n')
    ((labels, _),) = exp.get("vllm:num_requests_running").items()
    value = dict(labels)["model_name"]
    assert value == "m\\x1b]2;pwned\\x07\\x1b[2J\\x1b]52;c;ZWNobyBoaQ==\\x07\\u202e"
    assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in value)


_CAPTURE = (FIX / "vllm" / "vllm_0.32_cpu_full_load.txt").read_text()
_mutation = st.tuples(
    st.integers(0, len(_CAPTURE) - 1),
    st.integers(0, 40),
    st.sampled_from(["", " ", "\n", "{", "}", '"', "\\", "=", ",", "#", "NaN", "+Inf", "-1e308", "\x1b", "le=", "\t"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_mutation, min_size=1, max_size=8))
def test_mutated_real_captures_never_break_the_view(mutations):
    """Mutations of a real vLLM capture (cut, replaced, injected characters): the parser and the
    whole server view never raise, and what reaches JSON has no NaN or infinity."""
    import json

    from spoc_tui.core.jsonsafe import json_safe
    from spoc_tui.core.metrics.vllm import Scrape, server_view

    text = _CAPTURE
    for pos, cut, put in mutations:
        pos = min(pos, len(text))
        text = text[:pos] + put + text[pos + cut :]
    then = parse_text(_CAPTURE)
    view = server_view("x", Scrape(parse_text(text), 10.0, then, 0.0))
    json.dumps(json_safe(view.as_dict()), allow_nan=False)


def test_a_line_seen_before_parses_the_same_and_a_changed_value_is_read_anew():
    """Sample lines repeat between scrapes and are looked up, not parsed again: the look-up must
    give what a parse gives, and a line whose value changed is a new line."""
    body = (
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",Hostname="h"} 61\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",Hostname="h"} 64\n'
        "x_total 5\n"
        'bad_value{a="1"} nope\n'
        "nan_gauge NaN\n"
    )
    first, again = parse_text(body), parse_text(body)
    assert first.samples == again.samples and first.types == again.types
    assert first.errors == again.errors and len(again.errors) == 1  # a bad line is refused every time
    assert first.nonfinite == again.nonfinite == 1
    changed = parse_text(body.replace("} 64", "} 66"))
    assert changed.get("DCGM_FI_DEV_GPU_TEMP")[(("Hostname", "h"), ("UUID", "GPU-b"), ("gpu", "1"))] == 66.0
    # the same text inside an OpenMetrics body with an exemplar reads the same sample
    om = parse_text('x_total 5 # {trace_id="abc"} 1.0\n# EOF\n', "application/openmetrics-text")
    assert 5.0 in (om.get("x").get(()), om.get("x_total").get(()))


@pytest.mark.parametrize(
    "value",
    ["66", "6.5e1", "NaN", "+Inf", "-inf", "1_0", "66\x0c", "66\u2003", "\u200366", "6 6", "66 1700000000000", "x"],
)
@pytest.mark.parametrize(
    "head",
    ['m{gpu="1",h="a b"} ', 'm{gpu="1",h="a b"}\t', 'm{h="} 5"} ', "m ", "m  ", 'm{a="x y"}'],
)
def test_a_known_series_with_a_new_value_parses_as_a_fresh_parse_would(head, value):
    """A line whose name and labels were seen before is split at its last blank and only its
    value read: whatever follows, the outcome (sample, error, non-finite) is a fresh parse's."""
    line = head + value
    promparse._HEADS.clear()
    promparse._SAMPLES.clear()
    fresh = parse_text(line + "\n")
    promparse._HEADS.clear()
    promparse._SAMPLES.clear()
    parse_text(head + "5\n")  # the series seen before, with another value
    warm = parse_text(line + "\n")
    assert warm.samples == fresh.samples
    assert [e.split(":", 1)[1] for e in warm.errors] == [e.split(":", 1)[1] for e in fresh.errors]
    assert warm.nonfinite == fresh.nonfinite
