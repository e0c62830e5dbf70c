"""Operations: failures and recovery, link faults, stragglers, autoscaling, bad definitions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator import ConfigError, Simulation, load_scenario, run
from tests.conftest import REPO, make_scenario

PHASE = REPO / "scenarios" / "phase_split"
OPS = REPO / "scenarios" / "operations"


def one_p_two_d(**overrides):
    sc = load_scenario(PHASE / "1p2d_conv.yaml").with_(**{"workload.duration_s": 240})
    return sc.with_(**overrides) if overrides else sc


def accounted(res) -> None:
    r = res.requests
    assert set(r["status"]) <= {"completed", "failed", "rejected", "in_flight"}
    s = res.summary
    assert s["completed"] + s["failed"] + s["rejected"] + s["in_flight"] == s["num_requests"]
    assert (r.loc[r["status"] == "failed", "reason"] != "").all()
    steps = res.steps
    assert (steps["kv_used_blocks"] <= steps["kv_total_blocks"]).all()


def test_decode_instance_dies_and_recovers() -> None:
    sc = one_p_two_d(faults=[{"kind": "instance_failure", "target": "decode/0",
                              "at_s": 100, "duration_s": 60}])
    res = run(sc, base_dir=PHASE)
    accounted(res)
    r = res.requests
    hit = r[r["restarts"] > 0]
    assert len(hit) > 0
    assert (hit["status"] == "completed").all()  # failed, then recovered elsewhere
    assert (hit["generated_tokens"] == hit["output_tokens"]).all()
    assert res.summary["retries"] == int(r["restarts"].sum())
    # Nothing runs on decode/0 while it is down.
    d0 = res.steps[res.steps["instance_name"] == "decode/0"]
    down = d0[(d0["start_s"] > 100) & (d0["start_s"] < 160)]
    assert down.empty
    kinds = list(res.events["kind"])
    assert "instance_failure" in kinds
    assert "instance_recovery" in kinds


def test_faults_give_identical_results_with_and_without_fast_forward() -> None:
    sc = one_p_two_d(faults=[
        {"kind": "instance_failure", "target": "decode/0", "at_s": 100, "duration_s": 60},
        {"kind": "straggler", "target": "decode/1", "at_s": 150, "duration_s": 30,
         "slowdown": 3.0},
        {"kind": "link_degradation", "target": "prefill/0", "at_s": 40, "duration_s": 20,
         "bandwidth_factor": 0.0}])
    fast = run(sc, base_dir=PHASE).requests
    slow = run(sc.with_(**{"simulation.fast_forward": False}), base_dir=PHASE).requests
    for col in ("first_token_s", "completion_s"):
        assert np.nanmax(np.abs(fast[col] - slow[col])) < 1e-9
    assert list(fast["restarts"]) == list(slow["restarts"])


def test_straggler_slows_its_steps() -> None:
    sc = one_p_two_d(faults=[{"kind": "straggler", "target": "decode/1", "at_s": 100,
                              "duration_s": 50, "slowdown": 4.0}])
    res = run(sc, base_dir=PHASE)
    base = run(one_p_two_d(), base_dir=PHASE)
    def median_step(frame: pd.DataFrame) -> float:
        d1 = frame[(frame["instance_name"] == "decode/1") & (frame["start_s"] > 105)
                   & (frame["start_s"] < 145)]
        return float((d1["duration_s"] / d1["decode_seqs"].clip(lower=1) ** 0).median())
    assert median_step(res.steps) > 3.0 * median_step(base.steps)


def test_link_down_for_good_fails_transfers_with_a_reason() -> None:
    sc = one_p_two_d(faults=[{"kind": "link_degradation", "target": "prefill/0",
                              "at_s": 60, "bandwidth_factor": 0.0}])
    res = run(sc, base_dir=PHASE)
    accounted(res)
    failed = res.requests[res.requests["status"] == "failed"]
    assert len(failed) > 0
    assert failed["reason"].str.contains("KV transfer failed").all()
    assert (failed["arrival_s"] >= 59).all()
    assert res.summary["failed"] == len(failed)


def test_random_failures_are_reproducible() -> None:
    sc = one_p_two_d(faults=[{"kind": "random_failures", "pool": "decode", "mtbf_s": 80,
                              "mttr_s": 20}])
    a = run(sc, base_dir=PHASE)
    b = run(sc, base_dir=PHASE)
    accounted(a)
    assert (a.events["kind"] == "instance_failure").sum() >= 2
    pd.testing.assert_frame_equal(a.requests, b.requests)
    c = run(sc.with_(seed=5), base_dir=PHASE)
    assert not a.events.equals(c.events)


def test_whole_pool_down_then_back() -> None:
    sc = make_scenario(**{"workload.arrival.rate_per_s": 4.0, "workload.num_requests": 80,
                          "faults": [{"kind": "instance_failure", "target": "main/0",
                                      "at_s": 3.0, "duration_s": 5.0}]})
    res = run(sc)
    accounted(res)
    assert res.summary["completed"] == 80
    late = res.requests[(res.requests["arrival_s"] > 3.0) & (res.requests["arrival_s"] < 8.0)]
    assert (late["first_token_s"] >= 8.0).all()  # they waited for the instance to return


def test_autoscaled_fleet_uses_fewer_device_hours_at_similar_slo() -> None:
    """One ON burst and one OFF lull of the shipped pair (the docs run the whole 50 min)."""
    short = {"workload.duration_s": 1500}
    fixed = run(load_scenario(OPS / "bursty_fixed_peak.yaml").with_(**short), base_dir=OPS)
    scaled = run(load_scenario(OPS / "bursty_autoscaled.yaml").with_(**short), base_dir=OPS)
    f, a = fixed.summary, scaled.summary
    assert a["device_hours"] < 0.85 * f["device_hours"]
    assert a["slo_attainment"] >= f["slo_attainment"] - 0.1
    assert a["cost_usd_powered"] < f["cost_usd_powered"]
    kinds = set(scaled.events["kind"])
    assert {"scale_out", "instance_ready", "scale_in", "instance_off"} <= kinds


def test_autoscaler_events_and_cold_start() -> None:
    sc = load_scenario(OPS / "bursty_autoscaled.yaml").with_(**{"workload.duration_s": 300})
    sim = Simulation(sc, OPS)
    cold = sim.plan.instances[0].cold_start_s
    # 16 GB of bf16 weights at 5 GB/s + 30 s start-up.
    assert cold == pytest.approx(16.06e9 / 5e9 + 30, rel=0.01)
    res = sim.run()
    ev = res.events
    outs = ev[ev["kind"] == "scale_out"]["time_s"].to_numpy()
    ready = ev[ev["kind"] == "instance_ready"]["time_s"].to_numpy()
    assert len(outs) >= 1
    assert np.allclose(ready[: len(outs)] - outs[: len(ready)], cold)
    # A new instance serves nothing before it is ready.
    first_ready = ready[0]
    new = ev[ev["kind"] == "instance_ready"]["detail"].iloc[0]
    early = res.steps[(res.steps["instance_name"] == new) & (res.steps["start_s"] < first_ready)]
    assert early.empty


@pytest.mark.parametrize(("faults", "expect"), [
    ([{"kind": "instance_failure", "target": "decode/9", "at_s": 1}],
     "faults[0].target: unknown target instance 'decode/9'"),
    ([{"kind": "instance_failure", "target": "decode/0", "at_s": -1}],
     "faults[0].instance_failure.at_s"),
    ([{"kind": "random_failures", "pool": "nope", "mtbf_s": 10, "mttr_s": 1}],
     "faults[0].pool: unknown pool 'nope'"),
    ([{"kind": "meteor", "at_s": 1}], "unknown kind 'meteor'"),
])
def test_bad_fault_definitions(tmp_path: Path, faults, expect) -> None:
    import yaml

    from simulator.cli import main

    data = yaml.safe_load((PHASE / "1p2d_conv.yaml").read_text())
    data["faults"] = faults
    data["workload"]["arrival"]["path"] = str(REPO / "scenarios/traces/azure_llm_2023_conv.csv")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit) as exc:
        main(["run", str(path)])
    assert exc.value.code == 2


def test_bad_fault_messages() -> None:
    with pytest.raises(ConfigError, match="unknown target instance 'decode/9'"):
        Simulation(one_p_two_d(faults=[{"kind": "instance_failure", "target": "decode/9",
                                        "at_s": 1}]), PHASE)
    with pytest.raises(ConfigError, match=r"min_instances \(3\) > max_instances \(2\)"):
        make_scenario(**{"cluster.pools.main.autoscale": {
            "min_instances": 3, "max_instances": 2, "signal": "running",
            "scale_out_above": 10, "scale_in_below": 1}})
    with pytest.raises(ConfigError, match="scale_in_below must be lower"):
        make_scenario(**{"cluster.pools.main.autoscale": {
            "max_instances": 2, "signal": "running", "scale_out_above": 1,
            "scale_in_below": 5}})


def test_monitoring_series_add_up(tmp_path: Path) -> None:
    res = run(one_p_two_d(faults=[{"kind": "instance_failure", "target": "decode/0",
                                   "at_s": 100, "duration_s": 60}]), base_dir=PHASE)
    inst = res.monitoring(20.0, per_instance=True)
    # Busy seconds per instance equal the steps' durations (steps never overlap here).
    for name, g in inst.groupby("instance_name"):
        steps = res.steps[res.steps["instance_name"] == name]
        assert (g["busy"] * 20.0).sum() == pytest.approx(steps["duration_s"].sum(), rel=1e-9)
        assert (g["compute_util"] + g["memory_util"] <= g["busy"] + 1e-9).all()
    d0 = inst[(inst["instance_name"] == "decode/0") & (inst["time_s"] >= 100)
              & (inst["time_s"] < 160)]
    assert (d0["busy"] == 0).all()  # dead instance: no work
    pools = res.monitoring(20.0)
    assert set(pools["pool"]) == {"prefill", "decode"}
    cluster_wide = pools.drop_duplicates("time_s")  # request columns repeat on each pool row
    assert cluster_wide["completed"].sum() == res.summary["completed"]
    assert cluster_wide["restarts"].sum() == res.summary["retries"]
    out = res.save(tmp_path / "run")
    assert (out / "monitoring.parquet").is_file()
    from typer.testing import CliRunner

    from simulator.cli import app

    cli = CliRunner().invoke(app, ["plot", str(out), "--kind", "monitoring", "--format", "png"])
    assert cli.exit_code == 0, cli.output
    assert (out / "plots" / "monitoring.png").is_file()
