"""The live headroom published as Prometheus metrics (issue 75, point 2): the series a Grafana
panel, an alert rule or KEDA reads, per server and for the fleet. Against the real Prometheus:
tests/realengine/test_fleet_real.py."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from spoc_tui.core.errors import InputError
from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.twin.headroom import Headroom
from spoc_tui.twin.publish import HeadroomCollector, parse_address


def headroom(est: float | None, lo: float | None = None, hi: float | None = None, why: str = "fit") -> Headroom:
    return Headroom(est, (lo, hi), "ttft_p99" if est else None, None, est is not None, why, 10, None)


def scraped(c: HeadroomCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(c)
    exp = parse_text(generate_latest(reg).decode())
    return {(name, tuple(sorted(lbls))): v for name, series in exp.samples.items() for lbls, v in series.items()}


def value(rows, name: str, **labels: str) -> float | None:
    return rows.get((name, tuple(sorted(labels.items()))))


def test_each_servers_estimate_its_interval_and_the_fleets_weakest_are_series():
    t = [100.0]
    c = HeadroomCollector(clock=lambda: t[0])
    c.publish({"http://a:8000": headroom(2.5, 2.0, 3.1), "http://b:8000": headroom(None, why="too little traffic yet")})
    t[0] += 30.0
    rows = scraped(c)
    assert value(rows, "spoc_headroom_ratio", server="http://a:8000", bound="estimate") == 2.5
    assert value(rows, "spoc_headroom_ratio", server="http://a:8000", bound="ci95_low") == 2.0
    assert value(rows, "spoc_headroom_ratio", server="http://a:8000", bound="ci95_high") == 3.1
    assert value(rows, "spoc_headroom_identified", server="http://a:8000") == 1.0
    assert value(rows, "spoc_headroom_age_seconds", server="http://a:8000") == 30.0
    # no number: no ratio, identified 0, the reason said
    assert value(rows, "spoc_headroom_ratio", server="http://b:8000", bound="estimate") is None
    assert value(rows, "spoc_headroom_identified", server="http://b:8000") == 0.0
    assert (
        value(rows, "spoc_headroom_info", server="http://b:8000", binding_limit="", reason="too little traffic yet")
        == 1
    )
    # the fleet: no number while a replica has none
    assert value(rows, "spoc_headroom_identified", server="fleet") == 0.0
    assert value(rows, "spoc_headroom_ratio", server="fleet", bound="estimate") is None
    c.publish({"http://b:8000": headroom(10.0, 8.0, None)})  # every speed met the SLA: a bound
    rows = scraped(c)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(c)
    assert 'spoc_headroom_ratio{bound="ci95_high",server="http://b:8000"} +Inf' in generate_latest(reg).decode()
    assert value(rows, "spoc_headroom_ratio", server="fleet", bound="estimate") == 2.5  # its weakest replica
    assert value(rows, "spoc_headroom_identified", server="fleet") == 1.0
    assert value(rows, "spoc_headroom_age_seconds", server="fleet") == 30.0  # as old as its oldest


def test_one_servers_fleet_is_itself_and_a_long_reason_is_cut():
    """The fleet row is there with one server too (the KEDA trigger of spoc plan
    --keda-headroom reads it, whatever the fleet's size)."""
    c = HeadroomCollector()
    c.publish({"s": headroom(2.0)})
    assert value(scraped(c), "spoc_headroom_ratio", server="fleet", bound="estimate") == 2.0
    c = HeadroomCollector()
    c.publish({"s": headroom(None, why="x" * 1000)})
    rows = scraped(c)
    assert value(rows, "spoc_headroom_identified", server="fleet") == 0.0
    (reason,) = [
        dict(lbls)["reason"] for name, lbls in rows if name == "spoc_headroom_info" and ("server", "s") in lbls
    ]
    assert len(reason) == 200


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:9000", ("0.0.0.0", 9000)),
        ("[::1]:9000", ("::1", 9000)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_the_address_is_loopback_unless_a_host_is_given(text, expect):
    assert parse_address(text) == expect


@pytest.mark.parametrize("text", ["0", "65536", "x", "host:", "gpu-a:9000", ":9000x", "1.2.3:80"])
def test_an_address_that_is_not_one_is_refused_in_one_line(text):
    with pytest.raises(InputError, match="--serve-metrics"):
        parse_address(text)


def test_the_monitors_serve_metrics_setting_is_checked_before_the_monitor_starts():
    from spoc_tui.config import ConfigError, Settings

    Settings(vllm_urls=["http://127.0.0.1:8000"], serve_metrics="9464").validate()
    with pytest.raises(InputError, match="--serve-metrics 'gpu-a:9': 'gpu-a' is not an IP address"):
        Settings(vllm_urls=["http://127.0.0.1:8000"], serve_metrics="gpu-a:9").validate()
    with pytest.raises(ConfigError, match="serve_metrics publishes the headroom: it needs headroom on"):
        Settings(vllm_urls=["http://127.0.0.1:8000"], serve_metrics="9464", headroom=False).validate()


def test_the_ledger_is_published_and_a_grading_keeps_the_estimates_age():
    """Issue 76: the ledger's minutes graded and held beside the estimate (held over windows: the
    share a Grafana panel shows); republished after a grading, the estimate's age goes on."""
    from dataclasses import replace

    from spoc_tui.twin.ledger import LedgerSummary

    t = [100.0]
    c = HeadroomCollector(clock=lambda: t[0])
    h = headroom(2.5, 2.0, 3.1)
    c.publish({"http://a:8000": h})
    assert value(scraped(c), "spoc_headroom_ledger_windows", server="http://a:8000") is None  # none kept yet
    t[0] += 600.0
    c.publish({"http://a:8000": replace(h, ledger=LedgerSummary(10, 9, 600.0, 0.08, ()))}, fresh=False)
    rows = scraped(c)
    assert value(rows, "spoc_headroom_ledger_windows", server="http://a:8000") == 10.0
    assert value(rows, "spoc_headroom_ledger_held", server="http://a:8000") == 9.0
    assert value(rows, "spoc_headroom_age_seconds", server="http://a:8000") == 600.0
    assert value(rows, "spoc_headroom_ledger_windows", server="fleet") is None  # a replica's, not the fleet's
    c.publish({"http://a:8000": headroom(2.6, 2.1, 3.2)})  # a new estimate: its age from now
    assert value(scraped(c), "spoc_headroom_age_seconds", server="http://a:8000") == 0.0
