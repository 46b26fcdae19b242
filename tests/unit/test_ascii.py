"""ASCII for a terminal whose locale is not UTF-8 (issue 35: LANG=C drew UTF-8)."""

from spoc_tui.tui.ascii import to_ascii, wants_ascii


def test_the_locale_decides_and_spoc_ascii_overrides():
    assert wants_ascii({"LANG": "C"}) and wants_ascii({"LC_ALL": "POSIX", "LANG": "en_US.UTF-8"})
    assert wants_ascii({"LANG": "en_US.ISO-8859-1"})
    assert not wants_ascii({"LANG": "en_US.UTF-8"}) and not wants_ascii({"LC_CTYPE": "C.utf8", "LANG": "C"})
    assert not wants_ascii({})  # nothing said: a UTF-8 terminal
    assert wants_ascii({"SPOC_ASCII": "1", "LANG": "en_US.UTF-8"}) and not wants_ascii({"SPOC_ASCII": "0", "LANG": "C"})


def test_every_glyph_the_app_draws_becomes_ascii():
    drawn = "╭─ Servers ─╮│ ● a:8000 healthy · ▲ b lags… ↑↓→ ⣿⠀▁▂█ ≤ 2s ━╌┤└ ◇×"
    out = to_ascii(drawn)
    assert out.isascii() and len(out) == len(drawn)  # one cell stays one cell: the layout holds
    assert out.startswith("+- Servers -+| o a:8000 healthy . ^ b lags~ ^v> . __# < 2s --++ ox")
    assert to_ascii("<p>≤ 1s</p>", xml=True) == "<p>&lt; 1s</p>"  # inside an SVG
    assert to_ascii("\x1b[1;31mred\x1b[0m") == "\x1b[1;31mred\x1b[0m"  # escape sequences pass untouched
    assert to_ascii("日本") == "??"
