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
| `c` | the Capacity screen: KV-cache arithmetic, prefilled from this server (`m` or `Esc` back) |
| `l` | the Load screen: run a ramp against this server (`m` or `Esc` back; the ramp keeps running); `F6` there profiles the running step |
| `t` | the Tune screen: an NSGA-II study over server flags, the Pareto front live (`m` or `Esc` back; the study keeps running) |
| `F8` | save a screenshot (SVG) to the data folder |
| `?` | this help |
| `q` | quit |

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
