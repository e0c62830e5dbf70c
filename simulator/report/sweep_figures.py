"""Interactive figures of a sweep or a plan (plotly): latency and goodput curves, the
Pareto front, the P:D heatmap, and devices / $ per hour needed against the request rate.

The numbers are the ones the PNG plots draw (:mod:`simulator.plots`): the same seed
pooling, labels, Pareto rule and interval clipping.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simulator.plots.common import axis_columns, config_labels, label, pooled, scale
from simulator.plots.sweep import RATE, _pool_axis, _sweep_goodput, pareto_front, slo_targets
from simulator.report.run_figures import TEMPLATE


def _x_axis(frame: pd.DataFrame) -> str | None:
    axes = axis_columns(frame)
    if RATE in axes:
        return RATE
    numeric = [a for a in axes if pd.api.types.is_numeric_dtype(frame[a])]
    return numeric[-1] if numeric else None


def _errors(mean: np.ndarray, half: np.ndarray, high: float = math.inf,
            log: bool = False) -> dict[str, object]:
    """Asymmetric error bars clipped as the PNG plots clip them."""
    half = np.where(np.isfinite(half), half, 0.0)
    floor = mean / 10 if log else np.zeros_like(mean)
    lower = np.clip(mean - np.maximum(mean - half, floor), 0.0, None)
    upper = np.clip(np.minimum(mean + half, high) - mean, 0.0, None)
    return {"type": "data", "symmetric": False, "array": upper, "arrayminus": lower,
            "visible": bool((lower + upper).any())}


def curves(frame: pd.DataFrame, metrics: list[tuple[str, str]], title: str,
           log: bool = False) -> go.Figure | None:
    """One panel per metric, one line per configuration against the rate axis."""
    x = _x_axis(frame)
    metrics = [(m, t) for m, t in metrics if m in frame]
    if x is None or not metrics:
        return None
    group = [a for a in axis_columns(frame) if a != x]
    table = pooled(frame, [*group, x], [m for m, _ in metrics])
    if table.empty:
        return None
    table = table.assign(_label=config_labels(table, group))
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[t for _, t in metrics])
    slo = slo_targets(frame)
    for i, (name, rows) in enumerate(table.groupby("_label", sort=False)):
        part = rows.sort_values(x)
        colour = f"hsl({(i * 137) % 360}, 60%, 45%)"
        for col, (metric, _) in enumerate(metrics, 1):
            k = scale(metric)
            mean = part[f"{metric}_mean"].to_numpy(float) * k
            err = _errors(mean, part[f"{metric}_ci95"].to_numpy(float) * k,
                          high=100.0 if metric == "slo_attainment" else math.inf, log=log)
            fig.add_trace(go.Scatter(
                x=part[x], y=mean, error_y=err, mode="lines+markers", name=str(name),
                legendgroup=str(name), showlegend=col == 1, line={"color": colour},
                hovertemplate=f"{name}<br>{label(x)} %{{x:.4g}}<br>{label(metric)} "
                              "%{y:.4g}<extra></extra>"), row=1, col=col)
    xs = [float(frame[x].min()), float(frame[x].max())]
    for col, (metric, _) in enumerate(metrics, 1):
        target = slo.get(metric.split("_")[0] + "_s")
        if target and metric.endswith(("_p90_s", "_p99_s")):
            # a trace, not a shape: it toggles with the legend and sits right on log axes
            fig.add_trace(go.Scatter(x=xs, y=[target * 1e3] * 2, mode="lines",
                                     name=f"SLO {metric.split('_')[0].upper()} "
                                          f"{target * 1e3:g} ms",
                                     line={"dash": "dot", "color": "grey"}), row=1, col=col)
        fig.update_yaxes(title_text=label(metric), row=1, col=col,
                         type="log" if log else "linear",
                         range=[-2, 102] if metric == "slo_attainment" else None)
        fig.update_xaxes(title_text=label(x), row=1, col=col)
    seeds = int(frame["seed"].nunique()) if "seed" in frame else 1
    note = f" (mean of {seeds} seeds, bars = 95 % CI)" if seeds > 1 else ""
    fig.update_layout(template=TEMPLATE, height=430, title=title + note,
                      legend_title_text=", ".join(a.split(".")[-1] for a in group) or None)
    return fig


def pareto(xs: np.ndarray, ys: np.ndarray, names: list[str], ylabel: str,
           target_rate: float | None = None, decimals: int | None = None) -> go.Figure:
    """Cost against goodput; the Pareto front joined and numbered (1 = cheapest)."""
    front = pareto_front(xs, ys, decimals)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="configuration",
                             text=names, marker={"color": "grey", "size": 8},
                             hovertemplate="%{text}<br>$%{x:,.2f}/h, %{y:.4g} req/s"
                                           "<extra></extra>"))
    if len(front):
        fig.add_trace(go.Scatter(
            x=xs[front], y=ys[front], mode="lines+markers+text", line_shape="hv",
            name="Pareto front (cheapest for its goodput)", text=[str(k) for k in
                                                                 range(1, len(front) + 1)],
            textposition="bottom right", customdata=[names[i] for i in front],
            marker={"color": "crimson", "size": 10},
            hovertemplate="%{text}: %{customdata}<br>$%{x:,.2f}/h, %{y:.4g} req/s"
                          "<extra></extra>"))
    if target_rate is not None:
        fig.add_hline(y=target_rate, line_dash="dot", line_color="grey",
                      annotation_text=f"target {target_rate:g} req/s")
    fig.update_layout(template=TEMPLATE, height=460, title="Cost vs goodput",
                      xaxis_title=label("cost_usd_per_hour"), yaxis_title=ylabel)
    return fig


def sweep_pareto(frame: pd.DataFrame, target: float = 0.9) -> go.Figure | None:
    if "cost_usd_per_hour" not in frame:
        return None
    table, ycol, group = _sweep_goodput(frame, "cost_usd_per_hour", target)
    if table.empty:
        return None
    names = (config_labels(table, group) if group else table.get(
        "config_id", pd.Series(range(len(table))))).astype(str).tolist()
    ylabel = (f"goodput: max swept rate with SLO attainment >= {target:.0%} (req/s)"
              if ycol == "swept_goodput" else label(ycol))
    return pareto(table["cost_usd_per_hour_mean"].to_numpy(float),
                  table["_y"].to_numpy(float), names, ylabel)


def pd_heatmap(frame: pd.DataFrame) -> go.Figure | None:
    """Prefill x decode instances coloured by SLO attainment; cells show it and $/hour."""
    axes = axis_columns(frame)
    prefill, decode = _pool_axis(axes, "prefill"), _pool_axis(axes, "decode")
    if prefill is None or decode is None:
        return None
    facet = RATE if RATE in axes else None
    metrics = [m for m in ("slo_attainment", "cost_usd_per_hour") if m in frame]
    table = pooled(frame, [prefill, decode, *([facet] if facet else [])], metrics)
    facets = sorted(table[facet].unique()) if facet else [None]
    fig = make_subplots(rows=1, cols=len(facets), subplot_titles=[
        f"offered rate {v:g} req/s" if v is not None else "" for v in facets])
    ps, ds = sorted(table[prefill].unique()), sorted(table[decode].unique())
    for col, value in enumerate(facets, 1):
        part = table if value is None else table[table[facet] == value]
        z = np.full((len(ps), len(ds)), np.nan)
        cost = np.full((len(ps), len(ds)), np.nan)
        for _, row in part.iterrows():
            cell = (ps.index(row[prefill]), ds.index(row[decode]))
            z[cell] = row["slo_attainment_mean"] * 100
            if "cost_usd_per_hour_mean" in row:
                cost[cell] = row["cost_usd_per_hour_mean"]
        text = [[(f"{z[i, j]:.3g} %" if np.isfinite(z[i, j]) else "")
                 + (f"<br>${cost[i, j]:,.0f}/h" if np.isfinite(cost[i, j]) else "")
                 for j in range(len(ds))] for i in range(len(ps))]
        fig.add_trace(go.Heatmap(
            z=z, x=[str(d) for d in ds], y=[str(p) for p in ps], text=text,
            texttemplate="%{text}", zmin=0, zmax=100, colorscale="Viridis",
            showscale=col == len(facets), colorbar={"title": "SLO %"},
            hovertemplate="%{y}P:%{x}D: %{text}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="decode instances", type="category", row=1, col=col)
        fig.update_yaxes(title_text="prefill instances", type="category", row=1, col=col)
    fig.update_layout(template=TEMPLATE, height=430,
                      title="Prefill:decode ratio: SLO attainment (cells: attainment and $/hour)")
    return fig


def capacity_vs_rate(ranked: pd.DataFrame) -> go.Figure | None:
    """Devices and $/hour needed against the request rate
    (:func:`simulator.runner.planner.capacity_curve`)."""
    from simulator.runner.planner import capacity_curve

    curve = capacity_curve(ranked)
    if curve.empty:
        return None
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    xs = [*curve["from_rate_per_s"], curve["to_rate_per_s"].iloc[-1]]
    labels = [*curve["label"], curve["label"].iloc[-1]]
    fig.add_trace(go.Scatter(x=xs, y=[*curve["devices"], curve["devices"].iloc[-1]],
                             mode="lines+markers", line_shape="hv", name="devices", text=labels,
                             hovertemplate="from %{x:.4g} req/s: %{y} devices<br>%{text}"
                                           "<extra></extra>"), secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[*curve["cost_usd_per_hour"],
                                      curve["cost_usd_per_hour"].iloc[-1]],
                             mode="lines+markers", line_shape="hv", name="$/hour",
                             line={"dash": "dash"}, text=labels,
                             hovertemplate="from %{x:.4g} req/s: $%{y:,.2f}/h<br>%{text}"
                                           "<extra></extra>"), secondary_y=True)
    fig.update_yaxes(title_text="devices", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="$/hour", rangemode="tozero", secondary_y=True)
    fig.update_layout(template=TEMPLATE, height=400, xaxis_title="request rate (req/s)",
                      title="Devices and $/hour needed against the request rate (cheapest "
                            "ranked configuration whose goodput covers the rate)")
    return fig
