"""The SSE parser and the chunk interpreter, on hand-made bytes and on the engine fixtures."""
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from fairlib.serve.replay import llamacpp_chunks, load_frames, vllm_chunks
from fairlib.client.stream import StreamAccumulator
from fairlib.protocol.sse import (DONE, MalformedSSE, SSEParser, StreamError, decode_data, decode_payload, interpret_chunk,
                                  read_chunk)

FIX = Path(__file__).parent / "fixtures"

# file -> (token chunks, tokens per chunk, completion_tokens, comment lines, has server timings)
EXPECTED = {
    "vllm_completions.sse": (7, [1, 1, 2, 1, 1, 1, 1], 8, 2, False),  # " brown fox": 2 words
    "vllm_completions_token_ids.sse": (7, [1, 1, 2, 1, 1, 1, 1], 8, 0, False),
    "vllm_chat.sse": (7, [1, 1, 1, 2, 1, 1, 1], 8, 1, False),  # " can I": 2 words
    "llamacpp_completions.sse": (6, [1] * 6, 6, 0, True),
    "llamacpp_chat.sse": (6, [1] * 6, 6, 0, True),
}


def parse_all(data: bytes, cuts=()):
    """Feed ``data`` split at ``cuts``; return (events, parser)."""
    p, events, last = SSEParser(), [], 0
    for c in sorted(set(cuts)) + [len(data)]:
        events += p.feed(data[last:c])
        last = c
    return events + p.flush(), p


def accumulate(data: bytes, cuts=()):
    events, p = parse_all(data, cuts)
    acc = StreamAccumulator()
    for t, ev in enumerate(events):
        payload = decode_payload(ev)
        if payload is DONE:
            acc.done = True
            break
        acc.add(payload, float(t))
    return acc, p


# --- the parser --------------------------------------------------------------------------------

def test_data_done_and_comments():
    events, p = parse_all(b': hello\n\ndata: {"a": 1}\n\n:ping\ndata: [DONE]\n\n')
    assert [e.data for e in events] == ['{"a": 1}', "[DONE]"]
    assert decode_payload(events[0]) == {"a": 1} and decode_payload(events[1]) is DONE
    assert p.comments == 2


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings(eol):
    raw = (b"data: {\"x\": 1}" + eol + eol + b": c" + eol + b"data: [DONE]" + eol + eol)
    events, _ = parse_all(raw)
    assert [e.data for e in events] == ['{"x": 1}', "[DONE]"]


def test_crlf_split_between_cr_and_lf():
    p = SSEParser()
    assert p.feed(b'data: {"x": 1}\r') == []
    assert p.feed(b"\n\r") == []
    assert [e.data for e in p.feed(b"\n")] == ['{"x": 1}']


def test_multiple_events_in_one_read_and_event_over_many_reads():
    p = SSEParser()
    evs = p.feed(b"data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4")
    assert [e.data for e in evs] == ["1", "2", "3"]
    assert p.feed(b"5") == [] and p.feed(b"\n") == []
    assert [e.data for e in p.feed(b"\n")] == ["45"]


def test_multiline_data_event_id_and_unknown_fields():
    events, _ = parse_all(b"event: chunk\nid: 7\nretry: 100\nfoo: bar\ndata: a\ndata:b\ndata\n\n")
    assert len(events) == 1
    assert events[0].data == "a\nb\n" and events[0].event == "chunk" and events[0].id == "7"


def test_bom_and_blank_lines_without_data():
    events, _ = parse_all(b"\xef\xbb\xbf\n\n\ndata: [DONE]\n\n")
    assert [e.data for e in events] == ["[DONE]"]


def test_flush_takes_an_unterminated_last_event():
    p = SSEParser()
    assert p.feed(b"data: [DONE]") == []
    assert [e.data for e in p.flush()] == ["[DONE]"]


