import math
from pathlib import Path

import pytest

from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.core.metrics.stats import Histogram, bucket_quantile, merge_histograms
from spoc_tui.core.metrics.vllm import Scrape, engine_version, replicas_view, server_view

FIX = Path(__file__).parents[1] / "fixtures" / "vllm"


def view(name, then=None, dt=60.0):
    now = parse_text((FIX / name).read_text())
    prev = parse_text((FIX / then).read_text()) if then else None
    return server_view(name, Scrape(now, 100.0 + dt, prev, 100.0 if prev else None))


@pytest.mark.parametrize(
    "name,version",
    [
        ("vllm_sample_01.txt", "v0"),
        ("vllm_sample_04.txt", "v0"),
        ("vllm_sample_06.txt", "v1"),
        ("vllm_sample_07.txt", "v1"),
        ("vllm_sample_11.txt", "v0"),
        ("vllm_0.32_cpu_full_load.txt", "v1"),
    ],
)
def test_engine_version(name, version):
    assert engine_version(parse_text((FIX / name).read_text())) == version


def test_full_capture_figures():
    v = view("vllm_0.32_cpu_full_load.txt")
    t = v.total
    assert v.model_names == ("tiny",)
    assert t.running == 16 and t.waiting == 0
    assert 0 < t.kv_cache_usage < 0.01
    assert t.latency["ttft"].window == "lifetime"
    assert t.latency["ttft"].count == 144
    assert 0 < t.latency["ttft"].p50 < t.latency["ttft"].p99
    assert v.cache_config["kv_cache_size_tokens"] == "524288"
    assert [e.engine for e in v.engines] == ["0"]


def test_missing_metrics_are_none_not_zero():
    v = view("vllm_sample_01.txt")
    assert v.total.running is None
    assert v.total.kv_cache_usage is None
    assert v.total.latency["e2e"].p99 is None


def test_old_itl_name_is_read():
    # time_per_output_token_seconds is the pre-0.10.2 ITL
    text = (
        "".join(
            f'vllm:time_per_output_token_seconds_bucket{{le="{le}",model_name="m"}} {c}\n'
            for le, c in (("0.01", 5.0), ("0.025", 9.0), ("+Inf", 10.0))
        )
        + 'vllm:time_per_output_token_seconds_count{model_name="m"} 10.0\n'
    )
    v = server_view("x", Scrape(parse_text(text), 1.0))
    assert v.total.latency["itl"].count == 10
    assert 0.01 < v.total.latency["itl"].p90 <= 0.025


def test_truncated_excerpt_histogram_reads_na():
    v = view("vllm_sample_04.txt")  # the TPOT histogram was cut off before +Inf
    assert v.total.latency["itl"].p99 is None
    assert v.total.latency["ttft"].count == 1  # TTFT is complete (one gap inside, +Inf present)


def test_windowed_percentiles_use_bucket_differences():
    v = view("vllm_0.32_cpu_full_load.txt", then="vllm_0.32_cpu_full_idle.txt", dt=30)
    idle = view("vllm_0.32_cpu_full_idle.txt")
    assert v.total.latency["ttft"].window == "30s"
    assert v.total.latency["ttft"].count == 144 - (idle.total.latency["ttft"].count or 0)
    assert v.total.generation_tokens_rate > 0


def test_window_with_no_new_requests_is_na():
    v = view("vllm_0.32_cpu_full_load.txt", then="vllm_0.32_cpu_full_load.txt")
    L = v.total.latency["ttft"]
    assert L.count == 0 and L.p99 is None and L.mean is None


def test_counter_reset_counts_from_zero():
    a = parse_text('vllm:generation_tokens_total{engine="0",model_name="m"} 1000\n')
    b = parse_text('vllm:generation_tokens_total{engine="0",model_name="m"} 50\n')
    v = server_view("x", Scrape(b, 10.0, a, 0.0))
    assert v.total.generation_tokens_rate == pytest.approx(5.0)


def test_engines_merged_before_quantile():
    def exp(engine_counts):
        lines = []
        for eng, (c1, c2) in engine_counts.items():
            lines += [
                f'vllm:time_to_first_token_seconds_bucket{{engine="{eng}",le="0.1",model_name="m"}} {c1}',
                f'vllm:time_to_first_token_seconds_bucket{{engine="{eng}",le="1.0",model_name="m"}} {c1 + c2}',
                f'vllm:time_to_first_token_seconds_bucket{{engine="{eng}",le="+Inf",model_name="m"}} {c1 + c2}',
                f'vllm:time_to_first_token_seconds_count{{engine="{eng}",model_name="m"}} {c1 + c2}',
                f'vllm:time_to_first_token_seconds_sum{{engine="{eng}",model_name="m"}} 1',
            ]
        return parse_text("\n".join(lines) + "\n")

    v = server_view("x", Scrape(exp({"0": (90, 0), "1": (0, 10)}), 1.0))
    # 100 requests: 90 fast, 10 slow; p50 is in the fast bucket (averaging per-engine p50s would not be)
    assert v.total.latency["ttft"].p50 < 0.1
    assert len(v.engines) == 2
    assert v.engines[1].latency["ttft"].p50 > 0.1


