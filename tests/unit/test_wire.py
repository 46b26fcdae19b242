"""The ramp <-> Locust runner messages (spoc_tui/load/wire.py): one definition, both sides."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from spoc_tui.core.ramp.knee import FixedUsers
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import RequestSample
from spoc_tui.load import wire
from spoc_tui.load.ramp import RampConfig, spawn_rate
from spoc_tui.workload import load_workload


@pytest.mark.parametrize(
    "msg",
    [
        wire.SetUsers(8, 2, 4.0),
        wire.Stop(),
    ],
)
def test_commands_round_trip(msg):
    assert wire.decode_command(wire.encode(msg)) == msg


@pytest.mark.parametrize(
    "msg",
    [
        wire.Ready(2),
        wire.Ready(0, "exact: the server's /tokenize"),
        wire.UsersSet(8, 2),
        wire.RunnerFailed("only 1 of 2 workers joined"),
        wire.Stopped(),
        wire.Health(1.5, 0.25, (0.1, 2.0), "worker w1"),
        wire.Health(1.5, 0.25, (), "main", stale=3),
        wire.Sample(
            RequestSample(1.0, 2, 8, True, 0.05, 1.2, (0.01, 0.002), 30, 100, 64, None, "c-1", 1, "chatcmpl-x", 2.2)
        ),
    ],
)
def test_events_round_trip(msg):
    assert wire.decode_event(wire.encode(msg)) == msg


def test_the_wire_format_is_what_the_runner_speaks():
    assert (
        wire.encode(wire.SetUsers(8, 2, 4.0)) == '{"cmd":"users","n":8,"step":2,"spawn_rate":4.0,"arrival_rate":null}'
    )
    assert wire.decode_command(b'{"cmd": "users", "n": 8, "step": 2}') == wire.SetUsers(8, 2, 0.0)
    open_loop = wire.SetUsers(2, 3, 0.0, rate=2.5)
    assert wire.decode_command(wire.encode(open_loop)) == open_loop


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        "[1]",
        '{"cmd": "dance"}',
        '{"cmd": "users", "n": "x"}',
        '{"cmd": "users", "n": 1, "spawn_rate": -1}',
        '{"cmd": "users", "n": 1, "arrival_rate": 0}',
        '{"cmd": "users", "n": 1, "arrival_rate": "fast"}',
    ],
)
def test_bad_commands_are_refused(line):
    with pytest.raises(wire.WireError):
        wire.decode_command(line)


def test_samples_carry_gaps_in_whole_microseconds():
    sample = RequestSample(1.0, 2, 8, True, 0.05, 1.2, (0.0123456789, 0.002), 30, 100, 64, None, "c-1", 1, None, 2.2)
    line = wire.encode(wire.Sample(sample))
    assert '"itl_us":[12346,2000]' in line and '"itl":' not in line
    back = wire.decode_event(line)
    assert isinstance(back, wire.Sample)
    assert back.sample.itl == (0.012346, 0.002)
    # a line from an older runner (float seconds) still reads
    assert wire.decode_event(line.replace('"itl_us":[12346,2000]', '"itl":[0.5]')).sample.itl == (0.5,)  # type: ignore[union-attr]
    with pytest.raises(wire.WireError, match="itl_us"):
        wire.decode_event(line.replace("[12346,2000]", "[1.5]"))


def test_exited_is_never_sent():
    with pytest.raises(wire.WireError):
        wire.encode(wire.Exited())


def test_spawn_rate_fits_the_warm_up():
    cfg = RampConfig(
        "http://x", load_workload("chatbot"), FixedUsers([1]), parse_sla("ttft_p99<=1s"), Path("o"), warmup_s=10
    )
    assert spawn_rate(cfg, 40) == 8.0  # 40 users within the first 5 s
    assert spawn_rate(cfg, 5000) == 100.0  # never above Locust's advised maximum
    assert spawn_rate(cfg, -2) == 1.0
    cfg = replace(cfg, spawn_rate=3.0)
    assert spawn_rate(cfg, 40) == 3.0


def test_the_load_generators_command_line_never_holds_a_password():
    """One builder for a ramp's master, its workers and spoc load-worker: the URL on the command
    line (which ps shows every user) is redacted; the real one goes by environment."""
    from spoc_tui.load.ramp import runner_argv, runner_env

    argv = runner_argv("http://u:pw@gpu-host:8000/v1", "m", Path("w.json"), 3, "--worker")
    assert "pw" not in " ".join(argv) and "http://***@gpu-host:8000" in argv
    assert argv[-1] == "--worker" and argv[argv.index("--seed") + 1] == "3"
    assert runner_env("http://u:pw@gpu-host:8000")["SPOC_RUNNER_URL"] == "http://u:pw@gpu-host:8000"


@pytest.mark.parametrize("stale", ['"3"', "-1", "true", "1.5"])
def test_a_health_report_counts_stale_requests_in_whole_numbers(stale):
    line = f'{{"type": "health", "t": 1.0, "cpu_s": 0.1, "lags_ms": [], "stale": {stale}}}'
    with pytest.raises(wire.WireError, match="stale"):
        wire.decode_event(line)
    # a report without it (an older runner's) reads as none in flight
    assert wire.decode_event('{"type": "health", "t": 1.0, "cpu_s": 0.1, "lags_ms": []}').stale == 0  # type: ignore[union-attr]


def test_a_step_down_waits_for_the_last_levels_requests(tmp_path):
    """spoc ramp's drain: after a step down it waits until every load-generator process has
    reported, after the command, no request in flight from an earlier step; it says what it
    waits for, and it gives up at the step's limit or when nothing reports at all."""
    import asyncio

    from spoc_tui.core.ramp.sla import parse_sla
    from spoc_tui.load import ramp
    from spoc_tui.workload import load_workload

    cfg = ramp.RampConfig(
        "http://127.0.0.1:1",
        load_workload("chatbot"),
        FixedUsers([8, 2]),
        tuple(parse_sla("ttft_p99<=1s")),
        tmp_path,
        step_s=2.0,
        warmup_s=0.5,
        max_step_s=3.0,
    )
    notes: list[str] = []

    def report(phase, idx, level, steps, n, note):
        notes.append(note)

    async def scenario(reports: list[tuple[float, str, int]]) -> float:
        """The drain in virtual time: each report lands at its second after the command, each
        of the drain's waits moves the clock on (a real-time run missed the 0.5 s a stale count
        stood on a loaded host)."""
        now = [1_000.0]
        t0 = now[0]
        health = [wire.Health(t0 - 0.5, 0.0, (), "main", 5)]  # before the command: the process is known
        due = sorted(reports)

        async def sleep(s: float) -> None:
            now[0] += s
            while due and t0 + due[0][0] <= now[0]:
                after, proc, stale = due.pop(0)
                health.append(wire.Health(t0 + after, 0.0, (), proc, stale))

        pump: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # the load generator, alive
        end = await ramp._drain(cfg.step_limit_s, health, lambda note: report("warmup", 2, 2, [], 0, note), pump,
                                clock=lambda: now[0], sleep=sleep)  # fmt: skip
        return end - t0

    # 3 stale at 1.6 s (after the command reached it), none at 2.1 s: it ends at its next look
    took = asyncio.run(scenario([(0.2, "main", 5), (1.6, "main", 3), (2.1, "main", 0)]))
    assert took == 2.5
    assert "waiting for 3 requests of the last level to end" in notes
    # they never end: it gives up at the step's limit (3 s)
    took = asyncio.run(scenario([(1.6, "main", 2), (2.5, "main", 2)]))
    assert took == 3.0
