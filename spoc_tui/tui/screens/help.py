"""The help screen (``?``)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP_TEXT = """\
# spoc-tui monitor

| key | action |
|---|---|
| `p` | pause / resume refreshing (the last data stays) |
| `w` | the charts' span: 1, 5, 15 or 60 minutes |
| `l` / `F3` | the Load screen: run a ramp against this server (the ramp keeps running when you leave); `F6` there profiles the running step |
| `t` / `F4` | the Tune screen: an NSGA-II study over server flags, the Pareto front live (the study keeps running) |
| `c` / `F5` | the Capacity screen: KV-cache arithmetic and the fleet plan, prefilled from this server |
| `m`, `Esc` / `F2` | back to the monitor |
| `ctrl+r`, `ctrl+x` | start, stop a ramp or study (also from inside a field) |
| `Tab`, `Esc` | into a form field, out of it (letters are typed into a field only while you edit it) |
| `ctrl+p` | the command palette: every action above by name |
| `F8` | save a screenshot (SVG) to the data folder |
| `?` / `F1` | this help |
| `q` | quit (asks first while a ramp or study runs) |

**Verdict** (under the servers): the first that holds of *down*, *throttled* (a GPU of the server
throttles), *KV-bound* (KV cache ≥ 90 % or preemptions), *queue-bound* (requests wait in each of the
last 5 refreshes with the KV cache below 90 %), *SLA broken*, *idle*, *healthy*. With `--sla` (or
`sla` in the config) latency cells turn red past a limit and green within it; a percentile with too
few observations behind it (dim italic) is not judged.

**Charts**: requests, KV cache, tokens/s, TTFT and ITL p99 (the dashed red line is the SLA), and per
GPU SM clock, temperature (line: slowdown) and power (line: the limit), from 0 on a round scale.
Gaps are times without data (a source down).

**Events**: sources down and back, server restarts, preemption bursts, the KV cache filling,
throttling episodes (one per episode, ended after 10 s without throttling) and ramp and study steps.

**Servers**: *Run* requests in the batch, *Wait* queued, *KV* cache use, *Prefix* prefix-cache
hit rate over the window, *Preempt* total and per second, *In t/s* and *Out t/s* prompt and
generated tokens per second over the window.

**Latency**: percentiles from the differences of the server's histogram buckets over the
stated window, merged across engines and replicas before the quantile (interpolated inside
buckets, as PromQL does). *lifetime* means no window exists yet. `n/a`: the server does not
export that metric, or nothing finished in the window. `≤` marks an upper bound, mean / (1 − q),
shown where it is tighter than interpolating (the observations sit low in a coarse bucket);
*dim italic*: fewer than 10 observations lie beyond that percentile in the window.

**Roofline**: vLLM's own estimates of FLOPs and bytes per GPU over the window (vLLM 0.17+;
counted only with `--enable-mfu-metrics`), as a share of the GPU's peak when its model is known,
tokens per engine step, and a reading: *idle* (no step), *overhead-bound* (both shares under
25 %), *memory-bound* (bandwidth share at least the FLOP share), *compute-bound* (otherwise).

**GPUs**: clock-event reasons decoded; *idle* is not throttling. A `▶` marks a GPU whose SM
clock drags its tensor-parallel group (the group runs at its slowest GPU's pace).

Figures from the spoc-tui simulator are labelled SIMULATED.

Press `Esc` to close.
"""  # noqa: E501  (a Markdown table row cannot be wrapped)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 100; height: 90%; border: round $accent; background: $surface; padding: 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP_TEXT)
