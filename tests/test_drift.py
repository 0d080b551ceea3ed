"""Chapter 5's estimator (fairlib.drift), hand-computed; the protocol and its runs
(fairlib.chapters.driftsched); the two ways of counting (fairlib.chapters.tokens); the gateway's
estimator, alone and over HTTP in front of ``fairlib serve``."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from fairlib import drift
from fairlib.drift import DriftEstimator, f_input


# --- the estimate, by hand ----------------------------------------------------------------------
def test_the_estimate_by_hand():
    e = DriftEstimator()
    assert e.estimate("summary", "premium", 200) == 368          # 256 x 1 x 1.2 x 1.2 = 368.64
    assert e.estimate("short_qa", "batch", 0) == 51              # 64 x 0.8 = 51.2
    assert e.estimate("report", "standard", 600) == 768          # 512 x min(1.5, 1.6)
    assert e.estimate("technical", "standard", 250) == 480       # 384 x 1.25
    assert f_input(0) == 1.0 and f_input(499) == pytest.approx(1.499) and f_input(10 ** 6) == 1.5


def test_the_correction_by_hand():
    e = DriftEstimator()
    assert e.observe("summary", "standard", 128) == pytest.approx(0.95)        # m = 0.5: 0.9 + 0.05
    assert e.estimate("summary", "standard", 0) == 243                         # 256 x 0.95 = 243.2
    assert e.observe("summary", "batch", 64) == pytest.approx(0.9 * 0.95 + 0.1 * 0.25)   # m = 0.25
    assert e.observe("short_qa", "premium", 2000) == pytest.approx(1.2)        # m clamped to 3
    assert e.observe("report", "premium", 0) == pytest.approx(0.925)           # m clamped to 0.25
    assert e.bias["technical"] == 1.0 and e.updates == 4                        # untouched, counted
    e2 = DriftEstimator(alpha=0.5)
    e2.observe("technical", "standard", 192)
    assert e2.bias["technical"] == pytest.approx(0.75)                          # 0.5 x 1 + 0.5 x 0.5


def test_censored_lognormal_without_cuts_is_the_moments_of_the_logs():
    x = [math.e, math.e ** 2, math.e ** 3, math.e ** 4]             # logs 1..4: mean 2.5, var 1.25
    mu, sigma = drift.censored_lognormal(x, [False] * 4, cap=1e9)
    assert mu == pytest.approx(2.5) and sigma == pytest.approx(math.sqrt(1.25))
    assert drift.lognormal_mean(0.0, 1.0) == pytest.approx(math.exp(0.5))
    # capped far above every value: the plain mean; capped at the median: by hand
    assert drift.lognormal_capped_mean(0.0, 1.0, 1e12) == pytest.approx(math.exp(0.5))
    phi_m1 = 0.5 * math.erfc(1 / math.sqrt(2))                     # Phi(-1)
    assert drift.lognormal_capped_mean(0.0, 1.0, 1.0) == pytest.approx(math.exp(0.5) * phi_m1 + 0.5)


def test_censored_lognormal_is_the_maximum_likelihood_fit():
    """EM against the censored log-likelihood maximised by scipy (an independent path), and on a
    large sample against the parameters it was drawn with; the naive mean of the served lengths
    falls short of the uncut mean."""
    from scipy.optimize import minimize
    from scipy.stats import norm
    rng = np.random.default_rng(11)
    true = rng.lognormal(math.log(380), 0.5, 400)
    cap = 512.0
    cut = true >= cap
    served = np.minimum(true, cap)
    mu, sigma = drift.censored_lognormal(served, cut, cap)
    y, c = np.log(served[~cut]), math.log(cap)

    def nll(p):
        m, ls = p
        s = math.exp(ls)
        return -(norm.logpdf(y, m, s).sum() + cut.sum() * norm.logsf(c, m, s))
    opt = minimize(nll, [y.mean(), math.log(y.std())], method="Nelder-Mead",
                   options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000})
    assert mu == pytest.approx(opt.x[0], abs=1e-5) and sigma == pytest.approx(math.exp(opt.x[1]), abs=1e-5)
    big = rng.lognormal(math.log(380), 0.5, 200_000)
    mu, sigma = drift.censored_lognormal(np.minimum(big, cap), big >= cap, cap)
    assert mu == pytest.approx(math.log(380), abs=0.01) and sigma == pytest.approx(0.5, abs=0.01)
    assert drift.lognormal_capped_mean(mu, sigma, cap) == pytest.approx(np.minimum(big, cap).mean(), rel=0.005)
    assert np.minimum(big, cap).mean() < 0.93 * drift.lognormal_mean(mu, sigma)
    with pytest.raises(ValueError, match="at least two lengths must be uncut"):
        drift.censored_lognormal([512, 512, 3], [True, True, False], 512)


def test_per_tier_key_and_the_static_baseline():
    e = DriftEstimator(key="tier")
    assert set(e.bias) == set(drift.TIERS)
    e.observe("report", "batch", 256)                       # m = 0.5 on the batch tier's factor
    assert e.bias["batch"] == pytest.approx(0.95) and e.bias["premium"] == 1.0
    assert e.estimate("short_qa", "batch", 0) == int(64 * 0.95 * 0.8)
    s = DriftEstimator(adaptive=False)
    assert s.observe("report", "batch", 10) is None and s.bias["report"] == 1.0 and s.updates == 0


@pytest.mark.parametrize("kw, match", [({"alpha": 0}, "alpha"), ({"alpha": 1.5}, "alpha"),
                                       ({"key": "tenant"}, "key must be one of category, tier")])
def test_bad_parameters_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        DriftEstimator(**kw)


def test_bad_requests_are_named():
    e = DriftEstimator()
    with pytest.raises(ValueError, match="category must be one of short_qa, summary, technical, report"):
        e.estimate("poem", "standard", 1)
    with pytest.raises(ValueError, match="tier must be one of premium, standard, batch"):
        e.estimate("summary", "gold", 1)
    with pytest.raises(ValueError, match="input_len"):
        e.estimate("summary", "standard", -1)
    with pytest.raises(ValueError, match="actual"):
        e.observe("summary", "standard", math.nan)


# --- the two ways of counting ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def counter():
    from fairlib.chapters.tokens import TextCounter
    return TextCounter()


def test_the_tokenizer_is_cl100k_offline(counter):
    assert counter.enc.encode_ordinary("hello world") == [15339, 1917]          # cl100k_base's ids
    assert counter.enc.n_vocab == 100277


def test_text_is_counted_both_ways_and_seeded(counter):
    for cat in drift.CATEGORIES:
        rng = np.random.default_rng(3)
        w, t = counter.prompt(cat, 120, rng)
        assert w == 120 and t >= 120                         # every word is at least one token
        assert counter.answer(cat, 200, np.random.default_rng(4)) < 200
    code = counter.answer("technical", 300, np.random.default_rng(1))
    prose = counter.answer("short_qa", 300, np.random.default_rng(1))
    assert code < prose                                      # code: more tokens per whitespace word
    a = counter.count_requests(["summary", "report"], [50, 80], [100, 30], seed=7)
    b = counter.count_requests(["summary", "report"], [50, 80], [100, 30], seed=7)
    assert all((x == y).all() for x, y in zip(a, b)) and list(a[2]) == [100, 30]


# --- the protocol -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(counter):
    from fairlib.chapters import driftsched as ds
    return ds.protocol_requests(0, counter, n_cal=200, n_stress=300)


def test_the_protocols_phases_mix_and_cut(small):
    from fairlib.chapters import driftsched as ds
    assert (small["phase"] == "calibration").sum() == 200 and (small["phase"] == "stress").sum() == 300
    assert small["arrival_ms"].is_monotonic_increasing
    gaps = small["arrival_ms"].diff().fillna(small["arrival_ms"].iloc[0])
    cal, stress = gaps[small["phase"] == "calibration"], gaps[small["phase"] == "stress"]
    assert cal.between(50, 150).all() and stress.between(5, 30).all()
    # the stress phase shifts the mix toward the long categories
    long_share = small.groupby("phase")["category"].apply(lambda c: c.isin(["technical", "report"]).mean())
    assert long_share["stress"] > long_share["calibration"] + 0.25
    tb = small["category"].map(drift.T_BASE)
    assert (small["output_tokens"] <= tb).all() and (small["output_tokens"] == np.minimum(small["true_tokens"], tb)).all()
    assert (small["cut"] == (small["true_tokens"] >= tb)).all() and small["cut"].any()
    assert set(small["tier"]) == {0, 1, 2}
    # the paper's prompts: the generator's prefix (8 words) and one question of 4-15 words
    assert small["prompt_words"].between(12, 24).all() and small["prompt_words"].nunique() > 5
    by_cat = small.groupby("category")["prompt_words"].mean()
    assert by_cat["report"] > by_cat[["short_qa", "summary", "technical"]].max()
    # answers: 70% reach the cap (500 draws: within 3 sd), written as prose (~1.27 tokens per word)
    assert abs(small["cut"].mean() - ds.PAPER.cap_share) < 3 * math.sqrt(0.21 / len(small))
    tpw = small["output_tokens"].sum() / small["output_words"].sum()
    assert 1.2 < tpw < 1.35, tpw
    assert (small["drain_s"] == 15.0).all() and (small["poll_s"] == 2.0).all()
    assert np.allclose(small["gap_ms"].cumsum(), small["arrival_ms"])


def test_the_first_protocol_is_kept_as_it_was(counter):
    """EARLIER: uniform prompt words, the book's answer medians and styles (technical as code), no
    drain; seeded as the chapter's first version drew it (seed 0's first requests as saved then)."""
    from fairlib.chapters import driftsched as ds
    e = ds.protocol_requests(0, counter, n_cal=200, n_stress=300, protocol=ds.EARLIER)
    for c, (lo, hi) in ds.PROMPT_WORDS.items():
        assert e.loc[e["category"] == c, "prompt_words"].between(lo, hi).all()
    assert e["drain_s"].isna().all()
    code = e[e["category"] == "technical"]
    assert code["output_tokens"].sum() / code["output_words"].sum() > 2.2      # code: many tokens a word
    # seed 0's first requests as the first version drew them (read off it before the protocol split)
    assert list(e["prompt_words"].iloc[:5]) == [133, 22, 8, 178, 17]
    assert list(e["true_tokens"].iloc[:5]) == [183, 89, 31, 272, 88]
    assert list(e["output_words"].iloc[:5]) == [64, 59, 28, 104, 55]
    assert list(e["prompt_tokens"].iloc[:5]) == [373, 27, 8, 451, 21]


def test_protocol_options_are_checked():
    from fairlib.chapters.driftsched_protocol import Protocol
    with pytest.raises(ValueError, match="prompts must be 'templates' or 'uniform'"):
        Protocol("x", prompts="long")
    with pytest.raises(ValueError, match="cap_share must be in"):
        Protocol("x", cap_share=1.0)
    with pytest.raises(ValueError, match="styles must give each of short_qa"):
        Protocol("x", styles={"short_qa": "prose"})
    with pytest.raises(ValueError, match="drain_s must be seconds"):
        Protocol("x", drain_s=-1.0)


def test_the_drain_starts_the_stress_phase_after_the_queue_is_seen_empty(small):
    """With the drain the generator looks at the queue every poll_s after its last calibration
    request; 15 s after the first look that finds every calibration request taken, the stress
    phase starts, its own gaps kept. Rebuilt from the run's admissions."""
    from fairlib.chapters import driftsched as ds
    for name in ("static", "continuous"):
        out = ds.run_protocol(small, ds.ENGINES[name], "fcfs")
        cal, st = out[out["phase"] == "calibration"], out[out["phase"] == "stress"]
        last = cal["arrival_ms"].iloc[-1]
        empty = cal["admitted_ms"].max()
        k = max(0, math.ceil((empty - last) / 2000.0))
        seen = last + 2000.0 * k
        assert seen >= empty and (k == 0 or seen - 2000.0 < empty)
        assert st["arrival_ms"].iloc[0] == pytest.approx(seen + 15000.0 + st["gap_ms"].iloc[0])
        assert np.allclose(np.diff(st["arrival_ms"]), st["gap_ms"].iloc[1:])
        assert (cal["arrival_ms"] == small.loc[small["phase"] == "calibration", "arrival_ms"]).all()
        assert ((out["e2e_s"] * 1e3 + out["arrival_ms"]) - out["finish_ms"]).abs().max() < 1e-6


