"""``spoc twin calibrate``: a small designed set of probes against a live, idle server, read from
the client's side (each token's arrival) and the server's (/metrics before and after), fitted
into the twin's step time (:mod:`spoc_tui.twin.fit`).

Only what a real vLLM exposes is used, so the same code path calibrates vLLM and the simulator:
``/v1/models`` (model, max_model_len), ``vllm:cache_config_info`` (block size, KV blocks, prefix
caching, memory share), ``/tokenize`` (exact prompt lengths), each answer's ``usage`` (the prompt
tokens the server counted, and how many its prefix cache served), and the
``request_prefill_time_seconds`` histogram (the prefill as the engine timed it). Settings no
endpoint reports (max-num-seqs, max-num-batched-tokens, chunked prefill) are told
(``--max-num-seqs``...) or assumed at vLLM's defaults, and twin.json says which.

The probes, in rounds until the budget is spent (each round one of every kind, so a short
budget still fits every coefficient, and later rounds narrow them):

- **prefill**: one prompt alone, of 16 to 2,048 tokens, 2 tokens out: its TTFT, and the
  server's own prefill time;
- **decode**: B streams (1 to 32) of short or long prompts started together, every answer long:
  the gaps between tokens while all B decode, in two halves (two context lengths);
- **mixed**: 4 streams decoding when a new prompt arrives: the decoders' gap that holds its
  prefill;
- **shared**: B streams (4 to 16) whose long prompts share three quarters of their text, sent
  once the prefix cache holds that part (one request with it first): decode gaps as above, with
  the context the streams read in the same cached blocks (where the server caches prefixes).

Every prompt is new text (a prefix-cache hit would fake a short prefill): the answers'
``cached_tokens`` are subtracted where the server reports them.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx

from spoc_tui.collectors.http import new_client
from spoc_tui.collectors.scrape import SourceError, base_url, fetch
from spoc_tui.core.errors import EXIT_FAILURE
from spoc_tui.core.metrics.promparse import Exposition
from spoc_tui.core.metrics.sse import StreamTally
from spoc_tui.core.metrics.vllm import PREFIX_HITS, cache_config, engine_version
from spoc_tui.core.redact import redact_url
from spoc_tui.twin.correction import Stream, correct
from spoc_tui.twin.fit import Observation, fit_step_model
from spoc_tui.twin.model import (
    COEFFS,
    MAX_ANSWERS,
    ServerConfig,
    Twin,
    TwinError,
    design_row,
    step_features,
    with_answers,
)
from spoc_tui.workload import TextMaker

DEFAULT_BUDGET_S = 300.0
LOAD_SHARE = 0.2
"""The share of the budget spent on the closing mixed load (:meth:`Calibrator.load`)."""
LOAD_MIN_S = 8.0
IDLE_CHECKS, IDLE_CHECK_S = 4, 0.5
"""The server must stay idle over four readings of /metrics half a second apart."""
LOAD_USERS = 8
ANSWERS_SHARE = 0.45
"""Of the closing load's share of the budget, what learning the answers' lengths takes (0.3 until
2026-11-29: two waves, 32 answers, on the simulated A100 with a 180 s budget, whose median read
the server's answers 20 % short in one calibration)."""
ANSWER_WAVE = 32
"""Answers in flight at once while learning their lengths (at most the server's seats)."""
ANSWER_MAX_TOKENS = 1024
"""The longest answer asked for while learning their lengths (longer ones count as this)."""
ENDPOINTS = ("chat", "completions")
"""What the probes send: chat completions, as ``spoc ramp``'s profiles do (the default), or plain
completions, as a trace replay does. Where the API server shares the engine's process (the CPU
build), its per-token work for a chat stream lengthens every step, so the twin is calibrated on
the endpoint its predictions are for."""
MIN_BUDGET_S = 20.0
PREFILL_LENGTHS = (16, 64, 256, 512, 1024, 2048)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
MIXED_PREFILLS = (256, 1024)
MIXED_DECODERS = 4
SHARED_BATCHES = (8, 4, 16)
"""The shared-prefix probe's stream counts, one per round in turn."""
SHARED_SHARE = 0.75
"""The share of a shared-prefix probe's prompt that its streams have in common."""
ROUNDS = 8
"""The most rounds of probes (each one of every kind); the budget usually ends them first."""
VLLM_DEFAULTS: dict[str, object] = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 2048,
    "enable_chunked_prefill": True,
}
"""vLLM V1's defaults for online serving where the server does not report them (``vllm serve``:
max-num-seqs 256, max-num-batched-tokens 2048, chunked prefill on)."""

