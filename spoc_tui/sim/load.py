"""The simulator's built-in background load for ``spoc demo``: multi-turn chat users.

Users share a system prompt (so prefix caching matters), grow their conversation each turn
and think between turns. The number of active users drifts slowly so the monitor has
something to show. The load drives the engine directly (no HTTP), which keeps the demo
light on a laptop.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import Any

from spoc_tui.sim.engine import FILLER, SimEngine, SimRequest, chat_tokens

SYSTEM_PROMPT = " ".join(FILLER[(i * 5) % len(FILLER)] for i in range(400))


async def run_until(stop: asyncio.Event, work: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Run ``work`` until ``stop`` is set, then cancel it and wait for every task to end."""
    tasks = [asyncio.create_task(c) for c in work]
    try:
        await stop.wait()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class BuiltinLoad:
    def __init__(
        self,
        engine: SimEngine,
        users: int,
        wake: asyncio.Event,
        think_s: tuple[float, float] = (1.0, 6.0),
        seed: int = 0,
        wave_period_s: float = 180.0,
        heavy: bool = False,
        ramp_s: float | None = None,
    ) -> None:
        """
        Args:
            heavy: long pasted contexts and long answers (fills the KV cache).
            ramp_s: grow the active users linearly from 10 % over this many seconds, instead
                of the slow wave (so the queue keeps growing).
        """
        self.engine = engine
        self.heavy = heavy
        self.ramp_s = ramp_s
        self.users = max(0, users)
        self.wake = wake
        self.think_s = think_s
        self.rng = random.Random(seed + 17)
        self.wave_period_s = wave_period_s
        self._n = 0

    def active_users(self, t: float) -> int:
        """Between 60 % and 100 % of the configured users, on a slow wave (or a ramp)."""
        if self.ramp_s:
            return max(1, round(self.users * min(1.0, 0.1 + 0.9 * t / self.ramp_s)))
        frac = 0.8 + 0.2 * math.sin(2 * math.pi * t / self.wave_period_s)
        return max(1, round(self.users * frac)) if self.users else 0

    async def run(self, stop: asyncio.Event) -> None:
        await run_until(stop, [self._user(i, stop) for i in range(self.users)])

    async def _user(self, i: int, stop: asyncio.Event) -> None:
        rng = random.Random(self.rng.random() + i)
        start = self.engine.clock()
        await asyncio.sleep(rng.uniform(0, self.think_s[1]))
        while not stop.is_set():
            messages: list[dict[str, object]] = [{"role": "system", "content": SYSTEM_PROMPT}]
            for _turn in range(rng.randint(2, 8)):
                if i >= self.active_users(self.engine.clock() - start):
                    await asyncio.sleep(2.0)
                    break
                words = rng.randint(1000, 4000) if self.heavy else rng.randint(30, 600)
                messages.append({"role": "user", "content": " ".join(rng.choice(FILLER) for _ in range(words))})
                prompt = chat_tokens(messages)
                room = self.engine.max_len - len(prompt) - 1
                if room < 16:
                    break
                max_tokens = min(room, rng.randint(400, 1200) if self.heavy else rng.randint(80, 450))
                done: asyncio.Future[SimRequest] = asyncio.get_running_loop().create_future()
                self._n += 1
                req = SimRequest(
                    rid=f"demo-{i}-{self._n}",
                    prompt=prompt,
                    max_tokens=max_tokens,
                    target_tokens=self.engine.sample_output_len(max_tokens),
                    arrival=self.engine.clock(),
                    on_finish=partial(_resolve, done),
                    out_seed=rng.randrange(1 << 30),
                )
                self.engine.add(req)
                self.wake.set()
                try:
                    r = await done
                except asyncio.CancelledError:
                    self.engine.abort(req)
                    raise
                messages.append({"role": "assistant", "content": " ".join(r.word(k) for k in range(r.generated))})
                think = (0.0, 0.5) if self.heavy else self.think_s
                await asyncio.sleep(rng.uniform(*think) / self.engine.cfg.speed)


def _resolve(future: asyncio.Future[SimRequest], request: SimRequest) -> None:
    """A finished request resolves its future (once; a cancelled waiter is left alone)."""
    if not future.done():
        future.set_result(request)
