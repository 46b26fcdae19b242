"""The monitor's light scrape client (collectors.lighthttp) keeps every rule the httpx path keeps:
TLS by the process's rule, same-origin redirects, Basic from the URL, deadlines, bodies cut while
they stream; and it reuses connections, survives a server closing an idle one, reads chunked,
close-delimited and gzip bodies, and says what a malformed answer is."""

from __future__ import annotations

import asyncio
import gzip
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from spoc_tui.collectors import http, scrape
from spoc_tui.collectors.lighthttp import CONNECT_TIMEOUT_S, MAX_HEADER, ConnectFailed, ScrapeClient, needs_httpx
from spoc_tui.collectors.poller import VllmPoller
from spoc_tui.collectors.scrape import SourceError, fetch
from tests.e2e.test_hostile_sources import Servers

FIX = Path(__file__).resolve().parents[1] / "fixtures"
VLLM = (FIX / "vllm" / "vllm_0.32_cpu_full_load.txt").read_text()

CLIENTS = {"httpx": lambda: http.new_client(5.0), "light": ScrapeClient}


@pytest.fixture(autouse=True)
def default_tls():
    http.configure_tls(None, False)
    yield
    http.configure_tls(None, False)


class Seen:
    def __init__(self) -> None:
        self.auth: list[str | None] = []
        self.peers: set[object] = set()
        self.hostile = Servers()


def app(seen: Seen, other: str = "") -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        seen.auth.append(request.headers.get("Authorization"))
        seen.peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        return web.Response(text=VLLM, content_type="text/plain")

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(VLLM), 5000):
            await resp.write(VLLM[i : i + 5000].encode())
        await resp.write_eof()
        return resp

    async def gzipped(_: web.Request) -> web.Response:
        return web.Response(
            body=gzip.compress(VLLM.encode()), headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"}
        )

    async def moved(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/metrics")

    async def elsewhere(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"{other}/metrics")

    a = web.Application()
    for path, handler in (
        ("/metrics", metrics),
        ("/chunked/metrics", chunked),
        ("/gzip/metrics", gzipped),
        ("/old/metrics", moved),
        ("/cross/metrics", elsewhere),
    ):
        a.router.add_get(path, handler)
    a.add_subapp("/hostile/", seen.hostile.app())  # a trickling and an endless /metrics
    return a


@pytest.fixture()
async def server():
    seen = Seen()
    other = TestServer(app(Seen()), host="127.0.0.1")
    await other.start_server()
    s = TestServer(app(seen, f"http://localhost:{other.port}"), host="127.0.0.1")
    await s.start_server()
    yield seen, f"http://127.0.0.1:{s.port}"
    await s.close()
    await other.close()


@pytest.mark.parametrize("kind", CLIENTS)
async def test_both_clients_read_redirect_authenticate_and_refuse_alike(server, kind, monkeypatch):
    seen, root = server
    async with asyncio.timeout(60):
        c = CLIENTS[kind]()
        try:
            for path in ("", "/chunked/metrics", "/gzip/metrics", "/old/metrics"):
                r = await fetch(c, root + path)
                assert r.kind == "vllm" and len(r.exposition.samples) > 20, path
            with pytest.raises(SourceError, match=r"redirected to another server \(http://localhost:\d+/metrics\)"):
                await fetch(c, root + "/cross/metrics")
            basic = root.replace("http://", "http://ops:p%40ss@")
            await fetch(c, basic)
            assert seen.auth[-1] == "Basic b3BzOnBAc3M="  # ops:p@ss
            await fetch(c, root, api_key="sk-1")
            assert seen.auth[-1] == "Bearer sk-1"
            with pytest.raises(SourceError, match="no complete answer within 1.5 s"):
                await fetch(c, root + "/hostile/trickle/metrics", deadline_s=1.5)
            monkeypatch.setattr(scrape, "MAX_BODY", 2**20)
            with pytest.raises(SourceError, match="larger than 1 MiB"):
                await fetch(c, root + "/hostile/endless/metrics")
            assert seen.hostile.sent < 16 * 2**20
            # after a cut-off read the next one is whole (the half-read connection was dropped)
            assert (await fetch(c, root)).kind == "vllm"
            with pytest.raises(SourceError, match="cannot connect"):
                await fetch(c, "http://127.0.0.1:1")
        finally:
            await c.aclose()


async def test_the_light_client_keeps_one_connection_and_survives_its_close(server):
    seen, root = server
    c = ScrapeClient()
    try:
        for _ in range(5):
            await fetch(c, root)
        assert len(seen.peers) == 1  # kept alive: one connection for five reads
        for conns in c._idle.values():
            for _, writer in conns:
                writer.transport.abort()  # as a server closing an idle connection between two ticks would
        await asyncio.sleep(0.05)
        assert (await fetch(c, root)).kind == "vllm"
        assert len(seen.peers) == 2
        # sources behind one origin (a proxy routing replicas by path) read side by side
        got = await asyncio.gather(*(fetch(c, root) for _ in range(4)))
        assert all(r.kind == "vllm" and len(r.exposition.samples) > 20 for r in got)
        assert 2 < len(seen.peers) <= 5 and sum(len(v) for v in c._idle.values()) <= 4
    finally:
        await c.aclose()


class _Wire:
    """The client's side of an in-memory connection: what it writes is kept."""

    def __init__(self) -> None:
        self.sent = b""

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        pass


class Switchable:
    """A light client's connections, in memory, to a server serving ``body`` as /metrics that
    can be taken down (``up = False``): a refused connection at once, or, with ``down_cost_s``, a
    host that drops the attempt after that long (a failure that costs time, so the poller backs
    off). Each connection reads one answer and the connection's end."""

    def __init__(self, body: bytes, down_cost_s: float = 0.0, clock: list[float] | None = None) -> None:
        """``clock``: a virtual clock (the poller's) the dropped attempt moves on by ``down_cost_s``
        instead of sleeping it."""
        self.answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body),
            body,
        )
        self.down_cost_s = down_cost_s
        self.clock = clock
        self.up = True
        self.tried = 0
        """Connections asked for."""

    async def connect(self, origin: tuple[str, str, int]) -> tuple[asyncio.StreamReader, Any]:
        self.tried += 1
        if not self.up:
            if self.down_cost_s:
                if self.clock is not None:
                    self.clock[0] += self.down_cost_s
                else:
                    await asyncio.sleep(self.down_cost_s)
                raise ConnectFailed(f"no connection within {CONNECT_TIMEOUT_S:g} s")
            raise ConnectFailed("connection refused")
        reader = asyncio.StreamReader(limit=MAX_HEADER)
        reader.feed_data(self.answer)
        reader.feed_eof()  # the server closes after one answer (a kept-alive one is found closed)
        return reader, _Wire()

    def client(self) -> ScrapeClient:
        return ScrapeClient(self.connect)


