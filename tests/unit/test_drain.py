"""A step's window is the requests sent inside it, each followed to its end (issue #31: counting
the requests that *ended* in a window dropped the slow tail a p99 is about, and knees came out high)."""

import asyncio

from spoc_tui.core.presets import gpu_preset, model_preset
from spoc_tui.core.steps import RequestSample, sent_within
from spoc_tui.load import wire
from spoc_tui.load.ramp import _drain
from spoc_tui.load.workload import load_workload
from spoc_tui.sim.engine import EngineConfig, SimEngine
from spoc_tui.sim.virtual import VirtualServer


def _req(start: float, end: float | None) -> RequestSample:
    return RequestSample(
        start=start, step=1, users=4, ok=True, ttft=0.1, e2e=None if end is None else end - start, end=end
    )


def test_the_window_holds_what_was_sent_in_it_and_has_ended():
    samples = [_req(9.0, 10.5), _req(10.0, 12.0), _req(19.0, 26.0), _req(20.5, 21.0), _req(15.0, None)]
    # sent before the window (ended inside it), sent inside (one ending after it), sent after it
    assert [s.start for s in sent_within(samples, 10.0, 20.0)] == [10.0, 19.0]


def test_drain_waits_for_every_process_to_have_nothing_older_than_the_window_in_flight():
    async def main() -> tuple[float, float]:
        health: list[wire.Health] = [wire.Health(99.0, 1.0, (), "main", 98.0), wire.Health(99.5, 1.0, (), "w1", None)]
        pump = asyncio.create_task(asyncio.sleep(60))
        end = 100.0

        async def reports() -> None:
            await asyncio.sleep(0.3)
            health.append(wire.Health(100.5, 1.0, (), "main", 99.0))  # still answering a window request
            await asyncio.sleep(0.3)
            health.append(wire.Health(101.0, 1.0, (), "main", 100.6))  # only later requests now
            await asyncio.sleep(0.3)
            health.append(wire.Health(101.2, 1.0, (), "w1", None))

        feeder = asyncio.create_task(reports())
        took = await _drain(end, health, pump, 10.0)
        capped = await _drain(200.0, [wire.Health(199.0, 1.0, (), "main", 150.0)], pump, 0.5)
        await feeder
        pump.cancel()
        return took, capped

    took, capped = asyncio.run(main())
    assert 0.8 <= took < 3.0  # after both processes reported again with nothing from before the end
    assert 0.5 <= capped < 1.5  # never longer than it may


def _server(seed: int) -> VirtualServer:
    cfg = EngineConfig(
        model=model_preset("llama-3.1-8b"),
        gpu=gpu_preset("a100-40gb"),
        max_num_seqs=16,
        seed=seed,
        served_model_name="t",
    )
    return VirtualServer(SimEngine(cfg), load_workload("logs"), 8, seed=seed, spread_s=5.0)


def test_the_virtual_server_drains_as_the_ramp_does():
    for seed in (1, 2):
        vs = _server(seed)
        vs.advance(90.0)
        vs.set_users(12)
        vs.advance(130.0)
        open_at_close = [t for t in vs._in_flight.values() if t >= 100.0]
        assert open_at_close  # long logs prompts: some of the window's requests are unanswered at its close
        took = vs.drain(130.0, 60.0)
        assert 0 < took <= 60.0
        if took < 60.0:  # not cut short: nothing sent by the window's end is still unanswered
            assert not any(t <= 130.0 for t in vs._in_flight.values())
        window = vs.sent(100.0, 130.0)
        assert all(100.0 <= s.start <= 130.0 and s.end is not None for s in window)
        # the window's requests unanswered at its close are in it now, and they were the slow ones
        late = [s for s in window if s.end is not None and s.end > 130.0]
        assert len(late) >= len(open_at_close) - sum(1 for t in vs._in_flight.values() if t <= 130.0)
        assert min(s.e2e or 0.0 for s in late) > 0
