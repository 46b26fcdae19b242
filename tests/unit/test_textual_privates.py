"""Textual's privates, fenced (issue 51): every one spoc-tui uses lives in
spoc_tui/tui/textual_private.py, listed in its ``PRIVATES``; here each is checked against the
installed Textual, so an upgrade that moves one fails a test instead of a terminal that hangs up
(issue 56 item 1) or a screen that draws stale lines; and no other module names one."""

import ast
import functools
import importlib
import inspect
import io
import re
from pathlib import Path

import pytest

from spoc_tui.tui import textual_private
from spoc_tui.tui.textual_private import PRIVATES

PKG = Path(textual_private.__file__).parents[1]


def _cls(qualname: str) -> type:
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


@functools.cache
def _source(cls: type) -> str:
    """A class's source ('' where it has none): inspect parses the whole module for each call."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def _defines(cls: type, name: str) -> bool:
    """A class attribute, a slot, or an instance attribute its (or a base's) source sets or reads."""
    if hasattr(cls, name):
        return True
    for base in cls.__mro__:
        if name in getattr(base, "__slots__", ()):
            return True
        src = _source(base)
        if src and re.search(rf"self\.{re.escape(name)}\b", src):
            return True
    return False


@pytest.mark.parametrize("where", sorted(PRIVATES))
def test_every_private_is_where_the_fence_says(where):
    names = PRIVATES[where]
    try:
        module = importlib.import_module(where)
    except ModuleNotFoundError:
        cls = _cls(where)
        missing = [n for n in names if not _defines(cls, n)]
        assert not missing, f"{where} no longer has {missing}: a Textual upgrade moved them"
    else:
        missing = [n for n in names if not hasattr(module, n)]
        assert not missing, f"{where} no longer defines {missing}: a Textual upgrade moved them"


def test_every_private_the_fence_uses_is_listed():
    """What the module reads of Textual's privates, and the listing, agree: a new use is listed
    (and so pinned), a use that went is taken off."""
    src = Path(textual_private.__file__).read_text()
    body = src[src.index("from __future__") : src.index("PRIVATES: dict")] + src[src.index("# -- the quiet driver") :]
    imported = {
        (node.module, a.name)
        for node in ast.walk(ast.parse(body))
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("textual")
        and any(part.startswith("_") for part in node.module.split("."))
        for a in node.names
    }
    listed_imports = {(m, n) for m, ns in PRIVATES.items() if m.split(".")[-1].startswith("_") for n in ns}
    assert imported == listed_imports
    own = set(re.findall(r"def (_\w+)", body)) | set(re.findall(r"self\.(_\w+)\s*(?::[^=\n]+)?=", body))
    # not attributes: the private modules imported (and one named in a comment), and os._exit
    used = set(re.findall(r"\.(_[a-z]\w*)", body)) - {"_loop", "_parser", "_xterm_parser", "_segment_tools", "_exit"}
    listed = {n for m, ns in PRIVATES.items() if m.rpartition(".")[2][:1].isupper() for n in ns}  # by class
    assert not (used - listed - own), f"Textual privates used but not listed in PRIVATES: {sorted(used - listed - own)}"


def test_no_other_module_names_a_textual_private():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name == "textual_private.py":
            continue
        text = path.read_text()
        if re.search(r"^\s*(from|import) textual(\.\w+)*\._", text, re.M):
            offenders.append(f"{path.relative_to(PKG)}: imports a private Textual module")
    assert not offenders, offenders


def test_the_writer_thread_and_its_queue_are_where_the_hang_up_path_finds_them():
    from textual.drivers._writer_thread import WriterThread
    from textual.drivers.linux_driver import LinuxDriver

    w = WriterThread(io.StringIO())
    assert callable(w._queue.get) and callable(w.join)
    assert "self._writer_thread" in inspect.getsource(LinuxDriver)
    assert "def run_input_thread" in inspect.getsource(LinuxDriver)


# -- the fence on attribute access: no module but the fork reads, sets or shadows a Textual private
def _textual_privates() -> set[str]:
    """The private attributes and methods Textual's own source defines (``self._x``, ``def _x``)."""
    import textual

    names: set[str] = set()
    for path in Path(textual.__file__).parent.rglob("*.py"):
        src = path.read_text()
        names |= set(re.findall(r"self\.(_[a-zA-Z]\w*)", src)) | set(re.findall(r"def (_[a-zA-Z]\w*)", src))
    return names


def _our_privates() -> set[str]:
    """The private names spoc-tui's own classes define (outside the fork)."""
    names: set[str] = set()
    for path in PKG.rglob("*.py"):
        if path.name == "textual_private.py":
            continue
        src = path.read_text()
        names |= set(re.findall(r"self\.(_[a-zA-Z]\w*)\s*(?::[^=\n]+)?=", src))
        names |= set(re.findall(r"def (_[a-zA-Z]\w*)", src))
        names |= set(re.findall(r"^\s+(_[a-zA-Z]\w*)\s*(?::[^=\n]+)?=", src, re.M))
    return names


def _private_uses(src: str, classes: dict[str, type], textuals: set[str], ours: set[str]) -> list[str]:
    """Where ``src`` touches a Textual private: ``self._x`` in a class (of ``classes``, by name)
    whose Textual base defines ``_x`` (a use, or a shadowing an upgrade would break silently), and
    ``obj._x`` on anything else where ``_x`` is Textual's and none of ours."""
    tree = ast.parse(src)
    found: list[str] = []
    for cls_node in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        cls = classes.get(cls_node.name)
        if cls is None:
            continue
        bases = [b for b in cls.__mro__ if b.__module__.partition(".")[0] == "textual"]
        for node in ast.walk(cls_node):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                name = node.attr
                if name.startswith("_") and not name.startswith("__"):
                    hit = next((b for b in bases if _defines(b, name)), None)
                    if hit is not None:
                        found.append(f"{cls_node.name}: self.{name} is {hit.__qualname__}'s")
    modules = {"self", "cls"} | {
        (a.asname or a.name).partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }  # os._exit is no attribute of Textual's
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or (isinstance(node.value, ast.Name) and node.value.id in modules):
            continue
        name = node.attr
        if name.startswith("_") and not name.startswith("__") and name in textuals and name not in ours:
            found.append(f"line {node.lineno}: .{name} is Textual's")
    return sorted(set(found))


def test_no_other_module_reads_sets_or_shadows_a_textual_private_attribute():
    textuals, ours = _textual_privates(), _our_privates()
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "textual_private.py":
            continue
        classes: dict[str, type] = {}
        rel = path.relative_to(PKG.parent)
        if rel.parts[:2] == ("spoc_tui", "tui"):  # the modules with Textual classes
            module = importlib.import_module(".".join(rel.with_suffix("").parts).removesuffix(".__init__"))
            classes = {k: v for k, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__}
        offenders += [f"{rel}: {what}" for what in _private_uses(path.read_text(), classes, textuals, ours)]
    assert not offenders, offenders


def test_the_attribute_fence_finds_a_use_and_a_shadowing():
    src = (
        "from textual.widget import Widget\n"
        "class Probe(Widget):\n"
        "    def f(self):\n"
        "        return self._nodes\n"
        "def g(screen):\n"
        "    return screen._compositor\n"
    )
    space: dict[str, object] = {}
    exec(compile(src, "probe", "exec"), space)
    found = _private_uses(src, {"Probe": space["Probe"]}, _textual_privates(), _our_privates())  # type: ignore[dict-item]
    assert any("Probe: self._nodes is" in f for f in found), found
    assert any(".\u005fcompositor is Textual's" in f for f in found), found
