"""Reading exposition text from URLs and files (the I/O edge of the telemetry core)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit, urlunsplit

import httpx

from spoc_tui.collectors.http import RedirectRefused, new_client, request
from spoc_tui.collectors.lighthttp import ConnectFailed, HttpFailure, ScrapeClient
from spoc_tui.core.errors import SpocError, first_line
from spoc_tui.core.files import FileReadError, read_text_bounded
from spoc_tui.core.hardware.gpu import is_dcgm
from spoc_tui.core.metrics.promparse import Exposition, TooLarge, check_size, parse_text
from spoc_tui.core.metrics.vllm import is_vllm
from spoc_tui.core.redact import redact_text, redact_url

DEFAULT_TIMEOUT = httpx.Timeout(5.0, connect=2.0)
DEADLINE_S = 10.0
"""A whole scrape (connect, headers, every byte of the body) must finish within this; httpx's
own timeouts are per read, so a server trickling a byte every few seconds never trips them."""
MAX_BODY = 64 * 2**20
"""Bodies larger than this are refused while they stream in, never downloaded whole."""
# Plain text only: vLLM's OpenMetrics output is broken (see reference/exposition_notes.md).
ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"


class SourceError(SpocError):
    """A source that cannot be read or parsed; the message names it."""


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


@lru_cache(maxsize=256)
def metrics_url(url: str) -> str:
    """Accept a server's base URL (or its OpenAI ``/v1`` URL) and return its /metrics URL
    (worked out once per URL: a poller asks every second).

    Raises:
        SourceError: when the URL has no host.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises for a port out of 0-65535)
    except ValueError as e:  # "Invalid IPv6 URL", "Port out of range 0-65535"
        raise SourceError(f"{redact_text(url)}: not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceError(f"{redact_url(url)}: not an http(s) URL with a host")
    path = parts.path.rstrip("/")
    if path in ("", "/v1"):
        path = "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def base_url(url: str) -> str:
    """The server root of a vLLM URL (``http://h:8000/metrics`` -> ``http://h:8000``)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


@dataclass(frozen=True, slots=True)
class Reading:
    """One successful read of one source."""

    source: str
    kind: str
    """``vllm`` or ``dcgm``."""
    exposition: Exposition
    taken_at: float
    """Monotonic seconds."""
    wall_time: float
    derived: object = None
    """What ``fetch``'s ``derive`` made of it in the parsing thread, or the exception it raised (a
    defect of the caller's, for the caller to raise); None: no ``derive``, or a kind it was not for."""


def classify(source: str, exp: Exposition) -> str:
    if is_vllm(exp):
        return "vllm"
    if is_dcgm(exp):
        return "dcgm"
    if exp.errors and not exp.samples:
        raise SourceError(f"{source}: not Prometheus exposition text ({exp.errors[0]})")
    raise SourceError(f"{source}: no vLLM or DCGM metrics found")


def read_file(path: str) -> Reading:
    """Read saved exposition text.

    Raises:
        SourceError: missing, unreadable, binary or metric-less files.
    """
    try:
        text = read_text_bounded(path, MAX_BODY)
    except FileReadError as e:
        raise SourceError(f"{path}: {e}") from None
    try:
        check_size(text)
    except TooLarge as e:
        raise SourceError(f"{path}: {e}") from None
    exp = parse_text(text)
    return Reading(path, classify(path, exp), exp, time.monotonic(), time.time())


def auth_headers(api_key: str | None) -> dict[str, str]:
    headers = {"Accept": ACCEPT}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


async def fetch(
    client: httpx.AsyncClient | ScrapeClient,
    url: str,
    api_key: str | None = None,
    deadline_s: float = DEADLINE_S,
    derive: tuple[str, Callable[[Exposition], object]] | None = None,
) -> Reading:
    """Scrape one URL within ``deadline_s`` as a whole, the body limited to :data:`MAX_BODY`
    as it streams; the text is parsed in a worker thread, so a huge or hostile body never holds
    up the caller's event loop (the TUI's). ``client``: httpx's, or the monitor's lighter
    :class:`~spoc_tui.collectors.lighthttp.ScrapeClient` (the same rules, a sixth of the CPU).
    ``derive``: ``(kind, f)``: when the source serves that kind, ``f(exposition)`` runs in the same
    thread, straight after parsing, into :attr:`Reading.derived` (the monitor's server view: one
    hop to a thread a scrape, not two).

    Raises:
        SourceError: connection failures, timeouts, HTTP errors, bodies too large and bodies
            without metrics, each with a one-line reason that names the URL (never the API key).
    """
    target = metrics_url(url)
    url, shown_target = redact_url(url), redact_url(target)  # what messages show: never a password
    try:
        async with asyncio.timeout(deadline_s):
            status, body, ctype = await _download(client, target, api_key, url)
    except TimeoutError:
        raise SourceError(f"{url}: no complete answer within {deadline_s:g} s") from None
    except httpx.TimeoutException:
        raise SourceError(f"{url}: timed out") from None
    except httpx.ConnectError as e:
        raise SourceError(f"{url}: cannot connect ({_short(e)})") from None
    except RedirectRefused as e:
        raise SourceError(f"{url}: {e}") from None
    except httpx.HTTPError as e:
        raise SourceError(f"{url}: {type(e).__name__} ({_short(e)})") from None
    except ConnectFailed as e:
        raise SourceError(f"{url}: cannot connect ({_short(e)})") from None
    except HttpFailure as e:
        raise SourceError(f"{url}: {_short(e)}") from None
    if status != 200:
        raise SourceError(f"{url}: HTTP {status} from {shown_target}")
    try:
        exp, kind, derived = await asyncio.to_thread(_parse_and_derive, url, body, ctype, derive)
    except TooLarge as e:
        raise SourceError(f"{url}: {e}") from None
    return Reading(url, kind, exp, time.monotonic(), time.time(), derived)


async def _download(
    client: httpx.AsyncClient | ScrapeClient, target: str, api_key: str | None, url: str
) -> tuple[int, bytes, str | None]:
    if isinstance(client, ScrapeClient):  # its failures (a body too large among them) are HttpFailures
        answer = await client.get(target, auth_headers(api_key), MAX_BODY)
        return answer.status, answer.body if answer.status == 200 else b"", answer.content_type
    resp = await request(client, "GET", target, headers=auth_headers(api_key), stream=True)
    try:
        if resp.status_code != 200:
            return resp.status_code, b"", None
        declared = resp.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_BODY:
            raise SourceError(f"{url}: response larger than {MAX_BODY // 2**20} MiB")
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > MAX_BODY:
                raise SourceError(f"{url}: response larger than {MAX_BODY // 2**20} MiB")
            chunks.append(chunk)
        return resp.status_code, b"".join(chunks), resp.headers.get("content-type")
    finally:
        await resp.aclose()


def _parse_and_derive(
    url: str, body: bytes, content_type: str | None, derive: tuple[str, Callable[[Exposition], object]] | None
) -> tuple[Exposition, str, object]:
    exp = _decode_and_parse(body, content_type)
    kind = classify(url, exp)
    derived: object = None
    if derive is not None and derive[0] == kind:
        try:
            derived = derive[1](exp)
        except Exception as e:  # the caller's defect, not this source's failure: handed back
            derived = e
    return exp, kind, derived


def _decode_and_parse(body: bytes, content_type: str | None) -> Exposition:
    """Raises: TooLarge (see :func:`~spoc_tui.core.metrics.promparse.check_size`)."""
    text = body.decode("utf-8", errors="replace")
    check_size(text)
    return parse_text(text, content_type)


def _short(e: Exception) -> str:
    return first_line(e, 120)


async def read_source(client: httpx.AsyncClient, source: str, api_key: str | None = None) -> Reading:
    """A URL is scraped; anything else is read as a file."""
    if is_url(source):
        return await fetch(client, source, api_key)
    return read_file(source)


async def served_models(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> dict[str, int | None]:
    """``/v1/models`` of a vLLM server: each served model's ``max_model_len`` (None where not
    said). Reads only: no request is sent to the model.

    Raises:
        SourceError: unreachable, not 200, or not an OpenAI model list.
    """
    root = base_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with new_client(timeout_s) as c:
            r = await request(c, "GET", root + "/v1/models", headers=headers)
    except RedirectRefused as e:
        raise SourceError(f"{redact_url(root)}/v1/models: {e}") from None
    except httpx.HTTPError as e:
        raise SourceError(f"{redact_url(root)}/v1/models: {type(e).__name__}") from None
    if r.status_code != 200:
        raise SourceError(f"{redact_url(root)}/v1/models answered HTTP {r.status_code}")
    try:
        out: dict[str, int | None] = {}
        for m in r.json()["data"]:
            if not isinstance(m, dict):
                raise TypeError("a model that is not an object")
            n = m.get("max_model_len")
            out[str(m["id"])] = int(n) if isinstance(n, int) else None
        return out
    except (ValueError, KeyError, TypeError):
        raise SourceError(f"{redact_url(root)}/v1/models did not return an OpenAI model list") from None