def test_a_static_worker_learns_only_when_its_batch_is_back(small):
    """The estimator in the loop: a request's estimate uses exactly the answers whose results were
    back at its arrival (on a static-batch worker: when their batch ended), fed in the order they
    came back. Rebuilt here from the run's own admissions and finishes."""
    from fairlib.chapters import driftsched as ds
    for name in ("static", "continuous"):
        out = ds.run_protocol(small, ds.ENGINES[name], "fcfs", counting="tokens")
        back = out["finish_ms"].to_numpy()               # static: already the batch's end
        e = DriftEstimator()
        order = np.lexsort((np.arange(len(out)), back))
        k = 0
        for r in range(len(out)):
            while k < len(order) and back[order[k]] <= out["arrival_ms"].iat[r]:
                j = order[k]
                e.observe(out["category"].iat[j], drift.TIERS[out["tier"].iat[j]], float(out["actual"].iat[j]))
                k += 1
            assert out["est"].iat[r] == e.estimate(out["category"].iat[r], drift.TIERS[out["tier"].iat[r]],
                                                   float(out["prompt_tokens"].iat[r])), (name, r)
        if name == "static":   # batches of at most 32, and some full ones (the stress phase queues)
            sizes = out.groupby("admitted_ms").size()
            assert sizes.max() == 32


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_arrival_by_arrival_equals_a_table_run(small, engine):
    """run_protocol hands the engine one arrival at a time (the estimate needs what had finished
    by then); under FIFO, which reads no estimate, its admissions and finishes are a table run's."""
    import fairlib
    from fairlib.chapters import driftsched as ds
    out = ds.run_protocol(small, ds.ENGINES[engine], "fcfs")
    table = pd.DataFrame({"arrival_ms": out["arrival_ms"], "tenant": small["tier"],
                          "prompt_tokens": small["prompt_tokens"], "output_tokens": small["output_tokens"]})
    res = fairlib.simulate(table, ds.ENGINES[engine], "fcfs", n_tenants=3)
    assert np.array_equal(out["admitted_ms"].to_numpy(), res.requests["admitted_ms"].to_numpy())
    fin = res.requests["finish_ms"].to_numpy()
    if engine == "static":
        fin = pd.Series(fin).groupby(res.requests["admitted_ms"].to_numpy()).transform("max").to_numpy()
    assert np.array_equal(out["finish_ms"].to_numpy(), fin)


