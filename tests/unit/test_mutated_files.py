"""Every file a user hands spoc, read with one value changed: to another type, a huge or
non-finite number, or removed. A reader (and what uses what it read) either takes the file or
raises spoc's own error with the file and the field named; never a TypeError, a hang or an
OverflowError. Each case mutates a real file (a simulator's ramp and its prediction, a study,
a twin, a monitor recording, an H200 NVML recording, the built-in profiles, the search space,
a model's config.json) a fixed number of times from a fixed seed.

The sweep this is the regression guard of (thousands of mutants a reader) found ten such
faults; CHANGELOG 0.2.0, "Files and answers of another shape"."""

from __future__ import annotations

import copy
import json
import math
import random
import signal
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spoc_tui.core.errors import SpocError

FIX = Path(__file__).resolve().parents[1] / "fixtures"
MUTANTS = 120
VALUES: list[object] = [
    None,
    "x",
    "",
    -1,
    0,
    1e308,
    -1e308,
    3.5,
    [],
    {},
    True,
    [1],
    {"a": 1},
    10**30,
    math.nan,
    math.inf,
    -math.inf,
    10**400,
]
DELETE = object()


def _paths(node: object, pre: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield pre
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*pre, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            yield from _paths(v, (*pre, i))


def _set(doc: Any, path: tuple[Any, ...], value: object) -> Any:
    if not path:
        return None if value is DELETE else value
    node = doc
    for k in path[:-1]:
        node = node[k]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def _mutants(doc: object, seed: int, values: list[object]) -> Iterator[tuple[tuple[Any, ...], object, Any]]:
    rng = random.Random(seed)
    paths = list(_paths(doc))
    for _ in range(MUTANTS):
        path, value = rng.choice(paths), rng.choice([*values, DELETE])
        yield path, value, _set(copy.deepcopy(doc), path, value)


def _toml(doc: object) -> str:
    def v(x: object) -> str:
        if isinstance(x, bool):
            return "true" if x else "false"
        if isinstance(x, float):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else repr(x)
        if isinstance(x, (int, str)):
            return json.dumps(x)
        if isinstance(x, list):
            return "[" + ", ".join(v(i) for i in x) + "]"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {v(i)}" for k, i in x.items()) + "}"
        raise TypeError(x)

    if not isinstance(doc, dict):
        return "[not a table\n"  # a whole file replaced: not TOML
    return "".join(f"{json.dumps(k)} = {v(x)}\n" for k, x in doc.items() if x is not None)


def _sweep(write: Callable[[Any], None], doc: Any, use: Callable[[], object], seed: int, values: list[object]) -> None:
    """``use()`` on each mutant ``write`` puts in place: spoc's error or nothing, within 5 s."""
    odd = []

    def slow(*_: object) -> None:
        raise TimeoutError("took over 5 s")

    old = signal.signal(signal.SIGALRM, slow)
    try:
        for path, value, mutant in _mutants(doc, seed, values):
            write(mutant)
            signal.alarm(5)
            try:
                use()
            except SpocError:
                pass
            except Exception as e:
                odd.append((path, value, f"{type(e).__name__}: {e}"[:160]))
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert odd == [], odd[:5]


def _json_case(src: Path, use: Callable[[Path], object], tmp_path: Path, seed: int = 0) -> None:
    out = tmp_path / src.name
    _sweep(lambda m: out.write_text(json.dumps(m)), json.loads(src.read_text()), lambda: use(out), seed, VALUES)


def _jsonl_case(lines: list[str], name: str, use: Callable[[Path], object], tmp_path: Path) -> None:
    """One line of ``lines`` mutated at a time (each line in turn, several mutants each)."""
    out = tmp_path / name
    docs = [json.loads(line) for line in lines]
    for k, doc in enumerate(docs):

        def write(m: Any, k: int = k) -> None:
            out.write_text("\n".join([*lines[:k], json.dumps(m), *lines[k + 1 :]]) + "\n")

        _sweep(write, doc, lambda: use(out), seed=k, values=VALUES)


