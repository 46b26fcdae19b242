"""Parse-and-derive speed against prometheus_client's parser, on the same text, in one run.

Target (issue 2): at least 3x faster than prometheus_client for a full vLLM capture and an
8-GPU dcgm capture. Prints figures and ratios; run with `make bench`.

``--smoke`` (make test): one short round and the two smallest hostile bodies.

Hostile bodies (issue 17): each parsed and reduced to the server view (what the monitor does per
scrape), with its time and the process's peak RSS growth: a metric name and 1 MB of blanks
(quadratic backtracking took 53 s for 100 KB before), a 10 MB label value (1.8 GB before),
a line of 100k labels, 8,000 engines (4 s before) and a 50 MB body with 648k engines (over
300 s before). A body of more than 200,000 lines is refused before parsing (Prometheus'
sample_limit); one at the limit is parsed and reduced. Target: every case within a few seconds,
memory bounded.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from spoc_tui.core.hardware.gpu import dcgm_gpus  # noqa: E402
from spoc_tui.core.hardware.presets import GPUS  # noqa: E402
from spoc_tui.core.metrics.promparse import _CACHE, TooLarge, check_size, parse_text  # noqa: E402
from spoc_tui.core.metrics.vllm import Scrape, server_view  # noqa: E402
from spoc_tui.sim.exposition import dcgm_metrics  # noqa: E402
from spoc_tui.sim.gpu import SimGpu  # noqa: E402

FIX = ROOT / "tests" / "fixtures"
SMOKE = "--smoke" in sys.argv
"""make test runs it so (that the script runs, not its figures): one short round, the small bodies."""


def best_of(fn, repeat: int = 7, number: int = 20) -> float:
    if SMOKE:
        repeat, number = 1, 2
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def prom_client(text: str) -> int:
    n = 0
    for fam in text_string_to_metric_families(text):
        n += len(fam.samples)
    return n


def main() -> None:
    vllm_text = (FIX / "vllm" / "vllm_0.32_cpu_full_load.txt").read_text()
    # an 8-GPU dcgm-exporter body in the exporter's own format (fields, labels, value styles)
    dcgm_text = dcgm_metrics([SimGpu(i, GPUS["h100-80gb"]) for i in range(8)], "node-a")
    cases = [
        ("vLLM 0.32 full /metrics", vllm_text, lambda t: server_view("x", Scrape(parse_text(t), 1.0))),
        ("dcgm-exporter, 8 GPUs", dcgm_text, lambda t: dcgm_gpus(parse_text(t), "x")),
    ]
    print(
        f"{'input':<26}{'bytes':>8}{'prometheus_client':>20}{'spoc parse':>13}{'parse+derive':>15}{'ratio':>7}{'cold cache':>13}{'ratio':>7}"
    )
    for name, text, derive in cases:
        theirs = best_of(lambda text=text: prom_client(text))
        ours_parse = best_of(lambda text=text: parse_text(text))
        ours_all = best_of(lambda text=text, derive=derive: derive(text))

        def cold(text=text, derive=derive) -> None:
            _CACHE.clear()
            derive(text)

        ours_cold = best_of(cold)
        print(
            f"{name:<26}{len(text):>8}{theirs * 1e3:>17.2f} ms{ours_parse * 1e3:>10.2f} ms{ours_all * 1e3:>12.2f} ms"
            f"{theirs / ours_all:>6.1f}x{ours_cold * 1e3:>10.2f} ms{theirs / ours_cold:>6.1f}x"
        )
    print("ratio = prometheus_client (parse only) / spoc (parse + derive the whole view); target >= 3x.")
    print("A live monitor sees the same label sets every scrape, so the warm label cache is the steady state;")
    print("'cold cache' clears it before every parse (the first scrape of a server).")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def engines_text(n: int) -> str:
    engine_line = 'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n'
    hist = 'vllm:time_to_first_token_seconds_bucket{{engine="{i}",le="0.1",model_name="m"}} 3\n'
    return "".join(engine_line.format(i=i) + hist.format(i=i) for i in range(n))


def hostile() -> None:
    """What the monitor does with each body (size check, parse, the server view), smallest first;
    peak RSS is the process's high-water mark after the case."""
    cases = [
        ("name + 1 MB of blanks", lambda: "vllm:x" + " " * 2**20 + "\n"),
        ("100k labels on a line", lambda: "vllm:x{" + ",".join(f'l{i}="v"' for i in range(100_000)) + "} 1\n"),
        ("10 MB label value", lambda: 'vllm:num_requests_running{a="' + "v" * 10 * 2**20 + '"} 1\n'),
        ("8,000 engines", lambda: engines_text(8000)),
        ("200,000 lines, 100,000 engines", lambda: engines_text(100_000)),
        ("50 MB body, 368,000 engines", lambda: engines_text(368_000)),
    ]
    if SMOKE:
        cases = cases[:2]
    print()
    print(f"{'hostile body':<34}{'MB':>7}{'check+parse+view':>18}{'peak RSS':>10}  result")
    for name, make in cases:
        text = make()
        t0 = time.perf_counter()
        try:
            check_size(text)
            view = server_view("x", Scrape(parse_text(text), 1.0))
            result = f"{len(view.engines)} engine rows"
        except TooLarge as e:
            result = f"refused: {e}"
        dt = time.perf_counter() - t0
        print(f"{name:<34}{len(text) / 2**20:>7.1f}{dt:>16.2f} s{rss_mb():>7.0f} MB  {result}")
        del text
        _CACHE.clear()


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    main()
    hostile()
