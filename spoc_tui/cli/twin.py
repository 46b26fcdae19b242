"""``spoc twin calibrate|show|predict|check``: a twin of a live server, calibrated in minutes,
predicting ramps in seconds beside what was measured (docs/twin.md)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from spoc_tui.cli.experiment import ExperimentOptions, experiment_options
from spoc_tui.cli.options import api_key_options, default_option, from_config, sla_option, tls_options, twin_option
from spoc_tui.core.ramp.sla import DEFAULT_SLA
from spoc_tui.twin.model import WHAT_IF_FLAGS

if TYPE_CHECKING:
    from spoc_tui.core.results import RampHeader


def _bool(name: str, text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "on", "yes"):
        return True
    if t in ("0", "false", "off", "no"):
        return False
    from spoc_tui.core.errors import InputError

    raise InputError(f"{name}={text}: give true or false")


def parse_flags(items: tuple[str, ...], what: str) -> dict[str, object]:
    """``max-num-seqs=64`` ... into the twin's settings.

    Raises:
        InputError: an unknown flag, or a value of the wrong kind or range.
    """
    from spoc_tui.core.errors import InputError

    out: dict[str, object] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().removeprefix("--")
        if not sep or name not in WHAT_IF_FLAGS:
            raise InputError(f"{what} {item!r}: give FLAG=VALUE, FLAG one of {', '.join(WHAT_IF_FLAGS)}")
        key, kind = WHAT_IF_FLAGS[name]
        try:
            v: object = _bool(name, value) if kind == "bool" else int(value) if kind == "int" else float(value)
        except ValueError:
            raise InputError(
                f"{what} {item!r}: {value!r} is not a {'whole number' if kind == 'int' else 'number'}"
            ) from None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if key == "gpu_memory_utilization" and not 0 < float(v) <= 1:
                raise InputError(f"{what} {item!r}: gpu-memory-utilization is a share between 0 and 1")
            if key != "gpu_memory_utilization" and int(v) < 1:
                raise InputError(f"{what} {item!r}: must be at least 1")
        out[key] = v
    return out


@click.group("twin")
def twin_cmd() -> None:
    """A twin of a live vLLM server: calibrate it in minutes, then predict ramps, flag changes and
    fleets in seconds (docs/twin.md)."""


@twin_cmd.command("calibrate")
@click.option("--url", required=True, help="The vLLM server (idle: the probes time its steps).")
@click.option("--model", help="Served model name [default: the server's only model].")
@click.option("--tokenizer", help="Local tokenizer.json for exact prompt lengths [default: /tokenize].")
@default_option(
    "--budget",
    300.0,
    "Seconds of probing (more rounds narrow the fit's intervals); 20 to 3600.",
    "budget_s",
    type=float,
)
@click.option(
    "--engine-flag",
    "engine_flags",
    multiple=True,
    help="A setting the server does not report, as it was started: max-num-seqs=128, max-num-batched-tokens=8192, "
    "enable-chunked-prefill=false (repeatable) [default: vLLM's defaults, said in twin.json].",
)
@default_option(
    "--endpoint",
    "chat",
    "What the probes send: chat completions (as spoc ramp's profiles) or completions (as a trace replay).",
    type=click.Choice(("chat", "completions")),
)
@click.option("--dcgm", help="The GPUs' dcgm-exporter: their SM clocks during the probes go in twin.json.")
@click.option("--seed", type=int, default=0, show_default=True)
@default_option("--out", "twin.json", "Where to write the twin.", "out")
@api_key_options("Bearer token (never written to twin.json).")
@tls_options
def calibrate_cmd(
    url: str,
    model: str | None,
    tokenizer: str | None,
    budget_s: float,
    engine_flags: tuple[str, ...],
    endpoint: str,
    dcgm: str | None,
    seed: int,
    out: str,
    api_key: str | None,
) -> None:
    """Probe an idle server (prefills alone, decodes at several batch sizes and context lengths,
    prefills among decodes) and fit its engine's step time, each coefficient with its
    uncertainty. Exit code 0 with twin.json written, 1 when the server fails or is busy, 2 for bad
    input."""
    import asyncio

    from spoc_tui.collectors.scrape import metrics_url
    from spoc_tui.twin.calibrate import Calibrator
    from spoc_tui.twin.model import write_twin

    metrics_url(url)  # a bad URL is refused before anything runs
    told = parse_flags(engine_flags, "--engine-flag")
    if "gpu_memory_utilization" in told:
        from spoc_tui.core.errors import InputError

        raise InputError("--engine-flag gpu-memory-utilization: the server reports it (cache_config_info)")
    tty = sys.stderr.isatty()

    def progress(what: str, share: float) -> None:
        line = f"calibrating: {what} ({100 * share:.0f} % of {budget_s:g} s)"
        if tty:
            click.echo("\r\033[K" + line, nl=False, err=True)
        else:
            click.echo(line, err=True)

    cal = Calibrator(
        url,
        model=model,
        api_key=api_key,
        tokenizer=tokenizer,
        budget_s=budget_s,
        told=told,
        dcgm=dcgm,
        endpoint=endpoint,
        seed=seed,
        progress=progress,
    )
    try:
        twin = asyncio.run(cal.run())
    finally:
        if tty:
            click.echo("", err=True)
    write_twin(twin, out)
    click.echo("\n".join(twin.summary()))
    click.echo(f"wrote {out}")


@twin_cmd.command("show")
@click.argument("path", default="twin.json")
@click.option("--json", "as_json", is_flag=True, help="Print twin.json's object.")
def show_cmd(path: str, as_json: bool) -> None:
    """What a twin knows: the server's settings (and where each came from), the step-time
    coefficients with their spread, and how well they fit their own probes."""
    from spoc_tui.twin.model import read_twin

    twin = read_twin(path)
    click.echo(json.dumps(twin.as_dict(), indent=2) if as_json else "\n".join(twin.summary()))


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.0f} ms" if v < 10 else f"{v:.1f} s"


def _iv(v: float | None, iv: tuple[float | None, float | None] | None, rate: bool = False) -> str:
    if v is None:
        return "-"
    f = (lambda x: f"{x:.0f}") if rate else _fmt_s
    if iv is None or iv[0] is None or iv[1] is None:
        return f(v)
    return f"{f(v)} ({f(iv[0])}-{f(iv[1])})"


@twin_cmd.command("predict")
@twin_option("The calibrated twin.", default="twin.json", show_default=True)
@experiment_options
@sla_option("Latency limits, as spoc ramp takes them", DEFAULT_SLA)
@click.option(
    "--set",
    "what_if",
    multiple=True,
    help="A flag what-if: max-num-seqs=64, max-num-batched-tokens=4096, enable-chunked-prefill=false, "
    "enable-prefix-caching=false, gpu-memory-utilization=0.8 (repeatable).",
)
@default_option("--draws", 12, "Runs on draws of the fit (the intervals).", type=click.IntRange(0, 32))
@click.option("--out", "out_dir", help="Write ramp.json (predicted) into this folder.")
@click.option("--json", "as_json", is_flag=True, help="Print ramp.json's object.")
def predict_cmd(
    twin_path: str,
    exp: ExperimentOptions,
    sla: str | None,
    what_if: tuple[str, ...],
    draws: int,
    out_dir: str | None,
    as_json: bool,
) -> None:
    """Predict the ramp `spoc ramp` would run (the same users, pacing, steps and knee search) on
    the twin, in virtual time: each step's figures with prediction intervals (the fit's
    uncertainty, widening near saturation) and the knee with its interval. Nothing touches the
    server."""
    from spoc_tui.core.errors import InputError
    from spoc_tui.core.ramp.sla import parse_sla
    from spoc_tui.load.defaults import rules_error
    from spoc_tui.twin.model import read_twin
    from spoc_tui.twin.predict import Prediction, TraceRows, predict, read_rows
    from spoc_tui.workload import load_workload

    twin = read_twin(twin_path)
    src = exp.trace()
    rows: TraceRows | None = None
    trace_doc: dict[str, object] | None = None
    if src is not None:
        if click.get_current_context().get_parameter_source("profile") is not click.core.ParameterSource.DEFAULT:
            raise InputError("--trace replays the trace's own rows: give --trace or --profile, not both")
        rows = read_rows(src, twin.server.max_model_len)
        trace_doc = src.header(rows.read, rows.skipped, rows.span_s)
    p = Prediction(
        twin=twin,
        workload=load_workload(exp.profile),
        plan=exp.plan(src),
        limits=tuple(parse_sla(from_config(sla, "sla", "--sla", default=DEFAULT_SLA))),
        **exp.rules().values(),
        flags=parse_flags(what_if, "--set"),
        draws=draws,
        trace=rows,
    )
    if (why := rules_error(p, rows is not None)) is not None:
        raise InputError(why)
    t0 = time.perf_counter()
    quiet = as_json or not sys.stderr.isatty()
    res = predict(p, None if quiet else lambda m: click.echo(f"\r\033[Kpredicting: {m}", nl=False, err=True))
    took = time.perf_counter() - t0
    if not quiet:
        click.echo("", err=True)
    # the levels as a measured ramp's ramp.json names them (geom:1:8 as 1,2,4,8; auto as auto:256)
    from spoc_tui.twin.predicted import predicted_header

    header = predicted_header(p, res, twin_path, p.plan.describe(), took, trace_doc)
    if out_dir is not None:
        _write_predicted(Path(out_dir), header, res)
    if as_json:
        from spoc_tui.core.results import dumps, ramp_doc

        click.echo(dumps(ramp_doc(header, res.steps, res.knee, "complete", time.time())))
        return
    click.echo(prediction_text(p, res, took))
    if out_dir is not None:
        click.echo(f"wrote {out_dir}/ramp.json (predicted)")


def _write_predicted(out_dir: Path, header: RampHeader, res: Any) -> None:
    """The predicted ramp as ``ramp.json``, by the writer of a measured ramp's."""
    from spoc_tui.load.ramp import ResultWriter

    writer = ResultWriter(out_dir, header, requests=False)
    try:
        writer.write(res.steps, res.knee, "complete")
    finally:
        writer.close()
    if writer.kept:
        click.echo(writer.kept_note, err=True)


