"""The twin's engine: the simulator's scheduler (continuous batching, paged KV, prefix cache,
chunked prefill, preemption: :class:`~spoc_tui.sim.engine.SimEngine`) with the server's own
settings as it reported them, and each step timed by the calibrated model instead of the
datasheet roofline.

The model and GPU the simulator otherwise needs stand in only to build the engine: the KV blocks
are the server's (``num_gpu_blocks``), the context limit its ``max_model_len``, and no step time
comes from them.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from spoc_tui.core.hardware.capacity import IterationCost
from spoc_tui.core.hardware.presets import gpu_preset, model_preset
from spoc_tui.sim.engine import EngineConfig, SimEngine, SimRequest
from spoc_tui.twin.model import ServerConfig, SharedBlocks, StepModel, Twin, TwinError

STAND_IN_MODEL = "llama-3.1-8b"
STAND_IN_GPU = "h100-80gb"
ENGINE_SETTINGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "block_size",
    "max_model_len",
)
"""The server's settings the engine takes as they are (the same names on both)."""


def engine_config(server: ServerConfig, speed: float = 1.0, seed: int = 0) -> EngineConfig:
    """The simulator's configuration for the server's settings.

    Raises:
        TwinError: settings the engine refuses (as vLLM would).
    """
    model = replace(
        model_preset(STAND_IN_MODEL),
        name=server.model,
        served_name=server.model,
        max_position=max(131072, server.max_model_len),
    )
    cfg = EngineConfig(
        model=model,
        gpu=gpu_preset(STAND_IN_GPU),
        served_model_name=server.model,
        speed=speed,
        seed=seed,
        **{name: getattr(server, name) for name in ENGINE_SETTINGS},
    )
    try:
        cfg.validate()
    except ValueError as e:
        raise TwinError(f"the twin's settings are not a valid engine: {e}") from None
    return cfg


_NONE: list[int] = []
"""A request's hashes before it has any (one list: its count of blocks is 0)."""
_TWOPI = 2.0 * math.pi


