"""Tuning studies end to end on the simulated engine in virtual time (FastSimEvaluator).

The evaluator is the real simulator driven without sockets or sleeping, so these tests run the
real Optuna NSGA-II sampler, storage, seeding, duplicate detection and resume in seconds.
"""

import json
from pathlib import Path

import optuna
import pytest

from spoc_tui.core.ramp.knee import FixedUsers, SaturationSearch
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.redact import redact_argv, redact_url
from spoc_tui.core.tuning.space import load_space, parse_objectives, parse_space
from spoc_tui.load.ramp import RampConfig
from spoc_tui.tune import events
from spoc_tui.tune.evaluate import FastSimEvaluator
from spoc_tui.tune.study import StudyState, TuneConfig, TuneError, TuneSession, open_storage
from spoc_tui.workload import load_workload

SPACE = """
[fixed]
max-model-len = 8192

[flags.max-num-seqs]
pow2 = [8, 128]
default = 128

[flags.max-num-batched-tokens]
choices = [512, 2048, 8192]
default = 2048

[flags.enable-chunked-prefill]
choices = [true, false]
default = true
"""

LIMITS = parse_sla("ttft_p99<=30s,itl_p99<=400ms")


def make(tmp_path, trials=6, seed=3, space=SPACE, **kw):
    sp = parse_space(space, "test-space.toml")
    ramp = RampConfig("", load_workload("coding"), FixedUsers([24]), LIMITS, Path(), step_s=30, warmup_s=8, seed=0)
    ev = FastSimEvaluator(ramp, fixed=sp.fixed)
    cfg = TuneConfig(
        sp, parse_objectives("max:out_tok_s,min:itl_p99"), LIMITS, trials, tmp_path, population=4, seed=seed, **kw
    )
    seen: list[events.TuneEvent] = []
    return TuneSession(cfg, ev, seen.append), seen


