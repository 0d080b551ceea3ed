"""Run directory I/O, the summary's validity rule, and the Prometheus text parser."""
import json

import pytest

from fairlib.client import ERROR_CLASSES, RECORD_FIELDS, load_records
from fairlib.client.prom import MetricsScraper, parse_prometheus
from fairlib.records.schema import new_record
from fairlib.records.rundir import RunDir, read_jsonl
from fairlib.client.schedule import PlannedRequest
from fairlib.records.summary import summarize

PROM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B-FP8"} 3.0
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B-FP8"} 12
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 17.0
vllm:kv_cache_usage_perc{engine="0",model_name="a b} c"} NaN
vllm:weird{label="esc\\"aped"} 2.5 1700000000000
llamacpp:requests_processing 2
llamacpp:n_decode_total 1234
process_cpu_seconds_total 12.3
python_gc_objects_collected_total{generation="0"} 5.0
"""


def test_parse_prometheus():
    m = parse_prometheus(PROM)
    assert m['vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B-FP8"}'] == 3.0
    assert m['vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B-FP8"}'] == 12.0
    assert m['vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"}'] == 17.0
    assert m['vllm:kv_cache_usage_perc{engine="0",model_name="a b} c"}'] is None  # NaN -> null
    assert m['vllm:weird{label="esc\\"aped"}'] == 2.5
    assert m["llamacpp:requests_processing"] == 2.0 and m["llamacpp:n_decode_total"] == 1234.0
    assert not any(k.startswith(("process_", "python_")) for k in m)
    json.dumps(m, allow_nan=False)  # strict JSON


def test_scraper_survives_a_dead_endpoint(tmp_path):
    s = MetricsScraper("http://127.0.0.1:9/metrics", tmp_path / "m.jsonl", t0_wall=0.0, interval_s=0.05,
                       timeout_s=0.2).start()
    stats = s.stop()
    assert stats["samples"] == 0 and stats["errors"] >= 1 and stats["last_error"]


def rows(lags_ms, classes=None):
    classes = classes or ["none"] * len(lags_ms)
    return [(0.01 * i, 0.01 * i + lag / 1e3 if lag is not None else None, c)
            for i, (lag, c) in enumerate(zip(lags_ms, classes))]


def test_summary_validity_threshold():
    ok = summarize(rows([0.5] * 99 + [3.0]), n_planned=100, requested_rate_rps=100.0)
    assert ok["valid"] and ok["schedule_lag_ms"]["max"] == pytest.approx(3.0)
    assert ok["achieved_rate_rps"] == pytest.approx(100.0, rel=0.01)
    late = [0.5] * 90 + [30.0] * 10
    bad = summarize(rows(late), n_planned=100, requested_rate_rps=100.0)
    assert not bad["valid"] and "fell behind" in bad["valid_reason"]
    lax = summarize(rows(late), n_planned=100, requested_rate_rps=100.0, lag_threshold_ms=50.0)
    assert lax["valid"] and lax["lag_threshold_ms"] == 50.0


def test_summary_counts_every_class_and_unsent():
    r = rows([1.0, 1.0, 1.0, None], ["none", "timeout", "interrupted", "none"])
    s = summarize(r[:3], n_planned=5, requested_rate_rps=None, interrupted=True)
    assert set(s["error_counts"]) == set(ERROR_CLASSES)
    assert s["error_counts"]["timeout"] == 1 and s["error_counts"]["interrupted"] == 1
    assert s["n_sent"] == 3 and s["n_not_sent"] == 2 and s["interrupted"]
    empty = summarize([], n_planned=3, requested_rate_rps=None)
    assert not empty["valid"] and empty["schedule_lag_ms"]["p99"] is None


def test_records_loader_keeps_lists_and_skips_a_torn_line(tmp_path):
    rd = RunDir(tmp_path / "r")
    w = rd.records_writer()
    for i in (2, 0, 1):
        rec = new_record(PlannedRequest(i, 0, "a", 0.1 * i, "x y", 2, 4), worker=0)
        rec.update(actual_send_s=0.1 * i, chunk_times_s=[0.1 * i + 0.5, 0.1 * i + 0.6], chunk_tokens=[1, 3],
                   first_token_s=0.1 * i + 0.5, last_token_s=0.1 * i + 0.6, completion_tokens=4)
        w.write(rec)
    w.close()
    with open(tmp_path / "r" / "records.jsonl", "a") as f:
        f.write('{"request_id": 3, "worker"')  # a crash mid-write
    assert len(read_jsonl(tmp_path / "r" / "records.jsonl")) == 3
    df = load_records(tmp_path / "r")
    assert list(df.request_id) == [0, 1, 2] and list(df.columns[:len(RECORD_FIELDS)]) == list(RECORD_FIELDS)
    assert df.chunk_times_s[1] == pytest.approx([0.6, 0.7]) and df.chunk_tokens[0] == [1, 3]
    assert list(df.columns) == list(RECORD_FIELDS)          # the fields only: no derived columns
    assert list(df.completion_tokens) == [4, 4, 4] and list(df.max_tokens) == [4, 4, 4]


def test_empty_run_dir_loads(tmp_path):
    RunDir(tmp_path / "e").records_writer().close()
    df = load_records(tmp_path / "e")
    assert len(df) == 0 and list(df.columns) == list(RECORD_FIELDS)
