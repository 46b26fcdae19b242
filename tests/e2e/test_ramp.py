"""`spoc ramp` end to end against the simulator (short steps)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spoc_tui.core.ramp.knee import FixedUsers
from spoc_tui.procs.ports import free_ports
from spoc_tui.sim.process import start_sim

FAST = """
name = "fast"
system_tokens = 200
turns = 3
user_tokens = {dist = "uniform", min = 50, max = 300}
output_tokens = {dist = "uniform", min = 20, max = 80}
think_s = {dist = "uniform", min = 0.1, max = 0.4}
"""


@pytest.fixture(scope="module")
def sim8():
    port, dport = free_ports(2)
    proc = start_sim(["--gpu", "a100-40gb", "--max-num-seqs", "8", "--dcgm-port", str(dport)], port)
    yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{dport}/metrics"
    proc.stop()


@pytest.fixture()
def fast_profile(tmp_path):
    p = tmp_path / "fast.toml"
    p.write_text(FAST)
    return str(p)


def ramp(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "ramp", *args], capture_output=True, text=True, timeout=timeout
    )


def ramp_at_step_one(*args):
    """``spoc ramp`` started, its output read until its first step begins (to act on it mid-ramp)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "spoc_tui.cli", "ramp", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("step 1:"):
                break
    except BaseException:
        p.kill()
        raise
    return p


def test_ramp_finds_the_knee_and_records_both_views(sim8, fast_profile, tmp_path):
    url, dcgm = sim8
    out = tmp_path / "out"
    r = ramp(
        "--url",
        url,
        "--profile",
        fast_profile,
        "--users",
        "8,40",  # (a first step of 2 users spent 19 s reaching a conclusive p90; the knee needs none)
        "--step-seconds",
        "5",
        "--warmup-seconds",
        "1",
        "--sla",
        "ttft_p90<=500ms,itl_p90<=60ms",
        "--out",
        str(out),
        "--dcgm",
        dcgm,
        "--api-key",
        "sk-NEVER-WRITTEN",
    )
    assert r.returncode == 0, r.stderr
    assert "knee: 8 users meet the SLA; 40 break ttft_p90" in r.stdout
    assert "why: the batch is full: 8 running" in r.stdout  # the server-side reason, with its figures
    d = json.loads((out / "ramp.json").read_text())
    knee = d["knee"]
    assert (knee["max_users_within_sla"], knee["first_failing_users"], knee["broken_limit"]) == (8, 40, "ttft_p90")
    assert knee["reason"].startswith("the batch is full") and knee["cause"] == "batch_full"
    # the knee inferred across the steps lies in the bracket the decisions give, with its interval
    assert knee["boundary"] in ("smooth", "cliff") and knee["binding_limit"] in ("ttft_p90", "itl_p90")
    est, (lo, hi) = knee["estimate"], knee["ci95"]
    assert 8 <= est <= 40 and (lo is None or lo <= est) and (hi is None or est <= hi)
    assert "knee across steps: " in r.stdout and d["schema"] == 3
    assert d["sla"] == ["ttft_p90<=500ms", "itl_p90<=60ms"]
    # a short step may stay inconclusive (a p90 over a handful of requests); the last one broke
    assert d["steps"][-1]["verdict"]["decision"] == "breaks"
    for step in d["steps"]:  # every figure says how sure it is
        assert step["verdict"]["decision"] in ("meets", "breaks", "inconclusive")
        ttft = step["latency"]["ttft"]
        assert ttft["n"] == ttft["count"] > 0 and set(ttft["ci95"]) >= {"p50", "p90", "p99", "mean"}
        client = step["client"]  # the load generator watched itself through the window
        assert client["processes"]["main"]["cpu_pct"] is not None and client["loop_lag_p99_ms"] is not None
        assert isinstance(client["saturated"], bool)
        lo, hi = ttft["ci95"]["p90"]
        assert lo <= ttft["p90"] and (hi is None or ttft["p90"] <= hi)
        assert set(step["ci95"]) == {"request_rate", "output_tokens_per_s", "goodput", "error_rate"}
        assert step["verdict"]["checks"]["ttft_p90"]["ci95"] == ttft["ci95"]["p90"]
    last = d["steps"][-1]
    assert last["server"]["waiting_max"] > 0  # why the knee is there: requests queue behind 8 seats
    assert last["server"]["gpus"] and last["server"]["gpus"][0]["sm_clock_mhz"]
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) >= sum(s["requests"] for s in d["steps"])
    ok = [q for q in reqs if q["ok"]]
    assert ok and all(q["output_tokens"] and q["ttft"] and q["tpot"] is not None for q in ok if q["output_tokens"] > 1)
    assert any(q["turn"] > 0 for q in ok)  # multi-turn conversations
    assert all(q["request_id"].startswith("chatcmpl-") for q in ok)
    assert any((q["cached_tokens"] or 0) > 0 for q in ok)  # the shared system prompt and history hit the cache
    for f in out.iterdir():
        assert "sk-NEVER-WRITTEN" not in f.read_text(errors="replace")


