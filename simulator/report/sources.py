"""What a report is built from: a `run --out` folder, a sweep folder or a plan folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import yaml

from simulator.errors import ConfigError

Kind = Literal["run", "sweep", "plan"]


@dataclass
class Source:
    kind: Kind
    folder: Path
    scenario: dict[str, Any] = field(default_factory=dict)
    """A run's resolved scenario; a sweep's or plan's first configuration."""
    summary: dict[str, Any] = field(default_factory=dict)
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def _parquet(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


def load_source(path: str | Path) -> Source:
    """Read a results folder; a folder that is none of the three is a one-line error."""
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError("not a folder; give the --out folder of `disagg-sim run`, `sweep` "
                          "or `plan`", file=str(folder))
    if (folder / "summary.json").is_file():
        resolved = folder / "scenario.resolved.yaml"
        scenario = yaml.safe_load(resolved.read_text()) if resolved.is_file() else {}
        frames = {n: _parquet(folder / f"{n}.parquet")
                  for n in ("requests", "steps", "transfers", "events")}
        return Source("run", folder, scenario or {},
                      json.loads((folder / "summary.json").read_text()), frames)
    if (folder / "plan.parquet").is_file():
        ranked = pd.read_parquet(folder / "plan.parquet")
        rejected = (pd.read_csv(folder / "rejected.csv") if (folder / "rejected.csv").is_file()
                    else pd.DataFrame())
        frames = {"ranked": ranked, "rejected": rejected,
                  "simulated": _parquet(folder / "simulated.parquet")}
        scenario = json.loads(ranked["scenario_json"].iloc[0]) if len(ranked) else {}
        meta_path = folder / "plan.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        return Source("plan", folder, scenario, {}, frames, meta)
    if (folder / "results.parquet").is_file():
        results = pd.read_parquet(folder / "results.parquet")
        meta_path = folder / "sweep.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        scenario = (json.loads(results["scenario_json"].iloc[0])
                    if len(results) and "scenario_json" in results else {})
        return Source("sweep", folder, scenario, {}, {"results": results}, meta)
    raise ConfigError("no summary.json (run), results.parquet (sweep) or plan.parquet (plan) "
                      "here; give the --out folder of `disagg-sim run`, `sweep` or `plan`",
                      file=str(folder))
