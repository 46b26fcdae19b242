"""A study's files as written (trials.jsonl, pareto.json): their keys, in order, pinned, and read
back through the codec as typed documents, the old schema's too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.tuning.space import Objective
from spoc_tui.tune.files import StudyFiles
from spoc_tui.tune.records import TrialRecord, compute_front

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
        feasible=ttft <= 1.0, reference={"users": 8, "requests": 40}, duration_s=10.0, finished_at=float(n + 1),
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
    files.write_pareto(front, recs, "sqlite:////x/study.db", {1: [{"out_tok_s": 510.0, "ttft_p99": 0.61}]}, "complete", 8)
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
    others = [m for m in doc["pareto"] + doc["candidates"] if m["number"] != 1]
    assert all(list(m) == [k for k in MEMBER_KEYS if k not in ("spread_cv", "repeats")] for m in others)
    assert [o for o in doc["objectives"]] == [
        {"name": "out_tok_s", "direction": "max", "label": "output tokens/s"},
        {"name": "ttft_p99", "direction": "min", "label": "TTFT p99"},
    ]
    assert list(doc["early_stopped"]) == ["trials", "saved_s"]
    assert "sk-X" not in (tmp_path / "pareto.json").read_text() and doc["storage"] == "sqlite:////x/study.db"
    assert doc["reference_load_users"] == 8 and doc["trials_run"] == 5 and doc["infeasible"] == 1
