"""The request state machine: every change of state is checked in one place."""

from __future__ import annotations

import pytest

from simulator.engine.request import LIVE_STATES, TRANSITIONS, Request, State
from simulator.errors import SimulationError


def test_a_request_walks_the_colocated_and_the_disaggregated_paths() -> None:
    r = Request(0, 0.0, 10, 5)
    assert r.status is State.QUEUED
    for s in (State.PREFILL, State.DECODE, State.QUEUED, State.PREFILL, State.TRANSFER,
              State.DECODE, State.COMPLETED):
        r.move_to(s)
    assert r.status == "completed"  # the frame's plain string


@pytest.mark.parametrize(("path", "bad"), [
    ((), State.DECODE),  # decoding without a prefill
    ((), State.COMPLETED),
    ((State.PREFILL, State.DECODE), State.TRANSFER),  # only a prefill hands off
    ((State.PREFILL, State.DECODE, State.COMPLETED), State.QUEUED),  # terminal
    ((State.REJECTED,), State.QUEUED),
])
def test_an_illegal_change_raises_naming_both_states(path, bad) -> None:
    r = Request(7, 0.0, 10, 5)
    for s in path:
        r.move_to(s)
    before = r.status
    with pytest.raises(SimulationError, match=f"request 7: illegal state change "
                                              f"{before.value} -> {bad.value}"):
        r.move_to(bad)
    assert r.status is before


def test_the_table_covers_every_state_and_terminal_states_are_final() -> None:
    assert set(TRANSITIONS) == set(State)
    for s in set(State) - LIVE_STATES:
        assert TRANSITIONS[s] == frozenset()
    for s in LIVE_STATES:
        assert State.IN_FLIGHT in TRANSITIONS[s]
        assert State.FAILED in TRANSITIONS[s]


def test_status_cannot_be_assigned() -> None:
    r = Request(0, 0.0, 10, 5)
    with pytest.raises(AttributeError):
        r.status = State.DECODE  # type: ignore[misc]
