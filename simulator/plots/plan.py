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
    fig, (ax,) = new_figure(1, 1, width=7.5, height=4.5)
    rates = curve["rate_per_s"].to_numpy(float)
    ax.step(rates, curve["devices"], where="pre", marker="o", color="C0", label="devices")
    ax.set_ylabel("devices", color="C0")
    ax.set_ylim(bottom=0)
    cost = ax.twinx()
    cost.step(rates, curve["cost_usd_per_hour"], where="pre", marker="s", linestyle="--",
              color="C3", label="$/hour")
    cost.set_ylabel("cluster cost ($/hour)", color="C3")
    cost.set_ylim(bottom=0)
    for rate, devices, label in zip(rates, curve["devices"], curve["label"], strict=True):
        ax.annotate(label, (rate, devices), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("request rate (req/s)")
    ax.set_title("Devices and $/hour needed against the request rate\n(cheapest ranked "
                 "configuration whose goodput covers the rate)", fontsize="medium")
    ax.grid(True, alpha=0.3)
    return fig
