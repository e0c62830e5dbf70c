"""Serving measurements against the simulator: one scenario per benchmark point, run, compared.

Rows come from :mod:`simulator.validation.serving_io` (CSV or ``vllm bench serve`` JSON,
format in docs/VALIDATION.md). Each becomes a one-pool colocated
:class:`~simulator.scenario.schema.Scenario` (``dp`` replicas behind the router) run by
:func:`simulator.runner.run`. The client side follows the benchmark tools: a concurrency
means ``vllm bench serve --max-concurrency`` (closed loop: each finished request frees a
slot for the next), no concurrency means every request queued at t = 0 (offline
throughput, ``trtllm-bench``), a request rate means Poisson arrivals. What the client sees
adds the engine profile's frontend round trip (HTTP, tokenisation, detokenisation) to
TTFT and E2E; TPOT and ITL are differences of client timestamps, so it cancels there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.config_io import validate
from simulator.errors import ConfigError
from simulator.hardware.engines import engine_ref, load_engine
from simulator.scenario.schema import Scenario
from simulator.validation.serving_io import MEASURED, read_serving

__all__ = ["GROUPS", "METRICS", "long_errors", "read_serving", "row_scenario",
           "serving_error_table", "simulate_rows"]

# measured column -> (summary key stem, scale to the column's unit, client frontend adds?)
METRICS: dict[str, tuple[str, float, bool]] = {
    "measured_ttft_ms": ("ttft", 1e3, True),
    "measured_tpot_ms": ("tpot", 1e3, False),
    "measured_itl_ms": ("itl", 1e3, False),
    "measured_e2e_ms": ("e2e", 1e3, True),
    "measured_output_tok_s": ("output_token_throughput", 1.0, False),
}
GROUPS = ("engine", "device", "model", "tp", "concurrency")


def _where(row: dict[Any, Any]) -> str:
    if "row" not in row:
        return "row"
    return f"row {int(row['row'])} (line {int(row['line'])})"


def _int(row: dict[Any, Any], col: str, default: int) -> int:
    value = row.get(col)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return default
    return int(value)


def _num(row: dict[Any, Any], col: str) -> float | None:
    value = row.get(col)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def row_scenario(row: dict[Any, Any], file: str | None = None,
                 max_requests: int | None = None, predictor: str = "auto") -> Scenario:
    """The scenario that reproduces one canonical row (validated; errors name the row),
    its steps priced by ``predictor`` (``cost.predictor``)."""
    where = _where(row)
    version = row.get("engine_version")
    ref = engine_ref(str(row["engine"]), version if isinstance(version, str) else None)
    try:
        engine = load_engine(ref)
    except ConfigError as exc:
        raise ConfigError(exc.message, file=file, key=f"{where}.engine_version") from None
    arrival: dict[str, Any] = {"kind": row["arrival"]}
    if row["arrival"] == "closed_loop":
        arrival["concurrency"] = _int(row, "concurrency", 1)
        arrival["turnaround_s"] = engine.frontend.seconds(_int(row, "input_len", 1))
        arrival["turnaround_cv"] = engine.frontend.jitter_cv
        arrival["warmup_requests"] = _int(row, "warmup_requests", 0)
        arrival["ramp_s"] = _num(row, "concurrency_ramp_s") or 0.0
    elif row["arrival"] == "poisson":
        arrival["rate_per_s"] = _num(row, "request_rate")
    requests = _int(row, "num_requests", 1000)
    if max_requests is not None:
        requests = min(requests, max_requests)
    # Offline rows ran the engine's Python entry point (vllm bench latency / throughput,
    # trtllm-bench), which has its own default limits.
    scheduler: dict[str, Any] = {
        "entry_point": "offline" if row["arrival"] == "all_at_once" else "api_server"}
    # Attention data parallelism (TensorRT-LLM ``enable_attention_dp``, SGLang
    # ``--enable-dp-attention``): the tp ranks each hold their own requests and KV, the
    # experts run expert-parallel over all of them; the engine's batch limits are per rank.
    tp = _int(row, "tp", 1)
    dp_attention = row.get("attention_dp")
    ranks = tp if isinstance(dp_attention, (bool, np.bool_)) and dp_attention else 1
    for col in ("max_num_seqs", "max_num_batched_tokens"):
        if _num(row, col) is not None:
            scheduler[col] = _int(row, col, 0) * ranks
    if isinstance(row.get("chunked_prefill"), (bool, np.bool_)):
        scheduler["chunked_prefill"] = bool(row["chunked_prefill"])
    if _num(row, "memory_utilization") is not None:
        scheduler["memory_utilization"] = _num(row, "memory_utilization")
    data = {
        "name": f"serving-{where.split(' (')[0].replace(' ', '-')}",
        "seed": _int(row, "seed", 0),
        "model": str(row["model"]),
        "engine": ref,
        "precision": {"weights": row["precision"], "activations": row["precision"],
                      "kv_cache": row["kv_precision"]},
        "workload": {
            "arrival": arrival,
            "input_tokens": {"kind": "fixed", "tokens": _int(row, "input_len", 1)},
            "output_tokens": {"kind": "fixed", "tokens": _int(row, "output_len", 1)},
            "num_requests": requests,
        },
        "cluster": {"pools": [{
            "name": "main", "device": str(row["device"]), "instances": _int(row, "dp", 1),
            "parallelism": {"tp": tp // ranks, "pp": _int(row, "pp", 1),
                            "ep": _int(row, "ep", 1), "dp": ranks},
            "scheduler": scheduler,
        }]},
        "cost": {"predictor": predictor},
    }
    return validate(Scenario, data, file=file, prefix=where)


def _simulation(scenario: Scenario, row: dict[Any, Any], file: str | None) -> Any:
    from simulator.runner.run import Simulation

    try:
        return Simulation(scenario, file=file)
    except ConfigError as exc:
        key = _where(row) + (f".{exc.key}" if exc.key else "")
        raise ConfigError(exc.message, file=file, key=key) from None


def check_rows(df: pd.DataFrame, file: str | None = None, predictor: str = "auto") -> None:
    """Build every row's simulation, so every problem surfaces before the first run."""
    for row in df.to_dict("records"):
        _simulation(row_scenario(row, row.get("file", file), predictor=predictor), row,
                    row.get("file", file))


