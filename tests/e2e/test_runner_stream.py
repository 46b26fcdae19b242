"""The load generator's timing path (spoc_tui/load/runner.py ``send_chat``) against scripted
servers: each SSE event is timestamped when it arrives (not when a read buffer fills), and every
way a stream can go wrong is one error kind. The runner patches the whole process with gevent,
so it runs in a child process; the servers are plain sockets on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

CHILD = r"""
import json, sys
from spoc_tui.load import runner
from locust.env import Environment
from locust.contrib.fasthttp import FastHttpSession
out = []
runner.Shared.sink = out.append
runner.Shared.model = "m"
env = Environment()
s = FastHttpSession(sys.argv[1], env.events.request, None, network_timeout=float(sys.argv[2]), connection_timeout=2.0)
answer, ended = runner.send_chat(s, [{"role": "user", "content": "hi"}], 4, 0, "c-1", after=(0.0, 0.25))
assert ended == out[0].end, (ended, out[0].end)
print(json.dumps({"answer": answer, **out[0].as_dict()}))
"""

GAP_S = 0.4
"""Between the test server's events: long beside a loaded host's stalls (0.08 s was: beside a CPU
hog the client's first event came 0.104 s after its request), so the gaps the client measures
are the server's, not the host's."""


def event(content: str | None, usage: bool = False) -> bytes:
    ev: dict[str, object] = {
        "id": "chatcmpl-1",
        "choices": [] if content is None else [{"delta": {"content": content}}],
    }
    if usage:
        ev["usage"] = {"prompt_tokens": 5, "completion_tokens": 3}
    return b"data: " + json.dumps(ev).encode() + b"\n\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def good(conn: socket.socket) -> None:
    conn.sendall(STREAM_HEAD)
    for piece in ("a", "b", "c"):
        conn.sendall(chunk(event(piece)))
        time.sleep(GAP_S)
    conn.sendall(chunk(event(None, usage=True) + b"data: [DONE]\n\n") + b"0\r\n\r\n")


def server_error(conn: socket.socket) -> None:
    body = b'{"error": "boom"}'
    conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def broken(conn: socket.socket) -> None:
    conn.sendall(STREAM_HEAD + chunk(event("a")))
    time.sleep(GAP_S)
    conn.shutdown(socket.SHUT_RDWR)


def stalled(conn: socket.socket) -> None:
    conn.sendall(STREAM_HEAD + chunk(event("a")))
    time.sleep(3)


def no_done(conn: socket.socket) -> None:
    conn.sendall(STREAM_HEAD + chunk(event("a")) + b"0\r\n\r\n")


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    socks: list[socket.socket] = []

    def start(behave: Callable[[socket.socket], None]) -> str:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        socks.append(srv)

        def loop() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                buf = b""
                while b"\r\n\r\n" not in buf:
                    buf += conn.recv(65536)
                head, _, body = buf.partition(b"\r\n\r\n")
                length = next(
                    int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                assert json.loads(body)["stream"] is True
                try:
                    behave(conn)
                finally:
                    conn.close()

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{srv.getsockname()[1]}"

    yield start
    for s in socks:
        s.close()


def send(url: str, timeout: float = 5.0) -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(timeout)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_each_event_is_timed_when_it_arrives(serve):
    s = send(serve(good))
    assert s["ok"] is True and s["error"] is None
    assert s["answer"] == "abc"
    assert (s["output_tokens"], s["prompt_tokens"], s["request_id"]) == (3, 5, "chatcmpl-1")
    # three events GAP_S apart: two gaps of about GAP_S each, not one buffered read of all three
    gaps = s["itl"]
    assert isinstance(gaps, list) and len(gaps) == 2
    assert all(GAP_S * 0.7 < g < GAP_S * 3 for g in gaps), gaps
    assert isinstance(s["ttft"], float) and s["ttft"] < GAP_S
    # sent "after" an answer that ended at the epoch with a wait of 0.25 s asked (issue 77)
    assert s["since_answer"] == s["start"] and s["asked_wait"] == 0.25


@pytest.mark.parametrize(
    ("behave", "kind"),
    [(server_error, "http_5xx"), (broken, "stream"), (no_done, "stream"), (stalled, "timeout")],
)
def test_every_way_a_stream_fails_is_one_error_kind(serve, behave, kind):
    s = send(serve(behave), timeout=1.0)
    assert s["ok"] is False
    assert s["error"] == kind
    assert s["answer"] is None


def test_a_refused_connection_is_connect():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    s = send(f"http://127.0.0.1:{port}")
    assert (s["ok"], s["error"]) == (False, "connect")


COHORT_CHILD = r"""
import json, time, gevent
from spoc_tui.load import runner
C = runner.Cohort
runner.COHORT_DRAIN_S = 3.0
class R:
    user_count = 0
r = R()
t0 = time.perf_counter()
started = {}
def user(k, busy_s):
    gevent.sleep(busy_s)  # its request in flight when the step begins
    gen = C.join(k)
    started[k] = (gen, round(time.perf_counter() - t0, 3))
r.user_count = 2
C.next(r, 2)  # step 1: user 1 is busy for 0.5 s, user 0 waits for it
gs = [gevent.spawn(user, 0, 0.0), gevent.spawn(user, 1, 0.5)]
gevent.sleep(0.1)
r.user_count = 3
C.next(r, 3)  # step 2 begins before step 1's cohort started: its waiting user is carried over
gs.append(gevent.spawn(user, 2, 0.0))
gevent.joinall(gs, timeout=10)
print(json.dumps(started))
"""


def test_lockstep_cohorts_start_together_and_a_step_takes_the_last_ones_waiters():
    """--arrivals lockstep: every user of a step starts at one instant once the requests in flight
    end; a step that begins while the last one's users still wait for theirs (its drain outlasted
    the step) takes them into its own cohort (they waited on a start that never came)."""
    r = subprocess.run([sys.executable, "-c", COHORT_CHILD], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    started = json.loads(r.stdout)
    assert sorted(started) == ["0", "1", "2"], started
    gens = {g for g, _ in started.values()}
    times = [t for _, t in started.values()]
    assert gens == {2}, started  # all in the second step's cohort
    assert max(times) - min(times) < 0.05 and 0.45 < min(times) < 1.0, started  # together, once user 1 was free
