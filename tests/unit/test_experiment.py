"""The experiment driver's rules in virtual time (the simulator's engine under virtual users):
the budget, settling early, draining after a step down, measuring an undecided step on, the
queue rule, stop reasons, progress and the result file. Deterministic for a seed; seconds each.

The rules were tested before by timing live simulators in real time; here they run in the very
loop ``spoc ramp`` runs (:class:`spoc_tui.core.ramp.experiment.Driver`), over the virtual backend.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from spoc_tui.core.hardware.presets import gpu_preset, model_preset
from spoc_tui.core.ramp.experiment import Driver, Experiment, ExperimentError, RampProgress, run_now
from spoc_tui.core.ramp.knee import FixedRates, FixedSpeeds, FixedUsers, KneeSearch
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.results import RampHeader, read_ramp
from spoc_tui.load.ramp import RampConfig, ResultWriter
from spoc_tui.sim.backend import VirtualBackend
from spoc_tui.sim.engine import EngineConfig, SimEngine
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.workload import load_workload

FIXTURE = Path(__file__).parents[1] / "fixtures" / "experiment"


def server(seed: int = 1, seats: int = 16, profile: str = "chatbot", paced: bool = True) -> VirtualServer:
    """The simulated Llama-3.1-8B on one A100-40GB, as a ramp's users see it."""
    cfg = EngineConfig(
        model=model_preset("llama-3.1-8b"),
        gpu=gpu_preset("a100-40gb"),
        served_model_name="t",
        max_num_seqs=seats,
        seed=seed,
    )
    return VirtualServer(SimEngine(cfg), load_workload(profile), 0, seed=seed, ignore_eos=True, paced=paced)


def experiment(plan, sla: str = "ttft_p99<=1s", **kw) -> Experiment:
    """The experiment ``spoc ramp`` would run with these settings (its own defaults applied)."""
    cfg = RampConfig("http://127.0.0.1:1", load_workload("chatbot"), plan, tuple(parse_sla(sla)), Path(), **kw)
    cfg.validate()
    return cfg.experiment()


def drive(exp: Experiment, vs: VirtualServer | None = None, **kw) -> tuple[Driver, VirtualBackend, list[RampProgress]]:
    seen: list[RampProgress] = []
    backend = VirtualBackend(vs or server(), spawn_rate=lambda c: 10.0)
    d = Driver(exp, backend, on_progress=seen.append, **kw)
    run_now(d.run())
    return d, backend, seen


def test_a_listed_ramp_runs_its_levels_in_order_and_says_each_phase():
    d, _, seen = drive(experiment(FixedUsers([4, 8]), sla="ttft_p50<=1s", step_s=30, warmup_s=5, max_step_s=30))
    assert [s.users for s in d.steps] == [4, 8] and d.status == "complete" and d.stop_reason == ""
    phases = [p.phase for p in seen]
    assert phases[0] == "warmup" and phases[-1] == "done"
    assert phases.count("step_done") == 2 and "measuring" in phases
    # a step's window is its step's less the warm-up, on the virtual clock
    assert all(s.duration_s == pytest.approx(25.0, abs=0.5) for s in d.steps)
    assert all(s.requests > 0 and s.decision == "meets" for s in d.steps)
    assert seen[-1].knee is not None and seen[-1].steps == tuple(d.steps)


def test_the_same_seed_gives_the_same_ramp_and_another_seed_another():
    def figures(seed: int) -> list[dict]:
        d, _, _ = drive(experiment(FixedUsers([2, 8]), step_s=30, warmup_s=5), server(seed))
        return [s.as_dict() for s in d.steps]

    assert figures(3) == figures(3)
    assert figures(3) != figures(4)


def test_the_budget_counts_every_second_of_load_and_stops_the_search():
    exp = experiment(KneeSearch(max_users=256), sla="ttft_p99<=300ms", step_s=40, warmup_s=10, budget_s=150)
    d, backend, seen = drive(exp)
    # the load it held (drains, warm-ups and extensions included) stays within the budget
    assert backend.now() <= 150 + 1e-6
    assert len(d.steps) >= 2 and d.status == "complete"
    assert d.stop_reason.startswith("the budget (2.5 min of load) is spent; the knee so far:")
    lefts = [p.budget_left_s for p in seen if p.budget_left_s is not None]
    assert lefts == sorted(lefts, reverse=True) and lefts[-1] < 40


def test_an_undecided_step_is_measured_on_and_a_decided_one_is_not():
    # a limit near 4 users' ITL: its first window cannot decide it, so it is measured on to the limit
    probe, _, _ = drive(experiment(FixedUsers([4]), step_s=20, warmup_s=5, max_step_s=80))
    itl = probe.steps[0].latency.itl.p99
    assert itl is not None
    near = f"itl_p99<={itl * 1.01 * 1000:.1f}ms"
    d, _, seen = drive(experiment(FixedUsers([4]), sla=near, step_s=20, warmup_s=5, max_step_s=80))
    step = d.steps[0]
    assert step.extended_s > 0 and step.duration_s <= 75 + 1e-6
    assert any(p.phase == "extending" and p.message.startswith("inconclusive") for p in seen)
    far, _, _ = drive(experiment(FixedUsers([4]), sla="ttft_p50<=10s", step_s=20, warmup_s=5, max_step_s=80))
    assert far.steps[0].extended_s == 0 and far.steps[0].decision == "meets"


