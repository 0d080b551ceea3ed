"""fairlib.chapters.published: the comparison tables every chapter shows (hand-computed cases)."""
import math

import pandas as pd
import pytest

from fairlib.chapters import published


def test_abs_tolerance_broadcasts_and_judges_each_value():
    # ch1.share.fcfs: 25.9/26.8/24.7/22.6, abs 2.5
    t = published.compare("ch1.share.fcfs", [25.0, 29.4, 24.7, 20.0], labels=list("abcd"))
    assert list(t["tolerance"]) == [2.5] * 4
    assert list(t["within"]) == [True, False, True, False]          # 2.6 and 2.6 points off
    assert t["difference"].round(6).tolist() == [-0.9, 2.6, 0.0, -2.6]
    assert set(t["basis"]) == {"published"}


def test_rel_tolerance_scales_with_the_published_value():
    v = published.figure("ch1.maxmin.fcfs")["value"]
    t = published.compare("ch1.maxmin.fcfs", v * 1.149)
    assert math.isclose(t["tolerance"].iloc[0], 0.15 * v) and t["within"].iloc[0] is True
    assert published.compare("ch1.maxmin.fcfs", v * 1.151)["within"].iloc[0] is False


def test_no_tolerance_is_shown_not_asserted_and_asserted_drops_it():
    a = published.compare("ch3.crossing_flood", 2.87, labels=["crossing"])
    assert a["tolerance"].iloc[0] == published.SHOWN and a["within"].iloc[0] is None
    b = published.compare("ch1.maxmin.vtc", 3.0, labels=["vtc"])
    both = pd.concat([a, b])
    kept = published.asserted(both)
    assert list(kept.index) == ["vtc"] and kept["within"].all()
    assert not both["tolerance"].isna().any()                          # no NaN in the column


def test_inferred_figures_say_so():
    f = published.figure("ch3.vtc_heaviest_flood")
    assert f.get("inferred") is True
    assert published.compare("ch3.vtc_heaviest_flood", f["value"])["basis"].iloc[0] == "inferred"


def test_shape_mismatch_and_unknown_id_are_clear_errors():
    with pytest.raises(ValueError, match="shape"):
        published.compare("ch1.share.fcfs", [1.0, 2.0])
    with pytest.raises(ValueError, match="not found"):
        published.figure("ch9.nothing")
