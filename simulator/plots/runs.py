"""Plots of single runs: latency CDFs across runs, and one run's timeline.

Inputs are a run's frames (``RunResult.requests`` / ``.steps``, or the Parquet files
``disagg-sim run --out`` and ``frames: true`` sweeps write).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simulator.errors import ConfigError
from simulator.metrics.monitoring import busy_per_bin, last_in_bin
from simulator.plots.common import legend_below, new_figure, plain_log_axis


def latency_cdf(requests: Mapping[str, pd.DataFrame], *,
                slo: Mapping[str, float] | None = None, note: str = "") -> Figure:
    """Empirical CDFs of TTFT and TPOT of completed requests, one line per run.

    Every run given is drawn; ``note`` (e.g. "8 of 33 configurations") goes in the title,
    so a caller that chose a subset says so on the figure.
    """
    fig, (ax_ttft, ax_tpot) = new_figure(2, 1)
    spans: dict[str, list[float]] = {"ttft_s": [], "tpot_s": []}
    for i, (name, frame) in enumerate(requests.items()):
        done = frame[frame["status"] == "completed"] if "status" in frame else frame
        for ax, col in ((ax_ttft, "ttft_s"), (ax_tpot, "tpot_s")):
            if col not in done:
                raise ConfigError(f"requests frame of {name!r} has no {col} column")
            values = np.sort(done[col].dropna().to_numpy(float)) * 1e3
            if len(values):
                spans[col] += [values[0], values[-1]]
                ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post",
                        color=f"C{i % 10}", label=f"{name} (n={len(values)})")
    for ax, key, title in ((ax_ttft, "ttft_s", "Time to first token"),
                           (ax_tpot, "tpot_s", "Time per output token")):
        if slo and slo.get(key):
            ax.axvline(slo[key] * 1e3, color="0.4", linestyle=":",
                       label=f"SLO {slo[key] * 1e3:g} ms")
        # A log axis only when the values span more than a decade and a bit.
        span = [v for v in spans[key] if v > 0]
        log = bool(span) and max(span) / min(span) > 20
        if log:
            ax.set_xscale("log")
        ax.set_ylim(0, 1.01)
        ax.set_xlabel(f"{key.split('_')[0].upper()} (ms{', log scale' if log else ''})")
        ax.set_ylabel("fraction of completed requests")
        ax.set_title(f"CDF of {title.lower()}")
        ax.grid(True, which="both", alpha=0.3)
        if log:
            plain_log_axis(ax, "x")
    legend_below(fig, ax_tpot)
    fig.suptitle("Latency distributions" + (f": {note}" if note else ""))
    return fig


def run_timeline(steps: pd.DataFrame, *, bins: int = 200, title: str = "") -> Figure:
    """Instance activity, queue lengths and KV-cache use over simulated time.

    Top: share of each time bin each instance spent in steps. Middle: requests waiting
    (queue) and running per pool, summed over its instances. Bottom: KV blocks in use as a
    share of the pool's capacity.
    """
    need = {"instance_name", "pool", "start_s", "duration_s", "queue_len", "running",
            "kv_used_blocks", "kv_total_blocks"}
    missing = sorted(need - set(steps.columns))
    if missing:
        raise ConfigError(f"steps frame lacks column(s) {missing}")
    if steps.empty:
        raise ConfigError("the run has no steps to draw")
    end = steps["start_s"] + steps["duration_s"]
    edges = np.linspace(0.0, float(end.max()), bins + 1)
    width = np.diff(edges)
    mids = 0.5 * (edges[:-1] + edges[1:])
    pairs = steps[["pool", "instance_name"]].astype(str).drop_duplicates()
    names = list(pairs.sort_values(["pool", "instance_name"])["instance_name"])
    fig, (ax_act, ax_q, ax_kv) = new_figure(1, 3, width=10, height=2.6)
    activity = np.zeros((len(names), bins))
    pools = list(dict.fromkeys(steps["pool"]))
    queue = {p: np.zeros(bins) for p in pools}
    running = {p: np.zeros(bins) for p in pools}
    kv_used = {p: np.zeros(bins) for p in pools}
    kv_total = {p: np.zeros(bins) for p in pools}
    for row, name in enumerate(names):
        s = steps[steps["instance_name"] == name]
        t0, t1 = s["start_s"].to_numpy(float), (s["start_s"] + s["duration_s"]).to_numpy(float)
        activity[row] = busy_per_bin(t0, t1, edges) / width
        pool = s["pool"].iloc[0]
        # Steps record state when they start; a bin with no step at all means nothing ran.
        idle = activity[row] == 0
        queue[pool] += np.where(idle, 0.0, last_in_bin(t1, s["queue_len"].to_numpy(float), edges))
        running[pool] += np.where(idle, 0.0, last_in_bin(t1, s["running"].to_numpy(float), edges))
        kv_used[pool] += last_in_bin(t1, s["kv_used_blocks"].to_numpy(float), edges)
        kv_total[pool] += float(s["kv_total_blocks"].max())
    image = ax_act.imshow(activity, aspect="auto", origin="lower", cmap="magma", vmin=0,
                          vmax=1, extent=(edges[0], edges[-1], -0.5, len(names) - 0.5),
                          interpolation="nearest")
    ax_act.set_yticks(range(len(names)), names, fontsize="small" if len(names) < 12 else 6)
    ax_act.set_title("Instance activity (share of each interval spent in steps)")
    fig.colorbar(image, ax=ax_act, label="busy share", pad=0.01)
    for i, pool in enumerate(pools):
        ax_q.plot(mids, queue[pool], color=f"C{i}", label=f"{pool}: waiting")
        ax_q.plot(mids, running[pool], color=f"C{i}", linestyle="--",
                  label=f"{pool}: running")
        with np.errstate(invalid="ignore", divide="ignore"):
            ax_kv.plot(mids, 100 * kv_used[pool] / kv_total[pool], color=f"C{i}", label=pool)
    ax_q.set_title("Queue length and running requests per pool")
    ax_q.set_ylabel("requests")
    ax_q.legend(fontsize="small", loc="upper left", ncols=2)
    ax_kv.set_title("KV-cache use per pool")
    ax_kv.set_ylabel("KV blocks in use (%)")
    ax_kv.set_ylim(0, 102)
    ax_kv.legend(fontsize="small", loc="upper left")
    for ax in (ax_act, ax_q, ax_kv):
        ax.set_xlim(edges[0], edges[-1])
        ax.grid(True, alpha=0.3)
    ax_kv.set_xlabel("simulated time (s)")
    fig.suptitle(title or "Run timeline")
    return fig
