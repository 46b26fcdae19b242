"""The simulator's HTTP servers: an OpenAI-compatible vLLM look-alike and a DCGM exporter."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from spoc_tui.sim.engine import SimEngine, SimRequest, chat_tokens, tokenize
from spoc_tui.sim.exposition import dcgm_metrics, vllm_metrics

logger = logging.getLogger(__name__)


def error_response(status: int, message: str, type_: str = "BadRequestError", param: str | None = None) -> web.Response:
    """vLLM's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return web.json_response(body, status=status)


@dataclass
class SimServer:
    engine: SimEngine
    host: str = "127.0.0.1"
    port: int = 8000
    dcgm_port: int | None = 9400
    hostname: str = "spoc-sim"
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    _runners: list[web.AppRunner] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _rng: random.Random = field(default_factory=lambda: random.Random(0))
    bound_port: int | None = None
    bound_dcgm_port: int | None = None
    truth_log: str | None = None
    """Write each finished request's server-side truth (arrival, token times) as JSON lines."""
    _truth: Any = None
    api_key: str | None = field(default=None, repr=False)
    """As vLLM's --api-key: /v1 wants ``Authorization: Bearer KEY``."""

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.api_key and request.path.startswith("/v1"):
            if request.headers.get("Authorization", "") != f"Bearer {self.api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        resp: web.StreamResponse = await handler(request)
        return resp

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._rng = random.Random(self.engine.cfg.seed)
        api = web.Application(client_max_size=64 * 2**20, middlewares=[self._auth])
        api.router.add_get("/health", self.health)
        api.router.add_get("/version", self.version)
        api.router.add_get("/v1/models", self.models)
        api.router.add_post("/v1/chat/completions", self.chat)
        api.router.add_post("/v1/completions", self.completions)
        api.router.add_post("/tokenize", self.tokenize)
        api.router.add_get("/metrics", self.metrics)
        runner = web.AppRunner(api, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        self._runners.append(runner)
        self.bound_port = _bound_port(site)
        if self.dcgm_port is not None:
            dapp = web.Application()
            dapp.router.add_get("/metrics", self.dcgm)
            drunner = web.AppRunner(dapp, access_log=None, shutdown_timeout=1.0)
            await drunner.setup()
            dsite = web.TCPSite(drunner, self.host, self.dcgm_port, reuse_address=True)
            await dsite.start()
            self._runners.append(drunner)
            self.bound_dcgm_port = _bound_port(dsite)
        if self.truth_log:
            self._truth = open(self.truth_log, "a", buffering=1)
        self._tasks.append(asyncio.create_task(self.engine.run(self.stop_event, self.wake)))

    async def close(self) -> None:
        self.stop_event.set()
        for t in self._tasks:
            t.cancel()
        for result in await asyncio.gather(*self._tasks, return_exceptions=True):
            if isinstance(result, Exception) and not isinstance(result, asyncio.CancelledError):
                logger.warning("simulator task failed while stopping: %r", result)
        for r in self._runners:
            await r.cleanup()
        if self._truth is not None:
            self._truth.close()

    # -- endpoints ----------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0+spoc-sim"})

    async def models(self, request: web.Request) -> web.Response:
        cfg = self.engine.cfg
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": cfg.served_model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "spoc-sim",
                        "root": cfg.served_model_name,
                        "parent": None,
                        "max_model_len": cfg.resolved_max_model_len(),
                    }
                ],
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=vllm_metrics(self.engine),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Spoc-Simulated": "1"},
        )

    async def dcgm(self, request: web.Request) -> web.Response:
        return web.Response(
            text=dcgm_metrics(self.engine.gpus, self.hostname), content_type="text/plain", charset="utf-8"
        )

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            return error_response(400, "Request body is not valid JSON")
        if not isinstance(body, dict):
            return error_response(400, "Request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.engine.cfg.served_model_name:
            return error_response(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return body

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return error_response(400, "'messages' must be a non-empty list of message objects", param="messages")
        return await self._generate(request, body, chat_tokens(messages), chat=True)

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize``: a ``prompt`` (or chat ``messages``) -> its ``count`` and ``tokens``."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt, messages = body.get("prompt"), body.get("messages")
        if isinstance(prompt, str):
            ids = tokenize(prompt)
        elif isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
            ids = chat_tokens(messages)
        else:
            return error_response(400, "'prompt' must be a string (or 'messages' a list of messages)", param="prompt")
        return web.json_response(
            {"count": len(ids), "max_model_len": self.engine.cfg.resolved_max_model_len(), "tokens": ids}
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = [int(t) for t in prompt]
        elif isinstance(prompt, str):
            ids = tokenize(prompt) or [0]
        else:
            return error_response(400, "'prompt' must be a string or a list of token ids", param="prompt")
        return await self._generate(request, body, ids, chat=False)

    async def _generate(
        self, request: web.Request, body: dict[str, Any], prompt: list[int], chat: bool
    ) -> web.StreamResponse:
        eng = self.engine
        max_tokens = self._max_tokens(body, prompt, chat)
        if isinstance(max_tokens, web.Response):
            return max_tokens
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        ignore_eos = bool(body.get("ignore_eos", False))
        target = max_tokens if ignore_eos else eng.sample_output_len(max_tokens)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
        token_times: list[float] = []

        def on_token(n: int, t: float) -> None:
            token_times.append(t)
            queue.put_nowait((n, t))

        sent_times: list[float] = []

        def log_truth(r: SimRequest) -> None:
            if self._truth is not None:
                rec: dict[str, Any] = {
                    "id": rid,
                    "arrival": r.arrival,
                    "tokens": token_times,
                    "reason": r.finish_reason,
                }
                if stream:
                    rec["sent"] = sent_times
                self._truth.write(json.dumps(rec) + "\n")

        def on_finish(r: SimRequest) -> None:
            if not stream:
                log_truth(r)
            queue.put_nowait(None)

        req = SimRequest(
            rid=rid,
            prompt=prompt,
            max_tokens=max_tokens,
            target_tokens=target,
            arrival=eng.clock(),
            on_token=on_token,
            on_finish=on_finish,
            out_seed=self._rng.randrange(1 << 30),
        )
        delay = eng.outside_s(len(prompt))
        if delay > 0:
            await asyncio.sleep(delay / eng.cfg.speed)
        eng.add(req)
        self.wake.set()
        created = int(time.time())
        model = eng.cfg.served_model_name
        if not stream:
            return await self._whole(req, queue, chat, created, model)
        return await self._streamed(request, req, queue, chat, created, model, include_usage, sent_times, log_truth)

    def _max_tokens(self, body: dict[str, Any], prompt: list[int], chat: bool) -> int | web.Response:
        """The request's ``max_tokens`` (its default: what the context leaves), or vLLM's 400."""
        max_len = self.engine.max_len
        raw_max = body.get("max_completion_tokens", body.get("max_tokens"))
        if raw_max is not None and (isinstance(raw_max, bool) or not isinstance(raw_max, int) or raw_max < 1):
            return error_response(400, "max_tokens must be a positive integer", param="max_tokens")
        if len(prompt) >= max_len:
            return error_response(
                400,
                f"This model's maximum context length is {max_len} tokens. However, your request has "
                f"{len(prompt)} input tokens. Please reduce the length of the input messages.",
                param="messages" if chat else "prompt",
            )
        max_tokens: int = raw_max if raw_max is not None else max_len - len(prompt)
        if len(prompt) + max_tokens > max_len:
            return error_response(
                400,
                f"'max_tokens' is too large: {max_tokens}. This model's maximum context length is {max_len} "
                f"tokens and your request has {len(prompt)} input tokens ({max_tokens} > {max_len} - {len(prompt)}).",
                param="max_tokens",
            )
        return max_tokens

    async def _whole(
        self, req: SimRequest, queue: asyncio.Queue[tuple[int, float] | None], chat: bool, created: int, model: str
    ) -> web.Response:
        """The answer as one JSON body, once the engine has finished it."""
        eng = self.engine
        rid = req.rid
        try:
            while await queue.get() is not None:
                pass
        except asyncio.CancelledError:
            eng.abort(req)
            raise
        text = "".join(" " + req.word(i) for i in range(req.generated))
        usage = self._usage(req)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": req.finish_reason,
                "logprobs": None,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": req.finish_reason, "logprobs": None}
            obj = "text_completion"
        return web.json_response(
            {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": usage}
        )

    async def _streamed(
        self,
        request: web.Request,
        req: SimRequest,
        queue: asyncio.Queue[tuple[int, float] | None],
        chat: bool,
        created: int,
        model: str,
        include_usage: bool,
        sent_times: list[float],
        log_truth: Callable[[SimRequest], None],
    ) -> web.StreamResponse:
        """The answer as server-sent events, a token an event, as vLLM streams it."""
        eng = self.engine
        rid = req.rid
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        async def send(payload: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")

        try:
            # As vLLM's chat stream: the role chunk goes out with the first token (not before),
            # then one event per token; the last token's event carries the finish reason.
            first = True
            finished = False
            while True:
                item = await queue.get()
                if item is None:
                    break
                n, _ = item
                if chat and first:
                    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                    await send(
                        {"id": rid, "object": obj, "created": created, "model": model,
                         "choices": [{**role, "finish_reason": None}]}
                    )  # fmt: skip
                first = False
                piece = " " + req.word(n - 1)
                finished = n >= req.target_tokens
                reason = ("length" if n >= req.max_tokens else "stop") if finished else None
                if chat:
                    choice = {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": reason}
                else:
                    choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}
                await send({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]})
                sent_times.append(eng.clock())
            if not finished:  # aborted, or ended early by the context: the reason in an event of its own
                final: dict[str, object] = {"index": 0, "logprobs": None, "finish_reason": req.finish_reason}
                if chat:
                    final["delta"] = {}
                else:
                    final["text"] = ""
                await send({"id": rid, "object": obj, "created": created, "model": model, "choices": [final]})
            if include_usage:
                await send(
                    {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": self._usage(req),
                    }
                )
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            # the client went away mid-stream (a ramp's users stopped, a trial ended): the request
            # is aborted, as vLLM aborts it, without a traceback in the server's log
            eng.abort(req)
            self.wake.set()
            return resp
        except asyncio.CancelledError:
            eng.abort(req)
            self.wake.set()
            raise
        finally:
            # after the stream, not at the engine's finish (which runs inside the engine step, ahead
            # of the last tokens' writes); "sent": when each token's event went to the socket
            if req.finished is not None:
                log_truth(req)
        return resp

    @staticmethod
    def _usage(req: SimRequest) -> dict[str, Any]:
        return {
            "prompt_tokens": len(req.prompt),
            "total_tokens": len(req.prompt) + req.generated,
            "completion_tokens": req.generated,
            "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
        }


def _bound_port(site: web.TCPSite) -> int | None:
    server = site._server  # aiohttp keeps the listening server private; its sockets name the bound port
    sockets = getattr(server, "sockets", None)
    if not sockets:
        return None
    return int(sockets[0].getsockname()[1])
