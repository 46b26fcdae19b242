"""The simulator's OpenAI-API refusals, called on its handlers without a server: vLLM's error
shape (``{"error": {"message", "type", "param", "code"}}``) for each bad body. The wire itself
(streaming, usage) is tests/e2e/test_live_sim.py's."""

import asyncio
import json

import pytest

from spoc_tui.core.hardware.presets import GPUS, MODELS
from spoc_tui.sim.engine import EngineConfig, SimEngine
from spoc_tui.sim.server import SimServer


class _Body:
    """What the handlers read of a request before they refuse it: its JSON body."""

    path = "/v1/chat/completions"

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    async def json(self):
        return json.loads(self.raw.decode())


def _server() -> SimServer:
    cfg = EngineConfig(model=MODELS["llama-3.1-8b"], gpu=GPUS["h100-80gb"], served_model_name="m", max_model_len=4096)
    return SimServer(SimEngine(cfg, None, clock=lambda: 0.0))


def _msgs(**kw):
    return json.dumps({"messages": [{"role": "user", "content": "x"}], **kw}).encode()


@pytest.mark.parametrize(
    "body,status,param",
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b"\xff\xfe", 400, None),
        (_msgs(model="other"), 404, "model"),
        (json.dumps({"messages": []}).encode(), 400, "messages"),
        (json.dumps({"messages": ["x"]}).encode(), 400, "messages"),
        (_msgs(max_tokens=-1), 400, "max_tokens"),
        (_msgs(max_tokens=True), 400, "max_tokens"),
        (_msgs(max_tokens=1.5), 400, "max_tokens"),
        (_msgs(max_tokens=10**6), 400, "max_tokens"),
        (_msgs(max_completion_tokens=0), 400, "max_tokens"),
    ],
)
def test_a_bad_chat_body_gets_vllms_error_shape(body, status, param):
    r = asyncio.run(_server().chat(_Body(body)))  # type: ignore[arg-type]
    assert r.status == status
    err = json.loads(r.body)["error"]
    assert err["code"] == status and err["message"] and err["param"] == param
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


@pytest.mark.parametrize(
    "body,param",
    [
        (json.dumps({"prompt": {"a": 1}}).encode(), "prompt"),
        (json.dumps({"prompt": "word " * 5000}).encode(), "prompt"),
        (json.dumps({"prompt": "a", "max_tokens": 5000}).encode(), "max_tokens"),
    ],
)
def test_a_bad_completion_body_names_its_field(body, param):
    r = asyncio.run(_server().completions(_Body(body)))  # type: ignore[arg-type]
    assert r.status == 400
    assert json.loads(r.body)["error"]["param"] == param


def test_tokenize_answers_as_vllm():
    """``POST /tokenize`` as vLLM answers it: the count and the ids (a load generator learns its
    word counts from it), the chat form with the template's tokens, and a refusal by field."""
    server = _server()
    r = asyncio.run(
        server.tokenize(_Body(json.dumps({"prompt": "the queue, grows", "add_special_tokens": False}).encode()))
    )  # type: ignore[arg-type]
    got = json.loads(r.body)
    assert r.status == 200 and got["count"] == 4 and len(got["tokens"]) == 4 and got["max_model_len"] == 4096
    chat = json.dumps({"messages": [{"role": "user", "content": "the queue, grows"}]}).encode()
    got = json.loads(asyncio.run(server.tokenize(_Body(chat))).body)  # type: ignore[arg-type]
    assert got["count"] > 4  # the chat template's own tokens
    r = asyncio.run(server.tokenize(_Body(json.dumps({"prompt": 5}).encode())))  # type: ignore[arg-type]
    assert r.status == 400 and json.loads(r.body)["error"]["param"] == "prompt"


def test_tokenize_refuses_another_model():
    r = asyncio.run(_server().tokenize(_Body(json.dumps({"model": "other", "prompt": "x"}).encode())))  # type: ignore[arg-type]
    assert r.status == 404
