"""Textual's privates, fenced (issue 51): every one spoc-tui uses lives in
spoc_tui/tui/textual_private.py, listed in its ``PRIVATES``; here each is checked against the
installed Textual, so an upgrade that moves one fails a test instead of a terminal that hangs up
(issue 56 item 1) or a screen that draws stale lines; and no other module names one."""

import ast
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


def _defines(cls: type, name: str) -> bool:
    """A class attribute, a slot, or an instance attribute its (or a base's) source sets or reads."""
    if hasattr(cls, name):
        return True
    for base in cls.__mro__:
        if name in getattr(base, "__slots__", ()):
            return True
        try:
            src = inspect.getsource(base)
        except (OSError, TypeError):
            continue
        if re.search(rf"self\.{re.escape(name)}\b", src):
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
