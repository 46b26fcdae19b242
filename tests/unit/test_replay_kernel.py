"""The compiled one-replica replay (issue 73: :mod:`spoc_tui.twin.fastreplay`) against the Python
engine it stands for: the same requests, times, counters and polls, to the last bit."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from spoc_tui.core.traces.read import TraceRow
from spoc_tui.twin.fastreplay import ENV
from spoc_tui.twin.fleet import FleetSim
from spoc_tui.twin.model import Twin
from spoc_tui.twin.traffic import synth_rows
from tests.unit.test_headroom import traffic
from tests.unit.test_twin_fit import twin as fitted_twin
from tests.unit.test_twin_fleet import _mixed_rows, rows

ROOT = Path(__file__).resolve().parents[2]


def twin(step_cv: float = 0.05, **server: object) -> Twin:
    """The fit's twin without its shared-context term (a passive twin's: the headroom's)."""
    t = fitted_twin(step_cv)
    return replace(t, fit=replace(t.fit, b_shared=0.0), server=replace(t.server, **server))


def shared_twin(**server: object) -> Twin:
    t = fitted_twin(0.05)
    assert t.fit.b_shared > 0
    return replace(t, server=replace(t.server, **server))


def open_rows(n: int = 300, rate: float = 6.0) -> list[TraceRow]:
    """:func:`rows` without their follow-ups (those replay in Python)."""
    return [replace(r, parent=None) for r in rows(n, rate=rate)]


def played(
    tw: Twin, trace: list[TraceRow], *, poll_s: float | None = 1.0, cut: float | None = None
) -> tuple[object, ...]:
    """Everything a replay's readers read of it, run whole or cut every ``cut`` seconds."""
    sim = FleetSim(tw, trace, replicas=1, poll_s=poll_s)
    sim.start()
    if cut is None:
        sim.run_until(math.inf)
    else:
        t = 0.0
        while not sim.done:
            t += cut
            sim.run_until(t)
    eng = sim.replicas[0].engine
    st = eng.stats
    samples = [
        (s.trace_index, s.start, s.ttft, s.itl, s.e2e, s.end, s.ok, s.output_tokens, s.prompt_tokens, s.cached_tokens,
         s.scheduled, s.conversation, s.cut, s.held_s, s.turn)
        for s in sim.samples
    ]  # fmt: skip
    counters = (st.prefix_hits, st.prefix_queries, st.preemptions, st.generation_tokens, st.iterations, eng.busy_s,
                eng.running_peak, eng.used_blocks)  # fmt: skip
    return (
        samples,
        counters,
        (sim.skipped, sim.too_big, sim.stalled, sim.now, sim.done),
        sim.polls,
        sim._fast is not None,
    )


def both(monkeypatch: pytest.MonkeyPatch, tw: Twin, trace: list[TraceRow], **kw: object) -> tuple[tuple[object, ...], tuple[object, ...]]:  # fmt: skip
    monkeypatch.setenv(ENV, "python")
    python = played(tw, trace, **kw)  # type: ignore[arg-type]
    monkeypatch.delenv(ENV)
    fast = played(tw, trace, **kw)  # type: ignore[arg-type]
    assert fast[-1] and not python[-1], "the compiled engine played one and Python the other"
    return python[:-1], fast[:-1]


def grouped_rows(n: int = 400, groups: int = 40, seed: int = 2) -> list[TraceRow]:
    """Rows in many groups, each group's rows sharing a prefix of its own (a few 16-token blocks):
    a cache too small for them all evicts prefixes that rows then ask for again."""
    import random

    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(10.0)
        g = rng.randrange(groups)
        head = tuple(10_000 + 100 * g + k for k in range(rng.randint(2, 6)))
        ids = head + tuple(1_000_000 + 10 * i + k for k in range(rng.randint(0, 3)))
        out.append(TraceRow(i, t, len(ids) * 16 - rng.randrange(8), rng.randrange(8, 60), ids, 16, line=i + 1))
    return out