def test_replicas_merge():
    a = parse_text((FIX / "vllm_0.32_cpu_full_load.txt").read_text())
    total = replicas_view([Scrape(a, 1.0), Scrape(a, 1.0)])
    assert total.running == 32
    assert total.latency["ttft"].count == 288


def test_quantile_matches_promql_semantics():
    # histogram_quantile(0.5) of buckets 0.1:10, 0.2:20, +Inf:20 -> 0.1 + 0.1*(10-10)/10 = 0.1
    assert bucket_quantile(0.5, (0.1, 0.2, float("inf")), (10, 20, 20)) == pytest.approx(0.1)
    assert bucket_quantile(0.75, (0.1, 0.2, float("inf")), (10, 20, 20)) == pytest.approx(0.15)
    # rank in +Inf bucket returns the highest finite bound
    assert bucket_quantile(0.99, (0.1, 0.2, float("inf")), (10, 10, 20)) == pytest.approx(0.2)


def test_incomplete_histogram_reads_na():
    h = Histogram((0.1, 0.2), (1, 2), 2, 0.3)
    assert h.quantile(0.5) is None
    merged = merge_histograms([h, Histogram((0.1, 0.2, float("inf")), (1, 2, 2), 2, 0.3)])
    assert merged.quantile(0.5) is None


# -- quantiles the histogram's sum bounds (issue: truthful histogram percentiles) -----------------


def test_full_capture_queue_time_is_bounded_by_its_mean():
    """vLLM 0.32's queue time: mean 0.03 ms inside a 0-300 ms first bucket. Interpolation said
    p50 150 ms and p99 297 ms; the mean bounds them to mean / (1 - q)."""
    v = server_view("x", Scrape(parse_text((FIX / "vllm_0.32_cpu_full_load.txt").read_text()), 1.0)).total
    q = v.latency["queue"]
    assert q.mean == pytest.approx(2.666e-5, rel=1e-3)
    assert q.bounded == ("p50", "p90", "p99")
    assert q.p50 == pytest.approx(q.mean / 0.5) and q.p99 == pytest.approx(q.mean / 0.01)
    assert q.p99 < 0.003  # was 0.297 s
    # where the buckets are fine enough, the interpolation is tighter and stays
    assert v.latency["ttft"].bounded == () and v.latency["ttft"].p99 == pytest.approx(0.0712, rel=1e-3)
    assert q.as_dict()["bounded"] == ["p50", "p90", "p99"]


def test_bounded_quantile_is_the_tighter_of_interpolation_and_markov():
    # 100 observations of 1 ms in a 0-10 s bucket: interpolation puts p50 at 5 s
    h = Histogram(bounds=(10.0, float("inf")), counts=(100.0, 100.0), total=100.0, sum=0.1)
    assert h.quantile(0.5) == pytest.approx(5.0)
    assert h.bounded_quantile(0.5) == (pytest.approx(0.002), True)
    # evenly spread: the interpolation is below the bound and is kept
    even = Histogram(bounds=(1.0, 2.0, float("inf")), counts=(50.0, 100.0, 100.0), total=100.0, sum=100.0)
    assert even.bounded_quantile(0.5) == (pytest.approx(1.0), False)
    # no sum: nothing to bound with
    nosum = Histogram(bounds=(10.0, float("inf")), counts=(100.0, 100.0), total=100.0, sum=None)
    assert nosum.bounded_quantile(0.5) == (pytest.approx(5.0), False)


def test_markov_bound_holds_for_any_nonnegative_sample():
    """The bound is never below the true quantile, whatever the data."""
    import random

    rng = random.Random(7)
    bounds = (0.005, 0.05, 0.3, 1.0, 5.0, float("inf"))
    for _ in range(200):
        xs = sorted(
            rng.choice([rng.expovariate(1 / rng.choice([1e-4, 0.01, 0.5])), rng.uniform(0, 6)])
            for _ in range(rng.randint(5, 400))
        )
        counts = tuple(float(sum(1 for x in xs if x <= b)) for b in bounds)
        h = Histogram(bounds=bounds, counts=counts, total=float(len(xs)), sum=sum(xs))
        for q in (0.5, 0.9, 0.99):
            value, is_bound = h.bounded_quantile(q)
            true_q = xs[max(0, math.ceil(q * len(xs)) - 1)]
            if is_bound:
                assert value >= true_q - 1e-12


