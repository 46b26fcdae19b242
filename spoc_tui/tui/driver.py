"""The terminal driver: Textual's, with an input thread that sleeps while nothing is typed.

Textual 8.2.8's input thread wakes ten times a second to ask whether a half-typed escape
sequence (a lone Esc) has timed out and whether the app is closing: on the monitor at 160x48
that was 0.15 % of a core, a seventh of the whole process. Here it waits on the terminal and on
a wake-up pipe, and polls at Textual's 0.1 s only while a sequence is pending; closing the app
(the driver's exit event) writes to the pipe, so quitting is as prompt as before. A wait is
still cut at :data:`IDLE_WAIT_S` in case anything else is ever waited for.

The loop is Textual's own (``LinuxDriver.run_input_thread``, same parser, same decoding and
dispatch) but for the wait; the package pins Textual's version.
"""

from __future__ import annotations

import os
import selectors
import threading
import time
from codecs import getincrementaldecoder
from threading import Event

from textual._loop import loop_last
from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

HANGUP_GRACE_S = 5.0
"""How long the app has to exit by itself once its terminal is gone, before the process ends."""
IDLE_WAIT_S = 1.0
"""The longest wait with nothing typed and nothing pending."""
PENDING_WAIT_S = 0.1
"""The wait while an escape sequence is pending (Textual's)."""


class _WakingEvent(Event):
    """An Event whose ``set`` also wakes a thread waiting on :attr:`read_fd`."""

    def __init__(self) -> None:
        super().__init__()
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)

    def set(self) -> None:
        super().set()
        try:
            os.write(self._write_fd, b"x")
        except (BlockingIOError, OSError):
            pass  # full (already woken) or closed: the wait is bounded anyway

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        """Close the pipe, once (a second close could hit a descriptor since reused)."""
        fds, self.read_fd, self._write_fd = (self.read_fd, self._write_fd), -1, -1
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


class QuietDriver(LinuxDriver):
    """Textual's Linux/macOS driver whose input thread sleeps while nothing is typed."""

    exit_event: _WakingEvent

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.exit_event = _WakingEvent()

    def close(self) -> None:
        super().close()
        self.exit_event.close()

    def terminal_gone(self) -> None:
        """The terminal hung up (its other side closed: a pseudo-terminal that was not our controlling
        terminal sends no SIGHUP). The app exits as on ``q``; should it not within
        :data:`HANGUP_GRACE_S` (a write to the dead terminal blocking), the process ends as a
        hang-up ends it. Before this, the input thread read end-of-file in a loop at 90 % of a core."""

        def last_resort() -> None:
            time.sleep(HANGUP_GRACE_S)
            os._exit(129)  # 128 + SIGHUP, as a hang-up ends a process

        threading.Thread(target=last_resort, name="spoc-hangup", daemon=True).start()
        self._quiet_dead_terminal()
        app = self._app

        def ask_exit() -> None:
            try:
                app.call_from_thread(app.exit)
            except RuntimeError:  # the app is not running (any more): nothing to stop
                pass

        # from a thread of its own: the app's exit joins this input thread, which must not wait on it
        threading.Thread(target=ask_exit, name="spoc-exit", daemon=True).start()

    def _quiet_dead_terminal(self) -> None:
        """Let the app's last writes go nowhere instead of failing: the standard output and error
        that are the dead terminal now write to /dev/null, and should Textual's writer thread have
        died of a write to it (EIO), its queue is emptied (else the app blocks on a full queue and
        cannot exit)."""
        try:
            tty = os.fstat(self.fileno)
            null = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            return
        try:
            for fd in (1, 2):
                try:
                    st = os.fstat(fd)
                except OSError:
                    continue
                if st.st_rdev == tty.st_rdev and st.st_ino == tty.st_ino and st.st_dev == tty.st_dev:
                    os.dup2(null, fd)
        finally:
            os.close(null)
        writer = getattr(self, "_writer_thread", None)  # Textual's (pinned) LinuxDriver keeps it so
        queue = getattr(writer, "_queue", None)
        if writer is None or queue is None:
            return

        def drain() -> None:
            writer.join()  # ended: of the failed write, or as the app stopped it
            while True:
                queue.get()

        threading.Thread(target=drain, name="spoc-drain", daemon=True).start()

    def run_input_thread(self) -> None:
        """Wait for input and dispatch events (Textual's loop; only the wait and the end of the
        input differ)."""
        exit_event = self.exit_event
        exit_event.drain()  # a wake-up left from the last time input was stopped
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        selector.register(exit_event.read_fd, selectors.EVENT_READ)

        fileno = self.fileno
        is_terminal = os.isatty(fileno)
        reading = [True]
        EVENT_READ = selectors.EVENT_READ
        parser = XTermParser(self._debug)
        feed = parser.feed
        tick = parser.tick
        decode = getincrementaldecoder("utf-8")().decode
        read = os.read

        def process_selector_events(
            selector_events: list[tuple[selectors.SelectorKey, int]], final: bool = False
        ) -> None:
            typed = [(key, mask) for key, mask in selector_events if key.fd == fileno]
            for last, (_key, mask) in loop_last(typed):
                if mask & EVENT_READ:
                    try:
                        raw = read(fileno, 1024 * 4)
                    except OSError:  # EIO: the terminal's other side is closed
                        raw = b""
                    if not raw:
                        # the end of the input: stop watching it (it reads as ready for ever); a
                        # terminal that hung up ends the app, a closed pipe leaves it running
                        selector.unregister(fileno)
                        reading[0] = False
                        if is_terminal:
                            self.terminal_gone()
                        break
                    unicode_data = decode(raw, final=final and last)
                    for event in feed(unicode_data):
                        self.process_message(event)
            for event in tick():
                self.process_message(event)

        def wait() -> float:
            return PENDING_WAIT_S if parser._timeout_time is not None else IDLE_WAIT_S

        try:
            while not exit_event.is_set():
                process_selector_events(selector.select(wait()))
            if reading[0]:
                selector.unregister(self.fileno)
                process_selector_events(selector.select(PENDING_WAIT_S), final=True)
        finally:
            selector.close()
            try:
                for _event in feed(""):
                    pass
            except (EOFError, ParseError):
                pass
