"""StepTracker: decode steps rebuilt from token events, on hand-made event sequences."""
import pytest

from fairlib.gateway.steps import StepTracker


def tracker(**kw):
    steps, late = [], []
    t = StepTracker(lambda ids, toks, fin, dt, at: steps.append((ids, toks, fin, dt, at)), late.append, **kw)
    return t, steps, late


def test_a_burst_per_iteration_is_one_step_and_dt_is_the_gap_between_bursts():
    t, steps, _ = tracker(tol_ms=2.0)
    t.dispatched(0, 0.0)
    t.dispatched(1, 1.0)
    t.tokens(0, 10.0)
    t.tokens(1, 10.3)                      # both emitted: the step closes at once
    assert steps == [([0, 1], [1, 1], [False, False], 10.0, 10.0)]   # first tokens: from the first dispatch
    t.tokens(1, 22.1)                      # next iteration, another order
    t.tokens(0, 22.4, finished=True)
    assert steps[-1] == ([1, 0], [1, 1], [False, True], pytest.approx(12.1), 22.1)
    assert t.in_flight == 1


def test_a_stream_that_emits_again_starts_a_new_step_and_a_late_one_waits_for_the_timer():
    t, steps, _ = tracker(tol_ms=2.0)
    for r in (0, 1, 2):
        t.dispatched(r, 0.0)
    t.tokens(0, 5.0)
    t.tokens(1, 5.1)
    t.tokens(0, 15.0)                      # 0 again before 2 emitted: a new iteration
    assert [s[0] for s in steps] == [[0, 1]]
    t.poll(16.0)                           # within the tolerance: still open
    assert len(steps) == 1
    t.poll(17.5)                           # past it
    assert steps[-1][0] == [0] and steps[-1][3] == pytest.approx(10.0)


def test_a_stream_sent_after_the_step_began_does_not_hold_it_open():
    t, steps, _ = tracker(tol_ms=5.0)
    t.dispatched(0, 0.0)
    t.dispatched(1, 0.0)
    t.tokens(0, 10.0, finished=True)
    t.dispatched(2, 10.2)                  # the slot 0 freed, refilled at once
    t.tokens(1, 10.4)                      # every stream that could emit did: close
    assert steps[-1][0] == [0, 1] and steps[-1][2] == [True, False]


def test_finishes_inside_and_after_the_step():
    t, steps, late = tracker(tol_ms=2.0)
    t.dispatched(0, 0.0)
    t.dispatched(1, 0.0)
    t.tokens(0, 5.0)
    assert t.finish(0, 5.05) is True       # its end joins its entry (llama.cpp's separate final chunk)
    assert t.finish(0, 5.06) is False      # already
    t.tokens(1, 5.1)
    assert steps[-1][2] == [True, False]
    t.tokens(1, 15.0)
    t.poll(20.0)
    assert t.finish(1, 21.0) is None and late == [1]     # ended after its step closed: late
    assert t.in_flight == 0


def test_usage_tokens_join_the_open_entry():
    t, steps, _ = tracker(tol_ms=2.0)
    t.dispatched(0, 0.0)
    t.dispatched(1, 0.0)
    t.tokens(0, 5.0)
    assert t.add_tokens(0, 2) and not t.add_tokens(1, 2)
    t.tokens(1, 5.2)
    assert steps[-1][1] == [3, 1]


def test_the_tolerance_follows_the_streams_token_gaps():
    t, _, _ = tracker()
    assert t.tol_ms == 5.0
    for r in range(4):
        t.dispatched(r, 0.0)
    now = 0.0
    for _ in range(40):                    # iterations of 20 ms, chunks 0.1 ms apart
        now += 20.0
        for r in range(4):
            t.tokens(r, now + 0.1 * r)
    assert t.tol_ms == pytest.approx(0.3 * 20.0)
    with pytest.raises(ValueError, match="tol_ms"):
        StepTracker(lambda *a: None, tol_ms=0)
    with pytest.raises(KeyError):
        t.tokens(99, now)