def test_malformed_json_is_a_typed_error():
    events, _ = parse_all(b'data: {"id": "x", "choices": [\n\n')
    with pytest.raises(MalformedSSE):
        decode_payload(events[0])
    with pytest.raises(MalformedSSE):
        decode_payload(parse_all(b"data: [1, 2]\n\n")[0][0])  # JSON, but not an object


def test_invalid_utf8_and_overlong_line():
    with pytest.raises(MalformedSSE):
        SSEParser().feed(b"data: \xff\xfe\n")
    with pytest.raises(MalformedSSE):
        SSEParser(max_line_bytes=100).feed(b"data: " + b"x" * 200)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(EXPECTED)), st.lists(st.integers(min_value=0, max_value=4000), max_size=25),
       st.booleans())
def test_any_split_and_crlf_give_the_same_events(name, cuts, crlf):
    raw = (FIX / name).read_bytes()
    if crlf:
        raw = raw.replace(b"\n", b"\r\n")
    whole, _ = parse_all(raw)
    split, _ = parse_all(raw, [c % (len(raw) + 1) for c in cuts])
    assert split == whole


_ODD = (b": a comment\n\ndata: {\"a\": 1}\n\nevent: x\nid: 7\ndata: {\"b\":\ndata: 2}\n\n\n\n"
        b"data:{\"c\":3}\n\ndata:  {\"d\":4}\nretry: 5\n\ndata: [DONE]\n\n")


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(EXPECTED) + ["odd"]), st.lists(st.integers(min_value=0, max_value=4000), max_size=25),
       st.booleans(), st.booleans())
def test_feed_data_gives_the_data_feed_gives(name, cuts, crlf, bom):
    """The relay's fast split (whole LF ``data:`` events in one read) and the line machine agree on
    every event's data, however the bytes are cut, with CRLF, a BOM, comments, several fields."""
    raw = _ODD if name == "odd" else (FIX / name).read_bytes()
    if crlf:
        raw = raw.replace(b"\n", b"\r\n")
    if bom:
        raw = b"\xef\xbb\xbf" + raw
    whole, _ = parse_all(raw)
    p, got, last = SSEParser(), [], 0
    for c in sorted({c % (len(raw) + 1) for c in cuts}) + [len(raw)]:
        got += p.feed_data(raw[last:c])
        last = c
    got += [ev.data for ev in p.flush()]
    assert got == [ev.data for ev in whole]


def test_feed_data_fast_path_is_taken_and_keeps_a_partial_event():
    p = SSEParser()
    assert p.feed_data(b"data: 1\n\n") == ["1"]           # the first read: the line machine
    assert p.feed_data(b"data: 2\n\ndata: 3\n\ndata: 4") == ["2", "3"]
    assert p.feed_data(b"5\n\n") == ["45"]
    with pytest.raises(MalformedSSE):
        p.feed_data(b"data: \xff\n\n")


# --- the chunk interpreter ---------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_read_chunk_is_what_interpret_chunk_says(name):
    """The gateway's lean reader and the client's interpreter agree on every fixture chunk."""
    events, _ = parse_all((FIX / name).read_bytes())
    n = 0
    for ev in events:
        payload, _ = decode_data(ev.data)
        if payload is DONE:
            continue
        i = interpret_chunk(payload)
        assert read_chunk(payload) == (i.text, i.n_tokens, i.token_ids, i.finish_reason, i.usage)
        n += 1
    assert n >= 7


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_token_accounting(name):
    n_chunks, per_chunk, total, comments, has_timings = EXPECTED[name]
    acc, p = accumulate((FIX / name).read_bytes())
    assert len(acc.chunk_times) == n_chunks
    assert acc.chunk_tokens == per_chunk
    assert acc.completion_tokens == total and acc.tokens_source == "usage"
    assert acc.finish_reason == "length" and acc.done
    assert p.comments == comments
    assert (acc.server_timings is not None) == has_timings
    if has_timings:
        assert acc.server_timings["predicted_n"] == total and acc.server_timings["prompt_n"] > 0


