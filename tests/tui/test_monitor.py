import pytest

from spoc_tui.tui.messages import ServersSampled
from tests.tui.helpers import gpu_tick, make_app, no_gpu, server_tick, settings, settle

SIZES = [(80, 24), (120, 40), (200, 50)]
"""Every screen is snapshotted at these three (issue 35)."""


FIXED = 1_795_000_000.0
"""The monitor's clock in snapshots: event times and charts read the same on every run."""


def _connected(app):
    app.monitor.clock = lambda: FIXED
    app.post_message(ServersSampled(server_tick()))
    app.post_message(gpu_tick())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_connected(snap_compare, size):
    async def run_before(pilot):
        _connected(pilot.app)
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("mode", ["ascii", "no_color"])
def test_snapshot_without_utf8_or_colour(snap_compare, mode, monkeypatch):
    """LANG=C draws in ASCII (box drawing, bullets, braille turned into marks); NO_COLOR draws
    each chart line with its own mark, named in the legend."""
    if mode == "no_color":
        monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(ascii_mode=mode == "ascii")

    async def run_before(pilot):
        _connected(pilot.app)
        await settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_source_down(snap_compare, size):
    async def run_before(pilot):
        pilot.app.monitor.clock = lambda: FIXED
        pilot.app.post_message(ServersSampled(server_tick()))
        await settle(pilot)
        # the status taken at the pinned clock: "retry 4s" on every run (it counted down in real
        # time, and a loaded CI machine once drew "retry 3s")
        pilot.app.post_message(ServersSampled(server_tick(up=False, at=FIXED)))
        pilot.app.post_message(no_gpu())
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_no_gpu(snap_compare, size):
    async def run_before(pilot):
        pilot.app.monitor.clock = lambda: FIXED
        pilot.app.post_message(ServersSampled(server_tick()))
        pilot.app.post_message(no_gpu())
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


async def test_dragging_gpu_and_alert_are_shown():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        _connected(app)
        await settle(pilot)
        tp = str(app.monitor.tp.render())
        assert "GPU 3 drags TP group 0-3: thermal" in tp
        assert "DRAGGED" in tp
        cells = [str(c) for c in app.monitor.gpus.get_row("GPU-0003")]
        assert cells[0].startswith("▶") and "sw_thermal" in cells[-1]
        latency_title = app.monitor.latency_panel.border_title
        assert "60s" in latency_title


async def test_stale_source_keeps_data_and_says_why():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        await settle(pilot)
        app.post_message(ServersSampled(server_tick(up=False)))
        await settle(pilot)
        row = [str(c) for c in app.monitor.servers.get_row("http://192.0.2.5:8000")]
        assert row[0].startswith("✖") and row[1] == "16"
        assert "cannot connect" in str(app.monitor.status.render())
        assert app.monitor.servers_panel.has_class("-stale")


