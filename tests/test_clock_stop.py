"""A run stopped by its clock (``simulation.max_time_s``) during a decode fast-forward
jump records the jump's finished steps and tokens, as step-by-step simulation does.

Before the fix the jump in progress at the stop was dropped: with the scenario below,
fast-forward recorded 310 steps and 3,403 output tokens against step-by-step's 361 and
4,525."""

from __future__ import annotations

from simulator.runner.run import run
from tests.conftest import make_scenario
from tests.test_fast_forward import assert_identical


def test_a_run_cut_by_max_time_is_the_same_with_fast_forward() -> None:
    sc = make_scenario(**{"workload.num_requests": 40,
                          "workload.output_tokens": {"kind": "fixed", "tokens": 400},
                          "simulation.max_time_s": 3.0})
    fast = run(sc.with_(**{"simulation.fast_forward": True}))
    slow = run(sc.with_(**{"simulation.fast_forward": False}))
    assert fast.summary["in_flight"] > 0  # the clock did cut the run
    assert len(fast.steps) == len(slow.steps)
    assert fast.requests["generated_tokens"].sum() == slow.requests["generated_tokens"].sum()
    assert_identical(fast, slow)
