"""Fault injection: instance failures, link degradation, stragglers, random failures.

Each fault is a small SimPy process that waits for its time and calls the cluster, which
applies the stated policy to in-flight work (see docs/operations.md):

* a failed prefill or colocated instance loses its queue, its running prompts and any KV
  waiting to be handed off: those requests are routed again and recomputed;
* a failed decode instance loses its sequences: they are prefilled again (prompt plus the
  tokens already generated) and decode elsewhere; hand-offs on their way to it are sent
  to another decode instance from the prefill side, which still holds their KV;
* a degraded link slows every transfer leaving the instance; a link that is down stalls
  them, and a link down for good fails them (there is no second path);
* a straggler runs every step ``slowdown`` times slower.

The up-times of random failures are daemons (:mod:`simulator.engine.daemons`): a stalled
run stops rather than waiting for the next failure; a repair that is due is waited for.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from simulator.engine.cluster import Cluster
from simulator.engine.config import (
    Fault,
    InstanceFailure,
    LinkDegradation,
    RandomFailures,
    Straggler,
)
from simulator.engine.daemons import Daemons

Stop = Callable[[], bool]


def start_faults(env: simpy.Environment, cluster: Cluster, faults: list[Fault],
                 rng: np.random.Generator, stop: Stop, daemons: Daemons) -> None:
    for fault in faults:
        if isinstance(fault, InstanceFailure):
            env.process(_instance_failure(env, cluster, fault))
        elif isinstance(fault, LinkDegradation):
            env.process(_link_degradation(env, cluster, fault))
        elif isinstance(fault, Straggler):
            env.process(_straggler(env, cluster, fault))
        elif isinstance(fault, RandomFailures):
            for inst in cluster.instances:
                if inst.pool == fault.pool:
                    # One child stream per instance keeps runs reproducible.
                    child = np.random.default_rng(rng.integers(2**63))
                    env.process(_random_failures(env, cluster, inst.name, fault, child, stop,
                                                 daemons))


def _instance_failure(env: simpy.Environment, cluster: Cluster,
                      f: InstanceFailure) -> Generator[simpy.Event, Any, None]:
    yield env.timeout(f.at_s)
    inst = cluster.by_name[f.target]
    cluster.fail_instance(inst)
    if f.duration_s is not None:
        yield env.timeout(f.duration_s)
        cluster.recover_instance(inst)


def _link_degradation(env: simpy.Environment, cluster: Cluster,
                      f: LinkDegradation) -> Generator[simpy.Event, Any, None]:
    yield env.timeout(f.at_s)
    cluster.recorder.event(env.now, "link_degradation", f"{f.target} x{f.bandwidth_factor:g}")
    cluster.degrade_links(f.target, f.bandwidth_factor, for_good=f.duration_s is None)
    if f.duration_s is not None:
        yield env.timeout(f.duration_s)
        cluster.degrade_links(f.target, 1.0, for_good=False)
        cluster.recorder.event(env.now, "link_repair", f.target)


def _straggler(env: simpy.Environment, cluster: Cluster,
               f: Straggler) -> Generator[simpy.Event, Any, None]:
    yield env.timeout(f.at_s)
    inst = cluster.by_name[f.target]
    cluster.recorder.event(env.now, "straggler", f"{f.target} x{f.slowdown:g}")
    inst.set_speed(f.slowdown)
    if f.duration_s is not None:
        yield env.timeout(f.duration_s)
        inst.set_speed(1.0)
        cluster.recorder.event(env.now, "straggler_end", f.target)


def _random_failures(env: simpy.Environment, cluster: Cluster, name: str, f: RandomFailures,
                     rng: np.random.Generator, stop: Stop,
                     daemons: Daemons) -> Generator[simpy.Event, Any, None]:
    inst = cluster.by_name[name]
    while not stop():
        yield daemons.sleep(float(rng.exponential(f.mtbf_s)))
        if stop():
            return
        cluster.fail_instance(inst)
        yield env.timeout(float(rng.exponential(f.mttr_s)))
        cluster.recover_instance(inst)
