"""The one reading of a streamed completion (the load generator's and the calibration's)."""

from __future__ import annotations

import json

import pytest

from spoc_tui.core.metrics.sse import StreamTally

CHAT = [
    'data: {"id":"cmpl-1","choices":[{"delta":{"role":"assistant","content":""}}]}',
    ": keep-alive",
    'data: {"id":"cmpl-1","choices":[{"delta":{"content":"Hel"}}]}',
    "data: not json",
    'data: ["a list"]',
    'data: {"id":"cmpl-1","choices":[{"delta":{}}]}',
    'data: {"id":"cmpl-1","choices":[{"delta":{"content":"lo"}}]}',
    'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3.0,'
    '"prompt_tokens_details":{"cached_tokens":8}}}',
    "data: [DONE]",
]


@pytest.mark.parametrize("as_bytes", [False, True])
def test_every_event_with_choices_is_a_step_text_or_not(as_bytes):
    t = StreamTally(chat=True, keep_text=True)
    for k, line in enumerate(CHAT):
        t.feed(line.encode() + b"\n" if as_bytes else line, float(k))
    # the role event, the two texts and the empty delta: four steps (vllm bench serve counts so)
    assert t.times == [0.0, 2.0, 5.0, 6.0] and t.first == 0.0 and t.last == 6.0
    assert t.gaps == (2.0, 3.0, 1.0)
    assert t.text == "Hello" and t.request_id == "cmpl-1" and t.done
    assert (t.prompt_tokens, t.completion_tokens, t.cached_tokens) == (12, 3, 8)


def test_a_completion_streams_its_text_field_and_odd_counts_are_none():
    t = StreamTally(chat=False, keep_text=True)
    t.feed('data: {"choices":[{"text":"a"}]}', 1.0)
    t.feed("data: " + json.dumps({"choices": [{"text": "b"}], "usage": {"prompt_tokens": True}}), 2.0)
    t.feed('data: {"choices":[{"text":"c"}],"usage":{"completion_tokens":1e999,"prompt_tokens":"7"}}', 3.0)
    assert t.text == "abc" and t.prompt_tokens is None and t.completion_tokens is None
    assert not t.done  # a stream that ends without [DONE] broke: its caller says so


def test_nothing_but_done_is_a_stream_with_no_token():
    t = StreamTally()
    t.feed("data: [DONE]", 1.0)
    assert t.done and t.first is None and t.gaps == () and t.cached_tokens is None


def test_the_finish_reason_is_the_last_one_a_choice_said():
    """Whether the server ended the answer itself (``stop``) or cut it at max_tokens (``length``):
    a cut answer's length is only a lower bound of the model's (what the twin learns from)."""
    t = StreamTally()
    assert t.finish_reason is None
    t.feed('data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}', 1.0)
    t.feed('data: {"choices":[{"delta":{"content":"b"},"finish_reason":"length"}]}', 2.0)
    t.feed('data: {"choices":[],"usage":{"completion_tokens":2}}', 3.0)
    assert t.finish_reason == "length" and t.completion_tokens == 2
    t.feed('data: {"choices":["odd", {"finish_reason": 3}]}', 4.0)
    assert t.finish_reason == "length"
