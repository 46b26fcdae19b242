"""The result files' codec: every ramp.json this project wrote reads back with the same knee and
plan; a newer schema is refused with a message; what is written reads back as the same values."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from spoc_tui.core.ramp.knee import find_knee
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import RequestSample, ServerWindow, StepSummary, summarize_step
from spoc_tui.core.results import (
    SCHEMA,
    RampHeader,
    ResultError,
    decode_ramp,
    encode_ramp,
    read_pareto,
    read_ramp,
    read_trials,
)
from spoc_tui.procs.lock import mark_interrupted

V1 = Path(__file__).parent.parent / "fixtures" / "results" / "v1"
FUTURE = V1.parent / "future.ramp.json"


def _plain(d):
    """A result dict with the keys schema 2 added taken out, to compare with schema 1."""
    if isinstance(d, dict):
        return {k: _plain(v) for k, v in d.items() if k not in ("cause", "client_saturated")}
    if isinstance(d, list):
        return [_plain(v) for v in d]
    return d


@pytest.mark.parametrize("name", ["users", "auto", "rate", "trial"])
def test_every_schema_1_ramp_reads_back_with_the_same_steps_and_knee(name):
    raw = json.loads((V1 / f"{name}.ramp.json").read_text())
    assert "schema" not in raw  # written by main before the codec
    doc = read_ramp(V1 / f"{name}.ramp.json")
    assert doc.schema == 1 and doc.model == raw["model"] and doc.status == raw["status"]
    assert _plain(doc.knee.as_dict()) == raw["knee"]
    # the knee found again from the steps read back is the knee the ramp wrote
    assert _plain(find_knee(doc.steps).as_dict()) == raw["knee"]
    for step, old in zip(doc.steps, raw["steps"], strict=True):
        new = step.as_dict()
        for key, check in old["verdict"]["checks"].items():
            # the queue rule's check gained the fields every other check has (value, limit, ...)
            assert {k: v for k, v in new["verdict"]["checks"][key].items() if k in check} == check
        new["verdict"]["checks"] = old["verdict"]["checks"]
        assert new == old


def test_the_knees_cause_is_a_value_not_a_sentence():
    users = read_ramp(V1 / "users.ramp.json").knee
    assert users.why is not None and users.why.cause == "batch_full" and users.why.client_saturated
    rate = read_ramp(V1 / "rate.ramp.json").knee
    assert rate.unit == "req/s" and rate.why is not None and rate.why.cause == "queue_unbounded"
    assert read_ramp(V1 / "auto.ramp.json").knee.why is None  # nothing broke


def test_spoc_plan_gives_todays_answer_from_a_schema_1_ramp():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoc_tui.cli",
            "plan",
            "--ramp",
            str(V1 / "users.ramp.json"),
            "--users",
            "500",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    today, then = json.loads(out), json.loads((V1 / "users.plan.json").read_text())
    assert {k: v for k, v in today.items() if k in then} == then  # every key of then, as it was
    assert set(today) - set(then) == {"replicas_ci95", "replicas_at_most"}


def test_a_newer_schema_is_refused_with_a_message(tmp_path):
    with pytest.raises(ResultError, match=rf"newer spoc-tui \(schema 99; this one reads schema 1 to {SCHEMA}\)"):
        read_ramp(FUTURE)
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "plan", "--ramp", str(FUTURE), "--users", "5"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "newer spoc-tui" in r.stderr and "Traceback" not in r.stderr
    for bad in ('{"schema": "2", "steps": []}', '{"schema": 0, "steps": []}'):
        with pytest.raises(ResultError, match="not a version"):
            decode_ramp(json.loads(bad))
    with pytest.raises(ResultError, match="not a ramp result"):
        decode_ramp({"knee": {}})
    (tmp_path / "ramp.json").write_text("[1, 2]")
    with pytest.raises(ResultError, match="not a JSON object"):
        read_ramp(tmp_path)
    with pytest.raises(ResultError, match="no such file"):
        read_ramp(tmp_path / "nothing")


def test_a_newer_files_status_is_not_rewritten(tmp_path):
    doc = json.loads(FUTURE.read_text())
    doc["status"] = "running"
    (tmp_path / "ramp.json").write_text(json.dumps(doc))
    assert not mark_interrupted(tmp_path / "ramp.json", "parent gone")
    old = json.loads((V1 / "users.ramp.json").read_text())
    old["status"] = "running"
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert mark_interrupted(tmp_path / "old.json", "parent gone")


def _sample(i: int, ttft: float) -> RequestSample:
    return RequestSample(
        start=float(i),
        step=1,
        users=4,
        ok=True,
        ttft=ttft,
        e2e=ttft + 1,
        itl=(0.01,) * 20,
        output_tokens=21,
        end=i + 1.0,
    )


def test_what_is_written_reads_back_as_the_same_values():
    lims = parse_sla("ttft_p50<=1s,itl_p99<=50ms")
    steps = [
        summarize_step(
            1, 4, [_sample(i, 0.1) for i in range(30)], 30.0, lims, server=ServerWindow(seen=True, waiting=0)
        ),
        summarize_step(2, 8, [_sample(i, 2.0) for i in range(30)], 30.0, lims, unbounded="queue unbounded: 1 -> 40"),
    ]
    knee = find_knee(steps)
    text = encode_ramp(RampHeader(model="m", url="http://h"), steps, knee, "complete", 1.0)
    raw = json.loads(text)
    assert raw["schema"] == SCHEMA and next(iter(raw)) == "schema"
    doc = decode_ramp(raw)
    assert doc.steps == tuple(steps)
    assert doc.knee == knee and knee.why is not None and knee.why.cause == "queue_unbounded"
    assert StepSummary.from_dict(steps[1].as_dict()) == steps[1]


def test_study_files_carry_their_schema_and_read_back(tmp_path):
    pareto = read_pareto(V1 / "pareto.json")  # schema 1
    assert pareto.status == "complete" and pareto.pareto[0].flags[-1] == "--enable-chunked-prefill"
    assert pareto.pareto[0].spread_cv is None and pareto.objectives[0].maximise
    trials = read_trials(V1 / "trials.jsonl")
    assert [t.number for t in trials] == [0, 1, 2] and trials[0].status == "ok"
    cut = (V1 / "trials.jsonl").read_text() + '{"number": 3, "sta'
    (tmp_path / "trials.jsonl").write_text(cut)
    assert len(read_trials(tmp_path)) == 3  # the line a crash cut short is left out
    (tmp_path / "trials.jsonl").write_text(cut + "\n\n")  # ...not when a line follows it
    with pytest.raises(ResultError, match=r"trials.jsonl:4: not a trial record \(Unterminated string"):
        read_trials(tmp_path)
    (tmp_path / "trials.jsonl").write_text('{"number": 3, "sta\n' + (V1 / "trials.jsonl").read_text())
    with pytest.raises(ResultError, match=r"trials.jsonl:1: not a trial record \(.* line 1 column"):
        read_trials(tmp_path)
    (tmp_path / "trials.jsonl").write_text('{"schema": 7, "number": 0}\n')
    with pytest.raises(ResultError, match="newer spoc-tui"):
        read_trials(tmp_path)
    (tmp_path / "pareto.json").write_text('{"schema": 7, "pareto": []}')
    with pytest.raises(ResultError, match="newer spoc-tui"):
        read_pareto(tmp_path)


def test_json_lines_numbers_lines_skips_blanks_and_says_whether_a_bad_line_is_the_last():
    from spoc_tui.core.files import JsonLineError, json_lines

    assert list(json_lines(['{"a": 1}', "", "  ", "[2]"])) == [(1, {"a": 1}), (4, [2])]
    with pytest.raises(JsonLineError) as cut:
        list(json_lines(['{"a": 1}', '{"b": ']))
    assert (cut.value.lineno, cut.value.last, cut.value.msg) == (2, True, "Expecting value")
    assert cut.value.detail.startswith("Expecting value: line 1 column")
    with pytest.raises(JsonLineError) as inner:
        list(json_lines(["nope", ""]))  # a line follows: not a write a crash cut short
    assert (inner.value.lineno, inner.value.last) == (1, False)
    with pytest.raises(JsonLineError, match="nested too deeply"):
        list(json_lines(["[" * 100_000]))


def test_write_atomic_replaces_a_file_whole_and_never_renames_over_a_link_a_pipe_or_a_device(tmp_path):
    """``--out /dev/null`` as root had become a regular file /dev/null: the temporary file was
    renamed over the device node (or over the /dev/stdout link)."""
    import os
    import stat
    import threading

    from spoc_tui.core.files import write_atomic

    target = tmp_path / "a.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"  # the file replaced, the link kept

    null = tmp_path / "null"
    null.symlink_to("/dev/null")
    write_atomic(null, "gone")
    assert null.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    write_atomic(fifo, lambda f: f.write("through the pipe"))
    reader.join(10)
    assert got == ["through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "fifo", "link.json", "null"]  # no .part left


HEADER_PIN = Path(__file__).parent.parent / "fixtures" / "results" / "headers.json"
VOLATILE = ("started_at", "updated_at")


def _headers(tmp_path):
    """ramp.json's header as the two writers write it: a measured ramp's (spoc ramp's, before its
    first step) and a predicted one's (spoc twin predict --out), the times taken out."""
    from click.testing import CliRunner

    from spoc_tui.cli.main import cli
    from spoc_tui.core.ramp.knee import FixedUsers, Knee
    from spoc_tui.load.ramp import RampConfig, ResultWriter, ramp_header
    from spoc_tui.twin.model import write_twin
    from spoc_tui.workload import load_workload
    from tests.unit.test_twin_fit import twin

    cfg = RampConfig(
        "http://user:secret@127.0.0.1:1/",
        load_workload("chatbot"),
        FixedUsers([1, 2]),
        tuple(parse_sla("ttft_p99<=2s")),
        tmp_path / "m",
        step_s=30,
        warmup_s=5,
    )
    writer = ResultWriter(cfg.out_dir, ramp_header(cfg, "m", None), requests=False)
    writer.header = replace(writer.header, prompt_lengths="the server's tokenizer")
    writer.stopped("budget spent")
    writer.write([], Knee(None, None, None), "complete")
    writer.close()
    measured = json.loads((cfg.out_dir / "ramp.json").read_text())
    write_twin(twin(), tmp_path / "twin.json")
    args = ["twin", "predict", "--twin", str(tmp_path / "twin.json"), "--users", "1,2", "--step-seconds", "3"]
    r = CliRunner().invoke(cli, [*args, "--warmup-seconds", "1", "--draws", "0", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    predicted = json.loads((tmp_path / "p" / "ramp.json").read_text())
    predicted["prediction"]["seconds"] = None
    predicted["twin"]["calibrated_at"] = None
    for doc in (measured, predicted):  # where the checkout lies
        doc["profile"]["source"] = Path(doc["profile"]["source"]).name
    return {
        kind: {k: v for k, v in doc.items() if k not in (*VOLATILE, "steps", "knee")}
        for kind, doc in (("measured", measured), ("predicted", predicted))
    }


def test_the_ramp_json_header_keeps_its_keys_and_values(tmp_path):
    """Both writers' headers, pinned (tests/fixtures/results/headers.json; ``SPOC_REPIN=1``
    rewrites it, for a change meant to move them, said in the CHANGELOG): one typed header now
    writes both (issue 78), with the same keys and values each wrote before."""
    import os

    got = _headers(tmp_path)
    if os.environ.get("SPOC_REPIN"):
        HEADER_PIN.write_text(json.dumps(got, indent=1) + "\n")
    pinned = json.loads(HEADER_PIN.read_text())
    for kind in ("measured", "predicted"):
        assert sorted(got[kind]) == sorted(pinned[kind]), kind
        for k, v in pinned[kind].items():
            assert got[kind][k] == v, (kind, k, got[kind][k], v)
