"""Chapters 1-4's gateway helpers on hand-made rows (the live measurements: tests/test_real_engines.py)."""
import pandas as pd

from fairlib.chapters import gateway_live as gl


def test_used_rows_keeps_valid_runs_and_every_policy():
    rows = pd.DataFrame({"policy": ["fcfs"] * 4 + ["rpm_quota"] * 2,
                         "seed": [0, 0, 1, 1, 0, 0], "tenant": ["a", "b"] * 3,
                         "valid": [True, True, False, False, False, False]})
    used = gl.used_rows(rows)
    # fcfs: its valid seed only; rpm_quota: no valid run, so all of its rows (not dropped)
    assert used.index.tolist() == [0, 1, 4, 5]
    assert gl.used_rows(rows.assign(valid=True)).index.tolist() == list(range(6))
