"""The sweep engine (fairlib/sweep.py): the lean per-run path gives exactly what fairlib.simulate
gives; the table does not depend on the executor (serial, a process pool, a local Dask cluster),
the chunking or the worker count; the reference grid's definition; the saved grid."""
import functools
import json
import math
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
import pytest

import fairlib
from fairlib import sweep
from fairlib.analysis import indices as metrics
from fairlib.chapters import grid, presets

SMALL_BUILD = functools.partial(grid.grid_scenario, duration_s=20.0)
SMALL_GRID = {"flood": [1.0, 4.0], "spread": [1.0, grid.SEED000_SPREAD]}
SMALL_SEEDS = [0, 5]
SMALL_POLICIES = [sweep.PolicySpec("fcfs", "fcfs"), sweep.PolicySpec("vtc", "vtc", {"wp": 1.0, "wq": 2.0}),
                  sweep.PolicySpec("rpm_quota", "rpm_quota", grid._rpm_params)]


def small(**kw):
    return sweep.sweep(SMALL_BUILD, SMALL_GRID, SMALL_POLICIES, SMALL_SEEDS, progress=False, **kw)


@pytest.fixture(scope="module")
def serial_table():
    return small(executor="serial")


# --- the lean path against fairlib.simulate -------------------------------------------------
def expected_row(res: fairlib.SimResult, names) -> dict:
    """The sweep's columns computed from simulate()'s tables with pandas and fairlib.analysis.indices."""
    req, ten = res.requests, res.tenants
    done = req[req["finish_ms"].notna()]
    ttft = (done["first_token_ms"] - done["arrival_ms"]).to_numpy()
    e2e = (done["finish_ms"] - done["arrival_ms"]).to_numpy()
    share = ten["share"].to_numpy()
    row = {
        "requests": len(req), "rejected": int(req["rejected"].sum()), "admitted": int(req["admitted_ms"].notna().sum()),
        "finished": len(done), "busy_ms": res.run["busy_ms"], "end_ms": res.run["end_ms"],
        "iterations": res.run["iterations"], "decode_tokens": res.run["decode_tokens"],
        "prefill_frac": ten["prefill_ms"].sum() / res.run["busy_ms"],
        "max_min": metrics.max_min_ratio(share), "jain": metrics.jain_index(share),
        "counter_max_min": (metrics.max_min_ratio(res.counters) if res.counters is not None else math.nan),
        "ttft_p50": np.percentile(ttft, 50), "ttft_p99": np.percentile(ttft, 99),
        "e2e_p50": np.percentile(e2e, 50), "e2e_p99": np.percentile(e2e, 99),
    }
    dec = ten["decode_ms"].to_numpy()
    for i, n in enumerate(names):
        row[f"share_{n}"] = share[i]
        row[f"decode_share_{n}"] = dec[i] / dec.sum()
        row[f"prefill_share_{n}"] = ten["prefill_ms"].to_numpy()[i] / res.run["busy_ms"]
        row[f"decode_tokens_{n}"] = int(ten["decode_tokens"].to_numpy()[i])
    return row


LEAN_CASES = [
    (dict(flood=2.5, spread=4.0, duration_s=20.0), presets.SEED000_ENGINE),
    (dict(flood=6.5, spread=None, duration_s=15.0), presets.SEED000_ENGINE),
    # a KV-limited engine: preemptions, re-admissions (vtc_predict's prediction is kept)
    (dict(flood=1.0, spread=8.0, duration_s=10.0), fairlib.Engine(9.0, 0.55, 0.06, 24, kv_capacity_tokens=9000)),
]


