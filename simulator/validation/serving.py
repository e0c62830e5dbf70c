"""Measured serving results: the CSV format, and simulating each row to compare.

One row is one published benchmark point (format in docs/VALIDATION.md): model, device,
TP/PP, serving engine, precision, fixed input/output lengths, how requests arrived
(``all_at_once`` offline throughput, ``closed_loop`` at a concurrency, ``poisson`` at a
rate), the request count, optional scheduler limits, and at least one measured metric
(mean or median TTFT and TPOT in ms, output tokens/s). Each row becomes a one-pool
colocated :class:`~simulator.scenario.schema.Scenario`, run by :func:`simulator.runner.run`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.config_io import validate
from simulator.errors import ConfigError
from simulator.scenario.schema import Scenario

METRICS = {  # CSV column -> (summary key for mean, summary key for median, scale)
    "measured_ttft_ms": ("ttft_mean_s", "ttft_p50_s", 1e3),
    "measured_tpot_ms": ("tpot_mean_s", "tpot_p50_s", 1e3),
    "measured_output_tokens_per_s": ("output_token_throughput", "output_token_throughput", 1.0),
}
REQUIRED = ("model", "device", "input_tokens", "output_tokens", "arrival", "num_requests")
ARRIVALS = ("all_at_once", "closed_loop", "poisson")


def read_serving(path: str | Path) -> pd.DataFrame:
    """Read and check a serving-results CSV (ConfigError naming row and column)."""
    file = str(path)
    try:
        df = pd.read_csv(path, comment="#", skipinitialspace=True)
    except FileNotFoundError:
        raise ConfigError("file not found", file=file) from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ConfigError(f"cannot read CSV ({type(exc).__name__}: {exc})", file=file) from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ConfigError(f"missing column(s) {missing}; see docs/VALIDATION.md for the format",
                          file=file, key="header")
    if not any(c in df.columns for c in METRICS):
        raise ConfigError(f"needs at least one measured column: {', '.join(METRICS)}",
                          file=file, key="header")
    if df.empty:
        raise ConfigError("no rows", file=file)
    for i, row in enumerate(df.to_dict("records")):
        if str(row["arrival"]).strip() not in ARRIVALS:
            raise ConfigError(f"unknown arrival {row['arrival']!r}; allowed: {', '.join(ARRIVALS)}",
                              file=file, key=_key(i, "arrival"))
        kind = str(row["arrival"]).strip()
        needs = {"closed_loop": "concurrency", "poisson": "rate_per_s"}.get(kind)
        if needs and not (_num(row.get(needs)) or 0) > 0:
            raise ConfigError(f"arrival {str(row['arrival']).strip()} needs {needs} > 0",
                              file=file, key=_key(i, needs))
        if not any(_num(row.get(c)) is not None for c in METRICS):
            raise ConfigError(f"no measured value; fill one of {', '.join(METRICS)}",
                              file=file, key=_key(i, "measured_*"))
        for col in METRICS:
            value = row.get(col)
            if col in df.columns and _present(value) and (_num(value) is None or _num(value) <= 0):  # type: ignore[operator]
                raise ConfigError(f"must be a number > 0, got {value!r}", file=file,
                                  key=_key(i, col))
        stat = row.get("statistic")
        if _present(stat) and str(stat).strip() not in ("mean", "median"):
            raise ConfigError("statistic must be mean or median", file=file,
                              key=_key(i, "statistic"))
        _build(row_scenario(row, i, file), i, file)  # every problem surfaces before a run
    return df


def _build(scenario: Scenario, i: int, file: str | None) -> Any:
    """The scenario's simulation, built (profiles, memory fit); errors name the row."""
    from simulator.runner.run import Simulation

    try:
        return Simulation(scenario, file=file)
    except ConfigError as exc:
        where = f"row {i + 1} (line {i + 2})" + (f".{exc.key}" if exc.key else "")
        raise ConfigError(exc.message, file=file, key=where) from None


def _key(i: int, col: str) -> str:
    return f"row {i + 1} (line {i + 2}).{col}"


def _present(value: object) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return str(value).strip() != ""


def _num(value: object) -> float | None:
    if not _present(value):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _text(row: dict[str, Any], col: str, default: str) -> str:
    return str(row[col]).strip() if _present(row.get(col)) else default


