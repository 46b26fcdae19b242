"""Secrets out of every output (issue 17, item 8) and control characters out of the terminal (item 7)."""

from __future__ import annotations

import pytest

from spoc_tui.core.redact import redact_argv, redact_text, redact_url
from spoc_tui.core.textsafe import for_terminal, safe


@pytest.mark.parametrize(
    "url,shown",
    [
        ("http://admin:hunter2@gpu-a:8000/metrics", "http://***@gpu-a:8000/metrics"),
        ("https://token@gpu-a/v1", "https://***@gpu-a/v1"),
        ("http://gpu-a:8000", "http://gpu-a:8000"),
        ("http://[::1:19100", "http://[::1:19100"),
    ],
)
def test_urls_lose_their_userinfo(url, shown):
    assert redact_url(url) == shown


def test_key_like_flags_are_masked_in_command_lines():
    argv = [
        "vllm",
        "serve",
        "m",
        "--api-key",
        "sk-abcdef123",
        "--hf-token=hf_xyz",
        "--port",
        "8000",
        "--max-num-seqs=8",
    ]
    assert redact_argv(argv) == ["vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "--port", "8000",
                                 "--max-num-seqs=8"]  # fmt: skip
    assert redact_argv(["x", "http://u:p@h/metrics"]) == ["x", "http://***@h/metrics"]


def test_free_text_masks_bearer_tokens_keys_and_url_passwords():
    text = "GET http://u:pw@h:1/metrics failed; header Authorization: Bearer abc.def; key sk-live-123456789"
    out = redact_text(text)
    assert "pw" not in out and "abc.def" not in out and "sk-live" not in out
    assert "http://***@h:1/metrics" in out and "Bearer ***" in out


def test_terminal_text_is_inert_and_readable():
    assert safe("plain model-name/7B") == "plain model-name/7B"
    assert safe("a\x1b[2Jb\x9bc\u202ed") == "a\\x1b[2Jb\\x9bc\\u202ed"
    assert safe("tab\tok") == "tab\tok"
    assert for_terminal("line one\nhttp://u:p@h \x07") == "line one\nhttp://***@h \\x07"


def test_log_records_are_redacted_tracebacks_included():
    import logging

    from spoc_tui.core.redact import RedactingFormatter

    try:
        raise ValueError("cannot reach http://admin:hunter2@gpu-a:8000/metrics")
    except ValueError:
        import sys

        rec = logging.LogRecord("x", logging.ERROR, "f", 1, "reading %s", ("http://u:pw@h/m",), sys.exc_info())
    out = RedactingFormatter("%(message)s").format(rec)
    assert "hunter2" not in out and ":pw@" not in out and "***@gpu-a:8000" in out and "***@h/m" in out
