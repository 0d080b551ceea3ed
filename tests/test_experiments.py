"""Helpers the chapters call (fairlib/chapters/experiments.py): the reference grid read or recomputed,
the first crossing of two curves, the Azure trace as two tenants."""
import math

import numpy as np
import pandas as pd
import pytest

from fairlib import traces
from fairlib.chapters import experiments, grid, presets

from ci import in_ci

needs_grid = pytest.mark.skipif(not grid.GRID_FILE.exists(), reason="no saved grid (data/grid_seed000.csv.gz)")


# --- grid_slice -----------------------------------------------------------------------------
@needs_grid
def test_grid_slice_saved_selects_in_grid_order():
    t = experiments.grid_slice(floods=[6.5, 1.0], spreads=[grid.SEED000_SPREAD], seeds=[3, 0],
                               policies=["residency", "fcfs"])
    assert len(t) == 2 * 1 * 2 * 2
    assert list(t["flood"]) == [1.0] * 4 + [6.5] * 4
    assert list(t["seed"]) == [0, 0, 3, 3] * 2
    assert list(t["policy"]) == ["fcfs", "residency"] * 4       # the reference order, not the asked one
    assert (t["spread"] == grid.REFERENCE_SPREADS[-1]).all()
    assert list(t.index) == list(range(len(t)))


@needs_grid
def test_grid_slice_recomputed_equals_saved_exactly():
    kw = dict(floods=[1.0, 3.5], spreads=[grid.REFERENCE_SPREADS[4], grid.SEED000_SPREAD], seeds=[1],
              policies=["fcfs", "rpm_quota", "vtc_derived"])
    saved = experiments.grid_slice(**kw)
    fresh = experiments.grid_slice(**kw, use_saved=False)
    pd.testing.assert_frame_equal(fresh, saved, check_exact=True)


@needs_grid
def test_grid_slice_snaps_values_close_to_grid_points():
    a = experiments.grid_slice(floods=[1.0], spreads=[round(grid.SEED000_SPREAD, 12)], seeds=[0], policies=["fcfs"])
    assert len(a) == 1 and a["spread"].iloc[0] == grid.REFERENCE_SPREADS[-1]


@needs_grid
def test_grid_slice_refuses_what_the_saved_grid_lacks():
    with pytest.raises(ValueError, match="not a point of the saved grid"):
        experiments.grid_slice(floods=[1.25], policies=["fcfs"])
    with pytest.raises(ValueError, match="seeds"):
        experiments.grid_slice(floods=[1.0], seeds=[99], policies=["fcfs"])
    with pytest.raises(ValueError, match="ran 120 s"):
        experiments.grid_slice(floods=[1.0], duration_s=60.0, policies=["fcfs"])
    with pytest.raises(ValueError, match="not in the reference grid"):
        experiments.grid_slice(policies=["nope"])


def test_grid_slice_recomputes_off_grid_points(tmp_path):
    t = experiments.grid_slice(floods=[1.25], spreads=[2.0], seeds=[0], policies=["fcfs", "residency"],
                               use_saved=False, duration_s=10.0)
    assert list(t["policy"]) == ["fcfs", "residency"]
    assert (t["flood"] == 1.25).all() and (t["spread"] == 2.0).all()
    assert np.all(t["max_min"] >= 1.0)
    with pytest.raises(FileNotFoundError):
        experiments.grid_slice(path=tmp_path / "none.csv.gz")


# --- first_crossing -------------------------------------------------------------------------
def test_first_crossing_interpolates_linearly():
    x = [1.0, 2.0, 3.0, 4.0]
    assert experiments.first_crossing(x, [1.0, 2.0, 3.0, 4.0], [2.5] * 4) == pytest.approx(2.5)
    assert experiments.first_crossing(x, [0.0, 1.0, 4.0, 5.0], [2.0, 2.0, 2.0, 2.0]) == pytest.approx(2 + 1 / 3)
    # the first crossing, not a later one
    assert experiments.first_crossing(x, [0.0, 3.0, 0.0, 3.0], [1.0] * 4) == pytest.approx(1 + 1 / 3)


