"""The precomputed schedule: determinism, unique prefixes, prompt sizes, sharding, validation."""
import hashlib
import zlib

import numpy as np
import pandas as pd
import pytest

from fairlib.client import EndpointConfig, build_request, build_schedule, make_prompt
from fairlib.client.schedule import Schedule


def workload(n=40, seed=3, tenants=3):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "arrival_ms": np.sort(rng.uniform(0, 5000, n)).round(3),
        "tenant": rng.integers(0, tenants, n),
        "prompt_tokens": rng.integers(1, 300, n),
        "output_tokens": rng.integers(1, 64, n),
        "priority": rng.integers(0, 3, n),
    })


class PieceTokenizer:
    """A toy subword tokenizer: words cut into 3-character pieces, the first marked with '▁'."""

    name_or_path = "toy-pieces"

    def __init__(self):
        self.rev = {}

    def encode(self, text, add_special_tokens=True):
        ids = [1] if add_special_tokens else []  # a BOS the schedule must not count
        for w in text.split(" "):
            if not w:
                continue
            for k in range(0, len(w), 3):
                piece = ("▁" if k == 0 else "") + w[k:k + 3]
                i = 2 + zlib.crc32(piece.encode()) % 50000
                self.rev[i] = piece
                ids.append(i)
        return ids

    def decode(self, ids):
        return "".join(self.rev[i] for i in ids if i != 1).replace("▁", " ").lstrip(" ")


def test_same_seed_byte_identical_other_seed_different():
    df = workload()
    a, b = build_schedule(df, seed=7), build_schedule(df.copy(), seed=7)
    assert a.to_jsonl() == b.to_jsonl()
    assert hashlib.sha256(a.to_jsonl()).hexdigest() == b.sha256()
    assert build_schedule(df, seed=8).sha256() != a.sha256()


def test_roundtrip_through_jsonl(tmp_path):
    s = build_schedule(workload(), seed=1, tokenizer=PieceTokenizer())
    s.save(tmp_path / "s.jsonl")
    t = Schedule.load(tmp_path / "s.jsonl")
    assert t.to_jsonl() == s.to_jsonl() and t.requests == s.requests


def test_fields_order_and_sizes_whitespace():
    df = workload()
    s = build_schedule(df, seed=2)
    order = df.sort_values("arrival_ms", kind="mergesort").reset_index(drop=True)
    assert [r.request_id for r in s] == list(range(len(df)))
    assert [r.send_offset_s for r in s] == list(order["arrival_ms"] / 1000.0)
    assert [r.max_tokens for r in s] == list(order["output_tokens"])
    assert [r.priority for r in s] == list(order["priority"])
    assert [r.tenant_name for r in s] == [f"tenant{t}" for t in order["tenant"]]
    for r, p in zip(s, order["prompt_tokens"]):
        assert r.prompt_tokens == p and len(r.prompt.split()) == p and r.api == "completions"


def test_unique_prefixes_and_per_tenant_streams():
    df = workload(60)
    s = build_schedule(df, seed=4)
    firsts = [r.prompt.split()[0] for r in s]
    assert len(set(firsts)) == len(s)  # no two requests share a first token: no prefix-cache hit
    # tenant 0's prompts do not depend on the other tenants' traffic
    only0 = build_schedule(df[df.tenant == 0], seed=4)
    assert [r.prompt for r in s if r.tenant == 0] == [r.prompt for r in only0]


def test_tokenizer_sizing_exact():
    tok = PieceTokenizer()
    s = build_schedule(workload(), seed=5, tokenizer=tok)
    for r in s:
        assert isinstance(r.prompt, tuple) and len(r.prompt) == r.prompt_tokens
        assert 1 not in r.prompt  # no BOS
    text = build_schedule(workload(), seed=5, tokenizer=tok, token_id_prompts=False)
    for r, want in zip(text, s):
        assert isinstance(r.prompt, str)
        assert len(tok.encode(r.prompt, add_special_tokens=False)) == r.prompt_tokens == want.prompt_tokens


def test_make_prompt_deterministic_and_one_token():
    assert make_prompt(1, 2, 3, 50) == make_prompt(1, 2, 3, 50)
    assert make_prompt(1, 2, 3, 50) != make_prompt(1, 2, 4, 50)
    p, n = make_prompt(0, 0, 0, 1)
    assert n == 1 and len(p.split()) == 1


def test_tenant_names_and_string_tenants():
    df = workload(10)
    s = build_schedule(df, seed=0, tenant_names=["alice", "bob", "carol"])
    assert {r.tenant_name for r in s} <= {"alice", "bob", "carol"}
    df2 = df.assign(tenant=df.tenant.map({0: "zed", 1: "amy", 2: "kim"}))
    s2 = build_schedule(df2, seed=0)
    assert s2.meta["tenant_names"] == ["amy", "kim", "zed"]
    assert all(s2.meta["tenant_names"][r.tenant] == r.tenant_name for r in s2)


def test_shard_round_robin():
    s = build_schedule(workload(11), seed=0)
    shards = s.shard(3)
    assert [len(x) for x in shards] == [4, 4, 3]
    assert sorted(r.request_id for x in shards for r in x) == list(range(11))
    assert [r.request_id for r in shards[1]] == [r.request_id for r in s.requests[1::3]]


def test_validation():
    df = workload(5)
    with pytest.raises(ValueError, match="lacks columns"):
        build_schedule(df.drop(columns=["output_tokens"]), seed=0)
    with pytest.raises(ValueError, match="prompt_tokens"):
        build_schedule(df.assign(prompt_tokens=0), seed=0)
    with pytest.raises(ValueError, match="arrival_ms"):
        build_schedule(df.assign(arrival_ms=-1.0), seed=0)
    with pytest.raises(ValueError, match="chat"):
        build_schedule(df, seed=0, api="chat", tokenizer=PieceTokenizer(), token_id_prompts=True)


def test_request_body_completions_and_chat():
    s = build_schedule(workload(3), seed=0)
    r = s[0]
    url, headers, body = build_request(r, EndpointConfig(base_url="http://h:1/v1", model="m"))
    import json
    b = json.loads(body)
    assert url == "http://h:1/v1/completions" and headers["X-Tenant"] == r.tenant_name
    assert b["stream"] and b["stream_options"] == {"include_usage": True} and b["ignore_eos"]
    assert b["max_tokens"] == r.max_tokens and "min_tokens" not in b and "priority" not in b
    cfg = EndpointConfig(base_url="http://h:1/v1", model="m", send_min_tokens=True, send_priority=True,
                         ignore_eos=False, extra_body={"return_token_ids": True}, tenant_header=None)
    sc = build_schedule(workload(3), seed=0, api="chat")
    url, headers, body = build_request(sc[0], cfg)
    b = json.loads(body)
    assert url.endswith("/chat/completions") and "X-Tenant" not in headers and "ignore_eos" not in b
    assert b["messages"][0]["content"] == sc[0].prompt
    assert b["max_tokens"] == b["max_completion_tokens"] == b["min_tokens"] == sc[0].max_tokens
    assert b["priority"] == sc[0].priority and b["return_token_ids"] is True
    with pytest.raises(ValueError):
        build_request(sc[0], EndpointConfig(api="completions"))
