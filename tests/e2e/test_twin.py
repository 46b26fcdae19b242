"""`spoc twin` end to end: calibrate on a live simulator's probes; predict a ramp and check the
prediction against a measured one (measured by `spoc ramp`'s own driver in virtual time: the check's
logic needs no server, and how close it comes is benchmarks/twin_accuracy.py's); bad input refused
with a message."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from spoc_tui.procs.ports import free_ports
from spoc_tui.sim.process import start_sim
from spoc_tui.twin.model import RIDGES

PROFILE = """
name = "held-out"
ignore_eos = true
system_tokens = 100
turns = {dist = "uniform", min = 1, max = 2}
user_tokens = {dist = "uniform", min = 200, max = 600}
output_tokens = {dist = "uniform", min = 30, max = 80}
think_s = {dist = "uniform", min = 0.2, max = 0.8}
"""


@pytest.fixture(scope="module")
def sim():
    port, dport = free_ports(2)
    proc = start_sim(["--max-num-seqs", "32", "--dcgm-port", str(dport)], port)
    yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{dport}/metrics"
    proc.stop()


def spoc(*args, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def twin(sim, tmp_path_factory):
    out = tmp_path_factory.mktemp("twin") / "twin.json"
    url, dcgm = sim
    r = spoc("twin", "calibrate", "--url", url, "--dcgm", dcgm, "--budget", "25", "--engine-flag", "max-num-seqs=32",
             "--engine-flag", "max-num-batched-tokens=8192", "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "b_decode" in r.stdout and f"wrote {out}" in r.stdout
    return out


@pytest.fixture(scope="module")
def known_twin(tmp_path_factory):
    """A twin of known coefficients (tests/unit/test_twin_fit.py): for what reads a twin file and
    needs no server (a what-if, a fleet plan, refused input, a study on the twin)."""
    from spoc_tui.twin.model import write_twin
    from tests.unit.test_twin_fit import twin as made

    out = tmp_path_factory.mktemp("known") / "twin.json"
    write_twin(made(0.05), out)
    return out


def test_calibration_reads_the_servers_settings_and_fits_its_steps(twin):
    doc = json.loads(twin.read_text())
    assert doc["kind"] == "spoc-twin" and doc["schema"] == 3
    srv = doc["server"]
    assert srv["num_gpu_blocks"] > 0 and srv["block_size"] == 16 and srv["max_model_len"] == 32768
    assert srv["sources"]["num_gpu_blocks"] == "reported" and srv["sources"]["max_num_seqs"] == "told"
    assert srv["sources"]["enable_chunked_prefill"] == "assumed"
    res = {r["kind"]: r for r in doc["residuals"]}
    # what a live simulator's timing on a shared host cannot move: the probes ran and were fitted,
    # with a spread. How close the fit comes is asserted on exact steps with chosen noise
    # (tests/unit/test_twin_fit.py) and measured live in benchmarks/twin_accuracy.py: on four
    # workers over two cores the residuals and the shared-prefix probe (left out when the budget
    # ran short under load) moved with the host, and failed clean-clone runs.
    assert {"decode", "prefill"} <= set(res) and all(r["n"] >= 1 for r in res.values()), res
    assert all(0 <= r["median_abs_pct"] <= r["max_abs_pct"] < float("inf") for r in res.values()), res
    assert doc["fit"]["ridge"] in RIDGES, doc["fit"]
    assert doc["fit"]["b0"] > 0 and len(doc["draws"]) >= 16
    assert all(len(d) == 10 for d in doc["draws"])
    # the simulator ends its answers at EOS as models do: the twin learned how long they are
    answers = doc["answers"]
    assert len(answers["lengths"]) >= 16 and answers["from"].startswith("answers to the calibration's prompts")
    assert answers["lengths"] == sorted(answers["lengths"]) and len(set(answers["lengths"])) > 4
    assert doc["gpu_clocks"] and all(mhz > 500 for mhz in doc["gpu_clocks"].values())
    shown = spoc("twin", "show", str(twin))
    assert shown.returncode == 0 and "KV blocks" in shown.stdout and "assumed" in shown.stdout


def measured_ramp(tmp_path, profile: str, plan, sla: str, **kw):
    """A measured ramp's folder without a server: ``spoc ramp``'s own driver and writer on the
    simulator's engine in virtual time (tests/unit/test_ramp_virtual.py); a trace replay on a
    twin of known coefficients with 5 % step noise. The check and the prediction read it as any."""
    import asyncio

    from tests.unit.test_ramp_virtual import on_sim8, on_twin, ramp

    cfg = ramp(tmp_path, profile, plan, sla, **kw)
    if cfg.trace is not None:
        asyncio.run(on_twin(cfg, lambda _: None))
    else:
        asyncio.run(on_sim8(cfg, lambda _: None, requests=True))
    return cfg.out_dir


def test_a_ramp_teaches_the_twin_its_answers_with_the_cut_ones_as_lower_bounds(known_twin, tmp_path):
    """`spoc twin check --learn-answers` on a chatbot ramp (the simulated model stops at EOS, the
    profile's max_tokens cuts about half its answers): requests.jsonl says which were cut, and
    the twin learns the model's own lengths (Kaplan-Meier), longer than the answers as read."""
    import shutil
    import statistics

    from spoc_tui.core.ramp.knee import FixedUsers
    from spoc_tui.workload import load_workload

    assert not load_workload("chatbot").ignore_eos
    measured = measured_ramp(tmp_path, "chatbot", FixedUsers([16]), "ttft_p90<=2s", step_s=120, warmup_s=5,
                             max_step_s=120)  # fmt: skip
    reqs = [json.loads(x) for x in (measured / "requests.jsonl").read_text().splitlines()]
    done = [q for q in reqs if q["ok"]]
    assert len(done) > 100 and {q.get("cut") for q in done} == {True, False}, len(done)
    twin = tmp_path / "twin.json"
    shutil.copy(known_twin, twin)
    c = spoc("twin", "check", "--twin", str(twin), "--ramp", str(measured), "--draws", "2", "--learn-answers")
    assert c.returncode in (0, 1), c.stderr
    assert "the twin learned its answers' lengths" in c.stdout and "Kaplan-Meier" in c.stdout, c.stdout
    learned = json.loads(twin.read_text())["answers"]
    cut = sum(q["cut"] for q in done)
    assert f"{len(done)} answers of the ramp {measured.name}, {cut} cut at max_tokens" in learned["from"], learned
    as_read = statistics.median(q["output_tokens"] for q in done)
    # the simulated model's own median is 181 tokens (log-normal, sigma 0.7); as read, about 125
    assert statistics.median(learned["lengths"]) > 1.2 * as_read, (statistics.median(learned["lengths"]), as_read)


def test_the_prediction_is_checked_against_a_measured_ramp(known_twin, tmp_path):
    from spoc_tui.core.ramp.knee import FixedUsers

    prof = tmp_path / "held-out.toml"
    prof.write_text(PROFILE)
    # what is asserted is that the check and the prediction ran and said something; how close they
    # come is benchmarks/twin_accuracy.py's (a live server's, on a host whose speed moves it)
    measured = measured_ramp(tmp_path, str(prof), FixedUsers([2, 10]), "ttft_p90<=2s", step_s=5, warmup_s=1,
                             max_step_s=5)  # fmt: skip
    c = spoc("twin", "check", "--twin", str(known_twin), "--ramp", str(measured), "--draws", "4", "--json")
    assert c.returncode in (0, 1), c.stderr
    doc = json.loads(c.stdout)
    assert [s["level"] for s in doc["steps"]] == ["2 users", "10 users"], doc["steps"]
    med = doc["median_abs_error_pct"]
    assert all(0 <= med[k] < float("inf") for k in ("itl_p50", "e2e_p50")), med
    assert c.returncode == (0 if doc["holds"] else 1)
    text = spoc("twin", "check", "--twin", str(known_twin), "--ramp", str(measured), "--draws", "2")
    assert "the twin holds" in text.stdout or "DRIFTED" in text.stdout
    pred = tmp_path / "predicted"
    p = spoc("twin", "predict", "--twin", str(known_twin), "--profile", str(prof), "--users", "2,10",
             "--step-seconds", "5", "--warmup-seconds", "1", "--max-step-seconds", "5", "--sla", "ttft_p90<=2s",
             "--draws", "4", "--out", str(pred))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "knee (predicted)" in p.stdout and "queued" in p.stdout
    doc = json.loads((pred / "ramp.json").read_text())
    assert doc["predicted"] is True and len(doc["steps"]) == 2 and doc["prediction"]["draws"] == 4
    assert set(doc["prediction"]["steps"][0]["intervals"]) >= {"ttft_p50", "itl_p50", "e2e_p90", "output_tokens_per_s"}
    # the predicted ramp reads as any ramp does
    shown = spoc("compare", str(measured), str(pred), "--json")
    assert shown.returncode == 0, shown.stderr


def test_a_what_if_changes_the_prediction(known_twin):
    twin = known_twin

    def itl(*extra):
        r = spoc("twin", "predict", "--twin", str(twin), "--users", "48", "--step-seconds", "20", "--warmup-seconds",
                 "5", "--max-step-seconds", "20", "--draws", "0", "--json", *extra)  # fmt: skip
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["steps"][0]["latency"]["ttft"]["p50"]

    # 48 users on 32 seats queue; 8 seats queue far longer
    assert itl("--set", "max-num-seqs=8") > 1.5 * itl()


def test_a_second_prediction_into_the_same_folder_keeps_the_first(known_twin, tmp_path):
    """As a second spoc ramp into a folder: the first ramp.json moves to previous-<time>/, and
    the command says where (the writer's rule: tests/unit/test_ramp_virtual.py)."""
    args = ["twin", "predict", "--twin", str(known_twin), "--users", "geom:1:4", "--step-seconds", "10",
            "--warmup-seconds", "2", "--draws", "0", "--out", str(tmp_path / "out")]  # fmt: skip
    first = spoc(*args)
    assert first.returncode == 0 and "moved to" not in first.stderr, first.stderr
    # its levels named as a measured ramp's ramp.json names them (it wrote "geom:1:4")
    assert json.loads((tmp_path / "out" / "ramp.json").read_text())["users"] == "1,2,4"
    second = spoc(*args)
    assert second.returncode == 0 and "the folder's earlier results were moved to previous-" in second.stderr
    (kept,) = (tmp_path / "out").glob("previous-*")
    assert (kept / "ramp.json").exists() and (tmp_path / "out" / "ramp.json").exists()


def test_bad_input_is_refused_with_a_message(known_twin, tmp_path):
    twin = known_twin
    (dead,) = free_ports(1)
    r = spoc("twin", "calibrate", "--url", f"http://127.0.0.1:{dead}", "--budget", "20", "--out", str(tmp_path / "t"))
    assert r.returncode == 1 and "cannot reach" in r.stderr and "Traceback" not in r.stderr
    r = spoc("twin", "calibrate", "--url", "http://127.0.0.1:1", "--budget", "5")
    assert r.returncode == 2 and "--budget" in r.stderr
    r = spoc("twin", "calibrate", "--url", "http://127.0.0.1:1", "--engine-flag", "max-num-seqs=lots")
    assert r.returncode == 2 and "whole number" in r.stderr
    r = spoc("twin", "predict", "--twin", str(tmp_path / "none.json"))
    assert r.returncode == 2 and "no such file" in r.stderr
    r = spoc("twin", "predict", "--twin", str(twin), "--set", "tensor-parallel-size=2")
    assert r.returncode == 2 and "FLAG=VALUE" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "spoc-twin", "schema": 7}')
    r = spoc("twin", "show", str(bad))
    assert r.returncode == 2 and "newer spoc-tui" in r.stderr
    r = spoc("sim", "--twin", str(bad), "--port", "0")
    assert r.returncode == 2 and "newer spoc-tui" in r.stderr


