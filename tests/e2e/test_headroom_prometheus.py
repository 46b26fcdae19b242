"""The headroom through a real Prometheus (issue 75), as a user runs it: the history of two
simulated replicas (15 minutes, made on the virtual clock and loaded into the real Prometheus with
``promtool tsdb create-blocks-from openmetrics``) read by ``spoc inspect --prometheus URL --headroom
--since 15m --json``; ``spoc headroom --prometheus URL --serve-metrics`` scraped by the same
Prometheus, each replica's estimate and interval read back with PromQL; and the KEDA trigger ``spoc
plan --keda-headroom`` writes, evaluated by that Prometheus. (Whether each estimate holds the knee
measured on its replica: benchmarks/headroom.py --cases=prometheus.)"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.procs.group import stop_process_group
from spoc_tui.procs.ports import free_ports
from spoc_tui.sim.exposition import vllm_metrics
from spoc_tui.sim.history import write_openmetrics
from spoc_tui.sim.options import SimOptions
from spoc_tui.sim.run import build
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.workload import load_workload
from tests.realengine.conftest import guarded, start_prometheus

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
HISTORY_S = 900.0
SEATS = 16
RATES = {"gpu-a:8000": 1.0, "gpu-b:8000": 0.6}
"""Two replicas of a slow GPU (an L40S) at 16 seats: knees a few times their traffic, found in
few replays (the estimates' CPU is issue 73's)."""


def backfill(work: Path) -> Path:
    """15 minutes of both replicas scraped every 5 s, ending now, as Prometheus blocks."""
    end = time.time() - 5.0
    stored: dict[str, list] = {}
    servers = {}
    for i, (name, rate) in enumerate(RATES.items()):
        engine, _ = build(SimOptions(gpu="l40s", max_num_seqs=SEATS, dcgm_port=None, seed=i + 1))
        servers[name] = VirtualServer(engine, load_workload("chatbot"), 0, seed=i + 1)
        servers[name].set_rate(rate)
        stored[name] = []
    t = 0.0
    while t < HISTORY_S:
        t += 5.0
        for name, vs in servers.items():
            vs.advance(t)
            stored[name].append((end - HISTORY_S + t, parse_text(vllm_metrics(vs.engine))))
    om = work / "history.om"
    with om.open("w") as f:
        write_openmetrics(stored, f)
    blocks = work / "blocks"
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(promtool).exists():
        pytest.fail("promtool is not installed: run `bash scripts/realengine_setup.sh` (make test does)")
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks)], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    return blocks


def query(url: str, q: str) -> list[dict]:
    r = httpx.get(url + "/api/v1/query", params={"query": q}, timeout=10).json()
    assert r["status"] == "success", r
    return list(r["data"]["result"])


def test_a_fleets_headroom_from_prometheus_history_served_back_to_it_and_offered_to_keda(tmp_path):
    blocks = backfill(tmp_path)
    (port,) = free_ports(1)
    url, proc, work = start_prometheus({"spoc": [f"127.0.0.1:{port}"]}, blocks=blocks)
    spoc = [sys.executable, "-m", "spoc_tui.cli"]
    told = ["--max-num-seqs", str(SEATS), "--sla", "ttft_p99<=1s,itl_p99<=60ms"]  # knees of x2-x4: few replays
    serving = subprocess.Popen(
        [*guarded(), *spoc, "headroom", "--prometheus", url, "--since", "15m", "--serve-metrics", str(port), *told],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        t0 = time.monotonic()
        r = subprocess.run(
            [*spoc, "inspect", "--prometheus", url, "--headroom", "--since", "15m", "--json", *told],
            capture_output=True,
            text=True,
            timeout=300,
        )
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        got = {s["source"]: s["headroom"] for s in doc["servers"]}
        assert set(got) == set(RATES) and doc["history_s"] == HISTORY_S
        for name, h in got.items():
            lo, hi = h["ci95"]
            assert h["identified"] and lo <= h["estimate"] <= (hi if hi is not None else math.inf), (name, h)
            # the ledger: the newest windows of the history, each predicted on a fit of those before it
            ledger = h["ledger"]
            assert ledger["windows"] >= 3 and 0 <= ledger["held"] <= ledger["windows"], (name, ledger)
            assert set(ledger["by_metric"]) == {"ttft_p99", "itl_p99", "itl_mean"}, ledger
            print(name, ledger)
        weakest = min(got, key=lambda s: got[s]["estimate"])
        assert doc["fleet"]["replica"] == weakest and doc["fleet"]["headroom"] == got[weakest]
        # every scrape of the last 15 minutes (those the minute since the history ended pushed out aside)
        read = re.search(r"read (\d+) scrapes of 2 replica\(s\)", r.stderr)
        assert read and 2 * (HISTORY_S - 60) / 5 <= int(read.group(1)) <= 2 * HISTORY_S / 5, r.stderr
        print(f"spoc inspect --prometheus --headroom: {took:.0f} s; {[(n, h['estimate']) for n, h in got.items()]}")

        # spoc headroom, scraped by the same Prometheus: each replica's estimate and its interval
        rows: dict[tuple[str, str], float] = {}
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(rows) < 9 and serving.poll() is None:
            rows = {
                (s["metric"]["server"], s["metric"]["bound"]): float(s["value"][1])
                for s in query(url, "spoc_headroom_ratio")
            }
            time.sleep(1.0)
        assert len(rows) == 9, (rows, serving.poll())
        for name in [*RATES, "fleet"]:
            assert rows[(name, "ci95_low")] <= rows[(name, "estimate")] <= rows[(name, "ci95_high")], name
        assert rows[("fleet", "estimate")] == min(rows[(n, "estimate")] for n in RATES)

        # the KEDA trigger spoc plan writes: the replicas over the fleet's headroom, read against 1/1.3
        plan = subprocess.run(
            [*spoc, "plan", "--ramp", str(FIXTURES / "results" / "v1" / "users.ramp.json"), "--users", "100",
             "--keda-headroom", "1.3", "--prometheus", url, "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert plan.returncode == 0, plan.stderr
        trigger = yaml.safe_load(json.loads(plan.stdout)["keda_scaled_object"])["spec"]["triggers"][1]
        assert trigger["metadata"]["serverAddress"] == url
        (value,) = query(url, trigger["metadata"]["query"])
        assert float(value["value"][1]) == pytest.approx(2 / rows[("fleet", "estimate")], rel=1e-6)
        replicas = math.ceil(float(value["value"][1]) / float(trigger["metadata"]["threshold"]))
        assert replicas == math.ceil(2 * 1.3 / rows[("fleet", "estimate")] - 1e-9)
    finally:
        stop_process_group(serving)
        out = serving.stdout.read() if serving.stdout else ""
        stop_process_group(proc)
        shutil.rmtree(work, ignore_errors=True)
    assert "Traceback" not in out, out
    assert re.search(r"read \d+ scrapes of 2 vLLM replica\(s\) from the last 15 min", out), out
