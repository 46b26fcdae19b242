"""spoc plan: replicas from a ramp's knee with its bracket, the autoscaling target, manifests
that parse, and one-line errors for ramps that cannot be planned from."""

import json
import subprocess
import sys

import pytest
import yaml

from spoc_tui.core.analysis.fleetplan import PlanError, hpa_yaml, keda_yaml, plan_from_ramp, plan_text
from spoc_tui.core.results import decode_ramp


def raw(k=16, f=40, waiting_mean=None, waiting_max=0.0, gpus=1, unit="users", reason=""):
    """A ramp.json of schema 1 (as the ramps of today's main wrote it, trimmed)."""
    server = {"waiting_max": waiting_max, "gpus": [{"gpu": str(i)} for i in range(gpus)]}
    if waiting_mean is not None:
        server["waiting_mean"] = waiting_mean
    return {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "knee": {
            "max_users_within_sla": k,
            "first_failing_users": f,
            "unit": unit,
            "broken_limit": "ttft_p99",
            "inconclusive": [],
            "contradicted": [],
            "reason": reason,
        },
        "steps": [{"users": u, "server": server} for u in (1, 4, 16, 40)],
    }


def ramp(**kw):
    return decode_ramp(raw(**kw))


def test_replicas_with_headroom_and_the_brackets_interval():
    p = plan_from_ramp(ramp(), 1000, 0.2)
    assert p.users_per_replica == pytest.approx(12.8)
    assert p.replicas == 79  # ceil(1000 / 12.8)
    assert p.replicas_low == 33  # ceil(1000 / (39 * 0.8))
    assert p.gpus == 79
    assert plan_from_ramp(ramp(gpus=4), 1000, 0.2).gpus == 316
    assert plan_from_ramp(ramp(), 1000, 0.2, gpus_per_replica=2).gpus == 158
    assert plan_from_ramp(ramp(), 10, 0.0).replicas == 1


def test_target_waiting_from_the_knee_step():
    assert plan_from_ramp(ramp(waiting_mean=3.4, waiting_max=9), 100).target_waiting == 3.4
    p = plan_from_ramp(ramp(waiting_max=6), 100)
    assert p.target_waiting == 6 and "peak" in p.waiting_basis
    p = plan_from_ramp(ramp(), 100)
    assert p.target_waiting == 1 and "empty" in p.waiting_basis


def test_manifests_are_valid_yaml_with_the_plan():
    p = plan_from_ramp(ramp(waiting_mean=4), 500)
    keda = yaml.safe_load(keda_yaml(p, "http://prom:9090", "my-vllm"))
    assert keda["kind"] == "ScaledObject" and keda["spec"]["maxReplicaCount"] == p.replicas
    trig = keda["spec"]["triggers"][0]
    assert trig["type"] == "prometheus" and trig["metadata"]["threshold"] == "4"
    assert 'vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"}' in trig["metadata"]["query"]
    hpa = yaml.safe_load(hpa_yaml(p))
    assert hpa["spec"]["metrics"][0]["external"]["target"]["averageValue"] == "4"
    assert "replicas:" in plan_text(p)


def test_the_scaled_object_can_also_scale_out_on_the_fleets_headroom():
    """Issue 75, point 3: a second trigger beside the queue's: the replicas spoc watches over the
    fleet's headroom against 1/H, so KEDA's ceil(value / threshold) keeps the headroom at H (its
    figures checked against a real Prometheus in tests/realengine/test_fleet_real.py)."""
    from spoc_tui.core.analysis.fleetplan import headroom_query

    p = plan_from_ramp(ramp(waiting_mean=4), 500)
    assert len(yaml.safe_load(keda_yaml(p))["spec"]["triggers"]) == 1  # not asked: as before
    keda = yaml.safe_load(keda_yaml(p, "http://prom:9090", "my-vllm", headroom_under=1.3))
    queue, head = keda["spec"]["triggers"]
    assert queue["metadata"]["threshold"] == "4"
    assert head["type"] == "prometheus" and head["metricType"] == "AverageValue"
    assert head["metadata"] == {"serverAddress": "http://prom:9090", "query": headroom_query(), "threshold": "0.7692"}
    assert 'spoc_headroom_ratio{server="fleet",bound="estimate"}' in head["metadata"]["query"]
    for bad in (1.0, 0.5, 11.0):
        with pytest.raises(PlanError, match="--keda-headroom"):
            keda_yaml(p, headroom_under=bad)


@pytest.mark.parametrize(
    ("doc", "users", "headroom", "match"),
    [
        (ramp(k=None, f=2), 100, 0.2, "no knee.*even 2 users broke"),
        (ramp(k=None, f=None), 100, 0.2, "no knee.*no step met"),
        (ramp(), 0, 0.2, "at least 1"),
        (ramp(), -5, 0.2, "at least 1"),
        (ramp(), 100, 0.95, "headroom"),
        (ramp(unit="req/s"), 100, 0.2, "request rates"),
        (ramp(k=1), 100, 0.5, "under one user"),
    ],
)
def test_bad_plans_are_one_line_errors(doc, users, headroom, match):
    with pytest.raises(PlanError, match=match):
        plan_from_ramp(doc, users, headroom)


def test_no_failing_level_and_a_saturated_client_are_noted():
    p = plan_from_ramp(ramp(f=None, reason="... and the client saturated: timings not trustworthy"), 100)
    assert p.replicas_low == p.replicas
    assert any("no step broke" in n for n in p.notes) and any("saturated" in n for n in p.notes)