def test_the_twin_serves_live(known_twin):
    twin = known_twin
    (port,) = free_ports(1)
    proc = start_sim(["--twin", str(twin), "--max-num-seqs", "4"], port)
    try:
        import httpx

        m = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'num_gpu_blocks="' in m
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       json={"prompt": "hello there", "max_tokens": 4, "model": json.loads(twin.read_text())["server"]["model"]},
                       timeout=30)  # fmt: skip
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        proc.stop()


def test_tune_searches_on_the_twin_and_confirms_on_the_server(known_twin, tmp_path):
    twin = known_twin
    (tmp_path / "space.toml").write_text("[flags.max-num-seqs]\nchoices = [4, 32]\ndefault = 32\n")
    out = tmp_path / "tune"
    launch = f"{sys.executable} -m spoc_tui.cli sim --dcgm-port 0 --port {{port}} {{flags}}"
    r = spoc("tune", "--launch", launch, "--twin", str(twin), "--confirm", "1", "--space", str(tmp_path / "space.toml"),
             "--try", "--max-num-seqs 4", "--try", "--max-num-seqs 32", "--trials", "2", "--users", "12",
             "--step-seconds", "8", "--warmup-seconds", "2", "--sla", "ttft_p99<=5s",
             "--objectives", "max:out_tok_s,min:ttft_p99", "--out", str(out), timeout=400)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "predicted by the twin beside measured" in r.stdout
    assert "in virtual time" in r.stdout and "the twin's study took" in r.stdout
    doc = json.loads((out / "confirm.json").read_text())
    (row,) = doc["confirmed"]
    assert row["measured_status"] == "ok" and row["predicted"]["out_tok_s"] > 0 and row["measured"]["out_tok_s"] > 0
    # the twin's trials ran on spoc sim --twin, the confirmation on the launch command
    assert (out / "twin" / "pareto.json").exists() and (out / "confirm" / "trials.jsonl").exists()
    r = spoc(
        "tune",
        "--launch",
        launch,
        "--twin",
        str(twin),
        "--resume",
        "--out",
        str(tmp_path / "x"),
        "--sla",
        "ttft_p99<=5s",
    )
    assert r.returncode == 2 and "--twin runs two studies" in r.stderr
    # a flag the twin cannot change is refused before any trial
    (tmp_path / "bad.toml").write_text("[flags.block-size]\nchoices = [16, 32]\ndefault = 16\n")
    r = spoc("tune", "--launch", launch, "--twin", str(twin), "--space", str(tmp_path / "bad.toml"),
             "--out", str(tmp_path / "y"), "--sla", "ttft_p99<=5s")  # fmt: skip
    assert r.returncode == 2 and "varies --block-size" in r.stderr, r.stderr