def test_tokens_come_from_usage_not_from_chunks():
    # vLLM packs " brown fox" (2 tokens) into one chunk: 7 chunks, 8 tokens, all counted
    acc, _ = accumulate((FIX / "vllm_completions.sse").read_bytes())
    assert len(acc.chunk_times) == 7 and acc.completion_tokens == 8
    assert acc.resolve_chunk_tokens() == ([1, 1, 2, 1, 1, 1, 1], "text")


def test_token_ids_count_without_usage():
    raw = (FIX / "vllm_completions_token_ids.sse").read_bytes()
    no_usage = b"".join(f for f in load_frames(FIX / "vllm_completions_token_ids.sse") if b'"choices":[]' not in f)
    assert no_usage != raw
    acc, _ = accumulate(no_usage)
    assert acc.usage is None and acc.tokens_source == "token_ids" and acc.completion_tokens == 8


def test_chat_role_only_chunk_is_not_a_token():
    frames = load_frames(FIX / "vllm_chat.sse")
    role = decode_payload(parse_all(frames[0])[0][0])
    info = interpret_chunk(role)
    assert not info.is_token_chunk and info.n_tokens == 0
    frames_l = load_frames(FIX / "llamacpp_chat.sse")
    assert not interpret_chunk(decode_payload(parse_all(frames_l[0])[0][0])).is_token_chunk  # content: null


def test_usage_chunk_and_llamacpp_final_chunk_carry_no_token():
    usage = {"id": "x", "object": "text_completion", "choices": [],
             "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}}
    info = interpret_chunk(usage)
    assert not info.is_token_chunk and info.usage["completion_tokens"] == 2
    final = decode_payload(parse_all(load_frames(FIX / "llamacpp_completions.sse")[-2])[0][0])
    info = interpret_chunk(final)
    assert not info.is_token_chunk and info.finish_reason == "length" and info.timings["predicted_n"] == 6


def test_error_object_in_stream():
    with pytest.raises(StreamError) as e:
        interpret_chunk({"error": {"object": "error", "message": "boom", "type": "InternalServerError", "code": 500}})
    assert e.value.code == 500
    with pytest.raises(StreamError):
        interpret_chunk({"object": "error", "message": "old style", "code": 400})


def test_bad_chunk_structure_is_malformed():
    with pytest.raises(MalformedSSE):
        interpret_chunk({"choices": "nope"})
    with pytest.raises(MalformedSSE):
        interpret_chunk({"choices": [{"index": 0, "text": "a", "token_ids": 5}]})


def test_reasoning_content_counts_as_generated_text():
    info = interpret_chunk({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]})
    assert info.is_token_chunk and info.n_tokens == 1


def test_replay_builders_match_fixture_shapes():
    """The replay server's synthesised chunks have the fixtures' keys in the fixtures' order."""
    def keys(path, i):
        obj = decode_payload(parse_all(load_frames(FIX / path)[i])[0][0])
        return list(obj), list(obj["choices"][0]) if obj["choices"] else []

    v = vllm_chunks("completions", ["a", "b"], model="m", prompt_tokens=3)
    assert (list(v[0]), list(v[0]["choices"][0])) == keys("vllm_completions.sse", 1)
    c = vllm_chunks("chat", ["a", "b"], model="m", prompt_tokens=3)
    assert (list(c[0]), list(c[0]["choices"][0])) == keys("vllm_chat.sse", 0)
    assert (list(c[1]), list(c[1]["choices"][0])) == keys("vllm_chat.sse", 1)
    assert (list(c[2]), list(c[2]["choices"][0])) == keys("vllm_chat.sse", -3)
    assert list(c[-1]) == keys("vllm_chat.sse", -2)[0]
    lc = llamacpp_chunks("completions", ["a", "b"], model="m", prompt_tokens=3)
    assert (list(lc[-1]), list(lc[-1]["choices"][0])) == keys("llamacpp_completions.sse", -2)
    lh = llamacpp_chunks("chat", ["a", "b"], model="m", prompt_tokens=3)
    assert list(lh[-1]) == keys("llamacpp_chat.sse", -2)[0]
