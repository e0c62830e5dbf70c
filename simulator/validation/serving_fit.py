"""Fit one host-cost constant of an engine profile on the declared calibration set.

End-to-end constants (host time per step or per sequence) are the only figures fitted on
serving measurements, and only on ``scenarios/validation/serving_calibration.csv``: a
short, declared list of public points, each with its source. Everything else a serving
CSV holds is validation and is reported apart from it (docs/VALIDATION.md).

The fit is one scalar per engine: the value of ``parameter`` (e.g. ``step_overhead_us``)
that makes the median signed error of the engine's calibration rows zero, found by
bisection (the errors grow monotonically with a host cost). It prints the value; the
profile YAML records it with ``calibrated_on`` naming the file.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from simulator.hardware.engines import load_engine
from simulator.validation.serving import long_errors, simulate_rows
from simulator.validation.serving_io import read_serving

FITTED = {"vllm": "step_overhead_us", "trtllm": "per_sequence_overhead_us"}


def median_error(rows: pd.DataFrame, engine: str, parameter: str, value: float,
                 folder: Path) -> float:
    """Median signed error of ``rows`` when the engine profile's ``parameter`` = value."""
    data: dict[str, Any] = load_engine(engine).model_dump(mode="json")
    data[parameter] = float(value)
    path = folder / f"{engine}-{parameter}-{value:.6g}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    trial = rows.assign(engine=str(path), engine_version=None)
    return float(np.median(long_errors(simulate_rows(trial))["error"]))


def fit(rows: pd.DataFrame, engine: str, parameter: str, lo: float = 0.0, hi: float = 2000.0,
        tol: float = 1.0) -> float:
    """Bisection on ``[lo, hi]`` for a zero median signed error (the nearer bound if the
    error does not change sign). Latency errors grow with a host cost, throughput errors
    shrink; only the sign change matters."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        e_lo = median_error(rows, engine, parameter, lo, folder)
        e_hi = median_error(rows, engine, parameter, hi, folder)
        if e_lo * e_hi > 0:
            return lo if abs(e_lo) <= abs(e_hi) else hi
        while hi - lo > tol:
            mid = (lo + hi) / 2
            e_mid = median_error(rows, engine, parameter, mid, folder)
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
    for engine, parameter in FITTED.items():
        rows = df[df["engine"] == engine]
        if len(rows):
            value = fit(rows, engine, parameter)
            print(f"{engine}: {parameter} = {value:.0f} ({len(rows)} calibration rows)")


if __name__ == "__main__":
    main()