def test_constant_prompt_lengths_are_exact_from_the_servers_tokenize(sim8, tmp_path):
    """No --tokenizer: the runner learns word counts from the server's /tokenize, so a constant
    200-token message is 200 tokens on the server (plus the simulator's 7 template tokens) every
    time, not a calibrated guess."""
    url, _ = sim8
    prof = tmp_path / "flat.toml"
    prof.write_text('name = "flat"\nsystem_tokens = 0\nturns = 1\nuser_tokens = 200\noutput_tokens = 4\nthink_s = 0\n')
    out = tmp_path / "out"
    r = ramp("--url", url, "--profile", str(prof), "--users", "2", "--step-seconds", "3", "--warmup-seconds", "0",
             "--sla", "ttft_p99<=60s", "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads((out / "ramp.json").read_text())
    assert d["prompt_lengths"] == "exact: the server's /tokenize"
    lengths = [json.loads(x)["prompt_tokens"] for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(lengths) > 5 and set(lengths) == {207}


BAD_ARGUMENTS = [
    (["--sla", "ttft<=1s"], "cannot parse SLA clause"),
    (["--users", "8,4"], "increasing"),
    (["--profile", "codin"], "built-in: agent, chatbot, coding, logs, mix"),
    (["--warmup-seconds", "6"], "--warmup-seconds"),
    (["--rate", "4,2"], "rates must be increasing"),
    (["--poll-seconds", "0.1"], "--poll-seconds must be between"),
    (["--rate", "0"], "above 0"),
    (["--rate", "fast"], "bad --rate"),
    (["--rate", "nan"], "above 0"),
    (["--rate", "2", "--users", "4"], "not both"),
    (["--trace-think", "scaled"], "--trace-think goes with --trace FILE"),
    (["--twin", "/nonexistent/twin.json"], "twin"),  # the shadow twin's file, read before any load
]


def bad_ramp(url: str, tmp_path, args: list[str]):
    base = {
        "--url": url,
        "--sla": "ttft_p99<=1s",
        "--out": str(tmp_path / "o"),
        "--step-seconds": "5",
        "--warmup-seconds": "1",
    }
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    r = ramp(*[x for kv in base.items() for x in kv])
    assert not (tmp_path / "o" / "requests.jsonl").exists()
    return r


@pytest.mark.parametrize("args,msg", BAD_ARGUMENTS)
def test_bad_arguments_are_refused_before_the_server_is_asked(tmp_path, args, msg):
    """A flag that cannot be right is refused before any request: no server is needed to say so
    (the URL here answers nothing; were it asked, the error would be 'cannot reach')."""
    (port,) = free_ports(1)
    r = bad_ramp(f"http://127.0.0.1:{port}", tmp_path, args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert msg in r.stderr and "Traceback" not in r.stderr and "cannot reach" not in r.stderr


def test_a_folder_that_cannot_be_written_is_refused_before_any_load(sim8, tmp_path):
    """Found once the server has answered (the folder takes the server's model in its header).
    What the server's answers settle (an unknown model, a failing probe, a wrong answer) is
    tests/unit/test_preflight.py's, on answers in memory; the exit codes are the same."""
    url, _ = sim8
    r = bad_ramp(url, tmp_path, ["--out", "/proc/spoc-o1"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot write there" in r.stderr and "Traceback" not in r.stderr


FLAT = """
name = "flat"
user_tokens = 1000
output_tokens = 200
ignore_eos = true
"""


def test_the_load_generators_users_start_staggered_or_together_as_asked(tmp_path):
    """What only real time shows of --arrivals: the load generator's users start spread out by
    default, and with lockstep every step restarts all its users at one instant, the earlier
    step's users too (as the peers start every stream of a probe), not only those it adds. The
    arrivals' measure, and that staggered users stay out of lockstep while lockstep ones stay in,
    is tests/unit/test_ramp_virtual.py's, on the virtual clock. (This test asserted that measure
    here, on 4 s windows; a clean-clone run's slow host held one round of the 16 users' 2 s turns
    in the lockstep step's, 16 arrivals, under the 20 the measure needs.)"""
    port, dport = free_ports(2)
    proc = start_sim(["--dcgm-port", str(dport)], port)
    flat = tmp_path / "flat.toml"
    flat.write_text(FLAT)
    try:
        for mode, users in (("staggered", "16"), ("lockstep", "4,16")):
            out = tmp_path / mode
            r = ramp(
                "--url", f"http://127.0.0.1:{port}", "--profile", str(flat), "--users", users, "--step-seconds", "6",
                "--warmup-seconds", "2", "--max-step-seconds", "6", "--sla", "ttft_p99<=5s", "--arrivals", mode,
                "--out", str(out),
            )  # fmt: skip
            assert r.returncode == 0, r.stderr
            d = json.loads((out / "ramp.json").read_text())
            assert d["arrivals"] == mode and all("arrivals" in s for s in d["steps"])
            # the last step's first request of each of its 16 users
            firsts: dict[str, float] = {}
            for rec in map(json.loads, (out / "requests.jsonl").read_text().splitlines()):
                if rec["step"] == len(d["steps"]):
                    user = rec["conversation"].split("#")[0]
                    firsts[user] = min(firsts.get(user, rec["start"]), rec["start"])
            assert len(firsts) == 16, firsts
            spread = max(firsts.values()) - min(firsts.values())
            if mode == "lockstep":  # all sent together (before, the first step's 4 users kept their phase)
                assert spread < 0.05, sorted(firsts.values())
            else:  # started over half the warm-up, each then waiting up to a second: a slow host spreads them more
                assert spread > 0.5, sorted(firsts.values())
    finally:
        proc.stop()


def test_open_loop_rates_are_poisson_and_the_knee_is_in_requests_per_second(sim8, fast_profile, tmp_path):
    """--rate: arrivals on their schedule whatever is in flight, the knee in requests/s. That the
    schedule is Poisson at the asked rate is tests/unit/test_open_loop_arrivals.py's, on a clock the
    test owns. Here only what a host's speed cannot move: the requests this run recorded have
    their schedule and none left before its time. (This test also asserted the recorded schedule's
    rate and gaps' cv, and a clean-clone run read a cv of 2.0 at 20 req/s. Past the knee only the
    requests that finished before the ramp ended are recorded: of the step's ~160 arrivals, those
    of its first 3-4 s, and a few later ones that finished early. How many depends on the host's
    speed, and the thinned tail spreads the gaps.)"""
    url, _ = sim8
    out = tmp_path / "out"
    r = ramp(
        "--url", url, "--profile", fast_profile, "--rate", "5,20", "--step-seconds", "7", "--warmup-seconds", "1",
        "--max-step-seconds", "7", "--sla", "ttft_p50<=2s", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads((out / "ramp.json").read_text())
    assert d["users"] == "rate:5,20" and d["load"].startswith("open loop")
    assert [s["rate"] for s in d["steps"]] == [5.0, 20.0]
    assert d["knee"]["unit"] == "req/s" and "max_rate_within_sla" in d["knee"]
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    for step in (1, 2):
        mine = [x for x in rows if x["step"] == step]
        assert mine and all(x["scheduled"] is not None for x in mine)
        assert all(x["start"] >= x["scheduled"] - 0.001 for x in mine)
    assert " 5/s " in r.stdout and "20/s" in r.stdout


def test_unreachable_server_exits_1(tmp_path):
    (port,) = free_ports(1)
    r = ramp("--url", f"http://127.0.0.1:{port}", "--sla", "ttft_p99<=1s", "--out", str(tmp_path / "o"))
    assert r.returncode == 1 and "cannot reach the server" in r.stderr


@pytest.mark.parametrize("lives_s", [0.0, 1.5])
def test_a_server_that_dies_mid_ramp_is_a_failure_not_a_pass(fast_profile, tmp_path, lives_s):
    """Refused connections are `connect` errors (Locust reports them as status 0), a step whose
    requests all fail ends the ramp with exit 1, and the users back off instead of hammering the
    dead port (hundreds of requests a second before). A server that dies a moment into the step
    (``lives_s``), having answered its first requests, is a failure too: the step's last requests
    all failed and none was answered after them (it read as a step that broke its SLA badly, and
    the ramp stopped early with exit 0: a CI run, 2026-12-08, and 9 of 9 runs dying 0.8-2.2 s in)."""
    port, dport = free_ports(2)
    sim = start_sim(["--dcgm-port", str(dport)], port)
    out = tmp_path / "out"
    p = ramp_at_step_one(
        "--url", f"http://127.0.0.1:{port}", "--profile", fast_profile, "--users", "4,8", "--step-seconds", "6",
        "--warmup-seconds", "2", "--max-step-seconds", "6", "--sla", "ttft_p99<=1s", "--out", str(out),
    )  # fmt: skip
    try:
        time.sleep(lives_s)
        sim.stop()
        _, err = p.communicate(timeout=120)
    finally:
        sim.stop()
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, err
    assert "the server failed" in err and "connect" in err
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    failed = [x for x in rows if not x["ok"]]
    assert failed and not any(x["error"] == "http_0xx" for x in failed)
    assert len(failed) < 100, len(failed)  # 4 users backing off 0.5, 1, 2, 4 s over ~6 s


def test_master_and_local_worker(sim8, fast_profile, tmp_path):
    """A master and a worker process; in lockstep the worker restarts its users together at each
    step (it does not know its share: it waits until its count of users settles)."""
    url, _ = sim8
    out = tmp_path / "out"
    r = ramp(
        "--url", url, "--profile", fast_profile, "--users", "2,4", "--step-seconds", "5", "--warmup-seconds", "1",
        "--max-step-seconds", "5", "--sla", "ttft_p99<=5s", "--out", str(out), "--workers", "1",
        "--arrivals", "lockstep",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads((out / "ramp.json").read_text())
    assert [s["users"] for s in d["steps"]] == [2, 4] and all(s["requests"] > 0 for s in d["steps"])
    firsts: dict[str, float] = {}
    for rec in map(json.loads, (out / "requests.jsonl").read_text().splitlines()):
        if rec["step"] == 2:
            user = rec["conversation"].split("#")[0]
            firsts[user] = min(firsts.get(user, rec["start"]), rec["start"])
    assert len(firsts) == 4 and max(firsts.values()) - min(firsts.values()) < 0.25, firsts


def _descendants(pid: int) -> list[tuple[int, str]]:
    """This run's own processes under ``pid`` (pid and command line), read from /proc."""
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        out += [(int(child), cmd), *_descendants(int(child))]
    return out


def test_a_worker_its_host_starves_for_seconds_stays_in_the_test(sim8, fast_profile, tmp_path):
    """Locust's master drops a worker after 3 missed heartbeats; with the last one it stopped the
    whole test, and every step after read 0 requests while the ramp passed. A worker stopped 6 s
    (SIGSTOP: what a starved host does to it) is kept, and the next step is measured on it."""
    url, _ = sim8
    out = tmp_path / "out"
    p = ramp_at_step_one(
        "--url", url, "--profile", fast_profile, "--users", "2,4", "--step-seconds", "5", "--warmup-seconds", "1",
        "--max-step-seconds", "5", "--sla", "ttft_p99<=5s", "--out", str(out), "--workers", "1",
    )  # fmt: skip
    try:
        (worker,) = [pid for pid, cmd in _descendants(p.pid) if " --worker" in cmd]
        os.kill(worker, signal.SIGSTOP)
        time.sleep(6)
        os.kill(worker, signal.SIGCONT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    d = json.loads((out / "ramp.json").read_text())
    assert [s["users"] for s in d["steps"]] == [2, 4] and d["steps"][1]["requests"] > 0, d["steps"]


def _keys(x, path=""):
    """Every key path of a JSON document (lists by their first item)."""
    if isinstance(x, dict):
        return {k for key, v in x.items() for k in {f"{path}.{key}", *_keys(v, f"{path}.{key}")}}
    if isinstance(x, list) and x:
        return _keys(x[0], path + "[]")
    return set()


def test_a_measured_and_a_predicted_ramp_differ_only_by_the_backend(sim8, fast_profile, tmp_path):
    """The same experiment through the one driver: over the live backend against the simulator's
    server, and over the virtual backend on the simulator's engine with the same flags. Both
    ramp.json files come from the same writer with the same keys, the same levels in the same
    order, and a verdict each; only the backend (its clock, where its figures come from) differs."""
    import asyncio

    from spoc_tui.core.ramp.experiment import Driver, run_now
    from spoc_tui.core.ramp.sla import parse_sla
    from spoc_tui.load.ramp import RampConfig, ResultWriter, ramp_header, run_ramp, spawn_rate
    from spoc_tui.sim.backend import VirtualBackend
    from spoc_tui.sim.options import SimOptions
    from spoc_tui.sim.run import build
    from spoc_tui.sim.virtual import VirtualServer
    from spoc_tui.workload import load_workload

    url, _ = sim8
    live_dir, virtual_dir = tmp_path / "live", tmp_path / "virtual"
    cfg = RampConfig(
        url,
        load_workload(fast_profile),
        FixedUsers([2, 6]),
        tuple(parse_sla("ttft_p90<=20s")),
        live_dir,
        step_s=6,
        warmup_s=1,
        max_step_s=6,
    )
    measured = asyncio.run(run_ramp(cfg))

    engine, _ = build(SimOptions(gpu="a100-40gb", max_num_seqs=8, dcgm_port=None))
    vs = VirtualServer(engine, cfg.workload, 0, seed=cfg.seed, paced=True)
    writer = ResultWriter(virtual_dir, ramp_header(cfg, measured.model, None), requests=False)
    try:
        driver = Driver(cfg.experiment(), VirtualBackend(vs, spawn_rate=lambda c: spawn_rate(cfg, c)), sink=writer)
        run_now(driver.run())
    finally:
        writer.close()

    live = json.loads((live_dir / "ramp.json").read_text())
    virtual = json.loads((virtual_dir / "ramp.json").read_text())
    # what only a live backend has: the load generator's own health, and how it made prompt lengths
    own = {".prompt_lengths"}

    def comparable(doc):
        return {k for k in _keys(doc) if k not in own and not k.startswith(".steps[].client.")}

    assert comparable(live) == comparable(virtual), comparable(live) ^ comparable(virtual)
    assert [s["users"] for s in live["steps"]] == [s["users"] for s in virtual["steps"]] == [2, 6]
    assert live["status"] == virtual["status"] == "complete" and measured.status == "complete"
    for doc in (live, virtual):  # both measured the steps and judged them against the same SLA
        assert all(s["requests"] > 0 and s["verdict"]["decision"] for s in doc["steps"])
        assert doc["sla"] == ["ttft_p90<=20s"]
