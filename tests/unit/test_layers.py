"""The package's order, checked on its import graph (function-level imports included).

The whole order, lowest first (:data:`ORDER`): core <- collectors, procs, workload <- load, sim,
report, capacity <- profile <- tune <- twin <- config <- tui <- cli; and inside core
(:data:`CORE_ORDER`) errors, redact, jsonsafe, fmt, durations, confidence <- files, textsafe <-
metrics, traces, ramp <- tuning <- hardware <- results (the codec, above what it encodes),
monitor <- analysis (what is read from result files). A package imports only from its own
package and those of a lower rank: two of one rank never import each other. There is no import
cycle.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "spoc_tui"

ORDER: list[set[str]] = [
    {"core"},
    {"collectors", "procs", "workload"},
    {"load", "sim", "report", "capacity"},
    {"profile"},
    {"tune"},  # a study sees the evaluator protocol only: the twin is above it
    {"twin"},
    {"config"},
    {"tui"},
    {"cli"},
]
"""The packages of ``spoc_tui``, lowest first (issue 78: the whole order stated, where a list of
forbidden edges named a few)."""
CORE_ORDER: list[set[str]] = [
    {"errors", "redact", "jsonsafe", "fmt", "durations", "confidence"},
    {"files", "textsafe"},
    {"metrics", "traces", "ramp"},
    {"tuning"},
    {"hardware"},
    {"results", "monitor"},
    {"analysis"},
]
"""The sub-packages and modules of ``spoc_tui.core``, lowest first: metrics below hardware (a
GPU's reading is parsed by metrics), the codec (results) above what it encodes, what is read from
result files (analysis) above the codec."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """Every spoc_tui module ``path`` imports, anywhere in the file (functions included)."""
    return imports_of_text(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_of_text(text: str, name: str, is_pkg: bool) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES)
    return {m for m in out if m == "spoc_tui" or m.startswith("spoc_tui.")}


GRAPH = {name: {m for m in imports(p) if m in MODULES and m != name} for name, p in MODULES.items()}


def rank_of(module: str) -> tuple[int, str] | None:
    """The rank of ``module``'s unit and the unit: a package of ``spoc_tui`` (:data:`ORDER`) or,
    inside core, a sub-package or module of it (:data:`CORE_ORDER`; ranked among core's only)."""
    parts = module.split(".")
    if len(parts) < 2 or module == "spoc_tui.core":  # core's own __init__ holds nothing
        return None
    if parts[1] == "core" and len(parts) > 2:
        return next(((i, f"core.{parts[2]}") for i, rank in enumerate(CORE_ORDER) if parts[2] in rank), None)
    return next(((i, parts[1]) for i, rank in enumerate(ORDER) if parts[1] in rank), None)


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` against the order: to a unit of the same rank or above."""
    bad = []
    for src, targets in graph.items():
        a = rank_of(src)
        for dst in targets:
            b = rank_of(dst)
            if a is None or b is None or a[1] == b[1]:
                continue
            if a[1].startswith("core.") != b[1].startswith("core."):
                if a[1].startswith("core."):  # core below every other package: ORDER's first rank
                    bad.append(f"{src} -> {dst} (core above {b[1]})")
                continue
            if b[0] >= a[0]:
                bad.append(f"{src} -> {dst} ({a[1]} rank {a[0]}, {b[1]} rank {b[0]})")
    return sorted(bad)


def test_every_module_has_a_rank():
    loose = sorted(m for m in MODULES if m not in ("spoc_tui", "spoc_tui.core") and rank_of(m) is None)
    assert not loose, f"modules outside the order: {loose}"


def test_every_import_goes_down_the_order():
    bad = wrong_way(GRAPH)
    assert not bad, "imports against the order:\n" + "\n".join(bad)


def test_the_order_check_refuses_an_import_up_or_across():
    """The check itself can fail: an import up (core's ramp from its results, core from the twin)
    and one across a rank (load from sim) each break the order; one down does not."""
    assert wrong_way({"spoc_tui.core.ramp.knee": {"spoc_tui.core.results"}})
    assert wrong_way({"spoc_tui.core.results": {"spoc_tui.twin.headroom"}})
    assert wrong_way({"spoc_tui.load.ramp": {"spoc_tui.sim.run"}})
    assert not wrong_way({"spoc_tui.twin.headroom": {"spoc_tui.tune.study", "spoc_tui.core.ramp.knee"}})


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    # a package's __init__ importing its own submodules is how packages re-export: not a cycle
    graph = {
        src: {d for d in dsts if not (src.startswith(d + ".") and MODULES[d].name == "__init__.py")}
        for src, dsts in GRAPH.items()
    }
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle():
    """The check itself can fail: a made-up graph with a three-module cycle."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_layer_check_sees_function_level_imports(tmp_path):
    """An import inside a function (and a relative one) is an edge of the graph like any other."""
    src = tmp_path / "m.py"
    src.write_text(
        "def f():\n    from spoc_tui.tui.app import SpocApp\n    import spoc_tui.cli.main\n    return SpocApp\n"
    )
    assert {"spoc_tui.tui.app", "spoc_tui.cli.main"} <= imports_of_text(
        src.read_text(), "spoc_tui.core.probe", is_pkg=False
    )
    assert "spoc_tui.core.fmt" in imports_of_text("from . import fmt\n", "spoc_tui.core.probe", is_pkg=False)


@pytest.mark.parametrize(
    "package",
    [
        "spoc_tui.core",
        "spoc_tui.collectors",
        "spoc_tui.procs",
        "spoc_tui.load.ramp",
        "spoc_tui.tune.study",
        "spoc_tui.capacity.service",
        "spoc_tui.sim.run",
    ],
)
def test_below_the_ui_nothing_loads_textual(package):
    """Import hygiene (as Harlequin checks it): the core loads neither Textual, Rich nor httpx; the
    collectors and services do not load Textual (Rich comes with httpx, whose own CLI uses it)."""
    code = f"import sys, importlib; importlib.import_module({package!r}); print(sorted(m for m in ('textual',) if m in sys.modules))"
    if package == "spoc_tui.core":  # every core module
        code = (
            "import sys, importlib, pkgutil, spoc_tui.core as c; "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(c.__path__, 'spoc_tui.core.')]; "
            "print(sorted(m for m in ('textual', 'rich', 'httpx') if m in sys.modules))"
        )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=PKG.parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", f"{package} loads {r.stdout.strip()}"


WRITES = {"write_text", "write_bytes", "mkdir", "touch", "unlink", "rmtree"}
"""Calls that change files (a method of a path, or shutil's; a path's rename and replace share
their names with str's, and are left out)."""


def screen_policy(text: str, name: str) -> list[str]:
    """What a screen's source does beyond drawing and sending intents: an import of the twin (the
    app and its jobs hold it), a call that writes a file, an ``open`` for writing."""
    found = [f"imports {m}" for m in sorted(imports_of_text(text, name, False)) if m.startswith("spoc_tui.twin")]
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in WRITES:
            found.append(f"line {node.lineno}: .{f.attr}()")
        elif isinstance(f, ast.Name) and f.id == "open":
            modes = [a for a in node.args[1:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            modes += [k.value for k in node.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
            if any(set(str(m.value)) & set("wax+") for m in modes):
                found.append(f"line {node.lineno}: open(..., {modes[0].value!r})")
    return found


def test_screens_draw_and_send_intents():
    """Issue 78 point 3: no screen imports the twin or writes a file; they post what the operator
    asked (the Load form's twin is read by the reader the app hands it; a trial's command line is
    saved by the app)."""
    screens = {m: p for m, p in MODULES.items() if m.startswith("spoc_tui.tui.screens.")}
    assert len(screens) >= 5
    bad = {m: got for m, p in screens.items() if (got := screen_policy(p.read_text(), m))}
    assert not bad, bad


def test_the_screen_check_finds_a_twin_import_and_a_write():
    text = (
        "from spoc_tui.twin.model import read_twin\n"
        "def f(p):\n    p.write_text('x')\n    open(p, 'w')\n    open(p)\n    open(p, mode='a')\n"
    )
    assert screen_policy(text, "spoc_tui.tui.screens.probe") == [
        "imports spoc_tui.twin.model",
        "line 3: .write_text()",
        "line 4: open(..., 'w')",
        "line 6: open(..., 'a')",
    ]


def own_methods(cls: type) -> dict[str, list[str]]:
    """The methods (properties included) each of ``cls``'s classes of this package defines itself."""
    import inspect

    return {
        f"{c.__module__}.{c.__name__}": [
            k
            for k, v in vars(c).items()
            if inspect.isfunction(v) or isinstance(v, (property, staticmethod, classmethod))
        ]
        for c in cls.__mro__
        if c.__module__.startswith("spoc_tui.")
    }


def test_the_app_is_composed_of_jobs_not_a_pile_of_methods():
    """Issue 78 point 3: the ramp, profile, tuning and headroom jobs are objects that own their
    workers and messages (:mod:`spoc_tui.tui.jobs`), the monitor's polling is its sampler's
    (:mod:`spoc_tui.tui.sampling`): ``SpocApp`` and the app classes of ours it inherits from hold
    at most 30 methods of their own (61 in one class split by inheritance before)."""
    from spoc_tui.tui.app import SpocApp

    own = own_methods(SpocApp)
    assert "spoc_tui.tui.app.SpocApp" in own and sum(map(len, own.values())) <= 30, own


def test_the_method_count_sees_properties_and_inherited_classes():
    class Base:
        def a(self) -> None: ...

        @property
        def b(self) -> int:
            return 1

    class Child(Base):
        @staticmethod
        def c() -> None: ...

        x = 1

    Base.__module__ = Child.__module__ = "spoc_tui.probe"
    assert own_methods(Child) == {"spoc_tui.probe.Child": ["c"], "spoc_tui.probe.Base": ["a", "b"]}


def test_only_optuna_compat_touches_optunas_private_attributes():
    """Optuna's private API (``study._storage``, ``._study_id``, ``._thread_local``, private
    modules) is reached in one module, pinned by test_optuna_compat: an Optuna release that changes
    it fails there, not half-way through a study."""
    private = re.compile(r"\.(_storage|_study_id|_thread_local|_trial_id)\b|optuna\.[\w.]*\._\w+")
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name == "optuna_compat.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if private.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(PKG.parent)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_cores_values_are_typed_not_string_keyed_dicts():
    """Results in core are frozen, typed values: no dataclass field holds ``Any`` or a string-keyed
    dict of anything (a reader would have to know the keys by heart). Counts by name
    (``errors_by_kind: Mapping[str, int]``) are typed and allowed."""
    import dataclasses
    import importlib
    import pkgutil

    import spoc_tui.core as core

    allowed = {
        ("spoc_tui.core.monitor.recording", "Recording", "headers"),  # a recording's own header lines, as written
        # ramp.json's header carries documents whose codecs live above core, whole: the workload
        # (Workload.from_dict), the trace's selection (TraceSource.from_dict), the twin's part
        *(("spoc_tui.core.results", "RampHeader", f) for f in ("profile", "trace", "twin", "prediction")),
    }
    offenders = []
    for info in pkgutil.walk_packages(core.__path__, "spoc_tui.core."):
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if not (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == mod.__name__):
                continue
            for f in dataclasses.fields(obj):
                t = str(f.type)
                loose = "Any" in t or re.search(r"(dict|Mapping)\[str, (object|Json)|\bJson\b", t) or t == "dict"
                if loose and (mod.__name__, name, f.name) not in allowed:
                    offenders.append(f"{mod.__name__}.{name}.{f.name}: {t}")
    assert not offenders, "\n".join(offenders)
    for name in ("ramp.steps", "ramp.knee", "results"):  # a ramp's results: nothing is set after it is built
        mod = importlib.import_module(f"spoc_tui.core.{name}")
        for cls in vars(mod).values():
            if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == mod.__name__:
                assert cls.__dataclass_params__.frozen, f"{cls.__name__} is not frozen"  # type: ignore[attr-defined]


MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100


def test_no_module_or_function_grows_past_what_a_reader_holds():
    """Issue 51: no module over 800 lines, no function over 100. Unguarded, the headroom's module
    reached 842 lines before anyone counted."""
    modules, functions = [], []
    for path in sorted(PKG.rglob("*.py")):
        src = path.read_text()
        name = path.relative_to(PKG.parent).as_posix()
        if (n := src.count("\n")) > MAX_MODULE_LINES:
            modules.append(f"{name}: {n} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    functions.append(f"{name}:{node.lineno} {node.name}: {n} lines")
    assert not modules and not functions, (modules, functions)
