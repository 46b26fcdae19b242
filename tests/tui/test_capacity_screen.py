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
        assert "predicted vs the server's own cache_config_info" in text and "524288" in text


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_capacity_screen(snap_compare, size):
    async def run_before(pilot):
        await pilot.press("c")
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)
