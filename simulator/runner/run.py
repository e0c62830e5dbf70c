"""Run one scenario: build the engine, run the clock, collect frames and the summary."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import simpy

from simulator.cost.predictor import predictor_summary
from simulator.engine.autoscaler import Autoscaler
from simulator.engine.cluster import Cluster, TransferPlan
from simulator.engine.daemons import Daemons
from simulator.engine.faults import start_faults
from simulator.engine.kv_router import KvRouterState
from simulator.engine.recorder import Recorder
from simulator.engine.request import Request, State
from simulator.engine.router import RouterState
from simulator.engine.tenants import Admission, class_rngs
from simulator.engine.workload import Workload
from simulator.metrics.classes import class_summary
from simulator.metrics.compact import CompactSteps
from simulator.metrics.cost import cost_summary, powered_cost_summary
from simulator.metrics.summary import (
    add_latency_columns,
    local_prefill_share,
    summarize,
    tier_summary,
)
from simulator.runner.budget import check_budget, estimate_run
from simulator.runner.build import ClusterPlan, build_plan, with_resolved_precision
from simulator.runner.checks import VLLM_CONTEXT_RULE, check_context
from simulator.runner.progress import ProgressCallback, RunProgress, run_until
from simulator.runner.result import RunResult, StepRecords
from simulator.scenario.load import load_scenario, scenario_dir
from simulator.scenario.schema import Scenario

LARGE_RUN_REQUESTS = 100_000
"""Above this many requests ``record_steps: auto`` keeps stretches, not every step."""

STREAMS = ("arrival", "input", "output", "prefix", "routing", "faults", "speculation",
           "session")


def record_steps_mode(sc: Scenario) -> str:
    """``simulation.record_steps`` resolved: ``auto`` is ``stretches`` for a large run.

    A run is large when it asks for more than :data:`LARGE_RUN_REQUESTS` requests, or
    issues at a known rate for long enough to (rate x duration).
    """
    mode = sc.simulation.record_steps
    if mode != "auto":
        return mode
    w = sc.workload
    expected = w.num_requests
    rate = getattr(w.arrival, "rate_per_s", None)
    if expected is None and rate is not None and w.duration_s is not None:
        expected = int(rate * w.duration_s)
    return "stretches" if expected is not None and expected > LARGE_RUN_REQUESTS else "all"


def spawn_rngs(seed: int) -> dict[str, np.random.Generator]:
    """One independent generator per random stream, all from one seed."""
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return {name: np.random.default_rng(s) for name, s in zip(STREAMS, children, strict=True)}


class Simulation:
    """Inert until :meth:`run`; building it reads profiles but writes nothing."""

    def __init__(self, scenario: Scenario, base_dir: Path | None = None,
                 file: str | None = None, progress: ProgressCallback | None = None) -> None:
        self.scenario = scenario
        self.progress = progress
        self.plan: ClusterPlan = build_plan(scenario, base_dir, file)
        check_context(scenario, self.plan.model, file)
        pools = {p.spec.name: p.spec.max_instances for p in self.plan.pools}
        seqs = max(int(p.spec.scheduler.max_num_seqs or 1) for p in self.plan.pools)
        check_budget(estimate_run(scenario, pools, seqs), file)

    def run(self) -> RunResult:
        sc = self.scenario
        plan = self.plan
        wall0 = time.perf_counter()
        env = simpy.Environment()
        rngs = spawn_rngs(sc.seed)
        mode = record_steps_mode(sc)
        recorder = Recorder("all" if mode == "all" else "stretches")
        transfer = TransferPlan(sc.cluster.kv_transfer.mode, plan.transfer_path,
                                plan.model.num_layers)
        router = sc.cluster.router
        state = (KvRouterState(rngs["routing"], router.kv_router,
                               sc.workload.prefix_block_tokens, lambda: env.now)
                 if "kv_aware" in (router.policy, router.decode_policy)
                 else RouterState(rngs["routing"]))
        classes = list(sc.workload.classes or ())
        admission = Admission(classes) if any(c.max_outstanding for c in classes) else None
        cluster = Cluster(env, plan.instances, router, state,
                          recorder, transfer, fast_forward=sc.simulation.fast_forward,
                          prefix_block_tokens=sc.workload.prefix_block_tokens,
                          speculation_rng=rngs["speculation"], admission=admission)
        context = plan.model.max_context_tokens

        def submit(req: Request) -> None:
            # The model's context limit is checked here; what the instances' KV can hold,
            # by the cluster (Cluster.submit).
            total = req.prompt_tokens + req.output_tokens
            if total > context:
                req.move_to(State.REJECTED)
                req.reason = (f"prompt+output {total} tokens exceed the model's maximum "
                              f"context ({context}); {VLLM_CONTEXT_RULE}")
                recorder.requests.append(req)
                finished(req)
                return
            cluster.submit(req)

        def give_up(req: Request) -> None:
            cls = workload.classes[req.klass]
            cluster.cancel(req, f"client timeout after {cls.timeout_s:g} s")

        workload = Workload(env, sc.workload, rngs, submit, plan.base_dir, cancel=give_up,
                            class_rngs={c.name: class_rngs(sc.seed, c.name, rngs) for c in classes})

        def finished(req: Request) -> None:
            recorder.requests.ended(req)  # its values kept, the object may go
            workload.on_finished(req)

        cluster.on_finished = finished

        def stop() -> bool:
            return workload.done.triggered

        daemons = Daemons(env, cluster.waiting_for_instance)
        start_faults(env, cluster, list(sc.faults), rngs["faults"], stop, daemons)
        for pool in plan.pools:
            if pool.spec.autoscale is not None:
                cold = next(s.cold_start_s for s in plan.instances if s.pool == pool.spec.name)
                Autoscaler(env, cluster, pool.spec.name, pool.spec.autoscale, cold, stop,
                           daemons)
        workload.start()
        until: simpy.Event = workload.done
        if sc.simulation.max_time_s is not None:
            until = env.any_of([workload.done, daemons.deadline(sc.simulation.max_time_s)])
        tick = None
        if self.progress is not None:
            callback, total = self.progress, sc.workload.num_requests
            end = min((t for t in (sc.workload.duration_s, sc.simulation.max_time_s)
                       if t is not None), default=None)

            def tick(now: float) -> None:
                callback(RunProgress(now, len(recorder.requests), total, end))
        try:
            run_until(env, until, tick)
        except RuntimeError as exc:  # nothing left to happen: stuck requests stay in flight
            if "No scheduled events left" not in str(exc):
                raise
        cluster.stop()
        stuck: dict[str, int] = {}
        for req in recorder.requests:
            if not req.ended:
                if daemons.stalled_at is not None:
                    stuck[str(req.status)] = stuck.get(str(req.status), 0) + 1
                    req.reason = req.reason or (
                        f"stuck {req.status}: nothing could move it when the run stalled at "
                        f"{daemons.stalled_at:.6g} s")
                req.reason = req.reason or f"still {req.status} when the clock stopped"
                req.move_to(State.IN_FLIGHT)
        warnings = [stall_warning(daemons.stalled_at, stuck)] if stuck else []
        names = [s.name for s in plan.instances]
        pools = [s.pool for s in plan.instances]
        frame = recorder.requests_frame(names)
        recorder.requests.clear()  # in the frame now; the objects may go
        requests = add_latency_columns(frame)
        del frame
        transfers = recorder.transfers_frame(names, cluster.link_names)
        step_records = StepRecords(recorder, names, pools, mode)
        # The summary reads the steps as kept: a compact run's stretches are not expanded.
        steps: pd.DataFrame | CompactSteps = (
            step_records.frame() if mode == "all" else recorder.compact_steps(names, pools))
        slo = sc.slo
        measured, measured_steps = requests, steps
        if workload.measure_from_id:  # warm-ups stay in the frames, not in the summary
            requests["warmup"] = requests["request_id"] < workload.measure_from_id
            measured = requests[~requests["warmup"]]
            start = float(measured["arrival_s"].min()) if len(measured) else 0.0
            measured_steps = (steps.since(start) if isinstance(steps, CompactSteps)
                              else steps[steps["start_s"] >= start])
        summary = summarize(measured, measured_steps, ttft_s=slo.ttft_s, tpot_s=slo.tpot_s,
                            e2e_s=slo.e2e_s, pool_devices=plan.pool_devices)
        if classes:
            summary.update(class_summary(measured, classes, slo, duration=summary["duration_s"]))
        summary.update(cost_summary(plan, summary))
        # Device-hours each instance was powered (autoscaled ones only part of the run).
        device_of = {p.spec.name: p.device for p in plan.pools}
        powered = [(device_of[spec.pool], inst.powered_until(env.now) * spec.devices / 3600.0)
                   for inst, spec in zip(cluster.instances, plan.instances, strict=True)]
        out_tokens = float(requests.loc[requests["status"] == "completed",
                                        "generated_tokens"].sum())
        summary.update(powered_cost_summary(powered, out_tokens))
        summary["retries"] = cluster.retries
        summary["stalled"] = int(daemons.stalled_at is not None)  # 0/1: a number in sweep tables
        if any(spec.tiers for spec in plan.instances) or any(
                p.spec.scheduler.prefix_caching and p.spec.role == "decode" for p in plan.pools):
            summary.update(tier_summary(measured))
            summary.update(cluster.tiers.summary())
        if sc.cluster.router.conditional is not None:
            summary["local_prefill_share"] = local_prefill_share(measured)
        if workload.trace is not None:
            summary["trace_rows_skipped"] = sum(workload.trace.skipped.values())
        summary.update(predictor_summary([spec.cost for spec in plan.instances]))
        events = pd.DataFrame(recorder.events, columns=["time_s", "kind", "detail"])
        wall = time.perf_counter() - wall0
        # SimPy numbers every scheduled event from one per-environment counter.
        sim_events = next(env._eid)
        del steps, measured_steps
        return RunResult(with_resolved_precision(sc, plan.model), requests, step_records,
                         transfers, summary, events, wall, sim_events, warnings)


def stall_warning(at: float | None, stuck: dict[str, int]) -> str:
    """One line naming how many requests a stalled run left, where, and why."""
    where = ", ".join(f"{n} {state}" for state, n in sorted(stuck.items()))
    return (f"the run stalled at {at:.6g} s with {sum(stuck.values())} request(s) unfinished "
            f"({where}): nothing but periodic processes (autoscaler ticks, random-failure "
            "timers) was left to happen, so no request could progress; they are reported "
            "in_flight (see docs/RELIABILITY.md, 'Every run ends')")


def run(scenario: Scenario | str | Path, *, seed: int | None = None,
        base_dir: str | Path | None = None, file: str | None = None,
        progress: ProgressCallback | None = None) -> RunResult:
    """Simulate a scenario (object or YAML path) and return its result.

    ``file`` names the YAML the scenario came from, for error messages; ``progress`` is
    called with a :class:`~simulator.runner.progress.RunProgress` every few thousand events.
    """
    if not isinstance(scenario, Scenario):
        file = str(scenario)
        base_dir = base_dir or scenario_dir(scenario)
        scenario = load_scenario(scenario)
    elif base_dir is None and scenario.source_file is not None:
        base_dir = Path(scenario.source_file).parent  # a scenario loaded from (or built on) a file
        file = file or scenario.source_file
    base_dir = Path(base_dir) if base_dir is not None else None
    if seed is not None:
        scenario = scenario.with_(seed=seed)  # validated: a negative seed is bad input
    return Simulation(scenario, base_dir, file, progress).run()
