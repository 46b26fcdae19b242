"""Tuning studies scored on the twin in virtual time (``spoc tune --twin``): the evaluator, the
space it can search, and a study end to end with the real Optuna sampler."""

from pathlib import Path

import pytest

from spoc_tui.core.errors import InputError
from spoc_tui.core.ramp.knee import FixedUsers
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.tuning.space import parse_objectives, parse_space
from spoc_tui.load.ramp import RampConfig
from spoc_tui.tune.evaluate import TrialRequest
from spoc_tui.tune.study import TuneConfig, TuneSession
from spoc_tui.twin.tuning import TwinEvaluator, check_space, what_if
from spoc_tui.workload import load_workload
from tests.unit.test_twin_fit import twin

LIMITS = parse_sla("ttft_p99<=5s")


def ramp(users: int = 48) -> RampConfig:
    return RampConfig("", load_workload("chatbot"), FixedUsers([users]), LIMITS, Path(), step_s=40, warmup_s=8)


def test_a_trial_is_the_ramp_predicted_with_its_flags(tmp_path):
    ev = TwinEvaluator(twin(0.05), ramp())
    few = ev.evaluate(TrialRequest({"max-num-seqs": 4}, (), tmp_path))
    many = ev.evaluate(TrialRequest({"max-num-seqs": 64}, (), tmp_path))
    assert few.status == many.status == "ok"
    # 48 users on 4 seats queue; on 64 they do not
    assert few.steps[0].latency.ttft.p50 > 3 * many.steps[0].latency.ttft.p50
    assert few.steps[0].server.running_max <= 4 < many.steps[0].server.running_max
    assert many.kv_tokens == 4096 * 16 and many.max_model_len == 2048 and many.tokens_per_request
    half = ev.evaluate(TrialRequest({"gpu-memory-utilization": 0.45}, (), tmp_path))
    assert half.kv_tokens == many.kv_tokens // 2
    # what the twin cannot change is infeasible with the reason, not a wrong number
    bad = ev.evaluate(TrialRequest({"block-size": 32}, (), tmp_path))
    assert bad.status == "infeasible" and "the twin predicts only" in bad.reason
    assert ev.evaluate(TrialRequest({"enable-chunked-prefill": "yes"}, (), tmp_path)).status == "infeasible"


def test_the_space_the_twin_can_search():
    tw = twin()
    assert what_if({"max-num-seqs": 8.0, "enable-prefix-caching": False}) == {
        "max_num_seqs": 8,
        "enable_prefix_caching": False,
    }
    with pytest.raises(InputError, match="varies --kv-cache-dtype"):
        check_space(tw, ["max-num-seqs", "kv-cache-dtype"], {})
    # a fixed setting the twin has as calibrated may stay; another value may not
    assert check_space(tw, ["max-num-seqs"], {"max-model-len": 2048, "max-num-batched-tokens": 4096}) == {
        "max-num-batched-tokens": 4096
    }
    with pytest.raises(InputError, match="fixes --max-model-len 8192, the twin was calibrated at 2048"):
        check_space(tw, ["max-num-seqs"], {"max-model-len": 8192})
    with pytest.raises(InputError, match="fixes --tensor-parallel-size 2, which the twin cannot change"):
        check_space(tw, ["max-num-seqs"], {"tensor-parallel-size": 2})


def test_a_study_on_the_twin_finds_its_front_in_seconds(tmp_path):
    space = parse_space(
        "[flags.max-num-seqs]\npow2 = [4, 64]\ndefault = 64\n\n"
        "[flags.enable-prefix-caching]\nchoices = [true, false]\ndefault = true\n",
        "s.toml",
    )
    cfg = TuneConfig(space, parse_objectives("max:out_tok_s,min:ttft_p99"), LIMITS, 6, tmp_path, population=4, seed=1)
    summary = TuneSession(cfg, TwinEvaluator(twin(0.05), ramp())).run()
    assert summary.status == "complete"
    ran = [r for r in summary.records if r.repeat_of is None]
    assert len(ran) >= 4 and all(r.status == "ok" for r in ran)
    # more seats serve 48 users faster: the front's best throughput is not from 4 seats
    best = max(ran, key=lambda r: r.objectives["out_tok_s"])
    assert best.config["max-num-seqs"] > 4
    assert (tmp_path / "pareto.json").exists()


def test_the_twins_best_are_paired_with_their_runs_on_the_server():
    """``spoc tune --twin --confirm N``: the N best Pareto members by the first objective, each
    beside its trial on the server (a repeat's extra run left out), or ``not run``."""
    from spoc_tui.core.tuning.docs import StudyDoc, TrialRecord
    from spoc_tui.twin.confirm import confirmations

    def doc(first: str) -> StudyDoc:
        return StudyDoc.from_dict(
            {
                "objectives": [{"name": "out_tok_s", "direction": first}, {"name": "itl_p99", "direction": "min"}],
                "pareto": [
                    {"flags": ["--max-num-seqs", "8"], "objectives": {"out_tok_s": 100.0, "itl_p99": 0.01}},
                    {"flags": ["--max-num-seqs", "64"], "objectives": {"out_tok_s": 900.0, "itl_p99": 0.05},
                     "ci95": {"out_tok_s": [800.0, 1000.0]}},
                    {"flags": ["--max-num-seqs", "32"], "objectives": {"out_tok_s": 500.0, "itl_p99": 0.03}},
                ],
            }
        )  # fmt: skip

    # "max" is what a study writes (and optuna's "maximize" reads alike): the best are the highest.
    # (Before the typed documents the rule knew only "maximize", and picked a real study's worst.)
    assert [m.flags[1] for m in doc("max").best(2)] == ["64", "32"]
    assert [m.flags[1] for m in doc("maximize").best(2)] == ["64", "32"]
    assert [m.flags[1] for m in doc("min").best(2)] == ["8", "32"]
    best = doc("max").best(2)
    trials = [
        TrialRecord.from_dict({"flags": ["--max-num-seqs", "64"], "status": "ok", "objectives": {"out_tok_s": 850.0},
                               "extra": True}),
        TrialRecord.from_dict({"flags": ["--max-num-seqs", "64"], "status": "ok", "objectives": {"out_tok_s": 870.0}}),
    ]  # fmt: skip
    rows = confirmations(best, trials)
    assert rows[0].measured == {"out_tok_s": 870.0} and rows[0].measured_status == "ok"
    assert rows[1].measured is None and rows[1].measured_status == "not run"
    assert rows[0].as_dict()["flags"] == ["--max-num-seqs", "64"]
    assert rows[0].as_dict()["predicted_ci95"] == {"out_tok_s": [800.0, 1000.0]}
    assert rows[1].as_dict()["predicted_ci95"] == {}
