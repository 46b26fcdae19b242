"""Each experiment setting declared once (issue 78, point 1): the step rules are the fields of
:class:`spoc_tui.core.ramp.rules.StepRules`, and the classes that carry an experiment, the click
options of ``spoc ramp``, ``spoc twin predict`` and ``spoc tune`` and the Load form's fields are
made from them, not written again."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

from spoc_tui.core.ramp.rules import StepRules, form_id, settings

PKG = Path(__file__).resolve().parents[2] / "spoc_tui"
RULES = [f.name for f in fields(StepRules)]
ALIASES = {"step_seconds", "warmup_seconds", "max_step_seconds", "budget_spec", "step_limit_s"}
"""Names the rules went by before they were declared once (a class declaring one declares a rule)."""
EXPERIMENT_CLASSES = {
    "StepRules",
    "ExperimentOptions",
    "RampConfig",
    "Prediction",
    "Experiment",
    "ExperimentRequest",
    "TuneArgs",
    "StartRequested",
    "ShadowTwin",
}
"""The classes that carry an experiment's settings. (Other classes use some of the same names for
other things: a simulator's seed, a step's measured arrivals. The result files' codec,
``RampHeader``, holds the file's keys, which ``RampHeader.of_rules`` and ``step_rules`` map.)"""
FORM_WIDGETS = {"Field", "Input", "Select"}


def sources() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for p in PKG.rglob("*.py")}


def declarations(tree: ast.Module) -> list[tuple[str, str]]:
    """(class, field) for each rule (or alias) a class of :data:`EXPERIMENT_CLASSES` declares."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in EXPERIMENT_CLASSES:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id
                    if name in RULES or name in ALIASES:
                        out.append((node.name, name))
    return out


EXPERIMENT_COMMANDS = {"ramp_cmd", "predict_cmd", "tune"}
"""The commands that run an experiment (``spoc ramp``, ``spoc twin predict``, ``spoc tune``); others
take flags of the same name for their own settings (``spoc sim --seed``, ``spoc twin calibrate
--budget``)."""


def literal_flags_and_ids(tree: ast.Module) -> list[str]:
    """Each rule's flag written as an option's name on a command of :data:`EXPERIMENT_COMMANDS`
    (``@click.option("--seed", ...)``, ``@option("--seed")``), and each rule's form field id given to
    a widget (``Field(..., id="step")``)."""
    flags = {s.flag for _, s in settings()}
    ids = {form_id(n) for n in RULES}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in EXPERIMENT_COMMANDS:
            for d in node.decorator_list:
                if isinstance(d, ast.Call):
                    found += [a.value for a in d.args if isinstance(a, ast.Constant) and a.value in flags]
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in FORM_WIDGETS:
            found += [
                f"{name}(id={k.value.value!r})"
                for k in node.keywords
                if k.arg == "id" and isinstance(k.value, ast.Constant) and k.value.value in ids
            ]
    return found


def test_each_step_rule_is_declared_once():
    decl: list[tuple[str, str, str]] = []
    written: list[str] = []
    for path, tree in sources().items():
        decl += [(str(path.relative_to(PKG)), c, n) for c, n in declarations(tree)]
        if path.name != "rules.py":
            written += [f"{path.relative_to(PKG)}: {w}" for w in literal_flags_and_ids(tree)]
    per_rule = {r: [d for d in decl if d[2] == r] for r in RULES}
    assert all(len(v) == 1 and v[0][:2] == ("core/ramp/rules.py", "StepRules") for v in per_rule.values()), per_rule
    assert not [d for d in decl if d[2] in ALIASES], decl
    assert not written, f"options or form fields of a step rule written again: {written}"


def test_the_check_finds_a_rule_declared_again():
    tree = ast.parse(
        textwrap.dedent(
            """
            import click
            class Prediction:
                step_s: float = 60.0
                warmup_seconds: float = 10.0
            @click.option("--seed", type=int)
            def tune(): Field("1", id="warmup")
            @click.option("--seed", type=int)
            def sim(): pass
            """
        )
    )
    assert declarations(tree) == [("Prediction", "step_s"), ("Prediction", "warmup_seconds")]
    assert literal_flags_and_ids(tree) == ["--seed", "Field(id='warmup')"]


ADDED = """
import dataclasses, sys
import spoc_tui.core.ramp.rules as r

added = r.rule(2.0, r.Setting("--drain-seconds", "How long a step drains (a rule added to the spec).", "seconds",
                              "drain s"))
r.StepRules = dataclasses.make_dataclass(
    "StepRules", [("drain_s", float, added)], bases=(r.StepRules,), frozen=True, kw_only=True
)

from click.testing import CliRunner
from spoc_tui.cli.main import cli
from spoc_tui.tui.widgets.fields import rule_fields

for command in (["ramp"], ["twin", "predict"]):
    out = CliRunner().invoke(cli, [*command, "--help"], terminal_width=200).output
    print(command[-1], "--drain-seconds" in out and "How long a step drains" in out)
from textual.app import App
import asyncio

class Form(App):
    def compose(self):
        yield from rule_fields("rules")

async def form_ids():
    app = Form()
    async with app.run_test():
        return [w.id for w in app.screen.children]

print("form", "drain" in asyncio.run(form_ids()))
from spoc_tui.load.ramp import RampConfig
print("request", "drain_s" in {f.name for f in dataclasses.fields(RampConfig)})
"""


def test_a_rule_added_to_the_spec_appears_in_each_commands_help_and_on_the_load_form():
    """The must-show of issue 78: a step rule added to :class:`StepRules` (here by a subclass put
    in its place before anything reads it) is an option of ``spoc ramp`` and ``spoc twin
    predict``, a field of the Load form and a field of a ramp's request, with no other edit."""
    r = subprocess.run([sys.executable, "-c", ADDED], capture_output=True, text=True, timeout=120, cwd=PKG.parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ramp", "True", "predict", "True", "form", "True", "request", "True"], r.stdout
