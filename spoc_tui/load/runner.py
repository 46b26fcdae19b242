"""The Locust side of a load ramp, run as a child process: ``python -m spoc_tui.load.runner``.

Locust monkey-patches the whole process with gevent on import, which breaks asyncio, so it
never runs in the Textual process. This child speaks JSON lines:

- stdin (commands): ``{"cmd": "users", "n": 8, "step": 2}``, ``{"cmd": "stop"}``
- stdout (events): ``{"type": "ready"}``, ``{"type": "sample", ...}`` one per finished request,
  ``{"type": "users", "n": 8}``, ``{"type": "error", "message": ...}``, ``{"type": "stopped"}``

One Locust user is one conversation (with its history growing turn by turn). Requests use
``HttpUser`` with unbuffered streaming (``iter_content(chunk_size=None)``) and SSE parsed
here, so every content chunk is timestamped as it arrives.

With ``--expect-workers N`` it becomes a Locust master and the workers (``--worker``, local
or ``spoc load-worker --master HOST`` on other machines) send their samples to it over
Locust's own master/worker messages.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any

from gevent import monkey

monkey.patch_all()

import gevent  # noqa: E402
from gevent.fileobject import FileObjectPosix  # noqa: E402
from locust import HttpUser, constant, task  # noqa: E402
from locust.env import Environment  # noqa: E402
from locust.runners import MasterRunner  # noqa: E402

from spoc_tui.load.profiles import Profile, TextMaker, plan_conversation  # noqa: E402

def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class Shared:
    """What every user of this process shares (set up in ``main``)."""

    url = ""
    model = ""
    api_key: str | None = None
    profile: Profile | None = None
    maker = TextMaker()
    context_len: int | None = None
    step = 0
    users = 0
    seed = 0
    timeout = 300.0
    system_cache: dict[str, str] = {}
    sink: Any = None
    """Where samples go: ``emit`` on a master/local runner, a batch to the master on a worker."""
    counter = 0


def classify_error(exc: BaseException) -> str:
    name = type(exc).__name__.lower()
    if "timeout" in name:
        return "timeout"
    if "connect" in name:
        return "connect"
    return "stream"


class ChatUser(HttpUser):
    """One conversation: a system prompt, then turns whose history grows, with think time."""

    wait_time = constant(0)

    def on_start(self) -> None:
        Shared.counter += 1
        self.rng = random.Random(Shared.seed * 1_000_003 + Shared.counter + os.getpid())
        self.conv_id = f"{os.getpid()}-{Shared.counter}"

    @task
    def converse(self) -> None:
        assert Shared.profile is not None
        plan = plan_conversation(Shared.profile, self.rng, Shared.maker, Shared.context_len, Shared.system_cache)
        messages: list[dict[str, str]] = []
        if plan.system_text:
            messages.append({"role": "system", "content": plan.system_text})
        self.conv_id = f"{self.conv_id.split('#')[0]}#{self.rng.randrange(1 << 30):x}"
        for i, turn in enumerate(plan.turns):
            messages.append({"role": "user", "content": turn.user_text})
            answer = self._send(messages, turn.max_tokens, i)
            if answer is None:
                return  # a failed turn ends the conversation; the user starts a new one
            messages.append({"role": "assistant", "content": answer})
            gevent.sleep(plan.think_s[i])

    def _send(self, messages: list[dict[str, str]], max_tokens: int, turn: int) -> str | None:
        body = {
            "model": Shared.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"Authorization": f"Bearer {Shared.api_key}"} if Shared.api_key else {}
        step, users = Shared.step, Shared.users
        wall0 = time.time()
        t0 = time.perf_counter()
        first: float | None = None
        last: float | None = None
        gaps: list[float] = []
        usage: dict[str, Any] = {}
        request_id: str | None = None
        parts: list[str] = []
        done = False
        error: str | None = None
        try:
            with self.client.post("/v1/chat/completions", json=body, headers=headers, stream=True, timeout=(10, Shared.timeout), catch_response=True, name="chat") as resp:
                if resp.status_code != 200:
                    error = f"http_{resp.status_code // 100}xx"
                    resp.failure(f"HTTP {resp.status_code}")
                else:
                    buf = b""
                    for chunk in resp.iter_content(chunk_size=None):
                        now = time.perf_counter()
                        buf += chunk
                        while b"\n" in buf:
                            line, buf = buf.split(b"\n", 1)
                            line = line.strip()
                            if not line.startswith(b"data:"):
                                continue
                            data = line[5:].strip()
                            if data == b"[DONE]":
                                done = True
                                continue
                            try:
                                ev = json.loads(data)
                            except ValueError:
                                continue
                            if request_id is None and isinstance(ev.get("id"), str):
                                request_id = ev["id"]
                            if ev.get("usage"):
                                usage = ev["usage"]
                            for ch in ev.get("choices") or []:
                                piece = (ch.get("delta") or {}).get("content")
                                if piece:
                                    if first is None:
                                        first = now
                                    elif last is not None:
                                        gaps.append(now - last)
                                    last = now
                                    parts.append(piece)
                    if not done:
                        error = "stream"
                        resp.failure("stream ended without [DONE]")
                    else:
                        resp.success()
        except Exception as e:  # connection refused, timeouts, broken streams
            error = classify_error(e)
        end = time.perf_counter()
        details = usage.get("prompt_tokens_details") or {}
        sample = {
            "start": wall0,
            "end": wall0 + (end - t0),
            "step": step,
            "users": users,
            # A stream that completed with no text (EOS first) is a finished request without a TTFT.
            "ok": error is None,
            "error": error,
            "ttft": (first - t0) if first is not None else None,
            "e2e": end - t0,
            "itl": gaps,
            "output_tokens": usage.get("completion_tokens"),
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else None,
            "request_id": request_id,
            "conversation": self.conv_id,
            "turn": turn,
        }
        Shared.sink(sample)
        if sample["ok"] and usage.get("prompt_tokens"):
            planned = sum(len(m["content"].split()) for m in messages)
            Shared.maker.calibrate(planned, int(usage["prompt_tokens"]), overhead=4 * len(messages))
        return "".join(parts) if sample["ok"] else None


def _read_commands(env: Environment) -> None:
    stdin = FileObjectPosix(sys.stdin.fileno(), "rb")
    runner = env.runner
    assert runner is not None
    for raw in stdin:
        try:
            cmd = json.loads(raw)
        except ValueError:
            emit({"type": "error", "message": f"bad command {raw[:80]!r}"})
            continue
        if cmd.get("cmd") == "users":
            n = int(cmd.get("n", 0))
            Shared.step = int(cmd.get("step", Shared.step))
            Shared.users = n
            if isinstance(runner, MasterRunner):
                runner.send_message("spoc_step", {"step": Shared.step, "users": n})
            runner.start(n, spawn_rate=max(1, n), wait=False)
            emit({"type": "users", "n": n, "step": Shared.step})
        elif cmd.get("cmd") == "stop":
            break
    runner.quit()
    emit({"type": "stopped"})


def _configure(args: argparse.Namespace) -> None:
    with open(args.profile_json) as f:
        Shared.profile = Profile.from_dict(json.load(f))
    Shared.url = args.url
    Shared.model = args.model
    Shared.api_key = os.environ.get("SPOC_API_KEY") or None
    Shared.context_len = args.context_len
    Shared.seed = args.seed
    Shared.timeout = args.timeout
    Shared.maker = TextMaker(args.tokenizer)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spoc_tui.load.runner")
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile-json", required=True)
    ap.add_argument("--context-len", type=int, default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--expect-workers", type=int, default=0)
    ap.add_argument("--master-bind-host", default="127.0.0.1")
    ap.add_argument("--master-bind-port", type=int, default=5557)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--master-host", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, default=5557)
    args = ap.parse_args(argv)
    _configure(args)
    env = Environment(user_classes=[ChatUser], host=args.url, catch_exceptions=True)

    if args.worker:
        batch: list[dict[str, Any]] = []
        Shared.sink = batch.append
        runner = env.create_worker_runner(args.master_host, args.master_port)

        def on_step(msg: Any, **_kw: Any) -> None:
            Shared.step = int(msg.data.get("step", 0))
            Shared.users = int(msg.data.get("users", 0))

        runner.register_message("spoc_step", on_step)

        def flush() -> None:
            while True:
                gevent.sleep(0.25)
                if batch:
                    out = batch[:]
                    del batch[:]
                    runner.send_message("spoc_samples", out)

        gevent.spawn(flush)
        runner.greenlet.join()
        return 0

    def emit_sample(sample: dict[str, Any]) -> None:
        emit({"type": "sample", **sample})

    Shared.sink = emit_sample
    if args.expect_workers:
        runner = env.create_master_runner(args.master_bind_host, args.master_bind_port)
        runner.register_message("spoc_samples", lambda msg, **_kw: [emit_sample(s) for s in msg.data])
        deadline = time.time() + 60
        while runner.worker_count < args.expect_workers:
            if time.time() > deadline:
                emit({"type": "error", "message": f"only {runner.worker_count} of {args.expect_workers} workers joined"})
                return 1
            gevent.sleep(0.1)
    else:
        env.create_local_runner()
    emit({"type": "ready", "workers": args.expect_workers})
    _read_commands(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
