"""Long simulated clocks (> 1e5 s): every timed mechanism still finishes, on time.

At t >= 16,384 s one ulp of the clock is worth a few bytes on a TB/s link, so a transfer
whose finish test used an absolute byte tolerance could re-plan a zero-length timer
forever. A run that hangs makes these tests fail by alarm instead of hanging the suite.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator

import numpy as np
import pytest
import simpy

from simulator import run
from simulator.engine.fabric import Fabric, FlowSpec, ResourceSpec
from tests.conftest import make_scenario

SCHED = {"max_num_seqs": 64, "max_num_batched_tokens": 8192}


@pytest.fixture(autouse=True)
def _alarm() -> Iterator[None]:
    def hung(_signum: int, _frame: object) -> None:
        raise TimeoutError("the simulation did not finish (clock stuck)")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("t0", [16_384.0, 1e5, 3.7e6, 1e9])
def test_fabric_flows_finish_at_any_clock(t0: float) -> None:
    env = simpy.Environment(initial_time=t0)
    fabric = Fabric(env)
    link = ResourceSpec("nvlink:tx", 1e12)  # 1 TB/s: one ulp of t0 is worth bytes
    sizes = [1e3 * 1.37**k for k in range(40)]
    ends: list[float] = []

    def one(nbytes: float, delay: float) -> simpy.events.ProcessGenerator:
        yield env.timeout(delay)
        yield from fabric.send([FlowSpec((link,), nbytes)])
        ends.append(env.now)

    for nbytes in sizes:  # all at once: they leave one by one, each re-plan leaves residues
        env.process(one(nbytes, 0.0))
    steps = 0
    while env.peek() < float("inf"):
        env.step()
        steps += 1
        assert steps < 100 * len(sizes), "the fabric keeps re-planning without progress"
    assert len(ends) == len(sizes)
    # Work-conserving: the last byte leaves when all bytes at the full rate would have.
    tolerance = 4 * len(sizes) * math.ulp(t0)
    assert max(ends) - t0 == pytest.approx(sum(sizes) / 1e12, rel=1e-9, abs=tolerance)


def long_1p1d(**overrides):
    pools = [
        {"name": "prefill", "role": "prefill", "device": "H100-SXM", "parallelism": {"tp": 8},
         "scheduler": SCHED},
        {"name": "decode", "role": "decode", "device": "H100-SXM", "parallelism": {"tp": 8},
         "scheduler": SCHED},
    ]
    base = {
        "model": "Llama-3.1-70B",
        "cluster.pools": pools,
        # One request every 1,000 s: the clock passes 1e5 s with a light load.
        "workload.arrival": {"kind": "constant", "rate_per_s": 0.001},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 500, "max_tokens": 4000},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 2, "max_tokens": 300},
        "workload.num_requests": 120,
    }
    base.update(overrides)
    return make_scenario(**base)


@pytest.mark.parametrize("mode", ["bulk", "layerwise"])
def test_1p1d_run_past_1e5_seconds_finishes(mode: str) -> None:
    res = run(long_1p1d(**{"cluster.kv_transfer": {"mode": mode}}))
    r = res.requests
    assert (r["status"] == "completed").all()
    assert r["completion_s"].max() > 1e5
    assert len(res.transfers) == 120
    late = res.transfers[res.transfers["start_s"] > 1e5]
    assert len(late) > 0
    assert (late["duration_s"] > 0).all()


def test_decode_jumps_match_step_by_step_past_1e5_seconds() -> None:
    sc = long_1p1d()
    jump = run(sc)
    step = run(sc.with_(**{"simulation.fast_forward": False}))
    for col in ("first_token_s", "second_token_s", "transfer_end_s", "completion_s"):
        assert np.array_equal(jump.requests[col].to_numpy(), step.requests[col].to_numpy()), col
    assert len(jump.steps) == len(step.steps)


def test_faults_past_1e5_seconds() -> None:
    faults = [
        {"kind": "link_degradation", "target": "prefill/0", "at_s": 100_500.0,
         "duration_s": 3_000.0, "bandwidth_factor": 0.25},
        {"kind": "instance_failure", "target": "decode/0", "at_s": 110_000.5,
         "duration_s": 60.0},
    ]
    res = run(long_1p1d(faults=faults, **{
        "workload.output_tokens": {"kind": "fixed", "tokens": 3000}}))
    r = res.requests
    assert (r["status"] == "completed").all()
    kinds = res.events.set_index("kind")["time_s"]
    assert kinds["link_degradation"] == 100_500.0
    assert kinds["link_repair"] == 103_500.0
    assert kinds["instance_failure"] == 110_000.5
    assert kinds["instance_recovery"] == pytest.approx(110_060.5, abs=1e-9)
    assert r["restarts"].sum() >= 1  # the request decoding at 110,000.5 s was redone
    # The degraded hand-offs (101,000 s ... 103,000 s) ran at a quarter of the speed.
    t = res.transfers.merge(r[["request_id", "prompt_tokens"]], on="request_id")
    per_byte = t["duration_s"] / t["bytes"]
    slow = (t["start_s"] > 100_500) & (t["start_s"] < 103_500)
    assert per_byte[slow].min() > 3 * per_byte[~slow & (t["start_s"] < 110_000)].max()


def test_autoscaler_past_1e5_seconds() -> None:
    sc = make_scenario(**{
        # A burst at t = 0, then silence for 1e5 s, then the next burst.
        "workload.arrival": {"kind": "on_off", "on_rate_per_s": 40.0, "off_rate_per_s": 0.0,
                             "on_s": 30.0, "off_s": 100_000.0},
        "workload.num_requests": 2000,
        "workload.output_tokens": {"kind": "fixed", "tokens": 400},
        "cluster.pools.main.instances": 1,
        "cluster.pools.main.autoscale": {
            "min_instances": 1, "max_instances": 3, "signal": "running",
            "scale_out_above": 24, "scale_in_below": 4, "interval_s": 5, "cooldown_s": 20,
            "load_bandwidth_gb_per_s": 5.0, "startup_s": 10},
    })
    res = run(sc)
    assert (res.requests["status"] == "completed").all()
    assert res.requests["arrival_s"].max() > 1e5
    ev = res.events
    out = ev[(ev["kind"] == "scale_out") & (ev["time_s"] > 1e5)]["time_s"].to_numpy()
    ready = ev[(ev["kind"] == "instance_ready") & (ev["time_s"] > 1e5)]["time_s"].to_numpy()
    cold = ev[ev["kind"] == "instance_ready"]["time_s"].iloc[0] - ev[
        ev["kind"] == "scale_out"]["time_s"].iloc[0]
    assert len(out) > 0
    assert len(ready) == len(out)
    assert out[0] % 5.0 == 0.0  # on the policy's 5 s grid, after 20,000 looks
    assert ready - out == pytest.approx([cold] * len(out), abs=1e-9)
