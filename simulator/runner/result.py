"""RunResult: the frames and summary of one simulated run, and how to save them."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from simulator.scenario.schema import Scenario


@dataclass
class RunResult:
    scenario: Scenario
    requests: pd.DataFrame
    steps: pd.DataFrame
    transfers: pd.DataFrame
    summary: dict[str, Any]
    events: pd.DataFrame = field(default_factory=pd.DataFrame)
    wall_s: float = 0.0
    sim_events: int = 0

    def monitoring(self, interval_s: float | None = None, *,
                   per_instance: bool = False) -> pd.DataFrame:
        """Monitoring time series per pool (or per instance), sampled every ``interval_s``
        (default: the scenario's ``simulation.monitor_interval_s``)."""
        from simulator.metrics.monitoring import instance_timeseries, pool_timeseries

        step = interval_s or self.scenario.simulation.monitor_interval_s
        if per_instance:
            return instance_timeseries(self.steps, step)
        return pool_timeseries(self.steps, self.requests, step)

    def save(self, out_dir: str | Path, *, frames: bool = True) -> Path:
        """Write summary JSON, the resolved scenario and (optionally) Parquet frames."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(_jsonable(self.summary), indent=2) + "\n")
        (out / "scenario.resolved.yaml").write_text(
            yaml.safe_dump(self.scenario.model_dump(mode="json"), sort_keys=False))
        if frames:
            self.requests.to_parquet(out / "requests.parquet", index=False)
            self.steps.to_parquet(out / "steps.parquet", index=False)
            self.transfers.to_parquet(out / "transfers.parquet", index=False)
            if len(self.events):
                self.events.to_parquet(out / "events.parquet", index=False)
            if len(self.steps):
                self.monitoring(per_instance=True).to_parquet(out / "monitoring.parquet",
                                                              index=False)
        return out

    def _repr_html_(self) -> str:
        """Notebook view: a latency matrix (ms) and the other summary figures."""
        return _summary_html(self.scenario.name, self.scenario.seed, len(self.requests),
                             len(self.steps), self.summary)

    def __repr__(self) -> str:
        s = self.summary
        return (f"RunResult({self.scenario.name!r}, requests={len(self.requests)}, "
                f"completed={s.get('completed')}, ttft_p90_s={s.get('ttft_p90_s'):.4g}, "
                f"tpot_p90_s={s.get('tpot_p90_s'):.4g})")


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


_LATENCIES = ("ttft", "tpot", "itl", "e2e")
_STATS = ("mean", "p50", "p90", "p99")


def _summary_html(name: str, seed: int, n_requests: int, n_steps: int,
                  summary: dict[str, Any]) -> str:
    esc = html.escape
    latency_keys = {f"{m}_{s}_s" for m in _LATENCIES for s in _STATS}
    head = "".join(f"<th>{s}</th>" for s in _STATS)
    lat_rows = "".join(
        f"<tr><th>{m.upper()}</th>"
        + "".join(f"<td>{_fmt(summary[f'{m}_{s}_s'] * 1e3)}</td>"
                  if isinstance(summary.get(f"{m}_{s}_s"), float) else "<td>-</td>"
                  for s in _STATS) + "</tr>"
        for m in _LATENCIES if any(f"{m}_{s}_s" in summary for s in _STATS))
    other = "".join(f"<tr><th>{esc(str(k))}</th><td>{esc(_fmt(v))}</td></tr>"
                    for k, v in summary.items() if k not in latency_keys)
    cell = "vertical-align:top;padding-right:2em"
    return (f"<div><b>RunResult</b> {esc(name)} (seed {seed}): {n_requests} requests, "
            f"{n_steps} step rows"
            f"<table><tr><td style='{cell}'><table><tr><th>latency (ms)</th>{head}</tr>"
            f"{lat_rows}</table></td><td style='{cell}'><table>{other}</table></td></tr>"
            f"</table></div>")


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, float) and math.isnan(v):
            out[k] = None
        elif hasattr(v, "item"):
            out[k] = v.item()
        else:
            out[k] = v
    return out
