"""Per-class (tenant) plots: TTFT distributions by class, and class outcomes across runs.

Inputs are requests frames (``RunResult.requests``, with its ``class`` column) and run
summaries (``RunResult.summary``, with its ``class_<name>_*`` keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simulator.errors import ConfigError
from simulator.metrics.classes import class_names
from simulator.plots.common import legend_below, new_figure, plain_log_axis


def class_ttft_cdf(runs: Mapping[str, pd.DataFrame],
                   slo_ttft_s: Mapping[str, float] | None = None) -> Figure:
    """CDF of TTFT per class (one panel per class), one line per run; dotted lines mark
    each class's TTFT target."""
    found = list(dict.fromkeys(c for df in runs.values() for c in _classes(df)))
    # In the order the targets are given (the scenario's), then any others.
    classes = [c for c in (slo_ttft_s or {}) if c in found] + [
        c for c in found if c not in (slo_ttft_s or {})]
    fig, axes = new_figure(len(classes), 1)
    spans: list[float] = []
    for ax, cls in zip(axes, classes, strict=True):
        for i, (name, df) in enumerate(runs.items()):
            done = df[(df["class"] == cls) & (df["status"] == "completed")]
            values = np.sort(done["ttft_s"].dropna().to_numpy(float)) * 1e3
            if len(values):
                spans += [v for v in (values[0], values[-1]) if v > 0]
                ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post",
                        color=f"C{i % 10}", label=f"{name} (n={len(values)})")
        target = (slo_ttft_s or {}).get(cls)
        if target:
            ax.axvline(target * 1e3, color="0.4", linestyle=":",
                       label=f"{cls} TTFT target {target * 1e3:g} ms")
        ax.set_title(f"class {cls}: CDF of time to first token (completed requests)")
        ax.set_ylabel("fraction completed")
        ax.set_ylim(0, 1.01)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    log = bool(spans) and max(spans) / min(spans) > 20
    for ax in axes:
        if log:
            ax.set_xscale("log")
            plain_log_axis(ax, "x")
        ax.set_xlabel(f"TTFT (ms{', log scale' if log else ''})")
    fig.suptitle("Time to first token by request class")
    return fig


def class_outcomes(summaries: Mapping[str, Mapping[str, Any]]) -> Figure:
    """Per run and class, from run summaries: SLO attainment (each class against its own
    SLO), and the share of attempts shed or cancelled."""
    if not summaries:
        raise ConfigError("class_outcomes needs at least one run summary")
    fig, (ax_att, ax_lost) = new_figure(2, 1)
    runs = list(summaries)
    classes = list(dict.fromkeys(c for s in summaries.values() for c in class_names(s)))
    if not classes:
        raise ConfigError("these summaries have no request classes (workload.classes)")
    width = 0.8 / len(classes)
    x = np.arange(len(runs))
    for j, cls in enumerate(classes):
        att, lost = [], []
        for s in summaries.values():
            v = {k: float(s.get(f"class_{cls}_{k}", np.nan))
                 for k in ("slo_attainment", "shed", "cancelled", "attempts")}
            att.append(100 * v["slo_attainment"])
            lost.append(100 * (v["shed"] + v["cancelled"]) / max(1.0, v["attempts"]))
        ax_att.bar(x + j * width, att, width, color=f"C{j}", label=cls)
        ax_lost.bar(x + j * width, lost, width, color=f"C{j}", label=cls)
    for ax, title, ylabel in ((ax_att, "SLO attainment (own SLO)", "% of client requests"),
                              (ax_lost, "shed or cancelled", "% of attempts")):
        ax.set_xticks(x + width * (len(classes) - 1) / 2, runs, rotation=20, ha="right")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    ax_att.set_ylim(0, 105)
    legend_below(fig, ax_lost)
    fig.suptitle("Outcome by request class")
    return fig


def _classes(df: pd.DataFrame) -> list[str]:
    if "class" not in df:
        raise ConfigError("requests frame has no class column (a run of this version)")
    return list(dict.fromkeys(df["class"]))
