"""The simulator's HTTP API, `spoc inspect` and the pollers, against a real server on loopback."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from spoc_tui.collectors.poller import VllmPoller
from spoc_tui.procs.ports import free_port, free_ports
from spoc_tui.sim.process import start_sim
from tests.leftovers import interruptible

FIX = Path(__file__).parents[1] / "fixtures"


@pytest.fixture(scope="module")
def sim():
    port, dport = free_ports(2)
    proc = start_sim(["--tp", "2", "--dcgm-port", str(dport), "--load-users", "8", "--speed", "1"], port)
    yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{dport}/metrics", port
    proc.stop()


def test_streaming_chat_with_exact_usage(sim):
    url, _, _ = sim
    body = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "hello there, how are you"}],
        "max_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chunks = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    usage = chunks[-1]["usage"]
    assert len(content) == 7 == usage["completion_tokens"]
    assert usage["prompt_tokens"] > 6
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_completions_non_streaming(sim):
    url, _, _ = sim
    r = httpx.post(url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 3, "ignore_eos": True}, timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    # A refusal over the wire: vLLM's error shape, as JSON with its status (each refusal's
    # rule is tests/unit/test_sim_api.py's, on the handlers).
    r = httpx.post(url + "/v1/chat/completions", json={"model": "other", "messages": []}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_inspect_json_against_sim(sim):
    url, durl, _ = sim
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "inspect", url, durl, "--interval", "1.5", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    (server,) = data["servers"]
    assert server["engine_version"] == "v1" and server["simulated"] is True
    assert server["latency"]["ttft"]["window"].endswith("s")
    assert len(data["gpus"]) == 2
    for key in ("temp_c", "sm_clock_mhz", "power_w", "power_limit_w", "throttle_reasons", "uuid", "hostname"):
        assert key in data["gpus"][0]


def test_inspect_headroom_watches_says_why_not_yet_and_keeps_what_it_saw_on_ctrl_c(sim):
    """`spoc inspect --headroom`: the report with each server's headroom in the issue's keys. A
    watch shorter than the passive fit's windows cannot identify the step time and says so, never
    a bare number; Ctrl-C ends a long watch early and still reports what it saw (exit 130). The
    figures themselves are the virtual-time tests' and benchmarks/headroom.py's."""
    url, durl, _ = sim
    argv = [sys.executable, "-m", "spoc_tui.cli", "inspect", url, durl, "--headroom", "--sla", "ttft_p99<=2s"]
    p = subprocess.Popen(
        [*argv, "--interval", "120", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,  # a suite started in the background would hand it SIGINT ignored
    )
    assert p.stderr is not None
    first = p.stderr.readline()  # said before the first scrape: the watch is under way
    assert "watching 2 source(s) for 120 s" in first, first
    time.sleep(6)  # a scrape or two
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, first + err
    data = json.loads(out)
    assert 0 < data["watched_s"] < 60
    (server,) = data["servers"]
    h = server["headroom"]
    assert set(h) >= {"estimate", "ci95", "unit", "binding_limit", "identified", "windows", "traffic", "reason"}
    assert h["unit"] == "x" and h["identified"] is False and h["estimate"] is None and h["reason"], h
    assert h["sla"] == ["ttft_p99<=2s"] and len(data["gpus"]) == 2
    assert "Traceback" not in err
    r = subprocess.run([*argv, "--interval", "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "headroom: " in r.stdout and "verdict: " in r.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--headroom", "--sla", "ttft_p99<=fast"], "cannot parse"),
        (["--headroom", "--interval", "0"], "--interval must be between 0 and 86400 seconds with --headroom"),
        (["--sla", "ttft_p99<=2s"], "--sla and --twin are for --headroom"),
        (["--headroom", "--twin", "/nonexistent/twin.json"], "twin"),
        (["--max-num-seqs", "48"], "--max-num-seqs is for --headroom"),
        (["--headroom", "--max-num-seqs", "0"], "--max-num-seqs must be between 1 and 65536, got 0"),
    ],
)
def test_inspect_headroom_refuses_bad_input_in_one_line(args, says):
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "inspect", "http://127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and r.stderr.startswith("spoc: error: ") and "Traceback" not in r.stderr, r.stderr


def test_inspect_bad_source_reports_others_and_exits_2(tmp_path):
    """A server that answers (here a capture), one that does not and a file that is not there:
    the good one is reported, each bad one in a line, exit 2."""
    url = str(FIX / "vllm/vllm_0.32_cpu_full_load.txt")
    bad = free_port()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoc_tui.cli",
            "inspect",
            url,
            f"http://127.0.0.1:{bad}",
            str(tmp_path / "nope.txt"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert len(json.loads(r.stdout)["servers"]) == 1
    errs = r.stderr.strip().splitlines()
    assert len(errs) == 2 and "cannot connect" in errs[0] and "no such file" in errs[1]
    assert "Traceback" not in r.stderr


def test_inspect_file_text_mode():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoc_tui.cli",
            "inspect",
            str(FIX / "vllm/vllm_0.32_cpu_full_load.txt"),
            str(FIX / "dcgm/dcgm_sample_02.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "engine v1" in r.stdout and "latency over lifetime" in r.stdout and "GPU 0 Tesla V100" in r.stdout


def test_api_key_never_printed():
    url = str(FIX / "vllm/vllm_0.32_cpu_full_load.txt")
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "inspect", url, "http://127.0.0.1:1", "--api-key", "sk-SECRET-123"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "sk-SECRET-123" not in r.stdout + r.stderr


async def test_poller_goes_stale_and_recovers():
    """A server that stops answering: its last data is kept and marked stale, it is not retried
    while it backs off, and its return is seen. The monitor's own client over in-memory
    connections on a clock the test owns (the back-off's rule is the subject, not a socket; a
    server refusing at once is retried every poll instead: tests/e2e/test_hostile_values.py's)."""
    from tests.e2e.test_light_http import Switchable

    # a host that drops the attempt when down: a failure that costs time backs off
    now = [0.0]
    server = Switchable((FIX / "vllm" / "vllm_0.32_cpu_full_load.txt").read_bytes(), down_cost_s=0.3, clock=now)
    url = "http://gpu-a:8000"
    poller = VllmPoller([url], window_s=5, clock=lambda: now[0], client=server.client())
    try:
        t1 = await poller.poll()
        assert t1.servers and not t1.stale and t1.changes[0].up
        server.up = False
        now[0] += 1
        t2 = await poller.poll()
        assert t2.stale and not t2.changes[0].up and t2.servers  # last data kept
        now[0] += 0.5
        before = server.tried
        t3 = await poller.poll()  # still backing off: not retried, no new change
        assert t3.changes == () and t3.stale and server.tried == before
        server.up = True
        now[0] += 30
        t4 = await poller.poll()
        assert not t4.stale and t4.changes and t4.changes[0].up
    finally:
        await poller.aclose()


def test_simulator_exits_when_its_parent_is_killed(tmp_path):
    """`spoc demo` killed by SIGKILL (SSH drop) must not leave a simulator behind."""
    import os
    import signal
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[2])!r})\n"
        "from spoc_tui.procs.ports import free_ports\n"
        "from spoc_tui.sim.process import start_sim\n"
        "p, d = free_ports(2)\n"
        "proc = start_sim(['--dcgm-port', str(d)], p)\n"
        "print(proc.proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(child, signal.SIGKILL)
    raise AssertionError("simulator outlived its parent")


