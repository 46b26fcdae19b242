"""`spoc report`: one self-contained HTML page for a ramp, a study and a comparison, each opened in
a real headless browser (Debian's Chromium) and screenshotted, with every request the page might
make sent to a recording proxy: there must be none."""

import http.server
import json
import random
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spoc_tui.core.ramp.inference import infer_knee
from spoc_tui.core.ramp.knee import find_knee
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import RequestSample, summarize_step
from spoc_tui.core.results import RampHeader, encode_ramp

LIMITS = parse_sla("ttft_p90<=500ms")


def write_ramp(folder: Path, slope: float, url: str = "http://admin:hunter2@gpu-a:8000") -> None:
    """A ramp whose TTFT grows with the users (slope s per user), four levels."""
    rng = random.Random(int(slope * 1000))
    steps, windows = [], []
    for i, users in enumerate((2, 4, 8, 16), 1):
        samples = [
            RequestSample(start=100.0 + k * 0.1, end=100.5 + k * 0.1, step=i, users=users, ok=True,
                          ttft=slope * users * rng.uniform(0.5, 1.5), e2e=1.0, output_tokens=50)
            for k in range(200)
        ]  # fmt: skip
        steps.append(summarize_step(i, users, samples, 20.0, LIMITS))
        windows.append((float(users), samples))
    knee = find_knee(steps, infer_knee(windows, LIMITS, "users"))
    folder.mkdir(parents=True)
    header = RampHeader(url=url, model="tiny", sla=("ttft_p90<=500ms",), users="2,4,8,16")
    doc = {**json.loads(encode_ramp(header, steps, knee, "complete", 0.0)), "schema": 2}
    (folder / "ramp.json").write_text(json.dumps(doc))


def write_study(folder: Path) -> None:
    folder.mkdir(parents=True)
    objectives = [{"name": "out_tok_s", "direction": "max", "label": "output tokens/s"},
                  {"name": "ttft_p99", "direction": "min", "label": "TTFT p99"}]  # fmt: skip
    trials, front = [], []
    for n in range(8):
        cfg = {"max-num-seqs": 16 * (n + 1)}
        obj = {"out_tok_s": 300.0 + 40 * n, "ttft_p99": 0.05 + 0.03 * n * n}
        rec = {"schema": 2, "number": n, "status": "ok", "config": cfg, "flags": ["--max-num-seqs", str(16 * (n + 1))],
               "objectives": obj, "feasible": n < 6, "reason": "" if n < 6 else "ttft_p99 over the SLA"}  # fmt: skip
        trials.append(rec)
        if n in (2, 5):
            front.append({**rec, "status": "confirmed", "runs": 1, "command": "vllm serve m --api-key sk-SECRET123",
                          "ci95": {"out_tok_s": [obj["out_tok_s"] - 20, obj["out_tok_s"] + 20],
                                   "ttft_p99": [obj["ttft_p99"] * 0.8, obj["ttft_p99"] * 1.2]}})  # fmt: skip
    pareto = {"schema": 2, "status": "complete", "study": "s", "objectives": objectives, "sla": ["ttft_p99<=2s"],
              "trials_run": 8, "feasible": 6, "infeasible": 2, "hypervolume": 12.5, "pareto": front}  # fmt: skip
    (folder / "pareto.json").write_text(json.dumps(pareto))
    (folder / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials))


BROWSER_SERVICES = re.compile(r"(^|[./])(google\.com|googleapis\.com|gvt1\.com|gstatic\.com)(:\d+)?(/|$)")
"""Chromium's own background traffic, which no flag stops entirely."""


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self):
        Recorder.seen.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_CONNECT = do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def proxy():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


def spoc(*args):
    return subprocess.run([sys.executable, "-m", "spoc_tui.cli", *args], capture_output=True, text=True, timeout=60)


def open_in_chromium(page: Path, shot: Path, proxy_port: int) -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "Chromium is missing: make test installs Debian's (scripts/realengine_setup.sh)"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
              f"--proxy-server=http://127.0.0.1:{proxy_port}", "--proxy-bypass-list=<-loopback>",
              f"--user-data-dir={shot.parent / 'chromium-profile'}",
              # the browser's own traffic (updates, safe browsing, metrics) off: what reaches the
              # recording proxy can then only come from the page
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-default-apps", "--no-pings", "--disable-domain-reliability",
              "--disable-client-side-phishing-detection", "--disable-features=OptimizationHints,MediaRouter",
              "--metrics-recording-only"]  # fmt: skip
    r = subprocess.run([*common, f"--screenshot={shot}", "--window-size=1200,1800", page.as_uri()],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 20_000, r.stderr[-2000:]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    return dom.stdout


def check_page(html: str) -> None:
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    low = html.lower()
    for needle in ("<script", "src=", "href=", "url(", "@import"):
        assert needle not in low, needle
    assert "hunter2" not in html and "sk-SECRET123" not in html  # the one redactor ran on every text


def test_a_ramp_a_study_and_a_comparison_render_offline_in_a_browser(tmp_path, proxy):
    write_ramp(tmp_path / "a", slope=0.03)
    write_ramp(tmp_path / "b", slope=0.02)
    write_study(tmp_path / "study")
    cases = [
        (["report", str(tmp_path / "a")], tmp_path / "a" / "report.html", "ttft_p90.svg", "Knee across steps"),
        (["report", str(tmp_path / "study")], tmp_path / "study" / "report.html", "pareto.svg", "Pareto set"),
        (["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp.html")],
         tmp_path / "cmp.html", "compare-ttft_p90.svg", "B against A"),
    ]  # fmt: skip
    for argv, page, chart, says in cases:
        r = spoc(*argv)
        assert r.returncode == 0, r.stderr
        html = page.read_text()
        check_page(html)
        assert says in html and (page.with_name(page.stem + "-charts") / chart).exists()
        dom = open_in_chromium(page, tmp_path / f"{page.parent.name}-{page.stem}.png", proxy)
        assert says in dom and "<svg" in dom  # the browser parsed and laid the page out
    # what reached the proxy: the browser's own services (its updater, clock and account checks
    # still call Google with every flag off), and nothing else: not one request came from a page
    from_pages = [u for u in Recorder.seen if not BROWSER_SERVICES.search(u.split("?")[0])]
    assert from_pages == [], from_pages


def test_bad_paths_are_refused(tmp_path):
    r = spoc("report", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no such file or folder" in r.stderr
    (tmp_path / "empty").mkdir()
    r = spoc("report", str(tmp_path / "empty"))
    assert r.returncode == 2 and "neither a ramp" in r.stderr
    r = spoc("report", "a", "b", "c")
    assert r.returncode == 2 and "two ramps" in r.stderr


def test_a_page_written_to_a_pipe_or_a_device_leaves_it_one_and_writes_no_chart_folder_beside_it(tmp_path):
    write_ramp(tmp_path / "a", slope=0.03)
    null = tmp_path / "null"
    null.symlink_to("/dev/null")  # as /dev/stdout is a link to the terminal
    r = spoc("report", str(tmp_path / "a"), "--out", str(null))
    assert r.returncode == 0 and "no chart files (--out is not a file)" in r.stderr, r.stderr
    assert null.is_symlink() and not (tmp_path / "null-charts").exists()
