"""RunResult: the frames and summary of one simulated run, and how to save them."""

from __future__ import annotations

import json
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
        return out

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{k}</td><td>{_fmt(v)}</td></tr>" for k, v in self.summary.items()
        )
        return (f"<b>RunResult</b> {self.scenario.name}: {len(self.requests)} requests, "
                f"{len(self.steps)} steps<table>{rows}</table>")

    def __repr__(self) -> str:
        s = self.summary
        return (f"RunResult({self.scenario.name!r}, requests={len(self.requests)}, "
                f"completed={s.get('completed')}, ttft_p90_s={s.get('ttft_p90_s'):.4g}, "
                f"tpot_p90_s={s.get('tpot_p90_s'):.4g})")


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, float) and v != v:
            out[k] = None
        elif hasattr(v, "item"):
            out[k] = v.item()
        else:
            out[k] = v
    return out
