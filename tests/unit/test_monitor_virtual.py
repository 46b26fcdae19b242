"""The verdict ladder on the simulator's scenarios, on the virtual clock (issue 35, then issue 55):
in overload the headline is the queue, a lagging replica is named with its figure, and steady
load does not flicker.

The monitor's own model (:class:`~spoc_tui.core.monitor.model.MonitorModel`) reads the simulator's
``/metrics`` text, parsed and windowed by the live poller's rule, every virtual second
(:class:`~spoc_tui.sim.watch.VirtualWatch`). These ran a live simulator and the whole app in real
time for up to a minute each, beside three other test workers on two cores; what a poll saw then
depended on the host. Here a minute of a scenario takes a second or two, the same every time.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from spoc_tui.core.monitor.model import MonitorModel
from spoc_tui.sim.options import SimOptions
from spoc_tui.sim.run import build_replicas
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.sim.watch import VirtualWatch
from spoc_tui.workload import Workload, load_workload

# The simulator's built-in users (spoc_tui/sim/load.py BuiltinLoad) as profiles: a shared system
# prompt, 2-8 turns of 30-600 words, answers of up to 80-450 tokens (stopping at EOS), thinking
# 1-6 s; heavy (overload): 1,000-4,000 words, 400-1,200 tokens, thinking under half a second.
STEADY = """
name = "demo users"
system_tokens = 400
turns = {dist = "uniform", min = 2, max = 8}
user_tokens = {dist = "uniform", min = 30, max = 600}
output_tokens = {dist = "uniform", min = 80, max = 450}
think_s = {dist = "uniform", min = 1.0, max = 6.0}
"""
HEAVY = """
name = "heavy demo users"
system_tokens = 400
turns = {dist = "uniform", min = 2, max = 8}
user_tokens = {dist = "uniform", min = 1000, max = 4000}
output_tokens = {dist = "uniform", min = 400, max = 1200}
think_s = {dist = "uniform", min = 0.0, max = 0.5}
"""

Seen = list[list[tuple[str, str, str, tuple[str, ...]]]]


def profile(tmp_path, text: str) -> Workload:
    path = tmp_path / "users.toml"
    path.write_text(text)
    return load_workload(str(path))


def watch(
    opts: SimOptions,
    workload: Workload,
    seconds: float,
    until: Callable[[list[tuple[str, str, str, tuple[str, ...]]]], bool],
    users: Callable[[float], int] | None = None,
) -> Seen:
    """The scenario's replicas with their background users on the virtual clock and the monitor
    on them (a poll a second, a 10 s window, as the live test ran it) until ``until(verdicts)``
    holds or ``seconds`` pass; returns every poll's verdicts [(source, word, reason, causes)].
    ``users(t)``: the users of each replica at virtual time t (None: as built)."""
    replicas = build_replicas(opts)
    servers = [VirtualServer(e, workload, n, seed=opts.seed + i, paced=True) for i, (e, n) in enumerate(replicas)]
    names = [f"http://127.0.0.1:{8000 + i}" for i in range(len(servers))]
    w = VirtualWatch(servers, window_s=10.0, interval_s=1.0, names=names)
    model = MonitorModel(10.0, vllm_urls=names, clock=lambda: w.now)

    def before(t: float) -> None:
        if users is not None:
            for s in servers:
                s.set_users(users(t))

    seen: Seen = []
    for tick in w.run(seconds, before):
        model.servers(tick)
        v = [(src, x.word, x.reason, tuple(x.causes)) for src, x in model.verdicts]
        seen.append(v)
        if until(v):
            break
    return seen


def test_in_overload_the_growing_queue_is_the_headline(tmp_path):
    """``spoc sim --scenario overload --max-num-seqs 8 --load-users 96``: its users grow from 10 %
    to all of them over 90 s (the built-in load's ramp), so the queue keeps growing."""
    opts = SimOptions(scenario="overload", gpu="a100-40gb", max_num_seqs=8, load_users=96, dcgm_port=None)
    seen = watch(
        opts,
        profile(tmp_path, HEAVY),
        60,
        lambda v: bool(v) and v[0][1].startswith("shedding load"),
        users=lambda t: max(1, round(96 * min(1.0, 0.1 + 0.9 * t / 90))),
    )
    _src, word, reason, _causes = seen[-1][0]
    assert word.startswith("shedding load") and "waiting over the last" in reason, seen[-6:]
    assert len(seen) < 60, "the queue was the headline within the minute"


def test_the_lagging_replica_is_named_with_its_figure(tmp_path):
    """``spoc sim --scenario fleet --load-users 96``: three replicas, the last on slower GPUs."""
    opts = SimOptions(scenario="fleet", load_users=96, dcgm_port=None)

    def lagging(v) -> list:
        return [(s, w, r, cs) for s, w, r, cs in v if "lagging" in w or any(c.startswith("lagging") for c in cs)]

    seen = watch(opts, profile(tmp_path, STEADY), 60, lambda v: bool(lagging(v)))
    found = lagging(seen[-1])
    assert found, seen[-1]
    src, word, reason, causes = found[0]
    assert src.endswith(":8002"), found  # the last replica: the slow one
    text = reason if "lagging" in word else next(c for c in causes if c.startswith("lagging"))
    assert "vs its peers' median" in text and "ms" in text


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steady_load_does_not_flicker(tmp_path, seed):
    """``spoc sim --scenario steady --load-users 8`` for a minute: at most one settled change of
    verdict, never back and forth within three polls."""
    seen = watch(SimOptions(scenario="steady", load_users=8, dcgm_port=None, seed=seed), profile(tmp_path, STEADY), 60,
                 lambda v: False)  # fmt: skip
    words = [v[0][1] for v in seen[5:] if v]  # after the first polls (the window fills)
    assert len(words) == 55
    changes = sum(1 for a, b in zip(words, words[1:], strict=False) if a != b)
    assert changes <= 1, words
    for a, b, c in zip(words, words[1:], words[2:], strict=False):
        assert not (a == c != b), words