Progress = Callable[[str, float], None]
"""(what is running, share of the budget spent)."""


@dataclass
class _Metrics:
    prefill_sum: float | None
    prefill_count: float | None
    running: float
    waiting: float
    itl_sum: float | None = None
    itl_count: float | None = None
    """The server's inter-token histogram (the engine's own timestamps, not the client's reads)."""
    prefix_hits: float | None = None
    """Prompt tokens the prefix cache served, all time (None where the server does not count them)."""


def server_gap(before: _Metrics, after: _Metrics) -> float | None:
    """The mean gap between tokens the server measured between two reads, or None."""
    if before.itl_sum is None or before.itl_count is None or after.itl_sum is None or after.itl_count is None:
        return None
    n = after.itl_count - before.itl_count
    dt = after.itl_sum - before.itl_sum
    return dt / n if n > 0 and dt > 0 else None


POOR_FIT_PCT = 30.0
"""A kind of probe whose median residual is over this says the fit cannot be trusted (a cold or
shared server); said in the notes. Healthy calibrations read 2-16 % on the CPU server."""
GAP_AGREE = 2.0
"""A decode probe's half is left out when its mean gap is under the server's own mean over the
probe divided by this: tokens cannot come faster than the engine makes them, so the client saw a
stream stall and then arrive in a burst (a cold or busy front end), not the engine's steps. A
half slower than the engine stays: a slow front end is what users see too."""


def _hist(exp: Exposition, name: str) -> tuple[float | None, float | None]:
    s = exp.get(name + "_sum")
    c = exp.get(name + "_count")
    if not s or not c:
        return None, None
    return sum(s.values()), sum(c.values())


def _gauge(exp: Exposition, name: str) -> float:
    return sum(exp.get(name).values())