def predict(summary: dict[str, Any], statistic: str, frontend_s: float) -> dict[str, float]:
    """The client-visible figures of a run's summary, in the measured columns' units."""
    out = {}
    for col, (stem, scale, client) in METRICS.items():
        if stem == "output_token_throughput":
            value = float(summary[stem])
        else:
            value = float(summary[f"{stem}_{'p50' if statistic == 'median' else 'mean'}_s"])
            value += frontend_s if client else 0.0
        out["predicted" + col.removeprefix("measured")] = value * scale
    return out


def simulate_rows(df: pd.DataFrame, *, file: str | None = None,
                  max_requests: int | None = None, predictor: str = "auto") -> pd.DataFrame:
    """Every row with its predictions: the input columns plus ``predicted_*`` (wide), and
    which predictor priced its steps (``cost_predictor``)."""
    check_rows(df, file, predictor)
    out: list[dict[Any, Any]] = []
    for row in df.to_dict("records"):
        src = row.get("file", file)
        scenario = row_scenario(row, src, max_requests, predictor)
        wall0 = time.perf_counter()
        result = _simulation(scenario, row, src).run()
        engine = load_engine(scenario.engine)
        summary = result.summary
        preds = predict(summary, str(row.get("statistic", "mean")),
                        engine.frontend.seconds(_int(row, "input_len", 1)))
        out.append({**row, "engine_profile": scenario.engine,
                    "simulated_requests": scenario.workload.num_requests, **preds,
                    "cost_predictor": summary["cost_predictor"],
                    "completed": summary["completed"], "preemptions": summary["preemptions"],
                    "wall_s": round(time.perf_counter() - wall0, 3)})
    return pd.DataFrame(out)


def long_errors(wide: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, measured metric): measured, predicted, signed error and APE."""
    rows = []
    for r in wide.to_dict("records"):
        for col in MEASURED:
            measured = r.get(col)
            if measured is None or (isinstance(measured, float) and math.isnan(measured)):
                continue
            predicted = float(r["predicted" + col.removeprefix("measured")])
            err = predicted / float(measured) - 1.0
            rows.append({**{k: r.get(k) for k in ("file", "row", "line", *GROUPS, "input_len",
                                                   "output_len", "split", "precision")},
                         "metric": col.removeprefix("measured_"), "measured": float(measured),
                         "predicted": predicted, "error": err, "ape": abs(err)})
            rows[-1]["concurrency"] = _load_label(r)
    return pd.DataFrame(rows)


def _load_label(row: dict[Any, Any]) -> str:
    """How a point was loaded, for the tables' concurrency column: the closed-loop
    concurrency, the Poisson rate (``"2 req/s"``), or ``"offline"`` (all at once)."""
    concurrency, rate = _num(row, "concurrency"), _num(row, "request_rate")
    if concurrency is not None:
        return str(int(concurrency))
    if row.get("arrival") == "poisson" and rate is not None:
        return f"{rate:g} req/s"
    return "offline"


def serving_error_table(errors: pd.DataFrame, by: Sequence[str] = ("engine",)) -> pd.DataFrame:
    """Per metric and group: count, median and p90 APE, median signed error (percent)."""
    rows = []
    keys = ["metric", *by]
    for values, grp in errors.groupby(keys, sort=True):
        ape = grp["ape"].to_numpy(dtype=float)
        rows.append({**dict(zip(keys, values, strict=True)), "count": len(grp),
                     "median_ape_pct": float(np.median(ape) * 100),
                     "p90_ape_pct": float(np.percentile(ape, 90) * 100),
                     "bias_pct": float(np.median(grp["error"]) * 100)})
    return pd.DataFrame(rows)


def load_rows(paths: Sequence[str | Path], defaults: dict[str, Any] | None = None) -> pd.DataFrame:
    return read_serving(list(paths), defaults)