def test_sjf_keys_and_the_oracle(small):
    from fairlib.chapters import driftsched as ds
    fifo = ds.run_protocol(small, ds.ENGINES["continuous"], "fcfs")
    sjf = ds.run_protocol(small, ds.ENGINES["continuous"], "sjf")
    orc = ds.run_protocol(small, ds.ENGINES["continuous"], "sjf", oracle=True)
    # the same work: every answer served, the estimates identical under FIFO and SJF until feedback differs
    assert fifo["finish_ms"].notna().all() and sjf["finish_ms"].notna().all()
    assert orc["e2e_s"].mean() <= sjf["e2e_s"].mean() * 1.05
    assert sjf["e2e_s"].median() < fifo["e2e_s"].median()
    with pytest.raises(ValueError, match="counting must be 'tokens' or 'words'"):
        ds.run_protocol(small, ds.ENGINES["continuous"], "fcfs", counting="chars")
    with pytest.raises(ValueError, match="sjf_key"):
        ds.run_protocol(small, ds.ENGINES["continuous"], "sjf", sjf_key="time")


def test_tables_by_hand():
    from fairlib.chapters import driftsched as ds
    runs = pd.DataFrame({"counting": "tokens", "engine": "static", "policy": "FIFO", "seed": 0,
                         "est": [10, 20, 30], "est_static": [20, 20, 20], "actual": [10, 10, 40],
                         "e2e_s": [1.0, 2.0, 4.0], "tier": [0, 1, 2]})
    e = ds.error_table(runs).iloc[0]
    assert e["MAE adaptive"] == pytest.approx(20 / 3) and e["MAE static"] == pytest.approx(40 / 3)
    assert e["MAE cut (%)"] == pytest.approx(50.0)
    assert e["RMSE adaptive"] == pytest.approx(math.sqrt(200 / 3)) and e["RMSE static"] == pytest.approx(math.sqrt(600 / 3))
    lat = ds.latency_table(runs).iloc[0]
    assert lat["p50 (s)"] == 2.0 and lat["mean (s)"] == pytest.approx(7 / 3)
    assert list(ds.tier_table(runs).iloc[0]) == [1.0, 2.0, 4.0]
    assert ds.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert ds.kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert ds.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)       # 2 concordant, 1 discordant