def test_few_observations_are_flagged_per_percentile():
    from spoc_tui.core.metrics.stats import summarize

    h = Histogram(bounds=(1.0, float("inf")), counts=(50.0, 50.0), total=50.0, sum=10.0)
    s = summarize(h, "60s")
    assert not s.few("p50") and s.few("p90") and s.few("p99")


def test_prefix_hit_rate_pairs_names_of_one_generation():
    """Old and new names together (queries under the new name, hits under both) must not give
    a hit rate above 100 %."""
    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.core.metrics.vllm import Scrape, server_view

    def body(q_new, h_new, h_old, q_old):
        return (
            f"vllm:prefix_cache_queries_total {q_new}\nvllm:prefix_cache_hits_total {h_new}\n"
            f"vllm:gpu_prefix_cache_hits_total {h_old}\nvllm:gpu_prefix_cache_queries_total {q_old}\n"
            "vllm:num_requests_running 1\n"
        )

    then = parse_text(body(100, 50, 10, 20))
    now = parse_text(body(200, 90, 900, 40))
    v = server_view("x", Scrape(now, 10.0, then, 0.0)).total
    assert v.prefix_cache_hit_rate == 0.4  # 40 of 100 new-name queries, not 890/100
    only_new_queries = parse_text("vllm:prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 50\n"
                                  "vllm:num_requests_running 1\n")  # fmt: skip
    assert server_view("x", Scrape(only_new_queries, 1.0)).total.prefix_cache_hit_rate is None  # was 5.0


@pytest.mark.parametrize("name", sorted(p.name for p in FIX.glob("*.txt")))
def test_one_engine_view_is_the_totals_taken_without_building_it_again(name):
    """server_view's shortcut for a server whose every vllm: series is one engine's (it builds
    the view once, not twice) gives what building the engine's own view gives."""
    from spoc_tui.core.metrics.vllm import build_view, split_by_engine

    now = parse_text((FIX / name).read_text())
    then = parse_text((FIX / "vllm_0.32_cpu_full_idle.txt").read_text()) if "0.32" in name else None
    sv = server_view("s", Scrape(now, 60.0, then, 0.0 if then is not None else None))
    parts = split_by_engine(now)
    then_parts = split_by_engine(then) if then is not None else {}
    slow = tuple(
        build_view([Scrape(parts[e], 60.0, then_parts.get(e) if then is not None else None, 0.0 if then else None)], e)
        for e in sorted(parts, key=lambda e: (len(e), e))
    )
    assert sv.engines == slow


def _two_engines(text: str) -> str:
    """The capture as two engines: each engine-0 series again for engine 1, at twice the value."""
    out = [text.rstrip("\n")]
    for line in text.splitlines():
        if 'engine="0"' in line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            out.append(f"{head.replace(chr(34) + '0' + chr(34), chr(34) + '1' + chr(34), 1)} {2 * float(value)!r}")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("engines", [1, 2])
def test_a_baseline_seen_before_as_the_newest_scrape_gives_what_a_fresh_parse_gives(engines):
    """What a view derives from a scrape (its histograms, its split by engine) is kept with it
    and used again when it is a later window's baseline: the view must be a fresh parse's."""
    import json

    from spoc_tui.core.jsonsafe import json_safe

    now_text = (FIX / "vllm_0.32_cpu_full_load.txt").read_text()
    then_text = (FIX / "vllm_0.32_cpu_full_idle.txt").read_text()
    if engines == 2:
        now_text, then_text = _two_engines(now_text), _two_engines(then_text)
    then = parse_text(then_text)
    server_view("x", Scrape(then, 40.0))  # the newest scrape once
    kept = server_view("x", Scrape(parse_text(now_text), 100.0, then, 40.0))
    fresh = server_view("x", Scrape(parse_text(now_text), 100.0, parse_text(then_text), 40.0))
    assert len(kept.engines) == engines
    assert json.dumps(json_safe(kept.as_dict()), sort_keys=True) == json.dumps(
        json_safe(fresh.as_dict()), sort_keys=True
    )
    assert kept.total.latency["ttft"].count is not None and kept.total.latency["ttft"].window == "60s"


def test_merging_one_histogram_gives_it_back_and_several_add_at_their_common_bounds():
    a = Histogram(bounds=(0.1, 1.0, math.inf), counts=(1.0, 3.0, 4.0), total=4.0, sum=2.0)
    b = Histogram(bounds=(0.1, 0.5, 1.0, math.inf), counts=(2.0, 2.0, 5.0, 6.0), total=6.0, sum=3.0)
    assert merge_histograms([a]) is a
    assert merge_histograms([a, b]) == Histogram(
        bounds=(0.1, 1.0, math.inf), counts=(3.0, 8.0, 10.0), total=10.0, sum=5.0
    )
