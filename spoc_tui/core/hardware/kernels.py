"""Kernel and operator names to the classes a profile is summed by.

One ordered table, first match wins; extend it by adding a pattern to a class (or a class,
with its place in :data:`CLASSES`). Patterns are regular expressions searched in the lowercased
name. The order matters where names overlap: communication before everything (NCCL kernels
name reductions), KV-cache writes before attention (``reshape_and_cache`` is not attention
maths), attention before GEMM (CUTLASS FMHA kernels say ``cutlass``), sampling before the
element-wise class (``softmax`` here is the sampler's; vLLM's attention is fused).
"""

from __future__ import annotations

import re
from functools import lru_cache

GEMM = "GEMM"
ATTENTION = "attention"
KV_WRITE = "KV-cache write"
COMM = "communication"
SAMPLING = "sampling & logits"
ELEMENTWISE = "norms/activations/elementwise"
MEMCPY = "memory copies"
OTHER = "other"
IDLE = "idle"

CLASSES: tuple[str, ...] = (GEMM, ATTENTION, KV_WRITE, COMM, SAMPLING, ELEMENTWISE, MEMCPY, OTHER)
"""Kernel classes in display order (``idle`` is added by the analysis, not by a name)."""

RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        COMM,
        (
            r"nccl",
            r"all_?reduce",
            r"all_?gather",
            r"reduce_?scatter",
            r"all_?to_?all",
            r"cross_device_reduce",
            r"custom_ar",
            r"shm_",
            r"c10d::",
            r"broadcast_",
        ),
    ),
    (
        KV_WRITE,
        (
            r"reshape_and_cache",
            r"concat_and_cache",
            r"compute_slot_mapping",
            r"slot_mapping",
            r"copy_blocks",
            r"swap_blocks",
            r"kv_cache_write",
            r"kv_cache_update",
        ),
    ),
    (
        ATTENTION,
        (
            r"attention",
            r"attn",
            r"flash",
            r"fmha",
            r"sdpa",
            r"scaled_dot_product",
            r"mla_",
            r"_mla",
            r"paged_",
            r"merge_states",
            r"batch_decode",
            r"batch_prefill",
            r"xqa",
        ),
    ),
    (
        SAMPLING,
        (
            r"sampl",
            r"top_?k",
            r"top_?p",
            r"softmax",
            r"argmax",
            r"multinomial",
            r"gumbel",
            r"logit",
            r"penalt",
            r"radixsort",
            r"radix_sort",
            r"aten::sort",
            r"exponential_",
        ),
    ),
    (
        GEMM,
        (
            r"gemm",
            r"gemv",
            r"matmul",
            r"cublas",
            r"cutlass",
            r"nvjet",
            r"xmma",
            r"onednn_mm",
            r"dnnl",
            r"mkl",
            r"splitkreduce",
            r"scaled_mm",
            r"marlin",
            r"machete",
            r"wvsplitk",
            r"^aten::(mm|addmm|bmm|baddbmm|linear)$",
        ),
    ),
    (
        ELEMENTWISE,
        (
            r"norm",
            r"silu",
            r"gelu",
            r"relu",
            r"act_and_mul",
            r"swiglu",
            r"rotary",
            r"rope",
            r"elementwise",
            r"reduce_kernel",
            r"triton_(poi|red|per)_",
            r"^aten::(add|mul|sub|div|neg|exp|pow|rsqrt|mean|sum|cat|where|clamp|embedding|index_select|gather)",
            r"^_c::(silu|gelu|fused_add|rms)",
            r"fused_add",
            r"embedding",
            r"index_select",
            r"gather",
            r"cat_",
            r"catarray",
            r"fill",
        ),
    ),
    (
        MEMCPY,
        (
            r"memcpy",
            r"memset",
            r"^aten::(copy_|to|_to_copy|clone|contiguous|empty_like|zero_)$",
            r"dtoh|htod|dtod",
        ),
    ),
)

_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (cls, re.compile("|".join(f"(?:{p})" for p in patterns))) for cls, patterns in RULES
)


@lru_cache(maxsize=65536)
def classify(name: str) -> str:
    """The class of one kernel or operator name (``other`` when no rule matches)."""
    text = name.lower()
    for cls, pattern in _COMPILED:
        if pattern.search(text):
            return cls
    return OTHER
