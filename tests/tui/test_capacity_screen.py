import re

import pytest

from spoc_tui.tui.messages import ServersSampled
from spoc_tui.tui.screens.capacity import CapacityScreen
from tests.tui.helpers import gpu_tick, make_app, server_tick


async def _open(pilot):
    await pilot.press("c")
    await pilot.pause()
    await pilot.pause()
    return pilot.app.screen


async def test_live_recomputation_and_does_not_fit():
    app = make_app()
    async with app.run_test(size=(120, 45)) as pilot:
        scr = await _open(pilot)
        assert isinstance(scr, CapacityScreen)
        text = str(scr.result.render())
        assert any("KV bytes per token" in line and "128.0 KiB" in line for line in text.splitlines())
        scr.query_one("#model").value = "llama-3.1-70b"
        await pilot.pause()
        assert "does not fit" in str(scr.result.render()) and "GiB short per GPU" in str(scr.result.render())
        scr.query_one("#tp").value = "4"
        await pilot.pause()
        assert "320.0 KiB" in str(scr.result.render())
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.monitor


async def test_prefilled_from_the_monitored_server():
    app = make_app()
    async with app.run_test(size=(120, 45)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        app.post_message(gpu_tick())
        await pilot.pause()
        scr = await _open(pilot)
        await pilot.pause()
        assert scr.query_one("#gpu").value == "h100-80gb"  # from the GPU panel's model name
        assert scr.query_one("#block").value == "128"  # from the server's cache_config_info
        assert scr.query_one("#tp").value == "4"  # its TP group
        text = str(scr.result.render())
        # the server serves "tiny", not the form's Llama 3.1 8B: its figures are not set against the form's
        assert "predicted vs the server's own" not in text
        assert "not compared with the monitored server: it serves tiny on h100-80gb (TP 4)" in text


def _llama_tick():
    from dataclasses import replace

    from spoc_tui.core.monitor.snapshots import VllmTick

    t = server_tick()
    (s,) = t.servers
    return VllmTick((replace(s, model_names=("meta-llama/Llama-3.1-8B-Instruct",)),), None, t.stale, (), t.statuses)


async def test_like_is_compared_with_like_only():
    app = make_app()
    async with app.run_test(size=(120, 45)) as pilot:
        app.post_message(ServersSampled(_llama_tick()))
        app.post_message(gpu_tick())
        await pilot.pause()
        scr = await _open(pilot)
        await pilot.pause()
        assert scr.query_one("#model").value == "llama-3.1-8b"
        assert "predicted vs the server's own cache_config_info" in str(scr.result.render())
        scr.query_one("#model").value = "llama-3.1-70b"  # a what-if for another model
        await pilot.pause()
        text = str(scr.result.render())
        assert "predicted vs the server's own" not in text and "server 524288" not in text


async def test_the_answer_in_users_and_what_would_fit():
    app = make_app()
    async with app.run_test(size=(120, 45)) as pilot:
        scr = await _open(pilot)
        assert scr.query_one("#avg").value == "2048"  # a typical conversation, not the 128k maximum
        text = str(scr.result.render())
        assert "concurrent sequences" in text and "(context 2048)" in text
        users = str(scr.users.render())
        # 220 sequences of 2k tokens fit an 8B's cache on an H100 (below max-num-seqs 256); each decode
        # step reads 16 GB of weights and their KV: ~22 ms, 215 tokens an answer, 9 s think: ~630 users
        assert "chat users saturate 220 seats" in users and "the chatbot profile" in users
        assert re.search(r"about 6\d\d chat users", users)
        assert "saturated: the queue grows" in users and "busy" in users
        scr.query_one("#model").value = "llama-3.1-70b"  # 140 GB of weights on one H100
        await pilot.pause()
        text = str(scr.result.render())
        # TP 2 (66 GiB of weights per GPU) leaves no room for one 128k-token sequence; TP 4 does
        assert "does not fit" in text and "would fit: TP 4: 238 sequences" in text and "TP 2:" not in text
        assert str(scr.users.render()) == ""


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_capacity_screen(snap_compare, size):
    async def run_before(pilot):
        await pilot.press("c")
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


async def test_plan_panel_from_the_last_ramp():
    import json

    from spoc_tui.config import data_dir
    from tests.unit.test_fleetplan import raw as ramp

    folder = data_dir() / "ramps" / "20261124-120000"
    folder.mkdir(parents=True)
    (folder / "ramp.json").write_text(json.dumps(ramp(waiting_mean=3)))
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.press("c")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, CapacityScreen)
        shown = str(scr.plan.render())
        assert "replicas: 79" in shown and "target 3 per replica" in shown and "spoc plan --ramp" in shown
        scr.query_one("#plan_users").value = "0"
        await pilot.pause()
        assert "above 0" in str(scr.plan.render())


async def test_plan_panel_refuses_a_ramp_of_another_model():
    import json

    from spoc_tui.config import data_dir
    from tests.unit.test_fleetplan import raw as ramp

    folder = data_dir() / "ramps" / "20261124-120000"
    folder.mkdir(parents=True)
    (folder / "ramp.json").write_text(json.dumps(ramp()))
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        app.post_message(gpu_tick())
        await pilot.pause()
        await pilot.press("c")
        await pilot.pause()
        await pilot.pause()
        shown = str(app.screen.plan.render())
        assert (
            "the last ramp measured 'meta-llama/Llama-3.1-8B-Instruct'" in shown and "ramp this server first" in shown
        )
