"""The monitor model's side of the live headroom: the alert under the threshold and the fleet's
line (its weakest replica's), from the headroom as the worker thread hands it over."""

from spoc_tui.core.monitor.model import HeadroomShown, MonitorModel

A, B = "http://192.0.2.1:8000", "http://192.0.2.2:8000"


def test_the_fleet_is_as_its_weakest_replica_and_a_low_one_is_alerted():
    m = MonitorModel(60.0, clock=lambda: 100.0)
    m.set_headroom({A: HeadroomShown("headroom x3 ...", 3.0, True)})
    assert m.fleet_headroom() is None and not [a for a in m.alerts if a.key.startswith("headroom:")]
    m.set_headroom({A: HeadroomShown("headroom x3 ...", 3.0, True), B: HeadroomShown("headroom x1.1 ...", 1.1, True)})
    assert m.fleet_headroom() == (
        "fleet: headroom x1.1, its weakest replica's (192.0.2.2:8000), with the traffic split evenly"
    )
    (alert,) = [a for a in m.alerts if a.key.startswith("headroom:")]
    assert alert.key == f"headroom:{B}" and "under x1.2" in alert.text
    m.set_headroom({A: HeadroomShown("headroom x3 ...", 3.0, True), B: HeadroomShown("headroom: not yet", None, False)})
    assert m.fleet_headroom() == "fleet: no headroom yet (1 of 2 replicas not identified)"
    assert not [a for a in m.alerts if a.key.startswith("headroom:")]
    m.headroom_alert = 5.0  # --headroom-alert 5: x3 is low too
    m.set_headroom({A: HeadroomShown("headroom x3 ...", 3.0, True)})
    assert [a.key for a in m.alerts if a.key.startswith("headroom:")] == [f"headroom:{A}"]
    m.reset()
    assert m.headroom == {}


def test_each_servers_estimates_make_its_history_line():
    """Issue 52: the headroom's history beside its line: the estimates oldest first, a ``·`` where
    one could not say, the first and the last figure and the time they span; none before two,
    and a failure said for every server ("") is no server's estimate."""
    now = [0.0]
    m = MonitorModel(60.0, clock=lambda: now[0])
    m.set_headroom({A: HeadroomShown("headroom: not enough variety yet", None, False)})
    assert m.headroom_trend(A) is None
    for t, est in ((600.0, 4.0), (1200.0, 5.0), (1800.0, None), (2400.0, 6.0)):
        now[0] = t
        m.set_headroom({A: HeadroomShown("...", est, est is not None)})
    assert m.headroom_trend(A) == "history x4 ·▂▅·█ x6 over 40 min"
    m.set_headroom({"": HeadroomShown("headroom: failed (boom); see spoc.log", None, False)})
    assert "" not in m.headroom_history and m.headroom_trend("") is None
    m.reset()  # a replay seeking back: the history goes with the rest
    assert m.headroom_trend(A) is None


def test_the_line_says_how_old_its_estimate_is():
    """Issue 73: an estimate's age beside it, so an hour-old figure is not read as today's."""
    now = [100.0]
    m = MonitorModel(60.0, clock=lambda: now[0])
    assert m.headroom_age(A) is None
    m.set_headroom({A: HeadroomShown("headroom x3 ...", 3.0, True)})
    assert m.headroom_age(A) == "worked out just now"
    now[0] += 59.0
    assert m.headroom_age(A) == "worked out just now"
    now[0] += 4 * 60.0
    assert m.headroom_age(A) == "worked out 5 min ago"
    m.set_headroom({"": HeadroomShown("headroom: failed (...)", None, False)})
    assert m.headroom_age("") is None  # a failure said for every server has no estimate's age
