"""`disagg-sim compare A.yaml B.yaml ...`: scenarios side by side."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from simulator.cli.app import app
from simulator.cli.overrides import apply_sets
from simulator.cli.render import make_console

COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("devices", "devices", 1),
    ("completed", "completed", 1),
    ("goodput", "goodput req/s", 1),
    ("goodput_per_device", "goodput/dev", 1),
    ("slo_attainment", "SLO %", 100),
    ("ttft_p90_s", "TTFT p90 ms", 1e3),
    ("tpot_p90_s", "TPOT p90 ms", 1e3),
    ("itl_p99_s", "ITL p99 ms", 1e3),
    ("output_token_throughput", "out tok/s", 1),
    ("cost_usd_per_hour", "$/hour", 1),
    ("cost_usd_per_1m_output_tokens", "$/1M out tok", 1),
)


def _fmt(v: Any, scale: float) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        x = v * scale
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return str(v)


def comparison_table(names: list[str], cells: list[list[str]], width: int) -> Table:
    """Scenarios as rows when that fits in ``width`` columns, else metrics as rows and
    scenarios as columns: numbers are never cut to fit a narrow terminal."""
    wide = Table(title="Comparison")
    wide.add_column("scenario", overflow="fold")
    for _, label, _ in COLUMNS:
        wide.add_column(label, justify="right", no_wrap=True)
    for name, row in zip(names, cells, strict=True):
        wide.add_row(name, *row)
    need = (sum(max(len(label), *(len(r[i]) for r in cells)) + 3
                for i, (_, label, _) in enumerate(COLUMNS))
            + min(24, max(len(n) for n in names)) + 4)
    if need <= width:
        return wide
    tall = Table(title="Comparison")
    tall.add_column("metric", no_wrap=True)
    for name in names:
        tall.add_column(name, justify="right", overflow="fold")
    for i, (_, label, _) in enumerate(COLUMNS):
        tall.add_row(label, *(r[i] for r in cells))
    return tall


@app.command()
def compare(
    scenarios: Annotated[list[Path], typer.Argument(help="Scenario YAML files.")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override KEY=VALUE in "
                                                   "every scenario (repeatable).")] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="Override every scenario's seed.")] = None,
    csv: Annotated[Path | None, typer.Option(help="Also write the table as CSV.")] = None,
) -> None:
    """Simulate several scenarios and print goodput, p90 TTFT/TPOT and cost side by side."""
    import pandas as pd

    from simulator.runner.run import run as run_scenario
    from simulator.scenario.load import load_scenario, scenario_dir

    names: list[str] = []
    cells: list[list[str]] = []
    rows = []
    for path in scenarios:
        sc = apply_sets(load_scenario(path), set_, str(path))
        res = run_scenario(sc, seed=seed, base_dir=scenario_dir(path), file=str(path))
        s = res.summary
        names.append(sc.name)
        cells.append([_fmt(s.get(k, float("nan")), scale) for k, _, scale in COLUMNS])
        rows.append({"scenario": sc.name, "file": str(path),
                     **{k: s.get(k) for k, _, _ in COLUMNS}})
    console = make_console()
    console.print(comparison_table(names, cells, console.width))
    if csv is not None:
        pd.DataFrame(rows).to_csv(csv, index=False)
