"""Plots of a sweep's results table (one row per run): DataFrame in, Figure out.

With several seeds per configuration each point is the mean over seeds and the band or
error bar its 95 % confidence interval (:mod:`simulator.metrics.stats`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simulator.errors import ConfigError
from simulator.plots.common import (
    axis_columns,
    config_labels,
    label,
    legend_below,
    legend_title,
    new_figure,
    plain_log_axis,
    pooled,
    require,
    scale,
    short_names,
)

RATE = "workload.arrival.rate_per_s"


def slo_targets(frame: pd.DataFrame) -> dict[str, float]:
    """SLO targets of the first run (``ttft_s``, ``tpot_s``, ``e2e_s``) when recorded."""
    if "scenario_json" not in frame or frame.empty:
        return {}
    slo = json.loads(frame["scenario_json"].iloc[0]).get("slo", {})
    return {k: float(v) for k, v in slo.items() if v is not None}


def _group(frame: pd.DataFrame, x: str, group: Sequence[str] | None) -> list[str]:
    if group is not None:
        return list(group)
    axes = axis_columns(frame)
    if x in axes:
        return [a for a in axes if a != x]
    # x is a measured throughput: the rate axis still runs along each curve.
    return [a for a in axes if a != RATE]


def _line(ax, xs: np.ndarray, mean: np.ndarray, half: np.ndarray, *, low: float = 0.0,
          high: float = math.inf, log: bool = False, **style) -> None:
    """Mean line with 95 % CI error bars (none where there is a single seed).

    Intervals are clipped to what the quantity can be: ``[low, high]`` (0-100 % for SLO
    attainment, >= 0 otherwise); on a log axis an interval that would reach 0 stops one
    decade below the mean.
    """
    half = np.where(np.isfinite(half), half, 0.0)
    floor = np.maximum(low, mean / 10) if log else np.full_like(mean, low)
    lower = np.clip(mean - np.maximum(mean - half, floor), 0.0, None)
    upper = np.clip(np.minimum(mean + half, high) - mean, 0.0, None)
    err = np.vstack([lower, upper])
    ax.errorbar(xs, mean, yerr=err if err.any() else None, marker="o", markersize=3.5,
                capsize=2.5, elinewidth=0.8, **style)


def _series(frame: pd.DataFrame, x: str, group: list[str], metrics: list[str]
            ) -> list[tuple[str, pd.DataFrame]]:
    """Per configuration: rows sorted by ``x`` with ``<metric>_mean/_ci95``."""
    x_is_axis = x in axis_columns(frame)
    by = [*group, x] if x_is_axis else [*group, RATE] if RATE in frame else [*group]
    table = pooled(frame, list(dict.fromkeys(by)), [*metrics, *([] if x_is_axis else [x])])
    if table.empty:
        raise ConfigError("no successful runs to plot")
    xcol = x if x_is_axis else f"{x}_mean"
    table = table.assign(_x=table[xcol], _label=config_labels(table, group))
    return [(str(name), part.sort_values("_x"))
            for name, part in table.groupby("_label", sort=False)]


def latency_vs_throughput(frame: pd.DataFrame, *, x: str = RATE,
                          group: Sequence[str] | None = None,
                          percentiles: Sequence[str] = ("p50", "p90")) -> Figure:
    """TTFT and TPOT percentiles against offered rate or achieved throughput.

    One colour per configuration (the axes other than ``x``); solid = highest percentile,
    dashed = lower ones; dotted grey lines are the SLO targets.
    """
    metrics = [f"{m}_{p}_s" for m in ("ttft", "tpot") for p in percentiles]
    require(frame, [*metrics, x], "latency")
    groups = _group(frame, x, group)
    fig, (ax_ttft, ax_tpot) = new_figure(2, 1)
    slo = slo_targets(frame)
    for i, (name, part) in enumerate(_series(frame, x, groups, metrics)):
        color = f"C{i % 10}"
        for ax, m in ((ax_ttft, "ttft"), (ax_tpot, "tpot")):
            for j, p in enumerate(reversed(list(percentiles))):
                col = f"{m}_{p}_s"
                _line(ax, part["_x"].to_numpy(float), part[f"{col}_mean"].to_numpy(float) * 1e3,
                      part[f"{col}_ci95"].to_numpy(float) * 1e3, log=True, color=color,
                      linestyle="-" if j == 0 else "--",
                      label=f"{name} ({p})" if len(percentiles) > 1 else name)
    for ax, m, title in ((ax_ttft, "ttft", "Time to first token"),
                         (ax_tpot, "tpot", "Time per output token")):
        if f"{m}_s" in slo:
            ax.axhline(slo[f"{m}_s"] * 1e3, color="0.4", linestyle=":", linewidth=1,
                       label=f"SLO {slo[f'{m}_s'] * 1e3:g} ms")
        ax.set_title(f"{title} vs {label(x).split(' (')[0]}")
        ax.set_xlabel(label(x))
        ax.set_ylabel(f"{m.upper()} (ms)")
        ax.set_yscale("log")
        plain_log_axis(ax)
        ax.grid(True, which="both", alpha=0.3)
    legend_below(fig, ax_tpot, legend_title(frame, groups))
    slo_lines = [h for h in ax_ttft.get_lines() if str(h.get_label()).startswith("SLO")]
    if slo_lines:
        ax_ttft.legend(handles=slo_lines, fontsize="small", loc="upper left")
    fig.suptitle("Latency vs load" + _seeds_note(frame))
    return fig


def _seeds_note(frame: pd.DataFrame, bars: bool = True) -> str:
    seeds = frame["seed"].nunique() if "seed" in frame else 1
    if seeds < 2:
        return ""
    return f" (mean of {seeds} seeds{', error bars = 95 % CI' if bars else ''})"


def goodput_vs_rate(frame: pd.DataFrame, *, x: str = RATE, group: Sequence[str] | None = None,
                    target: float = 0.9) -> Figure:
    """SLO attainment and goodput against the offered rate, one line per configuration."""
    require(frame, [x, "slo_attainment", "goodput"], "goodput")
    groups = _group(frame, x, group)
    fig, (ax_att, ax_good) = new_figure(2, 1)
    for i, (name, part) in enumerate(_series(frame, x, groups, ["slo_attainment", "goodput"])):
        xs = part["_x"].to_numpy(float)
        for ax, m in ((ax_att, "slo_attainment"), (ax_good, "goodput")):
            _line(ax, xs, part[f"{m}_mean"].to_numpy(float) * scale(m),
                  part[f"{m}_ci95"].to_numpy(float) * scale(m),
                  high=100.0 if m == "slo_attainment" else math.inf, color=f"C{i % 10}",
                  label=name)
    ax_att.axhline(target * 100, color="0.4", linestyle=":", label=f"target {target:.0%}")
    ax_att.set_ylim(-2, 102)
    if x == RATE:
        top = float(frame[x].max())
        ax_good.plot([0, top], [0, top], color="0.6", linestyle=":", label="offered rate")
    for ax, m, title in ((ax_att, "slo_attainment", "SLO attainment"),
                         (ax_good, "goodput", "Goodput")):
        ax.set_title(f"{title} vs {label(x).split(' (')[0]}")
        ax.set_xlabel(label(x))
        ax.set_ylabel(label(m))
        ax.grid(True, alpha=0.3)
    legend_below(fig, ax_good, legend_title(frame, groups))
    fig.suptitle("SLO attainment and goodput" + _seeds_note(frame))
    return fig


def pareto_front(cost: np.ndarray, goodput: np.ndarray,
                 decimals: int | None = None) -> np.ndarray:
    """Indices of points no other point beats on both (lower cost, higher goodput).

    Among equal costs the higher goodput wins, then the earlier row. With ``decimals=2``
    costs are compared to the cent, as the planner ranks them, so on a planner table
    (sorted by its rank rule) the front starts at the top pick.
    """
    rounded = cost if decimals is None else np.round(cost, decimals)
    order = np.lexsort((np.arange(len(cost)), -goodput, rounded))
    best = -math.inf
    keep = []
    for i in order:
        if np.isfinite(cost[i]) and goodput[i] > max(best, 0.0):
            keep.append(i)
            best = goodput[i]
    return np.asarray(keep, dtype=int)


def _sweep_goodput(frame: pd.DataFrame, cost: str, target: float
                   ) -> tuple[pd.DataFrame, str, list[str]]:
    """Per configuration: mean cost and a goodput figure, and which figure it is.

    ``goodput_rate_per_s`` (from goodput-search sweeps or the planner) when present;
    otherwise, with a rate axis, the highest swept rate whose mean SLO attainment is at
    least ``target``; otherwise the measured ``goodput``.
    """
    axes = axis_columns(frame)
    if "goodput_rate_per_s" in frame:
        table = pooled(frame, axes or ["config_id"], [cost, "goodput_rate_per_s"])
        return table.rename(columns={"goodput_rate_per_s_mean": "_y"}), "goodput_rate_per_s", axes
    if RATE in axes:
        group = [a for a in axes if a != RATE]
        table = pooled(frame, [*group, RATE], [cost, "slo_attainment"])
        table["_ok"] = np.where(table["slo_attainment_mean"] >= target, table[RATE], 0.0)
        keys = group or ["n_seeds"]
        table = table.groupby(keys, sort=False, as_index=False).agg(
            **{f"{cost}_mean": (f"{cost}_mean", "mean"), "_y": ("_ok", "max")})
        return table, "swept_goodput", group
    table = pooled(frame, axes or ["config_id"], [cost, "goodput"])
    return table.rename(columns={"goodput_mean": "_y"}), "goodput", axes


def cost_vs_goodput(frame: pd.DataFrame, *, cost: str = "cost_usd_per_hour",
                    labels: pd.Series | None = None, goodput: str | None = None,
                    target: float = 0.9, target_rate: float | None = None) -> Figure:
    """Each configuration's cost against its goodput; the Pareto front joined and numbered.

    ``labels`` (one per row of ``frame``) means the rows already are configurations
    (the planner's table) and ``goodput`` names their goodput column.
    """
    if labels is not None:
        require(frame, [cost, goodput or "goodput_rate_per_s"], "pareto")
        ycol = goodput or "goodput_rate_per_s"
        names = labels.to_numpy()
        xs, ys = frame[cost].to_numpy(float), frame[ycol].to_numpy(float)
    else:
        require(frame, [cost], "pareto")
        table, ycol, group = _sweep_goodput(frame, cost, target)
        names = (config_labels(table, group) if group else table.get(
            "config_id", pd.Series(range(len(table))))).to_numpy()
        xs, ys = table[f"{cost}_mean"].to_numpy(float), table["_y"].to_numpy(float)
    ylabel = (f"goodput: max swept rate with SLO attainment >= {target:.0%} (req/s)"
              if ycol == "swept_goodput" else label(ycol))
    fig, (ax,) = new_figure(1, 1, width=7.5, height=5)
    ax.scatter(xs, ys, s=22, color="0.55", label="configuration", zorder=2)
    front = pareto_front(xs, ys, decimals=2 if labels is not None else None)
    if len(front):
        ax.plot(xs[front], ys[front], color="C3", marker="o", zorder=3,
                drawstyle="steps-post", label="Pareto front (cheapest for its goodput)")
        for k, i in enumerate(front, 1):
            ax.annotate(str(k), (xs[i], ys[i]), fontsize=8, xytext=(4, -10),
                        textcoords="offset points", color="C3")
            ax.plot([], [], " ", label=f"{k}: {names[i]}")
    if target_rate is not None:
        ax.axhline(target_rate, color="0.4", linestyle=":", label=f"target {target_rate:g} req/s")
    ax.set_xlabel(label(cost))
    ax.set_ylabel(ylabel)
    ax.set_title("Cost vs goodput")
    ax.grid(True, alpha=0.3)
    legend_below(fig, ax)
    return fig


def _pool_axis(axes: list[str], role: str) -> str | None:
    hits = [a for a in axes if a.endswith(".instances") and role in a.split(".")]
    return hits[0] if len(hits) == 1 else None


def pd_ratio_heatmap(frame: pd.DataFrame, *, metric: str = "slo_attainment",
                     prefill: str | None = None, decode: str | None = None,
                     facet: str | None = None) -> Figure:
    """Prefill instances x decode instances, coloured by ``metric``; one panel per ``facet``.

    The prefill and decode axes default to the sweep axes ``cluster.pools.<name>.instances``
    whose pool name contains ``prefill`` / ``decode``; ``facet`` defaults to the rate axis.
    """
    axes = axis_columns(frame)
    prefill = prefill or _pool_axis(axes, "prefill")
    decode = decode or _pool_axis(axes, "decode")
    if prefill is None or decode is None:
        raise ConfigError("the P:D heatmap needs two axes for the prefill and decode instance "
                          f"counts (e.g. cluster.pools.prefill.instances); sweep axes: {axes}")
    require(frame, [prefill, decode, metric], "P:D heatmap")
    if facet is None and RATE in axes and RATE not in (prefill, decode):
        facet = RATE
    by = [prefill, decode, *([facet] if facet else [])]
    cost = "cost_usd_per_hour"
    table = pooled(frame, by, [metric, *([cost] if cost in frame and metric != cost else [])])
    facets = sorted(table[facet].unique()) if facet else [None]
    fig, panels = new_figure(len(facets), 1, width=4.2, height=4.0)
    ps, ds = sorted(table[prefill].unique()), sorted(table[decode].unique())
    values = table[f"{metric}_mean"].to_numpy(float) * scale(metric)
    vmin, vmax = (0.0, 100.0) if metric == "slo_attainment" else (np.nanmin(values),
                                                                 np.nanmax(values))
    image = None
    for ax, value in zip(panels, facets, strict=True):
        part = table if value is None else table[table[facet] == value]
        grid = np.full((len(ps), len(ds)), np.nan)
        dollars = np.full((len(ps), len(ds)), np.nan)
        for _, row in part.iterrows():
            cell = (ps.index(row[prefill]), ds.index(row[decode]))
            grid[cell] = row[f"{metric}_mean"] * scale(metric)
            dollars[cell] = row.get(f"{cost}_mean", np.nan)
        image = ax.imshow(grid, origin="lower", cmap="viridis", vmin=vmin, vmax=vmax,
                          aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if np.isfinite(v):
                text = f"{v:.3g}" + (f"\n${dollars[i, j]:,.0f}/h" if np.isfinite(dollars[i, j])
                                     else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=8,
                        color="white" if v < vmin + 0.6 * (vmax - vmin) else "black")
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_yticks(range(len(ps)), [str(p) for p in ps])
        ax.set_xlabel(f"decode instances ({decode.removeprefix('cluster.pools.')})")
        ax.set_ylabel(f"prefill instances ({prefill.removeprefix('cluster.pools.')})")
        if facet == RATE:
            ax.set_title(f"offered rate {value:g} req/s")
        elif facet:
            ax.set_title(f"{short_names([facet])[facet]} = {value}")
    if image is not None:
        fig.colorbar(image, ax=panels, label=label(metric), shrink=0.9)
    note = " (cells: value and cluster $/hour)" if np.isfinite(
        table.get(f"{cost}_mean", pd.Series([np.nan])).to_numpy(float)).any() else ""
    fig.suptitle(f"Prefill:decode ratio: {label(metric)}{note}" + _seeds_note(frame, bars=False))
    return fig
