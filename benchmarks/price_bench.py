"""Micro-benchmark of first-time step pricing: the shapes a run prices, priced again cold.

Runs a benchmark scenario of bench.py (``--only a``, ``b``, ...) once at a small size,
recording every batch shape its instances price with ``InstanceCostModel.step`` (prefill
shapes kept between steps are asked once, mixed and decode shapes nearly always once), then
prices the same stream again on a fresh copy of each cost model (nothing remembered), best
of ``--repeat`` rounds, in CPU seconds, next to bench.py's bare-Python reference loop.

``--save FILE`` writes the prices (every ``StepCost`` field and ``breakdown``) as a pickle;
``--check FILE`` prices the stream again and reports any price that is not bit-identical
to the saved one (to compare two commits: save on one, check on the other).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench

from simulator.cost.batch import BatchShape
from simulator.cost.step import InstanceCostModel
from simulator.runner.run import run
from simulator.scenario.schema import Scenario


def record(key: str, requests: int) -> list[tuple[InstanceCostModel, list[BatchShape]]]:
    """The shapes each distinct cost model of scenario ``key`` prices, in order."""
    streams: dict[int, tuple[InstanceCostModel, list[BatchShape]]] = {}
    original = InstanceCostModel.step

    def step(self: InstanceCostModel, batch: BatchShape) -> Any:
        streams.setdefault(id(self), (self, []))[1].append(batch)
        return original(self, batch)

    scenario = Scenario.model_validate(bench.SCENARIOS[key]["scenario"]).with_(
        **{"workload.num_requests": requests})
    InstanceCostModel.step = step  # type: ignore[method-assign]
    try:
        run(scenario)
    finally:
        InstanceCostModel.step = original  # type: ignore[method-assign]
    return list(streams.values())


def fresh(cost: InstanceCostModel) -> InstanceCostModel:
    """A copy of ``cost`` with nothing remembered (built again from its fields)."""
    return type(cost)(**{f: getattr(cost, f) for f in cost.__dataclass_fields__})


def prices(streams: list[tuple[InstanceCostModel, list[BatchShape]]]) -> list[Any]:
    out: list[Any] = []
    for cost, shapes in streams:
        model = fresh(cost)
        out.append([(model.step(s), model.breakdown(s)) for s in shapes])
    return out


def time_pricing(streams: list[tuple[InstanceCostModel, list[BatchShape]]],
                 repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        models = [(fresh(cost), shapes) for cost, shapes in streams]
        start = time.process_time()
        for model, shapes in models:
            step = model.step
            for shape in shapes:
                step(shape)
        best = min(best, time.process_time() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", action="append", choices=["a", "b", "c"], default=None)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--save", type=Path, default=None)
    parser.add_argument("--check", type=Path, default=None)
    args = parser.parse_args(argv)
    saved: dict[str, Any] = {}
    checked = pickle.loads(args.check.read_bytes()) if args.check else {}
    bad = 0
    for key in args.only or ["a", "b"]:
        streams = record(key, args.requests)
        shapes = sum(len(s) for _, s in streams)
        ref = bench.reference_loop()
        seconds = time_pricing(streams, args.repeat)
        print(f"({key}) {args.requests} requests: {shapes} shapes priced in {seconds:.3f} CPU s "
              f"({seconds / shapes * 1e6:.1f} us each, {seconds / ref:.2f} reference loops)")
        if args.save or args.check:
            got = prices(streams)
            saved[key] = got
            if args.check:
                want = checked[key]
                diff = sum(a != b for g, w in zip(got, want, strict=True)
                           for a, b in zip(g, w, strict=True))
                bad += diff
                print(f"({key}) prices differing from {args.check}: {diff}")
    if args.save:
        args.save.write_bytes(pickle.dumps(saved))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
