"""Metrics as pure functions of the requests and steps frames.

Definitions (docs/metrics.md has the formulas) follow ``vllm bench serve``:
TTFT = first token the client receives - arrival (in disaggregated serving that token comes
from the decode instance, after the KV hand-off; ``prefill_ttft_s`` is the prefill's own
end - arrival); TPOT = (E2E - TTFT) / (output tokens - 1) for requests with
more than one output token; ITL = gaps between consecutive tokens (here: decode step
durations weighted by the sequences they advance); duration = last completion - first
arrival; goodput = requests meeting every SLO per second of duration.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from simulator.metrics.compact import CompactSteps
from simulator.metrics.percentile import weighted_percentiles

PERCENTILES = (50, 90, 99)
ENDED = ("completed", "failed", "rejected", "shed", "cancelled")
"""Statuses of requests that are over (shed and cancelled: request classes)."""


def add_latency_columns(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-request latency columns (seconds); NaN where a phase did not happen.

    Returns a new frame; ``requests`` is left as it was. The new frame shares the input's
    columns (pandas copy-on-write copies a column only if one of the two is changed), so a
    million-request frame is never held twice.
    """
    df = requests
    out = df.copy(deep=False)
    out["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    out["prefill_ttft_s"] = df["prefill_end_s"] - df["arrival_s"]
    out["e2e_s"] = df["completion_s"] - df["arrival_s"]
    decode_tokens = df["generated_tokens"] - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = (df["completion_s"] - df["first_token_s"]) / decode_tokens
    out["tpot_s"] = tpot.where(decode_tokens > 0)
    out["queue_s"] = df["prefill_start_s"] - df["arrival_s"]
    out["prefill_s"] = df["prefill_end_s"] - df["prefill_start_s"]
    out["transfer_queue_s"] = df["transfer_start_s"] - df["transfer_wait_s"]
    out["transfer_s"] = df["transfer_end_s"] - df["transfer_start_s"]
    out["decode_queue_s"] = df["decode_start_s"] - df["transfer_end_s"].where(
        df["transfer_end_s"].notna(), df["first_token_s"])
    out["decode_s"] = df["completion_s"] - df["decode_start_s"]
    out["first_to_second_token_s"] = df["second_token_s"] - df["first_token_s"]
    return out


__all__ = ["add_latency_columns", "itl_gaps", "slo_met", "summarize", "weighted_percentiles"]


def itl_gaps(steps: pd.DataFrame) -> np.ndarray:
    """Inter-token gap each step gives the sequences it decodes.

    A decoding sequence waits from the end of the previous decode-carrying step of its
    instance to the end of this one, so prefill-only steps in between (no chunked
    prefill) count towards its gap. When steps overlap (pipeline micro-batches) the
    previous step belongs to another micro-batch and the gap is the step's own latency.
    Rows without decodes get 0 (their weight is zero).
    """
    gaps = np.zeros(len(steps))
    if not len(steps):
        return gaps
    inst = steps["instance"].to_numpy()
    start = steps["start_s"].to_numpy(dtype=float)
    duration = steps["duration_s"].to_numpy(dtype=float)
    decodes = steps["decode_seqs"].to_numpy()
    # One instance at a time keeps the temporaries small on runs with tens of millions of
    # steps (a stable sort keeps each instance's rows in the order they were recorded).
    order = np.argsort(inst, kind="stable")
    bounds = np.flatnonzero(np.diff(inst[order])) + 1
    for group in np.split(order, bounds):
        rows = group[decodes[group] > 0]
        if not len(rows):
            continue
        s = start[rows]
        e = s + duration[rows]
        if len(e) > 1 and (np.diff(e) < 0).any():  # recorded out of end order: sort them
            by_end = np.argsort(e, kind="stable")
            rows, s, e = rows[by_end], s[by_end], e[by_end]
        prev = np.empty_like(e)
        prev[0] = np.inf
        prev[1:] = e[:-1]
        gaps[rows] = np.where(prev <= s, e - prev, e - s)
    return gaps


def _stats(prefix: str, series: pd.Series) -> dict[str, float]:
    arr = series.dropna().to_numpy(dtype=float)
    out: dict[str, float] = {}
    out[f"{prefix}_mean_s"] = float(arr.mean()) if len(arr) else float("nan")
    for q in PERCENTILES:
        out[f"{prefix}_p{q}_s"] = float(np.percentile(arr, q)) if len(arr) else float("nan")
    return out


def _pool_of_instance(steps: pd.DataFrame) -> np.ndarray:
    """Pool code of each instance id seen in a steps frame (-1 for ids not seen)."""
    inst = steps["instance"].to_numpy().astype(np.int64)
    out = np.full(int(inst.max()) + 1 if len(inst) else 0, -1, dtype=np.int64)
    out[inst] = steps["pool"].cat.codes.to_numpy()
    return out


def _itl_stats(steps: CompactSteps) -> dict[str, float]:
    """Mean and percentiles of the inter-token gaps, each weighted by its sequences."""
    out: dict[str, float] = {}
    if not len(steps):
        out["itl_mean_s"] = float("nan")
        for q in PERCENTILES:
            out[f"itl_p{q}_s"] = float("nan")
        return out
    gaps, seqs, _ = steps.itl()
    pct = weighted_percentiles(gaps, seqs)
    total = seqs.sum()
    gaps *= seqs  # the weighted gaps, in place: the frame-sized array is the largest here
    out["itl_mean_s"] = float(gaps.sum() / total) if total else float("nan")
    for q, v in pct.items():
        out[f"itl_p{q}_s"] = v
    return out


def slo_met(requests: pd.DataFrame, ttft_s: float | None, tpot_s: float | None,
            e2e_s: float | None) -> pd.Series:
    """True for completed requests that meet every given SLO."""
    ok = requests["status"] == "completed"
    if ttft_s is not None:
        ok &= requests["ttft_s"] <= ttft_s
    if tpot_s is not None:
        ok &= requests["tpot_s"].fillna(0.0) <= tpot_s
    if e2e_s is not None:
        ok &= requests["e2e_s"] <= e2e_s
    return ok


def summarize(requests: pd.DataFrame, steps: pd.DataFrame | CompactSteps, *, ttft_s: float | None = None,
              tpot_s: float | None = None, e2e_s: float | None = None,
              pool_devices: dict[str, int] | None = None) -> dict[str, Any]:
    """Throughput, latency percentiles, SLO attainment, goodput and utilisation.

    ``steps`` is the steps frame or the same steps as a run keeps them compactly
    (:class:`~simulator.metrics.compact.CompactSteps`): the figures are the same floats.
    """
    reqs = requests if "ttft_s" in requests else add_latency_columns(requests)
    done = reqs[reqs["status"] == "completed"]
    counts = reqs["status"].value_counts()
    summary: dict[str, Any] = {
        "num_requests": len(reqs),
        "completed": int(counts.get("completed", 0)),
        "failed": int(counts.get("failed", 0)),
        "rejected": int(counts.get("rejected", 0)),
        "in_flight": int(len(reqs) - sum(counts.get(s, 0) for s in ENDED)),
    }
    if len(done):
        start = float(reqs["arrival_s"].min())
        end = float(done["completion_s"].max())
        duration = max(end - start, 1e-12)
    else:
        duration = float("nan")
    summary["duration_s"] = duration
    per_s = 1.0 / duration if len(done) else 0.0
    summary["request_throughput"] = len(done) * per_s
    summary["input_token_throughput"] = float(done["prompt_tokens"].sum()) * per_s
    summary["output_token_throughput"] = float(done["generated_tokens"].sum()) * per_s
    summary["total_token_throughput"] = (summary["input_token_throughput"]
                                         + summary["output_token_throughput"])
    summary.update(_stats("ttft", done["ttft_s"]))
    summary.update(_stats("tpot", done["tpot_s"]))
    summary.update(_stats("e2e", done["e2e_s"]))
    # What one user sees while tokens stream: 1 / TPOT, averaged over requests.
    tpot = done["tpot_s"].dropna()
    positive = tpot[tpot > 0]
    summary["per_user_tokens_per_s_mean"] = float((1.0 / positive).mean()) if len(positive) else math.nan
    # ITL: every decode step gives one inter-token gap to each sequence it advances; a
    # speculative step that advances a sequence by n tokens delivers them in one burst,
    # so the client sees that gap and n - 1 gaps of zero.
    compact = (steps if isinstance(steps, CompactSteps)
               else CompactSteps.from_frame(steps, _pool_of_instance(steps)))
    summary.update(_itl_stats(compact))
    met = slo_met(reqs, ttft_s, tpot_s, e2e_s)
    summary["slo_attainment"] = float(met.sum() / len(reqs)) if len(reqs) else float("nan")
    summary["goodput"] = float(met.sum()) / duration if len(done) else 0.0
    summary["preemptions"] = int(reqs["preemptions"].sum())
    if "swaps" in reqs:  # scheduler.preemption: swap; included in preemptions
        summary["swap_preemptions"] = int(reqs["swaps"].sum())
        summary["swap_bytes"] = float(reqs["swap_bytes"].sum())
    if "cached_tokens" in reqs:
        started = reqs[reqs["prefill_start_s"].notna()]
        prompt = float(started["prompt_tokens"].sum())
        cached = float(started["cached_tokens"].sum())
        summary["prefix_hit_rate"] = cached / prompt if prompt else 0.0
        summary["prefill_tokens_saved"] = int(cached)
        summary["prefill_seconds_saved"] = float(started["prefill_saved_s"].sum())
    # Utilisation: device time per device over the run (busy_s is a step's device time
    # per device: its duration on one stage, duration / pp summed over a pipeline's
    # micro-batches, so overlapping micro-batches never count twice).
    # The span runs to the last step's end when work went on after the last completion
    # (requests that failed or were still in flight), so the share stays <= 1.
    if len(compact) and not math.isnan(duration):
        span = max(duration, compact.last_end() - float(reqs["arrival_s"].min()))
        busy, instances = compact.busy_by_pool()
        for pool, seconds in busy.items():
            n = (pool_devices or {}).get(f"{pool}:instances", instances.get(pool, 1))
            summary[f"util_{pool}"] = float(seconds / (span * max(n, 1)))
    if pool_devices:
        summary["devices"] = int(sum(v for k, v in pool_devices.items() if k.endswith(":devices")))
        if summary["devices"] and len(done):
            summary["goodput_per_device"] = summary["goodput"] / summary["devices"]
            summary["output_token_throughput_per_device"] = (
                summary["output_token_throughput"] / summary["devices"])
    return summary


TIER_COLUMNS = {"dram": "dram_hit_tokens", "ssd": "ssd_hit_tokens",
                "remote": "remote_hit_tokens"}


def tier_summary(reqs: pd.DataFrame) -> dict[str, float]:
    """Prefix hits by the tier they came from, and what loading them cost (docs/metrics.md).

    ``cached_tokens`` counts every prompt token not prefilled; the tier columns count
    those loaded from below HBM, so HBM's own share is the difference.
    """
    started = reqs[reqs["prefill_start_s"].notna()]
    prompt = float(started["prompt_tokens"].sum())
    out: dict[str, float] = {}
    below = 0.0
    for name, col in TIER_COLUMNS.items():
        tokens = float(started[col].sum())
        below += tokens
        out[f"hit_rate_{name}"] = tokens / prompt if prompt else 0.0
    hbm = float(started["cached_tokens"].sum()) - below
    out["hit_rate_hbm"] = hbm / prompt if prompt else 0.0
    out["kv_load_seconds"] = float(started["kv_load_s"].sum())
    # Net TTFT saved: prefill time the hits spared, less the time spent loading them.
    out["ttft_seconds_saved"] = float(started["prefill_saved_s"].sum()) - out["kv_load_seconds"]
    out["handoff_tokens_saved"] = int(started["decode_cached_tokens"].sum())
    return out


def local_prefill_share(reqs: pd.DataFrame) -> float:
    """P/D with conditional disaggregation: share of prefilled requests whose prefill ran
    on their decode instance (no hand-off)."""
    done = reqs[reqs["prefill_end_s"].notna() & (reqs["decode_instance"] >= 0)]
    if not len(done):
        return 0.0
    return float((done["prefill_instance"] == done["decode_instance"]).mean())
