"""Figures from results: DataFrame in, :class:`matplotlib.figure.Figure` out.

Nothing in ``engine/`` or ``cost/`` imports this package. ``disagg-sim plot`` wraps it.
"""

from simulator.plots.common import save
from simulator.plots.monitoring import monitoring_plot
from simulator.plots.runs import latency_cdf, run_timeline
from simulator.plots.sweep import (
    cost_vs_goodput,
    goodput_vs_rate,
    latency_vs_throughput,
    pareto_front,
    pd_ratio_heatmap,
)

__all__ = [
    "cost_vs_goodput",
    "goodput_vs_rate",
    "latency_cdf",
    "latency_vs_throughput",
    "monitoring_plot",
    "pareto_front",
    "pd_ratio_heatmap",
    "run_timeline",
    "save",
]
