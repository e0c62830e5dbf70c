"""The engines' measured all-reduce as device-profile curves (:mod:`simulator.validation.kernel_fit`).

Reads only ``custom_allreduce_perf.parquet`` of one engine's tables.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.cost.collectives import allreduce_time
from simulator.cost.operators import RESIDUAL_BYTES
from simulator.hardware.operator_fits import CollectiveCurve, lower_envelope
from simulator.hardware.profiles import DeviceProfile
from simulator.hardware.registry import load_link


def _ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.abs(pred / meas - 1) * 100


def knot_errors(curve: CollectiveCurve, log_log: bool = False) -> np.ndarray:
    """APE (%) of each interior knot predicted from the others, with the curve's own rule
    (:meth:`CollectiveCurve.seconds`: linear in the size on the lower envelope) or, with
    ``log_log``, the earlier one (straight lines in log size and log time between the
    measured knots). Reads the knots only: the rule was chosen on these errors, never on the
    held-out sizes."""
    sizes, times = (np.array([p[i] for p in curve.points]) for i in (0, 1))
    errors = []
    for i in range(1, len(sizes) - 1):
        rest, rest_t = np.delete(sizes, i), np.delete(times, i)
        if log_log:
            got = math.exp(np.interp(math.log(sizes[i]), np.log(rest), np.log(rest_t)))
        else:
            got = float(np.interp(sizes[i], rest, lower_envelope(rest_t)))
        errors.append(abs(got / times[i] - 1) * 100)
    return np.array(errors)


def allreduce_curves(folder: Path, device: DeviceProfile,
                     engine: str) -> tuple[list[CollectiveCurve], list[dict[str, Any]]]:
    """The engine's all-reduce per group size: knots on every other measured size.

    The sizes between the knots are held out and report the error of the curve
    ("after") and of the scale-up link's alpha-beta model ("before").
    """
    c = pd.read_parquet(folder / "custom_allreduce_perf.parquet")
    if "backend" in c and c["backend"].astype(str).str.endswith("graph").any():
        c = c[c["backend"].astype(str).str.endswith("graph")]  # CUDA-graph capture, as served
    link = load_link(device.scale_up_link) if device.scale_up_link else None
    curves, rows = [], []
    for ranks, part in c.groupby("num_gpus"):
        n = int(ranks)  # type: ignore[arg-type]
        med = part.groupby("message_size")["latency"].median().sort_index() * 1e3  # us
        sizes, us = med.index.to_numpy(float), med.to_numpy(float)
        knots = np.zeros(len(sizes), bool)
        knots[::2] = True
        knots[-1] = True
        curve = CollectiveCurve(ranks=n, points=[(float(b), round(float(t), 3))
                                                 for b, t in zip(sizes[knots], us[knots],
                                                                 strict=True)])
        curves.append(curve)
        held = ~knots
        if link is None or not held.any():
            continue
        after = np.array([curve.seconds(b) or math.nan for b in sizes[held]]) * 1e6
        # The link model takes bytes: ``message_size`` counts 16-bit elements.
        before = np.array([allreduce_time(b * RESIDUAL_BYTES, n, link)
                           for b in sizes[held]]) * 1e6
        meas = us[held]
        rows.append({"device": device.name, "engine": engine, "op": f"allreduce_{n}", "kept": True,
                     "held_out_rows": int(held.sum()), "fit_rows": int(knots.sum()),
                     "median_ape_before": round(float(np.median(_ape(before, meas))), 1),
                     "median_ape_after": round(float(np.median(_ape(after, meas))), 1),
                     "p90_ape_after": round(float(np.percentile(_ape(after, meas), 90)), 1),
                     "median_error_after": round(float(np.median(after / meas - 1) * 100), 1)})
    return curves, rows
