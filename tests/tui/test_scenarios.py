"""The verdict ladder on the simulator's scenarios, headless, with the real collectors (issue 35):
in overload the headline is the queue, a lagging replica is named with its figure, and steady
load does not flicker."""

import asyncio

from spoc_tui.config import Settings
from spoc_tui.procs.ports import free_ports
from spoc_tui.sim.process import start_sim
from spoc_tui.tui.app import SpocApp


async def watch(args: list[str], seconds: float, until, replicas: int = 1):
    """Run the simulator with ``args`` and the monitor on it until ``until(verdicts)`` holds or
    ``seconds`` pass; returns every poll's verdicts [(source, word, reason, causes)]."""
    port, dport = free_ports(2)
    if replicas > 1:
        from spoc_tui.procs.ports import free_block

        port, dport = free_block(replicas), free_block(replicas)
    proc = start_sim([*args, "--dcgm-port", str(dport)], port)
    seen = []
    try:
        s = Settings(
            vllm_urls=[f"http://127.0.0.1:{port + i}" for i in range(replicas)],
            dcgm_urls=[f"http://127.0.0.1:{dport + i}/metrics" for i in range(replicas)],
            nvml=False,
            interval=1.0,
            window=10.0,
        )
        app = SpocApp(s)
        async with app.run_test(size=(120, 40)):
            for _ in range(int(seconds)):
                await asyncio.sleep(1.0)
                v = [(src, x.word, x.reason, x.causes, x.since) for src, x in app.monitor.model.verdicts]
                seen.append(v)
                if until(v):
                    break
    finally:
        proc.stop()
    return seen


async def test_in_overload_the_growing_queue_is_the_headline():
    seen = await watch(
        ["--scenario", "overload", "--gpu", "a100-40gb", "--max-num-seqs", "8", "--load-users", "96"],
        60,
        lambda v: bool(v) and v[0][1].startswith("shedding load"),
    )
    _src, word, reason, _causes, _ = seen[-1][0]
    assert word.startswith("shedding load") and "waiting over the last" in reason, seen[-6:]


async def test_the_lagging_replica_is_named_with_its_figure():
    seen = await watch(
        ["--scenario", "fleet", "--load-users", "96"],
        60,
        lambda v: any("lagging" in w or any(c.startswith("lagging") for c in cs) for _, w, _, cs, _ in v),
        replicas=3,
    )
    last = seen[-1]
    lagging = [(s, w, r, cs) for s, w, r, cs, _ in last if "lagging" in w or any(c.startswith("lagging") for c in cs)]
    assert lagging, last
    _src, word, reason, causes = lagging[0]
    text = reason if "lagging" in word else next(c for c in causes if c.startswith("lagging"))
    assert "vs its peers' median" in text and "ms" in text


async def test_steady_load_does_not_flicker():
    seen = await watch(["--scenario", "steady", "--load-users", "8"], 25, lambda v: False)
    words = [v[0][1] for v in seen[5:] if v]  # after the first polls (the window fills)
    changes = sum(1 for a, b in zip(words, words[1:], strict=False) if a != b)
    assert changes <= 1, words  # at most one settled change, never back and forth within 3 polls
    for a, b, c in zip(words, words[1:], words[2:], strict=False):
        assert not (a == c != b), words