def test_study_runs_records_and_finds_a_front(tmp_path):
    s, evs = make(tmp_path, rerun_share=0)
    summary = s.run()
    assert summary.status == "complete"
    ran = [r for r in summary.records if r.repeat_of is None]
    assert len(ran) == 6
    keys = [s.cfg.space.key(r.config) for r in ran]
    assert len(set(keys)) == len(keys), "a configuration ran twice"
    # seeded first: the server's defaults, then max-num-seqs from the KV cache (or a note that it was tried)
    assert ran[0].config == s.cfg.space.defaults()
    assert any(isinstance(e, events.Note) and "KV cache" in e.message for e in evs)
    # 512 batched tokens without chunked prefill cannot start (max-model-len 8192): infeasible, not fatal
    bad = [r for r in ran if r.status == "infeasible"]
    for r in bad:
        assert not r.config["enable-chunked-prefill"] and r.config["max-num-batched-tokens"] < 8192
        assert "smaller than max_model_len" in r.reason
    lines = [json.loads(x) for x in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert [x["number"] for x in lines] == [r.number for r in ran]
    doc = json.loads((tmp_path / "pareto.json").read_text())
    assert doc["trials_run"] == 6 and doc["pareto"]
    assert doc["hypervolume"] == pytest.approx(summary.front.hypervolume) and doc["hypervolume"] > 0
    front = {p["number"] for p in doc["pareto"]}
    # no feasible trial dominates a Pareto one
    for p in doc["pareto"]:
        for r in ran:
            if r.feasible and r.number not in front:
                o = r.objectives
                assert not (
                    o["out_tok_s"] >= p["objectives"]["out_tok_s"]
                    and o["itl_p99"] <= p["objectives"]["itl_p99"]
                    and (o["out_tok_s"] > p["objectives"]["out_tok_s"] or o["itl_p99"] < p["objectives"]["itl_p99"])
                )
    assert all(p["command"].startswith("--max-model-len 8192") for p in doc["pareto"])
    # the study is a plain Optuna study: constraints stored, dashboard-readable
    st = optuna.load_study(study_name="spoc", storage=f"sqlite:///{tmp_path / 'study.db'}")
    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all(any(k.startswith("constraints:") for k in t.system_attrs) for t in done)
    assert sum(isinstance(e, events.TrialDone) for e in evs) == 6


def test_same_seed_same_study(tmp_path):
    a, _ = make(tmp_path / "a", trials=5, seed=11)
    b, _ = make(tmp_path / "b", trials=5, seed=11)
    ra, rb = a.run().records, b.run().records
    assert [r.config for r in ra] == [r.config for r in rb]
    assert [r.objectives for r in ra] == [r.objectives for r in rb]


def test_resume_continues_and_refuses_mistakes(tmp_path):
    s, _ = make(tmp_path, trials=3, rerun_share=0)
    s.run()
    again, _ = make(tmp_path, trials=5, rerun_share=0)
    with pytest.raises(TuneError, match="already exists.*--resume"):
        again.open()
    resumed, evs = make(tmp_path, trials=5, resume=True, rerun_share=0)
    summary = resumed.run()
    assert isinstance(evs[0], events.StudyOpened) and len(evs[0].records) == 3
    ran = [r for r in summary.records if r.repeat_of is None]
    assert len(ran) == 5 and len({resumed.cfg.space.key(r.config) for r in ran}) == 5
    assert len((tmp_path / "trials.jsonl").read_text().splitlines()) == 5
    other, _ = make(tmp_path, trials=5, resume=True, study_name="nope")
    with pytest.raises(TuneError, match="no study 'nope'.*studies there: spoc"):
        other.open()
    wrong, _ = make(tmp_path, trials=5, resume=True)
    wrong.cfg.objectives = parse_objectives("out_tok_s,ttft_p99")
    with pytest.raises(TuneError, match="optimises max:out_tok_s, min:itl_p99"):
        wrong.open()


def test_crashed_trial_runs_again_on_resume(tmp_path):
    s, _ = make(tmp_path, trials=2)
    s.run()
    st = s.study
    t = st.ask()  # a trial this host started, whose process died (a crash)
    t.suggest_categorical("max-num-seqs", [8, 16, 32, 64, 128])
    import socket

    t.set_user_attr("worker", f"{socket.gethostname()}:999999999")
    waiting = [x.number for x in st.get_trials(states=(optuna.trial.TrialState.WAITING,))]
    resumed, evs = make(tmp_path, trials=3, resume=True)
    resumed.open()
    assert any(isinstance(e, events.Note) and "interrupted by a crash" in e.message for e in evs)
    assert st.trials[t.number].state == optuna.trial.TrialState.FAIL
    resumed.run()
    assert resumed.counted() == 3
    # the configuration the crash cut short ran first, before the first generation queued before it
    again = [x for x in st.get_trials() if str(x.user_attrs.get("seeded", "")).startswith("re-run of interrupted")]
    assert again and again[0].user_attrs.get("status") in ("ok", "infeasible"), again
    assert waiting and all(st.trials[n].state == optuna.trial.TrialState.WAITING for n in waiting)


def test_a_resumed_study_remembers_the_max_model_len_its_servers_reported(tmp_path):
    sp = load_space(None)  # the built-in space: its max-model-len condition waits for a server
    assert sp.pending
    ramp = RampConfig("", load_workload("coding"), FixedUsers([24]), LIMITS, Path(), step_s=30, warmup_s=8, seed=0)
    objectives = parse_objectives("max:out_tok_s,min:itl_p99")
    cfg = TuneConfig(sp, objectives, LIMITS, 1, tmp_path, population=4, seed=3, rerun_share=0)
    TuneSession(cfg, FastSimEvaluator(ramp, fixed=sp.fixed), lambda e: None).run()
    sp2 = load_space(None)
    seen: list[events.TuneEvent] = []
    cfg2 = TuneConfig(sp2, objectives, LIMITS, 2, tmp_path, population=4, seed=3, rerun_share=0, resume=True)
    TuneSession(cfg2, FastSimEvaluator(ramp, fixed=sp2.fixed), seen.append).open()
    assert not sp2.pending and "max-model-len" in sp2.known
    assert any(isinstance(e, events.Note) and "the study's servers reported max-model-len" in e.message for e in seen)


def test_exhausted_space_stops(tmp_path):
    tiny = "[flags.max-num-seqs]\nchoices = [16, 32]\ndefault = 32\n"
    s, _ = make(tmp_path, trials=5, space=tiny, max_skips=30)
    summary = s.run()
    assert summary.status == "exhausted" and len(summary.records) == 2 and "exhausted" in summary.message


def test_repeats_of_the_pareto_set(tmp_path):
    s, _ = make(tmp_path, trials=3, repeats=2)
    summary = s.run()
    assert summary.repeats and all(len(v) == 2 for v in summary.repeats.values())
    doc = json.loads((tmp_path / "pareto.json").read_text())
    repeated = [p for p in doc["pareto"] if "repeats" in p]
    assert repeated and all(len(p["repeats"]) == 2 and p["runs"] >= 3 for p in repeated)
    lines = [json.loads(x) for x in (tmp_path / "trials.jsonl").read_text().splitlines()]
    extra = [x for x in lines if x["extra"]]
    assert len(extra) == 2 * len(summary.repeats) and all(x["repeat_of"] is not None for x in extra)
    assert doc["trials_run"] == 3  # --repeat-pareto runs are outside the budget


def test_reruns_are_pooled_within_the_budget_and_hidden_from_the_sampler(tmp_path):
    s, _ = make(tmp_path, trials=9, seed=5, rerun_share=0.25)
    summary = s.run()
    reruns = [r for r in summary.records if r.repeat_of is not None]
    assert reruns, "no configuration was re-run"
    assert len(summary.records) == 9  # re-runs count towards --trials
    assert len(reruns) <= int(0.25 * 9) + 1
    by_number = {r.number: r for r in summary.records}
    for r in reruns:
        assert r.config == by_number[r.repeat_of].config and r.repeat_of < r.number
    st = s.study
    for r in reruns:  # told as pruned: NSGA-II's populations never see a configuration twice
        assert st.trials[r.number].state == optuna.trial.TrialState.PRUNED
    doc = json.loads((tmp_path / "pareto.json").read_text())
    assert doc["trials_run"] == 9 and doc["reruns"] == len(reruns)
    # the re-runs measured the run-to-run noise (an upper bound; the simulator's fast mode has none)
    assert set(doc["run_to_run_cv"]) == {"out_tok_s", "itl_p99"} and all(v >= 0 for v in doc["run_to_run_cv"].values())
    assert all(p["status"] in ("confirmed", "provisional") for p in doc["pareto"])
    pooled = [p for p in doc["pareto"] + doc["candidates"] if p["runs"] > 1]
    for p in pooled:
        assert sorted(p["trials"]) == sorted([p["number"], *[r.number for r in reruns if r.repeat_of == p["number"]]])
        for name, (lo, hi) in p["ci95"].items():
            assert lo <= p["objectives"][name] <= hi
    # a resumed study reads its re-runs back as re-runs
    again, _ = make(tmp_path, trials=9, seed=5, resume=True)
    again.open()
    assert {r.number for r in again.records if r.repeat_of is not None} == {r.number for r in reruns}
    assert again.counted() == 9


def test_journal_storage_and_storage_errors(tmp_path):
    s, _ = make(tmp_path, trials=2, storage=f"journal:{tmp_path / 'study.journal'}")
    assert s.run().status == "complete"
    assert (tmp_path / "study.journal").stat().st_size > 0
    with pytest.raises(TuneError, match="expected sqlite"):
        open_storage("redis://x", tmp_path)
    with pytest.raises(TuneError, match=r"postgresql://\*\*\*@.*(driver|cannot open)"):
        open_storage("postgresql://u:hunter2@127.0.0.1:1/db", tmp_path)


def test_secrets_are_redacted():
    assert redact_url("postgresql://me:s3cret@db/x") == "postgresql://***@db/x"
    # the study uses the one redactor: a secret flag it did not list, and a URL's password in any flag
    argv = ["vllm", "serve", "--secret-key", "S3CR3T", "--download-dir", "http://u:pw@h/x", "--max-num-batched-tokens"]
    assert redact_argv([*argv, "4096"]) == [
        "vllm",
        "serve",
        "--secret-key",
        "***",
        "--download-dir",
        "http://***@h/x",
        "--max-num-batched-tokens",
        "4096",
    ]
    assert redact_argv(["vllm", "serve", "--api-key", "sk-1", "--hf-token=hf_x", "--port", "1"]) == [
        "vllm",
        "serve",
        "--api-key",
        "***",
        "--hf-token=***",
        "--port",
        "1",
    ]


def test_users_auto_calibrates_the_reference_load_on_the_first_trial(tmp_path):
    sp = parse_space(SPACE, "test-space.toml")
    ramp = RampConfig("", load_workload("coding"), SaturationSearch(128), LIMITS, Path(), step_s=30, warmup_s=8, seed=0)
    cfg = TuneConfig(
        sp, parse_objectives("max:out_tok_s,min:itl_p99"), LIMITS, 4, tmp_path, population=4, seed=3, rerun_share=0
    )
    seen: list[events.TuneEvent] = []
    s = TuneSession(cfg, FastSimEvaluator(ramp, fixed=sp.fixed), seen.append)
    summary = s.run()
    first, *rest = [r for r in summary.records if r.status == "ok"]
    ref = s.state.ref_users
    assert ref is not None and ref > 2  # doubled past light load
    # the study's decision is its own state: the configuration and the evaluator are as built
    assert s.cfg.ref_users is None and s.evaluator.ramp.plan == SaturationSearch(128)
    # the calibration trial is scored at the load it found
    assert first.reference is not None and first.reference.users == ref
    note = next(e.message for e in seen if isinstance(e, events.Note) and e.message.startswith("calibration"))
    assert f"measured at {ref} users" in note
    assert all(r.reference is not None and r.reference.users == ref for r in rest)
    assert s.study.user_attrs["reference_users"] == ref
    again = TuneSession(
        TuneConfig(sp, cfg.objectives, LIMITS, 5, tmp_path, population=4, seed=3, resume=True),
        FastSimEvaluator(
            RampConfig("", load_workload("coding"), SaturationSearch(128), LIMITS, Path()), fixed=sp.fixed
        ),
    )
    again.open()
    assert again.state.ref_users == ref and again.state.plan == FixedUsers([ref])
    assert again.state.trial(None).plan == FixedUsers([ref])  # what each resumed trial is handed


def test_early_stop_is_not_asked_during_the_calibration(tmp_path):
    """A calibrating trial has no user counts yet (``--users auto``): its steps are never judged
    against the front, even when other workers' trials already made one."""
    s, _ = make(tmp_path, trials=3, rerun_share=0)
    s.run()
    assert s._front is not None and s._front.members
    s.state = StudyState(SaturationSearch(128))  # as --users auto before the reference load is known
    from spoc_tui.core.ramp.steps import summarize_step

    assert s._dominated(summarize_step(1, 2, [], 10.0, LIMITS)) is None  # was an IndexError


def test_no_secret_of_the_launch_command_reaches_any_file_of_the_study(tmp_path):
    template = "vllm serve m --port {port} {flags} --secret-key S3CR3T --download-dir http://u:pw@h/x".split()
    s, _ = make(tmp_path, trials=3, rerun_share=0, template=template)
    s.run()
    doc = json.loads((tmp_path / "pareto.json").read_text())
    assert "--secret-key '***'" in doc["pareto"][0]["command"] or "--secret-key ***" in doc["pareto"][0]["command"]
    for f in tmp_path.rglob("*"):
        if f.is_file():
            blob = f.read_bytes()
            assert b"S3CR3T" not in blob and b"u:pw@" not in blob, f


def test_an_interrupted_ramp_that_does_not_stop_is_left_with_where_it_waits(capsys):
    """After Ctrl-C a study waits for the cancelled ramp's clean-up, but not for ever: one that
    hangs is named with where its tasks wait, and the interrupt goes on."""
    import asyncio

    from spoc_tui.tune.evaluate import stop_within

    async def hangs_in_its_cleanup() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.Event().wait()  # a clean-up that never ends

    async def cleans_up() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)

    loop = asyncio.new_event_loop()
    try:
        for coro, hangs in ((cleans_up(), False), (hangs_in_its_cleanup(), True)):
            task = loop.create_task(coro)
            loop.run_until_complete(asyncio.sleep(0))
            task.cancel()
            stop_within(loop, task, 0.2)
            err = capsys.readouterr().err
            assert task.done() is not hangs
            if hangs:
                assert "did not stop within 0 s of the interrupt" in err and "hangs_in_its_cleanup" in err, err
                task.cancel()  # let it go for the loop's close
                loop.run_until_complete(asyncio.wait({task}, timeout=1))
            else:
                assert err == ""
    finally:
        loop.close()


