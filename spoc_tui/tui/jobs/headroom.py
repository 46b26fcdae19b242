"""The live headroom: each server's, learned from the scrapes (or from Prometheus's history),
worked out off the UI thread within the CPU share the monitor leaves it, shown on the monitor,
served to Prometheus (``--serve-metrics``), and offered to the Load form to confirm."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from spoc_tui.config import data_dir
from spoc_tui.core.errors import first_line
from spoc_tui.core.monitor.model import HeadroomShown
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.redact import redact_url
from spoc_tui.tui.jobs.host import Handlers, JobHost
from spoc_tui.tui.messages import HeadroomEstimated, ServersSampled
from spoc_tui.tui.sources import MonitorSources
from spoc_tui.twin.headroom import Headroom
from spoc_tui.twin.headroom_confirm import HeadroomClaim, confirm_speeds, write_traffic_trace
from spoc_tui.twin.history import HISTORY_S, PrometheusFeed
from spoc_tui.twin.live import CpuMeter, LiveHeadroom
from spoc_tui.twin.model import read_twin
from spoc_tui.twin.passive import MIN_WINDOWS
from spoc_tui.twin.publish import HeadroomCollector
from spoc_tui.twin.traffic import WINDOW_S

logger = logging.getLogger(__name__)


class HeadroomJob:
    """Holds the live headroom (:attr:`live`, None with ``--no-headroom`` or no server source),
    wires its learners to the sources, and runs its work when it is due."""

    def __init__(
        self, host: JobHost, sources: MonitorSources, limits: tuple[Limit, ...], published: HeadroomCollector | None
    ) -> None:
        self.host = host
        self.published = published
        """Where each headroom worked out is served to Prometheus (``--serve-metrics``)."""
        self.live: LiveHeadroom | None = None
        self.feed: PrometheusFeed | None = None
        """With ``--prometheus``: the learners fed from what Prometheus stored (its last hour at
        the start)."""
        self.working = False
        s = host.settings
        if s.headroom and (sources.vllm is not None or sources.promql is not None):
            prior = read_twin(Path(s.twin).expanduser()) if s.twin else None
            self.live = LiveHeadroom(limits, prior, seats=s.max_num_seqs)
            self.live.meter = CpuMeter()  # the estimates take what the monitor leaves of 1.45 % of a core
            if sources.vllm is not None:
                sources.vllm.on_scrape = self.live.add
            elif sources.promql is not None:
                self.feed = PrometheusFeed(sources.promql.scrapes, self.live)

    def handlers(self) -> Handlers:
        return {HeadroomEstimated: self.estimated}

    def learning_note(self) -> str | None:
        """What the monitor's headroom line says until the first estimate."""
        if self.live is None:
            return None
        first = MIN_WINDOWS * WINDOW_S / 60
        every = f"then every {self.live.refresh_s / 60:.0f} min"
        if self.feed is not None:
            return (
                f"headroom: learning from Prometheus's last {HISTORY_S / 60:.0f} min (the first estimate once "
                f"read, {every})"
            )
        return f"headroom: learning from the scrapes (the first estimate in about {first:.0f} min, {every})"

    def sampled(self, message: ServersSampled) -> None:
        """A servers' tick: each new server's series published as learning, the monitor's own
        CPU measured, and the work started when it is due."""
        live = self.live
        if live is None:
            return
        if self.published is not None:  # each server's series from its first tick
            new = {sv.source for sv in message.tick.servers} - self.published.servers()
            self.published.publish({src: Headroom.none("learning", live.limits) for src in new})
        if live.meter is not None:
            live.meter.sample(busy=self.working)
        if not self.working and live.work_due():
            self.working = True
            if live.meter is not None:
                live.meter.busy()
            self.host.run_worker(self.work, group="headroom", exclusive=True, exit_on_error=False, thread=True)

    def work(self) -> None:
        """Every server's headroom, or its ledger's newest window graded (seconds of CPU, off the UI
        thread), posted back."""
        assert self.live is not None
        try:
            found, fresh = self.live.work()
            if self.published is not None:
                self.published.publish(found, fresh)
        except Exception as e:  # a defect: said on the line, and the monitor goes on
            logger.exception("working out the headroom")
            shown = {"": HeadroomShown(f"headroom: failed ({first_line(e, 120)}); see spoc.log", None, False)}
        else:
            later = self.live.next_note()
            shown = {
                src: HeadroomShown(
                    h.line() + (f"; {later}" if later else ""),
                    h.estimate,
                    h.identified,
                    h.ledger.line() if h.ledger is not None else "",
                    fresh,
                )
                for src, h in found.items()
            }
        self.host.post_message(HeadroomEstimated(shown))

    def estimated(self, message: HeadroomEstimated) -> None:
        self.working = False
        self.host.record(lambda r: r.headroom(message.results))
        self.host.monitor.apply_headroom(message.results)

    def confirm(self) -> None:
        """With a headroom worked out, the Load form is pre-filled to confirm it: the traffic it
        replayed written as a trace, at speeds around the estimate."""
        urls = self.host.settings.vllm_urls
        if self.live is None or not urls:
            return
        # the Load screen ramps the first server: its headroom, by its name as the poller shows it
        h = self.live.results.get(redact_url(urls[0]))
        if h is None or not h.identified or h.traffic is None or not h.estimate:
            return
        estimate = h.estimate
        path = data_dir() / "headroom" / f"traffic-{int(time.time())}.jsonl"
        try:
            rows = write_traffic_trace(h, path)
        except (OSError, ValueError) as e:
            logger.warning("writing the headroom's traffic: %s", e)
            return
        mins = round(h.traffic.seconds / 60) if h.traffic is not None else 0
        self.host.load_screen.prefill_trace(
            str(path),
            confirm_speeds(estimate),
            f"pre-filled to confirm the live headroom x{estimate:.2g}: the last {mins} min of traffic "
            f"({rows} requests, estimated from the server's counters and histograms) at speeds around it",
            HeadroomClaim.of(h, str(path)),
        )
