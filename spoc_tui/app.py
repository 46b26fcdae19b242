"""The Textual app: owns the workers and routes their messages to the screens."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from spoc_tui.collectors.poller import DcgmPoller, GpuTick, SourceStatus, VllmPoller, VllmTick
from spoc_tui.config import Settings, data_dir
from spoc_tui.core.gpu import GpuSample, analyse_groups, parse_tp_groups
from spoc_tui.messages import GpusSampled, RampFinished, RampProgressed, ServersSampled, SourceStatusChanged, TuneEvent, TuneFinished
from spoc_tui.screens.load import LoadScreen
from spoc_tui.screens.tune import TuneScreen
from spoc_tui.screens.monitor import MonitorScreen

HELP_TEXT = """\
# spoc-tui monitor

| key | action |
|---|---|
| `p` | pause / resume refreshing (the last data stays) |
| `c` | the Capacity screen: KV-cache arithmetic, prefilled from this server (`m` or `Esc` back) |
| `l` | the Load screen: run a ramp against this server (`m` or `Esc` back; the ramp keeps running) |
| `t` | the Tune screen: an NSGA-II study over server flags, the Pareto front live (`m` or `Esc` back; the study keeps running) |
| `F8` | save a screenshot (SVG) to the data folder |
| `?` | this help |
| `q` | quit |

**Servers**: *Run* requests in the batch, *Wait* queued, *KV* cache use, *Prefix* prefix-cache
hit rate over the window, *Preempt* total and per second, *In t/s* and *Out t/s* prompt and
generated tokens per second over the window.

**Latency**: percentiles from the differences of the server's histogram buckets over the
stated window, merged across engines and replicas before the quantile (interpolated inside
buckets, as PromQL does). *lifetime* means no window exists yet. `n/a`: the server does not
export that metric, or nothing finished in the window.

**GPUs**: clock-event reasons decoded; *idle* is not throttling. A `▶` marks a GPU whose SM
clock drags its tensor-parallel group (the group runs at its slowest GPU's pace).

Figures from the spoc-tui simulator are labelled SIMULATED.

Press `Esc` to close.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 100; height: 90%; border: round $accent; background: $surface; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP_TEXT)


@dataclass
class MonitorSources:
    """Everything the monitor reads from; built from settings or injected by tests."""

    vllm: VllmPoller | None = None
    dcgm: DcgmPoller | None = None
    gpu_readers: list[Any] = field(default_factory=list)
    """NVML collectors or trace replays: objects with a blocking ``read() -> list[GpuSample]``."""
    promql: Any | None = None
    tp_groups: list[list[int]] | None = None
    find_groups: Any | None = None
    """Callable returning TP groups found from local processes, or None."""
    gpu_note: str | None = None

    async def aclose(self) -> None:
        for p in (self.vllm, self.dcgm):
            if p is not None:
                await p.aclose()
        for r in self.gpu_readers:
            stop = getattr(r, "stop", None)
            if stop:
                stop()


def build_sources(settings: Settings) -> MonitorSources:
    from spoc_tui.collectors.nvml import NvmlCollector, NvmlUnavailable, TraceReplay

    src = MonitorSources()
    if settings.prometheus_url:
        from spoc_tui.collectors.promql import PromQLCollector

        src.promql = PromQLCollector(settings.prometheus_url)
    if settings.vllm_urls and not settings.prometheus_url:
        src.vllm = VllmPoller(settings.vllm_urls, settings.window, settings.api_key)
    if settings.dcgm_urls:
        src.dcgm = DcgmPoller(settings.dcgm_urls)
    if settings.nvml_trace:
        src.gpu_readers.append(TraceReplay(settings.nvml_trace))
    elif settings.nvml is not False:
        try:
            col = NvmlCollector()
            col.start()
            src.gpu_readers.append(col)
            src.find_groups = col.find_tp_groups
        except NvmlUnavailable as e:
            if settings.nvml:
                src.gpu_note = f"NVML unavailable: {e}"
    if settings.tp_groups:
        src.tp_groups = parse_tp_groups(settings.tp_groups)
    if not (src.dcgm or src.gpu_readers) and not src.gpu_note:
        src.gpu_note = "No GPU source: pass --dcgm URL, or run on the GPU host (NVML)."
    return src


class SpocApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "spoc-tui"
    SCREENS = {"help": HelpScreen}
    BINDINGS = [Binding("ctrl+c", "quit", "Quit", show=False, priority=True)]

    def __init__(self, settings: Settings, sources: MonitorSources | None = None, start_workers: bool = True) -> None:
        super().__init__()
        self.ramp_users: list[int] = []
        self._ramp_worker: Any = None
        self._tune_session: Any = None
        self.settings = settings
        self.sources = sources if sources is not None else build_sources(settings)
        self.start_workers = start_workers
        self.paused = False
        self._groups_cache: tuple[float, list[list[int]]] | None = None

    def title_text(self) -> str:
        s = self.settings
        if s.prometheus_url:
            target = f"Prometheus {s.prometheus_url}"
        elif s.vllm_urls:
            target = ", ".join(s.vllm_urls[:2]) + (f" +{len(s.vllm_urls) - 2}" if len(s.vllm_urls) > 2 else "")
        else:
            target = "no vLLM server (--url)"
        return f"spoc-tui · {target} · refresh {s.interval:g}s · window {s.window:g}s"

    def on_mount(self) -> None:
        self.monitor = MonitorScreen(self.title_text(), self.settings.window)
        self.push_screen(self.monitor)
        if not self.start_workers:
            return
        if self.sources.vllm is not None:
            self._poll_servers()
        if self.sources.promql is not None:
            self._poll_prometheus()
        if self.sources.dcgm is not None or self.sources.gpu_readers or self.sources.gpu_note:
            self._poll_gpus()

    async def on_unmount(self) -> None:
        await self.sources.aclose()

    # -- workers: sample, post, wait ------------------------------------------------------
    @work(group="servers", exclusive=True, exit_on_error=False)
    async def _poll_servers(self) -> None:
        poller = self.sources.vllm
        assert poller is not None
        while True:
            if not self.paused:
                tick = await poller.poll()
                for ch in tick.changes:
                    self.post_message(SourceStatusChanged(ch))
                self.post_message(ServersSampled(tick))
            await asyncio.sleep(self.settings.interval)

    @work(group="prometheus", exclusive=True, exit_on_error=False, thread=True)
    def _poll_prometheus(self) -> None:
        from textual.worker import get_current_worker

        from spoc_tui.collectors.scrape import SourceError
        from spoc_tui.core.vllm import Scrape, replicas_view, server_view

        worker = get_current_worker()
        prom = self.sources.promql
        url = self.settings.prometheus_url or "prometheus"
        up: bool | None = None
        while not worker.is_cancelled:
            if not self.paused:
                try:
                    now, then, t = prom.vllm_pair(self.settings.window)
                except SourceError as e:
                    if up is not False:
                        self.post_message(SourceStatusChanged(SourceStatus(url, False, str(e))))
                    up = False
                else:
                    if up is not True:
                        self.post_message(SourceStatusChanged(SourceStatus(url, True, None, time.time())))
                    up = True
                    scrapes = {inst: Scrape(exp, t, then.get(inst), t - self.settings.window if inst in then else None) for inst, exp in now.items()}
                    views = tuple(server_view(inst, sc) for inst, sc in sorted(scrapes.items()))
                    total = replicas_view(list(scrapes.values())) if len(scrapes) > 1 else None
                    status = SourceStatus(url, True, None, time.time())
                    self.post_message(ServersSampled(VllmTick(views, total, frozenset(), (), (status,))))
            # Sleep in short slices so a cancelled worker (quit) stops within 0.1 s.
            deadline = time.monotonic() + self.settings.interval
            while not worker.is_cancelled and time.monotonic() < deadline:
                time.sleep(0.1)

    @work(group="gpus", exclusive=True, exit_on_error=False)
    async def _poll_gpus(self) -> None:
        src = self.sources
        while True:
            if not self.paused:
                gpus: list[GpuSample] = []
                stale: frozenset[str] = frozenset()
                statuses: tuple[SourceStatus, ...] = ()
                changes: tuple[SourceStatus, ...] = ()
                if src.dcgm is not None:
                    t = await src.dcgm.poll()
                    gpus.extend(t.gpus)
                    stale, statuses, changes = t.stale, t.statuses, t.changes
                for reader in src.gpu_readers:
                    try:
                        gpus.extend(await asyncio.to_thread(reader.read))
                    except Exception as e:  # a GPU fell off the bus, NVML hiccup: keep going
                        changes = changes + (SourceStatus(getattr(reader, "source", "nvml"), False, f"NVML read failed: {e}"),)
                for ch in changes:
                    self.post_message(SourceStatusChanged(ch))
                groups = await self._tp_groups()
                reports = tuple(analyse_groups(groups, gpus)) if groups else ()
                self.post_message(GpusSampled(GpuTick(tuple(gpus), stale, changes, statuses), reports, src.gpu_note))
            await asyncio.sleep(self.settings.interval)

    async def _tp_groups(self) -> list[list[int]] | None:
        src = self.sources
        if src.tp_groups:
            return src.tp_groups
        if src.find_groups is None:
            return None
        now = time.monotonic()
        if self._groups_cache is None or now - self._groups_cache[0] > 30:
            try:
                found = await asyncio.to_thread(src.find_groups)
            except Exception:
                found = []
            self._groups_cache = (now, found)
        return self._groups_cache[1] or None

    # -- message handlers own the UI state -------------------------------------------------
    def on_servers_sampled(self, message: ServersSampled) -> None:
        self.monitor.apply_servers(message)

    def on_gpus_sampled(self, message: GpusSampled) -> None:
        self.monitor.apply_gpus(message)

    def on_source_status_changed(self, message: SourceStatusChanged) -> None:
        s = message.status
        self.monitor.apply_status(s)
        if s.up:
            self.notify(f"{s.source}: connected", severity="information", timeout=3)
        else:
            self.notify(s.reason or f"{s.source}: down", severity="error", timeout=6)

    # -- actions ----------------------------------------------------------------------------
    # -- load ramps -------------------------------------------------------------------------------
    @property
    def load_screen(self) -> LoadScreen:
        """Installed once, so a ramp keeps its screen while the operator watches the monitor."""
        if not self.is_screen_installed("load"):
            url = self.settings.vllm_urls[0] if self.settings.vllm_urls else None
            self.install_screen(LoadScreen(url), "load")
        screen = self.get_screen("load")
        assert isinstance(screen, LoadScreen)
        return screen

    def action_load(self) -> None:
        if self.screen is not self.load_screen:
            self.push_screen("load")

    def action_capacity(self) -> None:
        """Open the Capacity screen, prefilled from what the monitor sees."""
        from spoc_tui.screens.capacity import CapacityScreen

        screen = CapacityScreen()
        self.push_screen(screen)
        mon = self.monitor
        if mon._vllm is not None and mon._vllm.servers:
            server = mon._vllm.servers[0]
            gpus = mon._gpus.gpus if mon._gpus is not None else ()
            label = gpus[0].model if gpus else None
            tp = len(mon._groups[0].members) if mon._groups else None
            self.call_after_refresh(screen.prefill, server.model_names, server.cache_config, label, tp)

    def start_ramp(self, form: dict[str, Any]) -> None:
        from spoc_tui.load.ramp import RampConfig

        stamp = time.strftime("%Y%m%d-%H%M%S")
        cfg = RampConfig(
            url=self.settings.vllm_urls[0],
            profile=form["profile"],
            users=form["users"],
            limits=form["limits"],
            out_dir=data_dir() / "ramps" / stamp,
            step_s=form["step_s"],
            warmup_s=form["warmup_s"],
            api_key=self.settings.api_key,
            dcgm_urls=list(self.settings.dcgm_urls),
        )
        self.ramp_users = list(cfg.users)
        self.load_screen.set_running(True)
        self._ramp_worker = self._run_ramp(cfg)

    def stop_ramp(self) -> None:
        if self._ramp_worker is not None:
            self._ramp_worker.cancel()

    @work(group="ramps", exclusive=True, exit_on_error=False)
    async def _run_ramp(self, cfg: Any) -> None:
        from spoc_tui.load.ramp import RampError, run_ramp

        try:
            result = await run_ramp(cfg, lambda p: self.post_message(RampProgressed(p)))
        except RampError as e:
            self.post_message(RampFinished("error", str(e)))
        except asyncio.CancelledError:
            self.post_message(RampFinished("interrupted", f"stopped: finished steps kept in {cfg.out_dir}"))
            raise
        else:
            self.post_message(RampFinished(result.status, f"{result.status}: results in {cfg.out_dir}"))

    def on_ramp_progressed(self, message: RampProgressed) -> None:
        self.load_screen.show_progress(message.progress)

    def on_ramp_finished(self, message: RampFinished) -> None:
        self.load_screen.show_finished(message.message, message.status in ("complete", "stopped_early"))
        self.notify(message.message, severity="information" if message.status in ("complete", "stopped_early") else "warning", timeout=8)

    # -- tuning studies ----------------------------------------------------------------------
    @property
    def tune_screen(self) -> TuneScreen:
        if not self.is_screen_installed("tune"):
            self.install_screen(TuneScreen(self.settings.tune_launch), "tune")
        screen = self.get_screen("tune")
        assert isinstance(screen, TuneScreen)
        return screen

    def action_tune(self) -> None:
        if self.screen is not self.tune_screen:
            self.push_screen("tune")

    def start_tune(self, args: Any) -> None:
        from spoc_tui.core.tunespace import SpaceError
        from spoc_tui.tune.study import TuneSession
        from spoc_tui.tune_cmd import build

        screen = self.tune_screen
        root = data_dir() / "tunes"
        if args.resume:
            earlier = sorted(p.parent for p in root.glob("*/study.db"))
            if not earlier:
                screen.show_error(f"no earlier study in {root} to resume")
                return
            args.out_dir = str(earlier[-1])
        else:
            args.out_dir = str(root / time.strftime("%Y%m%d-%H%M%S"))
        args.api_key = self.settings.api_key
        try:
            cfg, evaluator = build(args)
        except (SpaceError, ValueError) as e:
            screen.show_error(str(e))
            return
        session = TuneSession(cfg, evaluator, lambda kind, data: self.post_message(TuneEvent(kind, data)))
        screen.show_error("")
        screen.prepare(cfg.objectives, cfg.limits, session)
        screen.set_running(True)
        self._tune_session = session
        self._run_tune(session)

    def stop_tune(self) -> None:
        if self._tune_session is not None:
            self._tune_session.stop()

    @work(group="tune", exclusive=True, exit_on_error=False, thread=True)
    def _run_tune(self, session: Any) -> None:
        from spoc_tui.tune.evaluate import TuneFatal
        from spoc_tui.tune.study import TuneError

        out = session.cfg.out_dir
        try:
            session.open()
            summary = session.run()
        except (TuneError, TuneFatal) as e:
            self.post_message(TuneFinished("error", str(e)))
        except Exception as e:  # a bug: shown, not a crash of the monitor
            self.post_message(TuneFinished("error", f"internal error: {type(e).__name__}: {e}"))
        else:
            ran = len([r for r in summary.records if r.repeat_of is None])
            self.post_message(TuneFinished(summary.status, f"{summary.status}: {ran} trial(s), {len(summary.front.records)} Pareto-optimal; "
                                                           f"results in {out}/pareto.json" + (f"; {summary.message}" if summary.message else "")))

    def on_tune_event(self, message: TuneEvent) -> None:
        self.tune_screen.apply_event(message.kind, message.data)

    def on_tune_finished(self, message: TuneFinished) -> None:
        ok = message.status in ("complete", "exhausted")
        self._tune_session = None
        self.tune_screen.finished(message.message, ok)
        if message.status == "error":
            self.tune_screen.show_error(message.message)
        self.notify(message.message, severity="information" if ok else "warning", timeout=8)

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self.monitor.set_paused(self.paused)

    def action_screenshot(self) -> None:
        folder = data_dir() / "screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        path = self.save_screenshot(path=str(folder))
        self.notify(f"screenshot saved: {Path(path)}", timeout=5)

    def action_quit(self) -> None:  # type: ignore[override]
        if self._tune_session is not None:
            self._tune_session.stop()  # its server stops; if we exit first, the server's guard stops it
        self.exit(0)


class NothingToMonitor(Exception):
    """No server and no GPU source: the message says what to pass."""


def check_sources(src: MonitorSources) -> None:
    if src.vllm is None and src.promql is None and src.dcgm is None and not src.gpu_readers:
        raise NothingToMonitor(
            "nothing to monitor: pass --url http://HOST:8000 (vLLM), --dcgm URL, --prometheus URL, "
            "or run on a GPU host; `spoc demo` shows the monitor on the simulator"
            + (f" ({src.gpu_note})" if src.gpu_note and src.gpu_note.startswith("NVML unavailable") else "")
        )


def run_monitor(settings: Settings, sources: MonitorSources | None = None) -> int:
    if sources is None:
        sources = build_sources(settings)
    try:
        check_sources(sources)
    except NothingToMonitor as e:
        import sys

        print(f"spoc: error: {e}", file=sys.stderr)
        return 2
    app = SpocApp(settings, sources)
    result = app.run()
    return int(result or 0)
