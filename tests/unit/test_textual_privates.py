"""The terminal driver (spoc_tui/tui/driver.py) leans on Textual privates: pinned here, so an
upgrade that moves one fails a test instead of a terminal that hangs up (issue 56 item 1)."""

import inspect
import io

from textual.drivers._writer_thread import WriterThread
from textual.drivers.linux_driver import LinuxDriver


def test_the_writer_thread_and_its_queue_are_where_the_hang_up_path_finds_them():
    w = WriterThread(io.StringIO())
    assert callable(w._queue.get) and callable(w.join)
    assert "self._writer_thread" in inspect.getsource(LinuxDriver)
    assert "def run_input_thread" in inspect.getsource(LinuxDriver)
