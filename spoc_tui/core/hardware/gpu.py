"""GPU health: DCGM exporter text and NVML readings to one GPU model, throttle decoding,
violation windows and tensor-parallel group outliers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from spoc_tui.core.errors import InputError
from spoc_tui.core.metrics.history import ScrapeHistory
from spoc_tui.core.metrics.promparse import Bounded, Exposition, Labels, is_sentinel
from spoc_tui.core.metrics.stats import median

# ---------------------------------------------------------------------------------------
# Clock-event reasons (NVML nvmlClocksEventReason* / DCGM_CLOCKS_EVENT_REASON_*)

REASON_BITS: dict[int, str] = {
    0x1: "idle",
    0x2: "app_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
THERMAL_BITS = 0x20 | 0x40
POWER_BITS = 0x4 | 0x80
THROTTLE_BITS = 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80 | 0x200 | 0x400
"""Bits that mean the clock is held down against demand. Idle (0x1) is not throttling."""


def decode_reasons(mask: int) -> list[str]:
    """All clock-event reasons in ``mask`` by name, lowest bit first."""
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    unknown = mask & ~sum(REASON_BITS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return names


def throttle_names(mask: int) -> list[str]:
    """Only the reasons that hold clocks down (idle and settings excluded)."""
    return [REASON_BITS[b] for b in sorted(REASON_BITS) if mask & b & THROTTLE_BITS]


# ---------------------------------------------------------------------------------------
# The GPU sample


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one moment. Units: C, MHz, W, %, MiB. Unknown is None."""

    source: str
    gpu: str
    uuid: str | None
    model: str | None = None
    hostname: str | None = None
    pci_bus_id: str | None = None
    temp_c: float | None = None
    mem_temp_c: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    util_pct: float | None = None
    fb_used_mib: float | None = None
    fb_total_mib: float | None = None
    reasons_mask: int | None = None
    slowdown_temp_c: float | None = None
    energy_j: float | None = None
    """Total energy since boot (DCGM's or NVML's counter), joules: the window's energy is its increase."""
    shutdown_temp_c: float | None = None
    violation_ns: dict[str, float] = field(default_factory=dict)
    """Cumulative throttled nanoseconds per policy (power, thermal, ...)."""
    throttled_pct: dict[str, float] | None = None
    """% of the last window spent throttled per policy; None without two readings."""
    simulated: bool = False

    @property
    def key(self) -> str:
        return self.uuid or f"{self.source}#{self.gpu}"

    @property
    def throttle_reasons(self) -> list[str] | None:
        return None if self.reasons_mask is None else throttle_names(self.reasons_mask)

    @property
    def clock_event_reasons(self) -> list[str] | None:
        return None if self.reasons_mask is None else decode_reasons(self.reasons_mask)

    @property
    def throttling(self) -> bool:
        if self.reasons_mask is not None:
            if self.reasons_mask & THROTTLE_BITS:
                return True
        if self.throttled_pct:
            return any(v >= 5.0 for k, v in self.throttled_pct.items() if k != "low_util")
        return False

    def throttle_kind(self) -> str | None:
        """``thermal``, ``power``, ``other`` or None when not throttling."""
        m = self.reasons_mask or 0
        if m & THERMAL_BITS:
            return "thermal"
        if m & POWER_BITS:
            return "power"
        if m & 0x8:  # hardware slowdown: thermal or power brake
            if self.temp_c is not None and self.slowdown_temp_c is not None and self.temp_c >= self.slowdown_temp_c - 2:
                return "thermal"
            if self.power_w is not None and self.power_limit_w and self.power_w >= 0.97 * self.power_limit_w:
                return "power"
            return "other"
        if self.throttled_pct:
            top = max(self.throttled_pct.items(), key=lambda kv: kv[1])
            if top[1] >= 5.0:
                return {"power": "power", "thermal": "thermal"}.get(top[0], "other")
        if m & THROTTLE_BITS:
            return "other"
        return None

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "model": self.model,
            "hostname": self.hostname,
            "temp_c": self.temp_c,
            "mem_temp_c": self.mem_temp_c,
            "sm_clock_mhz": self.sm_clock_mhz,
            "sm_clock_max_mhz": self.sm_clock_max_mhz,
            "power_w": self.power_w,
            "energy_j": self.energy_j,
            "power_limit_w": self.power_limit_w,
            "util_pct": self.util_pct,
            "fb_used_mib": self.fb_used_mib,
            "throttle_reasons": self.throttle_reasons,
            "clock_event_reasons": self.clock_event_reasons,
            "slowdown_temp_c": self.slowdown_temp_c,
            "throttled_pct": self.throttled_pct,
            "simulated": self.simulated,
        }


