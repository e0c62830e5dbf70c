"""Every run ends: a run whose requests can never finish stops instead of spinning.

Periodic processes (autoscaler ticks and drain polls, random-failure up-times) are
daemons (simulator/engine/daemons.py). Each run here is made in a child process with a
time limit, so that a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import simpy
import yaml

from simulator.engine.daemons import Daemons
from simulator.errors import EXIT_OK
from simulator.scenario.schema import Scenario
from tests.conftest import REPO, make_scenario
from tests.test_exit_codes import exit_code

CHILD = """
import json, sys
from simulator import run
from simulator.scenario.schema import Scenario
res = run(Scenario.model_validate_json(sys.stdin.read()))
r = res.requests
print(json.dumps({"status": r["status"].value_counts().to_dict(),
                  "reasons": sorted(set(r.loc[r["status"] != "completed", "reason"])),
                  "stalled": res.summary["stalled"], "in_flight": res.summary["in_flight"],
                  "warnings": res.warnings}))
"""

AUTOSCALE = {"min_instances": 1, "max_instances": 2, "signal": "queue_length",
             "scale_out_above": 2.0, "scale_in_below": 0.5, "interval_s": 0.5,
             "cooldown_s": 1.0, "startup_s": 0.5}


def run_limited(sc: Scenario, seconds: float = 60.0) -> dict[str, Any]:
    """Run ``sc`` in a child process; fails (not hangs) past ``seconds``."""
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], input=sc.model_dump_json(),
                              capture_output=True, text=True, timeout=seconds, cwd=REPO,
                              check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the run did not end within {seconds:g} s") from None
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def dead_decode(**more: Any) -> Scenario:
    """P/D on L40S: the only decode instance dies for good at 1 s, the prefill pool
    autoscales; every later hand-off waits for decode room that never comes."""
    return make_scenario(**{
        "workload.num_requests": 20,
        "workload.arrival": {"kind": "poisson", "rate_per_s": 4.0},
        "cluster.pools": [{"name": "p", "role": "prefill", "device": "L40S", "instances": 1,
                           "autoscale": AUTOSCALE},
                          {"name": "d", "role": "decode", "device": "L40S", "instances": 1}],
        "faults": [{"kind": "instance_failure", "target": "d/0", "at_s": 1.0}],
        **more})


def test_a_run_whose_hand_offs_wait_for_good_stalls_and_reports_them() -> None:
    out = run_limited(dead_decode())
    assert out["stalled"] == 1
    assert out["status"] == {"in_flight": 19, "completed": 1}
    assert out["in_flight"] == 19
    assert len(out["reasons"]) == 1
    assert out["reasons"][0].startswith("stuck transfer: nothing could move it when the run "
                                        "stalled at")
    assert len(out["warnings"]) == 1
    assert "with 19 request(s) unfinished (19 transfer)" in out["warnings"][0]


def test_random_failure_timers_do_not_keep_a_stalled_run_going() -> None:
    out = run_limited(dead_decode(faults=[
        {"kind": "instance_failure", "target": "d/0", "at_s": 1.0},
        {"kind": "random_failures", "pool": "p", "mtbf_s": 5.0, "mttr_s": 1.0}]))
    assert out["stalled"] == 1
    assert sum(out["status"].values()) == 20
    assert out["status"]["in_flight"] == out["in_flight"] > 0


def test_the_hypothesis_example_that_hung_ends() -> None:
    """The pressure property of tests/test_fast_forward.py hung on this example: the link
    of prefill instance main/0 dies for good before its NIC had carried a hand-off."""
    sched = {"max_num_seqs": 45, "max_num_batched_tokens": 4096, "prefix_caching": True,
             "memory_utilization": 0.4}
    sc = make_scenario(**{
        "seed": 4903,
        "workload.arrival": {"kind": "poisson", "rate_per_s": 1.712},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 800},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 477},
        "workload.shared_prefix": {"tokens": 600, "groups": 4, "fraction": 0.9},
        "workload.prefix_block_tokens": 256,
        "workload.num_requests": 40,
        "cluster.pools": [
            {"name": "main", "role": "prefill", "device": "L40S", "instances": 1,
             "scheduler": sched, "autoscale": {**AUTOSCALE, "max_instances": 3}},
            {"name": "d", "role": "decode", "device": "L40S", "instances": 2,
             "scheduler": {**sched, "prefix_caching": False}}],
        "cluster.router.policy": "prefix_affinity",
        "faults": [{"kind": "link_degradation", "target": "main/0", "at_s": 1.0,
                    "bandwidth_factor": 0.0}],
        "cluster.kv_transfer": {"link": "ethernet-100g"},
    })
    for fast_forward in (True, False):
        out = run_limited(sc.with_(**{"simulation.fast_forward": fast_forward}))
        # Every hand-off from main/0 crosses its dead link: they fail, none hangs.
        assert out["status"] == {"failed": 40}
        assert out["reasons"] == ["KV transfer failed: link ethernet-100g:main/0 is down"]
        assert out["stalled"] == 0


def test_a_scale_out_that_rescues_waiting_requests_is_waited_for() -> None:
    """Every request has arrived when the only serving instance dies for good; they wait
    at the router while only the autoscaler's ticks are scheduled. Its next tick outside
    the cool-down scales out, and they complete: the stall rule must not cut that off."""
    sc = make_scenario(**{
        "workload.num_requests": 20,
        "workload.arrival": {"kind": "all_at_once"},
        "cluster.pools": [{"name": "main", "device": "H100-SXM", "instances": 1,
                           "autoscale": {**AUTOSCALE, "scale_out_above": 50.0,
                                         "scale_in_below": 0.0, "cooldown_s": 3.0}}],
        "faults": [{"kind": "instance_failure", "target": "main/0", "at_s": 0.2}],
    })
    out = run_limited(sc)
    assert out["status"] == {"completed": 20}
    assert out["stalled"] == 0
    assert out["warnings"] == []


# ----- the rule itself, on a bare environment ---------------------------------------------
class Scaler:
    """A rescuer that stays in its cool-down for ``busy`` ticks, then looks and does nothing."""

    def __init__(self, daemons: Daemons, busy: int) -> None:
        self.daemons, self.busy, self.ticks = daemons, busy, 0

    def could_rescue(self) -> bool:
        return True

    def loop(self) -> Generator[simpy.Event, Any, None]:
        while True:
            yield self.daemons.sleep(1.0)
            self.ticks += 1
            if self.ticks > self.busy:
                self.daemons.quiet(self)


def _stall_time(waiting: bool, busy: int, work_until: float) -> float | None:
    env = simpy.Environment()
    daemons = Daemons(env, lambda: waiting)
    scaler = Scaler(daemons, busy)
    daemons.add_rescuer(scaler)
    env.process(scaler.loop())
    env.timeout(work_until)  # a step, flow or arrival still to come
    env.run(until=daemons.deadline(100.0))
    return daemons.stalled_at


def test_the_run_stops_at_the_first_daemon_wake_with_nothing_else_scheduled() -> None:
    assert _stall_time(waiting=False, busy=5, work_until=2.5) == 3.0


def test_a_rescuer_that_could_help_is_given_its_look_first() -> None:
    # Quiet period from the wake at 3 s; ticks 3..5 are in the cool-down, tick 6 looks
    # and does nothing, and the wake at 7 s stops the run.
    assert _stall_time(waiting=True, busy=5, work_until=2.5) == 7.0
    # A look before the period began does not count.
    assert _stall_time(waiting=True, busy=0, work_until=2.5) == 4.0


def test_cli_run_warns_on_stderr_and_succeeds(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "stall.yaml"
    path.write_text(yaml.safe_dump(dead_decode().model_dump(mode="json")))
    code, err = exit_code(["run", str(path), "--json"], capsys)
    assert code == EXIT_OK
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("warning: the run stalled at ")
    assert "19 request(s) unfinished" in lines[0]
