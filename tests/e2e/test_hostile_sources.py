"""Slow, endless and hostile sources (issue 17, items 1-3 and 6): every read has a whole-response
deadline, a body is limited while it streams, one slow source never holds the others back, and
no input makes the parser backtrack."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from spoc_tui.collectors import scrape
from spoc_tui.collectors.poller import VllmPoller
from spoc_tui.collectors.scrape import SourceError, fetch, read_file
from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.core.metrics.vllm import Scrape, server_view, split_by_engine

FIX = Path(__file__).resolve().parents[1] / "fixtures"
VLLM = (FIX / "vllm" / "vllm_0.32_cpu_full_load.txt").read_text()


class Servers:
    """A loopback aiohttp server with a healthy, a trickling and an endless /metrics."""

    def __init__(self) -> None:
        self.sent = 0

    def app(self) -> web.Application:
        async def healthy(_: web.Request) -> web.Response:
            return web.Response(text=VLLM, content_type="text/plain")

        async def trickle(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            for _ in range(60):  # one byte every 0.5 s: no single read ever times out
                await resp.write(b"#")
                await asyncio.sleep(0.5)
            return resp

        async def endless(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            line = b"vllm:num_requests_running 1\n" * 4096
            try:
                while True:
                    await resp.write(line)
                    self.sent += len(line)
            except (ConnectionError, RuntimeError):
                return resp

        app = web.Application()
        app.router.add_get("/healthy/metrics", healthy)
        app.router.add_get("/trickle/metrics", trickle)
        app.router.add_get("/endless/metrics", endless)
        return app


class InMemory:
    """The same three sources for httpx's client, in memory: no server and no socket (the reads'
    rules are the subject, and how they hold over a real socket, for both clients, is
    tests/e2e/test_light_http.py's, on :class:`Servers`)."""

    root = "http://gpu-a:8000"

    def __init__(self) -> None:
        self.sent = 0

    async def _trickle(self):
        for _ in range(60):  # one byte every 0.5 s: no single read ever times out
            yield b"#"
            await asyncio.sleep(0.5)

    async def _endless(self):
        line = b"vllm:num_requests_running 1\n" * 4096
        while True:
            self.sent += len(line)
            yield line

    def client(self) -> httpx.AsyncClient:
        def answer(request: httpx.Request) -> httpx.Response:
            head = {"Content-Type": "text/plain"}
            if request.url.path == "/healthy/metrics":
                return httpx.Response(200, text=VLLM, headers=head)
            if request.url.path == "/trickle/metrics":
                return httpx.Response(200, content=self._trickle(), headers=head)
            if request.url.path == "/endless/metrics":
                return httpx.Response(200, content=self._endless(), headers=head)
            return httpx.Response(404)

        return httpx.AsyncClient(transport=httpx.MockTransport(answer), timeout=scrape.DEFAULT_TIMEOUT)


async def test_a_trickling_server_hits_the_whole_response_deadline():
    src = InMemory()
    async with src.client() as c:
        t0 = time.monotonic()
        with pytest.raises(SourceError, match="no complete answer within 1.5 s"):
            await fetch(c, f"{src.root}/trickle/metrics", deadline_s=1.5)
        assert time.monotonic() - t0 < 10  # not the 30 s the body would take


async def test_an_endless_body_is_cut_while_it_streams(monkeypatch):
    src = InMemory()
    monkeypatch.setattr(scrape, "MAX_BODY", 2**20)
    async with src.client() as c:
        with pytest.raises(SourceError, match="larger than 1 MiB"):
            await fetch(c, f"{src.root}/endless/metrics")
    assert src.sent < 16 * 2**20  # stopped near the limit, not downloaded whole


async def test_a_slow_source_does_not_hold_the_others_back():
    src = InMemory()
    root = src.root
    poller = VllmPoller([f"{root}/healthy/metrics", f"{root}/trickle/metrics"], client=src.client())
    try:
        t0 = time.monotonic()
        tick = await poller.poll(wait_s=0.5)
        assert time.monotonic() - t0 < 3
        assert [v.source for v in tick.servers] == [f"{root}/healthy/metrics"]
        assert poller.slow() == {f"{root}/trickle/metrics"}
        tick = await poller.poll(wait_s=0.5)  # the slow read goes on; the healthy row is fresh again
        assert [v.source for v in tick.servers] == [f"{root}/healthy/metrics"]
    finally:
        await poller.aclose()