def test_ctrl_c_cancels_the_ramp_from_inside_its_loop_and_bounds_the_clean_up(capsys):
    """Ctrl-C during a study's ramp is a cancel the loop runs between its callbacks (never a
    KeyboardInterrupt raised inside the loop, which can lose a task's wake-up and hang the
    clean-up for ever); the clean-up runs, then the interrupt goes on. One that hangs is left after
    the bound with where it waits; the previous SIGINT handler is back after."""
    import asyncio
    import os
    import signal

    from spoc_tui.tune.evaluate import run_interruptible

    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in `spoc tune`
    seen: list[str] = []

    async def ramp(hangs: bool) -> str:
        # while the ramp runs, SIGINT is not Python's default (which raises where the loop is)
        seen.append("default" if signal.getsignal(signal.SIGINT) is signal.default_int_handler else "handled")
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(3600)
        finally:
            seen.append("cleaned")
            if hangs:
                await asyncio.Event().wait()
        return "finished"

    async def quick() -> str:
        return "finished"

    loop = asyncio.new_event_loop()
    try:
        assert run_interruptible(loop, loop.create_task(quick()), 0.2) == "finished"
        for hangs in (False, True):
            seen.clear()
            task = loop.create_task(ramp(hangs))
            with pytest.raises(KeyboardInterrupt):
                run_interruptible(loop, task, 0.3)
            err = capsys.readouterr().err
            assert seen == ["handled", "cleaned"], seen
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            if hangs:
                assert not task.done() and "did not stop within 0 s of the interrupt" in err and "ramp" in err, err
                task.cancel()
                loop.run_until_complete(asyncio.wait({task}, timeout=1))
            else:
                assert task.cancelled() and err == ""
    finally:
        loop.close()
        signal.signal(signal.SIGINT, outer)
