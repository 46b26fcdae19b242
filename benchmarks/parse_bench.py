"""Parse-and-derive speed against prometheus_client's parser, on the same text, in one run.

Target (issue 2): at least 3x faster than prometheus_client for a full vLLM capture and an
8-GPU dcgm capture. Prints figures and ratios; run with `make bench`.

Hostile bodies (issue 17): each parsed and reduced to the server view (what the monitor does per
scrape), with its time and the process's peak RSS growth: a metric name and 1 MB of blanks
(quadratic backtracking took 53 s for 100 KB before), a 10 MB label value (1.8 GB before),
a line of 100k labels, 8,000 engines (4 s before) and a 50 MB body with 648k engines (over
300 s before). Target: the 50 MB body within a few seconds, memory bounded (a few times the body).
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from spoc_tui.core.gpu import dcgm_gpus  # noqa: E402
from spoc_tui.core.presets import GPUS  # noqa: E402
from spoc_tui.core.promparse import _CACHE, parse_text  # noqa: E402
from spoc_tui.core.vllm import Scrape, server_view  # noqa: E402
from spoc_tui.sim.exposition import dcgm_metrics  # noqa: E402
from spoc_tui.sim.gpu import SimGpu  # noqa: E402

FIX = ROOT / "tests" / "fixtures"


def best_of(fn, repeat: int = 7, number: int = 20) -> float:
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


def hostile() -> None:
    engine_line = 'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n'
    hist = 'vllm:time_to_first_token_seconds_bucket{{engine="{i}",le="0.1",model_name="m"}} 3\n'
    many = "".join(engine_line.format(i=i) + hist.format(i=i) for i in range(8000))
    cases = [
        ("name + 1 MB of blanks", "vllm:x" + " " * 2**20 + "\n"),
        ("10 MB label value", 'vllm:num_requests_running{a="' + "v" * 10 * 2**20 + '"} 1\n'),
        (
            "100k labels on a line",
            "vllm:num_requests_running{" + ",".join(f'l{i}="v"' for i in range(100_000)) + "} 1\n",
        ),
        ("8,000 engines", many),
    ]
    big: list[str] = []
    size, i = 0, 0
    while size < 50 * 2**20:
        chunk = engine_line.format(i=i) + hist.format(i=i)
        big.append(chunk)
        size += len(chunk)
        i += 1
    cases.append((f"50 MB body, {i:,} engines", "".join(big)))
    del big
    print()
    print(f"{'hostile body':<32}{'MB':>7}{'parse+view':>12}{'peak RSS':>10}")
    for name, text in cases:
        base = rss_mb()
        t0 = time.perf_counter()
        server_view("x", Scrape(parse_text(text), 1.0))
        dt = time.perf_counter() - t0
        print(f"{name:<32}{len(text) / 2**20:>7.1f}{dt:>10.2f} s{max(0.0, rss_mb() - base):>7.0f} MB")
        _CACHE.clear()


if __name__ == "__main__":
    main()
    hostile()
