"""The figures of docs/operations.md, from the shipped scenarios in scenarios/operations/.

``python -m simulator.docs_operations`` runs every experiment of that page and prints
its tables in the page's Markdown (a few minutes on one core); ``--only mooncake`` (or
``failure``, ``bursty``) runs one section. Each run is the one the page's
``disagg-sim`` command line performs: the shipped scenario with the ``--set`` overrides
shown next to its row.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulator.runner.result import RunResult
from simulator.runner.run import Simulation, run
from simulator.scenario.load import load_scenario, scenario_dir

OPS = Path(__file__).resolve().parents[1] / "scenarios" / "operations"
MOONCAKE_TRACE = OPS.parent / "traces" / "mooncake_conversation_trace.jsonl"


def _run(name: str, sets: dict[str, Any] | None = None) -> RunResult:
    path = OPS / name
    sc = load_scenario(path)
    if sets:
        sc = sc.with_(**sets)
    return run(sc, base_dir=scenario_dir(path), file=str(path))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


# ----- a decode instance dies -----------------------------------------------------------
def decode_failure() -> list[str]:
    res = _run("decode_failure.yaml")
    pools = res.monitoring(15.0)
    dec = pools[pools["pool"] == "decode"].set_index("time_s")
    out = ["| interval start (s) | decode running | decode KV use | completed | mean TTFT (ms) "
           "| mean TPOT (ms) | restarts |", "|---|---|---|---|---|---|---|"]
    for t in (210, 225, 240, 255, 300, 345, 360, 375):
        r: dict[Any, Any] = dec.loc[float(t)].to_dict()
        out.append(f"| {t} | {r['running']:.0f} | {r['kv_usage'] * 100:.1f} % | "
                   f"{r['completed']:.0f} | {_ms(r['ttft_mean_s'])} | "
                   f"{_ms(r['tpot_mean_s'])} | "
                   f"{r['restarts']:.0f} |")
    s = res.summary
    out.append(f"\ntotals: {s['completed']:,} of {s['num_requests']:,} completed, "
               f"{s['failed']} failed, {s['retries']} retries, SLO attainment "
               f"{s['slo_attainment'] * 100:.1f} %; TTFT p90 {_ms(s['ttft_p90_s'])} ms, "
               f"TPOT p90 {_ms(s['tpot_p90_s'])} ms")
    return out


# ----- autoscaling under bursts -----------------------------------------------------------
def _bursty_row(label: str, res: RunResult) -> str:
    s = res.summary
    scale_outs = int((res.events["kind"] == "scale_out").sum()) if len(res.events) else 0
    return (f"| {label} | {s['num_requests']:,} | {s['device_hours']:.3f} | "
            f"{s['cost_usd_powered']:.2f} | {s['slo_attainment'] * 100:.1f} | "
            f"{s['goodput']:.2f} | {_ms(s['ttft_p90_s'])} | {s['tpot_p90_s'] * 1000:.1f} | "
            f"{scale_outs} |")


AUTOSCALE = "cluster.pools.main.autoscale"
POLICIES: dict[str, dict[str, Any]] = {
    "`running` 24/6, one instance per action": {f"{AUTOSCALE}.proportional": False},
    "`queue_length` 1.0/0.05": {f"{AUTOSCALE}.signal": "queue_length",
                                f"{AUTOSCALE}.scale_out_above": 1.0,
                                f"{AUTOSCALE}.scale_in_below": 0.05},
    "`ttft` p90 0.5 s / 0.1 s": {f"{AUTOSCALE}.signal": "ttft",
                                 f"{AUTOSCALE}.scale_out_above": 0.5,
                                 f"{AUTOSCALE}.scale_in_below": 0.1},
}
SHORT_BURSTS: dict[str, dict[str, Any]] = {
    "2-minute bursts, autoscaled 1-4": {"workload.arrival.on_s": 120},
    "2-minute bursts, autoscaled 2-4": {"workload.arrival.on_s": 120,
                                        f"{AUTOSCALE}.min_instances": 2,
                                        "cluster.pools.main.instances": 2},
}


def cli_overrides(sets: dict[str, Any]) -> str:
    """The ``disagg-sim`` options that make the same run."""
    return " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in sets.items())


def bursty() -> list[str]:
    cold = next(s.cold_start_s for s in Simulation(load_scenario(
        OPS / "bursty_autoscaled.yaml"), OPS).plan.instances)
    out = [f"cold start of Llama-3.1-8B on H100: {cold:.1f} s", "",
           "| fleet | requests | device-hours | $ (powered) | SLO % | goodput req/s "
           "| TTFT p90 ms | TPOT p90 ms | scale-outs |", "|---|---|---|---|---|---|---|---|---|"]
    fixed, auto = _run("bursty_fixed_peak.yaml"), _run("bursty_autoscaled.yaml")
    out.append(_bursty_row("fixed, 3 instances (sized for the peak)", fixed))
    out.append(_bursty_row("autoscaled 1–4, `running`, proportional", auto))
    saved = 1 - auto.summary["device_hours"] / fixed.summary["device_hours"]
    out.append(f"\nautoscaled: {saved * 100:.1f} % fewer device-hours, SLO attainment "
               f"{auto.summary['slo_attainment'] * 100:.1f} % against "
               f"{fixed.summary['slo_attainment'] * 100:.1f} %")
    out += ["", "| policy | device-hours | SLO % | scale-outs | overrides |", "|---|---|---|---|---|"]
    for label, sets in {**POLICIES, **SHORT_BURSTS}.items():
        res = _run("bursty_autoscaled.yaml", sets)
        s = res.summary
        scale_outs = int((res.events["kind"] == "scale_out").sum()) if len(res.events) else 0
        out.append(f"| {label} | {s['device_hours']:.3f} | {s['slo_attainment'] * 100:.1f} | "
                   f"{scale_outs} | `{cli_overrides(sets)}` |")
    return out


# ----- prefix caching on the Mooncake trace ---------------------------------------------
MOONCAKE: dict[str, dict[str, Any]] = {
    "cache + `prefix_affinity`": {},
    "cache + `least_outstanding`": {"cluster.router.policy": "least_outstanding"},
    "cache + `round_robin`": {"cluster.router.policy": "round_robin"},
    "no cache (`prefix_affinity`: least prefill work)": {
        "cluster.pools.main.scheduler.prefix_caching": False},
    "no cache, `least_outstanding`": {"cluster.pools.main.scheduler.prefix_caching": False,
                                      "cluster.router.policy": "least_outstanding"},
    "cache + affinity on 4 × H100, bf16 KV": {"cluster.pools.main.device": "H100-SXM",
                                              "precision.kv_cache": "bf16"},
}


def ideal_hit_rate(until_ms: float | None = None) -> tuple[int, float]:
    """Requests and prompt-token hit rate of the trace against an unbounded cache: a
    request hits the leading blocks whose hashes an earlier request carried, computing
    at least one token (as the simulator does)."""
    seen: set[int] = set()
    hit = total = n = 0
    with MOONCAKE_TRACE.open() as f:
        for line in f:
            row = json.loads(line)
            if until_ms is not None and row["timestamp"] >= until_ms:
                break
            k = 0
            for h in row["hash_ids"]:
                if h not in seen:
                    break
                k += 1
            hit += min(k * 512, row["input_length"] - 1)
            total += row["input_length"]
            seen.update(row["hash_ids"])
            n += 1
    return n, hit / total


def mooncake() -> list[str]:
    out = ["| configuration | prefix hit rate | prefill tokens saved | prefill s saved | "
           "TTFT mean ms | TTFT p90 ms | TPOT p90 ms | overrides |",
           "|---|---|---|---|---|---|---|---|"]
    for label, sets in MOONCAKE.items():
        s = _run("prefix_caching_mooncake.yaml", sets).summary
        out.append(f"| {label} | {s['prefix_hit_rate'] * 100:.1f} % | "
                   f"{s['prefill_tokens_saved']:,} | {s['prefill_seconds_saved']:.0f} | "
                   f"{_ms(s['ttft_mean_s'])} | {_ms(s['ttft_p90_s'])} | "
                   f"{s['tpot_p90_s'] * 1000:.1f} | `{cli_overrides(sets)}` |")
    plan = Simulation(load_scenario(OPS / "prefix_caching_mooncake.yaml"), OPS).plan
    tokens = plan.instances[0].kv_blocks * plan.instances[0].block_size
    n15, rate15 = ideal_hit_rate(900_000)
    n_all, rate_all = ideal_hit_rate()
    out.append(f"\nKV tokens per H200 instance (fp8): {tokens / 1e6:.2f} M; unbounded-cache "
               f"hit rate: {rate15 * 100:.1f} % over the first 15 min ({n15:,} requests), "
               f"{rate_all * 100:.1f} % over the whole trace ({n_all:,} requests)")
    return out


SECTIONS: dict[str, Callable[[], list[str]]] = {
    "failure": decode_failure, "bursty": bursty, "mooncake": mooncake}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append")
    args = parser.parse_args(argv)
    for name in args.only or list(SECTIONS):
        print(f"## {name}\n")
        print("\n".join(SECTIONS[name]()))
        print()


if __name__ == "__main__":
    main()
