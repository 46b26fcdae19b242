"""GPU and model presets, and reading a Hugging Face ``config.json``.

Figures are vendor datasheet values (dense BF16 tensor throughput, HBM bandwidth, board
power) and the models' published ``config.json`` shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spoc_tui.core.errors import InputError

GIB = 2**30


class PresetError(InputError, ValueError):
    """Unknown preset or unusable config; the message lists what is known or missing."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    label: str
    memory_bytes: int
    mem_bw_bytes_s: float
    bf16_flops: float
    power_limit_w: float
    idle_power_w: float
    sm_clock_max_mhz: float
    sm_clock_idle_mhz: float
    mem_clock_mhz: float
    slowdown_temp_c: float
    shutdown_temp_c: float
    interconnect_bytes_s: float
    """Per-GPU all-reduce bandwidth (NVLink or PCIe)."""
    next_up: str | None = None
    """The obvious bigger GPU, for "what if" rows."""


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            "a100-40gb",
            "NVIDIA A100-SXM4-40GB",
            42_949_672_960,
            1.555e12,
            312e12,
            400,
            55,
            1410,
            210,
            1215,
            88,
            92,
            300e9,
            "a100-80gb",
        ),
        GpuSpec(
            "a100-80gb",
            "NVIDIA A100-SXM4-80GB",
            85_899_345_920,
            2.039e12,
            312e12,
            400,
            60,
            1410,
            210,
            1593,
            88,
            92,
            300e9,
            "h100-80gb",
        ),
        GpuSpec(
            "h100-80gb",
            "NVIDIA H100 80GB HBM3",
            85_520_809_984,
            3.35e12,
            989e12,
            700,
            72,
            1980,
            345,
            2619,
            89,
            95,
            450e9,
            "h200",
        ),
        GpuSpec(
            "h200", "NVIDIA H200", 150_754_820_096, 4.8e12, 989e12, 700, 75, 1980, 345, 3201, 89, 95, 450e9, "b200"
        ),
        GpuSpec(
            "b200", "NVIDIA B200", 193_273_528_320, 8.0e12, 2250e12, 1000, 120, 1965, 450, 3996, 87, 95, 900e9, None
        ),
        GpuSpec(
            "l40s", "NVIDIA L40S", 48_305_799_168, 0.864e12, 362e12, 350, 35, 2520, 210, 9001, 88, 93, 32e9, "a100-80gb"
        ),
    )
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as serving maths needs it."""

    name: str
    served_name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position: int
    tie_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0
    """How many layers use sliding-window attention (their KV is capped at the window)."""
    weights_bytes_override: int | None = None
    """Checkpoint size where it is not params x dtype (e.g. MXFP4 experts)."""
    dtype: str = "bf16"

    # -- parameter counts ---------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        return q + kv + o

    @property
    def mlp_params_per_layer(self) -> int:
        if self.num_experts:
            return (
                self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size
                + self.hidden_size * self.num_experts
            )
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def active_mlp_params_per_layer(self) -> int:
        if self.num_experts:
            return self.experts_per_token * 3 * self.hidden_size * self.moe_intermediate_size
        return self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def total_params(self) -> int:
        return self.embedding_params + self.num_layers * (self.attn_params_per_layer + self.mlp_params_per_layer)

    @property
    def active_params(self) -> int:
        """Parameters touched per token (MoE: only the routed experts)."""
        return self.embedding_params // (1 if self.tie_embeddings else 2) + self.num_layers * (
            self.attn_params_per_layer + self.active_mlp_params_per_layer
        )

    @property
    def full_attention_layers(self) -> int:
        return self.num_layers - self.sliding_layers


def _m(**kw: Any) -> ModelSpec:
    return ModelSpec(**kw)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _m(
            name="llama-3.1-8b",
            served_name="meta-llama/Llama-3.1-8B-Instruct",
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
            vocab_size=128256,
            max_position=131072,
        ),
        _m(
            name="llama-3.1-70b",
            served_name="meta-llama/Llama-3.1-70B-Instruct",
            num_layers=80,
            hidden_size=8192,
            num_heads=64,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=28672,
            vocab_size=128256,
            max_position=131072,
        ),
        _m(
            name="qwen2.5-7b",
            served_name="Qwen/Qwen2.5-7B-Instruct",
            num_layers=28,
            hidden_size=3584,
            num_heads=28,
            num_kv_heads=4,
            head_dim=128,
            intermediate_size=18944,
            vocab_size=152064,
            max_position=32768,
        ),
        # gpt-oss-120b: 36 layers alternating full and 128-token sliding attention, 128 experts
        # (4 active), MXFP4 expert weights: the checkpoint is about 65 GB.
        _m(
            name="gpt-oss-120b",
            served_name="openai/gpt-oss-120b",
            num_layers=36,
            hidden_size=2880,
            num_heads=64,
            num_kv_heads=8,
            head_dim=64,
            intermediate_size=2880,
            vocab_size=201088,
            max_position=131072,
            num_experts=128,
            experts_per_token=4,
            moe_intermediate_size=2880,
            sliding_window=128,
            sliding_layers=18,
            weights_bytes_override=65_249_000_000,
            dtype="mxfp4",
        ),
    )
}

_ALIASES = {"h100": "h100-80gb", "a100": "a100-80gb", "h100-sxm": "h100-80gb", "a100-sxm": "a100-80gb"}


def gpu_preset(name: str) -> GpuSpec:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in GPUS:
        raise PresetError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[key]


def gpu_for_model_name(model_name: str | None) -> GpuSpec | None:
    """The preset of a GPU that NVML or DCGM names (``"NVIDIA H100 80GB HBM3"``), or None when
    no preset has the same peaks: PCIe and NVL boards of a family run at other clocks and
    bandwidths, and a wrong peak would give a wrong share."""
    if not model_name:
        return None
    text = model_name.strip().upper()
    for g in GPUS.values():
        if g.label.upper() == text:
            return g
    if "PCIE" in text or "NVL" in text:
        return None
    words = text.replace("-", " ").split()
    if "H200" in words:
        return GPUS["h200"]
    if "B200" in words:
        return GPUS["b200"]
    if "L40S" in words:
        return GPUS["l40s"]
    if "H100" in words and ("HBM3" in words or "SXM5" in text or "80GB" in words):
        return GPUS["h100-80gb"]
    if "A100" in words and "SXM4" in text:
        return GPUS["a100-80gb"] if "80GB" in text else GPUS["a100-40gb"]
    return None


def custom_gpu(memory_gib: float, base: GpuSpec | None = None) -> GpuSpec:
    if memory_gib <= 0:
        raise PresetError("GPU memory must be positive")
    b = base or GPUS["h100-80gb"]
    return replace(
        b,
        name=f"{memory_gib:g}gib",
        label=f"GPU with {memory_gib:g} GiB",
        memory_bytes=int(memory_gib * GIB),
        next_up=None,
    )


_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
_MOST = 2**31
"""No shape count of a real model comes near it (a vocabulary of 2 billion words)."""


def _count(cfg: dict[str, Any], key: str) -> int | None:
    """An optional count of the shape (None: absent, null or 0, so the caller's default).

    Raises:
        PresetError: a value that is not a whole number from 0 to :data:`_MOST`.
    """
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MOST:
        raise PresetError(f"config.json: {key} is {v!r}, not a whole number from 0 to {_MOST:,}")
    return v or None


def model_from_config(cfg: dict[str, Any], name: str = "custom") -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` dict.

    Raises:
        PresetError: naming every required field that is missing or not a positive integer, or
            an optional count that is not a whole number.
    """
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers
        cfg = {**cfg, **cfg["text_config"]}
    missing = [k for k in _REQUIRED if isinstance(cfg.get(k), bool) or not isinstance(cfg.get(k), int) or cfg[k] <= 0]
    if missing:
        raise PresetError(f"config.json lacks {', '.join(missing)} (needed for the attention shape)")
    for k in _REQUIRED:
        _count(cfg, k)
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    head_dim = _count(cfg, "head_dim") or hidden // heads
    kv = _count(cfg, "num_key_value_heads") or heads
    experts = _count(cfg, "num_local_experts") or _count(cfg, "num_experts") or _count(cfg, "n_routed_experts") or 0
    per_tok = _count(cfg, "num_experts_per_tok") or _count(cfg, "experts_per_token") or 0
    inter = _count(cfg, "intermediate_size") or 4 * hidden
    moe_inter = _count(cfg, "moe_intermediate_size") or (inter if experts else 0)
    layers = cfg["num_hidden_layers"]
    sliding = cfg.get("sliding_window") if isinstance(cfg.get("sliding_window"), int) else None
    layer_types = cfg.get("layer_types")
    if sliding and isinstance(layer_types, list):
        n_sliding = sum(1 for t in layer_types if "sliding" in str(t))
    elif sliding and cfg.get("use_sliding_window", True) and cfg.get("model_type") in ("mistral",):
        n_sliding = layers
    else:
        n_sliding = 0
        sliding = sliding if n_sliding else None
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return ModelSpec(
        name=name,
        served_name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=cfg["vocab_size"],
        max_position=_count(cfg, "max_position_embeddings") or 4096,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=experts,
        experts_per_token=per_tok,
        moe_intermediate_size=moe_inter,
        sliding_window=sliding,
        sliding_layers=n_sliding,
        dtype={"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(dtype, "bf16"),
    )


def read_json_object(p: Path, unreadable: str = "cannot read JSON") -> dict[str, Any]:
    """A JSON object from a file.

    Raises:
        PresetError: ``{p}: no such file``, ``{p}: {unreadable} (reason)``, ``{p}: not a JSON object``.
    """
    from spoc_tui.core.files import FileReadError, parse_json, read_text_bounded

    try:
        obj = parse_json(read_text_bounded(p))
    except FileReadError as e:
        raise PresetError(f"{p}: {e}" if str(e) == "no such file" else f"{p}: {unreadable} ({e})") from None
    except json.JSONDecodeError as e:
        raise PresetError(f"{p}: {unreadable} ({e})") from None
    if not isinstance(obj, dict):
        raise PresetError(f"{p}: not a JSON object")
    return obj


def model_preset(name: str) -> ModelSpec:
    """A preset by name, or a path to a ``config.json`` (or a folder holding one)."""
    key = name.strip().lower()
    if key in MODELS:
        return MODELS[key]
    for m in MODELS.values():
        if m.served_name.lower() == key:
            return m
    p = Path(name)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.name == "config.json":
        cfg = read_json_object(p)
        label = p.parent.name or "custom"
        return model_from_config(cfg, label)
    raise PresetError(f"unknown model {name!r}; known: {', '.join(MODELS)} (or a path to a config.json)")