# --- the gateway's estimator --------------------------------------------------------------------
def test_gateway_estimator_unit():
    from fairlib.gateway.estimate import GatewayEstimator, classify
    assert classify("Please summarise this") == "summary" and classify("a detailed plan") == "report"
    assert classify("review my code") == "technical" and classify("hi") == "short_qa" and classify([1, 2]) == "short_qa"
    g = GatewayEstimator("tokens")
    assert g.describe({"x-fairlib-category": "report"}, [1], "premium") == ("report", "premium")
    assert g.describe({"x-fairlib-tier": "batch"}, "summarise", None) == ("summary", "batch")
    assert g.describe({"x-fairlib-tier": "premium"}, [1], "batch") == ("short_qa", "batch")   # the file wins
    with pytest.raises(ValueError, match="x-fairlib-tier must be one of"):
        g.describe({"x-fairlib-tier": "gold"}, [1], None)
    assert g.describe({}, [1], None) == ("short_qa", "standard")
    with pytest.raises(ValueError, match="x-fairlib-category must be one of"):
        g.describe({"x-fairlib-category": "poem"}, [1], None)
    assert g.budget("summary", "premium", 200) == (368, 568)
    assert g.finished("summary", "standard", 128, "x " * 999) == pytest.approx(0.95)     # tokens, not words
    w = GatewayEstimator("words")
    assert w.finished("summary", "standard", 200, "one two " * 32) == pytest.approx(0.9 + 0.1 * 0.25)
    assert w.finished("short_qa", "standard", 64, "a " * 64) == pytest.approx(1.0)      # 64 words: m = 1
    assert w.state()["observed"] == 2 and w.state()["counting"] == "words"
    with pytest.raises(ValueError, match="--estimator must be one of tokens, words"):
        GatewayEstimator("chars")