# ---------------------------------------------------------------------------------------
# DCGM exporter text

# attribute -> ((metric name, scale), ...): old CSV names, DCGM 4.6 names, 1.x names.
_DCGM_FIELDS: dict[str, tuple[tuple[str, float], ...]] = {
    "temp_c": (("DCGM_FI_DEV_GPU_TEMP", 1), ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1), ("dcgm_gpu_temp", 1)),
    "mem_temp_c": (("DCGM_FI_DEV_MEMORY_TEMP", 1), ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 1), ("dcgm_memory_temp", 1)),
    "sm_clock_mhz": (("DCGM_FI_DEV_SM_CLOCK", 1), ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e-6), ("dcgm_sm_clock", 1)),
    "sm_clock_max_mhz": (("DCGM_FI_DEV_MAX_SM_CLOCK", 1), ("DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ", 1e-6)),
    "power_w": (("DCGM_FI_DEV_POWER_USAGE", 1), ("DCGM_FI_DEV_BOARD_POWER_WATTS", 1), ("dcgm_power_usage", 1)),
    "power_limit_w": (
        ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 1),
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", 1),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1),
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS", 1),
    ),
    "util_pct": (("DCGM_FI_DEV_GPU_UTIL", 1), ("DCGM_FI_DEV_GPU_UTIL_RATIO", 100), ("dcgm_gpu_utilization", 1)),
    "fb_used_mib": (("DCGM_FI_DEV_FB_USED", 1), ("dcgm_fb_used", 1)),
    "energy_j": (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3), ("dcgm_total_energy_consumption", 1e-3)),
    "fb_free_mib": (("DCGM_FI_DEV_FB_FREE", 1), ("dcgm_fb_free", 1)),
    "reasons": (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1), ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1)),
    "slowdown_temp_c": (("DCGM_FI_DEV_SLOWDOWN_TEMP", 1), ("DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS", 1)),
    "shutdown_temp_c": (("DCGM_FI_DEV_SHUTDOWN_TEMP", 1), ("DCGM_FI_DEV_GPU_TEMP_SHUTDOWN_CELSIUS", 1)),
}
_DCGM_VIOLATIONS: dict[str, str] = {
    "power": "DCGM_FI_DEV_POWER_VIOLATION",
    "thermal": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "sync_boost": "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "board_limit": "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "reliability": "DCGM_FI_DEV_RELIABILITY_VIOLATION",
}
_UUID_KEYS = ("UUID", "uuid", "gpu_uuid")
_HOST_KEYS = ("hostname", "Hostname")
_MODEL_KEYS = ("modelName", "model_name")


def is_dcgm(exp: Exposition) -> bool:
    return any(n.startswith(("DCGM_FI_", "dcgm_", "DCGM_EXP_")) for n in exp.samples) or any(
        n.startswith(("DCGM_FI_", "dcgm_")) for n in exp.types
    )


_ROW_TEXTS = ("uuid", "model", "hostname", "pci_bus_id")
_ROW_FIGURES = (
    "temp_c",
    "mem_temp_c",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "power_w",
    "energy_j",
    "power_limit_w",
    "util_pct",
    "fb_used_mib",
    "slowdown_temp_c",
    "shutdown_temp_c",
)
"""A dcgm-exporter row's values a :class:`GpuSample` takes under the same name."""


def _same_names(row: Mapping[str, object]) -> dict[str, Any]:
    """The row's values a :class:`GpuSample` takes under the same name (absent: None)."""
    return {**{k: _opt_str(row, k) for k in _ROW_TEXTS}, **{k: _opt_float(row, k) for k in _ROW_FIGURES}}


