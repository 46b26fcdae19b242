"""Monitor settings: defaults < TOML config file < environment < command line."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

import platformdirs

from spoc_tui import APP_NAME as APP_NAME
from spoc_tui.core.errors import InputError
from spoc_tui.core.files import FileReadError, read_text_bounded
from spoc_tui.core.redact import key_error


class ConfigError(InputError, ValueError):
    """A bad setting; the message names the file or flag and the field."""


MAX_NUM_SEQS = 65_536
"""The most seats (vLLM's max-num-seqs) the headroom is told."""


def check_max_num_seqs(seats: int | None, label: str) -> None:
    """The servers' seats as the operator told them (``--max-num-seqs``, config ``max_num_seqs``).

    Raises:
        ConfigError: out of range, named by ``label``.
    """
    if seats is not None and not 1 <= seats <= MAX_NUM_SEQS:
        raise ConfigError(f"{label} must be between 1 and {MAX_NUM_SEQS}, got {seats}")


def config_path() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


def data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME))


@dataclass
class Settings:
    vllm_urls: list[str] = field(default_factory=list)
    """vLLM servers (replicas) to scrape."""
    dcgm_urls: list[str] = field(default_factory=list)
    """dcgm-exporter endpoints."""
    prometheus_url: str | None = None
    """Read vLLM replicas through this Prometheus server (PromQL) instead of scraping them."""
    nvml: bool | None = None
    """Read local GPUs through NVML (None: when a GPU exists)."""
    nvml_trace: str | None = None
    """Replay a recorded NVML trace (JSONL) as the local GPU."""
    tp_groups: str | None = None
    """Tensor-parallel groups like ``0-3,4-7``; found from vLLM processes when omitted."""
    interval: float = 1.0
    """Seconds between refreshes."""
    window: float = 60.0
    """Seconds over which percentiles and rates are computed."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token for the servers; never displayed or logged."""
    gpu_cost_per_hour: float | None = None
    """Price of one GPU-hour: the monitor shows the cost per million output tokens."""
    trace_dir: str | None = None
    """The first server's torch_profiler_dir (on this host), for profiling from the Load screen."""
    sla: str | None = None
    """Latency limits (``ttft_p99<=2s,itl_p99<=100ms``): latency cells and the verdict are judged
    against them."""
    tune_launch: str | None = None
    """Launch command the Tune screen starts with (``spoc demo``: the simulator)."""
    headroom: bool = True
    """Learn each server's headroom from the scrapes (docs/headroom.md), against ``sla`` (or the
    default SLA), and alert when it is under ``headroom_alert``."""
    headroom_alert: float = 1.2
    """The headroom (times the recent traffic) under which the monitor alerts."""
    twin: str | None = None
    """A calibrated twin.json (``spoc twin calibrate``): the headroom's fit's prior."""
    max_num_seqs: int | None = None
    """The servers' max-num-seqs (vLLM's flag, which ``/metrics`` does not report), told to the
    headroom; without it the headroom assumes vLLM's default until a queue shows the seats."""
    serve_metrics: str | None = None
    """``[HOST:]PORT``: serve each server's headroom, and the fleet's, as Prometheus metrics
    (docs/fleet.md); loopback unless a host is given."""

    def validate(self) -> None:
        if not 0.1 <= self.interval <= 3600:
            raise ConfigError(f"interval must be between 0.1 and 3600 seconds, got {self.interval:g}")
        if not 1 <= self.window <= 86400:
            raise ConfigError(f"window must be between 1 and 86400 seconds, got {self.window:g}")
        from spoc_tui.collectors.scrape import SourceError, metrics_url

        for u in [*self.vllm_urls, *self.dcgm_urls, *([self.prometheus_url] if self.prometheus_url else [])]:
            try:
                metrics_url(u)
            except SourceError as e:
                raise ConfigError(str(e)) from None
        if not 0 < self.headroom_alert <= 100:
            raise ConfigError(f"headroom_alert must be a multiple between 0 and 100, got {self.headroom_alert:g}")
        check_max_num_seqs(self.max_num_seqs, "max_num_seqs")
        if self.serve_metrics is not None:
            if not self.headroom:
                raise ConfigError("serve_metrics publishes the headroom: it needs headroom on (not --no-headroom)")
            from spoc_tui.twin.publish import parse_address

            parse_address(self.serve_metrics)
        if self.twin is not None:
            from spoc_tui.twin.model import TwinError, read_twin

            try:
                read_twin(Path(self.twin).expanduser())
            except TwinError as e:
                raise ConfigError(f"twin: {e}") from None
        if self.gpu_cost_per_hour is not None and not 0 < self.gpu_cost_per_hour < 1e6:
            raise ConfigError(f"gpu_cost_per_hour must be a positive price, got {self.gpu_cost_per_hour:g}")
        if self.sla:
            from spoc_tui.core.ramp.sla import SlaError, parse_sla

            try:
                parse_sla(self.sla)
            except SlaError as e:
                raise ConfigError(f"sla: {e}") from None
        if self.tp_groups:
            from spoc_tui.core.hardware.gpu import parse_tp_groups

            try:
                parse_tp_groups(self.tp_groups)
            except ValueError as e:
                raise ConfigError(f"--tp-groups: {e}") from None


_TYPES = {f.name: f.type for f in fields(Settings)}


KEY_FILE_MAX = 64 * 1024
"""A bearer token's file is read up to this size (a token is a line; ``/dev/zero`` is refused)."""


def read_key_file(path: str | Path, label: str) -> str:
    """A bearer token kept in a file (``--api-key-file``, ``api_key_file``): the file's one line,
    stripped (a byte-order mark too). Errors name the file and never its content.

    Raises:
        ConfigError: unreadable, or not one bearer token (:func:`key_error`), named by ``label``.
    """
    try:
        key = read_text_bounded(path, KEY_FILE_MAX).removeprefix("\ufeff").strip()
    except FileReadError as e:
        raise ConfigError(f"{label}: cannot read ({e})") from None
    if (why := key_error(key)) is not None:
        raise ConfigError(f"{label}: the file {why}")
    return key


def load_file(path: Path) -> dict[str, object]:
    """Read the TOML config; a missing file is an empty config.

    Raises:
        ConfigError: unreadable TOML, unknown keys, wrong types.
    """
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(read_text_bounded(path))
    except FileReadError as e:
        raise ConfigError(f"{path}: cannot read ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({e})") from None
    out: dict[str, object] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name == "api_key_file":
            out["api_key"] = read_key_file(Path(str(value)).expanduser(), f"{path}: api_key_file")
            continue
        if name not in _TYPES:
            raise ConfigError(f"{path}: unknown setting {key!r}; known: {', '.join(sorted(_TYPES))}, api_key_file")
        expected = _TYPES[name]
        if "list" in str(expected):
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{path}: {key} must be a list of strings")
        elif "float" in str(expected):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{path}: {key} must be a number")
            value = float(value)
        elif "bool" in str(expected):
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: {key} must be true or false")
        elif "int" in str(expected):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{path}: {key} must be a whole number")
        elif not isinstance(value, str):
            raise ConfigError(f"{path}: {key} must be a string")
        out[name] = value
    return out
