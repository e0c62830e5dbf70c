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