def test_gateway_estimates_learns_and_orders_sjf_over_http(tmp_path):
    """sjf on the gateway's own estimates: the category header decides the order, the factor learns
    from the answers that come back (tokens counted from the stream), a bad header is a 400."""
    from fairlib.gateway import GatewayConfig, GatewayThread
    from fairlib.serve import ServeConfig, ServerThread
    from fairlib.sim.engine import Engine
    from test_gateway import FID, assert_idle, completion, post, _order_of_admission
    eng = Engine(iter_base_ms=6.0, iter_slope_ms=0.5, prefill_ms_per_token=0.02, max_batch=4)
    f = tmp_path / "tenants.toml"
    f.write_text('[[tenant]]\nname = "p"\ntier = "premium"\n[[tenant]]\nname = "b"\ntier = "batch"\n'
                 '[[tenant]]\nname = "n"\n')
    with ServerThread(ServeConfig(engine=eng, model="sim-model", port=0, n_tenants=4)) as up:
        gw = GatewayThread(GatewayConfig(upstreams=(up.base_url,), port=0, max_inflight=1, policy="sjf",
                                         tenants=str(f), estimator="tokens", health_interval_s=0.2,
                                         record_events=True)).start()
        try:
            cats = ["report", "short_qa", "summary"]
            order = _order_of_admission(gw, [(completion(2), {FID: "b", "x-fairlib-category": c}) for c in cats],
                                        (completion(60), {FID: "p", "x-fairlib-category": "short_qa"}))
            # budgets 20 + int(64 x 0.8 x 1.02) = 72, 20 + 208, 20 + 417: shortest first
            assert order == [0, 2, 3, 1]
            st = gw.state()["estimator"]
            # four answers back: short_qa 60 tokens (m = 0.9375) then 2 (m = 0.25); summary 2; report 2
            b1 = 0.9 * 1 + 0.1 * (60 / 64)
            assert st["observed"] == 4 and st["bias"]["short_qa"] == pytest.approx(0.9 * b1 + 0.1 * 0.25)
            assert st["bias"]["summary"] == pytest.approx(0.925) and st["bias"]["report"] == pytest.approx(0.925)
            s, _, raw = post(gw.base_url, "/completions", completion(2), {FID: "p", "x-fairlib-category": "poem"})
            err = json.loads(raw)["error"]
            assert s == 400 and "x-fairlib-category must be one of" in err["message"] and err["param"] == "x-fairlib-category"
            s, _, raw = post(gw.base_url, "/completions", completion(2), {FID: "n", "x-fairlib-tier": "gold"})
            assert s == 400 and json.loads(raw)["error"]["param"] == "x-fairlib-tier"
            # a chat request, not streamed, classified from its messages ("summarise" -> summary):
            # its 128-token answer moves summary's factor to 0.9 x 0.925 + 0.1 x 0.5
            chat = {"model": "sim-model", "max_tokens": 128, "ignore_eos": True, "stream": False,
                    "messages": [{"role": "user", "content": "please summarise this"}]}
            s, _, raw = post(gw.base_url, "/chat/completions", chat, {FID: "p"})
            assert s == 200 and json.loads(raw)["usage"]["completion_tokens"] == 128
            st = gw.state()["estimator"]
            assert st["observed"] == 5 and st["bias"]["summary"] == pytest.approx(0.9 * 0.925 + 0.05)
            assert_idle(gw)
            gw.set_policy("sjf")                  # a policy switch starts a fresh estimator
            assert gw.state()["estimator"]["observed"] == 0
        finally:
            gw.stop()