def test_plan_a_fleet_for_a_trace_on_the_twin(known_twin, tmp_path):
    twin = known_twin
    from tests.unit.test_twin_fleet import _mooncake

    trace = _mooncake(tmp_path / "mooncake.jsonl", n=400, rate=8.0, seed=5)
    r = spoc("plan", "--twin", str(twin), "--trace", str(trace), "--replicas", "1-3", "--autoscale",
             "num_requests_waiting>=2,cooldown=10s,startup=5s,interval=5s,max=4", "--sla", "ttft_p99<=1s", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["predicted"] is True and doc["trace"]["rows"] == 400 and len(doc["configs"]) == 4
    by = {c["config"]: c for c in doc["configs"]}
    assert by["3 replicas"]["replica_hours"] > by["1 replica"]["replica_hours"]
    # one replica is not saturated at 8 requests/s: more replicas are no faster, only cheaper per
    # replica, and their p99 may come out a few % either way (CI saw 87 ms against 83: three caches
    # each miss the shared prefix once); slower by more than noise would be a defect
    assert by["3 replicas"]["ttft_p99"] <= 1.15 * by["1 replica"]["ttft_p99"]
    assert all(c["requests"] == 400 for c in doc["configs"])
    text = spoc("plan", "--twin", str(twin), "--trace", str(trace), "--replicas", "1,2", "--sla", "ttft_p99<=1s")
    assert text.returncode == 0 and "replica-h" in text.stdout
    assert "cheapest within the SLA" in text.stdout or "none of these meets the SLA" in text.stdout
    bad = spoc("plan", "--twin", str(twin), "--replicas", "2")
    assert bad.returncode == 2 and "--trace" in bad.stderr
    bad = spoc("plan", "--twin", str(twin), "--trace", str(trace), "--autoscale", "queue>=3")
    assert bad.returncode == 2 and "num_requests_waiting" in bad.stderr


def test_a_trace_replay_is_predicted_and_checked(known_twin, tmp_path):
    from spoc_tui.core.ramp.knee import FixedSpeeds
    from spoc_tui.core.traces.read import trace_source
    from tests.unit.test_twin_fleet import _mooncake

    trace = _mooncake(tmp_path / "mooncake.jsonl", n=60, rate=6.0)
    measured = measured_ramp(tmp_path, "chatbot", FixedSpeeds([1.0, 3.0]), "ttft_p99<=1s",
                             trace=trace_source(str(trace)))  # fmt: skip
    twin = known_twin
    c = spoc("twin", "check", "--twin", str(twin), "--ramp", str(measured), "--trace", str(trace), "--draws", "3",
             "--json")  # fmt: skip
    assert c.returncode in (0, 1), c.stderr
    doc = json.loads(c.stdout)
    assert [s["level"] for s in doc["steps"]] == ["x1", "x3"]
    med = doc["median_abs_error_pct"]
    # how close: benchmarks/twin_accuracy.py (a live simulator's timing on a shared host moves it)
    assert all(0 <= med[k] < float("inf") for k in ("itl_p50", "e2e_p50", "output_tokens_per_s")), med
    # the ramp keeps the trace's name, not its path: the check asks for the file, and for the same rows
    r = spoc("twin", "check", "--twin", str(twin), "--ramp", str(measured))
    assert r.returncode == 2 and "give it with --trace FILE" in r.stderr
    other = _mooncake(tmp_path / "other.jsonl", n=50)
    r = spoc("twin", "check", "--twin", str(twin), "--ramp", str(measured), "--trace", str(other))
    assert r.returncode == 2 and "not the trace it replayed" in r.stderr
    pred = tmp_path / "predicted"
    p = spoc("twin", "predict", "--twin", str(twin), "--trace", str(trace), "--speed", "1,3", "--sla", "ttft_p99<=1s",
             "--draws", "3", "--out", str(pred))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "knee across steps (predicted)" in p.stdout
    doc = json.loads((pred / "ramp.json").read_text())
    assert doc["predicted"] is True and doc["trace"]["rows"] == 60 and doc["knee"]["unit"] == "x"
    assert [s["speed"] for s in doc["steps"]] == [1.0, 3.0] and all(s["trace"]["sent"] == 60 for s in doc["steps"])
    shown = spoc("compare", str(measured), str(pred), "--json")
    assert shown.returncode == 0, shown.stderr
    r = spoc("twin", "predict", "--twin", str(twin), "--trace", str(trace), "--users", "4")
    assert r.returncode == 2 and "--speed" in r.stderr
    r = spoc("twin", "predict", "--twin", str(twin), "--speed", "2")
    assert r.returncode == 2 and "go with --trace FILE" in r.stderr


def test_the_shadow_twin_predicts_each_step_as_it_is_measured_and_the_check_reads_it(known_twin, tmp_path):
    """Issue 76, point 3: ``spoc ramp --twin``'s shadow twin keeps its prediction on each step of
    ramp.json, typed; ``spoc twin check`` reads those (nothing simulated) and they are the very
    figures it works out when told to simulate again; another twin's are not taken for its own."""
    from spoc_tui.core.ramp.knee import FixedUsers
    from spoc_tui.core.ramp.rules import StepRules
    from spoc_tui.core.ramp.sla import parse_sla
    from spoc_tui.core.results import read_ramp
    from spoc_tui.twin.model import read_twin, write_twin
    from spoc_tui.twin.shadow import ShadowTwin, twin_id
    from spoc_tui.workload import load_workload

    prof = tmp_path / "held-out.toml"
    prof.write_text(PROFILE)
    twin = read_twin(known_twin)
    sla = "ttft_p90<=2s"
    shadow = ShadowTwin(twin, twin_id(twin, known_twin), load_workload(str(prof)), tuple(parse_sla(sla)), draws=2,
                        rules=StepRules(step_s=5.0, warmup_s=1.0))  # fmt: skip
    measured = measured_ramp(tmp_path, str(prof), FixedUsers([2, 10]), sla, step_s=5, warmup_s=1, max_step_s=5,
                             shadow=shadow)  # fmt: skip
    steps = read_ramp(str(measured)).steps
    assert all(s.shadow is not None and s.shadow.twin == twin_id(twin, known_twin) for s in steps), steps
    assert all(s.shadow.draws == 2 and s.shadow.figures["itl_p50"] > 0 for s in steps if s.shadow)
    assert all({"ttft_p50", "itl_p90", "e2e_p50", "output_tokens_per_s"} <= set(s.shadow.intervals) for s in steps
               if s.shadow)  # fmt: skip
    read = spoc("twin", "check", "--twin", str(known_twin), "--ramp", str(measured), "--json")
    assert read.returncode in (0, 1), read.stderr
    doc = json.loads(read.stdout)
    assert doc["predictions"] == "shadow" and doc["draws"] == 2
    again = spoc("twin", "check", "--twin", str(known_twin), "--ramp", str(measured), "--json", "--resimulate",
                 "--draws", "2")  # fmt: skip
    redone = json.loads(again.stdout)
    assert redone["predictions"] == "simulated"
    assert [s["predicted"] for s in redone["steps"]] == [s["predicted"] for s in doc["steps"]]
    assert [s["interval"] for s in redone["steps"]] == [s["interval"] for s in doc["steps"]]
    # the report of a ramp run with a twin sets each figure beside the twin's (issue 76)
    report = spoc("report", str(measured), "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "r.html").read_text()
    assert f"The twin beside each step ({twin_id(twin, known_twin)}, predicted as the ramp ran)" in html
    assert "measured figures.</p>" in html and html.count('<td class="l">itl_p50</td>') == 2
    # a twin calibrated again under the same name is another twin: its prediction is worked out
    other = tmp_path / "twin.json"
    write_twin(replace(twin, step_cv=twin.step_cv + 0.01), other)
    mine = spoc("twin", "check", "--twin", str(other), "--ramp", str(measured), "--json", "--draws", "2")
    assert json.loads(mine.stdout)["predictions"] == "simulated"