def prediction_text(p: Any, res: Any, took: float) -> str:
    from spoc_tui.core.ramp.text import knee_sentence

    lines = [
        f"predicted by the twin of {p.twin.server.model} ({res.draws} draws of the fit, {took:.1f} s)"
        + (f"; what-if: {', '.join(f'{k}={v}' for k, v in p.flags.items())}" if p.flags else ""),
        f"{'level':>10}  {'decision':<12} {'TTFT p50':<22} {'TTFT p99':<22} {'ITL p50':<20} {'E2E p50':<22} "
        f"{'tok/s':<16} queued",
    ]
    for i, r in enumerate(res.runs):
        s, iv = r.step, res.intervals[i]
        lines.append(
            f"{s.level_text:>10}  {s.decision:<12} {_iv(s.latency.ttft.p50, iv['ttft_p50']):<22} "
            f"{_iv(s.latency.ttft.p99, iv['ttft_p99']):<22} {_iv(s.latency.itl.p50, iv['itl_p50']):<20} "
            f"{_iv(s.latency.e2e.p50, iv['e2e_p50']):<22} "
            f"{_iv(s.output_tokens_per_s, iv['output_tokens_per_s'], rate=True):<16} {100 * res.saturated(i):.0f} %"
        )
        if note := res.step_notes(i):
            lines.append(f"        {note}")
    sentence, _tone = knee_sentence(res.knee)
    lines.append(f"knee (predicted): {sentence}")
    if res.knee.inferred is not None:
        lines.append(f"knee across steps (predicted): {res.knee.inferred.text}")
    lines.extend(f"note: {n}" for n in res.notes)
    if p.trace is None and not p.workload.ignore_eos:
        lines.append(
            "note: every answer is predicted as long as the profile asks; a model that stops earlier makes the real "
            "ramp lighter"
        )
    return "\n".join(lines)


