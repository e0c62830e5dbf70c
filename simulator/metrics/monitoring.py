"""Per-instance and per-pool monitoring time series, sampled on a fixed interval.

Computed after the run from the steps and requests frames (exact, and free while the
simulation runs). For each interval and instance:

- ``busy`` = device time per device in the interval ÷ interval (a step's ``busy_s`` spread
  evenly over its duration; on one stage that is the share of the interval spent in steps);
- ``compute_util`` / ``memory_util`` = compute / memory-bound seconds of its steps in the
  interval ÷ interval (per device; a step's seconds are spread evenly over its duration);
- ``queue_len``, ``running``, ``kv_used_blocks`` = the last value recorded by a step that
  ended in the interval (carried forward while the instance idles), ``kv_free_blocks``;

and per interval, from the requests that finished in it (cluster-wide, repeated on each
pool's row): mean prefill, transfer and decode times, mean TTFT and TPOT, completions and
restarts (router retries).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd


def busy_per_bin(start: np.ndarray, end: np.ndarray, edges: np.ndarray,
                 weight: np.ndarray | None = None) -> np.ndarray:
    """Seconds of the intervals ``[start, end)`` inside each bin (optionally scaled by
    ``weight``, the share of each interval that counts). Intervals may overlap.

    ``edges`` must be increasing. Each interval adds its partial overlap to the bins that
    hold its two ends and its weight to every bin it covers fully (a difference array),
    so time and memory grow as (intervals + bins), however long the run.
    """
    start = np.asarray(start, dtype=float)
    end = np.asarray(end, dtype=float)
    edges = np.asarray(edges, dtype=float)
    nbins = len(edges) - 1
    if nbins < 1:
        return np.zeros(0)
    w = np.ones_like(start) if weight is None else np.asarray(weight, dtype=float)
    lo = np.clip(start, edges[0], edges[-1])
    hi = np.clip(end, edges[0], edges[-1])
    keep = hi > lo
    lo, hi, w = lo[keep], hi[keep], w[keep]
    first = np.clip(np.searchsorted(edges, lo, side="right") - 1, 0, nbins - 1)
    last = np.clip(np.searchsorted(edges, hi, side="left") - 1, 0, nbins - 1)
    same = first == last
    out = np.zeros(nbins)
    out += np.bincount(first[same], weights=w[same] * (hi[same] - lo[same]), minlength=nbins)
    f, la, ws = first[~same], last[~same], w[~same]
    out += np.bincount(f, weights=ws * (edges[f + 1] - lo[~same]), minlength=nbins)
    out += np.bincount(la, weights=ws * (hi[~same] - edges[la]), minlength=nbins)
    # Bins strictly between the two ends are covered whole.
    cover = np.zeros(nbins + 1)
    cover += np.bincount(f + 1, weights=ws, minlength=nbins + 1)
    cover -= np.bincount(la, weights=ws, minlength=nbins + 1)
    out += np.cumsum(cover)[:nbins] * np.diff(edges)
    return out


def last_in_bin(times: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The value last recorded at or before each bin's end (0 before the first record)."""
    order = np.argsort(times, kind="stable")
    times, values = times[order], values[order]
    k = np.searchsorted(times, edges[1:], side="right")
    return np.where(k > 0, values[np.maximum(k - 1, 0)], 0.0)


def instance_timeseries(steps: pd.DataFrame, interval_s: float,
                        end_s: float | None = None) -> pd.DataFrame:
    """One row per (interval, instance); see the module docstring for the columns."""
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    if steps.empty:
        return pd.DataFrame(columns=["time_s", "pool", "instance_name"])
    last = float((steps["start_s"] + steps["duration_s"]).max())
    return series_of_instances(steps.groupby("instance_name", sort=True, observed=True),
                               last, interval_s, end_s)