def _opt_float(row: Mapping[str, object], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _opt_str(row: Mapping[str, object], key: str) -> str | None:
    v = row.get(key)
    return v if isinstance(v, str) else None


_IDENTITIES: Bounded[Labels, tuple[str, tuple[tuple[str, object], ...]] | None] = Bounded(4096)
"""A DCGM series' labels -> its GPU's key and identity (every series of a GPU, every scrape)."""


def _identity(labels: Labels) -> tuple[str, tuple[tuple[str, object], ...]] | None:
    """The GPU a series belongs to: its key (UUID, else ``gpu<N>``) and the row's identity
    fields; None for a series that names no GPU."""
    if labels in _IDENTITIES:
        return _IDENTITIES[labels]
    d = dict(labels)
    uuid = next((d[k] for k in _UUID_KEYS if d.get(k)), None)
    gpu = d.get("gpu")
    found: tuple[str, tuple[tuple[str, object], ...]] | None = None
    if uuid is not None or gpu is not None:
        found = (
            uuid or f"gpu{gpu}",
            (
                ("gpu", gpu if gpu is not None else "?"),
                ("uuid", uuid),
                ("model", next((d[k] for k in _MODEL_KEYS if d.get(k)), None)),
                ("hostname", next((d[k] for k in _HOST_KEYS if d.get(k)), None)),
                ("pci_bus_id", d.get("pci_bus_id")),
            ),
        )
    _IDENTITIES.keep(labels, found)
    return found


def _mig_instance(labels: Labels) -> str | None:
    inst = None
    for k, v in labels:
        if k == "GPU_I_ID":
            inst = v  # the last, as a dict of the labels would have it
    return inst


def dcgm_gpus(exp: Exposition, source: str) -> list[GpuSample]:
    """One sample per physical GPU (deduplicated by UUID across pods and MIG instances)."""
    rows: dict[str, dict[str, object]] = {}
    order: list[str] = []
    mig_fb: dict[str, dict[str, float]] = {}

    def row_for(labels: Labels) -> tuple[str, dict[str, object]] | None:
        who = _identity(labels)
        if who is None:
            return None
        key = who[0]
        row = rows.get(key)
        if row is None:
            row = rows[key] = dict(who[1])
            order.append(key)
        return key, row

    for attr, names in _DCGM_FIELDS.items():
        for name, scale in names:
            series = exp.get(name)
            if not series:
                continue
            for labels, value in series.items():
                found = row_for(labels)
                if found is None:
                    continue
                key, row = found
                if is_sentinel(value):
                    continue
                if attr == "fb_used_mib":
                    inst = _mig_instance(labels)
                    if inst is not None:
                        mig_fb.setdefault(key, {})[inst] = value
                        continue
                row.setdefault(attr, value * scale)
            break
    for policy, name in _DCGM_VIOLATIONS.items():
        for labels, value in exp.get(name).items():
            found = row_for(labels)
            if found is not None and not is_sentinel(value):
                viol = found[1].setdefault("violation_ns", {})
                assert isinstance(viol, dict)
                viol.setdefault(policy, value)
    out = []
    for key in order:
        row = rows[key]
        if key in mig_fb and "fb_used_mib" not in row:
            row["fb_used_mib"] = sum(mig_fb[key].values())
        fb_total = None
        if row.get("fb_used_mib") is not None and row.get("fb_free_mib") is not None:
            fb_total = (_opt_float(row, "fb_used_mib") or 0.0) + (_opt_float(row, "fb_free_mib") or 0.0)
        reasons = _opt_float(row, "reasons")
        viol_ns = row.get("violation_ns")
        out.append(
            GpuSample(
                source=source,
                gpu=str(row["gpu"]),
                fb_total_mib=fb_total,
                reasons_mask=None if reasons is None else int(reasons),
                violation_ns=dict(viol_ns) if isinstance(viol_ns, dict) else {},
                simulated=exp.has("spoc_sim_info"),
                **_same_names(row),
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# NVML readings (a dict per GPU as the collector or a recorded trace gives it)


def nvml_gpu(reading: Mapping[str, object], meta: Mapping[str, object], source: str = "nvml") -> GpuSample:
    """Convert one NVML reading (trace format of shared/data) to a :class:`GpuSample`.

    ``reading`` keys: temp_c, mem_temp_c, sm_mhz, sm_max_mhz, power_mw, power_limit_mw,
    util_gpu, fb_used / fb_total (bytes), reasons, violations {POLICY: {violation_ns}}.
    ``meta`` keys: gpu, name, uuid, pci, slowdown_c, shutdown_c.
    """

    def num(d: Mapping[str, object], k: str, scale: float = 1.0) -> float | None:
        v = d.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        return float(v) * scale

    viol: dict[str, float] = {}
    raw_viol = reading.get("violations")
    if isinstance(raw_viol, Mapping):
        for policy, data in raw_viol.items():
            if isinstance(data, Mapping) and isinstance(data.get("violation_ns"), (int, float)):
                viol[str(policy).lower()] = float(data["violation_ns"])
    mem_temp = num(reading, "mem_temp_c")
    fields = reading.get("fields")
    if mem_temp is None and isinstance(fields, Mapping):
        mem_temp = num(fields, "NVML_FI_DEV_MEMORY_TEMP")
    reasons = reading.get("reasons")
    return GpuSample(
        source=source,
        gpu=str(meta.get("gpu", reading.get("gpu", "0"))),
        uuid=_opt_str(meta, "uuid"),
        model=_opt_str(meta, "name"),
        hostname=_opt_str(meta, "hostname"),
        pci_bus_id=_opt_str(meta, "pci"),
        temp_c=num(reading, "temp_c"),
        mem_temp_c=mem_temp,
        sm_clock_mhz=num(reading, "sm_mhz"),
        sm_clock_max_mhz=num(reading, "sm_max_mhz") or num(meta, "sm_max_mhz"),
        power_w=num(reading, "power_mw", 1e-3),
        energy_j=num(reading, "energy_mj", 1e-3),
        power_limit_w=num(reading, "power_limit_mw", 1e-3) or num(meta, "power_limit_mw", 1e-3),
        util_pct=num(reading, "util_gpu"),
        fb_used_mib=num(reading, "fb_used", 1 / 2**20),
        fb_total_mib=num(reading, "fb_total", 1 / 2**20),
        reasons_mask=int(reasons) if isinstance(reasons, int) else None,
        slowdown_temp_c=num(meta, "slowdown_c"),
        shutdown_temp_c=num(meta, "shutdown_c"),
        violation_ns=viol,
    )


_POLICY_NAMES = {"low_utilization": "low_util"}


class ThrottleWindow:
    """ "% of window throttled" over the stated window: each GPU's cumulative violation counters
    against its reading at least ``window_s`` old (until there is one, the oldest kept, so the
    share is over a shorter span at first). Against the previous read alone, the share would
    swing from 100 % to 0 within a few refreshes of a window that says 30 s."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._hist: dict[str, ScrapeHistory[GpuSample]] = {}

    def add(self, t: float, sample: GpuSample) -> GpuSample:
        h = self._hist.get(sample.key)
        if h is None:
            h = self._hist[sample.key] = ScrapeHistory(self.window_s)
        h.window_s = self.window_s
        base = h.add(t, sample)
        return with_throttle_window(sample, base[1], t - base[0]) if base else sample


def with_throttle_window(now: GpuSample, then: GpuSample | None, dt_s: float | None) -> GpuSample:
    """Add "% of window throttled" per policy from two cumulative violation readings."""
    if then is None or not dt_s or dt_s <= 0 or not now.violation_ns:
        return now
    pct: dict[str, float] = {}
    for policy, ns in now.violation_ns.items():
        before = then.violation_ns.get(policy)
        if before is None or ns < before:
            continue
        pct[_POLICY_NAMES.get(policy, policy)] = min(100.0, 100.0 * (ns - before) / (dt_s * 1e9))
    return replace(now, throttled_pct=pct or None)


# ---------------------------------------------------------------------------------------
# Tensor-parallel groups


class TpGroupError(InputError, ValueError):
    """A tensor-parallel group list that cannot be (``--tp-groups``)."""


def parse_tp_groups(spec: str) -> list[list[int]]:
    """``"0-3,4-7"`` -> [[0,1,2,3],[4,5,6,7]]; ``"0+1,2+3"`` also works.

    Raises:
        ValueError: with a message naming the bad part.
    """
    groups: list[list[int]] = []
    seen: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        members: list[int] = []
        for piece in part.split("+"):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
            if not m:
                raise TpGroupError(f"bad TP group {part!r}: expected like 0-3 or 0+1+2+3")
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) else lo
            if hi < lo:
                raise TpGroupError(f"bad TP group {part!r}: {hi} < {lo}")
            members.extend(range(lo, hi + 1))
        dup = seen.intersection(members)
        if dup:
            raise TpGroupError(f"GPU {sorted(dup)[0]} is in two TP groups")
        seen.update(members)
        groups.append(members)
    if not groups:
        raise TpGroupError("no TP groups given")
    return groups


def groups_from_processes(gpu_pids: Mapping[int, Iterable[int]], parent_of: Mapping[int, int]) -> list[list[int]]:
    """Group GPUs whose compute processes share a parent (vLLM's TP workers of one engine).

    Args:
        gpu_pids: GPU index -> PIDs running on it (NVML compute processes).
        parent_of: PID -> parent PID.
    """
    owner: dict[int, int] = {}
    for gpu, pids in gpu_pids.items():
        pids = list(pids)
        if not pids:
            continue
        owner[gpu] = parent_of.get(pids[0], pids[0])
    by_parent: dict[int, list[int]] = {}
    for gpu, parent in sorted(owner.items()):
        by_parent.setdefault(parent, []).append(gpu)
    return [g for g in by_parent.values() if len(g) > 1]


@dataclass(frozen=True, slots=True)
class GroupMember:
    gpu: GpuSample
    clock_ratio: float | None
    """SM clock / group median SM clock."""
    temp_delta: float | None
    """Temperature minus the group median, C."""
    drags: bool
    reason: str | None


@dataclass(frozen=True, slots=True)
class TpGroupReport:
    name: str
    members: tuple[GroupMember, ...]
    median_clock_mhz: float | None
    median_temp_c: float | None
    slowdown_pct: float | None
    """How much slower the group runs than its median GPU (slowest clock vs median)."""

    @property
    def draggers(self) -> list[GroupMember]:
        return [m for m in self.members if m.drags]

    def alert(self) -> str | None:
        if not self.draggers:
            return None
        parts = []
        for m in self.draggers:
            cr = f"{m.clock_ratio * 100:.0f}% of median clock" if m.clock_ratio is not None else "clock n/a"
            td = f", {m.temp_delta:+.0f}C vs median" if m.temp_delta is not None else ""
            parts.append(f"GPU {m.gpu.gpu} drags TP group {self.name}: {m.reason} ({cr}{td})")
        return "; ".join(parts)


CLOCK_DRAG_RATIO = 0.93
"""A GPU clocked below 93 % of its group's median slows the whole group."""
TEMP_DRAG_DELTA = 10.0


def analyse_group(name: str, gpus: Sequence[GpuSample]) -> TpGroupReport:
    """Compare each GPU with its group's median SM clock and temperature."""
    clocks = [g.sm_clock_mhz for g in gpus if g.sm_clock_mhz is not None]
    temps = [g.temp_c for g in gpus if g.temp_c is not None]
    med_clock = median(clocks)
    med_temp = median(temps)
    members = []
    for g in gpus:
        ratio = g.sm_clock_mhz / med_clock if g.sm_clock_mhz is not None and med_clock else None
        tdelta = g.temp_c - med_temp if g.temp_c is not None and med_temp is not None else None
        idle_only = g.reasons_mask is not None and not (g.reasons_mask & THROTTLE_BITS) and g.reasons_mask & 0x1
        slow = ratio is not None and ratio < CLOCK_DRAG_RATIO
        hot = tdelta is not None and tdelta >= TEMP_DRAG_DELTA
        drags = bool(slow and not idle_only and len(gpus) > 1)
        reason = None
        if drags:
            reason = g.throttle_kind()
            if reason is None:
                near_slowdown = (
                    g.temp_c is not None and g.slowdown_temp_c is not None and g.temp_c >= g.slowdown_temp_c - 3
                )
                reason = "thermal" if (hot or near_slowdown) else "other"
        members.append(GroupMember(g, ratio, tdelta, drags, reason))
    slowdown = None
    if clocks and med_clock:
        slowdown = max(0.0, 100.0 * (1 - min(clocks) / med_clock))
    return TpGroupReport(name, tuple(members), med_clock, med_temp, slowdown)


def analyse_groups(groups: Sequence[Sequence[int]], gpus: Sequence[GpuSample]) -> list[TpGroupReport]:
    """Reports for given groups of GPU indices; GPUs missing from ``gpus`` are skipped."""
    by_index: dict[str, GpuSample] = {}
    for g in gpus:
        by_index.setdefault(g.gpu, g)
    reports = []
    for members in groups:
        found = [by_index[str(i)] for i in members if str(i) in by_index]
        if found:
            reports.append(analyse_group(f"{members[0]}-{members[-1]}", found))
    return reports