def test_run_steps_engine_is_the_line_through_the_median_step_of_each_batch(tmp_path):
    """Steps as a gateway logs them: at B=2 three steps (5, 100, 5 ms: the median drops the
    stall), at B=4 one of 7 ms, at B=1 one that is ignored: dt = 3 + 1 B; the step table compares
    the full batch's median (B=4: 7 ms) with the fitted engine's 2 + 0.5 * 4 = 4 ms."""
    import json as _json
    from types import SimpleNamespace

    from fairlib.chapters import driftsched as ds
    from fairlib.sim.engine import Engine

    ev = [{"spec": {}, "tenants": []}]
    t = 0.0
    for dt, B in ((5, 2), (100, 2), (5, 2), (7, 4), (50, 1)):
        t += dt
        ev.append(["step", t, dt, list(range(B)), [1] * B, [False] * B])
    (tmp_path / "gateway_events.jsonl").write_text("".join(_json.dumps(e) + "\n" for e in ev))
    run = SimpleNamespace(path=str(tmp_path), extra={"sim_engine": Engine(2.0, 0.5, 0.25, 4).to_dict(),
                                                      "driftsched": {"label": "FIFO", "seed": 0}})
    e = ds.run_steps_engine(run)
    assert (e.iter_base_ms, e.iter_slope_ms, e.prefill_ms_per_token, e.max_batch) == pytest.approx((3.0, 1.0, 0.25, 4))
    st = ds.run_steps(run)
    assert list(st["B"]) == [2, 2, 2, 4, 1] and st["dt_ms"].sum() == 167
    row = ds.step_table([run]).iloc[0]
    assert row["measured / fitted"] == pytest.approx(7 / 4)
    assert row["mean batch"] == pytest.approx(11 / 5)


def test_run_steps_engine_with_one_batch_size_keeps_the_fitted_slope(tmp_path):
    import json as _json
    from types import SimpleNamespace

    from fairlib.chapters import driftsched as ds
    from fairlib.sim.engine import Engine

    ev = [{"spec": {}, "tenants": []}] + [["step", 10.0 * (i + 1), 10.0, [0, 1, 2, 3], [1] * 4, [False] * 4]
                                          for i in range(3)]
    (tmp_path / "gateway_events.jsonl").write_text("".join(_json.dumps(e) + "\n" for e in ev))
    run = SimpleNamespace(path=str(tmp_path), extra={"sim_engine": Engine(2.0, 0.5, 0.25, 4).to_dict()})
    e = ds.run_steps_engine(run)
    assert (e.iter_base_ms, e.iter_slope_ms) == pytest.approx((8.0, 0.5))      # 10 = 8 + 0.5 * 4


