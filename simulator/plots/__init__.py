"""Figures from results: DataFrame in, :class:`matplotlib.figure.Figure` out.

Nothing in ``engine/`` or ``cost/`` imports this package. ``disagg-sim plot --kind KIND``
wraps it, and each kind has the same name here: ``plots.latency``, ``plots.goodput``,
``plots.pareto``, ``plots.pd_heatmap``, ``plots.cdf``, ``plots.timeline``,
``plots.monitoring``, ``plots.capacity`` (the descriptive names are kept as well).
Per request class: ``plots.class_cdf`` (= ``class_ttft_cdf``) and ``plots.class_outcomes``.
"""

from simulator.plots.classes import class_outcomes, class_ttft_cdf
from simulator.plots.common import save
from simulator.plots.monitoring import monitoring_plot
from simulator.plots.plan import capacity_vs_rate
from simulator.plots.runs import latency_cdf, run_timeline
from simulator.plots.sweep import (
    cost_vs_goodput,
    goodput_vs_rate,
    latency_vs_throughput,
    pareto_front,
    pd_ratio_heatmap,
)

# The names of `disagg-sim plot --kind`.
latency = latency_vs_throughput
goodput = goodput_vs_rate
pareto = cost_vs_goodput
pd_heatmap = pd_ratio_heatmap
cdf = latency_cdf
timeline = run_timeline
monitoring = monitoring_plot
capacity = capacity_vs_rate
class_cdf = class_ttft_cdf

__all__ = [
    "capacity",
    "capacity_vs_rate",
    "cdf",
    "class_cdf",
    "class_outcomes",
    "class_ttft_cdf",
    "cost_vs_goodput",
    "goodput",
    "goodput_vs_rate",
    "latency",
    "latency_cdf",
    "latency_vs_throughput",
    "monitoring",
    "monitoring_plot",
    "pareto",
    "pareto_front",
    "pd_heatmap",
    "pd_ratio_heatmap",
    "run_timeline",
    "save",
    "timeline",
]
