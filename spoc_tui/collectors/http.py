"""One set of rules for every HTTP client spoc-tui opens (scrapes, /v1/models, the ramp's checks,
the load generator): TLS, redirects and credentials.

- **TLS**: the system's CA store (and ``SSL_CERT_FILE``), or ``--ca-bundle PATH`` /
  ``SPOC_CA_BUNDLE`` for a private CA; ``--insecure`` / ``SPOC_INSECURE=1`` skips verification
  (a self-signed bring-up host), said once on stderr. Set once per process by the CLI
  (:func:`configure_tls`), handed to the load generator by environment (:func:`tls_env`).
- **Redirects**: followed within the same origin (scheme, host and port: vLLM answers
  ``/metrics`` with a 307 to ``/metrics/`` on old versions), at most 5; a redirect to another
  origin is refused with a message naming where it pointed, in every command alike (the monitor
  and inspect used to follow it, the ramp refused it).
- **Credentials**: ``--api-key`` is sent as ``Authorization: Bearer``. A URL's ``user:pass@``
  is HTTP Basic authentication (for a proxy in front of vLLM). Both at once would fight over the
  one Authorization header: refused (:func:`check_credentials`).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from spoc_tui.core.errors import InputError
from spoc_tui.core.redact import key_error, redact_url

MAX_REDIRECTS = 5
CA_ENV = "SPOC_CA_BUNDLE"
INSECURE_ENV = "SPOC_INSECURE"


class RedirectRefused(httpx.HTTPError):
    """A redirect to another origin (or too many): not followed."""


@dataclass(frozen=True)
class Tls:
    ca_bundle: str | None = None
    insecure: bool = False


_tls = Tls(os.environ.get(CA_ENV) or None, os.environ.get(INSECURE_ENV, "") in ("1", "true", "yes"))


def configure_tls(ca_bundle: str | None, insecure: bool) -> None:
    """Set this process's TLS rule (the CLI, once, from its flags and environment).

    Raises:
        InputError: a CA bundle that cannot be read as certificates, or both options at once.
    """
    global _tls
    if ca_bundle and insecure:
        raise InputError("--ca-bundle and --insecure contradict each other: give one")
    if ca_bundle:
        path = Path(ca_bundle).expanduser()
        try:
            ssl.create_default_context(cafile=str(path))
        except (OSError, ssl.SSLError) as e:
            raise InputError(f"--ca-bundle {ca_bundle}: cannot read certificates from it ({e})") from None
        ca_bundle = str(path)
    _tls = Tls(ca_bundle, insecure)


def tls() -> Tls:
    return _tls


def verify() -> ssl.SSLContext | bool:
    """What httpx's ``verify`` takes for this process's rule."""
    if _tls.insecure:
        return False
    if _tls.ca_bundle:
        return ssl.create_default_context(cafile=_tls.ca_bundle)
    return True


def tls_env() -> dict[str, str]:
    """The rule for a child process (the load generator)."""
    out = {}
    if _tls.ca_bundle:
        out[CA_ENV] = _tls.ca_bundle
    if _tls.insecure:
        out[INSECURE_ENV] = "1"
    return out


def new_client(timeout: float | httpx.Timeout, **kw: Any) -> httpx.AsyncClient:
    """An httpx client with this process's TLS rule; redirects go through :func:`request`."""
    return httpx.AsyncClient(timeout=timeout, verify=verify(), follow_redirects=False, **kw)


def same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def next_hop(url: str, resp: httpx.Response) -> str | None:
    """Where a redirect answer points, if it may be followed; None when ``resp`` is no redirect.

    Raises:
        RedirectRefused: a redirect to another origin.
    """
    if not resp.is_redirect:
        return None
    target: str = urljoin(url, str(resp.headers.get("location", "")))
    if not same_origin(url, target):
        raise RedirectRefused(
            f"redirected to another server ({redact_url(target)}): not followed; give that URL if it is right"
        )
    return target


async def request(
    client: httpx.AsyncClient, method: str, url: str, *, stream: bool = False, **kw: Any
) -> httpx.Response:
    """``client.request`` following same-origin redirects only (see the module's rule). With
    ``stream`` the body is not read: the caller reads it and closes the response.

    Raises:
        RedirectRefused, httpx.HTTPError.
    """
    for _ in range(MAX_REDIRECTS + 1):
        resp = await client.send(client.build_request(method, url, **kw), stream=stream)
        target = next_hop(url, resp)
        if target is None:
            return resp
        await resp.aclose()
        url = target
    raise RedirectRefused(f"more than {MAX_REDIRECTS} redirects")


def check_credentials(urls: list[str], api_key: str | None) -> None:
    """Raises: InputError when a URL carries ``user:pass@`` and an API key is given too, or when
    the key is no bearer token a header can carry (:func:`~spoc_tui.core.redact.key_error`; a key file's
    was checked as it was read, naming the file)."""
    if not api_key:
        return
    if (why := key_error(api_key)) is not None:
        raise InputError(f"the API key (--api-key, SPOC_API_KEY or config.toml's api_key) {why}")
    for url in urls:
        if "@" in urlsplit(url).netloc:
            raise InputError(
                f"{redact_url(url)}: a URL with user:password@ asks for HTTP Basic authentication and --api-key "
                "for a key of its own (Bearer) in the same Authorization header; a request cannot carry both"
            )