def series_of_instances(groups: Iterable[tuple[Any, pd.DataFrame]], last_end_s: float,
                        interval_s: float, end_s: float | None = None) -> pd.DataFrame:
    """:func:`instance_timeseries` from each instance's steps, one instance at a time.

    ``groups`` yields ``(instance name, its rows of the steps frame in order)`` in the
    frame's instance order; ``last_end_s`` is the latest step end of all of them. A run
    that keeps its steps compactly expands one instance at a time here, never the frame.
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    end = max(last_end_s, end_s or 0.0)
    edges = np.arange(0.0, end + interval_s, interval_s)
    if edges[-1] < end:
        edges = np.append(edges, edges[-1] + interval_s)
    rows = []
    for name, s in groups:
        t0 = s["start_s"].to_numpy(float)
        dur = s["duration_s"].to_numpy(float)
        t1 = t0 + dur
        with np.errstate(invalid="ignore", divide="ignore"):
            comp_share = np.where(dur > 0, s["compute_s"].to_numpy(float) / dur, 0.0)
            mem_share = np.where(dur > 0, s["memory_s"].to_numpy(float) / dur, 0.0)
        # Device time per device (busy_s), spread evenly over each step: pipeline
        # micro-batches overlap in time but share the stages' devices.
        with np.errstate(invalid="ignore", divide="ignore"):
            busy_share = np.where(dur > 0, s["busy_s"].to_numpy(float) / dur, 0.0)
        busy = busy_per_bin(t0, t1, edges, busy_share) / interval_s
        frame = pd.DataFrame({
            "time_s": edges[:-1],
            "pool": s["pool"].iloc[0],
            "instance_name": name,
            "busy": busy,
            "compute_util": busy_per_bin(t0, t1, edges, comp_share) / interval_s,
            "memory_util": busy_per_bin(t0, t1, edges, mem_share) / interval_s,
            "queue_len": last_in_bin(t1, s["queue_len"].to_numpy(float), edges),
            "running": last_in_bin(t1, s["running"].to_numpy(float), edges),
            "kv_used_blocks": last_in_bin(t1, s["kv_used_blocks"].to_numpy(float), edges),
            "kv_total_blocks": float(s["kv_total_blocks"].max()),
        })
        frame["kv_free_blocks"] = frame["kv_total_blocks"] - frame["kv_used_blocks"]
        rows.append(frame)
    if not rows:
        return pd.DataFrame(columns=["time_s", "pool", "instance_name"])
    return pd.concat(rows, ignore_index=True)


def pool_timeseries(steps: pd.DataFrame, requests: pd.DataFrame, interval_s: float,
                    end_s: float | None = None) -> pd.DataFrame:
    """One row per (interval, pool): instance series summed/averaged plus request phases."""
    return pools_of_instances(instance_timeseries(steps, interval_s, end_s), requests)


def pools_of_instances(inst: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """:func:`pool_timeseries` from the instance series it aggregates."""
    if inst.empty:
        return inst
    agg = inst.groupby(["time_s", "pool"], observed=True).agg(
        instances=("instance_name", "nunique"), busy=("busy", "mean"),
        compute_util=("compute_util", "mean"), memory_util=("memory_util", "mean"),
        queue_len=("queue_len", "sum"), running=("running", "sum"),
        kv_used_blocks=("kv_used_blocks", "sum"), kv_total_blocks=("kv_total_blocks", "sum"),
    ).reset_index()
    agg["kv_usage"] = agg["kv_used_blocks"] / agg["kv_total_blocks"]
    done = requests[requests["completion_s"].notna()].copy()
    edges = np.sort(agg["time_s"].unique())
    if len(done) and len(edges):
        done["time_s"] = edges[np.clip(np.searchsorted(edges, done["completion_s"],
                                                        side="right") - 1, 0, len(edges) - 1)]
        phases = done.groupby("time_s").agg(
            completed=("request_id", "count"), ttft_mean_s=("ttft_s", "mean"),
            tpot_mean_s=("tpot_s", "mean"), prefill_mean_s=("prefill_s", "mean"),
            transfer_mean_s=("transfer_s", "mean"), decode_mean_s=("decode_s", "mean"),
            restarts=("restarts", "sum"),
        ).reset_index()
        agg = agg.merge(phases, on="time_s", how="left")
    failed = requests[requests["status"] == "failed"]
    agg["failed_total"] = len(failed)
    return agg
