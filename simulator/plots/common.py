"""What every plot shares: metric labels with units, configuration labels, seed pooling.

Plots build :class:`matplotlib.figure.Figure` objects directly (no ``pyplot``), so they
hold no global state and need no display; ``save`` writes PNG and SVG.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from simulator.metrics.stats import aggregate_seeds

# metric -> (label with unit, scale applied to the stored value)
LABELS: dict[str, tuple[str, float]] = {
    "workload.arrival.rate_per_s": ("offered request rate (req/s)", 1.0),
    "request_throughput": ("achieved throughput (req/s)", 1.0),
    "output_token_throughput": ("output throughput (tokens/s)", 1.0),
    "total_token_throughput": ("total throughput (tokens/s)", 1.0),
    "goodput": ("goodput (req/s meeting every SLO)", 1.0),
    "goodput_per_device": ("goodput per device (req/s/device)", 1.0),
    "goodput_rate_per_s": ("goodput: max rate meeting the SLO target (req/s)", 1.0),
    "goodput_rate_per_device": ("goodput per device (req/s/device)", 1.0),
    "slo_attainment": ("SLO attainment (% of requests)", 100.0),
    "cost_usd_per_hour": ("cluster cost ($/hour)", 1.0),
    "cost_usd_per_1m_output_tokens": ("cost ($ per million output tokens)", 1.0),
    "energy_j_per_output_token": ("energy (J per output token)", 1.0),
    "devices": ("devices", 1.0),
}
for _m, _name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E latency")):
    for _s in ("mean", "p50", "p90", "p99"):
        LABELS[f"{_m}_{_s}_s"] = (f"{_name} {_s} (ms)", 1e3)


def label(metric: str) -> str:
    return LABELS.get(metric, (metric, 1.0))[0]


def scale(metric: str) -> float:
    return LABELS.get(metric, (metric, 1.0))[1]


def axis_columns(frame: pd.DataFrame) -> list[str]:
    """Sweep axes are the columns named by dotted scenario paths."""
    return [c for c in frame.columns if "." in c and c != "scenario_json"]


def short_names(paths: Sequence[str]) -> dict[str, str]:
    """Shortest unique tails: ``cluster.pools.prefill.instances`` -> ``prefill.instances``."""
    out: dict[str, str] = {}
    for path in paths:
        parts = path.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            others = [p for p in paths if p != path and p.split(".")[-n:] == parts[-n:]]
            if not others:
                out[path] = tail
                break
        else:
            out[path] = path
    return out


def config_labels(frame: pd.DataFrame, group: Sequence[str]) -> pd.Series:
    """One legend label per row from its ``group`` columns (``tp=4, instances=2``).

    With a single text column (a layout axis labelled ``1P1D TP4``) the label is the text
    alone; the legend title names the axis (:func:`legend_title`).
    """
    if not group:
        return pd.Series(["all runs"] * len(frame), index=frame.index)
    names = short_names(list(group))
    alone = len(group) == 1 and frame[group[0]].map(lambda v: isinstance(v, str)).all()

    def one(name: str, value: object) -> str:
        if alone:
            return str(value)
        if name.endswith(".instances"):  # cluster.pools.<pool>.instances
            return f"{name.removesuffix('.instances')}×{value}"
        return f"{name}={value}"

    return frame[list(group)].apply(
        lambda r: ", ".join(one(names[g], r[g]) for g in group), axis=1)


def legend_title(frame: pd.DataFrame, group: Sequence[str]) -> str | None:
    """The axis a single-text-column legend varies (``pools``), else no title."""
    if len(group) == 1 and group[0] in frame and frame[group[0]].map(
            lambda v: isinstance(v, str)).all():
        return short_names(list(group))[group[0]]
    return None


def pooled(frame: pd.DataFrame, by: Sequence[str], metrics: Iterable[str]) -> pd.DataFrame:
    """Successful runs pooled over seeds: ``<m>_mean`` and ``<m>_ci95`` for each metric."""
    ok = frame[frame["status"] == "ok"] if "status" in frame else frame
    metrics = [m for m in metrics if m in ok]
    if ok.empty:
        return pd.DataFrame(columns=[*by, "n_seeds"])
    return aggregate_seeds(ok, list(by), metrics)


def require(frame: pd.DataFrame, columns: Iterable[str], kind: str) -> None:
    from simulator.errors import ConfigError

    missing = [c for c in columns if c not in frame]
    if missing:
        raise ConfigError(f"the {kind} plot needs column(s) {missing}; the results have: "
                          f"{', '.join(c for c in frame.columns if c != 'scenario_json')}")


def legend_below(fig: Figure, ax: Axes, title: str | None = None) -> None:
    """One legend below the panels, from ``ax``'s labelled artists: outside the data, so it
    never covers a curve, and constrained layout keeps room for it whatever the label
    lengths (long labels wrap)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    wrapped = [textwrap.fill(str(t), 48) for t in labels]
    ncols = max(1, min(len(labels), 4 if max(len(t) for t in labels) < 28 else 2))
    fig.legend(handles, wrapped, loc="outside lower center", ncols=ncols, fontsize="small",
               title=title, title_fontsize="small", frameon=False)


def plain_log_axis(ax: Axes, axis: str = "y") -> None:
    """Log-axis ticks at 1-2-5 steps written as plain numbers (``20``, ``50``, ``100``),
    not ``2×10¹``; no minor labels."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 6.0,
               height: float = 4.2) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    return fig, axes


def save(fig: Figure, base: str | Path, formats: Sequence[str] = ("png", "svg"),
         dpi: int = 130) -> list[Path]:
    """Write ``base.png`` / ``base.svg``; returns the paths written."""
    base = Path(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = base.with_suffix(f".{fmt}")
        fig.savefig(path, dpi=dpi)
        paths.append(path)
    return paths
