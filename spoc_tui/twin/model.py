"""The twin of a server: its engine's step time as fitted from probes, the time a request spends
outside the engine, and the server's configuration as it reported it. ``twin.json`` holds one.

The step-time model (seconds per engine step), linear in what the step computes::

    step = b0                                  fixed cost of a step (scheduling, launch, sampling)
         + b_prefill  * prefill tokens past     the GEMMs of new prompt tokens beyond those the
                        the ridge               step computes while it reads the weights anyway
         + b_attn     * prefill attention       sum over chunks of n * (done + n/2), in k-token^2
         + b_decode   * decoding sequences      one new token each
         + b_context  * decode context          sum of their context lengths, in k-tokens
         + b_mixed    * [a prefill chunk rides with decodes]
         - b_shared   * shared decode context   k-tokens of context that another decoding
                                                sequence also reads (the same cached prefix blocks)

and a request's time outside the engine (HTTP, tokenizing, queueing into the engine, streaming
back): ``a0 + a_prompt * prompt k-tokens``, paid before the request reaches the scheduler.

Each coefficient is fitted non-negative (:mod:`spoc_tui.twin.fit`) with its bootstrap spread; the
bootstrap's draws are kept, so a prediction runs once per draw and its interval carries the fit's
uncertainty. ``step_cv`` is the steps' own jitter (robust coefficient of variation of decode
gaps), drawn per simulated step.

``ridge`` is the roofline's ridge in tokens: a step reads every weight once whatever it computes,
so a GPU computes its first tokens (about 130 for an 8B model on an A100: weights over memory
bandwidth, times the tensor cores' rate) inside the time the read takes. The prefill column
counts a step's prompt tokens beyond ``max(0, ridge - decodes)``, the room its decodes leave. A
linear model without it timed 100-300-token prefills on the simulated A100 21-23 % slow and
2,048-token ones 10 % fast. The fit searches it over :data:`RIDGES` (a CPU has none: 0), and a
twin before schema 3 has it at 0.

``b_shared`` is what a context token costs *less* when the step already reads its block for
another sequence: requests that share a prefix (a system prompt) hold the same KV blocks once the
prefix cache served them, and a CPU reading a block the step just read for another sequence reads
it from cache (on the real vLLM CPU server, 8 streams sharing a 320-word prefix decoded 28 %
faster than 8 of distinct prompts the same length). It never exceeds ``b_context`` (a shared
token is never free), and a twin without the shared-prefix probe (schema 1) has it at 0.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from spoc_tui.core.errors import InputError
from spoc_tui.core.files import FileReadError, parse_json, read_text_bounded, write_atomic
from spoc_tui.core.jsonsafe import json_safe
from spoc_tui.core.textsafe import clip, safe

TWIN_SCHEMA = 3
"""1: the first twin.json; 2: ``b_shared`` (the shared-prefix decode term) last in the fit, the
sd and every draw (a schema-1 twin reads with it at 0: no saving); 3: ``ridge`` after it (a
schema-1 or -2 twin reads with it at 0: every prefill token costs)."""

COEFFS = ("b0", "b_prefill", "b_attn", "b_decode", "b_context", "b_mixed", "a0", "a_prompt", "b_shared")
"""The fitted coefficients, in the fit's column order (``b_shared`` last: schema 1 had 8)."""
STEP_COEFFS = (*COEFFS[:6], "b_shared")
"""The coefficients of the engine's step (the rest are the time outside it)."""
PARAMS = (*COEFFS, "ridge")
"""What twin.json keeps of each fit, sd and draw: the coefficients, then the ridge (searched,
not fitted by the least squares)."""
RIDGES = (0.0, 16.0, 32.0, 48.0, 64.0, 96.0, 128.0, 160.0, 192.0, 256.0, 320.0, 384.0, 512.0)
"""The ridges the fit tries (prompt tokens)."""
COEFF_HELP = {
    "b0": "s per step",
    "b_prefill": "s per prefill token",
    "b_attn": "s per prefill k-token^2 of attention",
    "b_decode": "s per decoding sequence",
    "b_context": "s per k-token of decode context",
    "b_mixed": "s added to a step that mixes a prefill chunk with decodes",
    "a0": "s per request outside the engine",
    "a_prompt": "s per prompt k-token outside the engine",
    "b_shared": "s saved per k-token of decode context another decoding sequence reads in the same blocks",
    "ridge": "prefill tokens a step computes inside its fixed cost (the roofline's ridge; 0 on a CPU)",
}
WHAT_IF_FLAGS: dict[str, tuple[str, str]] = {
    "max-num-seqs": ("max_num_seqs", "int"),
    "max-num-batched-tokens": ("max_num_batched_tokens", "int"),
    "enable-chunked-prefill": ("enable_chunked_prefill", "bool"),
    "enable-prefix-caching": ("enable_prefix_caching", "bool"),
    "gpu-memory-utilization": ("gpu_memory_utilization", "float"),
}
"""The flags the twin predicts (``spoc twin predict --set``, ``spoc sim --twin``, ``spoc tune
--twin``): vLLM's name -> the twin's setting and its kind."""
WHAT_IF = tuple(key for key, _ in WHAT_IF_FLAGS.values())
"""The twin's settings a what-if changes."""


