"""``fit.measure`` against a stand-in for the client's sender with a known timing: the prefill
fit must not see the first request of each prompt length, which a real vLLM-CPU serves slower
(one untimed request per length comes first and is kept as ``prefill_warmup``)."""
import contextlib

import pytest

from fairlib.calibrate import fit, measurement

FIRST_OF_A_LENGTH_MS = 40.0       # what the stand-in adds to the first prompt of each new length


def _ttft_ms(P):
    return 5.0 + 0.1 * P


@pytest.fixture
def fake_sender(monkeypatch):
    seen, sent = set(), []

    async def send_request(session, r, cfg, clock):
        P = r.prompt_tokens
        extra = 0.0 if P in seen else FIRST_OF_A_LENGTH_MS
        seen.add(P)
        sent.append((P, r.max_tokens))
        ttft = (_ttft_ms(P) + extra) / 1e3
        times = [ttft + 0.010 * i for i in range(r.max_tokens)]     # 10 ms per token
        return {"error_class": "none", "ttft_s": ttft, "chunk_times_s": times,
                "chunk_tokens": [1] * len(times), "usage": {"prompt_tokens": P}}

    @contextlib.asynccontextmanager
    async def make_session(cfg):
        yield None

    monkeypatch.setattr(measurement, "send_request", send_request)
    monkeypatch.setattr(measurement, "make_session", make_session)
    return sent


def test_prefill_points_exclude_the_first_request_of_each_length(fake_sender):
    lengths = (16, 128, 256, 512)
    raw = fit.measure(None, "fairlib", fit.FitSettings(batches=(1, 2), decode_tokens=8, prompt_tokens=(32,),
                                                       prefill_lengths=lengths, repeats=1, prefill_repeats=3,
                                                       prefill_output_tokens=2))
    warm = raw["prefill_warmup"]
    assert [q["P_sent"] for q in warm] == list(lengths)
    assert [round(q["ttft_ms"], 6) for q in warm] == [round(_ttft_ms(P) + FIRST_OF_A_LENGTH_MS, 6) for P in lengths]
    assert len(raw["prefill"]) == 3 * len(lengths)
    for q in raw["prefill"]:
        assert q["ttft_ms"] == pytest.approx(_ttft_ms(q["P"]), abs=1e-9)
    pre = fit.fit_prefill(raw["prefill"])["linear"]
    assert pre["slope"] == pytest.approx(0.1, abs=1e-9) and pre["intercept"] == pytest.approx(5.0, abs=1e-9)
    assert pre["r2"] == pytest.approx(1.0, abs=1e-12)
    # the order: 2 x 2 warm-up decode requests, the decode sweep (1 + 2), the prefill warm-up, the repeats
    prefill_sent = [P for P, n in fake_sender if n == 2]
    assert prefill_sent == list(lengths) * 4


def test_no_warmup_times_the_first_requests(fake_sender):
    """``warmup=0`` sends no untimed request: then the first repeat carries the first-request cost
    (what the fit measured before the warm-up pass), and a median of 3 still hides one."""
    lengths = (16, 128)
    raw = fit.measure(None, "fairlib", fit.FitSettings(batches=(1,), decode_tokens=8, prompt_tokens=(32,),
                                                       prefill_lengths=lengths, repeats=1, prefill_repeats=3,
                                                       warmup=0))
    assert raw["prefill_warmup"] == []
    first = [q for q in raw["prefill"] if q["rep"] == 0]
    assert [q["ttft_ms"] for q in first] == pytest.approx([_ttft_ms(P) + FIRST_OF_A_LENGTH_MS for P in lengths])
    slope = fit.fit_prefill(raw["prefill"])["linear"]["slope"]
    assert slope == pytest.approx(0.1, abs=1e-9)


@pytest.mark.parametrize("kw, match", [
    (dict(batches=()), r"FitSettings\.batches must be integers >= 1 \(one or more\), got \(\)"),
    (dict(batches=(1, 0)), r"FitSettings\.batches must be integers >= 1"),
    (dict(decode_tokens=4), r"FitSettings\.decode_tokens must be integers >= 8"),
    (dict(prefill_lengths=(16, 2.5)), r"FitSettings\.prefill_lengths must be integers >= 1"),
    (dict(warmup=-1), r"FitSettings\.warmup must be integers >= 0"),
])
def test_fit_settings_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        fit.FitSettings(**kw)


def test_fit_settings_sort_the_batches_and_take_one_prompt_length():
    s = fit.FitSettings(batches=(8, 1, 4, 4), prompt_tokens=64)
    assert s.batches == (1, 4, 8) and s.prompt_tokens == (64,)
    with pytest.raises(TypeError, match="batch_sizes"):
        fit.FitSettings(batch_sizes=(1,))
