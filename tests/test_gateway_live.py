"""Chapters 1-4's gateway helpers on hand-made rows (the live measurements: tests/test_real_engines.py)."""
import pandas as pd

from fairlib.chapters import fidelity as fd
from fairlib.chapters import gateway_live as gl


def test_used_rows_keeps_valid_runs_and_every_policy():
    rows = pd.DataFrame({"policy": ["fcfs"] * 4 + ["rpm_quota"] * 2,
                         "seed": [0, 0, 1, 1, 0, 0], "tenant": ["a", "b"] * 3,
                         "valid": [True, True, False, False, False, False]})
    used = gl.used_rows(rows)
    # fcfs: its valid seed only; rpm_quota: no valid run, so all of its rows (not dropped)
    assert used.index.tolist() == [0, 1, 4, 5]
    assert gl.used_rows(rows.assign(valid=True)).index.tolist() == list(range(6))


def test_a_window_cut_is_the_design_any_other_failure_is_not():
    """The experiment cuts each request one window after it was sent (class ``timeout``) and a
    policy may turn one away (429): its runs lift the 1% bound, so every other class must raise."""
    import pytest

    from fairlib.records import Run
    rec = pd.DataFrame({"error_class": ["none", "timeout", "http_429", "timeout"],
                        "error_message": [None, "cut", "429", "cut"]})
    fd.check_cut_run(Run(rec, {}, {}, path="r"))
    bad = rec.assign(error_class=["none", "timeout", "http_502", "disconnect"],
                     error_message=[None, "cut", "Bad Gateway", "reset"])
    with pytest.raises(RuntimeError, match=r"2 request\(s\) failed other than by the window's cut.*Bad Gateway"):
        fd.check_cut_run(Run(bad, {}, {}, path="r"))


def test_an_unknown_data_plane_is_named_before_anything_starts():
    import pytest
    for call in (lambda: gl.check_data_plane("nginx"),
                 lambda: gl.chapter_runs("sim", ["fcfs"], data_plane="nginx")):
        with pytest.raises(ValueError, match=r"data_plane: 'nginx' is not one of python, envoy"):
            call()
    assert gl.check_data_plane("envoy") == "envoy"
