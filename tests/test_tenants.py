"""Request classes (tenants): the spec, per-class streams, admission limits, and the
priority queue and victim of vLLM's ``--scheduling-policy priority``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.config import RequestClass, WorkloadSpec
from simulator.engine.priority import PriorityQueue, choose_victim, make_queue, priority_key
from simulator.engine.request import Request
from simulator.engine.tenants import Admission
from simulator.errors import EXIT_BAD_INPUT
from simulator.runner.run import run
from simulator.scenario.schema import Scenario
from tests.conftest import make_scenario
from tests.test_exit_codes import exit_code


def premium(**extra: Any) -> dict[str, Any]:
    return {"name": "premium", "arrival": {"kind": "poisson", "rate_per_s": 3.0},
            "input_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 300},
            "output_tokens": {"kind": "uniform", "min_tokens": 5, "max_tokens": 40},
            "num_requests": 30, "priority": 0, "slo": {"ttft_s": 0.5}, **extra}


def batch(**extra: Any) -> dict[str, Any]:
    return {"name": "batch", "arrival": {"kind": "poisson", "rate_per_s": 6.0},
            "input_tokens": {"kind": "uniform", "min_tokens": 1000, "max_tokens": 3000},
            "output_tokens": {"kind": "uniform", "min_tokens": 20, "max_tokens": 120},
            "num_requests": 40, "priority": 1, **extra}


def with_classes(*classes: dict[str, Any], **overrides: Any) -> Scenario:
    data = make_scenario().model_dump(mode="json")
    data["workload"] = {"classes": list(classes)}
    sc = Scenario.model_validate(data)
    return sc.with_(**overrides) if overrides else sc


def req(rid: int, priority: int = 0, arrival: float = 0.0) -> Request:
    r = Request(rid, arrival, 10, 10)
    r.priority = priority
    return r


# ----- the spec --------------------------------------------------------------------
def test_single_class_spec_is_one_class_named_default() -> None:
    res = run(make_scenario(**{"workload.num_requests": 10}))
    assert set(res.requests["class"]) == {"default"}
    assert (res.requests["root_id"] == res.requests["request_id"]).all()
    assert not any(k.startswith("class_") for k in res.summary)


@pytest.mark.parametrize(("workload", "needle"), [
    ({"classes": [premium(), premium()]}, "class names must be unique"),
    ({"classes": [premium()], "arrival": {"kind": "poisson", "rate_per_s": 1}},
     "give arrival per class"),
    ({"classes": [premium(num_requests=None)]}, "classes[0] (premium): bound it"),
    ({"classes": [premium(arrival={"kind": "closed_loop", "concurrency": 2})]}, "closed_loop"),
    ({"classes": [premium(max_outstanding=0)]}, "max_outstanding"),
    ({"classes": [premium(timeout_s=-1)]}, "timeout_s"),
    ({}, "give `arrival` (one class) or `classes`"),
])
def test_bad_class_specs_are_one_line_errors(tmp_path: Path, workload: dict[str, Any],
                                             needle: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = make_scenario().model_dump(mode="json")
    data["workload"] = workload
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT, err
    assert "bad.yaml" in err, err
    assert "workload" in err, err
    assert needle in err, err
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_class_fields_need_no_engine_defaults() -> None:
    cls = RequestClass.model_validate(premium())
    assert cls.max_outstanding is None
    assert cls.timeout_s is None
    assert cls.retries == 0
    spec = WorkloadSpec.model_validate({"classes": [premium()]})
    assert [c.name for c in spec.sources] == ["premium"]  # type: ignore[union-attr]


# ----- streams ---------------------------------------------------------------------
def test_adding_a_class_leaves_another_class_draws_identical() -> None:
    alone = run(with_classes(premium())).requests
    both = run(with_classes(batch(), premium())).requests
    cols = ["arrival_s", "prompt_tokens", "output_tokens"]
    mine = both[both["class"] == "premium"][cols].reset_index(drop=True)
    assert len(mine) == 30
    assert mine.equals(alone[cols].reset_index(drop=True))
    assert set(both["class"]) == {"premium", "batch"}


def test_same_seed_same_results_with_classes() -> None:
    sc = with_classes(premium(), batch(max_outstanding=4))
    a, b = run(sc), run(sc)
    assert a.requests.equals(b.requests)
    assert a.steps.equals(b.steps)
    assert json.dumps(a.summary, default=str) == json.dumps(b.summary, default=str)


# ----- admission ---------------------------------------------------------------------
def test_admission_gate_counts_and_sheds() -> None:
    gate = Admission([RequestClass.model_validate(batch(max_outstanding=2))])
    rs = [req(i) for i in range(4)]
    for r in rs:
        r.klass = "batch"
    assert gate.admit(rs[0]) is None
    assert gate.admit(rs[1]) is None
    reason = gate.admit(rs[2])
    assert reason is not None
    assert "max_outstanding 2" in reason
    gate.release(rs[2])  # never admitted: releasing it frees nothing
    assert gate.outstanding["batch"] == 2
    gate.release(rs[0])
    assert gate.admit(rs[3]) is None
    assert gate.peak["batch"] == 2


@settings(max_examples=8, deadline=None)
@given(limit=st.integers(1, 6), rate=st.floats(4.0, 40.0))
def test_admission_limit_is_never_exceeded(limit: int, rate: float) -> None:
    sc = with_classes(premium(), batch(max_outstanding=limit,
                                       arrival={"kind": "poisson", "rate_per_s": rate}))
    res = run(sc)
    df = res.requests
    mine = df[(df["class"] == "batch") & (df["status"] != "shed")]
    # Requests of the class in the cluster at each of its admissions, from the frame.
    ends = mine["completion_s"].fillna(mine["cancel_s"]).to_numpy()
    starts = mine["arrival_s"].to_numpy()
    for t in starts:
        assert ((starts <= t) & (ends > t)).sum() <= limit
    shed = df[df["status"] == "shed"]
    assert (shed["class"] == "batch").all()
    assert res.summary["class_batch_shed"] == len(shed) == res.summary["shed"]
    assert res.summary["class_batch_completed"] + len(shed) == 40


# ----- priority queue and victim ---------------------------------------------------
def test_priority_queue_orders_by_priority_then_arrival() -> None:
    q = PriorityQueue()
    for r in (req(0, 1, 0.0), req(1, 0, 2.0), req(2, 0, 1.0), req(3, 1, 0.5)):
        q.append(r)
    assert q[0].id == 2
    assert [r.id for r in q] == [2, 1, 0, 3]
    late = req(4, 0, 0.1)
    q.appendleft(late)  # a preempted request re-enters by its key, not at the front
    assert [q.popleft().id for _ in range(len(q))] == [4, 2, 1, 0, 3]


def test_priority_queue_remove_and_contains() -> None:
    rs = [req(i, i % 3, float(i)) for i in range(7)]
    q = PriorityQueue(rs)
    q.remove(rs[3])
    assert rs[3] not in q
    assert rs[4] in q
    assert [r.id for r in q] == sorted((r.id for r in rs if r is not rs[3]),
                                       key=lambda i: priority_key(rs[i]))
    with pytest.raises(ValueError, match="request 3"):
        q.remove(rs[3])


def test_fcfs_queue_is_a_deque() -> None:
    q = make_queue("fcfs")
    a, b, c = req(0, 5), req(1, 0), req(2, 0)
    q.append(a)
    q.append(b)
    q.appendleft(c)  # a preempted request goes back to the front, whatever its priority
    assert [r.id for r in q] == [2, 0, 1]


def test_victim_is_lowest_priority_latest_arrival_and_not_in_flight() -> None:
    running = [req(0, 0, 0.0), req(1, 2, 1.0), req(2, 2, 3.0), req(3, 1, 4.0)]
    assert choose_victim(running, "priority") is running[2]
    assert choose_victim(running, "fcfs") is running[3]
    running[2].in_flight = True
    assert choose_victim(running, "priority") is running[1]
    for r in running:
        r.in_flight = True
    assert choose_victim(running, "priority") is None
    assert choose_victim(running, "fcfs") is None
