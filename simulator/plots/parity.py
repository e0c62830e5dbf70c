"""Predicted against measured: one log-log panel per serving engine."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

_MARKERS = {"ttft_ms": "o", "tpot_ms": "s", "itl_ms": "D", "e2e_ms": "^", "output_tok_s": "*"}


def parity_plot(errors: pd.DataFrame, title: str = "Serving: simulated vs measured") -> Figure:
    """``errors`` has ``engine, metric, measured, predicted`` and ``split``
    (calibration points hollow, validation filled); the diagonal and ±10 % band are drawn."""
    engines = sorted(errors["engine"].unique())
    fig = Figure(figsize=(4.2 * max(len(engines), 1), 4.2))
    axes = fig.subplots(1, max(len(engines), 1), squeeze=False)
    for ax, engine in zip(axes[0], engines, strict=False):
        grp = errors[errors["engine"] == engine]
        for (metric, split), pts in grp.groupby(["metric", "split"], sort=True):
            ax.scatter(pts["measured"], pts["predicted"], marker=_MARKERS.get(str(metric), "o"),
                       facecolors="none" if split == "calibration" else None,
                       edgecolors="C0" if split == "calibration" else None,
                       label=f"{metric} ({split})", s=28)
        lo = float(min(grp["measured"].min(), grp["predicted"].min())) / 1.5
        hi = float(max(grp["measured"].max(), grp["predicted"].max())) * 1.5
        line = np.geomspace(lo, hi, 50)
        ax.plot(line, line, color="black", lw=0.8)
        ax.fill_between(line, line / 1.1, line * 1.1, color="grey", alpha=0.2, lw=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured")
        ax.set_ylabel("simulated")
        ax.set_title(engine)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