@pytest.mark.parametrize("case", range(len(LEAN_CASES)))
def test_lean_path_equals_simulate(case):
    kw, engine = LEAN_CASES[case]
    sc = presets.seed000(engine=engine, flood_tenant=3, **kw)
    names = list(sc.tenant_names)
    specs = grid.reference_policies() + [sweep.PolicySpec("sjf", "sjf"), sweep.PolicySpec("aging", "aging", {"rate": 0.5})]
    rows = sweep.run_point(sc, 7, specs)
    df = sc.requests(7)
    preempted = 0
    for spec, row in zip(specs, rows):
        params = spec.resolve(sc)
        res = fairlib.simulate(df, sc.engine, spec.name, sc.duration_s * 1000.0, tenant_names=names, **params)
        preempted += int(res.requests["preemptions"].sum())
        want = expected_row(res, names)
        assert row["policy"] == spec.label and row["policy_name"] == spec.name
        assert json.loads(row["policy_params"]) == json.loads(json.dumps(params))
        for k, v in want.items():
            got = row[k]
            assert (got == v) or (math.isnan(got) and math.isnan(v)), (spec.label, k, got, v)
    if engine.kv_capacity_tokens is not None:
        assert preempted > 0


# --- the executors give the same table --------------------------------------------------------
def test_serial_table_shape(serial_table):
    t = serial_table
    assert len(t) == 2 * 2 * 2 * 3
    assert list(t.columns[:4]) == ["flood", "spread", "seed", "policy"]
    names = presets.SEED000_TENANTS
    for prefix in sweep.TENANT_COLUMNS:
        assert [f"{prefix}_{n}" for n in names] == [c for c in t.columns if c.startswith(prefix + "_")
                                                       and c[len(prefix) + 1:] in names]
    # grid order: product(flood, spread), then seeds, then policies as given
    assert t["policy"].tolist()[:3] == ["fcfs", "vtc", "rpm_quota"]
    assert t[["flood", "spread", "seed"]].drop_duplicates().shape[0] == 8
    assert np.allclose(t[[f"share_{n}" for n in names]].sum(axis=1), 1.0, rtol=1e-12)
    assert set(t.loc[t.policy == "rpm_quota", "policy_params"]) <= {json.dumps({"limit": v}, separators=(",", ":"))
                                                                     for v in range(1, 1000)}


def test_process_pool_and_chunking_give_the_same_table(serial_table):
    with ProcessPoolExecutor(max_workers=2, mp_context=sweep._default_context()) as ex:
        pooled = small(executor=ex, chunk_runs=3)
    pd.testing.assert_frame_equal(serial_table, pooled, check_exact=True)
    default = small(max_workers=2, chunk_runs=100)
    pd.testing.assert_frame_equal(serial_table, default, check_exact=True)


def test_dask_local_cluster_gives_the_same_table(serial_table):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as cluster, distributed.Client(cluster) as client:
        via_client = small(executor=client)
        via_executor = small(executor=client.get_executor(), chunk_runs=6)
    pd.testing.assert_frame_equal(serial_table, via_client, check_exact=True)
    pd.testing.assert_frame_equal(serial_table, via_executor, check_exact=True)


def test_fixed_scenario_and_policy_forms():
    sc = presets.seed000(duration_s=5.0)
    t = sweep.sweep(sc, None, ["fcfs", ("v", "vtc", {"wq": 3.0}), ("s", "slot_cap", {"cap": 6})], seeds=[1, 2],
                    executor="serial")
    assert t["policy"].tolist() == ["fcfs", "v", "s"] * 2 and t["seed"].tolist() == [1, 1, 1, 2, 2, 2]
    mapping = sweep.sweep(sc, None, {"fcfs": "fcfs", "v": ("vtc", {"wq": 3.0}), "s": ("slot_cap", {"cap": 6})},
                          seeds=[1, 2], executor="serial")
    pd.testing.assert_frame_equal(t, mapping, check_exact=True)


@pytest.mark.parametrize("bad", [
    dict(policies=[]), dict(policies=["fcfs", "fcfs"]), dict(executor="threads"), dict(grid={"seed": [1]}),
    dict(grid={"flood": 2.0}), dict(chunk_runs=0),
])
def test_bad_arguments(bad):
    kw = dict(build=SMALL_BUILD, grid={"flood": [1.0]}, policies=["fcfs"], seeds=[0], executor="serial")
    kw.update(bad)
    with pytest.raises(ValueError):
        sweep.sweep(kw.pop("build"), kw.pop("grid"), kw.pop("policies"), kw.pop("seeds"), **kw)


