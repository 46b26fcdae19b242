"""The Capacity screen: the KV-cache arithmetic, recomputed as the inputs change.

Prefilled from the monitored server when one is connected: its model (when it matches a
preset), its block size and KV dtype from ``cache_config_info``, its GPU from the GPU panel;
the server's own KV token count is shown next to the prediction.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, Select, Static

from spoc_tui.capacity.args import CapacityArgs
from spoc_tui.capacity.service import (
    TYPICAL_CONTEXT,
    compute,
    fits_instead,
    render,
    users_estimate,
)
from spoc_tui.core import fmt
from spoc_tui.core.analysis.fleetplan import PlanError, plan_from_ramp, plan_text
from spoc_tui.core.errors import InputError
from spoc_tui.core.hardware.capacity import CapacityError, CapacityPlan
from spoc_tui.core.hardware.presets import GPUS, MODELS, GpuSpec, ModelSpec, PresetError
from spoc_tui.core.results import RampDoc, read_ramp
from spoc_tui.tui.screens.keys import work_screen_keys
from spoc_tui.tui.widgets.badge import WorkBadge
from spoc_tui.tui.widgets.fields import Field


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


class CapacityScreen(Screen[None]):
    AUTO_FOCUS = None
    """No field takes the keys when the screen opens: Tab (or a click) to edit, Esc to leave."""

    BINDINGS = work_screen_keys(letters="lt")

    DEFAULT_CSS = """
    CapacityScreen Horizontal { height: auto; padding: 0 1; }
    CapacityScreen Label { padding: 0 1 0 0; }
    CapacityScreen Select { width: 24; }
    CapacityScreen Input { width: 14; }
    CapacityScreen #result { padding: 1 1; height: auto; }
    CapacityScreen #plan { padding: 0 1 1 1; height: auto; }
    CapacityScreen #users { padding: 0 1 1 1; height: auto; }
    """

    def __init__(self, ramp_path: Path | None = None) -> None:
        super().__init__()
        self.server_config: dict[str, str] = {}
        self.server_label = ""
        self.server_models: tuple[str, ...] = ()
        self.server_form: tuple[str | None, str | None, int] | None = None
        """(model preset, GPU preset, TP) the monitored server was recognised as: only that form is
        compared with its own figures."""
        self.ramp_path = ramp_path
        self._ramp: RampDoc | InputError | None = None

    def compose(self) -> ComposeResult:
        yield Static("Capacity: how many sequences fit", id="title")
        with VerticalScroll():
            with Horizontal():
                yield Label("model")
                yield Select(
                    [(m, m) for m in MODELS], value="llama-3.1-8b", allow_blank=False, id="model", compact=True
                )
                yield Label("GPU")
                yield Select([(g, g) for g in GPUS], value="h100-80gb", allow_blank=False, id="gpu", compact=True)
                yield Label("TP")
                yield Field("1", id="tp", restrict=r"[0-9]*")
            with Horizontal():
                yield Label("max len")
                yield Field("", placeholder="model", id="max_len", restrict=r"[0-9]*")
                yield Label("avg context")
                yield Field(
                    str(TYPICAL_CONTEXT),
                    id="avg",
                    restrict=r"[0-9]*",
                    tooltip="tokens held per conversation on average: a typical chat, not the maximum length",
                )
                yield Label("GPU util")
                yield Field("0.9", id="util", restrict=r"[0-9.]*")
            with Horizontal():
                yield Label("KV dtype")
                yield Select([("auto", "auto"), ("fp8", "fp8")], value="auto", allow_blank=False, id="kv", compact=True)
                yield Label("weights")
                yield Select(
                    [("model's", "default"), ("bf16", "bf16"), ("fp8", "fp8"), ("int4", "int4")],
                    value="default",
                    allow_blank=False,
                    id="weights",
                    compact=True,
                )
                yield Label("block")
                yield Field("16", id="block", restrict=r"[0-9]*")
            yield Static("", id="result")
            yield Static("", id="users")
            with Horizontal(id="plan-form"):
                yield Label("plan for users")
                yield Field("1000", id="plan_users", restrict=r"[0-9]*")
                yield Label("headroom")
                yield Field("0.2", id="headroom", restrict=r"[0-9.]*")
            yield Static("", id="plan")
        yield WorkBadge()
        yield Footer()

    def on_mount(self) -> None:
        self.result = self.query_one("#result", Static)
        self.plan = self.query_one("#plan", Static)
        self.users = self.query_one("#users", Static)
        self.recompute()

    def prefill(
        self, model_names: tuple[str, ...], cache_config: dict[str, str], gpu_label: str | None, tp: int | None
    ) -> None:
        """Take what the monitored server says about itself."""
        self.server_config = dict(cache_config)
        model_key: str | None = None
        gpu_key: str | None = None
        for name in model_names:
            for key, m in MODELS.items():
                if m.served_name.lower() == name.lower() or key == name.lower():
                    self.query_one("#model", Select).value = model_key = key
        if gpu_label:
            for key, g in GPUS.items():
                if g.label.lower() in gpu_label.lower() or gpu_label.lower() in g.label.lower():
                    self.query_one("#gpu", Select).value = gpu_key = key
        self.server_form = (model_key, gpu_key, tp or 1)
        if cache_config.get("block_size", "").isdigit():
            self.query_one("#block", Input).value = cache_config["block_size"]
        if "fp8" in cache_config.get("cache_dtype", ""):
            self.query_one("#kv", Select).value = "fp8"
        try:
            util = float(cache_config.get("gpu_memory_utilization", ""))
            self.query_one("#util", Input).value = f"{util:g}"
        except ValueError:  # the server did not say (or said "None"): keep the form's value
            pass
        if tp:
            self.query_one("#tp", Input).value = str(tp)
        self.server_label = fmt.names(model_names)
        self.server_models = model_names
        self.recompute()

    def args(self) -> CapacityArgs:
        util_text = self.query_one("#util", Input).value
        try:
            util = float(util_text)
        except ValueError:
            raise CapacityError(f"GPU util {util_text!r} is not a number") from None
        weights = str(self.query_one("#weights", Select).value)
        return CapacityArgs(
            model=str(self.query_one("#model", Select).value),
            gpu=str(self.query_one("#gpu", Select).value),
            tp=_int(self.query_one("#tp", Input).value) or 1,
            max_model_len=_int(self.query_one("#max_len", Input).value),
            avg_context=_int(self.query_one("#avg", Input).value),
            weights_dtype=None if weights == "default" else weights,
            kv_cache_dtype=str(self.query_one("#kv", Select).value),
            gpu_memory_utilization=util,
            block_size=_int(self.query_one("#block", Input).value) or 16,
        )

    def ramp(self) -> RampDoc:
        """The last ramp's result, read once for the screen (every keystroke recomputes the Plan
        and Users panels; the file does not change under them).

        Raises:
            InputError: no readable ramp (the same error each time).
        """
        if self._ramp is None:
            try:
                self._ramp = read_ramp(str(self.ramp_path))
            except InputError as e:
                self._ramp = e
        if isinstance(self._ramp, InputError):
            raise self._ramp
        return self._ramp

    def replan(self) -> None:
        """The Plan panel: replicas for the users asked, from the last ramp's knee."""
        if self.ramp_path is None:
            self.plan.update(Text("Plan: no ramp yet. Run one on the Load screen (l) or with spoc ramp.", style="dim"))
            return
        try:
            doc = self.ramp()
            if self.server_models and doc.model not in self.server_models:
                raise PlanError(
                    f"the last ramp measured {doc.model!r}, the monitored server serves "
                    f"{', '.join(self.server_models)}: ramp this server first"
                )
            users = _int(self.query_one("#plan_users", Input).value)
            if users is None:
                raise PlanError("users must be a whole number above 0")
            try:
                headroom = float(self.query_one("#headroom", Input).value)
            except ValueError:
                raise PlanError("headroom must be a number between 0 and 0.9") from None
            p = plan_from_ramp(doc, users, headroom)
        except InputError as e:
            self.plan.update(Text(f"Plan: {e}", style="bold red"))
            return
        text = Text("Plan ", style="bold")
        text.append(f"(from {self.ramp_path}): ", style="dim")
        text.append(plan_text(p) + "\n  manifests: spoc plan --ramp " + str(self.ramp_path) + f" --users {users}")
        self.plan.update(text)

    def recompute(self) -> None:
        if not self.is_mounted:
            return
        self.replan()
        try:
            a = self.args()
            model, gpu = MODELS[a.model], GPUS[str(a.gpu)]
        except (CapacityError, PresetError, KeyError) as e:
            self.result.update(Text(f"cannot compute: {e}", style="bold red"))
            self.users.update("")
            return
        try:
            plan = compute(a, model, gpu)
        except CapacityError as e:
            text = Text(f"does not fit: {e}", style="bold red")
            instead = fits_instead(a, model, gpu)
            text.append(
                "\n  would fit: " + "; ".join(instead) if instead else "\n  nothing within reach fits", style="yellow"
            )
            self.result.update(text)
            self.users.update("")
            return
        # like with like: the server's own figures only next to the form it was recognised as
        form = (a.model, a.gpu, a.tp)
        same = self.server_form is not None and form == self.server_form
        text = Text(render(a, model, gpu, plan, self.server_config if same else None))
        if self.server_label:
            if same:
                text.append(f"\n  prefilled from the monitored server ({self.server_label})", style="dim")
            else:
                _, g, tp = self.server_form or (None, None, 1)
                text.append(
                    f"\n  not compared with the monitored server: it serves {self.server_label}"
                    + (f" on {g}" if g else "")
                    + f" (TP {tp}); the form now describes another set-up",
                    style="dim",
                )
        self.result.update(text)
        self.users.update(self._users_text(a, model, gpu, plan))

    def _users_text(self, a: CapacityArgs, model: ModelSpec, gpu: GpuSpec, plan: CapacityPlan) -> Text:
        """The answer in users: the queueing view with the service time from the last ramp of
        this model, or from the model and GPU."""
        ramp = None
        if self.ramp_path is not None:
            try:
                doc: RampDoc | None = self.ramp()
            except InputError:
                doc = None
            names = {model.served_name.lower(), a.model.lower()}
            if doc is not None and doc.model.lower() in names:
                ramp = doc
        est = users_estimate(model, gpu, plan, a.tp, ramp)
        t = Text("Users ", style="bold")
        t.append(
            f"about {est.saturation:,.0f} chat users saturate {est.seats} seats (min of the sequences that fit "
            f"and max-num-seqs 256)\n",
        )
        t.append(f"  {est.basis}\n", style="dim")
        for users, util, wait in est.rows:
            w = "saturated: the queue grows" if wait == float("inf") else f"expected wait {wait * 1000:,.0f} ms"
            t.append(f"    {users:>7,} users  {util:>4.0%} busy  {w}\n", style="red" if wait == float("inf") else "")
        t.append("  an open M/M/c approximation: decode slows as the batch grows, so real waits begin earlier", "dim")
        return t

    def on_input_changed(self, event: Input.Changed) -> None:
        self.recompute()

    def on_select_changed(self, event: Select.Changed) -> None:
        self.recompute()
