"""Record and replay: the codec round-trips real snapshots, the file survives a crash, export."""

import csv
import io
import json

import pytest

from spoc_tui.core.monitor.recording import Recorder, RecordingError, decode, encode, export, read_recording
from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus, VllmTick
from tests.tui.helpers import gpu_tick, server_tick


def test_real_snapshots_round_trip_exactly():
    tick = server_tick()
    assert decode(VllmTick, json.loads(json.dumps(encode(tick)))) == tick
    down = server_tick(up=False)
    assert decode(VllmTick, json.loads(json.dumps(encode(down)))) == down
    g = gpu_tick().tick
    back = decode(GpuTick, json.loads(json.dumps(encode(g))))
    assert back == g and back.gpus[3].throttle_reasons == ["sw_thermal"]


def test_a_recording_appends_sessions_and_survives_a_torn_last_line(tmp_path):
    path = tmp_path / "rec.jsonl"
    r = Recorder(path, {"title": "t", "window_s": 60})
    r.servers(server_tick(), t=100.0)
    r.gpus(gpu_tick().tick, [[0, 1, 2, 3]], None, t=100.5)
    r.close()
    r2 = Recorder(path, {"title": "t2", "window_s": 30})  # a second session appends
    r2.status(SourceStatus("http://192.0.2.5:8000", False, "cannot connect"), t=200.0)
    r2._f.flush()
    with path.open("ab") as f:
        f.write(b'{"t": 200.5, "kind": "status", "note": "\xff\xfe not UTF-8"}\n')  # one corrupt line
    r2.servers(server_tick(up=False), t=201.0)
    r2.close()
    with path.open("a") as f:
        f.write('{"t": 202.0, "kind": "servers", "tick": {"serv')  # the monitor was killed mid-line
    rec = read_recording(path)
    assert [h["title"] for h in rec.headers] == ["t", "t2"]
    assert [r.kind for r in rec.records] == ["servers", "gpus", "status", "servers"]
    assert rec.skipped == 2 and rec.start == 100.0 and rec.end == 201.0
    assert rec.records[1].groups == ((0, 1, 2, 3),)
    assert rec.records[3].servers.stale == frozenset({"http://192.0.2.5:8000"})


def test_not_a_recording_is_one_clear_error(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text("hello\n")
    with pytest.raises(RecordingError, match="not a spoc recording"):
        read_recording(bad)
    with pytest.raises(RecordingError, match="cannot read"):
        read_recording(tmp_path / "missing.jsonl")
    empty = tmp_path / "e.jsonl"
    Recorder(empty, {}).close()
    with pytest.raises(RecordingError, match="no data"):
        read_recording(empty)


def test_csv_export_has_one_row_per_server_and_gpu(tmp_path):
    path = tmp_path / "rec.jsonl"
    r = Recorder(path, {})
    r.servers(server_tick(), t=100.0)
    r.gpus(gpu_tick().tick, [], None, t=100.5)
    r.close()
    rows = list(csv.DictReader(io.StringIO(export(read_recording(path), "csv"))))
    assert [row["kind"] for row in rows] == ["server", "gpu", "gpu", "gpu", "gpu"]
    assert rows[0]["running"] == "16.0" and float(rows[0]["ttft_p99"]) == pytest.approx(0.0712, abs=1e-3)
    assert rows[4]["throttle"] == "sw_thermal" and rows[4]["sm_clock_mhz"] == "980.0"
    js = json.loads(export(read_recording(path), "json"))
    assert len(js["records"]) == 2 and js["records"][0]["servers"]["servers"][0]["total"]["running"] == 16.0


def test_the_headroom_is_recorded_and_read_back_and_an_older_file_reads_as_before(tmp_path):
    """Each live headroom the monitor worked out is a record of its own: read back as it was (for
    spoc replay) and in the JSON export; a file without them (written before them) reads as
    before."""
    from spoc_tui.core.monitor.model import HeadroomShown

    path = tmp_path / "rec.jsonl"
    r = Recorder(path, {"title": "t", "window_s": 60})
    r.servers(server_tick(), t=100.0)
    shown = {
        "http://192.0.2.5:8000": HeadroomShown("headroom x1.8 (95 %: 1.5-2.1) of ...", 1.8, True),
        "http://192.0.2.6:8000": HeadroomShown("headroom: not enough variety yet: ...", None, False),
        "http://192.0.2.7:8000": HeadroomShown(
            "headroom x3 ...", 3.0, True, "predictions held 27 of 30 windows over 2.0 h (median error 8 %)", False
        ),  # the ledger graded again, the estimate kept (issue 76)
    }
    r.headroom(shown, t=101.0)
    r.close()
    rec = read_recording(path)
    assert [x.kind for x in rec.records] == ["servers", "headroom"]
    assert rec.records[1].headroom == shown and rec.skipped == 0
    out = json.loads(export(rec, "json"))["records"][1]
    assert out["headroom"]["http://192.0.2.5:8000"] == {"line": shown["http://192.0.2.5:8000"].line, "estimate": 1.8,
                                                         "identified": True, "ledger": "", "fresh": True}  # fmt: skip
    assert "headroom" not in json.loads(export(rec, "json"))["records"][0]


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("tick", "servers", 0, "total", "request_success"), [1]),  # a dict of another shape
        (("tick", "servers", 0, "total"), None),  # a value the type has no None for
        (("tick", "servers", 0, "source"), ["a"]),  # a list for a string
        (("tick", "servers", 0, "total", "finished_rates", "x"), []),
        (("tick", "gpus", 0, "reasons_mask"), 1.5),  # a float for a whole number
        (("tick", "gpus", 0, "temp_c"), True),  # a bool is not a number
        (("tick", "gpus", 0), "gpu0"),  # a string for an object
    ],
)
def test_a_record_of_other_types_is_skipped_like_a_torn_line(tmp_path, where, value):
    path = tmp_path / "rec.jsonl"
    r = Recorder(path, {"title": "t", "window_s": 60})
    r.servers(server_tick(), t=100.0)
    r.gpus(gpu_tick().tick, [[0, 1, 2, 3]], None, t=100.5)
    r.close()
    lines = path.read_text().splitlines()
    k = 1 if where[1] == "servers" else 2
    doc = json.loads(lines[k])
    node = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path.write_text("\n".join([*lines, json.dumps(doc)]) + "\n")
    rec = read_recording(path)
    assert rec.skipped == 1 and len(rec.records) == 2
    export(rec, "csv")


def test_a_recording_is_not_written_to_a_device():
    with pytest.raises(RecordingError, match="--record /dev/zero: not a regular file"):
        Recorder("/dev/zero", {})  # its fsync raised OSError out of the monitor
