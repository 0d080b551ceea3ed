"""The scenario's question and its one-sentence answer, on hand-made numbers; the run's label."""
import math

import pandas as pd
import pytest

from fairlib.analysis.verdict import FAIR_JAIN, question_of, verdict
from fairlib.records import Run
from fairlib.records.run import default_label

SLOS = {"interactive": (500.0, 50.0), "batch": (10000.0, 100.0)}


def table(ttft_p99, shares=(30.0, 70.0), attainment=(99.0, 100.0)):
    return pd.DataFrame({"completed": [10, 10], "ttft_p99_ms": ttft_p99, "slo_attainment_pct": attainment,
                         "residency_share_pct": shares}, index=pd.Index(["interactive", "batch"], name="tenant"))


def test_question_follows_the_offered_load():
    assert question_of({"offered_load": 0.3, "rho": 0.9}) == ("isolation", 0.3)
    assert question_of({"rho": 1.4}) == ("shares", 1.4)
    assert question_of({"rho": 1.0}) == ("shares", 1.0)
    assert question_of({"victim": "x"}) == ("isolation", None)
    assert question_of({}) == ("shares", None)


def test_isolation_held_and_not_held():
    scen = {"offered_load": 0.9, "victim": "interactive"}
    v = verdict(table([400.0, 9000.0]), {"windowed_jain_residency_min": 0.62}, scen, SLOS)
    assert v.question == "isolation" and v.ok is True and v.tenant == "interactive"
    assert v.answer == ("Latency isolation held: interactive's TTFT p99 was 400 ms, within its 500 ms SLO "
                        "(SLO attainment 99.0%); the worst window's residency Jain was 0.62.")
    assert "offered load 0.90 of capacity" in v.asks and "interactive's TTFT p99" in v.asks
    alone = pd.DataFrame({"contention": [1240.0], "alone": [335.0], "ratio": [1240.0 / 335.0]},
                         index=pd.Index(["ttft_p99_ms"], name="metric"))
    v = verdict(table([1240.0, 9000.0]), {}, scen, SLOS, alone)
    assert v.ok is False
    assert v.answer == ("Latency isolation did not hold: interactive's TTFT p99 was 1,240 ms, over its 500 ms SLO "
                        "(3.7x its 335 ms alone, SLO attainment 99.0%).")


def test_isolation_without_a_victim_reads_the_tenant_furthest_over_its_slo():
    v = verdict(table([450.0, 12000.0]), {}, {"offered_load": 0.5}, SLOS)   # 0.9 and 1.2 of their SLOs
    assert v.tenant == "batch" and v.ok is False


def test_shares_fair_and_not_fair():
    scen = {"rho": 1.4}
    v = verdict(table([1.0, 1.0], shares=(48.0, 52.0)), {"jain_residency_demand": 0.99, "max_min_residency": 1.083},
                scen, SLOS)
    assert v.question == "shares" and v.ok is True
    assert v.answer == ("Shares were fair: the demand-normalised Jain of residency was 0.990 (>= 0.95); residency "
                        "shares ran from 48.0% (interactive) to 52.0% (batch), max/min 1.08.")
    v = verdict(table([1.0, 1.0], shares=(20.0, 80.0)), {"jain_residency_demand": FAIR_JAIN - 0.01}, scen, SLOS)
    assert v.ok is False and "(< 0.95)" in v.answer and v.answer.startswith("Shares were not fair")


def test_nothing_completed_is_nothing_to_judge():
    t = table([math.nan, math.nan]).assign(completed=0)
    assert verdict(t, {}, {"offered_load": 0.5, "victim": "interactive"}, SLOS).ok is None
    assert verdict(t, {"jain_residency_demand": math.nan}, {"rho": 2.0}, SLOS).answer.startswith("No request")


def test_labels():
    assert default_label("sim", "vtc") == "sim:vtc"
    assert default_label("http", "gateway-residency") == "http:gateway-residency"
    assert default_label("http", None, "http://user:secret@10.0.0.5:8080/v1") == "http:10.0.0.5:8080"
    assert default_label("http") == "http"
    recs = pd.DataFrame()
    assert Run(recs, {"extra": {"label": "mine", "backend": "http"}}).label == "mine"
    assert Run(recs, {"backend": "sim", "policy": {"name": "fcfs", "params": {}}}).label == "sim:fcfs"
    old_http = {"endpoint": {"base_url": "http://127.0.0.1:8000/v1"}, "extra": {"backend": "http", "policy": None}}
    assert Run(recs, old_http).label == "http:127.0.0.1:8000"


@pytest.mark.parametrize("load,question", [(0.2, "isolation"), (3.0, "shares")])
def test_shipped_scenarios_ask_by_their_load(load, question):
    from fairlib import scenarios
    for name in scenarios.SCENARIOS:
        s = scenarios.load(name).to_dict()
        want = "isolation" if s["offered_load"] < 1 else "shares"
        assert question_of(s)[0] == want
    assert question_of({"offered_load": load})[0] == question
