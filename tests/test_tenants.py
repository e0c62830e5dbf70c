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

from simulator.engine.priority import PriorityQueue, make_queue, priority_key
from simulator.engine.request import Request
from simulator.engine.tenants import Admission
from simulator.engine.workload_spec import RequestClass, WorkloadSpec
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
@given(limit=st.integers(1, 6), rate=st.floats(4.0, 40.0),
       timeout=st.one_of(st.none(), st.floats(0.2, 5.0)), retries=st.integers(0, 2))
def test_admission_limit_is_never_exceeded(limit: int, rate: float, timeout: float | None,
                                           retries: int) -> None:
    sc = with_classes(premium(), batch(max_outstanding=limit, timeout_s=timeout,
                                       retries=retries, retry_backoff_s=0.1,
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
    first = df[(df["class"] == "batch") & (df["attempt"] == 0)]
    assert len(first) == 40
    assert (df["attempt"] <= retries).all()


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


# ----- priority scheduling in the engine -----------------------------------------------
def burst(**overrides: Any) -> Scenario:
    """Premium chat under a burst of long batch prompts on one instance."""
    sc = with_classes(
        premium(num_requests=40, arrival={"kind": "poisson", "rate_per_s": 4.0}),
        batch(num_requests=60, arrival={"kind": "all_at_once"},
              input_tokens={"kind": "uniform", "min_tokens": 3000, "max_tokens": 6000}))
    return sc.with_(**{"cluster.pools.main.scheduler.max_num_seqs": 32, **overrides})


@pytest.mark.parametrize("where", ["instance", "central_queue"])
def test_priority_gives_the_premium_class_a_lower_ttft_under_a_burst(where: str) -> None:
    if where == "instance":
        on = {"cluster.pools.main.scheduler.scheduling_policy": "priority"}
        off = {"cluster.pools.main.scheduler.scheduling_policy": "fcfs"}
    else:
        base = {"cluster.router.dispatch": "central_queue",
                "cluster.pools.main.scheduler.max_num_seqs": 8}
        on = {**base, "cluster.router.queue_policy": "priority"}
        off = {**base, "cluster.router.queue_policy": "fcfs"}
    with_p, without = run(burst(**on)).summary, run(burst(**off)).summary
    for q in ("p50", "p90", "p99"):
        assert with_p[f"class_premium_ttft_{q}_s"] <= without[f"class_premium_ttft_{q}_s"]
    # The burst waits instead: priorities move latency, they do not create capacity.
    assert with_p["class_batch_ttft_p50_s"] >= without["class_batch_ttft_p50_s"]
    assert with_p["class_premium_ttft_p90_s"] < 0.5 * without["class_premium_ttft_p90_s"]


def test_priority_preempts_the_least_urgent_running_request() -> None:
    """With a KV too small for the burst, preemptions fall on the batch class."""
    sc = burst(**{"cluster.pools.main.device": "L40S",
                  "cluster.pools.main.scheduler.memory_utilization": 0.45,
                  "cluster.pools.main.scheduler.scheduling_policy": "priority"})
    df = run(sc).requests
    by_class = df.groupby("class")["preemptions"].sum()
    assert by_class["batch"] > 0
    assert by_class.get("premium", 0) == 0


# ----- planner and goodput: every class meets its own SLO ------------------------------
def class_plan(**changes: Any) -> Any:
    from simulator.runner.planner import PlanSpec

    return PlanSpec.model_validate({
        "name": "tenants", "model": "Llama-3.1-8B",
        "workload": {"duration_s": 20, "classes": [
            {"name": "premium", "arrival": {"kind": "poisson", "rate_per_s": 2.0},
             "input_tokens": {"kind": "fixed", "tokens": 400},
             "output_tokens": {"kind": "fixed", "tokens": 100},
             "priority": 0, "slo": {"ttft_s": 0.15, "tpot_s": 0.03}},
            {"name": "batch", "arrival": {"kind": "poisson", "rate_per_s": 18.0},
             "input_tokens": {"kind": "fixed", "tokens": 3000},
             "output_tokens": {"kind": "fixed", "tokens": 200},
             "priority": 1, "slo": {"ttft_s": 20.0}}]},
        "slo": {"ttft_s": 20.0},
        "hardware": [{"device": "H100-SXM", "max_devices": 8}],
        "tp": [1], "layouts": ["colocated"], "top": 1, "goodput_search": False,
        **changes})


def test_planner_meets_every_class_slo_not_just_the_average() -> None:
    from simulator.runner.planner import Family, Shape, plan, scenario_of

    spec = class_plan()
    result = plan(spec, workers=1)
    sim = result.simulated
    assert result.best is not None
    best = run(result.best).summary
    assert best["slo_attainment_min_class"] >= 0.9
    # A smaller configuration met the target on average over all requests while the
    # premium class missed it: the planner did not stop there.
    passed_on_average = sim[(sim["slo_attainment"] >= 0.9) & ~sim["feasible"]]
    assert len(passed_on_average) > 0
    assert passed_on_average["devices"].max() < int(result.ranked["devices"].iloc[0])
    # The target rate scales every class alike (the mix is kept).
    one = Family("colocated", (Shape("H100-SXM", 1, 1),))
    rates = [c.arrival.rate_per_s for c in scenario_of(spec, one, (1,), rate=40.0)
             .workload.classes or []]
    assert rates == pytest.approx([4.0, 36.0])


def test_goodput_search_scales_the_mix_and_holds_the_worst_class() -> None:
    from simulator.runner.goodput import GoodputSpec, search_goodput

    sc = with_classes(premium(num_requests=None, duration_s=15.0),
                      batch(num_requests=None, duration_s=15.0))
    res = search_goodput(sc, GoodputSpec(target=0.9, rel_tol=0.1, max_probes=8))
    assert res.rate_per_s > 0
    assert res.result is not None
    s = res.result.summary
    assert s["slo_attainment_min_class"] >= 0.9
    assert res.attainment == s["slo_attainment_min_class"]
    rates = [c.arrival.rate_per_s for c in res.result.scenario.workload.classes or []]
    assert sum(rates) == pytest.approx(res.rate_per_s)
    assert rates[1] / rates[0] == pytest.approx(2.0)  # batch : premium as given (6 : 3)


def test_cli_prints_a_table_per_class(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from simulator.cli import app

    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(with_classes(premium(), batch(max_outstanding=3))
                                   .model_dump(mode="json", exclude_none=True)))
    out = CliRunner().invoke(app, ["run", str(path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "per class (each against its own SLO)" in out.output
    assert "premium" in out.output
    assert "batch" in out.output


# ----- the single-class spec is one class named default --------------------------------
def as_default_class(sc: Scenario) -> Scenario:
    """``sc``'s single-class workload written out as ``classes: [{name: default}]``."""
    data = sc.model_dump(mode="json")
    w = data["workload"]
    cls = {"name": "default", **{k: w.pop(k) for k in ("arrival", "input_tokens",
                                                        "output_tokens", "shared_prefix")}}
    w["classes"] = [{k: v for k, v in cls.items() if v is not None}]
    return Scenario.model_validate(data)


@pytest.mark.parametrize("overrides", [
    {},
    {"workload.arrival": {"kind": "gamma", "rate_per_s": 8.0, "cv": 3.0},
     "workload.shared_prefix": {"tokens": 512, "groups": 3, "fraction": 0.5},
     "cluster.pools.main.scheduler.prefix_caching": True},
    {"workload.arrival": {"kind": "on_off", "on_rate_per_s": 20.0, "on_s": 1.0,
                          "off_s": 2.0}, "workload.num_requests": None,
     "workload.duration_s": 6.0},
    {"workload.arrival": {"kind": "all_at_once"}, "cluster.router.dispatch": "central_queue"},
])
def test_a_default_class_written_out_is_the_single_class_workload(
        overrides: dict[str, Any]) -> None:
    sc = make_scenario(**overrides)
    single, written = run(sc), run(as_default_class(sc))
    assert written.scenario.workload.classes is not None
    assert single.requests.equals(written.requests)
    assert single.steps.equals(written.steps)
    for key in ("completed", "ttft_p90_s", "tpot_p90_s", "e2e_p99_s", "duration_s"):
        assert single.summary[key] == written.summary[key]
    assert written.summary["slo_attainment"] == pytest.approx(single.summary["slo_attainment"])


def test_cli_plots_ttft_by_class_from_a_run_folder(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from simulator.cli import app

    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(with_classes(premium(), batch())
                                   .model_dump(mode="json", exclude_none=True)))
    runner = CliRunner()
    assert runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out")]).exit_code == 0
    res = runner.invoke(app, ["plot", str(tmp_path / "out"), "--kind", "class-cdf",
                              "--format", "png"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "plots" / "class_cdf.png").stat().st_size > 0
