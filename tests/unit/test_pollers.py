"""The pollers' own rules on the simulator's real exposition text, through httpx's in-memory
transport (no socket, no clock): the kind check that refuses a DCGM exporter given as a vLLM
server and the reverse, the one hop to a thread per scrape, a view's defect reaching the caller.
The HTTP itself (deadlines, redirects, bodies cut while they stream) is tests/e2e's."""

import asyncio

import httpx
import pytest

from spoc_tui.collectors.poller import DcgmPoller, VllmPoller
from spoc_tui.sim.exposition import dcgm_metrics, vllm_metrics
from spoc_tui.sim.options import SimOptions
from spoc_tui.sim.run import build
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.workload import load_workload

VLLM = "http://127.0.0.1:8000"
DCGM = "http://127.0.0.1:9400/metrics"


@pytest.fixture
def client():
    """``spoc sim --tp 2 --load-users 8`` after 20 virtual seconds: its /metrics and its exporter's."""
    engine, users = build(SimOptions(tp=2, load_users=8, dcgm_port=None))
    server = VirtualServer(engine, load_workload("chatbot"), users, seed=0, paced=True)
    server.advance(20.0)
    bodies = {VLLM + "/metrics": vllm_metrics(server.engine), DCGM: dcgm_metrics(server.engine.gpus)}

    def answer(request: httpx.Request) -> httpx.Response:
        body = bodies.get(str(request.url))
        if body is None:
            return httpx.Response(404, text="not found")
        return httpx.Response(200, text=body, headers={"content-type": "text/plain; version=0.0.4"})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


async def test_the_dcgm_poller_refuses_a_vllm_url_and_reads_the_exporter(client):
    p = DcgmPoller([VLLM, DCGM], client=client)
    try:
        tick = await p.poll()
    finally:
        await p.aclose()
    assert len(tick.gpus) == 2
    assert any("not DCGM" in (s.reason or "") for s in tick.changes)


async def test_a_servers_scrape_is_parsed_and_viewed_in_one_hop_to_a_thread(client, monkeypatch):
    """The server's view is worked out in the thread that parsed its scrape (one hop a scrape,
    not two: each cost more CPU than the view); a DCGM exporter given as a vLLM server is still
    refused, and no view is made of it."""
    from spoc_tui.collectors import scrape

    hops: list[object] = []
    real = asyncio.to_thread

    async def counted(func, /, *args, **kwargs):
        hops.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(scrape.asyncio, "to_thread", counted)
    now = [0.0]
    poller = VllmPoller([VLLM, DCGM], window_s=5, clock=lambda: now[0], client=client)
    try:
        tick = await poller.poll()
        now[0] += 0.5  # within the refused exporter's back-off (1 s)
        tick = await poller.poll()
    finally:
        await poller.aclose()
    assert len(tick.servers) == 1 and tick.servers[0].total.running is not None
    # one hop a scrape: the server's two, and the exporter's one (refused, it then backs off)
    assert len(hops) == 3, hops
    assert all(getattr(f, "__name__", "") == "_parse_and_derive" for f in hops)
    assert any("serves dcgm metrics" in (s.reason or "") for s in tick.statuses)
    assert poller.windows.scrapes(VLLM) == 2 and poller.windows.scrapes(DCGM) == 0


async def test_a_view_that_fails_in_the_parsing_thread_is_raised_by_the_poll(client, monkeypatch):
    """A defect in the server's view (worked out in the parsing thread) reaches the poll's caller
    as it always did (the monitor shows it as the poller's), and the scrape is kept once."""
    from spoc_tui.core.metrics import vllm

    def broken(source, scrape):
        raise ZeroDivisionError("a defect")

    monkeypatch.setattr(vllm, "server_view", broken)
    poller = VllmPoller([VLLM], window_s=5, client=client)
    try:
        with pytest.raises(ZeroDivisionError, match="a defect"):
            await poller.poll()
    finally:
        await poller.aclose()
    assert poller.windows.scrapes(VLLM) == 1 and VLLM not in poller.latest
