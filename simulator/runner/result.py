"""RunResult: the frames and summary of one simulated run, and how to save them."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from simulator.engine.recorder import Recorder
from simulator.scenario.schema import Scenario


def _column_values(values: Any) -> set[int]:
    """The distinct values of a recorder column (an ``array``)."""
    if not len(values):
        return set()
    return set(np.unique(np.frombuffer(values, dtype=values.typecode)).tolist())


class StepRecords:
    """The steps of a run as ``simulation.record_steps`` kept them.

    ``all``: the per-step frame, built at the end of the run. ``stretches``: compact
    records, the per-step frame expanded (identically) the first time it is read.
    ``none``: no steps (an empty frame).
    """

    def __init__(self, recorder: Recorder, instance_names: list[str], pool_names: list[str],
                 mode: str) -> None:
        self.mode = mode
        self._names, self._pools = instance_names, pool_names
        self._recorder: Recorder | None = recorder if mode == "stretches" else None
        self._frame: pd.DataFrame | None = None
        if mode == "all":
            self._frame = recorder.steps_frame(instance_names, pool_names)
        elif mode == "none":
            self._frame = Recorder().steps_frame(instance_names, pool_names)

    def frame(self) -> pd.DataFrame:
        if self._frame is None:
            assert self._recorder is not None
            self._frame = self._recorder.steps_frame(self._names, self._pools)
        return self._frame

    def __len__(self) -> int:
        """Rows of the steps frame, counted without expanding a compact run's stretches."""
        if self._frame is not None:
            return len(self._frame)
        assert self._recorder is not None
        return len(self._recorder.steps["instance"]) + sum(self._recorder.stretches["steps"])

    def instance_series(self, interval_s: float) -> pd.DataFrame:
        """Monitoring series per instance (``metrics.monitoring``); a compact run expands
        one instance's steps at a time, never the whole frame (unless already built)."""
        from simulator.metrics.monitoring import instance_timeseries, series_of_instances

        if self._frame is not None or self._recorder is None:
            return instance_timeseries(self.frame(), interval_s)
        rec, names, pools = self._recorder, self._names, self._pools
        if not len(self):
            return instance_timeseries(self.frame(), interval_s)
        last = rec.compact_steps(names, pools).last_end()
        seen = _column_values(rec.steps["instance"]) | _column_values(rec.stretches["instance"])
        groups = ((names[i], rec.steps_frame(names, pools, instance=i))
                  for i in range(len(names)) if i in seen)
        return series_of_instances(groups, last, interval_s)

    def stretches(self) -> pd.DataFrame:
        rec = self._recorder or Recorder()
        return rec.stretches_frame(self._names, self._pools)


@dataclass
class RunResult:
    scenario: Scenario
    requests: pd.DataFrame
    step_records: StepRecords
    transfers: pd.DataFrame
    summary: dict[str, Any]
    events: pd.DataFrame = field(default_factory=pd.DataFrame)
    wall_s: float = 0.0
    sim_events: int = 0
    warnings: list[str] = field(default_factory=list)
    """What the caller should know about the run (e.g. that it stalled), one line each."""

    @property
    def steps(self) -> pd.DataFrame:
        """One row per step (see docs/metrics.md); empty under ``record_steps: none``."""
        return self.step_records.frame()

    @property
    def num_steps(self) -> int:
        """``len(self.steps)``, without building the steps frame of a compact run."""
        return len(self.step_records)

    @property
    def stretches(self) -> pd.DataFrame:
        """One row per compactly kept decode stretch (``record_steps: stretches``)."""
        return self.step_records.stretches()

    def monitoring(self, interval_s: float | None = None, *,
                   per_instance: bool = False) -> pd.DataFrame:
        """Monitoring time series per pool (or per instance), sampled every ``interval_s``
        (default: the scenario's ``simulation.monitor_interval_s``)."""
        from simulator.metrics.monitoring import pools_of_instances

        if self.step_records.mode == "none":
            raise ValueError("monitoring needs the steps: this run had simulation.record_steps: "
                             "none (use all or stretches)")
        step = interval_s or self.scenario.simulation.monitor_interval_s
        inst = self.step_records.instance_series(step)
        return inst if per_instance else pools_of_instances(inst, self.requests)

    def save(self, out_dir: str | Path, *, frames: bool = True) -> Path:
        """Write summary JSON, the resolved scenario and (optionally) Parquet frames."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(_jsonable(self.summary), indent=2) + "\n")
        (out / "scenario.resolved.yaml").write_text(
            yaml.safe_dump(self.scenario.model_dump(mode="json"), sort_keys=False))
        if frames:
            self.requests.to_parquet(out / "requests.parquet", index=False)
            if self.step_records.mode != "none":
                self.steps.to_parquet(out / "steps.parquet", index=False)
            self.transfers.to_parquet(out / "transfers.parquet", index=False)
            if len(self.events):
                self.events.to_parquet(out / "events.parquet", index=False)
            if self.step_records.mode != "none" and self.num_steps:
                self.monitoring(per_instance=True).to_parquet(out / "monitoring.parquet",
                                                              index=False)
        return out

    def _repr_html_(self) -> str:
        """Notebook view: a latency matrix (ms) and the other summary figures."""
        return _summary_html(self.scenario.name, self.scenario.seed, len(self.requests),
                             self.num_steps, self.summary)

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
