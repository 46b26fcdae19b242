"""Human formatting of figures; ``None`` is always shown as ``n/a``."""

from __future__ import annotations

import math

NA = "n/a"


def seconds(v: float | None, upper_bound: bool = False) -> str:
    """Latency: ms below one second, s above; ``≤`` before a figure that is an upper bound."""
    if v is None:
        return NA
    mark = "≤" if upper_bound else ""
    if v < 1.0:
        return mark + (f"{v * 1000:.1f}ms" if v < 0.1 else f"{v * 1000:.0f}ms")
    return f"{mark}{v:.2f}s"


def pct(v: float | None, fraction: bool = True, digits: int = 0) -> str:
    if v is None:
        return NA
    return f"{v * 100 if fraction else v:.{digits}f}%"


def num(v: float | None, digits: int = 0, unit: str = "") -> str:
    if v is None:
        return NA
    if digits == 0:
        return f"{v:,.0f}{unit}"
    return f"{v:,.{digits}f}{unit}"


def plain(v: float | None, unit: str = "") -> str:
    """A whole number without thousands separators (clocks, watts, degrees)."""
    return NA if v is None else f"{v:.0f}{unit}"


def _scaled(v: float | None, steps: tuple[tuple[float, float, str, str], ...], last: str, unit: str = "") -> str:
    """``v`` by the first step (threshold, divisor, format, suffix) it reaches, else ``last``."""
    if v is None:
        return NA
    for threshold, divisor, spec, suffix in steps:
        if v >= threshold:
            return f"{v / divisor:{spec}}{suffix}{unit}"
    return f"{v:{last}}{unit}"


def rate(v: float | None, unit: str = "/s") -> str:
    return _scaled(v, ((10_000, 1000, ".1f", "k"), (100, 1, ".0f", "")), ".1f", unit)


def count(v: float | None) -> str:
    return _scaled(v, ((1e9, 1e9, ".2f", "G"), (1e6, 1e6, ".2f", "M"), (1e4, 1e3, ".1f", "k")), ".0f")


def short_source(src: str) -> str:
    """A source as the screens name it: ``http://h:8000/metrics`` -> ``h:8000``."""
    for p in ("http://", "https://"):
        src = src.removeprefix(p)
    return src.removesuffix("/metrics")


def names(items: tuple[str, ...] | list[str], limit: int = 3, width: int = 48) -> str:
    """A list of names bounded for one line: at most ``limit``, each cut to ``width`` characters,
    then "and N more" (a server with 10,000 LoRA adapters must not print a 109 KB line)."""
    if not items:
        return NA
    shown = [n if len(n) <= width else n[: width - 1] + "…" for n in list(items)[:limit]]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" and {more:,} more" if more > 0 else "")


SPARK = " ▁▂▃▄▅▆▇█"
SPARK_ASCII = " .:-=+*#%@"


def sparkline(values: list[float | None], low: float = 0.0, marks: str = SPARK) -> str:
    """One character a value, from ``low`` (the first mark, and any value under it) to the largest
    (the last; every value at ``low``: the first mark); a value missing or not finite is a ``·``."""
    known = [v if v is not None and math.isfinite(v) else None for v in values]
    top = max((v for v in known if v is not None), default=low)
    span = top - low
    out = []
    for v in known:
        if v is None:
            out.append("·")
        else:
            out.append(marks[max(0, round((v - low) / span * (len(marks) - 1)))] if span > 0 else marks[0])
    return "".join(out)
