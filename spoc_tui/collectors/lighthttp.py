"""A small HTTP/1.1 GET client for the monitor's scrapes, one kept-alive connection per origin.

The monitor reads ``/metrics`` of every server and exporter once a second. Through httpx a read
of a 25 KB body cost about 3 ms of CPU on the 2-core CI machine (its transport layers, anyio,
h11), a third of what the monitor spent on its sources; through this about 0.6 ms. It keeps the
rules of :mod:`spoc_tui.collectors.http`, so a scrape behaves alike through either:

- TLS by the process's rule (``--ca-bundle``, ``--insecure``; the same context httpx builds);
- a URL's ``user:pass@`` sent as HTTP Basic authentication; the caller's headers (a Bearer key);
- redirects followed within the same origin only, at most :data:`~spoc_tui.collectors.http.MAX_REDIRECTS`;
- bodies of ``Content-Length``, chunked or to the connection's end, refused past ``max_body`` while
  they stream; gzip or deflate decoded if a server sends them unasked.

What it does not do (a proxy from the environment) is left to httpx: :func:`needs_httpx`. Deadlines
are the caller's (``asyncio.timeout``); a read cut off anywhere drops its connection, so a
half-read answer is never taken for the next one.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import urllib.request
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

import httpx

from spoc_tui.collectors.http import MAX_REDIRECTS, RedirectRefused, same_origin, verify
from spoc_tui.core.redact import redact_url

MAX_HEADER = 64 * 1024
"""An answer's status line and headers together."""
READ_CHUNK = 256 * 1024
CONNECT_TIMEOUT_S = 2.0
"""As the httpx path's connect timeout: a host that drops the connection attempt reads as down
in 2 s, not at the scrape's whole deadline."""


class HttpFailure(Exception):
    """A GET that did not give an answer; the message says why in a few words."""


class ConnectFailed(HttpFailure):
    """No connection: refused, unreachable, a name that does not resolve, a TLS handshake refused."""


class BodyTooLarge(HttpFailure):
    pass


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    content_type: str | None


Origin = tuple[str, str, int]


def needs_httpx(url: str) -> bool:
    """True where the environment routes ``url`` through a proxy (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY`` unless ``NO_PROXY`` names the host): httpx reads it that way, this client not."""
    proxies = urllib.request.getproxies_environment()
    parts = urlsplit(url)
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass_environment(parts.hostname or "", proxies)  # type: ignore[attr-defined]


