"""Predicted against measured: one log-log panel per serving engine."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

_MARKERS = {"ttft_ms": "o", "tpot_ms": "s", "itl_ms": "D", "e2e_ms": "^", "output_tok_s": "*"}
_COLORS = {"ttft_ms": "C0", "tpot_ms": "C1", "itl_ms": "C2", "e2e_ms": "C3", "output_tok_s": "C4"}


def parity_plot(errors: pd.DataFrame, title: str = "Serving: simulated vs measured") -> Figure:
    """``errors`` has ``engine, metric, measured, predicted`` and ``split``
    (calibration points hollow, validation filled); the diagonal and ±10 % band are drawn."""
    engines = sorted(errors["engine"].unique())
    fig = Figure(figsize=(4.2 * max(len(engines), 1), 4.2))
    axes = fig.subplots(1, max(len(engines), 1), squeeze=False)
    for ax, engine in zip(axes[0], engines, strict=False):
        grp = errors[errors["engine"] == engine]
        for (metric, split), pts in grp.groupby(["metric", "split"], sort=True):
            color = _COLORS.get(str(metric), "C5")
            ax.scatter(pts["measured"], pts["predicted"], marker=_MARKERS.get(str(metric), "o"),
                       facecolors="none" if split == "calibration" else color,
                       edgecolors=color, label=f"{metric} ({split})", s=30)
        lo = float(min(grp["measured"].min(), grp["predicted"].min())) / 1.5
        hi = float(max(grp["measured"].max(), grp["predicted"].max())) * 1.5
        if hi / lo < 10:  # keep at least one labelled decade on each axis
            lo, hi = 10 ** np.floor(np.log10(lo)), 10 ** np.ceil(np.log10(hi))
        line = np.geomspace(lo, hi, 50)
        ax.plot(line, line, color="black", lw=0.8)
        ax.fill_between(line, line / 1.1, line * 1.1, color="grey", alpha=0.2, lw=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured (ms or tokens/s)")
        ax.set_ylabel("simulated (same unit)")
        ax.set_title(engine)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
