"""Live headroom over HTTP: the sources watched for a while, their scrapes feeding each server's
passive learner (:class:`spoc_tui.twin.headroom.HeadroomLearner`), for ``spoc inspect --headroom``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from spoc_tui.collectors.http import new_client
from spoc_tui.collectors.inspect import InspectResult, read_all, result_of
from spoc_tui.collectors.scrape import DEFAULT_TIMEOUT, Reading, SourceError
from spoc_tui.core.redact import redact_url
from spoc_tui.core.sla import Limit
from spoc_tui.twin.headroom import HeadroomLearner
from spoc_tui.twin.model import Twin

HEADROOM_EVERY_S = 5.0
"""How often ``spoc inspect --headroom`` scrapes while it watches (the monitor's windows are 30 s)."""


async def watch_headroom(
    sources: list[str],
    seconds: float,
    limits: Sequence[Limit],
    api_key: str | None = None,
    prior: Twin | None = None,
    every_s: float = HEADROOM_EVERY_S,
    say: Callable[[str], None] = lambda _: None,
) -> InspectResult:
    """Watch ``sources`` for ``seconds``, scraping every ``every_s``, each vLLM server's scrapes
    feeding a passive learner (:class:`spoc_tui.twin.headroom.HeadroomLearner`); then the last
    window's report, as ``inspect_sources`` gives it, with each server's headroom (worked out off
    the event loop). The report's window is the whole watch (the first reading against the last).
    Ctrl-C ends the watch early: what was seen is still reported, marked ``interrupted``. A
    source that fails a scrape is tried again at the next one; one whose first or last reading
    failed is reported as an error."""
    learners: dict[str, HeadroomLearner] = {}
    first: list[Reading | SourceError] | None = None
    last: list[Reading | SourceError] | None = None
    t0 = time.monotonic()
    next_say = 60.0
    interrupted = False
    async with new_client(DEFAULT_TIMEOUT) as client:
        try:
            while True:
                got = await read_all(client, sources, api_key)
                first, last = (first or got), got
                for src, r in zip(sources, got, strict=True):
                    if isinstance(r, Reading) and r.kind == "vllm":
                        learner = learners.setdefault(redact_url(src), HeadroomLearner(limits, prior=prior))
                        learner.add(r.taken_at, r.exposition)
                elapsed = time.monotonic() - t0
                if elapsed >= seconds - 1e-6:
                    break
                if elapsed >= next_say:
                    say(f"watched {elapsed:.0f} of {seconds:.0f} s")
                    next_say += 60.0
                await asyncio.sleep(min(every_s, seconds - elapsed))
        except (KeyboardInterrupt, asyncio.CancelledError):
            interrupted = True
    watched = time.monotonic() - t0
    if first is None:  # interrupted before the first reading came back
        return InspectResult(watched_s=watched, interrupted=True)
    res = result_of(sources, first, last if last is not first else None)
    res.watched_s, res.interrupted = watched, interrupted
    if learners:
        say(f"watched {watched:.0f} s; working out the headroom of {len(learners)} server(s)...")
        for name, learner in learners.items():
            h = await asyncio.to_thread(learner.estimate)
            res.headroom[name] = (h.line(), h.as_dict())
    return res
