"""`spoc monitor` in a real (pseudo-)terminal: keys reach it through the quiet input thread (a
lone Esc included, which waits on the escape-sequence timeout), and it quits at once on `q`."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a POSIX terminal")


class Pty:
    """A process on a 120x40 pseudo-terminal whose output is kept as text."""

    def __init__(self, argv: list[str]) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "LANG": "C.UTF-8", "COLUMNS": "120", "LINES": "40"}
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self.master = master
        self.out = ""
        self._lock = threading.Lock()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.out += data.decode("utf-8", "replace")

    def expect(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if text in self.out:
                    return
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not shown within {timeout} s; last output: {self.out[-500:]!r}")

    def clear(self) -> None:
        with self._lock:
            self.out = ""

    def send(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)


def test_keys_reach_the_monitor_in_a_terminal_and_q_quits():
    term = Pty([sys.executable, "-m", "spoc_tui.cli", "monitor", "--url", "http://127.0.0.1:9", "--no-nvml"])
    try:
        term.expect("vLLM servers")
        term.clear()
        term.send("l")  # the Load screen
        term.expect("Start")
        term.clear()
        term.send("\x1b")  # a lone Esc: a key only once the escape-sequence timeout passes
        term.expect("vLLM servers", timeout=15)
        t0 = time.monotonic()
        term.send("q")
        assert term.proc.wait(timeout=15) == 0
        quit_s = time.monotonic() - t0
        assert quit_s < 10, quit_s
    finally:
        term.close()


def test_the_monitor_exits_when_its_terminal_goes_away():
    """Issue 56 item 1: on a pseudo-terminal that is not its controlling terminal (no SIGHUP comes),
    the monitor read end-of-file in a loop at 90 % of a core for ever once the terminal closed."""
    term = Pty([sys.executable, "-m", "spoc_tui.cli", "monitor", "--url", "http://127.0.0.1:9", "--no-nvml"])
    try:
        term.expect("vLLM servers")
        os.close(term.master)
        term.master = os.open(os.devnull, os.O_RDONLY)  # for close()
        rc = term.proc.wait(timeout=10)
        assert rc in (0, 129)
    finally:
        term.close()