@pytest.mark.parametrize("name", ["ramp.json", "predicted.json"])
def test_a_ramp_and_its_report_comparison_and_plan(tmp_path, name):
    from spoc_tui.core.analysis.compare import compare
    from spoc_tui.core.analysis.fleetplan import plan_from_ramp, plan_text
    from spoc_tui.core.results import read_ramp
    from spoc_tui.report.html import comparison_report, ramp_report

    good = read_ramp(FIX / "results" / "sim" / "ramp.json")

    def use(p: Path) -> None:
        doc = read_ramp(p)
        ramp_report(doc)
        comparison_report(compare(good, doc))
        plan_text(plan_from_ramp(doc, 100, 0.2, None))

    _json_case(FIX / "results" / "sim" / name, use, tmp_path)


def test_a_study(tmp_path):
    from spoc_tui.core.results import read_pareto, read_trials
    from spoc_tui.report.html import study_report

    _json_case(FIX / "results" / "v1" / "pareto.json", lambda p: study_report(read_pareto(p), []), tmp_path)
    lines = (FIX / "results" / "v1" / "trials.jsonl").read_text().splitlines()
    _jsonl_case(lines, "trials.jsonl", read_trials, tmp_path)


def test_a_twin_and_its_prediction(tmp_path):
    from spoc_tui.core.ramp.knee import FixedUsers
    from spoc_tui.twin.model import read_twin, write_twin
    from spoc_tui.twin.predict import Prediction, predict
    from spoc_tui.workload import load_workload
    from tests.unit.test_twin_fit import twin

    src = tmp_path / "src" / "twin.json"
    src.parent.mkdir()
    write_twin(twin(0.1), src)
    chat = load_workload("chatbot")

    def use(p: Path) -> None:
        predict(Prediction(read_twin(p), chat, FixedUsers([2]), (), step_s=5, warmup_s=1, draws=1))

    _json_case(src, use, tmp_path)


def test_a_monitor_recording_and_its_export(tmp_path):
    from spoc_tui.core.monitor.model import HeadroomShown
    from spoc_tui.core.monitor.recording import Recorder, export, read_recording
    from spoc_tui.core.monitor.snapshots import SourceStatus
    from tests.tui.helpers import gpu_tick, server_tick

    src = tmp_path / "src.jsonl"
    r = Recorder(src, {"title": "t", "window_s": 60})
    r.servers(server_tick(), t=100.0)
    r.gpus(gpu_tick().tick, [[0, 1, 2, 3]], None, t=100.5)
    r.status(SourceStatus("http://192.0.2.5:8000", False, "cannot connect"), t=101.0)
    r.headroom({"http://192.0.2.5:8000": HeadroomShown("headroom x2.1 (95 %: 1.8-2.4)", 2.1, True)}, t=102.0)
    r.close()

    def use(p: Path) -> None:
        rec = read_recording(p)
        export(rec, "csv")
        export(rec, "json")

    _jsonl_case(src.read_text().splitlines(), "rec.jsonl", use, tmp_path)


def test_an_nvml_recording(tmp_path):
    from spoc_tui.collectors.nvml import TraceReplay

    lines = (FIX / "h200" / "nvml_trace.jsonl").read_text().splitlines()[:4]

    def use(p: Path) -> None:
        rep = TraceReplay(p)
        for _ in range(len(rep.rows) + 1):
            rep.read()

    _jsonl_case(lines, "nvml.jsonl", use, tmp_path)


def test_a_model_config_json_in_spoc_capacity(tmp_path):
    from spoc_tui.capacity.args import CapacityArgs
    from spoc_tui.capacity.service import CapacityRequest, capacity_report

    src = tmp_path / "src" / "config.json"
    src.parent.mkdir()
    src.write_text(
        json.dumps(
            {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
             "intermediate_size": 14336, "max_position_embeddings": 131072, "vocab_size": 128256,
             "torch_dtype": "bfloat16", "head_dim": 128, "tie_word_embeddings": False}
        )
    )  # fmt: skip

    def use(p: Path) -> None:
        args = CapacityArgs(model=str(p), gpu="h100-80gb")
        capacity_report(CapacityRequest(args, queue_users=[1, 8])).text()

    _json_case(src, use, tmp_path)


