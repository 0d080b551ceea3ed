"""Bad inputs to ``fairlib.simulate`` and ``fairlib.Engine`` fail early with a ValueError that
names the offending field (book/engine-model.md, Inputs)."""
import math

import numpy as np
import pandas as pd
import pytest

import fairlib
from fairlib import Engine, simulate
from sim_harness import POLICY_NAMES


def table(**changes):
    cols = dict(arrival_ms=[0.0, 1.0, 1.0], tenant=[0, 1, 0], prompt_tokens=[5, 6, 7], output_tokens=[2, 3, 1],
                est_output_tokens=[2, 3, 1], klass=[0, 1, 0], priority=[1, 0, 1])
    cols.update(changes)
    return pd.DataFrame(cols)


def test_a_valid_table_runs():
    res = simulate(table(), policy="fcfs")
    assert res.requests["finish_ms"].notna().all()


# --- the request table ---------------------------------------------------------------------------
@pytest.mark.parametrize("column", ["prompt_tokens", "output_tokens"])
@pytest.mark.parametrize("value", [0, -3])
def test_token_counts_must_be_positive(column, value):
    values = [5, value, 7]
    with pytest.raises(ValueError, match=rf"{column}.*>= 1"):
        simulate(table(**{column: values}))


def test_est_output_tokens_must_be_positive():
    with pytest.raises(ValueError, match=r"est_output_tokens.*>= 1"):
        simulate(table(est_output_tokens=[1, 0, 1]), policy="sjf")


def test_unsorted_arrivals():
    with pytest.raises(ValueError, match=r"arrival_ms.*sorted"):
        simulate(table(arrival_ms=[0.0, 2.0, 1.0]))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_arrival_times_must_be_finite(bad):
    with pytest.raises(ValueError, match=r"arrival_ms.*finite"):
        simulate(table(arrival_ms=[0.0, 1.0, bad]))


def test_arrival_times_must_not_be_negative():
    with pytest.raises(ValueError, match=r"arrival_ms.*>= 0"):
        simulate(table(arrival_ms=[-1.0, 1.0, 1.0]))


@pytest.mark.parametrize("column", ["tenant", "prompt_tokens", "output_tokens", "est_output_tokens", "klass",
                                    "priority"])
def test_nan_in_an_integer_column(column):
    values = table()[column].to_numpy(dtype=float, copy=True)
    values[1] = np.nan
    with pytest.raises(ValueError, match=rf"{column}.*NaN"):
        simulate(table(**{column: values}))


def test_nullable_integer_column_with_a_missing_value():
    with pytest.raises(ValueError, match=r"prompt_tokens.*NaN"):
        simulate(table(prompt_tokens=pd.array([5, None, 7], dtype="Int64")))


@pytest.mark.parametrize("column", ["tenant", "prompt_tokens", "output_tokens"])
def test_fractional_values_in_an_integer_column(column):
    values = table()[column].to_numpy(dtype=float, copy=True)
    values[2] += 0.5
    with pytest.raises(ValueError, match=rf"{column}.*fractional"):
        simulate(table(**{column: values}))


@pytest.mark.parametrize("values", [["a", "b", "c"], [True, False, True]])
def test_non_numeric_integer_column(values):
    with pytest.raises(ValueError, match=r"'tenant'.*integers"):
        simulate(table(tenant=values))


@pytest.mark.parametrize("column", ["arrival_ms", "tenant", "prompt_tokens", "output_tokens"])
def test_missing_required_column(column):
    with pytest.raises(ValueError, match=rf"missing column.*{column}"):
        simulate(table().drop(columns=column))


def test_not_a_table():
    with pytest.raises(ValueError, match="requests"):
        simulate([(0.0, 0, 5, 2)])


@pytest.mark.parametrize("tenants, n_tenants", [([0, 1, 2], 2), ([0, 1, 5], 3), ([0, -1, 0], None), ([0, -1, 0], 2)])
def test_tenant_index_out_of_range(tenants, n_tenants):
    with pytest.raises(ValueError, match=r"'tenant'.*0\.\."):
        simulate(table(tenant=tenants), n_tenants=n_tenants)


@pytest.mark.parametrize("n_tenants", [0, -1, 1.5, True])
def test_n_tenants_must_be_a_positive_integer(n_tenants):
    with pytest.raises(ValueError, match="n_tenants"):
        simulate(table(tenant=[0, 0, 0]), n_tenants=n_tenants)


# --- the engine -----------------------------------------------------------------------------------
@pytest.mark.parametrize("max_batch", [0, -1, 2.5, True])
def test_max_batch_at_least_one(max_batch):
    with pytest.raises(ValueError, match="max_batch"):
        Engine(max_batch=max_batch)


@pytest.mark.parametrize("field", ["iter_base_ms", "iter_slope_ms", "prefill_ms_per_token"])
@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf])
def test_engine_costs_must_be_finite_and_non_negative(field, value):
    with pytest.raises(ValueError, match=field):
        Engine(**{field: value})


def test_an_iteration_must_take_time():
    with pytest.raises(ValueError, match="iter_base_ms.*iter_slope_ms"):
        Engine(iter_base_ms=0.0, iter_slope_ms=0.0)


@pytest.mark.parametrize("field", ["max_prefill_tokens", "kv_capacity_tokens"])
@pytest.mark.parametrize("value", [0, -5, 10.5])
def test_engine_limits_must_be_positive_integers(field, value):
    with pytest.raises(ValueError, match=field):
        Engine(**{field: value})


