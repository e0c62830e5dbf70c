"""Per-class (tenant) metrics: attainment against each class's own SLO, goodput, latency
percentiles, and what happened to the requests that were not served.

A *client request* is a first attempt and its retries (same ``root_id``). It meets its
class's SLO when one of its attempts completed within every target of the class (each
attempt's latency measured from that attempt's arrival, as ``vllm bench serve`` measures
each HTTP request). Attainment = client requests meeting the SLO / client requests;
goodput = client requests meeting the SLO / run duration. Without retries a client
request is one row, and these are the definitions of :mod:`simulator.metrics.summary`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd

from simulator.metrics.summary import PERCENTILES, add_latency_columns, slo_met

STATUSES = ("completed", "shed", "cancelled", "failed", "rejected", "in_flight")


class Targets(Protocol):
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def tpot_s(self) -> float | None: ...
    @property
    def e2e_s(self) -> float | None: ...


class ClassLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def slo(self) -> Targets | None: ...


def class_names(summary: Mapping[str, Any]) -> list[str]:
    """Request classes of a run summary (its ``class_<name>_requests`` keys), in order."""
    return [k[len("class_"):-len("_requests")] for k in summary
            if k.startswith("class_") and k.endswith("_requests")]


def met_slo(requests: pd.DataFrame, classes: Sequence[ClassLike], default: Targets) -> pd.Series:
    """True for completed attempts within every target of their own class."""
    reqs = requests if "ttft_s" in requests else add_latency_columns(requests)
    ok = pd.Series(False, index=reqs.index)
    for cls in classes:
        rows = reqs["class"] == cls.name
        t = cls.slo or default
        ok[rows] = slo_met(reqs[rows], t.ttft_s, t.tpot_s, t.e2e_s)
    return ok


def class_table(requests: pd.DataFrame, classes: Sequence[ClassLike], default: Targets,
                duration: float) -> pd.DataFrame:
    """One row per class: counts, attainment, goodput and latency percentiles."""
    reqs = requests if "ttft_s" in requests else add_latency_columns(requests)
    met = met_slo(reqs, classes, default)
    rows: list[dict[str, Any]] = []
    for cls in classes:
        mine = reqs[reqs["class"] == cls.name]
        clients = mine["root_id"].nunique()
        served = mine.loc[met[mine.index], "root_id"].nunique()
        counts = mine["status"].value_counts()
        row: dict[str, Any] = {"class": cls.name, "requests": int(clients),
                               "attempts": len(mine), "retried": int((mine["attempt"] > 0).sum())}
        row.update({s: int(counts.get(s, 0)) for s in STATUSES})
        row["slo_attainment"] = served / clients if clients else float("nan")
        row["goodput"] = served / duration if np.isfinite(duration) and duration > 0 else 0.0
        done = mine[mine["status"] == "completed"]
        for metric in ("ttft", "tpot", "e2e"):
            values = done[f"{metric}_s"].dropna().to_numpy(dtype=float)
            for q in PERCENTILES:
                row[f"{metric}_p{q}_s"] = (float(np.percentile(values, q)) if len(values)
                                           else float("nan"))
        rows.append(row)
    return pd.DataFrame(rows)


def class_summary(requests: pd.DataFrame, classes: Sequence[ClassLike], default: Targets,
                  duration: float) -> dict[str, Any]:
    """Flat summary keys: ``class_<name>_<metric>`` per class, the worst class's
    attainment, totals of shed / cancelled / retried, and the whole run's attainment and
    goodput against each request's own class SLO (these replace the single-SLO ones)."""
    table = class_table(requests, classes, default, duration)
    out: dict[str, Any] = {}
    for row in table.to_dict("records"):
        name = row.pop("class")
        out.update({f"class_{name}_{k}": v for k, v in row.items()})
    clients = int(table["requests"].sum())
    served = float((table["slo_attainment"] * table["requests"]).fillna(0).sum())
    out["slo_attainment"] = served / clients if clients else float("nan")
    out["goodput"] = served / duration if np.isfinite(duration) and duration > 0 else 0.0
    out["slo_attainment_min_class"] = float(table["slo_attainment"].min())
    for key in ("shed", "cancelled", "retried"):
        out[key] = int(table[key].sum())
    return out
