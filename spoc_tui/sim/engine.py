"""The simulated vLLM engine: continuous batching over a paged, prefix-cached KV cache.

One :meth:`SimEngine.step` is one engine iteration. The scheduler follows vLLM V1: running
requests decode first (one token each, up to ``max_num_seqs``), the remaining token budget
(``max_num_batched_tokens``) goes to prefills, chunked when chunked prefill is on. KV blocks
are allocated per ``block_size`` tokens; when a decode needs a block and none is free, the
most recently admitted request is preempted (its blocks freed, recomputed later). Finished
requests leave their full blocks in an LRU prefix cache keyed by a hash chain of block
token ids, so multi-turn conversations that resend their history hit the cache.

The iteration's duration comes from the roofline in :mod:`spoc_tui.core.hardware.capacity`, on the
slowest GPU of the tensor-parallel group.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import zlib
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from spoc_tui.core.hardware.capacity import (
    CapacityError,
    IterationCost,
    iteration_time,
    kv_bytes_per_token,
    plan,
)
from spoc_tui.core.hardware.presets import GpuSpec, ModelSpec
from spoc_tui.core.tuning.engineflags import BLOCK_SIZES, EngineFlags
from spoc_tui.sim.decoderun import Run, decode_run, roofline_decode_costs
from spoc_tui.sim.gpu import SimGpu
from spoc_tui.sim.lazy import Contexts, Decoders
from spoc_tui.sim.lazyrun import lazy_run
from spoc_tui.sim.prefix import BlockHash, PrefixCache
from spoc_tui.sim.stats import EngineStats, Hist, hist_request_tokens

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
FILLER = (
    "the of and to in is that for it as with was on be by at this from or an are not have "
    "has but they which one you all were we there can been more will would their if so about "
    "what when up out into time only new some could these two may then do first any like now"
).split()


_FILLER_IDS = [zlib.crc32(w.encode()) & 0xFFFFFF for w in FILLER]
_FILLER_ARRAY = np.asarray(_FILLER_IDS, dtype=np.int64)
_ASSISTANT = zlib.crc32(b"assistant") & 0xFFFFFF


def tokenize(text: str) -> list[int]:
    """The simulator's tokenizer: words and punctuation, ids by CRC32 (exact and stable)."""
    return [zlib.crc32(t.encode()) & 0xFFFFFF for t in _TOKEN_RE.findall(text)]


