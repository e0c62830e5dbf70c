"""Per-pool autoscaling: a policy looks at a load signal every interval and powers
instances on (after a cold start) or drains them (no new work; off once idle).

Its ticks and drain polls are daemons (:mod:`simulator.engine.daemons`): they never keep
a stalled run going.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from simulator.engine.cluster import Cluster
from simulator.engine.config import AutoscaleSpec
from simulator.engine.daemons import Daemons
from simulator.engine.instance import Instance


def pool_signal(kind: str, instances: list[Instance]) -> float:
    """The scaling signal of a pool's serving instances (and drain their samples)."""
    serving = [x for x in instances if x.accepting]
    if kind in ("ttft", "tpot"):
        samples: list[float] = []
        for x in instances:
            samples.extend(x.take_signals(kind))
        if not samples:
            return 0.0
        return float(np.percentile(samples, 90)) if kind == "ttft" else float(np.mean(samples))
    if not serving:
        return float("inf")  # nothing serves: any load is too much
    if kind == "queue_length":
        return float(np.mean([x.num_waiting for x in serving]))
    if kind == "running":
        return float(np.mean([x.num_running + x.reserved for x in serving]))
    if kind == "kv_usage":
        return float(np.mean([x.kv_load for x in serving]))
    raise ValueError(f"unknown scaling signal {kind!r}")


class Autoscaler:
    def __init__(self, env: simpy.Environment, cluster: Cluster, pool: str,
                 spec: AutoscaleSpec, cold_start_s: float, stop: Callable[[], bool],
                 daemons: Daemons) -> None:
        self.env = env
        self.daemons = daemons
        self.cluster = cluster
        self.pool = pool
        self.spec = spec
        self.cold_start_s = cold_start_s
        self.stop = stop
        self.instances = [x for x in cluster.instances if x.pool == pool]
        self.starting: set[int] = set()
        for x in self.instances:
            x.collect_signals()
        daemons.add_rescuer(self)
        env.process(self._loop())

    def could_rescue(self) -> bool:
        """An instance of this pool that is off could take a request waiting for one."""
        off = [x for x in self.instances if not x.active and x.index not in self.starting]
        if not off:
            return False
        waiting = (self.cluster.handoff.pending_requests() if off[0].role == "decode"
                   else list(self.cluster.pending_entry))
        return any(x.can_ever_hold(req) for req in waiting for x in off)

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        spec, env = self.spec, self.env
        last_action = -float("inf")
        while not self.stop():
            yield self.daemons.sleep(spec.interval_s)
            signal = pool_signal(spec.signal, self.instances)
            if env.now - last_action < spec.cooldown_s:
                continue
            powered = [x for x in self.instances if x.active or x.index in self.starting]
            serving = [x for x in self.instances if x.accepting]
            if signal > spec.scale_out_above and len(powered) < spec.max_instances:
                add = 1
                if spec.proportional and powered and signal != float("inf"):
                    want = math.ceil(len(powered) * signal / spec.scale_out_above)
                    add = max(1, want - len(powered))
                add = min(add, spec.max_instances - len(powered))
                for off in [x for x in self.instances
                            if not x.active and x.index not in self.starting][:add]:
                    self.starting.add(off.index)
                    off.power(True)
                    self.cluster.recorder.event(env.now, "scale_out",
                                                f"{off.name} (signal {signal:.4g})")
                    env.process(self._start(off))
                last_action = env.now
                self.daemons.acted()
            elif signal < spec.scale_in_below and len(serving) > spec.min_instances:
                victim = min(serving, key=lambda x: (x.outstanding, -x.index))
                victim.drain()
                self.cluster.recorder.event(env.now, "scale_in",
                                            f"{victim.name} (signal {signal:.4g})")
                env.process(self._drain(victim))
                last_action = env.now
                self.daemons.acted()
            else:
                self.daemons.quiet(self)

    def _start(self, inst: Instance) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(self.cold_start_s)
        self.starting.discard(inst.index)
        inst.start_serving()
        self.cluster.recorder.event(self.env.now, "instance_ready", inst.name)
        self.cluster.flush_pending()

    def _drain(self, inst: Instance) -> Generator[simpy.Event, Any, None]:
        while not inst.idle:
            yield self.daemons.sleep(min(1.0, self.spec.interval_s))
        if inst.draining:
            inst.switch_off()
            self.cluster.recorder.event(self.env.now, "instance_off", inst.name)