def answering(answer: bytes) -> tuple[ScrapeClient, list[_Wire]]:
    """A light client whose every connection reads ``answer`` and then the connection's end:
    the client's reading of each kind of answer, without a server or a socket."""
    wires: list[_Wire] = []

    async def connect(origin: tuple[str, str, int]) -> tuple[asyncio.StreamReader, Any]:
        reader = asyncio.StreamReader(limit=MAX_HEADER)
        reader.feed_data(answer)
        reader.feed_eof()
        wires.append(_Wire())
        return reader, wires[-1]

    return ScrapeClient(connect), wires


@pytest.mark.parametrize(
    ("answer", "expect"),
    [
        (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + VLLM.encode(), None),  # to the connection's end
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP/1.x answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "ended early"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunked body"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\nxx", "encoding not asked for"),
        (b"HTTP/1.1 503 Unavailable\r\nContent-Length: 0\r\n\r\n", "HTTP 503"),
        (b"", "closed the connection without an answer"),
    ],
)
async def test_the_light_client_reads_or_names_each_kind_of_answer(answer, expect):
    root = "http://gpu-a:8000"
    c, wires = answering(answer)
    try:
        if expect is None:
            assert (await fetch(c, root)).kind == "vllm"
        else:
            with pytest.raises(SourceError, match=expect) as e:
                await fetch(c, root)
            assert "gpu-a:8000" in str(e.value)  # the message names the source
        # one request, as the client wrote it to the wire
        assert len(wires) == 1 and wires[0].sent.startswith(b"GET /metrics HTTP/1.1\r\nHost: gpu-a:8000\r\n")
    finally:
        await c.aclose()


async def test_the_light_client_checks_certificates_by_the_process_rule(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    s = TestServer(app(Seen()), host="127.0.0.1")
    await s.start_server(ssl=ctx)
    url = f"https://127.0.0.1:{s.port}"
    try:
        c = ScrapeClient()
        with pytest.raises(SourceError, match="certificate verify failed"):
            await fetch(c, url)
        await c.aclose()
        for rule in ((str(cert), False), (None, True)):
            http.configure_tls(*rule)
            c = ScrapeClient()
            assert (await fetch(c, url)).kind == "vllm"
            await c.aclose()
    finally:
        await s.close()


async def test_a_proxy_in_the_environment_sends_the_pollers_through_httpx(monkeypatch):
    for var in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert not needs_httpx("http://192.0.2.5:8000")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert needs_httpx("http://192.0.2.5:8000")
    assert not needs_httpx("http://127.0.0.1:8000")
    assert not needs_httpx("https://192.0.2.5:8000")  # HTTP_PROXY is for http only
    poller = VllmPoller(["http://192.0.2.5:8000"])
    try:
        await poller.poll(wait_s=0.01)
        assert not isinstance(poller._client, ScrapeClient)
    finally:
        await poller.aclose()
    poller = VllmPoller(["http://127.0.0.1:1"])
    try:
        await poller.poll()
        assert isinstance(poller._client, ScrapeClient)
    finally:
        await poller.aclose()


async def test_a_host_that_never_answers_the_connection_reads_as_down_in_two_seconds(monkeypatch):
    """As httpx's connect timeout: a host dropping the connection attempt (a firewall, a dead
    machine) is down within CONNECT_TIMEOUT_S, not at the scrape's whole deadline."""
    from spoc_tui.collectors import lighthttp

    async def never(*args, **kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(lighthttp.asyncio, "open_connection", never)
    monkeypatch.setattr(lighthttp, "CONNECT_TIMEOUT_S", 0.2)
    c = ScrapeClient()
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(SourceError, match=r"cannot connect \(no connection within 0.2 s\)"):
        await fetch(c, "http://192.0.2.5:8000")
    assert asyncio.get_running_loop().time() - t0 < 5
