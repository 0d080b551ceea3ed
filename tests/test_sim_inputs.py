"""simulate() and the simulator's records (trace_simulation) check their inputs with one function
(fairlib.sim.simulate.prepare): they accept and refuse the same things."""
import numpy as np
import pandas as pd
import pytest

from fairlib import Engine, make_policy, simulate
from fairlib.records import trace_simulation

ENG = Engine(8.0, 1.0, 0.0, 4)


def _table(**extra):
    return pd.DataFrame({"arrival_ms": [0.0, 1.0, 2.0], "tenant": [0, 1, 0], "prompt_tokens": [4, 4, 4],
                         "output_tokens": [3, 2, 1], **extra})


@pytest.mark.parametrize("kw, says", [
    (dict(horizon_ms=True), "horizon_ms"),
    (dict(horizon_ms=0), "horizon_ms"),
    (dict(horizon_ms=float("nan")), "horizon_ms"),
    (dict(tenant_names=["a", "b", "c"], n_tenants=2), "tenant_names has 3 names for 2 tenants"),
    (dict(policy="sjf"), "needs the requests column 'est_output_tokens'"),
    (dict(policy="nope"), "policy must be one of"),
])
def test_both_refuse_the_same(kw, says):
    for run in (simulate, trace_simulation):
        with pytest.raises(ValueError, match=says):
            run(_table(), ENG, **kw)


@pytest.mark.parametrize("policy", ["fcfs", "vtc", "residency", "priority", "aging"])
def test_a_policy_object_serves_both(policy):
    """The same Policy object (not a name) in simulate() and in the traced run: same result, the
    object unchanged (the traced run used to copy it, and the copy failed for residency)."""
    pol = make_policy(policy)
    before = dict(vars(pol))
    t = _table(klass=[1, 0, 0], priority=[1, 0, 0])
    a = simulate(t, ENG, pol, tenant_names=["x", "y"])
    b, times = trace_simulation(t, ENG, pol, tenant_names=["x", "y"])
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert [len(t) for t in times] == [3, 2, 1]
    assert np.all(np.diff(times[0]) > 0)
    assert {k: v for k, v in vars(pol).items() if k in before} == before
