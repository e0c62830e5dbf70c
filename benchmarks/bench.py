"""Speed benchmarks: simulated requests per wall-second, events per second, peak memory.

Run ``python benchmarks/bench.py`` (all scenarios) or ``--only b`` (one), ``--json FILE`` to
keep the figures for comparison between commits. Each scenario runs in a fresh process so
its peak memory (max RSS) is its own. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
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
}

SWEEP = {
    "title": "(d) 100-run sweep: Llama-3.1-8B 1xH100, 10 rates x 10 seeds, 300 requests each",
}


def _one(key: str, requests: int | None) -> dict[str, Any]:
    from simulator.runner.run import run
    from simulator.scenario.schema import Scenario

    spec = SCENARIOS[key]["scenario"]
    sc = Scenario.model_validate(spec)
    if requests is not None:
        sc = sc.with_(**{"workload.num_requests": requests})
    t0 = time.perf_counter()
    res = run(sc)
    wall = time.perf_counter() - t0
    n = len(res.requests)
    return {"requests": n, "wall_s": wall, "sim_wall_s": res.wall_s, "events": res.sim_events,
            "steps": len(res.steps), "completed": res.summary["completed"]}


def _sweep(workers: int) -> dict[str, Any]:
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
            "seeds": list(range(10)),
        }))
        t0 = time.perf_counter()
        table = run_sweep(load_sweep(folder / "sweep.yaml"), folder / "out", workers=workers)
        wall = time.perf_counter() - t0
    return {"requests": int(table["num_requests"].sum()), "wall_s": wall, "runs": len(table),
            "events": float("nan"), "steps": float("nan"), "completed": int(table["completed"].sum())}


def _child(key: str, requests: int | None, workers: int) -> None:
    out = _sweep(workers) if key == "d" else _one(key, requests)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if key == "d":
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        out["peak_rss_mb"] = max(out["peak_rss_mb"], kids)
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", action="append", choices=["a", "b", "c", "d"],
                        help="run only these scenarios (repeatable)")
    parser.add_argument("--requests", type=int, default=None,
                        help="override the request count of a/b/c (quick runs)")
    parser.add_argument("--workers", type=int, default=2, help="processes for the sweep (d)")
    parser.add_argument("--json", type=Path, default=None, help="write results as JSON")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.requests, args.workers)
        return 0
    from rich.console import Console
    from rich.table import Table

    keys = args.only or ["a", "b", "c", "d"]
    results = {}
    table = Table(title="disagg-sim benchmarks")
    for col in ("scenario", "requests", "wall s", "requests/s", "events/s", "steps", "peak MB"):
        table.add_column(col, justify="right" if col != "scenario" else "left")
    for key in keys:
        cmd = [sys.executable, __file__, "--child", key, "--workers", str(args.workers)]
        if args.requests is not None:
            cmd += ["--requests", str(args.requests)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            return proc.returncode
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        title = SWEEP["title"] if key == "d" else SCENARIOS[key]["title"]
        r["title"] = title
        r["requests_per_s"] = r["requests"] / r["wall_s"]
        r["events_per_s"] = (r["events"] / r["sim_wall_s"]) if key != "d" else float("nan")
        results[key] = r
        table.add_row(title, f"{r['requests']:,}", f"{r['wall_s']:.2f}",
                      f"{r['requests_per_s']:,.0f}",
                      "-" if r["events_per_s"] != r["events_per_s"] else f"{r['events_per_s']:,.0f}",
                      "-" if key == "d" else f"{r['steps']:,}", f"{r['peak_rss_mb']:,.0f}")
    Console(width=160).print(table)
    if args.json:
        meta = {"python": platform.python_version(), "machine": platform.machine(),
                "processor": platform.processor(), "date": time.strftime("%Y-%m-%d")}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
