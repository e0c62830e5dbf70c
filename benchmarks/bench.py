"""Speed benchmarks: simulated requests per wall-second, events per second, peak memory.

Run ``python benchmarks/bench.py`` (all scenarios) or ``--only b`` (one), ``--json FILE`` to
keep the figures for comparison between commits, ``--compare OLD.json`` to print the change
against them. Each scenario runs in a fresh process so its peak memory (max RSS) is its own.

Next to each run the same process measures a bare-Python reference loop (a fixed
event-heap simulation of known size, :func:`reference_loop`). Both are timed in CPU
seconds of the process (``time.process_time``), which other processes on a shared machine
inflate far less than wall seconds; the ratio ``cpu / ref`` says how many reference loops
the scenario costs, and ``req/ref`` how many requests it simulates per reference loop,
which compare across machines and loads better than seconds do. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRACE = str(REPO / "scenarios" / "traces" / "azure_llm_2023_conv.csv")

CONV_LENGTHS = {
    "input_tokens": {"kind": "lognormal", "mean_tokens": 1155, "cv": 0.9, "max_tokens": 8192},
    "output_tokens": {"kind": "lognormal", "mean_tokens": 211, "cv": 1.0, "max_tokens": 2048},
}


def _pool(name: str, role: str, model_tp: int, instances: int = 1) -> dict[str, Any]:
    return {"name": name, "role": role, "device": "H100-SXM", "instances": instances,
            "parallelism": {"tp": model_tp},
            "scheduler": {"max_num_seqs": 256, "max_num_batched_tokens": 8192}}


SCENARIOS: dict[str, dict[str, Any]] = {
    "a": {
        "title": "(a) colocated Llama-3.1-8B, 1xH100, Poisson 8 req/s, 20k requests",
        "scenario": {
            "name": "bench-a", "model": "Llama-3.1-8B",
            "workload": {"arrival": {"kind": "poisson", "rate_per_s": 8.0}, **CONV_LENGTHS,
                         "num_requests": 20_000},
            "cluster": {"pools": [_pool("main", "colocated", 1)]},
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        },
    },
    "b": {
        "title": "(b) 1P1D Llama-3.1-70B, H100 TP4, Poisson 4 req/s, 50k requests",
        "scenario": {
            "name": "bench-b", "model": "Llama-3.1-70B",
            "workload": {"arrival": {"kind": "poisson", "rate_per_s": 4.0}, **CONV_LENGTHS,
                         "num_requests": 50_000},
            "cluster": {"pools": [_pool("prefill", "prefill", 4), _pool("decode", "decode", 4)]},
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        },
    },
    "c": {
        "title": "(c) 32P+32D Llama-3.1-70B H100 TP4 (64 instances), 128 req/s, 1M requests",
        "scenario": {
            "name": "bench-c", "model": "Llama-3.1-70B",
            "workload": {"arrival": {"kind": "poisson", "rate_per_s": 128.0}, **CONV_LENGTHS,
                         "num_requests": 1_000_000},
            "cluster": {"pools": [_pool("prefill", "prefill", 4, 32),
                                  _pool("decode", "decode", 4, 32)],
                        "router": {"policy": "least_tokens", "decode_policy": "least_kv"}},
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        },
    },
    "e": {
        "title": "(e) 24-hour replay at the Azure conversation trace's rate: 1P1D Llama-3.1-70B, "
                 "5 req/s for 86,400 s",
        "scenario": {
            "name": "bench-e", "model": "Llama-3.1-70B",
            # The Azure LLM conversation trace (2023) carries about 5.4 requests/s; its
            # lengths are those of CONV_LENGTHS. A day at that rate, Poisson.
            "workload": {"arrival": {"kind": "poisson", "rate_per_s": 5.0}, **CONV_LENGTHS,
                         "duration_s": 86_400.0},
            "cluster": {"pools": [_pool("prefill", "prefill", 4), _pool("decode", "decode", 4)]},
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        },
    },
}

REFERENCE_EVENTS = 200_000
"""Events of the reference loop: about 0.06 s of bare Python on this project's 2-core machine."""


