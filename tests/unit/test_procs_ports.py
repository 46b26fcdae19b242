"""Who holds a port: the port-clash messages name the process (issue 35)."""

import os
import socket

from spoc_tui.procs.ports import free_port, port_holder


def test_the_holder_of_a_listening_port_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        holder = port_holder(port)
        assert holder is not None and holder.startswith(f"pid {os.getpid()} (")
    assert port_holder(free_port()) is None  # nobody listens
