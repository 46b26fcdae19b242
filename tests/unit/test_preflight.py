"""What a server's answers settle before any load: ``spoc ramp``'s preflight and ``spoc twin
calibrate``'s idle check, on answers served through httpx's in-memory transport (the rules are
the subject; a real server's answers over a socket are the e2e tests', which reach these same
functions through the commands). Each refusal has its message and its exit code."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from spoc_tui.load.ramp import RampError, preflight
from spoc_tui.twin import calibrate
from spoc_tui.twin.calibrate import Calibrator
from spoc_tui.twin.model import TwinError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
URL = "http://gpu-a:8000"


def server(
    chat: httpx.Response | None = None, metrics: Callable[[], str] | None = None, models: object = None
) -> httpx.MockTransport:
    """A vLLM server's answers: its model list, a one-token answer, its /metrics."""
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path == "/v1/models":
            body = models if models is not None else {"data": [{"id": "tiny", "max_model_len": 2048}]}
            return httpx.Response(200, json=body)
        if request.url.path == "/v1/chat/completions":
            return chat or httpx.Response(200, json={"choices": [{"message": {"content": "x"}}]})
        if request.url.path == "/metrics" and metrics is not None:
            return httpx.Response(200, text=metrics(), headers={"Content-Type": "text/plain"})
        return httpx.Response(404)

    t = httpx.MockTransport(answer)
    t.seen = seen  # type: ignore[attr-defined]
    return t


def test_preflight_finds_the_model_and_its_context():
    assert asyncio.run(preflight(URL, None, None, server())) == ("tiny", 2048)
    assert asyncio.run(preflight(URL, "tiny", None, server())) == ("tiny", 2048)


@pytest.mark.parametrize(
    ("kw", "model", "code", "says"),
    [
        ({}, "no-such-model", 2, "model 'no-such-model' is not served by http://gpu-a:8000; it serves: tiny"),
        ({"chat": httpx.Response(500, json={"error": {"message": "CUDA out of memory", "code": 500}})}, None, 1,
         "a one-token probe request failed with HTTP 500: CUDA out of memory"),
        ({"chat": httpx.Response(401)}, None, 1, "failed with HTTP 401"),
        ({"models": {"object": "list"}}, None, 1, "did not return an OpenAI model list"),
        ({"models": {"data": []}}, None, 1, "serves no model"),
    ],
)  # fmt: skip
def test_what_only_the_server_settles_is_refused_before_any_load(kw, model, code, says):
    t = server(**kw)
    with pytest.raises(RampError) as e:
        asyncio.run(preflight(URL, model, None, t))
    assert says in str(e.value) and e.value.exit_code == code, (str(e.value), e.value.exit_code)
    # nothing past what refused it: the probe is sent only once the list names the model
    assert t.seen[-1] == ("POST /v1/chat/completions" if "chat" in kw else "GET /v1/models")  # type: ignore[attr-defined]


def test_an_api_key_is_asked_for_by_name():
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401 if request.headers.get("Authorization") != "Bearer sk-1" else 200, json={"data": []})

    with pytest.raises(RampError, match="the server wants an API key \\(401\\); pass --api-key") as e:
        asyncio.run(preflight(URL, None, None, httpx.MockTransport(answer)))
    assert e.value.exit_code == 2
    with pytest.raises(RampError, match="serves no model"):  # with the key it gets as far as the list
        asyncio.run(preflight(URL, None, "sk-1", httpx.MockTransport(answer)))


def test_a_busy_server_is_not_calibrated(monkeypatch):
    """Requests running now, or requests it finished while the calibration watched a moment
    (users thinking between turns leave a busy server idle between scrapes): refused, exit 1."""
    monkeypatch.setattr(calibrate, "IDLE_CHECK_S", 0.01)
    busy = (FIX / "vllm_0.32_cpu_full_load.txt").read_text()
    with pytest.raises(TwinError, match=r"the server is busy \(16 running, 0 waiting") as e:
        asyncio.run(Calibrator(URL, budget_s=20, transport=server(metrics=lambda: busy)).run())
    assert e.value.exit_code == 1 and "calibrate on an idle server" in str(e.value)

    idle = (FIX / "vllm_0.32_cpu_full_idle.txt").read_text()
    line = 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 0.0'
    assert line in idle
    scrapes = [0]

    def finishing() -> str:  # idle at every look, but one more request finished between two
        scrapes[0] += 1
        return idle.replace(line, line[:-3] + ("0.0" if scrapes[0] == 1 else "1.0"))

    with pytest.raises(TwinError, match=r"the server is busy \(0 running, 0 waiting, 1 finished in the last 0.04 s\)"):
        asyncio.run(Calibrator(URL, budget_s=20, transport=server(metrics=finishing)).run())


def test_a_server_without_a_kv_cache_report_is_not_calibrated():
    text = "\n".join(
        ln for ln in (FIX / "vllm_0.32_cpu_full_idle.txt").read_text().splitlines() if "cache_config_info" not in ln
    )
    with pytest.raises(TwinError, match="has no vllm:cache_config_info"):
        asyncio.run(Calibrator(URL, budget_s=20, transport=server(metrics=lambda: text)).run())


@pytest.mark.parametrize(
    "body", [{"data": ["tiny"]}, {"data": [7]}, {"data": "tiny"}, ["tiny"], {"data": [{"name": "tiny"}]}]
)
def test_a_model_list_of_another_shape_is_said_not_raised(monkeypatch, body):
    """The monitor's and the calibration's readers of /v1/models and /tokenize: an answer of another
    shape is the reader's one error, never an AttributeError out of a worker."""
    from spoc_tui.collectors import scrape

    monkeypatch.setattr(scrape, "new_client", lambda timeout: httpx.AsyncClient(transport=server(models=body)))
    with pytest.raises(scrape.SourceError, match="did not return an OpenAI model list"):
        asyncio.run(scrape.served_models(URL))
    with pytest.raises(RampError, match="did not return an OpenAI model list"):
        asyncio.run(preflight(URL, None, None, server(models=body)))


@pytest.mark.parametrize("body", [[1, 2], {"count": "7"}, {"count": True}, {"tokens": [1]}])
def test_a_tokenize_answer_of_another_shape_leaves_prompt_lengths_approximate(monkeypatch, body):
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=body)

    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(answer), **kw))
    cal = Calibrator(URL, budget_s=20, transport=server())
    cal._learn_lengths()
    assert not cal.maker.exact
    assert any("prompt lengths approximate (no /tokenize: /tokenize answered without a count)" in n for n in cal.notes)