def reference_loop(events: int = REFERENCE_EVENTS) -> float:
    """CPU seconds of a fixed pure-Python discrete-event loop (an M/M/1 queue on a heap).

    Deterministic (a linear congruential generator, no library randomness), the same work
    on every machine: ``events`` heap pops, each scheduling one or two events, with the
    float arithmetic and small-object churn of a simulator's hot path. The best of three
    runs is returned, so a momentary stall does not count.
    """
    import heapq

    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        state = 12345
        heap: list[tuple[float, int, int]] = [(0.0, 0, 0)]
        seq = 1
        queue = 0
        busy = False
        served = 0
        for _ in range(events):
            now, _seq, kind = heapq.heappop(heap)
            state = (state * 1103515245 + 12345) & 0x7FFFFFFF
            gap = -math.log((state + 1) / 2147483649.0)
            if kind == 0:  # arrival: schedule the next one; start service if idle
                heapq.heappush(heap, (now + gap * 1.25, seq, 0))
                seq += 1
                if busy:
                    queue += 1
                else:
                    busy = True
                    heapq.heappush(heap, (now + gap, seq, 1))
                    seq += 1
            else:  # departure
                served += 1
                if queue:
                    queue -= 1
                    heapq.heappush(heap, (now + gap, seq, 1))
                    seq += 1
                else:
                    busy = False
        best = min(best, time.process_time() - t0)
        if served <= 0:  # pragma: no cover - keeps the loop's result alive
            raise AssertionError("reference loop served nothing")
    return best


SWEEP_TITLE = ("(d) {runs:,}-run sweep: Llama-3.1-8B 1xH100, 10 rates x {seeds} seeds, 300 requests "
               "each")


def _one(key: str, requests: int | None) -> dict[str, Any]:
    from simulator.runner.run import run
    from simulator.scenario.schema import Scenario

    spec = SCENARIOS[key]["scenario"]
    sc = Scenario.model_validate(spec)
    if requests is not None:
        sc = sc.with_(**{"workload.num_requests": requests})
    t0, c0 = time.perf_counter(), time.process_time()
    res = run(sc)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(res.requests)
    return {"requests": n, "wall_s": wall, "cpu_s": cpu, "sim_wall_s": res.wall_s, "events": res.sim_events,
            "steps": res.num_steps, "completed": res.summary["completed"],
            "simulated_s": float(res.summary["duration_s"])}


def _sweep(workers: int, seeds: int = 10) -> dict[str, Any]:
    import yaml

    from simulator.runner.sweep import load_sweep, run_sweep

    base = {
        "name": "bench-d", "model": "Llama-3.1-8B",
        "workload": {"arrival": {"kind": "poisson", "rate_per_s": 4.0}, **CONV_LENGTHS,
                     "num_requests": 300},
        "cluster": {"pools": [_pool("main", "colocated", 1)]},
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "base.yaml").write_text(yaml.safe_dump(base))
        (folder / "sweep.yaml").write_text(yaml.safe_dump({
            "name": "bench-d", "base": "base.yaml",
            "grid": {"workload.arrival.rate_per_s": [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]},
            "seeds": list(range(seeds)),
        }))
        t0 = time.perf_counter()
        table = run_sweep(load_sweep(folder / "sweep.yaml"), folder / "out", workers=workers)
        wall = time.perf_counter() - t0
    # The work runs in worker processes: wall time is the figure.
    return {"requests": int(table["num_requests"].sum()), "wall_s": wall, "cpu_s": wall, "runs": len(table),
            "events": float("nan"), "steps": float("nan"), "completed": int(table["completed"].sum())}


def _child(key: str, requests: int | None, workers: int, seeds: int = 10) -> None:
    ref_before = reference_loop()
    out = _sweep(workers, seeds) if key == "d" else _one(key, requests)
    # Before and after the scenario, the better of the two: load may change during a run.
    out["reference_s"] = min(ref_before, reference_loop())
    out["reference_events"] = REFERENCE_EVENTS
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if key == "d":
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        out["peak_rss_mb"] = max(out["peak_rss_mb"], kids)
    print(json.dumps(out))


def _label(key: str, requests: int | None) -> str:
    return key if requests is None else f"{key}@{requests}"