def test_simulator_serves_replicas_one_port_each_and_one_lags():
    from spoc_tui.core.hardware.gpu import dcgm_gpus
    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.procs.ports import free_block

    port, dport = free_block(2), free_block(2)
    proc = start_sim(
        ["--scenario", "imbalanced", "--replicas", "2", "--load-users", "4", "--dcgm-port", str(dport)], port
    )
    try:
        models = []
        for i in range(2):
            assert httpx.get(f"http://127.0.0.1:{port + i}/health", timeout=5).status_code == 200
            assert "vllm:num_requests_running" in httpx.get(f"http://127.0.0.1:{port + i}/metrics", timeout=5).text
            (g,) = dcgm_gpus(parse_text(httpx.get(f"http://127.0.0.1:{dport + i}/metrics", timeout=5).text), "d")
            models.append((g.model, g.hostname))
        assert models == [("NVIDIA H100 80GB HBM3", "spoc-sim-0"), ("NVIDIA L40S", "spoc-sim-1")]
    finally:
        proc.stop()


def test_simulator_replica_options_are_checked():
    for args, msg in (
        (["--scenario", "imbalanced", "--replicas", "1"], "2 replicas or more"),
        (["--replicas", "99"], "between 1 and 16"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "spoc_tui.cli", "sim", *args, "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_truth_log_has_engine_and_wire_times(tmp_path):
    """The benchmarks' referee: per request, when each token left the engine and (streams) when its
    event was written to the socket, on the monotonic clock clients stamp with."""
    port, dport = free_ports(2)
    truth = tmp_path / "truth.jsonl"
    proc = start_sim(["--dcgm-port", str(dport), "--truth-log", str(truth)], port)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        msgs = [{"role": "user", "content": "hello there"}]
        with httpx.stream(
            "POST", url, json={"messages": msgs, "max_tokens": 5, "stream": True, "ignore_eos": True}, timeout=10
        ) as r:
            ids = {json.loads(x[6:])["id"] for x in r.iter_lines() if x.startswith("data: {")}
        plain = httpx.post(url, json={"messages": msgs, "max_tokens": 3, "ignore_eos": True}, timeout=10).json()
    finally:
        proc.stop()
    recs = {d["id"]: d for d in map(json.loads, truth.read_text().splitlines())}
    (sid,) = ids
    s = recs[sid]
    assert len(s["tokens"]) == len(s["sent"]) == 5
    assert s["arrival"] <= s["tokens"][0]
    assert all(t <= w for t, w in zip(s["tokens"], s["sent"], strict=True))
    assert s["sent"] == sorted(s["sent"])
    p = recs[plain["id"]]
    assert len(p["tokens"]) == 3 and "sent" not in p


def test_a_client_leaving_mid_stream_is_aborted_without_a_traceback(tmp_path):
    """As vLLM does: a client that goes away mid-answer frees its seat (no phantom load after it)
    and the request counts as aborted. A ramp's users stopping (or a trial ending) close their
    streams so, on both endpoints; the simulator's log (the Tune screen's server-log pane) gets
    no traceback."""
    import socket
    import time

    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.procs.server import ServerProcess
    from spoc_tui.sim.process import sim_argv

    port, dport = free_ports(2)
    log = tmp_path / "server.log"
    server = ServerProcess(sim_argv(["--dcgm-port", str(dport)], port), port, log, guard=True, tmp_prefix="spoc-sim-")
    server.start(timeout=20, poll=0.2)
    model = "meta-llama/Llama-3.1-8B-Instruct"
    try:
        bodies = [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 20000}),
            ("/v1/completions", {"model": model, "prompt": "hello", "max_tokens": 4000}),
            ("/v1/completions", {"model": model, "prompt": "hello again", "max_tokens": 4000}),
        ]
        for path, fields in bodies:
            body = json.dumps({**fields, "ignore_eos": True, "stream": True}).encode()
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            got = b""
            while b"data: " not in got:  # streaming
                chunk = s.recv(4096)
                assert chunk, got
                got += chunk
            s.close()  # gone mid-answer
        aborted = (("engine", "0"), ("finished_reason", "abort"), ("model_name", model))
        deadline = time.monotonic() + 10
        running = n_aborted = None
        while time.monotonic() < deadline:
            m = parse_text(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
            (running,) = m.get("vllm:num_requests_running").values()
            n_aborted = m.get("vllm:request_success_total").get(aborted, 0)
            if running == 0 and n_aborted == 3:
                break
            time.sleep(0.2)
        # the abandoned requests were aborted, not left decoding thousands of tokens
        assert (running, n_aborted) == (0, 3)
    finally:
        server.stop()
    out = log.read_text()
    assert "Traceback" not in out and "Error handling request" not in out, out


def test_stop_signals_in_a_burst_leave_no_traceback_in_the_log(tmp_path):
    """Stopping a trial's server sends the process group SIGTERM and the guard forwards it: a
    second signal used to land while the loop closed its wakeup pipe, and Python printed
    "Exception ignored ... Bad file descriptor" with a traceback into the server's log (2 of 10
    stops under a burst). Now the first stop signal is the only one handled."""
    import os
    import signal
    import time

    from spoc_tui.procs.server import ServerProcess
    from spoc_tui.sim.process import sim_argv

    for i in range(4):
        port, dport = free_ports(2)
        log = tmp_path / f"server{i}.log"
        # guarded, as a study's servers are (the burst reaches the guard and the simulator both): and
        # a test process killed mid-test (a suite stopped) leaves no simulator behind
        server = ServerProcess(
            sim_argv(["--dcgm-port", str(dport)], port), port, log, guard=True, tmp_prefix="spoc-sim-"
        )
        server.start(timeout=20, poll=0.2)
        assert server.proc is not None
        try:
            end = time.monotonic() + 0.5
            while time.monotonic() < end and server.proc.poll() is None:
                os.killpg(server.proc.pid, signal.SIGTERM)
                time.sleep(0.0005)
            server.proc.wait(10)
        except ProcessLookupError:
            pass
        finally:
            server.stop()
        out = log.read_text()
        assert "Traceback" not in out and "Exception ignored" not in out, out


def test_spoc_headroom_serves_each_servers_series_from_its_first_scrape_and_stops_on_sigterm(sim):
    """Issue 75, point 2: ``spoc headroom --serve-metrics`` (no terminal) serves the headroom as
    Prometheus metrics: from the first scrape each server's series exist (no number yet, and
    why); SIGTERM ends it and frees the port. Bad addresses and a taken port are one line, exit 2.
    The series against the real Prometheus: tests/realengine/test_fleet_real.py."""
    url, _, _ = sim
    port = free_port()
    argv = [sys.executable, "-m", "spoc_tui.cli", "headroom", "--url", url, "--every", "1"]
    p = subprocess.Popen([*argv, "--serve-metrics", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)  # fmt: skip
    try:
        assert p.stdout is not None
        first = p.stdout.readline()
        assert first.startswith(f"serving the headroom of 1 server(s) at http://127.0.0.1:{port}/metrics"), first
        text = ""
        for _ in range(50):
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            if "spoc_headroom_identified{" in text:
                break
            time.sleep(0.2)
        assert f'spoc_headroom_identified{{server="{url}"}} 0.0' in text, text
        assert 'reason="learning from the scrapes"' in text and "spoc_headroom_ratio{" not in text
        taken = subprocess.run([*argv, "--serve-metrics", str(port)], capture_output=True, text=True, timeout=60)
        assert taken.returncode == 2 and taken.stderr.startswith(
            f"spoc: error: --serve-metrics 127.0.0.1:{port}: cannot listen"
        )
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "Traceback" not in err, err
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    bad = subprocess.run([*argv, "--serve-metrics", "gpu-a:9"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "spoc: error: --serve-metrics 'gpu-a:9': 'gpu-a' is not an IP address (or localhost)"
    ]
