"""Fit one host-cost constant of an engine profile on the declared calibration set.

End-to-end constants (host time per step or per sequence) are the only figures fitted on
serving measurements, and only on ``scenarios/validation/serving_calibration.csv``: a
short, declared list of public points, each with its source. Everything else a serving
CSV holds is validation and is reported apart from it (docs/VALIDATION.md).

The calibration rows are grouped by the engine profile that prices them (``engine`` and
``engine_version``, as ``validate-serving`` resolves them). One constant per profile is the
value of its ``parameter`` (e.g. ``step_overhead_us``) that makes the median signed error
of its rows zero, found by bisection (the errors grow monotonically with a host cost).
Where a profile fits as many constants as it has rows (``vllm-0.6``: a per-step and a
per-layer time from two models of 32 and 80 layers), they are solved jointly for a zero
error on every row by Newton steps on finite differences (the simulated batch latency is
affine in host time per step). It prints the values; the profile YAML records them with
``calibrated_on`` naming the file.

A calibration row that measures TTFT calibrates the profile's frontend instead (the time
outside the engine, ``FRONTEND``): its per-prompt-token cost is the value that zeroes the
median TTFT error of those rows, by the same bisection; its other columns fit nothing. The
host constants are fitted on the rows without a TTFT.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import yaml

from simulator.hardware.engines import engine_ref, load_engine
from simulator.validation.serving import long_errors, simulate_rows
from simulator.validation.serving_io import read_serving


class Constant(NamedTuple):
    """One fitted constant of an engine profile: its key, the metric of the rows it zeroes
    (None: every measured value), and the bisection's upper bound and tolerance."""

    parameter: str
    metric: str | None = None
    hi: float = 2000.0
    tol: float = 1.0


FITTED: dict[str, tuple[Constant, ...]] = {
    "vllm": (Constant("step_overhead_us"),),
    "trtllm": (Constant("per_sequence_overhead_us"),),
    "vllm-0.6": (Constant("step_overhead_us"), Constant("per_layer_overhead_us")),
    # The memory outside the KV pool: the saturated row's TPOT says how many requests
    # the pool holds.
    "nim": (Constant("runtime_reserve_gib", "tpot_ms", hi=20.0, tol=0.01),),
}
"""The constants fitted per engine profile (profile name: constants)."""

FRONTEND: dict[str, str] = {"nim": "frontend.per_prompt_token_us"}
"""The frontend constant fitted per engine profile on its calibration rows' TTFT."""


def row_errors(rows: pd.DataFrame, engine: str, values: dict[str, float],
               folder: Path, metric: str | None = None) -> np.ndarray:
    """Signed error of every measured value of ``rows`` when the engine profile's
    parameters take ``values``."""
    data: dict[str, Any] = load_engine(engine).model_dump(mode="json")
    for key, v in values.items():
        *parents, leaf = key.split(".")  # "frontend.per_prompt_token_us": a nested field
        block = data
        for part in parents:
            block = block[part]
        block[leaf] = float(v)
    tag = "-".join(f"{k}-{v:.6g}" for k, v in values.items())
    path = folder / f"{engine}-{tag}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    trial = rows.assign(engine=str(path), engine_version=None)
    errors = long_errors(simulate_rows(trial))
    if metric is not None:
        errors = errors[errors["metric"] == metric]
    return errors["error"].to_numpy(dtype=float)


def median_error(rows: pd.DataFrame, engine: str, parameter: str, value: float,
                 folder: Path, metric: str | None = None) -> float:
    """Median signed error of ``rows`` (of one ``metric``, or all) when the engine
    profile's ``parameter`` = value."""
    return float(np.median(row_errors(rows, engine, {parameter: value}, folder, metric)))


def fit_joint(rows: pd.DataFrame, engine: str, parameters: tuple[str, ...],
              step: float = 100.0, iterations: int = 3) -> dict[str, float]:
    """Constants (>= 0) that zero the error of every measured value of ``rows``, one per
    value: Newton steps with a finite-difference Jacobian, from zero."""
    x = np.zeros(len(parameters))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)

        def errors(at: np.ndarray) -> np.ndarray:
            return row_errors(rows, engine, dict(zip(parameters, at, strict=True)), folder)

        for _ in range(iterations):
            e0 = errors(x)
            if len(e0) != len(parameters):
                raise ValueError(f"{engine}: {len(parameters)} constants need as many "
                                 f"measured values, got {len(e0)}")
            jac = np.column_stack([(errors(x + step * np.eye(len(x))[k]) - e0) / step
                                   for k in range(len(x))])
            x = np.maximum(x - np.linalg.solve(jac, e0), 0.0)
    return dict(zip(parameters, (float(v) for v in x), strict=True))


def fit(rows: pd.DataFrame, engine: str, parameter: str, lo: float = 0.0, hi: float = 2000.0,
        tol: float = 1.0, metric: str | None = None) -> float:
    """Bisection on ``[lo, hi]`` for a zero median signed error (the nearer bound if the
    error does not change sign). Latency errors grow with a host cost, throughput errors
    shrink; only the sign change matters."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        e_lo = median_error(rows, engine, parameter, lo, folder, metric)
        e_hi = median_error(rows, engine, parameter, hi, folder, metric)
        if e_lo * e_hi > 0:
            return lo if abs(e_lo) <= abs(e_hi) else hi
        while hi - lo > tol:
            mid = (lo + hi) / 2
            e_mid = median_error(rows, engine, parameter, mid, folder, metric)
            if e_mid * e_lo > 0:
                lo, e_lo = mid, e_mid
            else:
                hi = mid
    return (lo + hi) / 2


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("csv", type=Path, nargs="?",
                        default=Path("scenarios/validation/serving_calibration.csv"))
    args = parser.parse_args(argv)
    df = read_serving(args.csv)
    refs = [engine_ref(str(e), v if isinstance(v, str) else None)
            for e, v in zip(df["engine"], df["engine_version"], strict=True)]
    timed = (df["measured_ttft_ms"].notna() if "measured_ttft_ms" in df
             else df["engine"].isna()).to_numpy()
    for engine, parameter in FRONTEND.items():
        rows = df[np.array([r == engine for r in refs]) & timed]
        if len(rows):
            value = fit(rows, engine, parameter, hi=50.0, tol=0.01, metric="ttft_ms")
            print(f"{engine}: {parameter} = {value:.2f} ({len(rows)} calibration rows, TTFT)")
    for engine, parameters in FITTED.items():
        rows = df[np.array([r == engine for r in refs]) & ~timed]
        if not len(rows):
            continue
        if len(parameters) == 1:
            const = parameters[0]
            values = {const.parameter: fit(rows, engine, const.parameter, hi=const.hi,
                                           tol=const.tol, metric=const.metric)}
        else:
            values = fit_joint(rows, engine, tuple(c.parameter for c in parameters))
        shown = ", ".join(f"{k} = {v:.{2 if v < 10 else 1}f}" for k, v in values.items())
        print(f"{engine}: {shown} ({len(rows)} calibration rows)")


if __name__ == "__main__":
    main()