def _int(row: dict[str, Any], col: str, default: int | None) -> int | None:
    value = _num(row.get(col))
    return default if value is None else int(value)


def row_scenario(row: dict[Any, Any], i: int = 0, file: str | None = None,
                 max_requests: int | None = None) -> Scenario:
    """The scenario that reproduces one row (validated; errors name the row)."""
    arrival_kind = str(row["arrival"]).strip()
    arrival: dict[str, Any] = {"kind": arrival_kind}
    if arrival_kind == "closed_loop":
        arrival["concurrency"] = _int(row, "concurrency", None)
    elif arrival_kind == "poisson":
        arrival["rate_per_s"] = _num(row.get("rate_per_s"))
    requests = _int(row, "num_requests", None)
    if requests is not None and max_requests is not None:
        requests = min(requests, max_requests)
    precision = _text(row, "precision", "bf16")
    kv = _text(row, "kv_cache_precision", precision)
    scheduler: dict[str, Any] = {}
    for col in ("max_num_seqs", "max_num_batched_tokens"):
        if _present(row.get(col)):
            scheduler[col] = _int(row, col, None)
    if _present(row.get("memory_utilization")):
        scheduler["memory_utilization"] = _num(row.get("memory_utilization"))
    data = {
        "name": f"serving-row-{i + 1}",
        "seed": _int(row, "seed", 0),
        "model": str(row["model"]).strip(),
        "engine": _text(row, "engine", "vllm"),
        "precision": {"weights": precision, "activations": precision, "kv_cache": kv},
        "workload": {
            "arrival": arrival,
            "input_tokens": {"kind": "fixed", "tokens": _int(row, "input_tokens", None)},
            "output_tokens": {"kind": "fixed", "tokens": _int(row, "output_tokens", None)},
            "num_requests": requests,
        },
        "cluster": {"pools": [{
            "name": "main", "device": str(row["device"]).strip(),
            "parallelism": {"tp": _int(row, "tp", 1), "pp": _int(row, "pp", 1)},
            "scheduler": scheduler,
        }]},
    }
    return validate(Scenario, data, file=file, prefix=f"row {i + 1} (line {i + 2})")


def simulate_rows(df: pd.DataFrame, *, file: str | None = None,
                  max_requests: int | None = None) -> pd.DataFrame:
    """Simulate every row; one output row per (input row, measured metric)."""
    out: list[dict[str, Any]] = []
    for i, row in enumerate(df.to_dict("records")):
        scenario = row_scenario(row, i, file, max_requests)
        wall0 = time.perf_counter()
        summary = _build(scenario, i, file).run().summary
        wall = time.perf_counter() - wall0
        median = _present(row.get("statistic")) and str(row["statistic"]).strip() == "median"
        for col, (mean_key, median_key, scale) in METRICS.items():
            measured = _num(row.get(col))
            if measured is None:
                continue
            predicted = float(summary[median_key if median else mean_key]) * scale
            out.append({
                "row": i + 1,
                "model": row["model"], "device": row["device"],
                "engine": scenario.engine, "tp": scenario.cluster.pools[0].parallelism.tp,
                "input_tokens": int(row["input_tokens"]),
                "output_tokens": int(row["output_tokens"]),
                "arrival": scenario.workload.arrival.kind,
                "simulated_requests": scenario.workload.num_requests,
                "metric": col.removeprefix("measured_"),
                "measured": measured, "predicted": predicted,
                "error": predicted / measured - 1.0, "ape": abs(predicted / measured - 1.0),
                "completed": summary["completed"], "preemptions": summary["preemptions"],
                "wall_s": round(wall, 3),
                "source": row.get("source", ""),
            })
    return pd.DataFrame(out)


def serving_error_table(pred: pd.DataFrame) -> pd.DataFrame:
    """Per metric, engine and device: count, median and p90 APE, median signed error."""
    rows = []
    for (metric, engine, device), grp in pred.groupby(["metric", "engine", "device"], sort=True):
        ape = grp["ape"].to_numpy(dtype=float)
        rows.append({"metric": metric, "engine": engine, "device": device, "count": len(grp),
                     "median_ape_pct": float(np.median(ape) * 100),
                     "p90_ape_pct": float(np.percentile(ape, 90) * 100),
                     "median_error_pct": float(np.median(grp["error"]) * 100)})
    return pd.DataFrame(rows)
