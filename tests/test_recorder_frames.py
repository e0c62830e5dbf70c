"""The requests frame built column by column equals the frame built from lists."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.recorder import REQUEST_COLUMN_NAMES, REQUEST_FIELDS, Recorder
from simulator.engine.request import Request, State

NAMES = ["prefill/0", "decode/0", "decode/1"]


def from_lists(reqs: list[Request]) -> pd.DataFrame:
    """The plain construction: every column a list, renamed, sorted by id (stable)."""
    data = {f: [getattr(r, f) for r in reqs] for f in REQUEST_FIELDS}
    data["status"] = [s.value for s in data["status"]]
    df = pd.DataFrame(data).rename(columns=REQUEST_COLUMN_NAMES)
    names = [*NAMES, ""]
    df["prefill_instance_name"] = [names[i] for i in df["prefill_instance"]]
    df["decode_instance_name"] = [names[i] for i in df["decode_instance"]]
    if not len(df):
        df["prefill_instance_name"] = df["decode_instance_name"] = []
    return df.sort_values("request_id", kind="stable").reset_index(drop=True)


requests = st.lists(st.tuples(
    st.integers(0, 20), st.floats(0, 100), st.integers(1, 5000), st.integers(1, 500),
    st.sampled_from([State.QUEUED, State.REJECTED, State.SHED]), st.text(max_size=4),
    st.integers(-1, 2), st.booleans()), max_size=30)


@settings(max_examples=60, deadline=None)
@given(requests)
def test_requests_frame_equals_the_frame_built_from_lists(rows) -> None:
    rec = Recorder()
    for rid, at, prompt, output, state, reason, where, timed in rows:
        req = Request(rid, at, prompt, output)
        if state is not State.QUEUED:
            req.move_to(state)
        req.reason = reason
        req.decode_instance = where
        req.swap_bytes = 3 if timed else 0.5  # int in some rows, float in others
        if timed:
            req.first_token_s = at + 1.0
        rec.requests.append(req)
    expected = from_lists(rec.requests)
    got = rec.requests_frame(NAMES)
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    assert list(got.dtypes) == list(expected.dtypes)


@settings(max_examples=80, deadline=None)
@given(requests, st.lists(st.booleans(), min_size=30, max_size=30),
       st.lists(st.integers(0, 29), max_size=3))
def test_requests_kept_as_plain_values_once_ended_give_the_same_frame(rows, ended,
                                                                      twice) -> None:
    """Ended requests leave the log as typed values; in-flight ones stay objects; one
    with a value of another type (an int ``swap_bytes``) stays an object; a request
    recorded twice gives two rows. The frame is the one built from the objects."""
    rec = Recorder()
    made: list[Request] = []
    for i, (rid, at, prompt, output, _state, reason, where, timed) in enumerate(rows):
        req = Request(rid, at, prompt, output)
        req.reason = reason
        req.decode_instance = where
        req.swap_bytes = 3 if timed and i % 3 == 0 else 0.5
        rec.requests.append(req)
        made.append(req)
        if i in twice:
            rec.requests.append(req)
            made.append(req)
    for i, req in enumerate(made):
        if ended[i % 30] and not req.ended:
            state = rows[min(i, len(rows) - 1)][4]
            req.move_to(state if state is not State.QUEUED else State.REJECTED)
            req.first_token_s = req.arrival_s + 1.0
            rec.requests.ended(req)
    assert len(rec.requests) == len(made)
    assert list(rec.requests) == [r for r in made if not r.ended]
    expected = from_lists(made)
    got = rec.requests_frame(NAMES)
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    assert list(got.dtypes) == list(expected.dtypes)


finite_or_not = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
any_int = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(2**63, 2**70),
                    st.integers(-(2**70), -(2**63) - 1))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(finite_or_not, finite_or_not, any_int, any_int), min_size=1,
                max_size=12))
def test_ended_rows_keep_each_value_bit_for_bit(rows) -> None:
    """An ended request's numbers come back from the log's typed rows unchanged: the
    floats' bits (NaN, -0.0, infinities, subnormals), every int of 8 bytes; one with an
    int beyond 8 bytes stays an object, with its exact value."""
    rec = Recorder()
    made = []
    for i, (t, saved, prompt, turn) in enumerate(rows):
        req = Request(i, 1.0, 10, 5)
        req.decode_start_s, req.prefill_saved_s = t, saved
        req.prompt_tokens, req.turn = prompt, turn
        rec.requests.append(req)
        req.move_to(State.REJECTED)
        rec.requests.ended(req)
        made.append(req)
    got = rec.requests_frame(NAMES)
    for col, field in (("decode_start_s", "decode_start_s"),
                       ("prefill_saved_s", "prefill_saved_s")):
        want = [getattr(r, field) for r in made]
        assert (pd.Series(want, dtype=float).to_numpy().view("int64").tolist()
                == got[col].to_numpy(dtype=float).view("int64").tolist()), col
    for col in ("prompt_tokens", "turn"):
        assert [int(v) for v in got[col]] == [getattr(r, col) for r in made], col