class Calibrator:
    """The probes against one server, within a budget."""

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        tokenizer: str | None = None,
        budget_s: float = DEFAULT_BUDGET_S,
        told: dict[str, object] | None = None,
        dcgm: str | None = None,
        endpoint: str = "chat",
        seed: int = 0,
        progress: Progress | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """
        Args:
            transport: httpx's, where the server's answers come from (None: the network).
        """
        if not MIN_BUDGET_S <= budget_s <= 3600:
            raise TwinError(f"--budget must be between {MIN_BUDGET_S:g} s and 1 hour, got {budget_s:g} s")
        self.root = base_url(url)
        self.model = model
        self.api_key = api_key
        self.budget_s = budget_s
        self.told = dict(told or {})
        self.dcgm = dcgm
        if endpoint not in ENDPOINTS:
            raise TwinError(f"--endpoint {endpoint!r}: give {' or '.join(ENDPOINTS)}")
        self.endpoint = endpoint
        self.chat = endpoint == "chat"
        self.clocks: dict[str, list[float]] = {}
        # new text every run: a second calibration must not hit the prefix cache the first one left
        self.rng = random.Random(f"{seed}:{time.time_ns()}")
        self.maker = TextMaker(tokenizer)
        self.progress = progress or (lambda _w, _f: None)
        self.obs: list[Observation] = []
        self.notes: list[str] = []
        self.gap_cvs: list[float] = []
        self.dropped = 0
        """Decode observations left out: the client's gaps were shorter than the engine's (GAP_AGREE)."""
        self._probe = 0
        self._t0 = 0.0
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.transport = transport

    # -- the server ---------------------------------------------------------------------
    async def _metrics(self, c: httpx.AsyncClient) -> tuple[Exposition, _Metrics]:
        try:
            r = await fetch(c, self.root, self.api_key)
        except SourceError as e:
            raise TwinError(f"cannot read the server's /metrics: {e}", exit_code=EXIT_FAILURE) from None
        exp = r.exposition
        ps, pc = _hist(exp, "vllm:request_prefill_time_seconds")
        its, itc = _hist(exp, "vllm:inter_token_latency_seconds")
        if its is None:
            its, itc = _hist(exp, "vllm:time_per_output_token_seconds")  # before vLLM 0.11's rename
        running, waiting = _gauge(exp, "vllm:num_requests_running"), _gauge(exp, "vllm:num_requests_waiting")
        hits = next((sum(v.values()) for n in PREFIX_HITS if (v := exp.get(n))), None)
        return exp, _Metrics(ps, pc, running, waiting, its, itc, hits)

    async def _config(self, c: httpx.AsyncClient) -> ServerConfig:
        from spoc_tui.load.ramp import RampError, preflight

        try:
            model, mml = await preflight(self.root, self.model, self.api_key, self.transport)
        except RampError as e:
            raise TwinError(str(e), exit_code=e.exit_code) from None
        self.model = model
        exp, m = await self._metrics(c)
        info = cache_config(exp)
        if not info:
            raise TwinError(
                f"{redact_url(self.root)}: its /metrics has no vllm:cache_config_info, so the twin cannot know its KV "
                "cache: is this a vLLM server?"
            )
        # busy now, or in the next seconds: users who think between requests leave the server
        # momentarily idle, so the requests it finished over a while count too
        done0 = _gauge(exp, "vllm:request_success_total")
        running, waiting = m.running, m.waiting
        for _ in range(IDLE_CHECKS):
            if running or waiting:
                break
            await asyncio.sleep(IDLE_CHECK_S)
            exp, m = await self._metrics(c)
            running, waiting = max(running, m.running), max(waiting, m.waiting)
        finished = _gauge(exp, "vllm:request_success_total") - done0
        if running or waiting or finished > 0:
            raise TwinError(
                f"the server is busy ({running:g} running, {waiting:g} waiting, {finished:g} finished in the last "
                f"{IDLE_CHECKS * IDLE_CHECK_S:g} s): calibrate on an idle server, or the probes time other people's "
                "requests",
                exit_code=EXIT_FAILURE,
            )
        sources: dict[str, str] = {}

        def reported(key: str, conv: Callable[[str], object]) -> object:
            raw = info.get(key)
            if raw in (None, "None", ""):
                return None
            try:
                v = conv(raw)
            except ValueError:
                return None
            sources[key] = "reported"
            return v

        block = reported("block_size", int)
        blocks = reported("num_gpu_blocks", int)
        if not isinstance(block, int) or not isinstance(blocks, int) or block < 1 or blocks < 1:
            raise TwinError("the server's cache_config_info lacks block_size or num_gpu_blocks")
        prefix = reported("enable_prefix_caching", lambda s: s == "True")
        gmu = reported("gpu_memory_utilization", float)
        if mml is None:
            raise TwinError("the server's /v1/models does not say its max_model_len")
        sources["max_model_len"] = "reported"
        values: dict[str, object] = {}
        for k, default in VLLM_DEFAULTS.items():
            if k in self.told:
                values[k] = self.told[k]
                sources[k] = "told"
            else:
                values[k] = default
                sources[k] = "assumed"
        if prefix is None:
            prefix = bool(self.told.get("enable_prefix_caching", True))
            sources["enable_prefix_caching"] = "told" if "enable_prefix_caching" in self.told else "assumed"
        mbt = int(values["max_num_batched_tokens"])  # type: ignore[call-overload]
        if not values["enable_chunked_prefill"]:
            mbt = max(mbt, mml)
        return ServerConfig(
            model=model,
            max_model_len=int(mml),
            block_size=block,
            num_gpu_blocks=blocks,
            enable_prefix_caching=bool(prefix),
            gpu_memory_utilization=gmu if isinstance(gmu, float) else None,
            max_num_seqs=int(values["max_num_seqs"]),  # type: ignore[call-overload]
            max_num_batched_tokens=mbt,
            enable_chunked_prefill=bool(values["enable_chunked_prefill"]),
            sources=sources,
            engine_version=engine_version(exp),
        )

    async def _read_clocks(self, c: httpx.AsyncClient, after_s: float = 0.0, keep: bool = True) -> None:
        """The GPUs' SM clocks from the dcgm-exporter (``--dcgm``) ``after_s`` from now, kept per GPU
        (``keep``; else the exporter is only checked): twin.json says what clocks the fit was made
        at, so a later drift (a hot GPU, a power cap) can be told. Read under load only: an idle
        GPU clocks down (345 MHz on the simulated A100), and a reading after a probe had ended, or
        the one before any, made a slow host's twin say it was fitted at idle clocks."""
        if not self.dcgm:
            return
        await asyncio.sleep(after_s)
        from spoc_tui.core.hardware.gpu import dcgm_gpus

        try:
            r = await fetch(c, self.dcgm)
        except SourceError as e:
            raise TwinError(f"--dcgm: {e}", exit_code=EXIT_FAILURE) from None
        gpus = dcgm_gpus(r.exposition, self.dcgm)
        if not gpus:
            raise TwinError(f"--dcgm {redact_url(self.dcgm)}: no GPU in its metrics")
        for g in gpus:
            if g.sm_clock_mhz is not None and keep:
                self.clocks.setdefault(g.gpu, []).append(g.sm_clock_mhz)

    def _learn_lengths(self) -> None:
        """Exact prompt lengths from the server's /tokenize (or the local tokenizer)."""
        if self.maker.exact:
            return
        client = httpx.Client(timeout=10.0, headers=self.headers)

        def count(text: str) -> int:
            r = client.post(
                self.root + "/tokenize", json={"model": self.model, "prompt": text, "add_special_tokens": False}
            )
            if r.status_code != 200:
                raise TwinError(f"/tokenize answered HTTP {r.status_code}")
            body = r.json()
            n = body.get("count") if isinstance(body, dict) else None
            if isinstance(n, bool) or not isinstance(n, int):
                raise TwinError("/tokenize answered without a count")
            return n

        try:
            if not self.maker.learn(count):
                self.notes.append("prompt lengths approximate (the tokenizer's counts do not add up word by word)")
        except (httpx.HTTPError, TwinError, ValueError) as e:
            self.notes.append(f"prompt lengths approximate (no /tokenize: {e}); the answers' usage gives the counts")
        finally:
            client.close()

    # -- one request --------------------------------------------------------------------
    def _text(self, tokens: int, prefix: str = "", prefix_tokens: int = 0) -> str:
        """A new prompt of ``tokens`` tokens; with ``prefix`` (of ``prefix_tokens``), that text
        and then new words for the rest."""
        rng = random.Random(self.rng.random())
        if not prefix:
            return self.maker.text(tokens, rng)
        left = max(1, tokens - prefix_tokens)
        rest = self.maker.continuation(left, rng) if self.maker.additive else self.maker.text(left, rng)
        return f"{prefix} {rest}"

    async def _stream(
        self,
        c: httpx.AsyncClient,
        tokens: int,
        max_tokens: int,
        seen: list[int] | None = None,
        i: int = 0,
        prompt: str | None = None,
        eos: bool = False,
    ) -> Stream:
        """One streamed completion of a new prompt of ``tokens`` tokens (or of ``prompt``); with
        ``seen``, its tokens so far are counted in ``seen[i]`` as they arrive; ``eos``: the
        server may end the answer itself (otherwise it runs to ``max_tokens``)."""
        if prompt is None:
            prompt = self._text(tokens)
        body = {
            "model": self.model,
            **({"messages": [{"role": "user", "content": prompt}]} if self.chat else {"prompt": prompt}),
            "max_tokens": max_tokens,
            "ignore_eos": not eos,  # the server's default sampling, as spoc ramp's requests use it
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        s = Stream(sent=time.perf_counter())
        tally = StreamTally(chat=self.chat, times=s.times)  # (the tokens' times fill s.times as they come)
        try:
            path = "/v1/chat/completions" if self.chat else "/v1/completions"
            async with c.stream("POST", self.root + path, json=body, headers=self.headers) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")[:200]
                    s.error = f"HTTP {r.status_code}: {text}"
                    return s
                async for line in r.aiter_lines():
                    # every event with choices is a step, as the load generator counts them
                    tally.feed(line, time.perf_counter())
                    if tally.done:
                        break
                    if seen is not None:
                        seen[i] = len(s.times)
            s.prompt_tokens, s.completion_tokens = tally.prompt_tokens, tally.completion_tokens
            s.cached_tokens = tally.cached_tokens or 0
        except httpx.HTTPError as e:
            s.error = f"{type(e).__name__}: {e}"
        return s

    def _id(self) -> int:
        self._probe += 1
        return self._probe

    def _chunks(self, tokens: int, done: int = 0) -> list[tuple[int, int]]:
        """A prompt's prefill chunks (new tokens, done) as the engine schedules it alone."""
        cfg = self.server
        left = tokens - done
        if not cfg.enable_chunked_prefill:
            return [(left, done)]
        out = []
        while left > 0:
            n = min(left, cfg.max_num_batched_tokens)
            out.append((n, done))
            done += n
            left -= n
        return out

    # -- the probes ---------------------------------------------------------------------
    async def prefill(self, c: httpx.AsyncClient, length: int) -> None:
        pid = self._id()
        _, before = await self._metrics(c)
        s = await self._stream(c, length, 2)
        _, after = await self._metrics(c)
        if s.error or s.ttft is None or s.prompt_tokens is None:
            self.notes.append(f"a {length}-token prefill probe failed ({s.error or 'no tokens'})")
            return
        computed = s.prompt_tokens - s.cached_tokens
        chunks = self._chunks(s.prompt_tokens, s.cached_tokens)
        steps = [step_features([], [ch]) for ch in chunks]
        row = tuple(sum(col) for col in zip(*steps, strict=True))
        each = tuple((1.0, float(n), 0.0) for n, _ in chunks)  # one step a chunk, no decodes
        self.obs.append(Observation("prefill", pid, design_row(row, 1.0, s.prompt_tokens / 1e3), s.ttft, each))
        if (
            before.prefill_sum is not None
            and after.prefill_sum is not None
            and after.prefill_count is not None
            and before.prefill_count is not None
            and after.prefill_count - before.prefill_count == 1
            and computed > 0
        ):
            y = after.prefill_sum - before.prefill_sum
            if y > 0:
                self.obs.append(Observation("server_prefill", pid, design_row(row), y, each))

    async def decode(self, c: httpx.AsyncClient, batch: int, context: int, out: int, shared: bool = False) -> None:
        """B streams decoding together; ``shared``: their prompts share :data:`SHARED_SHARE` of
        their text, already in the prefix cache when they are sent."""
        pid = self._id()
        prompts: list[str | None] = [None] * batch
        if shared:
            n_prefix = int(SHARED_SHARE * context)
            prefix = self._text(n_prefix)
            warm = await self._stream(c, n_prefix, 1, prompt=prefix)  # computes the prefix's blocks once
            if warm.error:
                self.notes.append(f"a shared-prefix probe failed ({warm.error})")
                return
            prompts = [self._text(context, prefix, n_prefix) for _ in range(batch)]
        _, before = await self._metrics(c)
        streams = await asyncio.gather(*(self._stream(c, context, out, prompt=p) for p in prompts))
        _, after = await self._metrics(c)
        bad = [s for s in streams if s.error or len(s.times) < 4 or s.prompt_tokens is None]
        if bad:
            self.notes.append(f"a decode probe of {batch} streams failed ({bad[0].error or 'too few tokens'})")
            return
        reread = 0
        if shared:
            # the context read again: every stream holds the cached prefix's blocks, read once for
            # the first and again for each other; the cache's count from the answers (vLLM with
            # --enable-prompt-tokens-details) or from /metrics over the probe
            cached = [s.cached_tokens for s in streams]
            if not any(cached) and before.prefix_hits is not None and after.prefix_hits is not None:
                each = (after.prefix_hits - before.prefix_hits) / batch
                cached = [int(each)] * batch
            reread = sum(cached) - max(cached)
            if reread <= 0:
                note = "a shared-prefix probe found nothing in the prefix cache (or no count of its hits): left out"
                if note not in self.notes:
                    self.notes.append(note)
                return
        referee = server_gap(before, after)
        lo = max(s.times[0] for s in streams)
        hi = min(s.times[-1] for s in streams)
        mid = (lo + hi) / 2
        # per stream and half: its mean gap (span / gaps), not the gaps' median: a server that
        # falls behind streaming sends several tokens in one read, and those gaps read ~0
        halves: list[list[tuple[float, float]]] = [[], []]
        gaps_all: list[float] = []
        for s in streams:
            for half, (a, b) in zip(halves, ((lo, mid), (mid, hi)), strict=True):
                ks = [k for k, t in enumerate(s.times) if a <= t <= b]
                if len(ks) >= 3:
                    span = s.times[ks[-1]] - s.times[ks[0]]
                    half.append((span / (len(ks) - 1), (ks[0] + ks[-1]) / 2))
            gaps_all += [b - a for a, b in zip(s.times, s.times[1:], strict=False) if a >= lo and b <= hi]
        if len(gaps_all) >= 8:
            med = statistics.median(gaps_all)
            real = [g for g in gaps_all if g > 0.2 * med]  # coalesced reads are not the steps' jitter
            if med > 0 and len(real) >= 8:
                m2 = statistics.median(real)
                self.gap_cvs.append(1.4826 * statistics.median(abs(g - m2) for g in real) / m2)
        for h in halves:
            if len(h) < batch:
                continue
            y = statistics.median(g for g, _ in h)
            if referee is not None and y < referee / GAP_AGREE:
                self.dropped += 1
                continue
            k_mid = statistics.median(k for _, k in h)
            ctx = [int((s.prompt_tokens or 0) + k_mid) for s in streams]
            kind = "shared" if shared else "decode"
            self.obs.append(Observation(kind, pid, design_row(step_features(ctx, []), shared=reread), y))

    # -- the whole calibration --------------------------------------------------------
    async def run(self) -> Twin:
        self._t0 = time.perf_counter()
        async with new_client(httpx.Timeout(120.0, connect=5.0), transport=self.transport) as c:
            self.progress("reading the server's configuration", 0.0)
            self.server = await self._config(c)
            await self._read_clocks(c, keep=False)
            await asyncio.to_thread(self._learn_lengths)
            cfg = self.server
            self.progress("warming up", 0.0)
            await asyncio.gather(*(self._stream(c, 64, 16) for _ in range(2)))
            pilot = await self._stream(c, 64, 33)
            if pilot.error or len(pilot.times) < 8:
                why = pilot.error or "too few tokens"
                raise TwinError(f"the server did not stream a test answer ({why})", exit_code=EXIT_FAILURE)
            step = (pilot.times[-1] - pilot.times[0]) / (len(pilot.times) - 1)
            mml = cfg.max_model_len
            capacity = cfg.num_gpu_blocks * cfg.block_size
            long_ctx = max(64, min(1024, mml // 2))
            out = int(max(24, min(96, 0.6 / max(step, 1e-4))))  # about half a second of decode at batch 1
            lengths = [n for n in PREFILL_LENGTHS if n <= mml - 8]
            batches = [b for b in DECODE_BATCHES if b <= cfg.max_num_seqs and b * (long_ctx + out) <= capacity]
            mixed = [n for n in MIXED_PREFILLS if n <= mml - 8 and n <= cfg.max_num_batched_tokens]
            shared = [b for b in SHARED_BATCHES if b in batches] if cfg.enable_prefix_caching else []
            # every shape the probes use, once and untimed: a cold engine compiles or allocates on
            # its first batch of a size (the first round ran up to 2.7x slower on the CPU build)
            await asyncio.gather(*(self._stream(c, 32, 8) for _ in range(max(batches, default=1))))
            for n in lengths:
                await self._stream(c, n, 2)
            plan: list[tuple[str, tuple[int, ...]]] = []
            for r in range(ROUNDS):
                plan += [("prefill", (n,)) for n in lengths]
                plan += [("decode", (b, 32, out)) for b in batches]
                plan += [("decode", (b, long_ctx, out)) for b in batches if b <= 8 or r % 2 == 0]
                plan += [("mixed", (n, 32, out * 2)) for n in mixed]
                if shared:
                    plan.append(("shared", (shared[r % len(shared)], long_ctx, out)))
            done = 0
            cost: dict[str, float] = {}
            # the last share of the budget: a mixed load, the whole engine at work (see load())
            load_s = max(LOAD_MIN_S, LOAD_SHARE * self.budget_s)
            probe_budget = self.budget_s - load_s
            for kind, args in plan:
                spent = time.perf_counter() - self._t0
                if done and spent + cost.get(kind, 0.0) > probe_budget:
                    continue
                self.progress(f"{kind} {args[0]}", min(1.0, spent / self.budget_s))
                t = time.perf_counter()
                if kind == "prefill":
                    await self.prefill(c, args[0])
                elif kind in ("decode", "shared"):
                    batch, context, n_out = args
                    await self.decode(c, batch, context, n_out, shared=kind == "shared")
                else:
                    await self.mixed(c, *args)
                cost[kind] = max(cost.get(kind, 0.0), time.perf_counter() - t)
                done += 1
            self.progress("a mixed load", min(1.0, (time.perf_counter() - self._t0) / self.budget_s))
            users = max(2, min(LOAD_USERS, cfg.max_num_seqs))
            mixed_s = load_s * (1 - ANSWERS_SHARE)
            clocks = [asyncio.create_task(self._read_clocks(c, after_s=mixed_s * k / 3)) for k in (1, 2)]
            try:
                load = await self.load(c, users, mixed_s, min(mml - 8, 600))
                await asyncio.gather(*clocks)  # read under the mixed load
            finally:
                for task in clocks:
                    task.cancel()
            self.progress("answers the server ends itself", min(1.0, (time.perf_counter() - self._t0) / self.budget_s))
            lengths = await self.answers(c, load_s * ANSWERS_SHARE, max(16, min(ANSWER_MAX_TOKENS, mml - 80)))
        return self._fitted(time.perf_counter() - self._t0, load, lengths)

    def _fitted(self, seconds: float, load: list[Stream], lengths: list[int]) -> Twin:
        """The twin the probes make: the step model fitted, corrected by the closing load, with
        the answers' lengths and what the calibration noticed."""
        self.progress("fitting", 1.0)
        assert self.server is not None
        if self.dropped:
            self.notes.append(
                f"{self.dropped} decode observation(s) left out: the client's gaps between tokens were under "
                f"1/{GAP_AGREE:g} of the server's own (the stream stalled, then came in a burst)"
            )
        fit, sd, draws, residuals, notes = fit_step_model(self.obs, seed=0)
        poor = [f"{r.kind} {r.median_abs_pct:.0f} %" for r in residuals if r.median_abs_pct > POOR_FIT_PCT]
        if poor:
            notes.append(
                f"the fit is poor against its own probes (median error {', '.join(poor)}; over {POOR_FIT_PCT:g} %): "
                "the server's speed moved during calibration (cold, or shared with other work); calibrate again"
            )
        unmeasured = " ".join(notes)
        zero = [k for k in COEFFS if getattr(fit, k) == 0.0 and f"{k} not measured" not in unmeasured]
        if zero:
            notes.append(f"fitted at 0 (too small for the probes to see): {', '.join(zero)}")
        cv = statistics.median(self.gap_cvs) if self.gap_cvs else 0.0
        twin = Twin(
            fit=fit,
            sd=sd,
            draws=draws,
            step_cv=min(cv, 1.0) if math.isfinite(cv) else 0.0,
            server=self.server,
            residuals=residuals,
            observations=len(self.obs),
            probes=self._probe,
            url=redact_url(self.root),
            seconds=seconds,
            gpu_clocks={g: statistics.median(v) for g, v in self.clocks.items()},
            endpoint=self.endpoint,
            notes=tuple(self.notes + notes),
        )
        twin = correct(twin, load)
        if lengths:
            twin = with_answers(twin, lengths, "answers to the calibration's prompts, EOS honoured")
        else:
            twin = replace(twin, notes=(*twin.notes, "no answer ended by the server itself: answers as long as asked"))
        return twin

    async def answers(self, c: httpx.AsyncClient, seconds: float, max_tokens: int) -> list[int]:
        """How long the server's answers are when it may stop at EOS: short prompts, as many in
        flight as the decode probes' largest batch, each slot sending its next as soon as its last
        answer ends, for about ``seconds`` (each slot at least one) or until :data:`MAX_ANSWERS`
        are asked; each answer's tokens, those cut at ``max_tokens`` included (as ``max_tokens``).

        Every answer asked is kept, the last of each slot too (it ends after the deadline): what
        decides whether a slot asks again is the time its earlier answers took, not this one's
        length, so the sample is not biased towards short answers, as keeping only the answers
        that ended in time would be. (Until 2026-11-30 the slots went in waves, each as long as its
        longest answer: the simulated A100's 180 s calibration learned 64 answers, whose median
        is only good to about 11 %.)"""
        end = time.perf_counter() + seconds
        slots = max(1, min(ANSWER_WAVE, self.server.max_num_seqs if self.server else ANSWER_WAVE))
        out: list[int] = []
        asked = [0]

        async def slot() -> None:
            while True:
                asked[0] += 1
                s = await self._stream(c, 64, max_tokens, eos=True)
                if s.error is None and s.completion_tokens:
                    out.append(s.completion_tokens)
                if time.perf_counter() >= end or asked[0] >= MAX_ANSWERS:
                    return

        await asyncio.gather(*(slot() for _ in range(slots)))
        return out

    async def load(self, c: httpx.AsyncClient, users: int, seconds: float, max_prompt: int) -> list[Stream]:
        """``users`` closed-loop streams of mixed lengths (prompts 50 to ``max_prompt`` tokens,
        30-120 out, 0.1-0.5 s between turns) for ``seconds``: the engine prefilling, decoding and
        mixing at once with the server's front end busy beside it, as under a ramp. What isolated
        probes cannot see (the front end sharing the engine's process or core, a step slower when
        the batch churns) shows here; :func:`correct` fits it."""
        end = time.perf_counter() + seconds
        done: list[Stream] = []

        async def user(k: int) -> None:
            rng = random.Random(self.rng.random())
            while time.perf_counter() < end:
                s = await self._stream(c, rng.randrange(50, max(51, max_prompt)), rng.randrange(30, 121))
                if s.error is None and s.times and s.prompt_tokens is not None:
                    done.append(s)
                await asyncio.sleep(rng.uniform(0.1, 0.5))

        await asyncio.gather(*(user(k) for k in range(users)))
        return done

    async def mixed(self, c: httpx.AsyncClient, length: int, context: int, out: int) -> None:
        """A mixed probe: the newcomer is sent once every decoder has streamed 8 tokens."""
        pid = self._id()
        seen = [0] * MIXED_DECODERS
        decoders = [asyncio.create_task(self._stream(c, context, out, seen, i)) for i in range(MIXED_DECODERS)]
        t_start = time.perf_counter()
        while min(seen) < 8 and time.perf_counter() - t_start < 60 and not all(d.done() for d in decoders):
            await asyncio.sleep(0.001)
        s = await self._stream(c, length, 2)
        streams = await asyncio.gather(*decoders)
        if s.error or not s.times or s.prompt_tokens is None or any(d.error for d in streams):
            self.notes.append(f"a mixed probe failed ({s.error or 'no answer'})")
            return
        chunks = self._chunks(s.prompt_tokens, s.cached_tokens)
        if len(chunks) != 1:
            return
        # each decoder's span from its last token before the newcomer was sent to two tokens past
        # the newcomer's first: n steps of decoding, one of which also holds the prefill. A span,
        # not the one gap: a server behind on streaming delivers tokens in bursts, so single gaps
        # lie, while spans between token reads add up
        rows: list[tuple[float, ...]] = []
        ys: list[float] = []
        for d in streams:
            i0 = max((k for k, t in enumerate(d.times) if t <= s.sent), default=None)
            after = [k for k, t in enumerate(d.times) if t >= s.times[0]]
            if i0 is None or len(after) < 3:
                continue
            i1 = after[2]
            n = i1 - i0
            ctx = int((d.prompt_tokens or 0) + (i0 + i1) / 2)
            decode = step_features([ctx] * MIXED_DECODERS, [])
            prefill = (0.0, *step_features([], chunks)[1:])  # its step is one of the n: no second b0
            rows.append((*tuple(n * a + b for a, b in zip(decode, prefill, strict=True))[:5], 1.0))
            ys.append(d.times[i1] - d.times[i0])
        if len(rows) < MIXED_DECODERS:
            self.notes.append("a mixed probe's prefill did not land among the decodes")
            return
        k = sorted(range(len(ys)), key=ys.__getitem__)[len(ys) // 2]  # the median decoder's span
        # the prefill column is the one step that holds the chunk beside the decoders
        beside = ((1.0, float(sum(n for n, _ in chunks)), float(MIXED_DECODERS)),)
        self.obs.append(Observation("mixed", pid, design_row(rows[k]), ys[k], beside))