def chat_tokens(messages: list[dict[str, object]]) -> list[int]:
    """Tokens of a chat conversation under a simple template (4 tokens per message + 3)."""
    ids: list[int] = []
    for m in messages:
        ids.extend((1, zlib.crc32(str(m.get("role", "")).encode()) & 0xFFFFFF, 2))
        content = m.get("content", "")
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        ids.extend(tokenize(str(content)))
        ids.append(3)
    ids.extend((1, _ASSISTANT, 2))  # the generation prompt opens an assistant turn
    return ids


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig(EngineFlags):
    """The simulated engine: vLLM's flags (:class:`EngineFlags`, their defaults declared there),
    the model, the GPUs and the simulation's own settings."""

    model: ModelSpec
    gpu: GpuSpec
    served_model_name: str
    tp: int = 1
    quantization: str | None = None
    """``fp8``: FP8 weights (half the bytes, twice the tensor throughput)."""
    speed: float = 1.0
    """Simulated seconds per wall second (tests run faster than real time)."""
    seed: int = 0

    def resolved_max_model_len(self) -> int:
        return self.max_model_len or min(self.model.max_position, 32768)

    def resolved_batched_tokens(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 8192 if self.enable_chunked_prefill else max(8192, self.resolved_max_model_len())

    def validate(self) -> None:
        """Refuse what vLLM refuses, with its kind of message.

        Raises:
            CapacityError: impossible or invalid configuration.
        """
        if self.max_num_seqs < 1:
            raise CapacityError("max-num-seqs must be at least 1")
        if self.block_size not in BLOCK_SIZES:
            raise CapacityError(f"block-size {self.block_size} is not one of {', '.join(map(str, BLOCK_SIZES))}")
        mml = self.resolved_max_model_len()
        if mml > self.model.max_position:
            raise CapacityError(f"max-model-len {mml} exceeds the model's {self.model.max_position} positions")
        mbt = self.resolved_batched_tokens()
        if mbt < 1:
            raise CapacityError("max-num-batched-tokens must be positive")
        if not self.enable_chunked_prefill and mbt < mml:
            raise CapacityError(
                f"max_num_batched_tokens ({mbt}) is smaller than max_model_len ({mml}). This effectively "
                "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer "
                "sequences. Please increase max_num_batched_tokens or decrease max_model_len."
            )
        if self.quantization not in (None, "fp8"):
            raise CapacityError(f"quantization {self.quantization!r} is not simulated; known: fp8")
        if mbt < self.max_num_seqs and self.max_num_batched_tokens is not None:
            raise CapacityError(f"max-num-batched-tokens ({mbt}) must be at least max-num-seqs ({self.max_num_seqs})")


@dataclass(eq=False)  # a request is itself: list.remove and `in` compare identity, not every field
class SimRequest:
    rid: str
    prompt: Sequence[int]
    """Its token ids (a list; a trace replay's, runs of ids: :class:`~spoc_tui.twin.rowprompts.RunPrompt`)."""
    max_tokens: int
    target_tokens: int
    """How many tokens it will generate (max_tokens when ignore_eos, else a sampled length)."""
    arrival: float
    on_token: Callable[[int, float], None] | None = None
    on_finish: Callable[[SimRequest], None] | None = None
    times: list[float] | None = None
    """Where the engine notes each token's time (a client in virtual time); ``on_token`` streams
    them one by one instead (the live server's), which keeps the request on the step path."""
    computed: int = 0
    """Tokens whose KV is in the cache (prompt + generated)."""
    generated: int = 0
    blocks: int = 0
    cached_tokens: int = 0
    shared_blocks: int = 0
    """Leading full prompt blocks computed and offered to other requests while this one runs."""
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0
    aborted: bool = False
    itl: list[float] = field(default_factory=list)
    seq: int = 0
    """Its place in the batch's order (counted as requests are admitted)."""
    lazy: int = -1
    """The step count it became a lazy decode at (:mod:`spoc_tui.sim.lazy`), -1 when it is not one."""
    keys: list[BlockHash] | None = None
    """The keys (:meth:`PrefixCache.hashes`) of its prompt's leading full blocks as far as its
    sender knows them: a trace replay's, all (worked out for many rows at once); a user's next
    turn, its conversation's so far (its last turn's, whose prompt and answer it begins with). The
    engine works out the rest at its admission. Once it ends, the keys of the blocks it left in the
    prefix cache (its prompt's and its answer's), which a next turn hands on; those up to
    :attr:`own_from` where that is set."""
    own_from: int | None = None
    """The first of its blocks no other request can ever look up (a trace replay's row: its first
    block no other row names, and every block after it, its answer's too; None: any may be).
    Those are neither offered to requests that arrive while it runs nor hashed at its end: the
    prefix cache holds them as a count, in their place (:meth:`PrefixCache.insert`), so that they
    are evicted in their turn as before."""

    @property
    def total_len(self) -> int:
        return len(self.prompt) + self.generated

    out_seed: int = 0

    def word(self, i: int) -> str:
        """The i-th generated word (one token each): filler, but stable, so a client that
        sends the answer back in its next turn hits the prefix cache as with a real server."""
        return FILLER[(self.out_seed + i * 7) % len(FILLER)]

    def output_array(self, n: int) -> np.ndarray:
        """The first ``n`` of :meth:`output_ids`, as an array."""
        return _FILLER_ARRAY[(self.out_seed + np.arange(n) * 7) % len(FILLER)]

    def output_ids(self) -> list[int]:
        if self.generated < 32:
            return [_FILLER_IDS[(self.out_seed + i * 7) % len(FILLER)] for i in range(self.generated)]
        ids: list[int] = self.output_array(self.generated).tolist()
        return ids


class SimEngine:
    """One simulated engine on a TP group of :class:`SimGpu`."""

    LAZY = True
    """Step the decodes past their prefill as one (:mod:`spoc_tui.sim.lazy`); off, each is walked
    at every step (the tests compare the two)."""

    def __init__(
        self, cfg: EngineConfig, gpus: list[SimGpu] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        cfg.validate()
        self.cfg = cfg
        self.plan = plan(
            cfg.model,
            cfg.gpu,
            tp=cfg.tp,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.resolved_max_model_len(),
            kv_cache_dtype=cfg.kv_cache_dtype,
            block_size=cfg.block_size,
            weights_dtype=cfg.quantization,
        )
        self.num_blocks = self.plan.num_blocks
        self.kv_per_token = kv_bytes_per_token(cfg.model, cfg.kv_cache_dtype)
        self.gpus = gpus if gpus is not None else [SimGpu(i, cfg.gpu, seed=cfg.seed) for i in range(cfg.tp)]
        self.clock = clock
        self.rng = random.Random(cfg.seed)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.running_peak = 0
        """The most requests the engine has run at once (the seats, ``max_num_seqs``, bound it)."""
        self.used_blocks = 0
        self.cache = PrefixCache()
        self.max_len = cfg.resolved_max_model_len()
        self.stats = EngineStats(
            request_prompt_tokens=Hist(hist_request_tokens(self.max_len)),
            request_generation_tokens=Hist(hist_request_tokens(self.max_len)),
            request_prefill_computed_tokens=Hist(hist_request_tokens(self.max_len)),
        )
        self.budget = cfg.resolved_batched_tokens()
        self._hashes: dict[str, list[BlockHash]] = {}
        self._live: dict[BlockHash, int] = {}
        """Hashes of prompt blocks that running requests have computed, with how many hold each."""
        self.last_iteration_s = 0.0
        self._last_cost = IterationCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        self.busy_s = 0.0
        self._abort_pending = False
        """A request was aborted since the last schedule (the decode run leaves it to the step path)."""
        self._lazy: Decoders[SimRequest] = Decoders(cfg.block_size)
        self._eager: list[SimRequest] = []
        """The running requests that are not lazy decodes, in the batch's order."""
        self._step_lazy = 0
        """Lazy decodes in the step scheduled and not yet completed."""
        self._pending: tuple[list[SimRequest], list[tuple[SimRequest, int]]] = ([], [])
        self._admitted = 0

    # -- requests -----------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        req.aborted = True
        self._abort_pending = True

    def outside_s(self, prompt_tokens: int) -> float:
        """Seconds a request spends outside the engine before it reaches the scheduler (HTTP,
        tokenizing): none in the simulator (its own HTTP is real); a twin's calibrated figure."""
        return 0.0

    def _share(self, req: SimRequest) -> None:
        """Offer the request's newly computed full prompt blocks to requests that arrive while it
        runs (vLLM hashes a block once it is computed, not when its request ends)."""
        hashes = self._hashes.get(req.rid)
        if hashes is None:
            return
        full = min(len(hashes), req.computed // self.cfg.block_size)  # its keys stop at own_from
        live = self._live
        for h in hashes[req.shared_blocks : full]:
            live[h] = live.get(h, 0) + 1
        req.shared_blocks = max(req.shared_blocks, full)

    def _unshare(self, req: SimRequest) -> None:
        hashes = self._hashes.get(req.rid) or []
        live = self._live
        for h in hashes[: req.shared_blocks]:
            n = live.get(h, 0) - 1
            if n > 0:
                live[h] = n
            else:
                live.pop(h, None)
        req.shared_blocks = 0

    def _free(self, req: SimRequest, cache_it: bool) -> None:
        self._unshare(req)
        self.used_blocks -= req.blocks
        if cache_it and self.cfg.enable_prefix_caching:
            bs = self.cfg.block_size
            known = self._hashes.get(req.rid) or []
            m, n = len(known), req.computed // bs
            own = req.own_from
            if own is not None and own <= m:  # its blocks from ``own`` on: a count, never hashed
                req.keys = known[: min(own, n)]
            elif n > m:  # the prompt's last part, then the answer up to the last full block's end
                head = req.prompt[m * bs :]
                tail = np.concatenate((np.asarray(head, np.int64), req.output_array(n * bs - len(req.prompt))))
                req.keys = PrefixCache.continued(known, tail, bs, n)
            else:
                req.keys = known[:n]
            self.cache.insert(req.keys, n - len(req.keys))
        req.blocks = 0
        self.cache.evict_to(self.num_blocks - self.used_blocks)

    def _finish(self, req: SimRequest, now: float, reason: str) -> None:
        req.finished = now
        req.finish_reason = reason
        self._free(req, cache_it=reason != "abort")
        self._hashes.pop(req.rid, None)
        st = self.stats
        st.success[reason] = st.success.get(reason, 0) + 1
        st.e2e.observe(now - req.arrival)
        st.request_prompt_tokens.observe(len(req.prompt))
        st.request_generation_tokens.observe(req.generated)
        st.request_prefill_computed_tokens.observe(max(0, len(req.prompt) - req.cached_tokens))
        if req.first_scheduled is not None:
            st.queue.observe(req.first_scheduled - req.arrival)
            if req.first_token is not None:
                st.prefill_time.observe(req.first_token - req.first_scheduled)
                st.decode_time.observe(now - req.first_token)
        if req.generated > 1 and req.first_token is not None:
            st.tpot.observe((now - req.first_token) / (req.generated - 1))
        if req.on_finish:
            req.on_finish(req)

    def _answered(self, req: SimRequest, now: float) -> None:
        """``req``'s answer ended with its last token at ``now``: out of the batch and finished,
        cut at its max_tokens or the context ("length") or at its end ("stop")."""
        self.running.remove(req)
        if req in self._eager:
            self._eager.remove(req)
        cut = req.generated >= req.max_tokens or req.total_len >= self.max_len
        self._finish(req, now, "length" if cut else "stop")

    def _prompt_keys(self, r: SimRequest) -> list[BlockHash]:
        """The keys of ``r``'s prompt's full blocks (up to :attr:`SimRequest.own_from`: no request
        looks further): those its sender knew (:attr:`SimRequest.keys`), the rest worked out from
        its tokens after them (the same keys as all from its tokens)."""
        bs = self.cfg.block_size
        n = len(r.prompt) // bs
        if r.own_from is not None and r.own_from < n:
            n = r.own_from
        known = r.keys or []
        if len(known) >= n:
            return known if len(known) == n else known[:n]
        return PrefixCache.continued(known, r.prompt[len(known) * bs :], bs, n)

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cfg.block_size)

    def _grow(self, req: SimRequest, new_len: int) -> bool:
        need = self._blocks_for(new_len) - req.blocks
        if need <= 0:
            return True
        if self.used_blocks + need > self.num_blocks:
            return False
        self.used_blocks += need
        req.blocks += need
        self.cache.evict_to(self.num_blocks - self.used_blocks)
        return True

    def _preempt_last(self) -> SimRequest | None:
        if not self.running:
            return None
        victim = self.running.pop()
        assert victim.lazy < 0 and self._eager and self._eager[-1] is victim, "a lazy decode preempted"
        self._eager.pop()
        self._unshare(victim)
        self.used_blocks -= victim.blocks
        victim.blocks = 0
        victim.computed = 0
        victim.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    # -- one iteration --------------------------------------------------------------------
    def schedule(self) -> tuple[list[SimRequest], list[tuple[SimRequest, int]]]:
        """Pick this step's decodes and prefill chunks (and allocate their KV blocks)."""
        now = self.clock()
        budget = self.budget
        bs = self.cfg.block_size
        decodes: list[SimRequest] = []
        prefills: list[tuple[SimRequest, int]] = []
        lazy = self._lazy
        if lazy.n and not self._lazy_holds():
            self.wake_all()
        if self._abort_pending:
            self._drop_aborted(now)
        self._step_lazy = lazy.n
        if lazy.n:  # every lazy decode its token, first in the batch's order (_lazy_holds)
            budget -= lazy.n
            if need := lazy.blocks_due():
                self.used_blocks += need
                self.cache.evict_to(self.num_blocks - self.used_blocks)
        # Running requests: decode, or continue a chunked prefill.
        i = 0
        running = self._eager
        while i < len(running) and budget > 0:
            r = running[i]
            target = len(r.prompt) + r.generated
            remaining = target - r.computed
            if remaining <= 1 and r.computed >= len(r.prompt) and r.computed < r.blocks * bs:
                budget -= 1  # a decode whose next token fits its blocks: nothing else to weigh
                decodes.append(r)
                i += 1
                continue
            if remaining <= 0:
                remaining = 1  # a decode step for the last sampled token
            chunk = min(remaining, budget) if self.cfg.enable_chunked_prefill else remaining
            if chunk > budget:
                i += 1
                continue
            gone = False
            while not self._grow(r, r.computed + chunk):
                victim = self._preempt_last()
                if victim is None or victim is r:
                    gone = True
                    break
            if gone:
                continue
            if self._blocks_for(r.computed + chunk) > r.blocks:
                i += 1
                continue
            budget -= chunk
            if remaining == 1 and r.computed >= len(r.prompt):
                decodes.append(r)
            else:
                prefills.append((r, chunk))
            i += 1
        # New requests, in arrival order, while seats, budget and blocks last.
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            r = self.waiting[0]
            target = len(r.prompt) + r.generated
            if target > self.max_len or self._blocks_for(len(r.prompt) + r.target_tokens) > self.num_blocks:
                # longer than the context, or than the whole KV cache (a twin's that reports a few
                # blocks): it can never run; waited on, a replay never ended (issue 74)
                self.waiting.popleft()
                self._finish(r, now, "abort")
                continue
            hit = 0
            if self.cfg.enable_prefix_caching and r.computed == 0:
                hashes = self._hashes.get(r.rid)
                if hashes is None:
                    hashes = self._hashes[r.rid] = self._prompt_keys(r)
                # Never treat the whole prompt as cached: the last token must be computed.
                usable = hashes[: max(0, (len(r.prompt) - 1) // bs)]
                hit = self.cache.match(usable, self._live) * bs
            remaining = target - (r.computed or hit)
            chunk = min(remaining, budget) if self.cfg.enable_chunked_prefill else remaining
            if chunk > budget:
                break
            base = r.computed or hit
            if not self._grow(r, base + chunk):
                break
            self.waiting.popleft()
            if r.computed == 0:
                r.computed = hit
                r.cached_tokens = hit
                self.stats.prefix_queries += len(r.prompt)
                self.stats.prefix_hits += hit
            if r.first_scheduled is None:
                r.first_scheduled = now
            self._admitted += 1
            r.seq = self._admitted
            self.running.append(r)
            self._eager.append(r)
            budget -= chunk
            prefills.append((r, chunk))
        if len(self.running) > self.running_peak:
            self.running_peak = len(self.running)
        return decodes, prefills

    def _drop_aborted(self, now: float) -> None:
        """The requests aborted since the last step out of the batch and the queue, finished."""
        self._abort_pending = False
        for r in [r for r in self.running if r.aborted]:
            self.running.remove(r)
            self._eager.remove(r)
            self._finish(r, now, "abort")
        for r in [r for r in self.waiting if r.aborted]:
            self.waiting.remove(r)
            self._finish(r, now, "abort")

    def _lazy_holds(self) -> bool:
        """Whether the next step may step the lazy decodes as one, as vLLM's scheduler would step
        them one by one: no abort to handle, each gets its token (within the token budget, and
        the running requests still in their prefill after all of them in the batch's order, so
        none takes the budget before them) and the blocks they take are free."""
        lazy = self._lazy
        if self._abort_pending or lazy.n > self.budget:
            return False
        if self._eager and self._eager[0].seq < lazy.top:
            return False
        return self.used_blocks + lazy.blocks_due() <= self.num_blocks

    def wake_all(self) -> None:
        """Every lazy decode's fields as the step path would have them (before a decode run, an
        abort, a step the lazy decodes cannot take as one)."""
        if self._lazy.n:
            self._lazy.wake_all(self.running)
            self._eager = list(self.running)
        self._step_lazy = 0

    def _contexts(self, decodes: list[SimRequest]) -> list[int] | Contexts:
        """The step's decodes' contexts, the lazy ones' included, as the cost models read them."""
        if not self._step_lazy:
            return [r.computed for r in decodes]
        return Contexts(len(decodes) + self._step_lazy, sum(r.computed for r in decodes) + self._lazy.context())

    def _decode_costs(
        self, decodes: np.ndarray, contexts: np.ndarray, shared: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Steps of decodes alone, ``decodes[j]`` of them with ``contexts[j]`` tokens of context in
        all: each one's seconds, FLOPs and bytes read per GPU (:meth:`_cost`'s, as arrays)."""
        ratio = min(g.clock_ratio for g in self.gpus) if self.gpus else 1.0
        return roofline_decode_costs(
            self.cfg.model,
            self.cfg.tp,
            decodes,
            contexts,
            self.plan.weights_bytes_per_gpu,
            self.kv_per_token,
            self.cfg.gpu,
            clock_ratio=ratio,
            flops_scale=2.0 if self.cfg.quantization == "fp8" else 1.0,
        )

    def _jitter_draw(self, n: int) -> list[float] | None:
        """The next ``n`` steps' jitter factors, as a twin's step draws them (None: none)."""
        return None

    def _jitter_mark(self) -> object:
        """Where the jitter's draws stand (:meth:`_jitter_rewind` goes back to it)."""
        return None

    def _jitter_rewind(self, mark: object, used: int) -> None:
        """Back to ``mark`` and on by ``used`` draws (a decode run drew ahead)."""
        return None

    def _times_shared(self) -> bool:
        """Whether a step's time depends on the context its decodes share (:meth:`_shared`)."""
        return False

    def _shared(self, decodes: list[SimRequest]) -> int:
        return 0

    def decode_run(
        self,
        until: float,
        horizon: Callable[[], float],
        clock_to: Callable[[float], None],
        *,
        strict: bool = False,
    ) -> Run:
        """The decode steps up to the next event worked out at once: the lazy decodes'
        (:func:`~spoc_tui.sim.lazyrun.lazy_run`), or where they are off, the decode run's
        (:func:`~spoc_tui.sim.decoderun.decode_run`)."""
        if self.LAZY and not self._times_shared():
            return lazy_run(self, until, horizon, clock_to, strict)
        return decode_run(self, until, horizon, clock_to, strict=strict)

    def cost(self, decodes: list[SimRequest], prefills: list[tuple[SimRequest, int]]) -> float:
        return self._cost(decodes, prefills).seconds

    def _lazy_cost(self, n: int, context: int) -> IterationCost:
        """:meth:`_cost` of a step of ``n`` lazy decodes alone holding ``context`` tokens."""
        return self._cost_of(Contexts(n, context), [])

    def _cost(self, decodes: list[SimRequest], prefills: list[tuple[SimRequest, int]]) -> IterationCost:
        return self._cost_of(self._contexts(decodes), [(n, r.computed) for r, n in prefills])

    def _cost_of(self, contexts: Collection[int], prefills: list[tuple[int, int]]) -> IterationCost:
        """A step's cost: its decodes' contexts, its prefill chunks (tokens, computed before)."""
        ratio = min(g.clock_ratio for g in self.gpus) if self.gpus else 1.0
        c = iteration_time(
            self.cfg.model,
            self.cfg.gpu,
            self.cfg.tp,
            contexts,
            prefills,
            self.plan.weights_bytes_per_gpu,
            self.kv_per_token,
            clock_ratio=ratio,
            flops_scale=2.0 if self.cfg.quantization == "fp8" else 1.0,
        )
        return c

    def complete(self, decodes: list[SimRequest], prefills: list[tuple[SimRequest, int]], now: float) -> None:
        """Apply the iteration's results at time ``now``: tokens out, requests finished."""
        st = self.stats
        st.iterations += 1
        k, self._step_lazy = self._step_lazy, 0
        tokens = k + len(decodes) + sum(n for _, n in prefills)
        if tokens:
            # the same model that times the step counts its work: FLOPs and bytes read per GPU
            # from the cost model, and the new tokens' KV entries written
            c = self._last_cost
            st.iteration_tokens.observe(tokens)
            st.flops_per_gpu += c.flops
            st.read_bytes_per_gpu += c.bytes_read
            st.write_bytes_per_gpu += self.kv_per_token / self.cfg.tp * tokens
        lazy = self._lazy
        lazy.tick(now)
        if k:  # each lazy decode made its token: one gap each since the step before
            st.generation_tokens += k
            st.itl.observe_times(now - lazy.ends[-2], k)
            for r in lazy.ending():  # first in the batch's order (_lazy_holds)
                self._answered(r, now)
        emitted: list[SimRequest] = []
        for r in decodes:
            r.computed += 1
            emitted.append(r)
        for r, n in prefills:
            r.computed += n
            if self.cfg.enable_prefix_caching:
                self._share(r)
            if r.computed >= len(r.prompt) + r.generated:
                emitted.append(r)
        st.generation_tokens += len(emitted)
        gaps: list[float] = []
        max_len = self.max_len
        for r in emitted:
            g = r.generated = r.generated + 1
            if r.first_token is None:
                r.first_token = now
                st.ttft.observe(now - r.arrival)
                # as vLLM V1 counts prompt_tokens: the whole prompt, the prefix cache's hits
                # included (its prompt_tokens_by_source splits them), once its prefill is done
                st.prompt_tokens += len(r.prompt)
            elif r.last_token is not None:
                gaps.append(now - r.last_token)
            r.last_token = now
            if r.times is not None:
                r.times.append(now)
            if r.on_token:
                r.on_token(g, now)
            if g >= r.target_tokens or len(r.prompt) + g >= max_len:
                self._answered(r, now)
        if len(gaps) > 8:
            st.itl.observe_many(np.asarray(gaps))
        else:
            for gap in gaps:
                st.itl.observe(gap)
        if self.LAZY and emitted and not self._times_shared():
            self._make_lazy(emitted)

    def _make_lazy(self, emitted: list[SimRequest]) -> None:
        """The requests that just made a token and decode next, read by nobody token by token,
        stepped as one from now on (:mod:`spoc_tui.sim.lazy`)."""
        lazy, bs, max_len = self._lazy, self.cfg.block_size, self.max_len
        entered = False
        for r in emitted:
            if (
                r.finished is None
                and r.on_token is None
                and r.times is not None
                and not r.aborted
                and r.computed == len(r.prompt) + r.generated - 1
                and r.blocks == -(-r.computed // bs)
            ):
                lazy.enter(r, max_len)
                entered = True
        if entered:
            self._eager = [r for r in self._eager if r.lazy < 0]
            lazy.trim(self.running)

    def step(self) -> float:
        """Schedule one iteration and return its duration (simulated seconds); tokens are
        delivered by :meth:`complete`, which the caller runs when the time has passed."""
        decodes, prefills = self.schedule()
        self._pending = (decodes, prefills)
        self._last_cost = self._cost(decodes, prefills)
        self.last_iteration_s = self._last_cost.seconds
        return self.last_iteration_s

    def stepping(self) -> bool:
        """Whether the step just scheduled (:meth:`step`) runs anything."""
        decodes, prefills = self._pending
        return bool(decodes or prefills or self._step_lazy)

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0

    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -- the real-time loop -------------------------------------------------------------
    async def run(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        """Iterate in (scaled) real time until ``stop`` is set."""
        speed = self.cfg.speed
        last = self.clock()
        while not stop.is_set():
            if self.idle():
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), timeout=0.25)
                except TimeoutError:
                    pass
                now = self.clock()
                self.step_gpus(now - last, 0.0, 0.0)
                last = now
                continue
            dur = self.step()
            decodes, prefills = self._pending
            if dur <= 0:
                await asyncio.sleep(0.001)
                continue
            await asyncio.sleep(dur / speed)
            now = self.clock()
            self.complete(decodes, prefills, now)
            n_prefill = sum(n for _, n in prefills)
            intensity = 0.72 + 0.28 * min(1.0, n_prefill / 2048)
            self.step_gpus(now - last, 1.0, intensity)
            last = now

    def step_gpus(self, wall_dt: float, busy: float, intensity: float) -> None:
        dt = wall_dt * self.cfg.speed
        for g in self.gpus:
            g.step(dt, busy, intensity)
            g.fb_used_mib = (
                self.plan.weights_bytes_per_gpu + self.plan.kv_cache_bytes / self.cfg.tp + 1.2 * 2**30
            ) / 2**20

    def sample_output_len(self, max_tokens: int) -> int:
        """Natural answer length when EOS is honoured: log-normal around 220 tokens."""
        n = int(self.rng.lognormvariate(5.2, 0.7))
        return max(1, min(max_tokens, n))
