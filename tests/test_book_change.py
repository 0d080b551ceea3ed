"""fairlib.chapters.book.change: the words a chapter writes for a change over seeds."""
import pytest

from fairlib.chapters.book import change


def test_tie_within_the_seeds_spread():
    # mean 0.5667, sd 2.2502 (hand-computed): |m| <= s -> a tie, not "a cut by 1%"
    out = change([1.0, -1.9, 2.6], "the 99th percentile")
    assert out == "leaves the 99th percentile unchanged (+0.6 ± 2.3%, within the seeds' spread)"


def test_a_negative_cut_is_written_as_a_rise():
    # mean -8, sd 1: higher, never "cuts by -8%"
    assert change([-7.0, -9.0, -8.0], "the 99th percentile") == \
        "raises the 99th percentile by 8% (-8.0 ± 1.0%)"


def test_a_cut_beyond_the_spread():
    assert change([36.0, 37.0, 38.0], "the median") == "lowers the median by 37% (+37.0 ± 1.0%)"


def test_one_seed_has_no_spread():
    assert change([0.4], "it") == "lowers it by 0.4% (+0.4 ± 0.0%)"
    assert change([0.0], "it").startswith("leaves it unchanged")


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")]])
def test_bad_values_are_refused(bad):
    with pytest.raises(ValueError, match="one per seed"):
        change(bad, "it")


def test_split_constant_drops_only_the_columns_with_one_value():
    import pandas as pd

    from fairlib.chapters.book import constants_line, split_constant

    t = pd.DataFrame({"valid": [True, True], "answered": [300, 300], "p50 (s)": [1.5, 2.0],
                      "gap": [None, None]})
    narrow, const = split_constant(t)
    assert list(narrow.columns) == ["p50 (s)"]
    assert const == {"valid": True, "answered": 300, "gap": None}
    assert constants_line({"valid": True, "answered": 300}) == "every row: valid True, answered 300"
    kept, const2 = split_constant(t, keep=("answered",))
    assert list(kept.columns) == ["answered", "p50 (s)"] and "answered" not in const2
    one_row, none = split_constant(t.iloc[:1])      # a single row: nothing is "constant"
    assert list(one_row.columns) == list(t.columns) and none == {}


def test_constants_line_writes_numpy_bools_as_words():
    import numpy as np

    from fairlib.chapters.book import constants_line

    assert constants_line({"valid": np.bool_(True), "errors": np.int64(0)}) == "every row: valid True, errors 0"
