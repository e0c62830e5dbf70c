"""Per-pool monitoring over time, with failures and scaling actions marked."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from simulator.errors import ConfigError
from simulator.plots.common import new_figure, plain_log_axis

_MARKS = {"instance_failure": ("red", "failure"), "instance_recovery": ("green", "recovery"),
          "scale_out": ("purple", "scale out"), "scale_in": ("gray", "scale in"),
          "link_degradation": ("orange", "link degraded"), "straggler": ("brown", "straggler")}


def monitoring_plot(pools: pd.DataFrame, events: pd.DataFrame | None = None, *,
                    title: str = "") -> Figure:
    """Queue/running, KV use, utilisation and latency of each pool over simulated time.

    ``pools`` is :func:`simulator.metrics.monitoring.pool_timeseries` output (or
    ``RunResult.monitoring()``); ``events`` (``RunResult.events``) adds vertical markers.
    """
    if pools.empty:
        raise ConfigError("no monitoring samples to draw")
    fig, axes = new_figure(1, 4, width=10, height=2.3)
    ax_q, ax_kv, ax_u, ax_lat = axes
    for i, (pool, g) in enumerate(pools.groupby("pool", sort=True, observed=True)):
        c = f"C{i}"
        ax_q.plot(g["time_s"], g["queue_len"], color=c, label=f"{pool}: waiting")
        ax_q.plot(g["time_s"], g["running"], color=c, ls="--", label=f"{pool}: running")
        ax_kv.plot(g["time_s"], 100 * g["kv_usage"], color=c, label=pool)
        ax_u.plot(g["time_s"], 100 * g["compute_util"], color=c, label=f"{pool}: compute")
        ax_u.plot(g["time_s"], 100 * g["memory_util"], color=c, ls=":",
                  label=f"{pool}: memory BW")

    if "ttft_mean_s" in pools:  # request latencies are cluster-wide, not per pool
        lat = pools.drop_duplicates("time_s").sort_values("time_s")
        ax_lat.plot(lat["time_s"], 1e3 * lat["ttft_mean_s"], color="k", label="TTFT")
        ax_lat.plot(lat["time_s"], 1e3 * lat["tpot_mean_s"], color="k", ls="--", label="TPOT")
    ax_q.set_ylabel("requests")
    ax_q.set_title("Waiting and running requests")
    ax_kv.set_ylabel("KV blocks in use (%)")
    ax_kv.set_title("KV-cache use")
    ax_u.set_ylabel("share of time (%)")
    ax_u.set_title("Compute- and memory-bound time per device")
    ax_lat.set_ylabel("ms (log)")
    ax_lat.set_yscale("log")
    plain_log_axis(ax_lat)
    ax_lat.set_title("Mean TTFT and TPOT of the requests that finished in each interval")
    if events is not None and len(events):
        seen: set[str] = set()
        for _, ev in events.iterrows():
            mark = _MARKS.get(str(ev["kind"]))
            if mark is None:
                continue
            color, name = mark
            for ax in axes:
                ax.axvline(float(ev["time_s"]), color=color, lw=0.8, alpha=0.6,
                           label=name if (ax is ax_q and name not in seen) else None)
            seen.add(name)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        # Legends beside the panels, never over the data.
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      borderaxespad=0.0, frameon=False)
    ax_lat.set_xlabel("simulated time (s)")
    fig.suptitle(title or "Monitoring")
    return fig