def test_first_crossing_edges():
    assert experiments.first_crossing([1, 2], [3, 4], [2, 2]) == 1.0          # already above
    assert math.isnan(experiments.first_crossing([1, 2], [0, 1], [2, 2]))      # never
    assert experiments.first_crossing([1, 2], [0, 2], [2, 2]) == 2.0           # touches at the end
    with pytest.raises(ValueError):
        experiments.first_crossing([2, 1], [0, 1], [1, 1])
    with pytest.raises(ValueError):
        experiments.first_crossing([1, 2], [0, 1], [1])
    with pytest.raises(ValueError):
        experiments.first_crossing([1, 2], [0, np.nan], [1, 1])


# --- azure_scenario -------------------------------------------------------------------------
def test_azure_scenario_from_the_committed_quantiles():
    sc = experiments.azure_scenario(machine_ms_per_s=500.0, duration_s=30.0)
    assert sc.tenant_names == ("code", "conv")
    np.testing.assert_allclose(sc.offered_ms_per_s(), [500.0, 500.0])
    q = traces.read_trace_quantiles()
    assert sc.tenants[0].output.mean == pytest.approx(q["code_output_tokens"].mean())
    assert sc.tenants[1].prompt.mean == pytest.approx(q["conv_prompt_tokens"].mean())
    req = sc.requests(0)
    assert set(req["tenant"]) == {0, 1}
    assert set(req.loc[req["tenant"] == 0, "output_tokens"]) <= set(q["code_output_tokens"])
    # at 750 ms/s each (chapter 2), an equal quota at the capacity rule binds both services
    sc750 = experiments.azure_scenario(duration_s=30.0)
    assert np.all(sc750.rates_rps() * 60 > presets.operator_rpm_limit(sc750))


def test_azure_scenario_with_fixed_prompts():
    sc = experiments.azure_scenario(prompt_tokens=387, duration_s=10.0)
    assert all(t.prompt.mean == 387 for t in sc.tenants)
    assert (sc.requests(1)["prompt_tokens"] == 387).all()


@pytest.mark.skipif((traces.find_trace_file("code") is None or traces.find_trace_file("conv") is None)
                    and not in_ci(), reason="no local copy of the raw Azure trace (under CI=true: fails)")
def test_azure_scenario_from_the_raw_trace():
    d = traces.find_trace_file("code").parent
    sc = experiments.azure_scenario(trace_dir=d, duration_s=10.0)
    raw = traces.load_azure_trace("conv", path=d)
    assert sc.tenants[1].output.mean == pytest.approx(raw["output_tokens"].mean())
    with pytest.raises(FileNotFoundError):
        experiments.azure_scenario(trace_dir=d / "missing")


# --- counter_shares -------------------------------------------------------------------------
def test_counter_shares_even_at_the_exchange_rate_only():
    from fairlib import SEED000_ENGINE as eng
    means = np.array(presets.SEED000_OUTPUT_MEANS)
    for b in (8, 24, 48):
        s = experiments.counter_shares(eng, 387, means, 1.0, float(eng.exchange_rate(b)), batch=b)
        np.testing.assert_allclose(s, 0.25, rtol=1e-12)
    # the derived weight at 24 is too low at 8 (long answers undercharged) and too high at 48
    wq = float(eng.exchange_rate(24))
    s8 = experiments.counter_shares(eng, 387, means, 1.0, wq, batch=8)
    s48 = experiments.counter_shares(eng, 387, means, 1.0, wq, batch=48)
    assert s8[3] > 0.25 > s8[0] and s48[0] > 0.25 > s48[3]


def test_counter_shares_shipped_weights_by_hand():
    from fairlib import SEED000_ENGINE as eng
    means = np.array(presets.SEED000_OUTPUT_MEANS)
    cost = 0.06 * 387 + means * (9 + 0.55 * 24) / 24
    r = cost / (387 + 2 * means)
    np.testing.assert_allclose(experiments.counter_shares(eng, 387, means), r / r.sum(), rtol=1e-12)
    assert round(float(r.max() / r.min()), 2) == 3.08       # the seed publishes 3.05 measured
    with pytest.raises(ValueError):
        experiments.counter_shares(eng, 387, means, 0.0, 0.0)
    with pytest.raises(ValueError):
        experiments.counter_shares(eng, [387, 387], [1.0, -1.0])