def test_cli(tmp_path):
    (tmp_path / "ramp.json").write_text(json.dumps(raw(waiting_mean=2)))
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "plan", "--ramp", str(tmp_path), "--users", "200", "--json"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["replicas"] == 16 and d["autoscaling"]["target_waiting_per_replica"] == 2
    assert yaml.safe_load(d["keda_scaled_object"])["kind"] == "ScaledObject"
    for args, msg in (
        (["--users", "0"], "at least 1"),
        (["--users", "10", "--model", "other"], "not 'other'"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "spoc_tui.cli", "plan", "--ramp", str(tmp_path), *args],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "plan", "--ramp", str(tmp_path / "nope"), "--users", "5"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr


def _inferred(estimate, ci95, boundary, **kw):
    doc = raw(**kw)
    doc["knee"].update(estimate=estimate, ci95=ci95, binding_limit="ttft_p99", boundary=boundary, levels=5)
    return decode_ramp(doc)


def test_replicas_for_the_inferred_knee_and_both_ends_of_its_interval():
    p = plan_from_ramp(_inferred(20.0, [16.0, 25.0], "smooth"), 1000, 0.2)
    assert p.knee_users == 20.0 and p.replicas == 63  # ceil(1000 / 16)
    assert p.replicas_ci95 == (50, 79)  # 25 users a replica .. 16
    assert "(95 %: 50-79)" in plan_text(p) and p.as_dict()["replicas_ci95"] == [50, 79]
    assert yaml.safe_load(keda_yaml(p))["spec"]["maxReplicaCount"] == 63  # the ScaledObject from the estimate


def test_a_one_sided_knee_gives_at_most_never_a_size():
    p = plan_from_ramp(_inferred(40.0, [40.0, None], "bound", f=None), 1000, 0.2)
    assert p.at_most and p.replicas == 32 and p.replicas_ci95 == (None, 32)
    text = plan_text(p)
    assert "replicas: at most 32" in text and "--users auto:160" in text
    assert p.as_dict()["replicas_at_most"] is True


def test_even_the_lowest_level_broke_names_lower_levels_to_try():
    with pytest.raises(PlanError, match=r"even 64 users broke .*--users 8,16,32"):
        plan_from_ramp(_inferred(None, [None, 64.0], "bound", k=None, f=64), 100, 0.2)
    with pytest.raises(PlanError, match=r"even 8 users broke .*--users 1,2,4"):
        plan_from_ramp(ramp(k=None, f=8), 100, 0.2)
    with pytest.raises(PlanError, match="one user already breaks it"):
        plan_from_ramp(ramp(k=None, f=1), 100, 0.2)


def test_an_interval_with_an_open_low_end_plans_from_the_estimate_and_says_the_open_side():
    """A p99 from short steps: no level showed the SLA met, so the knee's interval has no low end
    (the knee could be anywhere below 64 users) and the replicas' interval no high end."""
    p = plan_from_ramp(_inferred(30.0, [None, 64.0], "smooth", k=None, f=64), 1000, 0.2)
    assert not p.at_most and p.replicas == 42  # ceil(1000 / 24)
    assert p.replicas_ci95 == (20, None)  # 64 users a replica at most .. no end
    assert "replicas: 42 (95 %: 20-?)" in plan_text(p) and p.as_dict()["replicas_ci95"] == [20, None]


def test_a_crafted_model_name_stays_one_quoted_value_in_the_manifests_and_the_query():
    """Issue 56 item 5: the model name was pasted unquoted into the PromQL and the YAML."""
    doc = raw(waiting_mean=4)
    doc["model"] = 'm"}) or vector(1000) #\nevil: key'
    p = plan_from_ramp(decode_ramp(doc), 500)
    keda = yaml.safe_load(keda_yaml(p, "http://prom:9090", "my-vllm"))
    query = keda["spec"]["triggers"][0]["metadata"]["query"]
    assert query == 'sum(vllm:num_requests_waiting{model_name="m\\"}) or vector(1000) #\\nevil: key"})'
    assert "evil" not in keda and "evil" not in keda["spec"]["triggers"][0]["metadata"]
    hpa = yaml.safe_load(hpa_yaml(p, "my-vllm"))
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["selector"]["matchLabels"] == {"model_name": doc["model"]}


@pytest.mark.parametrize(
    ("deployment", "prometheus", "match"),
    [
        ("vllm\nevil: 1", "http://prom:9090", "--deployment"),
        ("VLLM", "http://prom:9090", "--deployment"),
        ("vllm", "http://prom:9090\n  evil: 1", "--prometheus"),
        ("vllm", "prom:9090", "--prometheus"),
        ("vllm", 'http://p/"x', "--prometheus"),
    ],
)
def test_deployment_and_prometheus_are_checked_before_they_reach_a_manifest(deployment, prometheus, match):
    p = plan_from_ramp(ramp(waiting_mean=4), 500)
    with pytest.raises(PlanError, match=match):
        keda_yaml(p, prometheus, deployment)


def test_users_past_ten_million_are_refused(tmp_path):
    (tmp_path / "ramp.json").write_text(json.dumps(raw(waiting_mean=2)))
    with pytest.raises(PlanError, match="at most 10,000,000"):
        plan_from_ramp(ramp(), 10**15)
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "plan", "--ramp", str(tmp_path), "--users", str(10**15)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "at most 10,000,000" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "plan", "--ramp", str(tmp_path), "--users", "9", "--deployment", "a b"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--deployment" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_model_name_too_long_to_be_one_is_refused_and_a_control_character_is_shown_inert():
    doc = raw(waiting_mean=2)
    doc["model"] = "m" * 10_000_000
    with pytest.raises(PlanError, match="10,000,000 characters long"):
        plan_from_ramp(decode_ramp(doc), 100)
    doc["model"] = "evil\x1b]0;title\x07"
    text = plan_text(plan_from_ramp(decode_ramp(doc), 100))
    assert "\x1b" not in text and "evil\\x1b]0;title\\x07" in text