def _measure(key: str, requests: int | None, workers: int, seeds: int = 10) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", key, "--workers", str(workers),
           "--seeds", str(seeds)]
    if requests is not None:
        cmd += ["--requests", str(requests)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(proc.returncode)
    r: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    r["title"] = (SWEEP_TITLE.format(runs=10 * seeds, seeds=seeds) if key == "d"
                  else SCENARIOS[key]["title"])
    r["requests_per_s"] = r["requests"] / r["wall_s"]
    r["events_per_s"] = (r["events"] / r["sim_wall_s"]) if key != "d" else float("nan")
    # Machine-independent figures: the run's CPU time in reference loops, and the
    # requests simulated per reference loop.
    r["cpu_per_reference"] = r["cpu_s"] / r["reference_s"]
    r["requests_per_reference"] = r["requests"] / r["cpu_per_reference"]
    return r


def _compare(results: dict[str, dict[str, Any]], old_file: Path) -> None:
    """Before/after per scenario: requests per reference loop, and its change."""
    from rich.console import Console
    from rich.table import Table

    old = json.loads(old_file.read_text())["results"]
    table = Table(title=f"against {old_file}")
    for col in ("scenario", "req/ref before", "req/ref now", "speed-up (ref)",
                "req/s before", "req/s now", "peak MB before", "peak MB now"):
        table.add_column(col, justify="right" if col != "scenario" else "left")
    for label, now in results.items():
        was = old.get(label)
        if was is None or "requests_per_reference" not in was:
            table.add_row(label, "-", f"{now['requests_per_reference']:,.0f}", "-", "-",
                          f"{now['requests_per_s']:,.0f}", "-", f"{now['peak_rss_mb']:,.0f}")
            continue
        table.add_row(label, f"{was['requests_per_reference']:,.0f}",
                      f"{now['requests_per_reference']:,.0f}",
                      f"{now['requests_per_reference'] / was['requests_per_reference']:.2f}x",
                      f"{was['requests_per_s']:,.0f}", f"{now['requests_per_s']:,.0f}",
                      f"{was['peak_rss_mb']:,.0f}", f"{now['peak_rss_mb']:,.0f}")
    Console(width=160).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", action="append", choices=["a", "b", "c", "d", "e"],
                        help="run only these scenarios (repeatable)")
    parser.add_argument("--requests", type=int, action="append", default=None,
                        help="override the request count of a/b/c/e; repeat for a scaling "
                             "series (--requests 10000 --requests 100000)")
    parser.add_argument("--workers", type=int, default=2, help="processes for the sweep (d)")
    parser.add_argument("--seeds", type=int, default=10,
                        help="seeds per arrival rate of the sweep (d): 10 rates x 10 seeds by "
                             "default; 100 runs the whole 1,000-configuration sweep")
    parser.add_argument("--json", type=Path, default=None, help="write results as JSON")
    parser.add_argument("--compare", type=Path, default=None, metavar="REF.json",
                        help="print the change against an earlier --json file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.requests[0] if args.requests else None, args.workers,
               args.seeds)
        return 0
    from rich.console import Console
    from rich.table import Table

    keys = args.only or ["a", "b", "c", "d"]
    counts: list[int | None] = list(args.requests) if args.requests else [None]
    results: dict[str, dict[str, Any]] = {}
    table = Table(title="disagg-sim benchmarks")
    for col in ("scenario", "requests", "wall s", "cpu s", "ref s", "cpu/ref", "requests/s",
                "req/ref", "events/s", "steps", "peak MB"):
        table.add_column(col, justify="right" if col != "scenario" else "left")
    for key in keys:
        for n in counts if key != "d" else [None]:
            r = _measure(key, n, args.workers, args.seeds)
            label = _label(key, n)
            results[label] = r
            table.add_row(
                r["title"] if n is None else f"{r['title']} [{n:,}]", f"{r['requests']:,}",
                f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}", f"{r['reference_s']:.3f}",
                f"{r['cpu_per_reference']:,.1f}", f"{r['requests_per_s']:,.0f}",
                f"{r['requests_per_reference']:,.0f}",
                "-" if r["events_per_s"] != r["events_per_s"] else f"{r['events_per_s']:,.0f}",
                "-" if key == "d" else f"{r['steps']:,}", f"{r['peak_rss_mb']:,.0f}")
    Console(width=200).print(table)
    if args.compare:
        _compare(results, args.compare)
    if args.json:
        meta = {"python": platform.python_version(), "machine": platform.machine(),
                "processor": platform.processor(), "date": time.strftime("%Y-%m-%d"),
                "load_average": list(os.getloadavg()),
                "reference_events": REFERENCE_EVENTS}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