class TwinError(InputError):
    """A twin that cannot be made, read or used; the message says what to change (exit code 2
    for bad input, 1 where the server failed: set per instance)."""


def step_features(
    decodes: Collection[int], prefills: Sequence[tuple[int, int]], ridge: float = 0.0
) -> tuple[float, ...]:
    """The step's row of the design: (1, prefill tokens past the ridge, attention k-tok^2,
    decodes, context k-tok, mixed), from each decode's context and each prefill chunk's (new
    tokens, done). The shared decode context (``shared`` tokens) is a column of its own:
    :func:`design_row`."""
    n_p = sum(n for n, _ in prefills)
    attn = sum(n * (done + n / 2) for n, done in prefills) / 1e6
    ctx = sum(decodes) / 1e3
    mixed = 1.0 if decodes and prefills else 0.0
    return (1.0, past_ridge(n_p, len(decodes), ridge), attn, float(len(decodes)), ctx, mixed)


def past_ridge(prefill_tokens: float, decodes: int, ridge: float) -> float:
    """A step's prompt tokens beyond those it computes inside its fixed cost: the ridge less
    what its decodes take of it."""
    return max(0.0, prefill_tokens - max(0.0, ridge - decodes))


def design_row(
    step: Sequence[float], outside: float = 0.0, prompt_k: float = 0.0, shared: int = 0
) -> tuple[float, ...]:
    """A full row of the fit's design in :data:`COEFFS` order: a step's (or steps') features,
    the time outside the engine's two columns, and the shared decode context (k-tokens, negative:
    its coefficient is a saving)."""
    return (*step, outside, prompt_k, -shared / 1e3)


def shared_context(prefixes: Sequence[Sequence[Hashable]]) -> int:
    """Blocks of decode context read more than once in a step: each sequence's leading prompt
    blocks (their hashes), counted over the step's decodes; a block held by k of them is read
    k - 1 times more. In blocks (times the block size: tokens)."""
    held = Counter(h for hashes in prefixes for h in hashes)
    return held.total() - len(held)


class SharedBlocks:
    """:func:`shared_context` of a step's decodes, kept as they come and go: a decode's blocks are
    counted when it joins (or its count of blocks changes) and taken out when it leaves, so a
    step costs its changes, not every block of every decode (counting them all each step took a
    third of a twin's replay)."""

    def __init__(self) -> None:
        self._count: dict[Hashable, int] = {}  # a dict: Counter's deletion is Python code
        self._total = 0
        self._by: dict[str, tuple[Sequence[Hashable], int]] = {}
        """Per request: the hash list its blocks came from and how many of them are counted."""

    def _add(self, hashes: Sequence[Hashable]) -> None:
        count = self._count
        get = count.get
        for h in hashes:
            count[h] = get(h, 0) + 1
        self._total += len(hashes)

    def _take(self, hashes: Sequence[Hashable]) -> None:
        count = self._count
        for h in hashes:
            left = count[h] - 1
            if left:
                count[h] = left
            else:
                del count[h]
        self._total -= len(hashes)

    def step(self, held: Mapping[str, tuple[Sequence[Hashable], int]]) -> int:
        """The shared blocks of the step whose decodes hold, by request id, the leading ``n`` of
        these hashes (``(hashes, n)``): as :func:`shared_context` of their leading blocks."""
        for rid, (hashes, n) in held.items():
            was = self._by.get(rid)
            if was is not None and was[1] == n and was[0] is hashes:
                continue
            if was is not None:
                self._take(was[0][: was[1]])
            self._add(hashes[:n])
            self._by[rid] = (hashes, n)
        for rid in [r for r in self._by if r not in held]:
            hashes, n = self._by.pop(rid)
            self._take(hashes[:n])
        return self._total - len(self._count)