def test_save_and_load_round_trip(serial_table, tmp_path):
    path = tmp_path / "g.csv.gz"
    grid.save_grid(serial_table, path, {"parameters": {"x": 1}})
    back, meta = grid.load_grid(path, with_meta=True)
    pd.testing.assert_frame_equal(serial_table, back, check_exact=True)
    assert meta["rows"] == len(serial_table) and meta["fairlib_version"] == fairlib.__version__
    assert meta["parameters"] == {"x": 1} and "git_commit" in meta and "date" in meta
    first = path.read_bytes()
    grid.save_grid(serial_table, path)
    assert path.read_bytes() == first          # deterministic bytes


# --- the reference grid -----------------------------------------------------------------------
def test_reference_grid_definition():
    g = grid.reference_grid()
    assert g["grid"]["flood"] == [1.0 + 0.5 * i for i in range(12)]
    s = np.array(g["grid"]["spread"])
    # rounded to 12 significant digits (the same on every CPU): the last is the blog post's spread
    assert len(s) == 12 and s[0] == 1.0 and math.isclose(s[-1], grid.SEED000_SPREAD, rel_tol=1e-12)
    assert all(float(f"{x:.12g}") == x for x in s)
    assert np.allclose(s[1:] / s[:-1], s[1] / s[0], rtol=1e-11)          # geometric
    assert grid.SEED000_SPREAD == pytest.approx(353.8 / 23.7)
    assert len(g["seeds"]) == 12
    n_configs = len(g["grid"]["flood"]) * len(s) * len(g["seeds"])
    assert n_configs == 1728 and len(g["policies"]) == 9
    labels = [p.label for p in g["policies"]]
    assert labels == ["fcfs", "rpm_quota", "vtc", "vtc_derived", "lcf", "residency", "slot_cap", "rr", "vtc_predict"]
    sc = grid.grid_scenario(1.0, grid.SEED000_SPREAD)
    seed = presets.seed000(flood_tenant=grid.FLOOD_TENANT)
    pd.testing.assert_frame_equal(sc.requests(3), seed.requests(3), check_exact=True)   # the seed, exactly
    params = {p.label: p.resolve(sc) for p in g["policies"]}
    assert params["vtc_derived"]["wq"] == pytest.approx(15.4166666667, abs=1e-9)
    assert params["slot_cap"] == {"cap": 6}
    assert params["rpm_quota"] == {"limit": presets.operator_rpm_limit(sc)}
    # the spread keeps the tenants' order and the spread asked for
    means = [t.output.mean for t in grid.grid_scenario(2.0, s[4]).tenants]
    assert means == sorted(means) and max(means) / min(means) == pytest.approx(s[4])
    flooded = grid.grid_scenario(3.0, 1.0).offered_ms_per_s()
    assert flooded[grid.FLOOD_TENANT] == pytest.approx(3 * 750.0) and np.delete(flooded, grid.FLOOD_TENANT) \
        == pytest.approx([750.0] * 3)


def test_saved_grid_matches_a_recomputed_slice():
    if not grid.GRID_FILE.exists():
        pytest.skip(f"{grid.GRID_FILE} not made yet (python benchmarks/grid.py)")
    table, meta = grid.load_grid(with_meta=True)
    g = grid.reference_grid()
    assert len(table) == 1728 * 9 and meta["rows"] == len(table)
    assert meta["git_commit"] and meta["fairlib_version"]
    # a slice: two grid points x one seed x all policies, recomputed now
    for flood, spread, seed in [(1.0, g["grid"]["spread"][-1], 0), (6.5, g["grid"]["spread"][3], 11)]:
        fresh = sweep.sweep(grid.grid_scenario, {"flood": [flood], "spread": [spread]}, g["policies"], [seed],
                            executor="serial")
        saved = table[(table.flood == flood) & np.isclose(table.spread, spread, rtol=1e-15) & (table.seed == seed)]
        saved = saved.reset_index(drop=True)
        pd.testing.assert_frame_equal(fresh, saved, check_exact=False, rtol=1e-9, check_dtype=False)
