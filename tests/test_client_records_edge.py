"""Records that stay right against hostile answers (issue 10, items 3, 4 and parts of 9).

NaN/Infinity in the server's JSON, coalesced tokens (usage deltas, token ids, text), an HTML 200
page, a non-streamed answer, usage over max_tokens, a record the writer cannot keep, and damaged
run-directory files. Servers are ``fairlib.serve.replay`` test doubles on 127.0.0.1.
"""
import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from fairlib.analysis.reporting import main as analyze_main
from fairlib.analysis.service import token_service
from fairlib.client import EndpointConfig, build_schedule, load_records, load_summary, run
from fairlib.client.stream import StreamAccumulator
from fairlib.protocol.sse import loads_finite
from fairlib.records import load_run
from fairlib.records.rundir import RecordWriter, read_jsonl
from fairlib.records.schema import new_record
from fairlib.records.summary import summarize
from fairlib.serve.replay import Html, NonStreamed, ReplayServer, Synth

NAN = float("nan")

ROUTES = {
    "nan_chunk": Synth(chunk_patch={"metrics": {"queue_ms": NAN}}),
    "nan_usage": Synth(usage_patch={"completion_tokens": NAN}),
    "inf_usage": Synth(usage_patch={"prompt_tokens": float("inf")}),
    "coalesced": Synth(chunk_pattern=(1, 1, 2)),                     # 4 tokens per 3 events
    "coalesced_usage": Synth(chunk_pattern=(1, 1, 2), continuous_usage=True),
    "html": Html(),
    "whole": NonStreamed(delay_s=0.02),
    "over": Synth(usage_patch={"completion_tokens": 20}),
    "ok": Synth(ttft_s=0.01, itl_s=0.001),
}


@pytest.fixture(scope="module")
def server():
    with ReplayServer(ROUTES) as srv:
        yield srv


def schedule(n=2, out=16, tenants=("t",)):
    df = pd.DataFrame({"arrival_ms": [i * 10.0 for i in range(n)], "tenant": [i % len(tenants) for i in range(n)],
                       "prompt_tokens": 16, "output_tokens": out, "priority": 0})
    return build_schedule(df, seed=0, api="completions", tenant_names=list(tenants))


def go(server, route, path, sched=None, extra_body=None):
    cfg = EndpointConfig(base_url=server.url(route), model="m", timeout_s=5.0, extra_body=extra_body or {})
    summary = run(sched or schedule(), cfg, path, scrape_metrics=False, collect_env=False, start_delay_s=0.05)
    return summary, load_records(path)


# --- 3: NaN / Infinity in the server's JSON -------------------------------------------------------

def test_loads_finite_nulls_and_locates_nonfinite_numbers():
    obj, bad = loads_finite('{"a": [1, NaN, {"b": -Infinity}], "s": "NaN", "c": Infinity}')
    assert obj == {"a": [1, None, {"b": None}], "s": "NaN", "c": None}
    assert bad == ["a[1]=NaN", "a[2].b=-Infinity", "c=Infinity"]
    assert loads_finite(b'{"x": 1.5}') == ({"x": 1.5}, [])


@pytest.mark.parametrize("route, where", [("nan_chunk", "metrics.queue_ms=NaN"),
                                          ("nan_usage", "usage.completion_tokens=NaN"),
                                          ("inf_usage", "usage.prompt_tokens=Infinity")])
def test_nonfinite_json_is_recorded_and_flagged(server, tmp_path, route, where):
    summary, df = go(server, route, tmp_path / "r")
    assert len(read_jsonl(tmp_path / "r" / "records.jsonl")) == 2      # both records written
    assert list(df.error_class) == ["nonfinite_number"] * 2, list(df.error_message)
    assert [list(x) for x in df.nonfinite] == [[where]] * 2
    assert all(where in m for m in df.error_message)
    assert summary["n_records"] == summary["n_sent"] == 2 and summary["n_not_sent"] == 0
    assert summary["error_counts"]["nonfinite_number"] == 2 and summary["n_ok"] == 0
    assert not summary["valid"] and "nonfinite_number 2" in summary["valid_reason"]
    assert load_summary(tmp_path / "r")["valid"] is False
    if route == "nan_usage":
        assert df.usage[0]["completion_tokens"] is None and pd.isna(df.completion_tokens[0])