@dataclass(frozen=True, slots=True)
class StepModel:
    """One set of coefficients (the fit, or one bootstrap draw of it)."""

    b0: float
    b_prefill: float
    b_attn: float
    b_decode: float
    b_context: float
    b_mixed: float
    a0: float
    a_prompt: float
    b_shared: float = 0.0
    ridge: float = 0.0
    ridge_moves: bool = field(default=False, kw_only=True)
    """Whether the ridge moves with the decode context's read (the passive fit's model): a step
    computes prompt tokens free while it reads its decodes' KV cache as well as the weights, the
    roofline's max of read and compute; added, a big prefill beside a long context was timed for
    both (on the simulated A100, prefill steps 7-12 % slow, the replay's ITL p99 at x6.5 131 ms
    where the truth's was 104)."""

    @classmethod
    def from_vector(cls, v: Sequence[float]) -> StepModel:
        """From the coefficients in :data:`COEFFS` order, and the ridge after them if given."""
        return cls(*(float(x) for x in v))

    def vector(self) -> tuple[float, ...]:
        """The coefficients (:data:`COEFFS`; the ridge is not one)."""
        return tuple(getattr(self, k) for k in COEFFS)

    def params(self) -> tuple[float, ...]:
        """The coefficients and the ridge (:data:`PARAMS`), as twin.json keeps them."""
        return tuple(getattr(self, k) for k in PARAMS)

    def step_s(self, decodes: Collection[int], prefills: Sequence[tuple[int, int]], shared: int = 0) -> float:
        """Seconds of one engine step (0 for an empty one); ``shared``: tokens of the decodes'
        context that another decode in the step reads in the same blocks."""
        if not decodes and not prefills:
            return 0.0
        if not prefills:
            secs = self.decode_step_s(len(decodes), sum(decodes))
        else:
            f = step_features(decodes, prefills, self.moved_ridge(sum(decodes) / 1e3))
            # term by term in the order sum() over the first six of vector() adds them (the same float)
            secs = (
                0
                + self.b0 * f[0]
                + self.b_prefill * f[1]
                + self.b_attn * f[2]
                + self.b_decode * f[3]
                + self.b_context * f[4]
                + self.b_mixed * f[5]
            )
        if shared > 0:
            secs -= min(self.b_shared, self.b_context) * min(shared, sum(decodes)) / 1e3
        return secs

    def decode_step_s(self, decodes: int, context: int) -> float:
        """:meth:`step_s` of ``decodes`` decodes alone holding ``context`` tokens, sharing none (a
        lazy run's every step): the row of step_features is (1, 0, 0, n, context k-tok, 0), summed
        term by term in the order sum() adds it (the same float)."""
        return (
            0.0
            + self.b0 * 1.0
            + self.b_prefill * 0.0
            + self.b_attn * 0.0
            + self.b_decode * float(decodes)
            + self.b_context * (context / 1e3)
            + self.b_mixed * 0.0
        )

    def decode_steps_s(self, decodes: np.ndarray, contexts: np.ndarray, shared: np.ndarray | None) -> np.ndarray:
        """:meth:`step_s` of many steps of decodes alone (``decodes[j]`` of them holding
        ``contexts[j]`` tokens, sharing ``shared[j]``), as an array: the same operations in the
        same order, so each is :meth:`step_s`'s to the last bit."""
        import numpy as np  # the CLI loads this module; only a run needs NumPy

        ctx = contexts.astype(np.int64)
        f: tuple[float | np.ndarray, ...] = (1.0, 0.0, 0.0, decodes.astype(float), ctx / 1e3, 0.0)  # no prefills
        secs: np.ndarray = np.zeros(len(ctx))
        for c, x in zip(self.vector()[:6], f, strict=True):
            secs = secs + c * x
        if shared is not None:
            cut = min(self.b_shared, self.b_context) * np.minimum(shared, ctx) / 1e3
            secs = np.where(shared > 0, secs - cut, secs)
        return secs

    def moved_ridge(self, context_k: float) -> float:
        """The ridge of a step whose decodes hold ``context_k`` k-tokens of context: the prompt
        tokens whose compute the step's reads hide (:attr:`ridge_moves`)."""
        if not self.ridge_moves or self.b_prefill <= 0:
            return self.ridge
        return self.ridge + self.b_context * context_k / self.b_prefill

    def outside_s(self, prompt_tokens: int) -> float:
        """Seconds a request spends outside the engine (HTTP, tokenizing, streaming back)."""
        return self.a0 + self.a_prompt * prompt_tokens / 1e3


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What the twin knows of the server's engine, and where each setting came from."""

    model: str
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    enable_prefix_caching: bool
    gpu_memory_utilization: float | None
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    sources: dict[str, str] = field(default_factory=dict)
    """setting -> ``reported`` (the server's /metrics or /v1/models), ``told`` (an option),
    ``inferred`` (from the probes), ``assumed`` (vLLM's default)."""
    engine_version: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str) -> ServerConfig:
        try:
            return cls(
                model=str(d["model"]),
                max_model_len=_int(d["max_model_len"], "max_model_len", 1, 100_000_000),
                block_size=_int(d["block_size"], "block_size", 1, 65_536),
                num_gpu_blocks=_int(d["num_gpu_blocks"], "num_gpu_blocks", 1, 1_000_000_000),
                enable_prefix_caching=bool(d["enable_prefix_caching"]),
                gpu_memory_utilization=None
                if d.get("gpu_memory_utilization") is None
                else _number("gpu_memory_utilization", d["gpu_memory_utilization"], 1e-3, 1.0),
                max_num_seqs=_int(d["max_num_seqs"], "max_num_seqs", 1, 1_000_000),
                max_num_batched_tokens=_int(d["max_num_batched_tokens"], "max_num_batched_tokens", 1, 100_000_000),
                enable_chunked_prefill=bool(d["enable_chunked_prefill"]),
                sources={str(k): str(v) for k, v in dict(d.get("sources") or {}).items()},  # type: ignore[call-overload]
                engine_version=str(d.get("engine_version") or ""),
            )
        except (KeyError, TypeError, ValueError) as e:
            why = e if type(e) is ValueError else f"{type(e).__name__}: {e}"
            raise TwinError(f"{where}: the server's configuration does not read ({why})") from None

    def with_flags(self, flags: Mapping[str, object]) -> ServerConfig:
        """The configuration after a what-if (``--set``): KV blocks scale with the memory share
        given to the cache (weights and activations stay as they were)."""
        changes: dict[str, object] = dict(flags)
        out = replace(self, sources=dict(self.sources), **changes)  # type: ignore[arg-type]
        for k in flags:
            out.sources[k] = "what-if"
        gmu_new, gmu_old = flags.get("gpu_memory_utilization"), self.gpu_memory_utilization
        if gmu_new is not None and gmu_old:
            # the KV cache is what is left of gmu x memory after the weights: blocks grow with the
            # extra share only; without the weights' size, scale by the ratio (an upper bound)
            out = replace(out, num_gpu_blocks=max(1, int(self.num_gpu_blocks * float(gmu_new) / gmu_old)))  # type: ignore[arg-type]
        return out