def test_a_step_down_waits_for_the_last_levels_requests_and_counts_only_its_own():
    d, _, _ = drive(experiment(FixedUsers([48, 2]), sla="ttft_p99<=60s", step_s=30, warmup_s=5))
    high, low = d.steps
    assert high.drained_s == 0 and low.drained_s > 0
    # the low step's requests were all sent after the drain: none of the 48 users' backlog
    set_at = 5 + high.duration_s  # (the first step started at 0 on the virtual clock)
    assert low.requests > 0 and min(s.start for s in d.runs[1].window) >= set_at + low.drained_s - 1e-9
    assert low.latency.ttft.p99 is not None and high.latency.ttft.p99 is not None
    assert low.latency.ttft.p99 < high.latency.ttft.p99


def test_a_knee_search_step_ends_once_its_next_level_is_plain():
    # (the doubling's first steps are where it settles: five minutes of load show it)
    exp = experiment(KneeSearch(max_users=256), sla="ttft_p99<=300ms", step_s=40, warmup_s=10, budget_s=300)
    d, _, _ = drive(exp)
    settled = [s for s in d.steps if s.settled_early is not None]
    assert settled, [s.users for s in d.steps]
    assert all(s.duration_s < 30 and s.settled_early.saved_s > 0 for s in settled)
    # without the rule every step runs its window
    d2, _, _ = drive(replace(exp, settle=False))
    assert all(s.settled_early is None for s in d2.steps)


def test_a_listed_ramp_stops_once_a_step_breaks_badly():
    exp = experiment(FixedUsers([2, 64, 128]), sla="ttft_p99<=50ms", step_s=30, warmup_s=5)
    d, _, _ = drive(exp, server(seats=8))
    assert d.status == "stopped_early" and len(d.steps) < 3
    assert d.stop_reason.startswith("step 2 (64 users): ttft_p99 at least") and "(abort factor 3)" in d.stop_reason


def test_a_queue_that_grows_without_bound_ends_the_step_as_a_break():
    vs = server(seats=4, paced=False)
    d, _, _ = drive(experiment(FixedRates([20.0]), sla="ttft_p99<=60s", step_s=120, warmup_s=5), vs)
    (step,) = d.steps
    assert step.verdict.broken_limit == "queue_unbounded" and step.duration_s < 110
    assert step.server.waiting_max is not None and step.server.waiting_max > 10


def test_a_studys_early_stop_ends_the_step_and_the_ramp():
    exp = experiment(FixedUsers([4, 8]), step_s=60, warmup_s=5)
    exp = replace(exp, early_stop=lambda s: "dominated by trial 3" if s.requests >= 10 else None)
    d, _, _ = drive(exp)
    (step,) = d.steps
    assert d.status == "stopped_early" and d.stop_reason == "dominated by trial 3"
    assert step.stopped_early is not None and step.stopped_early.saved_s > 0 and step.duration_s < 55


def test_the_virtual_ramp_is_written_by_the_ramps_writer(tmp_path):
    exp = experiment(FixedUsers([1, 2]), step_s=20, warmup_s=5)
    writer = ResultWriter(tmp_path, RampHeader(model="t", url="virtual", sla=("ttft_p99<=1s",)), requests=False)
    try:
        d = Driver(exp, VirtualBackend(server()), sink=writer)
        run_now(d.run())
    finally:
        writer.close()
    doc = read_ramp(tmp_path)
    assert doc.status == "complete" and len(doc.steps) == 2 and doc.steps == tuple(d.steps)
    assert json.loads((tmp_path / "ramp.json").read_text())["stop_reason"] == ""
    assert not (tmp_path / "requests.jsonl").exists()


class _NoReplay(VirtualBackend):
    """A backend whose replays must not start."""

    started: list[float] = []

    async def start_replay(self, idx: int, speed: float) -> float:
        self.started.append(speed)
        raise AssertionError("no replay should run")


def test_a_replay_longer_than_the_budget_is_refused_before_any_load():
    # (the driver raises its experiment's error type: spoc ramp's RampError, the twin's TwinError)
    exp = experiment(FixedUsers([1]), step_s=30, budget_s=60)
    exp = replace(exp, replay_s=lambda speed: 300 / speed, error=ExperimentError)
    with pytest.raises(ExperimentError, match=r"a replay at x1 takes 5.0 min, more than the budget \(1 min\)"):
        run_now(Driver(exp, _NoReplay()).run())
    assert _NoReplay.started == []