TOML_VALUES = [v for v in VALUES if v is not None] + [float("nan"), float("inf"), 2**62]


@pytest.mark.parametrize("profile", ["chatbot", "agent", "coding", "logs"])
def test_a_profile_and_the_conversations_it_draws(tmp_path, profile):
    from spoc_tui.workload import TextMaker, load_workload, plan_conversation

    src = Path(__file__).resolve().parents[2] / "spoc_tui" / "workload" / "profiles" / f"{profile}.toml"
    out = tmp_path / f"{profile}.toml"

    def use() -> None:
        w = load_workload(str(out))
        rng, maker, cache = random.Random(0), TextMaker(), {}
        for _ in range(5):
            plan_conversation(w, rng, maker, 4096, cache)

    _sweep(lambda m: out.write_text(_toml(m)), tomllib.loads(src.read_text()), use, 0, TOML_VALUES)


def test_a_search_space(tmp_path):
    from spoc_tui.core.tuning.space import load_space

    src = Path(__file__).resolve().parents[2] / "spoc_tui" / "tune" / "default_space.toml"
    out = tmp_path / "space.toml"
    _sweep(
        lambda m: out.write_text(_toml(m)), tomllib.loads(src.read_text()), lambda: load_space(str(out)), 0, TOML_VALUES
    )


def test_what_the_review_found_non_finite_is_read_as_not_a_number(tmp_path):
    """Issue 74: NaN in ``knee.levels`` and ``steps[].trace.rows``, Infinity as a knee, were
    tracebacks in ``spoc report`` and ``spoc compare``; a recording whose headroom is a list or
    whose ``t`` is Infinity crashed ``spoc replay``; its ``--export json`` wrote bare NaN. JSON has
    no NaN: read as null (n/a), as spoc writes it; a record that cannot be one is skipped."""
    from spoc_tui.core.analysis.compare import compare
    from spoc_tui.core.monitor.model import HeadroomShown
    from spoc_tui.core.monitor.recording import Recorder, export, read_recording
    from spoc_tui.core.results import read_ramp
    from spoc_tui.report.html import comparison_report, ramp_report

    doc = json.loads((FIX / "results" / "sim" / "ramp.json").read_text())
    doc["knee"]["levels"], doc["knee"]["estimate"] = math.nan, math.inf
    doc["steps"][0]["trace"] = {"rows": math.nan}
    doc["steps"][1]["request_rate"] = -math.inf
    (tmp_path / "ramp.json").write_text(json.dumps(doc))  # NaN, Infinity, -Infinity: Python's JSON
    bad = read_ramp(tmp_path / "ramp.json")
    assert bad.knee is None or bad.knee.inferred is None or bad.knee.inferred.estimate is None
    ramp_report(bad)
    comparison_report(compare(read_ramp(FIX / "results" / "sim" / "ramp.json"), bad))

    src = tmp_path / "rec.jsonl"
    r = Recorder(src, {"title": "t", "window_s": 60})
    r.headroom({"s": HeadroomShown("headroom x2", 2.0, True)}, t=1.0)
    r.headroom({"s": HeadroomShown("headroom x?", math.nan, False)}, t=2.0)  # written as null
    r.close()
    with src.open("a") as f:
        f.write('{"t": 3.0, "kind": "headroom", "headroom": [1, 2]}\n{"t": Infinity, "kind": "status"}\n')
    rec = read_recording(src)
    assert [x.t for x in rec.records] == [1.0, 2.0] and rec.skipped == 2
    assert rec.records[1].headroom is not None and rec.records[1].headroom["s"].estimate is None
    out = export(rec, "json")
    assert "NaN" not in out and "Infinity" not in out and json.loads(out)["records"][0]["headroom"]


def test_an_opentelemetry_trace(tmp_path):
    """Issue 74: the OTLP reader joins the sweep (its times, ids and token counts mutated)."""
    from spoc_tui.core.traces.read import read_trace
    from tests.unit.test_otel import SESSION, export

    lines = [json.dumps(export(SESSION[:4])), json.dumps(export(SESSION[4:]))]
    _jsonl_case(lines, "otel.jsonl", lambda p: list(read_trace(p, "otel")), tmp_path)