CASES = {
    # follow-up turns, each released at its parent's end plus its think time
    "follow-ups": lambda: (twin(num_gpu_blocks=400), rows(400, rate=12.0)),
    # a small KV cache: prefixes served, blocks evicted, requests preempted
    "chat, 400 blocks": lambda: (twin(num_gpu_blocks=400), open_rows(400, rate=12.0)),
    "chat, no jitter": lambda: (twin(0.0, num_gpu_blocks=400), open_rows(400, rate=12.0)),
    # 16- and 512-token blocks: a row's own part starts inside an engine block; some rows outgrow the cache
    "mixed blocks": lambda: (twin(num_gpu_blocks=400), [replace(r, t=r.t / 8) for r in _mixed_rows(400)]),
    # the headroom's rows, naming only their shared blocks, and naming their own too
    "learned traffic": lambda: (twin(num_gpu_blocks=300), synth_rows(traffic(rate=12.0, share=0.6), 60.0, seed=5)),
    "learned, own named": lambda: (
        twin(num_gpu_blocks=300),
        synth_rows(traffic(rate=12.0, share=0.6), 60.0, seed=5, name_own=True),
    ),
    "8 seats, prefill whole": lambda: (
        twin(max_num_seqs=8, enable_chunked_prefill=False, max_num_batched_tokens=4096),
        open_rows(200, rate=10.0),
    ),
    "many prefixes, evicted": lambda: (twin(num_gpu_blocks=160), grouped_rows()),
    # the fit's own twin: its steps' time less the context its decodes share (SharedBlocks)
    "shared context term": lambda: (shared_twin(num_gpu_blocks=400), open_rows(400, rate=12.0)),
    "shared, prefill whole": lambda: (
        shared_twin(max_num_seqs=8, enable_chunked_prefill=False, max_num_batched_tokens=4096),
        grouped_rows(),
    ),
    "no prefix caching": lambda: (twin(enable_prefix_caching=False, num_gpu_blocks=300), open_rows(300, rate=12.0)),
    "small token budget": lambda: (twin(max_num_batched_tokens=256, num_gpu_blocks=500), open_rows(200, rate=8.0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_compiled_replay_is_the_python_replay_to_the_bit(monkeypatch, case):
    tw, trace = CASES[case]()
    python, fast = both(monkeypatch, tw, trace)
    assert fast == python
    samples, counters, _ends, polls = fast
    assert len(samples) >= 0.9 * len(trace) and polls
    if case == "follow-ups":
        assert sum(1 for s in samples if s[13]) >= 10  # turns held for their parent's answer
    if "400 blocks" in case or "learned" in case:
        assert counters[0] > 0 and counters[2] > 0  # the cache served prefixes and preempted
    if "evicted" in case:
        hit_rate = counters[0] / counters[1]
        assert 0.2 < hit_rate < 0.8, hit_rate  # prefixes served, others evicted before asked for again


def test_a_replay_cut_anywhere_is_the_replay_run_whole(monkeypatch):
    """As the driver plays a predicted step (run_until every poll), and as a one-off run plays it."""
    tw, trace = CASES["chat, 400 blocks"]()
    whole = both(monkeypatch, tw, trace)
    for cut in (0.37, 3.0):
        assert both(monkeypatch, tw, trace, cut=cut) == whole
    assert both(monkeypatch, tw, trace, poll_s=None)[1][:2] == whole[1][:2]  # no polls: the same requests


def test_rows_too_long_for_the_context_or_the_cache_are_skipped_alike(monkeypatch):
    small = twin(num_gpu_blocks=3)
    trace = [TraceRow(i, i * 0.5, 30 if i % 2 else 300, 8, line=i + 1) for i in range(20)]
    trace += [TraceRow(20, 11.0, small.server.max_model_len - 2, 5, line=21)]  # the context, before the cache
    python, fast = both(monkeypatch, small, trace)
    assert fast == python
    skipped, too_big, stalled, _now, done = fast[2]
    assert (skipped, too_big, stalled, done) == (11, 10, 0, True)


def test_replays_the_compiled_engine_does_not_play_are_played_in_python(monkeypatch):
    """More than one replica, an autoscaler, or SPOC_REPLAY_ENGINE=python: the Python engine's."""
    from spoc_tui.twin.fleet import Autoscale

    for kw in ({"replicas": 2}, {"autoscale": Autoscale(2.0)}):
        sim = FleetSim(twin(), rows(100), **kw)  # type: ignore[arg-type]
        sim.start()
        assert sim._fast is None
    sim = FleetSim(twin(), rows(100), replicas=1)
    sim.start()
    assert sim._fast is not None
    monkeypatch.setenv(ENV, "python")
    sim = FleetSim(twin(), rows(100), replicas=1)
    sim.start()
    assert sim._fast is None


def test_the_kernel_plays_the_same_as_plain_python_with_its_bounds_checked():
    """The kernel's own code run as Python (numba off: every array index checked) plays the same
    replay as compiled: no read or write past an array's end hides in the machine code."""
    code = (
        "import math, sys; sys.path.insert(0, '.');"
        "from tests.unit.test_replay_kernel import CASES, played;"
        "tw, tr = CASES['chat, 400 blocks'](); print(repr(played(tw, tr[:120])))"
    )
    outs = []
    for off in ("1", "0"):
        env = {**os.environ, "NUMBA_DISABLE_JIT": off}
        env.pop(ENV, None)
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout)
    assert outs[0] == outs[1] and "True)" in outs[0]


def test_a_kernel_numba_cannot_build_leaves_the_replays_to_python(monkeypatch, caplog):
    """Where numba fails to compile the kernel (a machine its compiler cannot serve), the replay
    plays in Python, the same figures, and says so once in the log; the process's later replays
    do not try again."""
    import logging

    from spoc_tui.twin import fastreplay, replaykernel

    tw, trace = CASES["chat, 400 blocks"]()
    python, _ = both(monkeypatch, tw, trace)

    def cannot(*_a: object) -> int:
        raise RuntimeError("Failed in nopython mode pipeline (step: native lowering)\nmore")

    monkeypatch.setattr(replaykernel, "run_until", cannot)
    monkeypatch.setitem(fastreplay._loaded, "kernel", replaykernel)
    with caplog.at_level(logging.WARNING, logger="spoc_tui.twin.fastreplay"):
        got = played(tw, trace)
    assert got[:-1] == python and got[-1] is False
    assert "could not be built (Failed in nopython mode pipeline (step: native lowering))" in caplog.text
    assert fastreplay.kernel() is None
    sim = FleetSim(tw, trace, replicas=1)
    sim.start()
    assert sim._fast is None
