"""One rule for TLS, redirects and credentials across commands (collectors.http): a private CA
with --ca-bundle, --insecure for a self-signed host, same-origin redirects followed and others
refused (the monitor, inspect and the ramp alike), Basic and Bearer never mixed."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from spoc_tui.collectors import http
from spoc_tui.collectors.scrape import SourceError, fetch, served_models
from spoc_tui.core.errors import InputError

FIX = Path(__file__).resolve().parents[1] / "fixtures"
VLLM = (FIX / "vllm" / "vllm_0.32_cpu_full_load.txt").read_text()


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (openssl, as an operator would make one)."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return d / "cert.pem", d / "key.pem"


@pytest.fixture(autouse=True)
def default_tls():
    http.configure_tls(None, False)
    yield
    http.configure_tls(None, False)


def metrics_app(other: str = "") -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=VLLM, content_type="text/plain")

    async def moved(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/metrics/")  # as old vLLM answers /metrics

    async def elsewhere(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"{other}/metrics")

    async def models(_: web.Request) -> web.Response:
        raise web.HTTPFound(f"{other}/v1/models")

    app = web.Application()
    app.router.add_get("/metrics", moved)
    app.router.add_get("/metrics/", metrics)
    app.router.add_get("/cross/metrics", elsewhere)
    app.router.add_get("/v1/models", models)
    return app


async def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """A command against a server of this test's event loop (which must go on answering)."""
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)


async def _tls_server(cert) -> TestServer:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    server = TestServer(metrics_app(), host="127.0.0.1")
    await server.start_server(ssl=ctx)
    return server


async def test_a_private_ca_is_refused_by_default_and_accepted_with_ca_bundle_or_insecure(cert):
    server = await _tls_server(cert)
    url = f"https://127.0.0.1:{server.port}"
    try:
        async with http.new_client(5.0) as c:
            with pytest.raises(SourceError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                await fetch(c, url)
        http.configure_tls(str(cert[0]), False)
        async with http.new_client(5.0) as c:
            assert (await fetch(c, url)).kind == "vllm"
        http.configure_tls(None, True)
        async with http.new_client(5.0) as c:
            assert (await fetch(c, url)).kind == "vllm"
        # the commands take the rule from their flags (and SPOC_CA_BUNDLE)
        run = [sys.executable, "-m", "spoc_tui.cli", "inspect", url]
        bad = await _run(run)
        assert bad.returncode == 2 and "certificate" in bad.stderr.lower() and "Traceback" not in bad.stderr
        ok = await _run([*run, "--ca-bundle", str(cert[0])])
        assert ok.returncode == 0 and "model tiny" in ok.stdout, ok.stderr
        ins = await _run([*run, "--insecure"])
        assert ins.returncode == 0 and "TLS certificates are not checked" in ins.stderr
    finally:
        await server.close()


def test_a_bad_ca_bundle_or_both_options_are_refused():
    with pytest.raises(InputError, match="cannot read certificates"):
        http.configure_tls(__file__, False)
    with pytest.raises(InputError, match="contradict"):
        http.configure_tls(__file__, True)


def test_the_load_generator_takes_the_rule_by_environment(cert):
    code = (
        "import spoc_tui.load.runner as r; u = r._StreamingUser; "
        "print(u.insecure, int(object.__new__(u).ssl_context_factory().verify_mode))"  # as Locust calls it
    )
    env = {"PATH": "/usr/bin:/bin", http.CA_ENV: str(cert[0])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["False", str(int(ssl.CERT_REQUIRED))], out.stderr


async def test_same_origin_redirects_are_followed_and_others_refused_everywhere():
    other = TestServer(metrics_app(), host="127.0.0.1")
    await other.start_server()
    # the same server under another name is another origin: http://localhost:P is not http://127.0.0.1:P
    server = TestServer(metrics_app(f"http://localhost:{other.port}"), host="127.0.0.1")
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}"
    try:
        async with http.new_client(5.0) as c:
            assert (await fetch(c, url)).kind == "vllm"  # /metrics -> /metrics/
            with pytest.raises(SourceError, match=r"redirected to another server \(http://localhost:\d+/metrics\)"):
                await fetch(c, url + "/cross/metrics")
        with pytest.raises(SourceError, match="redirected to another server"):
            await served_models(url)
        # inspect and the ramp say the same
        r = await _run([sys.executable, "-m", "spoc_tui.cli", "inspect", url + "/cross/metrics"])
        assert r.returncode == 2 and "redirected to another server" in r.stderr
        from spoc_tui.load.ramp import RampError, preflight

        with pytest.raises(RampError, match="redirected to another server"):
            await preflight(url, None, None)
    finally:
        await server.close()
        await other.close()


def test_basic_and_bearer_are_never_mixed(tmp_path):
    for argv in (
        ["monitor", "--url", "http://ops:pw@127.0.0.1:1", "--api-key", "k"],
        ["inspect", "http://ops:pw@127.0.0.1:1", "--api-key", "k"],
        ["ramp", "--url", "http://ops:pw@127.0.0.1:1", "--api-key", "k", "--sla", "ttft_p99<=1s", "--out", "o"],
    ):
        r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "HTTP Basic authentication" in r.stderr, (argv, r.stderr)
        assert "pw" not in r.stderr
