"""Planner figures: devices and $/hour needed against the request rate."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from simulator.errors import ConfigError
from simulator.plots.common import new_figure


def capacity_vs_rate(ranked: pd.DataFrame) -> Figure:
    """Step curves of devices (left axis) and $/hour (right axis) against the request rate,
    from a plan's ranked table with goodputs (:func:`simulator.runner.planner.capacity_curve`):
    each step is the cheapest ranked configuration whose goodput covers the rate."""
    from simulator.runner.planner import capacity_curve

    curve = capacity_curve(ranked)
    if curve.empty:
        raise ConfigError("the capacity plot needs the plan's goodput search "
                          "(plan key goodput_search: true)")
    fig, (ax,) = new_figure(1, 1, width=8.0, height=4.5)
    edges = [*curve["from_rate_per_s"], curve["to_rate_per_s"].iloc[-1]]
    devices = [*curve["devices"], curve["devices"].iloc[-1]]
    dollars = [*curve["cost_usd_per_hour"], curve["cost_usd_per_hour"].iloc[-1]]
    ax.step(edges, devices, where="post", color="C0", label="devices")
    ax.set_ylabel("devices", color="C0")
    ax.set_ylim(0, max(devices) * 1.25)
    ax.yaxis.get_major_locator().set_params(integer=True)
    cost = ax.twinx()
    cost.step(edges, dollars, where="post", linestyle="--", color="C3", label="$/hour")
    cost.set_ylabel("cluster cost ($/hour, dashed)", color="C3")
    cost.set_ylim(0, max(dollars) * 1.25)
    for _, row in curve.iterrows():  # each configuration once, over the rates it serves
        ax.annotate(f"{row['label']}\nup to {row['to_rate_per_s']:.3g} req/s",
                    ((row["from_rate_per_s"] + row["to_rate_per_s"]) / 2, row["devices"]),
                    fontsize=7, ha="center", xytext=(0, 6), textcoords="offset points")
    ax.set_xlabel("request rate (req/s)")
    ax.set_title("Devices and $/hour needed against the request rate\n(cheapest ranked "
                 "configuration whose goodput covers the rate)", fontsize="medium")
    ax.grid(True, alpha=0.3)
    return fig
