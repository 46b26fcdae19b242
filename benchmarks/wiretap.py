"""The wire as referee: every HTTP packet to and from one server port on the loopback, with the
kernel's own timestamp, and the streamed chat requests read back out of them.

A real vLLM server keeps no per-token log, but the kernel sees each of its SSE events leave: an
AF_PACKET socket on ``lo`` (root) with SO_TIMESTAMPNS gets the time each packet was handed to the
loopback, stamped by the kernel when it passes, however late this reader gets to it. A classic BPF
filter keeps only outgoing packets to or from the port that carry data (no ACKs), and the reader
drains its 256 MiB buffer 20 times a second, so it barely touches the cores the clients use.

Run as a process: ``python benchmarks/wiretap.py PORT FILE`` captures until SIGTERM; ``read_wire``
turns the file into one record per response: its id, when the request's last byte went out, and
when each event with ``choices`` went out (the same events `vllm bench serve` and spoc time).
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import json
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ETH_P_ALL = 3
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
SO_TIMESTAMPNS = 35
PACKET_OUTGOING = 4
REC = struct.Struct("<dHHI")  # kernel time, source port, destination port, payload length


def _filter(port: int) -> bytes:
    """cBPF: outgoing IPv4 TCP to or from ``port`` with a payload (lo's frames: 14-byte header)."""
    ins = [
        (0x20, 0, 0, 0xFFFFF004),  # ld pkttype (ancillary)
        (0x15, 0, 15, PACKET_OUTGOING),  # jeq outgoing, else drop
        (0x30, 0, 0, 23),  # ldb [23]: IP protocol
        (0x15, 0, 13, 6),  # jeq TCP, else drop
        (0xB1, 0, 0, 14),  # ldxb 4*([14]&0xf): IP header length
        (0x48, 0, 0, 14),  # ldh [x+14]: source port
        (0x15, 2, 0, port),  # jeq port: to the payload check
        (0x48, 0, 0, 16),  # ldh [x+16]: destination port
        (0x15, 0, 8, port),  # jeq port, else drop
        (0x50, 0, 0, 26),  # ldb [x+26]: TCP data offset
        (0x74, 0, 0, 4),  # rsh 4
        (0x64, 0, 0, 2),  # lsh 2: TCP header length
        (0x0C, 0, 0, 0),  # add x: IP + TCP header length
        (0x02, 0, 0, 0),  # st M[0]
        (0x28, 0, 0, 16),  # ldh [16]: IP total length
        (0x61, 0, 0, 0),  # ldx M[0]
        (0x2D, 1, 0, 0),  # jgt x: a payload, accept
        (0x06, 0, 0, 0),  # drop
        (0x06, 0, 0, 0x40000),  # accept
    ]
    return b"".join(struct.pack("HBBI", *i) for i in ins)


def capture(port: int, out: Path) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL))
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 256 << 20)
    prog = _filter(port)
    buf = ctypes.create_string_buffer(prog)
    fprog = struct.pack("HL", len(prog) // 8, ctypes.addressof(buf))
    s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind(("lo", 0))
    s.setblocking(False)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with out.open("wb") as f:
        print("ready", flush=True)
        while True:
            last = stop
            while True:
                try:
                    data, anc, _flags, _addr = s.recvmsg(1 << 18, 64)
                except BlockingIOError:
                    break
                ts = 0.0
                for _lvl, typ, d in anc:
                    if typ == SO_TIMESTAMPNS:
                        sec, ns = struct.unpack("qq", d[:16])
                        ts = sec + ns / 1e9
                ihl = (data[14] & 0xF) * 4
                tcp = 14 + ihl
                sport, dport, seq = struct.unpack("!HHI", data[tcp : tcp + 8])
                body = data[tcp + (data[tcp + 12] >> 4) * 4 :]
                f.write(REC.pack(ts, sport, dport, len(body)) + struct.pack("<I", seq) + body)
            if last:
                break
            time.sleep(0.05)


@dataclass
class Response:
    port: int  # the client's end of the connection
    sent: float  # when the request's last byte went out
    id: str | None = None
    events: list[float] = field(default_factory=list)  # each event with choices

    @property
    def ttft(self) -> float:
        return self.events[0] - self.sent


def read_wire(path: Path, server_port: int) -> list[Response]:
    """Every streamed response in the capture, in order, with its events' kernel times."""
    raw = path.read_bytes()
    i = 0
    streams: dict[int, list[tuple[float, bytes]]] = {}  # client port -> server's packets
    asked: dict[int, list[float]] = {}  # client port -> when each request packet went out
    while i < len(raw):
        ts, sport, dport, n = REC.unpack_from(raw, i)
        i += REC.size + 4
        body = raw[i : i + n]
        i += n
        if sport == server_port:
            streams.setdefault(dport, []).append((ts, body))
        elif dport == server_port:
            asked.setdefault(sport, []).append(ts)
    out: list[Response] = []
    for port, packets in streams.items():
        data = b"".join(b for _, b in packets)
        ends = list(itertools.accumulate(len(b) for _, b in packets))  # offset just past each packet
        times = [t for t, _ in packets]
        requests = sorted(asked.get(port, []))

        def when(offset: int, ends: list[int] = ends, times: list[float] = times) -> float:
            """The time of the packet that holds byte ``offset``."""
            return times[bisect.bisect_right(ends, offset)]

        cur: Response | None = None
        at = 0
        while True:
            head = data.find(b"HTTP/1.1 ", at)
            ev = data.find(b"data: ", at)
            if ev < 0 and head < 0:
                break
            if head >= 0 and (ev < 0 or head < ev):
                k = bisect.bisect_right(requests, when(head))  # the last request packet before it
                cur = Response(port, requests[k - 1] if k else float("nan"))
                out.append(cur)
                at = head + 9
                continue
            end = data.find(b"\n\n", ev)
            if end < 0:
                break
            at = end + 2
            payload = data[ev + 6 : end].strip()
            if cur is None or payload == b"[DONE]":
                continue
            try:
                doc = json.loads(payload)
            except ValueError:
                continue
            if cur.id is None and isinstance(doc.get("id"), str):
                cur.id = doc["id"]
            if doc.get("choices"):
                cur.events.append(when(end + 1))
    return [r for r in out if r.events]


if __name__ == "__main__":
    capture(int(sys.argv[1]), Path(sys.argv[2]))


class Tap:
    """``with Tap(port, file) as tap:`` captures while the block runs; ``tap.responses()`` after.
    Without root (no AF_PACKET) ``ok`` is False and nothing is captured."""

    def __init__(self, port: int, path: Path) -> None:
        self.port, self.path = port, path
        self.ok = False
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Tap:
        import os

        if os.geteuid() != 0:
            return self
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(self.port), str(self.path)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.ok = self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def responses(self) -> list[Response]:
        if not self.ok:
            return []
        try:
            return read_wire(self.path, self.port)
        finally:
            self.path.unlink(missing_ok=True)  # tens of MB a run