def test_a_nonfinite_answer_beside_good_ones_is_counted(server, tmp_path):
    s = schedule(n=4)
    summary, _ = go(server, "nan_chunk", tmp_path / "bad", s)
    assert summary["error_counts"]["nonfinite_number"] == 4
    summary, df = go(server, "ok", tmp_path / "good", s)
    assert summary["error_counts"]["nonfinite_number"] == 0 and (df.nonfinite.isna()).all()


def test_a_record_the_writer_cannot_keep_is_an_error_the_run_counts(tmp_path):
    class Odd:
        def __repr__(self):
            return "Odd()"

    w = RecordWriter(tmp_path / "records.jsonl")
    rec = {"request_id": 0, "error_class": "none", "error_message": None,
           "server_timings": {"x": NAN, "y": [1.0, float("-inf")]}, "usage": Odd()}
    w.write(rec)                                   # never raises
    ok = {"request_id": 1, "error_class": "none", "error_message": None}
    w.write(ok)
    w.close()
    assert rec["error_class"] == "record_error" and w.failed == 1 and w.count == 2
    assert "server_timings.x=nan" in rec["error_message"] and "usage=Odd" in rec["error_message"]
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    first = json.loads(lines[0], parse_constant=lambda c: pytest.fail(f"{c} written"))
    assert first["server_timings"] == {"x": None, "y": [1.0, None]} and first["usage"] == "Odd()"
    assert first["error_class"] == "record_error" and json.loads(lines[1])["error_class"] == "none"
    late = {"request_id": 2, "error_class": "none", "error_message": None}
    w.write(late)                                  # closed file: not written, still counted
    assert late["error_class"] == "record_error" and "not written" in late["error_message"] and w.failed == 2
    s = summarize([(0.0, 0.0, "record_error"), (0.01, 0.01, "none")], n_planned=2, requested_rate_rps=None)
    assert s["error_counts"]["record_error"] == 1 and not s["valid"] and "record_error" in s["valid_reason"]


# --- 4: coalesced tokens --------------------------------------------------------------------------

@pytest.mark.parametrize("route, extra, source", [("coalesced", None, "text"),
                                                  ("coalesced", {"return_token_ids": True}, "token_ids"),
                                                  ("coalesced_usage", None, "usage")])
def test_coalesced_tokens_are_all_counted(server, tmp_path, route, extra, source):
    summary, df = go(server, route, tmp_path / "r", schedule(n=2, out=96), extra)
    assert list(df.error_class) == ["none", "none"], list(df.error_message)
    assert list(df.n_token_chunks) == [72, 72] and list(df.completion_tokens) == [96, 96]
    for ck in df.chunk_tokens:
        assert ck == [1, 1, 2] * 24 and sum(ck) == 96
    assert list(df.chunk_tokens_source) == [source, source]
    service = token_service(load_run(tmp_path / "r"), window="all")
    assert service["output_tokens"].sum() == 192                     # 2 x 96, not 2 x 72


def _acc(texts, usage_total=None):
    acc = StreamAccumulator()
    for i, t in enumerate(texts):
        acc.add({"choices": [{"index": 0, "text": t, "finish_reason": None}]}, float(i))
    if usage_total is not None:
        acc.add({"choices": [], "usage": {"completion_tokens": usage_total, "prompt_tokens": 1}}, 9.0)
    return acc


def test_text_rule_shares_the_usage_total():
    # words match the total: the words
    assert _acc([" a", " b c", " d"], 4).resolve_chunk_tokens() == ([1, 2, 1], "text")
    # no total: the words, at least 1 a chunk
    assert _acc([" a", " b c", "\n"]).resolve_chunk_tokens() == ([1, 2, 1], "text")
    # one word each (no spaces), 7 tokens over 3 chunks: 1 each + 4 by characters [2, 4, 1]:
    # quotas 8/7, 16/7, 4/7 -> floors 1, 2, 0, the remainder to the largest fraction (4/7)
    assert _acc(["你好", "世界和平", "!"], 7).resolve_chunk_tokens() == ([2, 3, 2], "text")
    # extra tokens follow the extra words [0, 2, 1]: total 8 = 3 + 5 extra, quotas 0, 10/3, 5/3
    # -> floors 0, 3, 1, the remainder to the largest fraction (2/3) -> 1 + [0, 3, 2]
    assert _acc([" a", " b c d", " e f"], 8).resolve_chunk_tokens() == ([1, 4, 3], "text")
    # total 9 = 3 + 6 extra: quotas 0, 4, 2
    assert _acc([" a", " b c d", " e f"], 9).resolve_chunk_tokens() == ([1, 5, 3], "text")
    # fewer tokens than chunks: the total by words [1, 2, 1] -> quotas 0.5, 1, 0.5 -> [1, 1, 0]
    assert _acc([" a", " b c", " d"], 2).resolve_chunk_tokens() == ([1, 1, 0], "text")


