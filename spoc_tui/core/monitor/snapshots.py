"""The frozen snapshots the collectors hand out and the monitor draws.

They sit in the core so that widgets and screens can take them without knowing the
collectors that make them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from spoc_tui.core.hardware.gpu import GpuSample
from spoc_tui.core.metrics.vllm import EngineView, ServerView


@dataclass(frozen=True, slots=True)
class SourceStatus:
    source: str
    up: bool
    reason: str | None = None
    last_ok: float | None = None
    """Wall time of the last good read."""
    retry_in: float | None = None
    """Seconds to the next try, as of ``at``."""
    at: float = field(default_factory=time.time, compare=False)
    """Wall time the status was taken (``retry_in`` counts down from it)."""

    def retry_left(self, now: float) -> float | None:
        """Seconds to the next try as of ``now``."""
        return None if self.retry_in is None else max(0.0, self.retry_in - (now - self.at))


@dataclass(frozen=True, slots=True)
class VllmTick:
    servers: tuple[ServerView, ...]
    """Latest view of every source that has ever answered (stale ones included)."""
    total: EngineView | None
    """All replicas merged (buckets added before the quantile); None with one replica."""
    stale: frozenset[str]
    changes: tuple[SourceStatus, ...]
    statuses: tuple[SourceStatus, ...]
    taken_at: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class GpuTick:
    gpus: tuple[GpuSample, ...]
    stale: frozenset[str]
    changes: tuple[SourceStatus, ...]
    statuses: tuple[SourceStatus, ...]