class TwinEngine(SimEngine):
    """A :class:`SimEngine` whose steps take the calibrated time (one draw of the fit), with the
    steps' own jitter, and whose requests spend the calibrated time outside the engine first."""

    def __init__(
        self,
        twin: Twin,
        model: StepModel | None = None,
        *,
        flags: Mapping[str, object] | None = None,
        speed: float = 1.0,
        seed: int = 0,
        jitter: bool = True,
        clock: Callable[[], float] = time.monotonic,
        answer_lengths: Sequence[int] | None = None,
    ) -> None:
        """
        Args:
            answer_lengths: the answers' lengths to draw from (a bootstrap resample of the
                twin's, for a draw of the prediction); the twin's own by default.
        """
        server = twin.server.with_flags(flags) if flags else twin.server
        super().__init__(engine_config(server, speed, seed), gpus=[], clock=clock)
        self.twin = twin
        self.server = server
        self.model = model or twin.fit
        self.num_blocks = server.num_gpu_blocks
        self.plan = replace(
            self.plan,
            num_blocks=server.num_gpu_blocks,
            kv_cache_tokens=server.num_gpu_blocks * server.block_size,
            kv_cache_bytes=0.0,
            notes=("KV blocks as the server reported them (twin)",),
        )
        cv = twin.step_cv if jitter else 0.0
        self._sigma = math.sqrt(math.log1p(cv * cv)) if cv > 0 else 0.0
        self._jitter_rng = random.Random(seed * 7_919 + 17)
        self._shared_blocks = SharedBlocks()
        self._stream: list[float] = []
        self._carried = False
        self.answer_lengths = tuple(answer_lengths) if answer_lengths is not None else twin.answer_lengths

    def sample_output_len(self, max_tokens: int) -> int:
        """An answer's length when the request lets the server stop at EOS: one of the lengths
        the twin learned (:attr:`Twin.answer_lengths`), capped at what the request asks; as long
        as asked where it learned none."""
        lengths = self.answer_lengths
        if not lengths:
            return max_tokens
        return max(1, min(max_tokens, lengths[self.rng.randrange(len(lengths))]))

    def _shared(self, decodes: list[SimRequest]) -> int:
        """Tokens of the decodes' context read again in this step: prompt blocks (by their
        prefix hashes: the prefix cache hands every request with that prefix the same blocks)
        that another decode holds too."""
        if len(decodes) < 2 or self.model.b_shared <= 0 or not self.cfg.enable_prefix_caching:
            return 0
        bs = self.cfg.block_size
        held: dict[str, tuple[Sequence[Hashable], int]] = {}
        for r in decodes:
            hashes = self._hashes.get(r.rid) or _NONE
            held[r.rid] = (hashes, min(len(hashes), r.computed // bs))
        return self._shared_blocks.step(held) * bs

    def _cost(self, decodes: list[SimRequest], prefills: list[tuple[SimRequest, int]]) -> IterationCost:
        secs = self.model.step_s(self._contexts(decodes), [(n, r.computed) for r, n in prefills], self._shared(decodes))
        # mean-preserving lognormal jitter: the steps' spread as the probes measured it
        return IterationCost(self._jittered(secs), 0.0, 0.0, 0.0, 0.0, 0.0)

    def _lazy_cost(self, n: int, context: int) -> IterationCost:
        """:meth:`_cost` of a step of ``n`` lazy decodes alone holding ``context`` tokens (none
        shares: a lazy run's engine does not time its shared context)."""
        secs = self.model.decode_step_s(n, context)
        return IterationCost(self._jittered(secs), 0.0, 0.0, 0.0, 0.0, 0.0)

    def _jittered(self, secs: float) -> float:
        if secs > 0 and self._sigma > 0:
            return secs * math.exp(self._jitter_rng.gauss(-(self._sigma**2) / 2, self._sigma))
        return secs

    def _jitter_draw(self, n: int) -> list[float] | None:
        """The factors of the next ``n`` steps' jitter, drawn as :meth:`_jittered` would draw them
        one by one (random.gauss's own arithmetic, a pair of normals from two uniforms, the second
        kept for the next draw): the same floats, a tenth of the calls. The normals drawn since
        :meth:`_jitter_mark` are kept (:meth:`_jitter_rewind` needs them)."""
        if self._sigma <= 0:
            return None
        rng = self._jitter_rng
        uniform = rng.random
        zs: list[float] = []
        z = rng.gauss_next  # type: ignore[attr-defined]
        rng.gauss_next = None  # type: ignore[attr-defined]
        if z is not None:
            zs.append(z)
        while len(zs) < n:
            x2pi = uniform() * _TWOPI
            g2rad = math.sqrt(-2.0 * math.log(1.0 - uniform()))
            zs.append(math.cos(x2pi) * g2rad)
            zs.append(math.sin(x2pi) * g2rad)
        # the stream of normals: one carried over from the last draw is in it already
        self._stream.extend(zs[1:] if self._carried and z is not None else zs)
        self._carried = len(zs) > n
        if self._carried:
            rng.gauss_next = zs.pop()  # type: ignore[attr-defined]
        mu, sigma = -(self._sigma**2) / 2, self._sigma
        return [math.exp(mu + z * sigma) for z in zs]

    def _jitter_mark(self) -> object:
        """Where the draws stand (the generator's state, and whether a normal was held over)."""
        if self._sigma <= 0:
            return None
        self._stream, self._carried = [], False
        rng = self._jitter_rng
        return rng.getstate(), rng.gauss_next is not None  # type: ignore[attr-defined]

    def _jitter_rewind(self, mark: object, used: int) -> None:
        """Back to ``mark``, then on by exactly ``used`` draws (a run drew ahead): the uniforms they
        took are taken again (cheap), the normal held over for the next draw is the stream's."""
        if mark is None:
            return
        assert isinstance(mark, tuple)
        state, held = mark
        rng = self._jitter_rng
        rng.setstate(state)
        fresh = used - 1 if held and used else used  # the held normal, when used, took no uniform
        pairs = -(-fresh // 2)
        uniform = rng.random
        for _ in range(2 * pairs):
            uniform()
        if held and not used:
            return  # the held one still held (the state has it)
        rng.gauss_next = self._stream[used] if fresh % 2 else None  # type: ignore[attr-defined]

    def _times_shared(self) -> bool:
        return self.model.b_shared > 0 and self.cfg.enable_prefix_caching

    def _decode_costs(
        self, decodes: np.ndarray, contexts: np.ndarray, shared: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`StepModel.step_s` of steps of decodes alone, as arrays (the same operations in
        the same order: each step's time to the last bit); no jitter (:meth:`_jittered`)."""
        m = self.model
        secs = m.decode_steps_s(decodes, contexts, shared)
        zero = np.zeros(len(secs))
        return secs, zero, zero

    def outside_s(self, prompt_tokens: int) -> float:
        return self.model.outside_s(prompt_tokens)
