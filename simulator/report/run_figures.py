"""Interactive figures of one run (plotly): latency CDFs, monitoring per pool, phases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

TEMPLATE = "plotly_white"
MAX_PHASE_REQUESTS = 2000
"""Most requests drawn one bar each in the phase breakdown (evenly spaced beyond that)."""

PHASES = (("queue_s", "queue (prefill)"), ("prefill_s", "prefill"),
          ("transfer_queue_s", "KV transfer wait"), ("transfer_s", "KV transfer"),
          ("decode_queue_s", "decode admission wait"), ("decode_s", "decode"))


def latency_cdfs(requests: pd.DataFrame, slo: dict[str, Any]) -> go.Figure:
    """Empirical CDFs of TTFT, TPOT and E2E of completed requests, SLO targets marked."""
    done = requests[requests["status"] == "completed"] if "status" in requests else requests
    metrics = [m for m in ("ttft_s", "tpot_s", "e2e_s") if m in done]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[
        f"{m.split('_')[0].upper()} (ms)" for m in metrics])
    for col, metric in enumerate(metrics, 1):
        values = np.sort(done[metric].dropna().to_numpy(float)) * 1e3
        share = np.arange(1, len(values) + 1) / max(1, len(values))
        fig.add_trace(go.Scatter(
            x=values, y=share, mode="lines", line_shape="hv", name=metric.split("_")[0].upper(),
            hovertemplate="%{x:.4g} ms: %{y:.1%} of requests<extra></extra>"), row=1, col=col)
        target = slo.get(metric)
        if target:  # a trace, so that it toggles and sits right on a log axis
            fig.add_trace(go.Scatter(x=[target * 1e3] * 2, y=[0, 1], mode="lines",
                                     name=f"SLO {metric.split('_')[0].upper()} "
                                          f"{target * 1e3:g} ms",
                                     line={"dash": "dot", "color": "grey"}), row=1, col=col)
        positive = values[values > 0]
        if len(positive) and positive[-1] / positive[0] > 20:
            fig.update_xaxes(type="log", row=1, col=col)
    fig.update_yaxes(title_text="fraction of completed requests", range=[0, 1.02], row=1, col=1)
    fig.update_layout(template=TEMPLATE, height=380,
                      title=f"Latency distributions ({len(done)} completed requests)")
    return fig


MONITORED = (("queue_len", "waiting requests", 1.0), ("running", "running requests", 1.0),
             ("kv_usage", "KV blocks in use (%)", 100.0),
             ("compute_util", "compute-bound time (%)", 100.0),
             ("memory_util", "memory-bound time (%)", 100.0))


EVENT_COLOURS = {"instance_failure": "red", "instance_recovery": "green",
                 "scale_out": "purple", "scale_in": "grey", "link_degradation": "orange",
                 "straggler": "brown"}


def monitoring(pools: pd.DataFrame, events: pd.DataFrame | None = None) -> go.Figure:
    """Per-pool time series, one row of panels per signal, one colour per pool; failures,
    recoveries and scaling actions as vertical lines (hover for the detail)."""
    shown = [m for m in MONITORED if m[0] in pools]
    fig = make_subplots(rows=len(shown), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[m[1] for m in shown])
    colours = [f"hsl({(i * 137) % 360}, 60%, 45%)" for i in range(pools["pool"].nunique())]
    for i, (pool, g) in enumerate(pools.groupby("pool", sort=True, observed=True)):
        for row, (col, title, scale) in enumerate(shown, 1):
            fig.add_trace(go.Scatter(
                x=g["time_s"], y=g[col] * scale, mode="lines", name=str(pool),
                legendgroup=str(pool), showlegend=row == 1, line={"color": colours[i]},
                hovertemplate=f"{pool} t=%{{x:.4g}} s: %{{y:.4g}}<extra>{title}</extra>"),
                row=row, col=1)
    if events is not None and len(events):
        marks = events[events["kind"].isin(list(EVENT_COLOURS))]
        for _, ev in marks.iterrows():
            for row in range(1, len(shown) + 1):
                fig.add_vline(x=float(ev["time_s"]), line_color=EVENT_COLOURS[str(ev["kind"])],
                              line_width=1, opacity=0.6, row=row, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=len(shown), col=1)
    fig.update_layout(template=TEMPLATE, height=170 * len(shown) + 80,
                      title="Monitoring per pool (click a pool in the legend to hide it)")
    return fig


def phase_breakdown(requests: pd.DataFrame) -> tuple[go.Figure, str]:
    """Stacked time of each phase per request (in arrival order), and what is shown."""
    done = requests[requests["status"] == "completed"] if "status" in requests else requests
    done = done.sort_values("arrival_s") if "arrival_s" in done else done
    note = f"all {len(done)} completed requests"
    if len(done) > MAX_PHASE_REQUESTS:
        pick = np.linspace(0, len(done) - 1, MAX_PHASE_REQUESTS).round().astype(int)
        done = done.iloc[np.unique(pick)]
        note = (f"{len(done)} of the completed requests, evenly spaced in arrival order "
                f"(at most {MAX_PHASE_REQUESTS} bars)")
    fig = go.Figure()
    ids = done["request_id"].astype(str) if "request_id" in done else done.index.astype(str)
    for col, name in PHASES:
        if col in done and float(done[col].fillna(0).abs().sum()) > 0:
            fig.add_trace(go.Bar(x=ids, y=done[col].fillna(0) * 1e3, name=name,
                                 hovertemplate=f"request %{{x}}: %{{y:.4g}} ms<extra>{name}</extra>"))
    fig.update_layout(template=TEMPLATE, barmode="stack", height=420, bargap=0,
                      title=f"Where each request's time went ({note})",
                      xaxis_title="request id (arrival order)", yaxis_title="ms",
                      xaxis={"type": "category", "showticklabels": len(done) <= 60})
    return fig, note
