"""A study's files as written (trials.jsonl, pareto.json): their keys, in order, pinned, and read
back through the codec as typed documents, the old schema's too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import StepVerdict
from spoc_tui.core.results import ResultError, read_pareto, read_trials
from spoc_tui.core.tuning.docs import ReferenceStep, TrialRecord
from spoc_tui.core.tuning.space import Objective
from spoc_tui.tune.files import StudyFiles
from spoc_tui.tune.records import compute_front

OBJECTIVES = (Objective("out_tok_s", "max"), Objective("ttft_p99", "min"))
LIMITS = tuple(parse_sla("ttft_p99<=1s"))

TRIAL_KEYS = [
    "schema", "number", "status", "config", "flags", "objectives", "constraints", "feasible", "reason", "log_tail",
    "knee", "reference", "start_s", "duration_s", "worker", "repeat_of", "finished_at", "ci95", "n", "extra",
    "early_stop",
]  # fmt: skip
PARETO_KEYS = [
    "schema", "status", "study", "storage", "objectives", "sla", "reference_load_users", "trials_run", "feasible",
    "infeasible", "hypervolume", "hypervolume_reference", "pareto", "candidates", "settled", "run_to_run_cv", "noise",
    "reruns", "early_stopped", "updated_at",
]  # fmt: skip
REFERENCE_KEYS = ["users", "requests", "out_tok_s", "req_s", "ttft_p99", "itl_p99", "error_rate", "verdict"]
MEMBER_KEYS = [
    "number", "status", "config", "flags", "command", "objectives", "ci95", "n", "runs", "trials", "spread_cv",
    "first_run", "reference", "repeats",
]  # fmt: skip


@dataclass
class Settings:
    out_dir: Path
    study_name: str = "s"
    objectives: tuple[Objective, ...] = OBJECTIVES
    limits: tuple = LIMITS
    template: list[str] = None  # type: ignore[assignment]
    rerun_share: float = 0.2


def record(n: int, tok: float, ttft: float, seqs: int, repeat_of: int | None = None, **kw) -> TrialRecord:
    return TrialRecord(
        number=n, status="ok", config={"max-num-seqs": seqs}, flags=["--max-num-seqs", str(seqs)],
        objectives={"out_tok_s": tok, "ttft_p99": ttft}, constraints={"ttft_p99<=1s": ttft - 1.0},
        feasible=ttft <= 1.0, reference=ReferenceStep(8, 40, tok, 2.0, ttft, 0.02, 0.0, StepVerdict("meets")), duration_s=10.0, finished_at=float(n + 1),
        ci95={"out_tok_s": [tok * 0.9, tok * 1.1], "ttft_p99": [ttft * 0.8, ttft * 1.2]},
        n={"out_tok_s": 40, "ttft_p99": 40}, repeat_of=repeat_of, **kw,
    )  # fmt: skip


def study(tmp_path: Path) -> tuple[StudyFiles, list[TrialRecord]]:
    recs = [
        record(0, 300.0, 0.2, 16),
        record(1, 500.0, 0.6, 64),
        record(2, 520.0, 0.62, 64, repeat_of=1),
        record(3, 200.0, 1.5, 256),
        TrialRecord(number=4, status="infeasible", config={"max-num-seqs": 2}, flags=["--max-num-seqs", "2"],
                    reason="server did not start", log_tail="boom", finished_at=5.0),
    ]  # fmt: skip
    files = StudyFiles(Settings(tmp_path, template=["vllm", "serve", "m", "--api-key", "sk-X", "{flags}"]))
    for r in recs:
        files.append(r)
    front = compute_front(recs, OBJECTIVES, LIMITS)
    files.write_pareto(
        front, recs, "sqlite:////x/study.db", {1: [{"out_tok_s": 510.0, "ttft_p99": 0.61}]}, "complete", 8
    )
    return files, recs


def test_the_study_files_keys_stay_as_they_were(tmp_path):
    study(tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert all(list(x) == TRIAL_KEYS for x in lines)
    doc = json.loads((tmp_path / "pareto.json").read_text())
    assert list(doc) == PARETO_KEYS
    (member,) = [m for m in doc["pareto"] if m["number"] == 1]
    assert list(member) == MEMBER_KEYS  # spread_cv (two runs) and repeats (--repeat-pareto) present here
    assert list(member["first_run"]) == ["objectives", "ci95", "n"]
    assert list(member["reference"]) == REFERENCE_KEYS and lines[0]["reference"] == member["reference"] | {
        "out_tok_s": 300.0, "ttft_p99": 0.2}  # fmt: skip
    assert lines[4]["knee"] == lines[4]["reference"] == lines[4]["early_stop"] == {}  # measured nothing
    others = [m for m in doc["pareto"] + doc["candidates"] if m["number"] != 1]
    assert all(list(m) == [k for k in MEMBER_KEYS if k not in ("spread_cv", "repeats")] for m in others)
    assert list(doc["objectives"]) == [
        {"name": "out_tok_s", "direction": "max", "label": "output tokens/s"},
        {"name": "ttft_p99", "direction": "min", "label": "TTFT p99"},
    ]
    assert list(doc["early_stopped"]) == ["trials", "saved_s"]
    assert "sk-X" not in (tmp_path / "pareto.json").read_text() and doc["storage"] == "sqlite:////x/study.db"
    assert doc["reference_load_users"] == 8 and doc["trials_run"] == 5 and doc["infeasible"] == 1


def test_they_read_back_as_the_typed_documents_written(tmp_path):
    _, recs = study(tmp_path)
    assert read_trials(tmp_path) == recs
    doc = read_pareto(tmp_path)
    raw = json.loads((tmp_path / "pareto.json").read_text())
    assert doc.as_dict() == {k: v for k, v in raw.items() if k != "schema"}
    assert [m.number for m in doc.best(2)] == [1, 0]  # by output tokens/s, the highest first
    assert doc.pareto[0].reference is not None and doc.pareto[0].reference.verdict.decision == "meets"


def test_a_study_file_of_another_shape_is_refused_where_it_is_wrong(tmp_path):
    good = '{"schema": 2, "number": 0, "status": "ok", "config": {}, "flags": []}\n'
    (tmp_path / "trials.jsonl").write_text(good + '{"schema": 2, "number": 1, "status": "done", "config": {}}\n' + good)
    with pytest.raises(ResultError, match=r"trials.jsonl:2: status 'done' is not one of ok, infeasible"):
        read_trials(tmp_path)
    (tmp_path / "trials.jsonl").write_text(good.replace('"flags": []', '"flags": [], "objectives": {"x": "fast"}'))
    with pytest.raises(ResultError, match=r"trials.jsonl:1: objectives.x: 'fast' is not a number"):
        read_trials(tmp_path)
    (tmp_path / "pareto.json").write_text('{"schema": 2, "pareto": [{"number": 1, "ci95": {"x": [1]}}]}')
    with pytest.raises(ResultError, match=r"pareto\[0\]: ci95.x: an interval is \[low, high\]"):
        read_pareto(tmp_path)
    (tmp_path / "pareto.json").write_text('{"schema": 2, "pareto": [7]}')
    with pytest.raises(ResultError, match=r"pareto\[0\]: not an object"):
        read_pareto(tmp_path)