@twin_cmd.command("check")
@twin_option("The calibrated twin.", default="twin.json", show_default=True)
@click.option("--ramp", "ramp_path", required=True, help="A measured ramp (folder or ramp.json) on the twin's server.")
@click.option("--draws", type=click.IntRange(0, 32), default=8, show_default=True)
@click.option(
    "--set",
    "what_if",
    multiple=True,
    help="The ramp ran with a flag the twin was not calibrated at (max-num-seqs=4...): check the what-if.",
)
@click.option(
    "--trace",
    "trace_path",
    help="The trace a trace replay's ramp replayed (ramp.json keeps its name and selection, not the file).",
)
@click.option(
    "--learn-answers",
    is_flag=True,
    help="After the check, the twin learns how long the server's answers are from the ramp's requests "
    "(its profile letting the server stop at EOS) and is written back: predictions then draw from them.",
)
@click.option(
    "--resimulate",
    is_flag=True,
    help="Work the twin's predictions out again even where the ramp kept this twin's, made as it ran (spoc ramp "
    "--twin).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def check_cmd(
    twin_path: str,
    ramp_path: str,
    draws: int,
    what_if: tuple[str, ...],
    trace_path: str | None,
    learn_answers: bool,
    resimulate: bool,
    as_json: bool,
) -> None:
    """The twin's prediction of a measured ramp beside it, step by step (absolute % error of
    TTFT, ITL and E2E p50/p90 and tokens/s, and whether each measurement lies in the prediction's
    interval), and whether the twin still holds. Exit code 0 when it holds, 1 when it drifted,
    2 for files that cannot be read."""
    from spoc_tui.core.results import read_ramp
    from spoc_tui.twin.answers import learned_lengths
    from spoc_tui.twin.check import CHECKED, answers_of, check
    from spoc_tui.twin.model import MAX_ANSWERS, read_twin, with_answers, write_twin
    from spoc_tui.twin.shadow import twin_id

    twin = read_twin(twin_path)
    ramp = read_ramp(ramp_path)
    lengths = answers_of(Path(ramp.path).parent, ramp.header) if learn_answers else []  # refused before the check
    shadow_id = None if resimulate else twin_id(twin, twin_path)
    res = check(twin, ramp, draws, flags=parse_flags(what_if, "--set"), trace=trace_path, shadow_id=shadow_id)
    learned = ""
    if lengths:
        got = learned_lengths(lengths, MAX_ANSWERS)
        taught = with_answers(twin, got.lengths, got.text(f"the ramp {Path(ramp.path).parent.name}"))
        write_twin(taught, twin_path)
        learned = f"the twin learned its answers' lengths: {taught.answer_text()}; written to {twin_path}"
    if as_json:
        doc = res.as_dict()
        if learned:
            doc["learned_answers"] = {"lengths": len(taught.answer_lengths), "from": taught.answers_from}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(f"twin {twin_path} against {ramp.path} ({len(res.steps)} steps, {res.draws} draws)")
        if res.source == "shadow":
            click.echo("(its predictions made as the ramp ran, by spoc ramp --twin, read from ramp.json)")
        head = "  ".join(f"{k:<18}" for k in CHECKED)
        click.echo(f"{'level':>10}  {head}")
        for s in res.steps:
            cells = []
            for k in CHECKED:
                e = s.error_pct(k)
                mark = {True: "", False: "!", None: ""}[s.inside(k)]
                cells.append(f"{'-' if e is None else f'{e:.0f} %'}{mark:<1}".ljust(18))
            click.echo(f"{s.level:>10}  " + "  ".join(cells))
        click.echo("(absolute error of the prediction; ! = the measurement lies outside the prediction's interval)")
        for c in res.clocks:
            click.echo(c.text)
        click.echo(("the twin holds: " if res.holds else "the twin DRIFTED: ") + res.why)
        if learned:
            click.echo(learned)
    sys.exit(0 if res.holds else 1)
