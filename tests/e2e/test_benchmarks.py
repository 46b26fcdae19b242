"""The benchmarks run in a short smoke mode, so none can rot unnoticed (their figures: make bench)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_knee_search_benchmark_smoke():
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "knee_search.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all cases: inference holds the truth" in r.stdout and "bisection" in r.stdout


def test_replay_memory_benchmark_smoke():
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "replay_memory.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "a load generator's replay share" in r.stdout and "meets the 300 MB target" in r.stdout


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ("parse_bench.py", "ratio = prometheus_client"),
        ("hostile_text.py", "ratio = old/new"),
        ("sim_bench.py", "H100 FP8 saturation output"),
        ("sim_speed.py", "its figures moved 0 % at most"),
        ("monitor_cpu.py", "a bare Textual app"),
        ("monitor_cpu.py --prometheus", "spoc monitor --prometheus over 16 replicas"),
        ("headroom_prometheus.py", "through Prometheus x"),
        ("load_fidelity.py", ""),
        ("trace_bench.py", "read back:"),
        ("tune_quality.py", "hypervolume reached"),
        ("tune_noise.py", ""),
        ("client_referee.py", ""),
        ("cli_startup.py", "spoc --help"),
        ("vs_peers_knee.py", "flat 1000 in / 200 out"),
        ("headroom.py", "live headroom vs the measured knee"),
        ("ledger.py", "predictions held"),
        ("watches.py", "monitor, 5 min: headroom"),
        ("headroom.py --cases=bursts", "told max-num-seqs 24: headroom"),  # beside the others, on a worker of its own
    ],
)
def test_every_benchmark_runs_in_its_smoke_mode(script, says):
    """Each benchmark's --smoke (a few seconds of what `make bench` runs for minutes): none can rot
    unnoticed. vs_vllm_bench.py needs the real vLLM: the real-engine tier runs its smoke."""
    name, *extra = script.split()
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *extra, "--smoke"],
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert says in r.stdout, r.stdout[-3000:]
    assert "Traceback" not in r.stderr


def test_the_headroom_benchmark_says_again_only_what_a_real_run_kept(tmp_path):
    """``--again=DIR`` reads a ``--real`` run's kept scrapes; a folder without them is refused
    with the reason and exit code 2, not a traceback."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "headroom.py"), f"--again={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{tmp_path / 'scrapes.jsonl'}: no such file" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "scrapes.jsonl").write_text('{"t": 5.0, "text": ""}\nnot json\n')
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "headroom.py"), f"--again={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "scrapes.jsonl, line 2: not a kept scrape" in r.stderr, r.stdout + r.stderr


def test_the_ledger_benchmark_grades_again_what_a_real_run_kept(tmp_path):
    """``ledger.py --again=DIR`` grades a ``--real`` run's kept scrapes again, minute by minute; a
    folder without them is refused with the reason and exit code 2."""
    import json

    from spoc_tui.sim.exposition import vllm_metrics
    from spoc_tui.sim.run import SimOptions, build
    from spoc_tui.sim.virtual import VirtualServer
    from spoc_tui.workload import load_workload

    def again() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "ledger.py"), f"--again={tmp_path}"],
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = again()
    assert r.returncode == 2 and f"{tmp_path / 'scrapes.jsonl'}: no such file" in r.stderr, r.stdout + r.stderr
    engine, _ = build(SimOptions(gpu="l40s", dcgm_port=None, seed=1))
    vs = VirtualServer(engine, load_workload("chatbot"), 0, seed=1)
    vs.set_rate(2.0)
    with (tmp_path / "scrapes.jsonl").open("w") as kept:
        for k in range(1, 37):  # three minutes, a scrape every 5 s
            vs.advance(5.0 * k)
            kept.write(json.dumps({"t": 5.0 * k, "text": vllm_metrics(vs.engine)}) + "\n")
    r = again()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "real vLLM CPU, windows alone, seed 1: predictions held" in r.stdout and "Traceback" not in r.stderr
    assert "calibrated twin" not in r.stdout  # no twin.json kept: the windows alone
    (tmp_path / "twin.json").write_text("{}")  # a twin that is not one: said, not a traceback
    r = again()
    assert r.returncode == 2 and f"--again: {tmp_path / 'twin.json'}:" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "twin.json").unlink()
    with (tmp_path / "scrapes.jsonl").open("a") as kept:
        kept.write('{"t": 185.0}\n')  # a line that is not a kept scrape
    r = again()
    assert r.returncode == 2 and "scrapes.jsonl, line 37: not a kept scrape" in r.stderr, r.stderr