# --- 9: an HTML 200 page, a non-streamed answer, usage over max_tokens ----------------------------

def test_html_200_page_is_its_own_error_class(server, tmp_path):
    summary, df = go(server, "html", tmp_path / "r")
    assert list(df.error_class) == ["bad_content_type"] * 2
    msg = df.error_message[0]
    assert "text/html" in msg and "<!DOCTYPE html><html>" in msg
    assert summary["error_counts"]["bad_content_type"] == 2 and summary["error_counts"]["disconnect"] == 0


def test_non_streamed_answer_has_unknown_tpot(server, tmp_path):
    _, df = go(server, "whole", tmp_path / "r")
    r = df.iloc[0]
    assert r.error_class == "none" and r.completion_tokens == 16 and r.n_token_chunks == 1
    assert r.ttft_s >= 0.02 and r.e2e_s == pytest.approx(r.ttft_s)
    assert r.tpot_s is None or math.isnan(r.tpot_s)                   # unknown, not 0
    assert r.streamed is not None and not r.streamed                  # and the record says why
    assert r.chunk_tokens == [16] and r.chunk_tokens_source == "usage"
    assert json.loads((tmp_path / "r" / "records.jsonl").read_text().splitlines()[0])["tpot_s"] is None


def test_streamed_answer_has_tpot_and_says_streamed(server, tmp_path):
    _, df = go(server, "ok", tmp_path / "r")
    assert (df.streamed == True).all() and (df.tpot_s > 0).all()  # noqa: E712


def test_usage_over_max_tokens_is_not_trusted(server, tmp_path):
    summary, df = go(server, "over", tmp_path / "r")
    assert list(df.error_class) == ["over_max_tokens"] * 2
    assert "completion_tokens 20 > max_tokens 16" in df.error_message[0]
    assert summary["error_counts"]["over_max_tokens"] == 2 and summary["n_ok"] == 0 and not summary["valid"]


# --- 9: damaged run-directory files name the file and the line ------------------------------------

def test_damaged_run_dir_files_name_file_and_line(server, tmp_path, capsys):
    d = tmp_path / "r"
    go(server, "ok", d, schedule(n=3))
    rec = d / "records.jsonl"
    lines = rec.read_text().splitlines(keepends=True)
    rec.write_text(lines[0] + '{"request_id": 1, "oops\n' + lines[2])
    with pytest.raises(ValueError, match=r"records\.jsonl, line 2: not JSON"):
        load_records(d)
    with pytest.raises(ValueError, match=r"records\.jsonl, line 2"):
        load_run(d)
    assert analyze_main(["--run", str(d), "--out", str(tmp_path / "report.md")]) == 2   # fairlib analyze
    assert f"{rec}, line 2: not JSON" in capsys.readouterr().err
    rec.write_text("".join(lines))
    cfg = d / "config.json"
    text = cfg.read_text().splitlines(keepends=True)
    cfg.write_text(text[0] + text[1] + "  oops\n" + "".join(text[2:]))
    with pytest.raises(ValueError, match=r"config\.json, line 3 column 3"):
        load_run(d)
    cfg.write_text("".join(text))
    (d / "summary.json").write_text('{\n  "valid": tru\n}\n')
    with pytest.raises(ValueError, match=r"summary\.json, line 2"):
        load_summary(d)
    with pytest.raises(ValueError, match=r"summary\.json, line 2"):
        load_run(d)


def test_new_record_has_every_new_field():
    req = SimpleNamespace(request_id=0, tenant=0, tenant_name="t", priority=0, api="completions",
                          prompt_tokens=1, max_tokens=1, send_offset_s=0.0)
    assert {"streamed", "chunk_tokens_source", "nonfinite"} <= set(new_record(req))