def test_engine_must_be_an_engine():
    with pytest.raises(ValueError, match="engine"):
        simulate(table(), engine={"max_batch": 2})


# --- the horizon ----------------------------------------------------------------------------------
@pytest.mark.parametrize("horizon", [0, 0.0, -1.0, -math.inf, math.nan, "100"])
def test_horizon_must_be_a_positive_number(horizon):
    with pytest.raises(ValueError, match="horizon_ms"):
        simulate(table(), horizon_ms=horizon)


@pytest.mark.parametrize("horizon", [None, math.inf, 1e-9, 5])
def test_horizon_accepts_positive_numbers_and_none(horizon):
    simulate(table(), horizon_ms=horizon)


# --- policies and their parameters ----------------------------------------------------------------
def test_unknown_policy_lists_the_allowed_names():
    with pytest.raises(ValueError, match="policy") as err:
        simulate(table(), policy="no_such_policy")
    message = str(err.value)
    assert "no_such_policy" in message
    for name in POLICY_NAMES:
        assert name in message


@pytest.mark.parametrize("policy", [None, 3])
def test_policy_must_be_a_name_or_a_policy(policy):
    with pytest.raises(ValueError, match="policy must be one of"):
        simulate(table(), policy=policy)


@pytest.mark.parametrize("policy, params", [
    ("fcfs", {"limit": 3}), ("vtc", {"weight": [1, 1]}), ("rpm_quota", {"limit": 3, "window": 1}),
    ("residency", {"wp": 1.0}), ("aging", {"cap": 2}), ("sjf", {"rate": 1.0}),
])
def test_unknown_policy_parameter(policy, params):
    unknown = next(k for k in params if k not in fairlib.POLICIES[policy].params)
    with pytest.raises(ValueError, match=rf"{policy}.*unknown parameter.*{unknown}"):
        simulate(table(), policy=policy, **params)


@pytest.mark.parametrize("policy, param", [("rpm_quota", "limit"), ("slot_cap", "cap"), ("weighted", "w")])
def test_missing_required_parameter(policy, param):
    with pytest.raises(ValueError, match=rf"{policy}.*{param}.*required"):
        simulate(table(), policy=policy)


@pytest.mark.parametrize("policy, params, field", [
    ("rpm_quota", {"limit": 0}, "limit"), ("rpm_quota", {"limit": 2.5}, "limit"),
    ("slot_cap", {"cap": 0}, "cap"), ("aging", {"rate": -1.0}, "rate"), ("aging", {"rate": math.nan}, "rate"),
    ("vtc", {"wp": -1.0}, "wp"), ("vtc", {"wq": math.inf}, "wq"), ("lcf", {"wq": -2.0}, "wq"),
    ("vtc", {"weights": [1.0, 0.0]}, "weights"), ("residency", {"weights": [1.0, math.nan]}, "weights"),
    ("weighted", {"w": [1, -1]}, "w"), ("weighted", {"w": [0, 0]}, "w"),
])
def test_bad_parameter_values(policy, params, field):
    with pytest.raises(ValueError, match=rf"{policy}.*'{field}'"):
        simulate(table(), policy=policy, **params)


@pytest.mark.parametrize("policy", ["vtc", "lcf", "residency"])
@pytest.mark.parametrize("weights", [[1.0], [1.0, 2.0, 3.0]])
def test_weights_of_the_wrong_length(policy, weights):
    with pytest.raises(ValueError, match=rf"{policy}.*weights.*one weight per tenant"):
        simulate(table(), policy=policy, weights=weights)


def test_weights_follow_n_tenants():
    simulate(table(), policy="vtc", weights=[1.0, 2.0, 3.0], n_tenants=3)
    with pytest.raises(ValueError, match="weights"):
        simulate(table(), policy="vtc", weights=[1.0, 2.0], n_tenants=3)


def test_sjf_without_est_output_tokens():
    with pytest.raises(ValueError, match=r"sjf.*est_output_tokens"):
        simulate(table().drop(columns="est_output_tokens"), policy="sjf")


@pytest.mark.parametrize("policy, params", [("weighted", {"w": [1, 1]}), ("aging", {})])
def test_class_policies_without_klass(policy, params):
    with pytest.raises(ValueError, match=rf"{policy}.*klass"):
        simulate(table().drop(columns="klass"), policy=policy, **params)


def test_priority_without_priority_or_klass():
    with pytest.raises(ValueError, match=r"priority.*'priority'"):
        simulate(table().drop(columns=["priority", "klass"]), policy="priority")


@pytest.mark.parametrize("klass", [[0, 2, 0], [0, -1, 0]])
def test_weighted_with_a_klass_outside_the_weights(klass):
    with pytest.raises(ValueError, match=r"weighted.*klass.*0\.\.1"):
        simulate(table(klass=klass), policy="weighted", w=[3, 1])


def test_aging_with_a_negative_klass():
    with pytest.raises(ValueError, match=r"aging.*klass"):
        simulate(table(klass=[0, -1, 0]), policy="aging", rate=0.01)


def test_policy_object_and_parameters_together():
    with pytest.raises(ValueError, match="policy"):
        simulate(table(), policy=fairlib.make_policy("rpm_quota", limit=2), limit=3)