def _reason(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, ssl.SSLError):
        return f"TLS: {e}"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve the host ({e.strerror})"
    return str(e) or type(e).__name__


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ScrapeClient:
    """GETs over kept-alive connections: a connection is taken from its origin's idle ones (or
    opened) for one request and given back when the answer was read whole, so reads of sources
    behind one origin (a proxy routing replicas by path) run side by side."""

    def __init__(self, connect: Callable[[Origin], Awaitable[Conn]] | None = None) -> None:
        """
        Args:
            connect: opens a connection to an origin (scheme, host, port); None: TCP (and TLS for
                https) within :data:`CONNECT_TIMEOUT_S`. Tests hand it in-memory streams.
        """
        self._idle: dict[Origin, list[Conn]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._open = connect or self._connect

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()

    def _give_back(self, origin: Origin, conn: Conn) -> None:
        self._idle.setdefault(origin, []).append(conn)

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(verify=verify())
        return self._ssl

    async def get(self, url: str, headers: dict[str, str], max_body: int) -> Answer:
        """GET ``url``, following same-origin redirects.

        Raises:
            ConnectFailed, BodyTooLarge, HttpFailure, RedirectRefused.
        """
        for _ in range(MAX_REDIRECTS + 1):
            status, body, head = await self._get_once(url, headers, max_body)
            location = head.get("location")
            if status not in (301, 302, 303, 307, 308) or location is None:
                return Answer(status, body, head.get("content-type"))
            target = urljoin(url, location)
            if not same_origin(url, target):
                raise RedirectRefused(
                    f"redirected to another server ({redact_url(target)}): not followed; give that URL if it is right"
                )
            url = target
        raise RedirectRefused(f"more than {MAX_REDIRECTS} redirects")

    async def _get_once(self, url: str, headers: dict[str, str], max_body: int) -> tuple[int, bytes, dict[str, str]]:
        parts = urlsplit(url)
        scheme, host = parts.scheme, parts.hostname or ""
        if scheme not in ("http", "https") or not host:
            raise HttpFailure(f"not an http(s) URL with a host: {redact_url(url)}")
        port = parts.port or (443 if scheme == "https" else 80)
        origin = (scheme, host, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        shown_host = f"[{host}]" if ":" in host else host
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {shown_host}" + (f":{parts.port}" if parts.port else ""),
            "User-Agent: spoc-tui",
            "Accept-Encoding: identity",
        ]
        if any(c in "\r\n\0" for kv in headers.items() for c in "".join(kv)):
            # a header's line break would send what follows as headers of its own (issue 74)
            raise HttpFailure("a request header holds a line break; nothing was sent")
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if parts.username is not None and not any(k.lower() == "authorization" for k in headers):
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            lines.append("Authorization: Basic " + base64.b64encode(pair).decode("ascii"))
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        for attempt in (0, 1):
            idle = self._idle.get(origin)
            reused = bool(idle)
            conn = idle.pop() if idle else await self._open(origin)
            reader, writer = conn
            try:
                writer.write(request)
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as e:
                    if reused and not e.partial and attempt == 0:
                        # the server closed a kept-alive connection between two ticks: a new one
                        writer.close()
                        continue
                    raise HttpFailure("the server closed the connection without an answer") from None
                except (ConnectionResetError, BrokenPipeError):
                    if reused and attempt == 0:
                        writer.close()
                        continue
                    raise
                status, fields, keep = _head(head)
                body, to_end = await _body(reader, status, fields, max_body)
            except asyncio.IncompleteReadError:
                writer.close()
                raise HttpFailure("the answer ended early") from None
            except asyncio.LimitOverrunError:
                writer.close()
                raise HttpFailure(f"an answer's header or chunk line longer than {MAX_HEADER // 1024} KiB") from None
            except OSError as e:
                writer.close()
                raise HttpFailure(f"connection lost ({_reason(e)})") from None
            except BaseException:  # a deadline's cancellation among them: the connection is mid-answer
                writer.close()
                raise
            if to_end or not keep:
                writer.close()
            else:
                self._give_back(origin, conn)
            return status, _decoded(body, fields, max_body), fields
        raise HttpFailure("the server closed the connection without an answer")

    async def _connect(self, origin: Origin) -> Conn:
        scheme, host, port = origin
        tls = self._tls() if scheme == "https" else None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(
                    host, port, ssl=tls, server_hostname=host if tls else None, limit=MAX_HEADER
                )
        except TimeoutError:
            raise ConnectFailed(f"no connection within {CONNECT_TIMEOUT_S:g} s") from None
        except OSError as e:  # a TLS handshake refused (ssl.SSLError) among them
            raise ConnectFailed(_reason(e)) from None


def _head(raw: bytes) -> tuple[int, dict[str, str], bool]:
    """Status, headers (lower-case names; repeated ones joined by commas) and whether the
    connection stays open after this answer."""
    text = raw.decode("latin-1")
    status_line, _, rest = text.partition("\r\n")
    version, _, tail = status_line.partition(" ")
    code = tail[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise HttpFailure(f"not an HTTP/1.x answer ({status_line[:60]!r})")
    fields: dict[str, str] = {}
    for line in rest.split("\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpFailure(f"a malformed header line ({line[:60]!r})")
        key = name.strip().lower()
        value = value.strip()
        fields[key] = f"{fields[key]}, {value}" if key in fields else value
    conn = fields.get("connection", "").lower()
    keep = "close" not in conn and (version != "HTTP/1.0" or "keep-alive" in conn)
    return int(code), fields, keep


async def _body(reader: asyncio.StreamReader, status: int, fields: dict[str, str], max_body: int) -> tuple[bytes, bool]:
    """The body, and whether it ran to the connection's end (then the connection is spent)."""
    if status in (204, 304) or 100 <= status < 200:
        return b"", False
    too_large = BodyTooLarge(f"response larger than {max_body // 2**20} MiB")
    if "chunked" in fields.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        size = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                n = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HttpFailure("a malformed chunked body") from None
            if n == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                    pass
                return b"".join(chunks), False
            size += n
            if size > max_body:
                raise too_large
            chunks.append(await reader.readexactly(n))
            if await reader.readexactly(2) != b"\r\n":
                raise HttpFailure("a malformed chunked body")
    declared = fields.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise HttpFailure(f"a malformed Content-Length ({declared[:20]!r})")
        if int(declared) > max_body:
            raise too_large
        return await reader.readexactly(int(declared)), False
    # neither: the body runs to the connection's end
    parts: list[bytes] = []
    size = 0
    while chunk := await reader.read(READ_CHUNK):
        size += len(chunk)
        if size > max_body:
            raise too_large
        parts.append(chunk)
    return b"".join(parts), True


def _decoded(body: bytes, fields: dict[str, str], max_body: int) -> bytes:
    coding = fields.get("content-encoding", "identity").lower().strip()
    if coding in ("", "identity"):
        return body
    if coding not in ("gzip", "deflate"):
        raise HttpFailure(f"a body in an encoding not asked for ({coding})")
    d = zlib.decompressobj(wbits=47)  # gzip or zlib, told apart by their headers
    try:
        out = d.decompress(body, max_body + 1)
    except zlib.error as e:
        raise HttpFailure(f"a {coding} body that does not decode ({e})") from None
    if len(out) > max_body:
        raise BodyTooLarge(f"response larger than {max_body // 2**20} MiB")
    return out