def _int(v: object, name: str = "a setting", lo: int = 0, hi: int = 2**62) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise ValueError(f"{name} is {str(v)[:40]!r}, not a whole number")
    if not lo <= v <= hi:
        raise ValueError(f"{name} is {int(v)}: it must lie in [{lo:,}, {hi:,}]")
    return int(v)


@dataclass(frozen=True, slots=True)
class Residuals:
    """How well the fit reproduces its own probes, by kind of observation."""

    kind: str
    """``prefill`` (TTFT of a prompt alone), ``server_prefill`` (the server's own prefill time),
    ``decode`` (decode gaps at a batch size), ``shared`` (the same, prompts sharing a cached
    prefix), ``mixed`` (a decode gap with a prefill in it)."""
    n: int
    median_abs_pct: float
    max_abs_pct: float


@dataclass(frozen=True, slots=True)
class Twin:
    """A calibrated twin: the fit, its draws, the server, and how it was made."""

    fit: StepModel
    sd: StepModel
    """Each coefficient's bootstrap standard deviation."""
    draws: tuple[StepModel, ...]
    step_cv: float
    server: ServerConfig
    residuals: tuple[Residuals, ...] = ()
    observations: int = 0
    probes: int = 0
    calibrated_at: float = field(default_factory=time.time)
    url: str = ""
    seconds: float = 0.0
    """How long the calibration's probes ran."""
    gpu_clocks: dict[str, float] = field(default_factory=dict)
    """From DCGM where given: the GPUs' SM clock (MHz) during the probes, so drift can be told."""
    notes: tuple[str, ...] = ()
    """What the calibration noticed (a probe disturbed by other traffic, a coefficient at zero)."""
    endpoint: str = "chat"
    """What the probes sent: ``chat`` (chat completions, as profiles do) or ``completions``."""
    correction: dict[str, object] = field(default_factory=dict)
    """What the closing mixed load changed (``step_scale``, ``a0_shift``, errors before and after)."""
    answer_lengths: tuple[int, ...] = ()
    """How long the server's answers are when it stops at EOS (a sample of answers' tokens,
    sorted): a prediction draws each answer's length from them, capped at what the request
    asks. Empty: unknown, every answer is as long as asked."""
    answers_from: str = ""
    """Where :attr:`answer_lengths` came from, in words."""

    def answer_text(self) -> str:
        """Which answer lengths a prediction uses, in a few words."""
        if not self.answer_lengths:
            return "every answer as long as asked (the twin knows no answer lengths: spoc twin check teaches it)"
        n = len(self.answer_lengths)
        med = self.answer_lengths[n // 2]
        return f"answers stop at EOS, their lengths from {self.answers_from} ({n} answers, median {med} tokens)"

    def as_dict(self) -> dict[str, object]:
        return {
            "schema": TWIN_SCHEMA,
            "kind": "spoc-twin",
            "url": self.url,
            "calibrated_at": self.calibrated_at,
            "seconds": round(self.seconds, 1),
            "server": self.server.as_dict(),
            "model": {
                "step_s": "b0 + b_prefill*max(0, prefill_tokens - max(0, ridge - decodes)) "
                "+ b_attn*sum(n*(done+n/2))/1e6 + b_decode*decodes "
                "+ b_context*sum(decode_context)/1e3 + b_mixed*[prefill with decodes] "
                "- min(b_shared, b_context)*shared_decode_context/1e3",
                "outside_s": "a0 + a_prompt*prompt_tokens/1e3",
                "units": COEFF_HELP,
            },
            "fit": asdict(self.fit),
            "sd": asdict(self.sd),
            "step_cv": self.step_cv,
            "draws": [list(d.params()) for d in self.draws],
            "residuals": [asdict(r) for r in self.residuals],
            "observations": self.observations,
            "probes": self.probes,
            "gpu_clocks": self.gpu_clocks,
            "endpoint": self.endpoint,
            "correction": self.correction,
            "notes": list(self.notes),
            "answers": {"lengths": list(self.answer_lengths), "from": self.answers_from},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str = "twin.json") -> Twin:
        """A twin of any schema this program wrote.

        Raises:
            TwinError: not a twin, a newer schema, or fields that do not read.
        """
        if d.get("kind") != "spoc-twin":
            raise TwinError(f"{where}: not a twin (spoc twin calibrate writes one)")
        v = d.get("schema")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise TwinError(f"{where}: schema {v!r} is not a version this program wrote")
        if v > TWIN_SCHEMA:
            raise TwinError(
                f"{where}: written by a newer spoc-tui (schema {v}; this one reads 1 to {TWIN_SCHEMA}): upgrade it"
            )
        try:
            fit = _model(d["fit"], v)
            sd = _model(d["sd"], v)
            rows = [
                [_param(PARAMS[i] if i < len(PARAMS) else "?", x) for i, x in enumerate(row)]
                for row in d["draws"]  # type: ignore[attr-defined]
            ]
            server = d["server"]
            residuals = tuple(
                Residuals(str(r["kind"]), int(r["n"]), float(r["median_abs_pct"]), float(r["max_abs_pct"]))
                for r in d.get("residuals") or []  # type: ignore[attr-defined]
            )
            step_cv = _number("step_cv", d.get("step_cv") or 0.0, 0.0, 10.0)
            _check_steps_cost_time(fit, "the fit")
            clocks = d.get("gpu_clocks")
            gpu_clocks = (
                {str(k)[:40]: _number(f"gpu_clocks[{str(k)[:20]!r}]", x, 0.0, 100_000.0) for k, x in clocks.items()}
                if isinstance(clocks, Mapping)
                else {}
            )
            counts = {k: int(_number(k, d.get(k) or 0, 0.0, 1e12)) for k in ("observations", "probes")}
            stamps = {k: _number(k, d.get(k) or 0.0, 0.0, 1e12) for k in ("calibrated_at", "seconds")}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            why = e if type(e) is ValueError else f"{type(e).__name__}: {e}"
            raise TwinError(f"{where}: the fit does not read ({why})") from None
        if not isinstance(server, Mapping):
            raise TwinError(f"{where}: no server configuration")
        width = {1: len(PARAMS) - 2, 2: len(PARAMS) - 1}.get(v, len(PARAMS))  # no b_shared in 1, no ridge in 2
        if any(len(r) != width for r in rows):
            raise TwinError(f"{where}: a draw has the wrong number of coefficients (schema {v} has {width})")
        draws = tuple(StepModel.from_vector(r + [0.0] * (len(PARAMS) - width)) for r in rows)
        for i, draw in enumerate(draws, 1):
            try:
                _check_steps_cost_time(draw, f"draw {i}")
            except ValueError as e:
                raise TwinError(f"{where}: {e}") from None
        return cls(
            fit=fit,
            sd=sd,
            draws=draws or (fit,),
            step_cv=max(0.0, min(step_cv, 2.0)),
            server=ServerConfig.from_dict(server, where),
            residuals=residuals,
            observations=counts["observations"],
            probes=counts["probes"],
            calibrated_at=stamps["calibrated_at"],
            url=str(d.get("url") or ""),
            seconds=stamps["seconds"],
            gpu_clocks=gpu_clocks,
            notes=tuple(str(n) for n in notes) if isinstance(notes := d.get("notes"), list) else (),
            endpoint="completions" if d.get("endpoint") == "completions" else "chat",
            correction=dict(corr) if isinstance(corr := d.get("correction"), Mapping) else {},
            **_answers(d.get("answers"), where),
        )

    def summary(self) -> list[str]:
        """Lines for a person: the coefficients with their spread, the server, the residuals."""
        s = self.server
        out = [
            f"twin of {s.model} at {self.url or '?'}, calibrated "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(self.calibrated_at))} "
            f"({self.probes} probes, {self.observations} observations, {self.seconds:.0f} s, {self.endpoint} requests)",
            f"  engine: {s.num_gpu_blocks} KV blocks of {s.block_size} tokens, max-model-len {s.max_model_len}, "
            f"max-num-seqs {s.max_num_seqs}, max-num-batched-tokens {s.max_num_batched_tokens}, chunked prefill "
            f"{_on(s.enable_chunked_prefill)}, prefix caching {_on(s.enable_prefix_caching)}",
        ]
        out.append(f"  answers: {self.answer_text()}")
        assumed = sorted(k for k, v in s.sources.items() if v == "assumed")
        if assumed:
            out.append(
                f"  assumed (vLLM's defaults; pass them to calibrate if the server differs): {', '.join(assumed)}"
            )
        out.append("  step time:")
        for k in COEFFS:
            mean, sd = getattr(self.fit, k), getattr(self.sd, k)
            rel = f" (+-{100 * sd / mean:.0f} %)" if mean > 0 else ""
            out.append(f"    {k:<10} {_si(mean):>10}{rel:<10} {COEFF_HELP[k]}")
        ridge, ridge_sd = self.fit.ridge, self.sd.ridge
        out.append(f"    {'ridge':<10} {ridge:>8.0f} tok (+-{ridge_sd:.0f})    {COEFF_HELP['ridge']}")
        out.append(f"    step jitter (CV) {100 * self.step_cv:.1f} %")
        if self.gpu_clocks:
            clocks = ", ".join(f"GPU {g} {mhz:.0f}" for g, mhz in sorted(self.gpu_clocks.items()))
            out.append(f"  SM clocks during the probes (MHz, DCGM): {clocks}")
        if self.residuals:
            out.append("  residuals (the fit against its own probes):")
            for r in self.residuals:
                out.append(
                    f"    {r.kind:<15} n={r.n:<4} median |error| {r.median_abs_pct:.1f} %, worst {r.max_abs_pct:.1f} %"
                )
        out.extend(f"  note: {n}" for n in self.notes)
        return [safe(clip(line)) for line in out]  # the model, the URL and the notes come from a file


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _si(v: float) -> str:
    """Seconds in a readable unit."""
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1:
        return f"{v:.3g} s"
    if a >= 1e-3:
        return f"{v * 1e3:.3g} ms"
    if a >= 1e-6:
        return f"{v * 1e6:.3g} us"
    return f"{v * 1e9:.3g} ns"


