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


def test_a_servers_private_tmpdir_leaves_room_for_vllms_sockets(monkeypatch, tmp_path):
    """vLLM puts its ZMQ IPC sockets (a UUID each) in TMPDIR, and a Unix socket path holds 107
    bytes: under a long TMPDIR (pytest's, CI17) every trial's vLLM exited. The private TMPDIR then
    goes under /tmp, where the sockets fit; a short TMPDIR is kept."""
    import tempfile

    from spoc_tui.procs.server import IPC_NAME_LEN, UNIX_SOCKET_PATH_MAX, private_tmp_parent

    long_dir = tmp_path / ("x" * 60)
    long_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_dir))
    assert private_tmp_parent() == "/tmp"
    short = tempfile.mkdtemp(prefix="s", dir="/tmp")
    try:
        monkeypatch.setattr(tempfile, "tempdir", short)
        assert private_tmp_parent() is None
        private = tempfile.mkdtemp(prefix="spoc-server-", dir=private_tmp_parent())
        assert len(private) + IPC_NAME_LEN <= UNIX_SOCKET_PATH_MAX
    finally:
        import shutil

        shutil.rmtree(short, ignore_errors=True)