@pytest.mark.parametrize("steps, want", [
    (((10.0, 2), (6.0, 4)), (8.0, 0.0)),            # falls with the batch: the mean step (weights 1, 1)
    (((1.0, 2), (9.0, 4)), (0.0, 1.9)),             # crosses zero: through the origin, b = (2 + 36) / 20
    (((1.0, 4),), (0.0, 0.25)),                     # one size, faster than the fit's slope: 1 = 0.25 x 4
])
def test_run_steps_engine_never_builds_an_impossible_engine(tmp_path, steps, want):
    import json as _json
    from types import SimpleNamespace

    from fairlib.chapters import driftsched as ds
    from fairlib.sim.engine import Engine

    ev = [{"spec": {}, "tenants": []}]
    t = 0.0
    for dt, B in steps:
        t += dt
        ev.append(["step", t, dt, list(range(B)), [1] * B, [False] * B])
    (tmp_path / "gateway_events.jsonl").write_text("".join(_json.dumps(e) + "\n" for e in ev))
    run = SimpleNamespace(path=str(tmp_path), extra={"sim_engine": Engine(2.0, 0.5, 0.25, 4).to_dict()})
    e = ds.run_steps_engine(run)
    assert (e.iter_base_ms, e.iter_slope_ms) == pytest.approx(want)


# --- the paper's figures from a protocol's runs (fairlib.chapters.driftsched_figures) ----------------
def test_figures_are_aggregated_as_the_chapter_aggregates_them(small):
    """figures_table: latencies averaged over the seeds, SJF's cuts from those means; the error cuts
    the mean over the schedulers of error_table's per-run cuts (checked against runs made here)."""
    from fairlib.chapters import driftsched as ds
    from fairlib.chapters import driftsched_figures as dfig
    halves = {0: small.iloc[:250].reset_index(drop=True), 1: small.iloc[250:].reset_index(drop=True)}
    halves[1] = halves[1].assign(arrival_ms=halves[1]["arrival_ms"] - halves[1]["arrival_ms"].iloc[0] + 1.0)
    eng = ds.ENGINES["static"]
    pols = ("FIFO", "SJF", "Priority")
    t = dfig.figures_table({"x": ("k", eng)}, [0, 1], lambda key, s: halves[s], policies=pols).loc["x"]
    p50 = {p: [ds.run_protocol(halves[s], eng, *ds.POLICIES[p], counting="words")["e2e_s"].quantile(0.5)
               for s in (0, 1)] for p in ("FIFO", "SJF")}
    assert t["SJF p50 cut (%)"] == pytest.approx(100 * (1 - np.mean(p50["SJF"]) / np.mean(p50["FIFO"])))
    runs = pd.concat([ds.run_protocol(halves[s], eng, *ds.POLICIES[p], counting="words")
                      .assign(counting="words", engine="static", policy=p, seed=s) for p in pols for s in (0, 1)])
    assert t["MAE cut (%)"] == pytest.approx(ds.error_table(runs)["MAE cut (%)"].mean())
    with pytest.raises(ValueError, match="policies must include FIFO, SJF and Priority"):
        dfig.paper_figures(small, eng, policies=("FIFO", "SJF"))


def test_the_step_factor_fit_recovers_a_known_step(small):
    """Priority's latencies made at step x1.2 are recovered from a grid around it (error 0 there)."""
    from fairlib.chapters import driftsched as ds
    from fairlib.chapters import driftsched_figures as dfig
    o = ds.run_protocol(small, ds.l4_engines(1.2)["static"], "priority", counting="words")
    pub = [o.loc[o["tier"] == 0, "e2e_s"].mean(), o.loc[o["tier"] == 2, "e2e_s"].mean()]
    f, table = dfig.fit_step_factor([small], pub, grid=(1.0, 1.1, 1.2, 1.3))
    assert f == 1.2 and table.loc[1.2, "squared log error"] == pytest.approx(0.0, abs=1e-24)
    assert (table["squared log error"].drop(1.2) > 0).all()
    with pytest.raises(ValueError, match="published must be Priority"):
        dfig.fit_step_factor([small], [77.0])
    with pytest.raises(ValueError, match="step_factor must be"):
        ds.l4_engines(0.0)
