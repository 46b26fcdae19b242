"""The fleet's watch list: shed load (admission rejections, aborted/errored requests, 4xx/5xx),
speculative decoding, and the replica that lags."""

from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.core.metrics.vllm import Scrape, server_view
from spoc_tui.core.monitor.alerts import shed_alerts
from spoc_tui.core.monitor.fleet import lagging, waiting_per_replica

TTFT_BOUNDS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0)


def exposition(
    waiting=0, rejected=0, aborted=0, errored=0, http5=0, http4=0, drafts=0, draft_tokens=0, accepted=0, ttft=()
):
    L = 'model_name="m",engine="0"'
    lines = [
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{L}}} {waiting}",
        "# TYPE vllm:admission_rejections_total counter",
        f'vllm:admission_rejections_total{{{L},reason="max_num_queued_reqs"}} {rejected}',
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{L},finished_reason="stop"}} 100',
        f'vllm:request_success_total{{{L},finished_reason="abort"}} {aborted}',
        f'vllm:request_success_total{{{L},finished_reason="error"}} {errored}',
        "# TYPE http_requests_total counter",
        'http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 100',
        f'http_requests_total{{handler="/v1/chat/completions",method="POST",status="5xx"}} {http5}',
        f'http_requests_total{{handler="/v1/models",method="GET",status="4xx"}} {http4}',
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{L}}} {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total{{{L}}} {draft_tokens}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{L}}} {accepted}",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    acc = 0
    for b in TTFT_BOUNDS:
        acc += sum(
            1 for t in ttft if t <= b and (TTFT_BOUNDS.index(b) == 0 or t > TTFT_BOUNDS[TTFT_BOUNDS.index(b) - 1])
        )
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{L},le="{b}"}} {acc}')
    lines.append(f'vllm:time_to_first_token_seconds_bucket{{{L},le="+Inf"}} {len(ttft)}')
    lines.append(f"vllm:time_to_first_token_seconds_count{{{L}}} {len(ttft)}")
    lines.append(f"vllm:time_to_first_token_seconds_sum{{{L}}} {sum(ttft)}")
    return parse_text("\n".join(lines) + "\n")


def view(src="a", then=None, **now):
    return server_view(src, Scrape(exposition(**now), 10.0, exposition(**(then or {})), 0.0))


def test_shed_load_rates_and_alert():
    v = view(rejected=20, aborted=5, errored=1, http5=3, http4=10).total
    assert v.rejections_rate == 2.0
    assert v.finished_rates["abort"] == 0.5 and v.finished_rates["error"] == 0.1
    assert v.http_rates == {"2xx": 0.0, "5xx": 0.3, "4xx": 1.0}
    assert abs(v.shed_rate - (2.0 + 0.5 + 0.1 + 0.3 + 1.0)) < 1e-9
    (a,) = shed_alerts(v)
    assert a.severity == "error"
    for part in ("admission rejections 2/s", "aborted 0.5/s", "errored 0.1/s", "HTTP 5xx 0.3/s", "HTTP 4xx 1/s"):
        assert part in a.text


def test_quiet_server_sheds_nothing_and_old_servers_read_na():
    v = view().total
    assert v.shed_rate == 0.0 and shed_alerts(v) == []
    old = server_view(
        "x", Scrape(parse_text("vllm:num_requests_running 1\n"), 10.0, parse_text("vllm:num_requests_running 1\n"), 0.0)
    )
    assert old.total.shed_rate is None and old.total.rejections_rate is None


def test_speculative_decoding_acceptance():
    v = view(drafts=100, draft_tokens=400, accepted=300).total
    assert v.spec_acceptance == 0.75
    assert v.spec_mean_length == 4.0  # 1 + 300 / 100
    assert view().total.spec_acceptance is None


def test_the_replica_that_lags_is_named():
    fast = [0.02] * 50
    a = view("a", waiting=1, ttft=fast)
    b = view("b", waiting=2, ttft=fast)
    c = view("c", waiting=9, ttft=[0.8] * 50)
    (lag,) = lagging([a, b, c])
    assert lag.source == "c" and "9 waiting vs its peers' median 1.5" in lag.reason and "TTFT p99" in lag.reason
    assert waiting_per_replica([a, b, c]) == 4.0
    assert lagging([a, b, c], stale=frozenset({"c"})) == []
    assert lagging([a]) == []
    # within noise: no lag
    assert lagging([view("a", waiting=0, ttft=fast), view("b", waiting=0, ttft=[0.03] * 50)]) == []


def test_which_replica_a_gpu_serves():
    from spoc_tui.core.monitor.fleet import replica_of_gpu

    a, b = "http://node-a:8000", "http://node-b:8000"
    assert replica_of_gpu("http://x:9400/metrics", None, [a], []) == a  # one server: all GPUs its
    # DCGM's Hostname label names the node of one server
    assert replica_of_gpu("http://x:9400/metrics", "node-b", [a, b], ["http://x:9400/metrics"]) == b
    # two exporters for two servers on one host: paired in the order given
    ea, eb = "http://127.0.0.1:9401/metrics", "http://127.0.0.1:9402/metrics"
    s1, s2 = "http://127.0.0.1:8001", "http://127.0.0.1:8002"
    assert replica_of_gpu(eb, "spoc-sim", [s1, s2], [ea, eb]) == s2
    # nothing says: unknown, never guessed
    assert replica_of_gpu(ea, "spoc-sim", [s1, s2], [ea]) is None