async def test_a_broken_url_fails_its_source_and_polling_goes_on():
    """A source whose URL cannot be read fails alone, and the healthy one is read (served through
    httpx's in-memory transport: the URL's check is the subject, not the socket)."""
    healthy = "http://127.0.0.1:8000/healthy/metrics"
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200, text=VLLM)))
    poller = VllmPoller(["http://127.0.0.1:99999", healthy], client=client)
    try:
        tick = await poller.poll()
    finally:
        await poller.aclose()
    assert [v.source for v in tick.servers] == [healthy]
    down = [s for s in tick.statuses if not s.up]
    assert len(down) == 1 and "not a valid URL" in (down[0].reason or "")


def test_files_are_read_with_a_bound(tmp_path):
    with pytest.raises(SourceError, match="not a regular file"):
        read_file("/dev/zero")
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SourceError, match="not UTF-8"):
        read_file(str(binary))


HOSTILE = r"""
import sys
from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.core.metrics.vllm import Scrape, server_view
cases = [
    "vllm:x" + " " * 4_000_000 + "\n",
    "vllm:x" + " " * 4_000_000 + "x y z\n",
    'vllm:x{a="1",' + " " * 4_000_000 + "x} 1\n",
    "vllm:x{" + ",".join(f'l{i}="v"' for i in range(200_000)) + "} 1\n",
    "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(50_000)),
]
for text in cases:
    server_view("x", Scrape(parse_text(text), 1.0))
print("ok")
"""


def test_no_input_makes_the_parser_backtrack():
    """Inputs that took hours with backtracking (53 s for 100 KB of blanks, quadratic; here 4 MB)
    or quadratic per-engine work (50,000 engines) finish: in a child with a limit a thousand
    times what they need, so a regression hangs no test run."""
    r = subprocess.run([sys.executable, "-c", HOSTILE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_per_engine_rows_come_from_one_pass():
    text = "".join(
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {e + 1}\n'
        f'vllm:num_requests_waiting{{engine="{e}",model_name="m"}} {2 * e}\n'
        for e in range(3)
    )
    exp = parse_text(text)
    assert sorted(split_by_engine(exp)) == ["0", "1", "2"]
    view = server_view("x", Scrape(exp, 1.0))
    assert [(e.engine, e.running, e.waiting) for e in view.engines] == [("0", 1, 0), ("1", 2, 2), ("2", 3, 4)]
    assert view.total.running == 6 and view.total.waiting == 6


def test_inspect_prints_no_escape_sequence_and_no_password(tmp_path):
    evil = tmp_path / "evil.txt"
    evil.write_text(VLLM.replace('model_name="', 'model_name="\x1b]52;c;ZWNobyBoaQ==\x07\x1b[2J', 1))
    for args in ([str(evil)], [str(evil), "--json"]):
        r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", "inspect", *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout
        assert "\\x1b]52" in r.stdout or "\\\\x1b]52" in r.stdout  # shown, inert


@pytest.fixture()
async def servers():
    s = Servers()
    server = TestServer(s.app(), host="127.0.0.1")
    await server.start_server()
    yield s, f"http://127.0.0.1:{server.port}"
    await server.close()


async def test_inspect_json_and_errors_never_show_a_url_password(servers):
    _, root = servers
    with_pw = root.replace("http://", "http://admin:hunter2@")
    for target in (f"{with_pw}/healthy/metrics", f"{with_pw}/missing/metrics"):
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "spoc_tui.cli", "inspect", target, "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(p.communicate(), 60)
        text = out.decode() + err.decode()
        assert "hunter2" not in text and "***@127.0.0.1" in text, text[-300:]


def test_a_body_past_the_sample_limit_is_refused_before_parsing(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("vllm:num_requests_running 1\n" * 200_001)
    with pytest.raises(SourceError, match="more than the 200,000 a scrape may have"):
        read_file(str(big))