async def test_a_down_source_counts_its_retry_between_ticks_and_only_then():
    """The status line's "retry N s" counts down each second with no tick arriving while a source
    is down; with every source up the ticks redraw it, and no timer wakes the screen."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        now = [FIXED]
        app.monitor.clock = lambda: now[0]
        app.post_message(ServersSampled(server_tick()))
        await settle(pilot)
        assert app.monitor._status_timer is not None and app.monitor._status_timer._active.is_set() is False
        app.post_message(ServersSampled(server_tick(up=False, at=FIXED)))
        await settle(pilot)
        assert "retry 4s" in str(app.monitor.status.render())
        timer = app.monitor._status_timer
        assert timer._active.is_set() and timer._interval == 1.0  # counting each second now
        # two seconds on and no tick: what the timer does when it fires, in the screen's own time
        # (waiting 1.3 s of real time for the 1 s timer read "retry 4s" on a loaded host)
        now[0] = FIXED + 2.2
        timer._callback()
        await settle(pilot)
        assert "retry 2s" in str(app.monitor.status.render())
        app.post_message(ServersSampled(server_tick()))
        await settle(pilot)
        assert "cannot connect" not in str(app.monitor.status.render())
        assert app.monitor._status_timer._active.is_set() is False


async def test_pause_help_and_screenshot_keys(tmp_path):
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("p")
        assert app.paused and "PAUSED" in str(app.monitor.status.render())
        await pilot.press("p")
        assert not app.paused
        await pilot.press("question_mark")
        await settle(pilot)
        assert app.screen.__class__.__name__ == "HelpScreen"
        await pilot.press("escape")
        await settle(pilot)
        await pilot.press("f8")
        await settle(pilot)
        shots = list((tmp_path / "data").rglob("*.svg"))
        assert shots
        svg = shots[0].read_text()
        # renders right offline: no web font to fetch, the system's monospace font (issue #20)
        assert "@font-face" not in svg and "cdnjs" not in svg and "font-family: monospace;" in svg


async def test_ui_never_shows_api_key():
    from tests.tui.helpers import settings

    s = settings()
    s.api_key = "sk-TOPSECRET"
    app = make_app(s)
    async with app.run_test(size=(160, 48)) as pilot:
        _connected(app)
        await settle(pilot)
        assert "sk-TOPSECRET" not in app.export_screenshot()


async def test_worker_against_live_simulator():
    """The real workers, collectors and simulator together: data arrives on screen."""
    from spoc_tui.config import Settings
    from spoc_tui.procs.ports import free_ports
    from spoc_tui.sim.process import start_sim
    from spoc_tui.tui.app import SpocApp

    port, dport = free_ports(2)
    proc = start_sim(["--tp", "2", "--dcgm-port", str(dport), "--load-users", "6"], port)
    try:
        s = Settings(
            vllm_urls=[f"http://127.0.0.1:{port}"],
            dcgm_urls=[f"http://127.0.0.1:{dport}/metrics"],
            nvml=False,
            tp_groups="0-1",
            interval=0.3,
        )
        app = SpocApp(s)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(60):
                await pilot.pause(0.1)
                if app.monitor.model.vllm and app.monitor.model.gpu_tick and app.monitor.model.gpu_tick.gpus:
                    break
            assert app.monitor.model.vllm.servers[0].simulated
            assert len(app.monitor.model.gpu_tick.gpus) == 2
            assert "SIMULATED" in app.monitor.servers_panel.border_title
            for _ in range(40):  # what is served: from the metrics, and max-model-len from /v1/models
                await pilot.pause(0.1)
                if "max-model-len" in str(app.monitor.server_info.render()):
                    break
            info = str(app.monitor.server_info.render())
            assert "meta-llama/Llama-3.1-8B-Instruct · vLLM" in info and "max-model-len 32,768" in info
    finally:
        proc.stop()


class _FakePromQL:
    """Stands in for PromQLCollector: real expositions (two replicas) as Prometheus returns them."""

    def __init__(self):
        from spoc_tui.core.metrics.promparse import parse_text
        from tests.tui.helpers import FIX

        self.now = {
            inst: parse_text((FIX / "vllm/vllm_0.32_cpu_full_load.txt").read_text()) for inst in ("a:8000", "b:8000")
        }
        self.then = {
            inst: parse_text((FIX / "vllm/vllm_0.32_cpu_full_idle.txt").read_text()) for inst in ("a:8000", "b:8000")
        }
        self.calls = 0
        self.reads: list[tuple[float, float]] = []

    def stamps(self, at):
        return dict.fromkeys(self.now, 1000.0 + self.calls)  # a new scrape of each at every poll

    def query(self, selector, at):
        self.calls += 1
        return self.now if self.calls % 2 else self.then  # now, then the window's start

    def scrapes(self, start, end):
        """What Prometheus stored between ``start`` and ``end`` (the headroom's feed reads it)."""
        self.reads.append((start, end))
        return {inst: [(end - 30.0, self.then[inst]), (end, self.now[inst])] for inst in self.now}


async def test_prometheus_worker_merges_replicas():
    from spoc_tui.config import Settings
    from spoc_tui.tui.app import MonitorSources, SpocApp

    fake = _FakePromQL()
    app = SpocApp(
        Settings(prometheus_url="http://prom:9090", nvml=False, interval=0.2, window=60), MonitorSources(promql=fake)
    )
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(40):
            await pilot.pause(0.05)
            if app.monitor.model.vllm is not None:
                break
        tick = app.monitor.model.vllm
        assert {s.source for s in tick.servers} == {"a:8000", "b:8000"}
        assert tick.total.running == 32
        assert tick.total.latency["ttft"].window == "60s"
        assert app.monitor.servers.row_count == 3  # two replicas and their sum
        # the headroom learns through Prometheus too: its last hour read at once into each replica's learner
        assert app.headroom is not None and "learning from Prometheus's last 60 min" in app.monitor._headroom_note
        for _ in range(40):
            if app.headroom.learner("b:8000") is not None:
                break
            await pilot.pause(0.05)
        start, end = fake.reads[0]
        assert end - start == 3600.0 and app.headroom.learner("a:8000") is not None
        assert app.headroom.seen_s == 30.0


def test_nothing_to_monitor_is_a_clear_error():
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "monitor", "--no-nvml"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "nothing to monitor" in r.stderr and "spoc demo" in r.stderr


def test_a_password_in_a_url_never_reaches_the_screen():
    s = settings()
    s.vllm_urls = ["http://admin:hunter2@127.0.0.1:8000"]
    s.prometheus_url = None
    app = make_app(s)
    assert "hunter2" not in app.title_text() and "http://***@127.0.0.1:8000" in app.title_text()


def fleet_tick():
    """Three replicas: two alike, the third queueing with a slow TTFT and shedding load."""
    from spoc_tui.core.metrics.vllm import Scrape, replicas_view, server_view
    from spoc_tui.core.monitor.snapshots import SourceStatus, VllmTick
    from tests.unit.test_fleet import exposition

    fast = [0.02] * 50
    specs = {
        "http://192.0.2.1:8000": dict(waiting=1, ttft=fast),
        "http://192.0.2.2:8000": dict(waiting=2, ttft=fast),
        "http://192.0.2.3:8000": dict(
            waiting=9, ttft=[0.8] * 50, rejected=20, http5=3, drafts=100, draft_tokens=400, accepted=300
        ),
    }
    scrapes = {u: Scrape(exposition(**kw), 10.0, exposition(), 0.0) for u, kw in specs.items()}
    views = tuple(server_view(u, s) for u, s in scrapes.items())
    return VllmTick(
        views, replicas_view(list(scrapes.values())), frozenset(), (), tuple(SourceStatus(u, True) for u in specs)
    )


async def test_fleet_view_names_the_lagging_replica_and_the_shed_load():
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_message(ServersSampled(fleet_tick()))
        await settle(pilot)
        table = app.monitor.servers
        assert table._order[0] == "__all__"  # the fleet total on top
        assert str(table.get_row("__all__")[0]) == "fleet of 3"
        assert str(table.get_row("http://192.0.2.3:8000")[0]).startswith("▲ ")
        assert not str(table.get_row("http://192.0.2.1:8000")[0]).startswith("▲")
        tp = str(app.monitor.tp.render())
        assert "replica http://192.0.2.3:8000 lags the fleet: 9 waiting vs its peers' median 1.5" in tp
        assert "shedding load over the window: admission rejections 2/s" in tp
        assert "4.0 waiting per replica (the autoscaling signal)" in app.monitor.servers_panel.border_title
        spec = str(app.monitor.spec.render())
        assert "75% of draft tokens accepted, 4.00 tokens per draft" in spec


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_fleet(snap_compare, size):
    async def run_before(pilot):
        pilot.app.monitor.clock = lambda: FIXED
        pilot.app.post_message(ServersSampled(fleet_tick()))
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)