def test_a_replay_longer_than_a_day_is_refused_as_a_step_is():
    """Issue 74: the one-day rule held --step-seconds, not a replay's span over its speed: a
    year's trace at x1, or a minute's at x1e-9, grew a prediction to gigabytes. The first such
    step is refused before any load; one later (a search slowing down) ends the ramp, said."""
    for span, speeds in ((366 * 86_400.0, [1.0]), (60.0, [1e-9])):
        exp = replace(experiment(FixedUsers([1]), step_s=30), plan=FixedSpeeds(speeds), unit="x")
        exp = replace(exp, replay_s=lambda v, span=span: span / v, error=ExperimentError)
        with pytest.raises(ExperimentError, match=r"lasts [\d.e+,]+ days of the trace's time; a step is at most a day"):
            run_now(Driver(exp, _NoReplay()).run())


def test_run_now_refuses_a_coroutine_that_waits():
    class Suspend:
        def __await__(self):
            yield  # what an event loop's future does while it waits

    async def waits() -> None:
        await Suspend()

    with pytest.raises(RuntimeError, match="waited"):
        run_now(waits())


# -- pinned: the predicted ramp's figures for a fixed seed ------------------------------------


def _pinned_predictions() -> dict[str, dict]:
    from spoc_tui.core.ramp.knee import parse_user_plan
    from spoc_tui.twin.predict import Prediction, predict
    from tests.unit.test_twin_fleet import twin

    out = {}
    tw = twin(0.05)
    for name, plan in [("users", parse_user_plan("1,4,16")), ("auto", parse_user_plan("auto:64"))]:
        p = Prediction(
            twin=tw,
            workload=load_workload("chatbot"),
            plan=plan,
            limits=tuple(parse_sla("ttft_p99<=1s,itl_p99<=100ms")),
            step_s=40,
            warmup_s=10,
            draws=1,
            seed=5,
        )
        res = predict(p)
        out[name] = {"steps": [s.as_dict() for s in res.steps], "knee": res.knee.as_dict()}
    return json.loads(json.dumps(out))


def _close(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) | set(b)
        return [d for k in sorted(keys) for d in _close(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items, pinned {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
        return []
    return [] if a == b else [f"{path}: {a!r}, pinned {b!r}"]


def test_the_predicted_ramp_keeps_its_keys_and_figures_for_a_seed():
    """``spoc twin predict``'s steps and knee for a fixed twin and seed, pinned
    (tests/fixtures/experiment/pinned_prediction.json; ``SPOC_REPIN=1`` rewrites it, for a change
    meant to move them, said in the CHANGELOG)."""
    got = _pinned_predictions()
    path = FIXTURE / "pinned_prediction.json"
    if os.environ.get("SPOC_REPIN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert path.exists(), f"{path} is missing: SPOC_REPIN=1 writes it"
    diffs = _close(got, json.loads(path.read_text()))
    assert not diffs, "\n".join(diffs[:20])


def test_a_ramp_and_a_prediction_are_refused_alike_and_a_step_over_a_day_is_a_typo(tmp_path):
    from click.testing import CliRunner

    from spoc_tui.cli.main import cli
    from spoc_tui.load.defaults import rules_error
    from spoc_tui.load.ramp import RampError
    from spoc_tui.twin.model import write_twin
    from tests.unit.test_twin_fit import twin

    cfg = RampConfig(
        url="http://127.0.0.1:1", workload=load_workload("chatbot"), plan=FixedUsers([1]), limits=(), out_dir=tmp_path
    )
    cases = [
        (dict(step_s=1e20), "--step-seconds must be above 0 and at most 86,400 (a day)"),
        (dict(step_s=30.0, warmup_s=30.0), "--warmup-seconds must be at least 0 and shorter than --step-seconds"),
        (dict(max_step_s=10 * 86_400.0), "--max-step-seconds must be at least --step-seconds and at most 86,400"),
        (dict(budget_s=1.0), "--budget must be at least one step"),
        (dict(spawn_rate=5000.0), "--spawn-rate must be above 0 and at most 1000"),
        (  # issue 74: --rate 10000 at a minute's step grew a prediction to 4.9 GB
            dict(plan=FixedRates([1.0, 10_000.0])),
            "--rate 10000 over a step of up to 240 s (--max-step-seconds) is 2,400,000 requests; a step holds "
            "at most 60,000",
        ),
    ]
    for change, says in cases:
        bad = replace(cfg, **change)
        assert (rules_error(bad, trace=False) or "").startswith(says)
        with pytest.raises(RampError, match=says.replace("(", r"\(").replace(")", r"\)")):
            bad.validate()
    path = tmp_path / "twin.json"
    write_twin(twin(), path)
    r = CliRunner().invoke(cli, ["twin", "predict", "--twin", str(path), "--users", "1", "--step-seconds", "1e20"])
    err = r.exception  # spoc's main() prints it as one line and exits with its code
    assert err is not None and getattr(err, "exit_code", None) == 2
    assert str(err) == "--step-seconds must be above 0 and at most 86,400 (a day)"
