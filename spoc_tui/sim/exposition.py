"""Prometheus text for the simulator: vLLM V1 names and labels, and dcgm-exporter fields."""

from __future__ import annotations

from collections.abc import Iterable

from spoc_tui.sim.engine import SimEngine
from spoc_tui.sim.gpu import SimGpu
from spoc_tui.sim.stats import Hist


def _f(v: float) -> str:
    """prometheus_client style: floats always with a decimal point."""
    if v == int(v) and abs(v) < 1e15:
        return f"{float(v)!r}"
    return repr(float(v))


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)).replace(chr(10), chr(92) + "n")}"'
        for k, v in sorted(pairs)
    )
    return "{" + inner + "}" if inner else ""


def vllm_metrics(engine: SimEngine, engine_id: str = "0") -> str:
    model = engine.cfg.served_model_name
    base = [("engine", engine_id), ("model_name", model)]
    L = _labels(base)
    st = engine.stats
    out: list[str] = []

    def family(name: str, kind: str, help_: str) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")

    family("spoc_sim_info", "gauge", "This server is the spoc-tui engine simulator: every figure is simulated.")
    sim_labels = _labels([("gpu", engine.cfg.gpu.name), ("model", engine.cfg.model.name), ("tp", str(engine.cfg.tp))])
    out.append(f"spoc_sim_info{sim_labels} 1.0")
    family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
    out.append(f"vllm:num_requests_running{L} {_f(len(engine.running))}")
    family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
    out.append(f"vllm:num_requests_waiting{L} {_f(len(engine.waiting))}")
    family("vllm:num_requests_waiting_by_reason", "gauge", "Number of waiting requests by reason.")
    out.append(
        f"vllm:num_requests_waiting_by_reason{_labels(base + [('reason', 'capacity')])} {_f(len(engine.waiting))}"
    )
    out.append(f"vllm:num_requests_waiting_by_reason{_labels(base + [('reason', 'deferred')])} 0.0")
    family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
    out.append(f"vllm:kv_cache_usage_perc{L} {_f(engine.kv_usage)}")
    counters = (
        ("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", st.preemptions),
        (
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            st.prefix_queries,
        ),
        ("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", st.prefix_hits),
        ("vllm:prompt_tokens_total", "Number of prefill tokens processed.", st.prompt_tokens),
        ("vllm:generation_tokens_total", "Number of generation tokens processed.", st.generation_tokens),
        (
            "vllm:estimated_flops_per_gpu_total",
            "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
            st.flops_per_gpu,
        ),
        (
            "vllm:estimated_read_bytes_per_gpu_total",
            "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
            st.read_bytes_per_gpu,
        ),
        (
            "vllm:estimated_write_bytes_per_gpu_total",
            "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
            st.write_bytes_per_gpu,
        ),
    )
    for name, help_, value in counters:
        family(name, "counter", help_)
        out.append(f"{name}{L} {_f(value)}")
    family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    for reason, n in sorted(st.success.items()):
        out.append(f"vllm:request_success_total{_labels(base + [('finished_reason', reason)])} {_f(n)}")
    hists = (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", st.ttft),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", st.itl),
        (
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            st.tpot,
        ),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", st.e2e),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", st.queue),
        ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", st.prefill_time),
        ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", st.decode_time),
        ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", st.iteration_tokens),
        ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", st.request_prompt_tokens),
        ("vllm:request_generation_tokens", "Number of generation tokens processed.", st.request_generation_tokens),
        (
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            st.request_prefill_computed_tokens,
        ),
    )
    for name, help_, h in hists:
        family(name, "histogram", help_)
        out.extend(_hist_lines(name, base, h))
    cfg = engine.cfg
    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    info = [
        ("block_size", str(cfg.block_size)),
        ("cache_dtype", cfg.kv_cache_dtype),
        ("enable_prefix_caching", str(cfg.enable_prefix_caching)),
        ("engine", engine_id),
        ("gpu_memory_utilization", str(cfg.gpu_memory_utilization)),
        # per GPU, as vLLM's CacheConfig has it (each GPU of a TP group holds its share of every block)
        ("kv_cache_memory_bytes", str(int(engine.plan.kv_cache_bytes / cfg.tp))),
        ("kv_cache_size_tokens", str(engine.plan.kv_cache_tokens)),
        ("num_gpu_blocks", str(engine.num_blocks)),
        ("num_cpu_blocks", "None"),
        ("sliding_window", str(cfg.model.sliding_window)),
    ]
    out.append(f"vllm:cache_config_info{_labels(info)} 1.0")
    return "\n".join(out) + "\n"


def _hist_lines(name: str, base: list[tuple[str, str]], h: Hist) -> list[str]:
    lines = []
    cum = h.cumulative()
    for b, c in zip(list(h.bounds) + [float("inf")], cum):
        le = "+Inf" if b == float("inf") else _f(b)
        lines.append(f"{name}_bucket{_labels(base + [('le', le)])} {_f(c)}")
    L = _labels(base)
    lines.append(f"{name}_count{L} {_f(h.n)}")
    lines.append(f"{name}_sum{L} {_f(h.sum)}")
    return lines


_DCGM_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda g: round(g.sm_clock_mhz)),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda g: round(g.spec.mem_clock_mhz)),
    ("DCGM_FI_DEV_MAX_SM_CLOCK", "gauge", "Maximum SM clock (in MHz).", lambda g: round(g.spec.sm_clock_max_mhz)),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", lambda g: round(g.mem_temp_c)),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: round(g.temp_c)),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "gauge", "Slowdown temperature (in C).", lambda g: round(g.spec.slowdown_temp_c)),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: f"{g.power_w:.6f}"),
    (
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "gauge",
        "Enforced power limit (in W).",
        lambda g: f"{g.spec.power_limit_w:.6f}",
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda g: round(g.energy_mj),
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: round(g.util_pct)),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda g: round(g.fb_used_mib)),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        lambda g: max(0, round(g.spec.memory_bytes / 2**20 - g.fb_used_mib)),
    ),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons (bitmask).", lambda g: g.reasons),
    (
        "DCGM_FI_DEV_POWER_VIOLATION",
        "counter",
        "Throttling duration due to power constraints (in ns).",
        lambda g: round(g.power_violation_ns),
    ),
    (
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "counter",
        "Throttling duration due to thermal constraints (in ns).",
        lambda g: round(g.thermal_violation_ns),
    ),
)


def dcgm_metrics(gpus: list[SimGpu], hostname: str = "spoc-sim") -> str:
    out = [
        "# HELP spoc_sim_info This exporter is the spoc-tui engine simulator: every figure is simulated.",
        "# TYPE spoc_sim_info gauge",
        "spoc_sim_info 1",
    ]
    for name, kind, help_, get in _DCGM_FIELDS:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for g in gpus:
            labels = (
                f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="00000000:{0x18 + g.index * 0x10:02X}:00.0",'
                f'device="nvidia{g.index}",modelName="{g.spec.label}",Hostname="{hostname}"'
            )
            out.append(f"{name}{{{labels}}} {get(g)}")
    return "\n".join(out) + "\n"
