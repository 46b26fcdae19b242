"""The trace formats' names (``--trace-format``): light on purpose, ``spoc --help`` lists them
without loading the readers (:mod:`spoc_tui.core.traces.read`)."""

from __future__ import annotations

from typing import Literal

TraceFormat = Literal["mooncake", "bailian", "burstgpt", "azure", "weka", "spoc", "otel"]
FORMATS: tuple[TraceFormat, ...] = ("mooncake", "bailian", "burstgpt", "azure", "weka", "spoc", "otel")
BLOCK_TOKENS: dict[TraceFormat, int] = {"mooncake": 512, "bailian": 16, "weka": 64, "otel": 64}
"""Tokens one hash id stands for, as each format publishes it."""