def _model(d: object, schema: int) -> StepModel:
    """A set of coefficients as twin.json of ``schema`` holds it (schema 1 had no ``b_shared``:
    no saving; schemas 1 and 2 no ``ridge``: every prefill token costs)."""
    if not isinstance(d, Mapping):
        raise TypeError("not an object")
    absent = {"b_shared": 2, "ridge": 3}  # the schema each was added in
    values = (0.0 if schema < absent.get(k, 1) else _param(k, d[k]) for k in PARAMS)
    return StepModel(*values, ridge_moves=d.get("ridge_moves") is True)


MAX_COEFF_S = 3_600.0
"""The most any coefficient may cost (seconds per its unit): an hour. A calibrated one is
micro- to milliseconds; a hand-edited ``1e300`` made a prediction run for ever."""
MAX_RIDGE = 1_000_000.0


def _number(name: str, v: object, lo: float, hi: float) -> float:
    """``v`` as a finite number within ``[lo, hi]``, or ValueError naming ``name``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name} is {str(v)[:40]!r}, not a finite number")
    if not lo <= v <= hi:
        raise ValueError(f"{name} is {v!r}: it must lie in [{lo:g}, {hi:g}]")
    return float(v)


def _param(name: str, v: object) -> float:
    """A coefficient (never negative: the fit is non-negative) or the ridge, checked."""
    return _number(name, v, 0.0, MAX_RIDGE if name == "ridge" else MAX_COEFF_S)


def takes_time(m: StepModel) -> bool:
    """Whether a decode step of one sequence and a prefill of 1,024 tokens each take at least a
    microsecond (coefficients all zero made ``spoc sim --twin`` answer no completion)."""
    return m.step_s([1], []) >= 1e-6 and m.step_s([], [(1024, 0)]) >= 1e-6


def _check_steps_cost_time(m: StepModel, what: str) -> None:
    """A step must take time (:func:`takes_time`)."""
    if not takes_time(m):
        raise ValueError(f"{what}: a step would take no time (b0 and the per-token costs are zero)")


MAX_ANSWERS = 256
"""Answer lengths a twin keeps (a sample: enough for a distribution's shape, a few KB)."""


def _answers(d: object, where: str) -> dict[str, Any]:
    """A twin file's ``answers`` (absent before they were learned: none)."""
    if d is None:
        return {}
    if not isinstance(d, Mapping) or not isinstance(d.get("lengths", []), list):
        raise TwinError(f"{where}: answers: not an object with a list of lengths")
    try:
        lengths = tuple(sorted(int(_number("answers.lengths", x, 1.0, 10_000_000.0)) for x in d.get("lengths", [])))
    except ValueError as e:
        raise TwinError(f"{where}: {e}") from None
    return {"answer_lengths": lengths[:MAX_ANSWERS], "answers_from": str(d.get("from") or "")[:200]}


def with_answers(twin: Twin, lengths: Sequence[int], source: str, seed: int = 0) -> Twin:
    """``twin`` predicting answers of these lengths (at most :data:`MAX_ANSWERS`, drawn evenly)."""
    kept = sorted(int(n) for n in lengths if n > 0)
    if len(kept) > MAX_ANSWERS:
        step = len(kept) / MAX_ANSWERS
        kept = [kept[int(i * step)] for i in range(MAX_ANSWERS)]
    return replace(twin, answer_lengths=tuple(kept), answers_from=source)


def read_twin(path: str | Path) -> Twin:
    """A twin.json.

    Raises:
        TwinError: missing, unreadable, not JSON, not a twin, or a newer schema.
    """

    try:
        text = read_text_bounded(path)
    except FileReadError as e:
        raise TwinError(f"{path}: {e}") from None
    try:
        doc = parse_json(text, keep_non_finite=True)  # each figure refused by name
    except ValueError as e:
        raise TwinError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise TwinError(f"{path}: not a twin (spoc twin calibrate writes one)")
    return Twin.from_dict(doc, str(path))


def write_twin(twin: Twin, path: str | Path) -> None:
    """Raises: TwinError when the file cannot be written."""
    import json

    try:
        write_atomic(path, json.dumps(json_safe(twin.as_dict()), indent=2, allow_nan=False) + "\n")
    except OSError as e:
        raise TwinError(f"cannot write {path} ({e.strerror or e})") from None
