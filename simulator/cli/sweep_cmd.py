"""`disagg-sim sweep SWEEP.yaml --out DIR`: run a grid of scenarios x seeds, resumably."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from simulator.cli.app import app
from simulator.cli.render import make_console

# (column, header, scale) of the per-configuration table.
METRICS: tuple[tuple[str, str, float], ...] = (
    ("slo_attainment", "SLO %", 100),
    ("goodput", "goodput req/s", 1),
    ("goodput_rate_per_s", "max rate req/s", 1),
    ("ttft_p90_s", "TTFT p90 ms", 1e3),
    ("tpot_p90_s", "TPOT p90 ms", 1e3),
    ("output_token_throughput", "out tok/s", 1),
    ("cost_usd_per_hour", "$/h", 1),
    ("cost_usd_per_1m_output_tokens", "$/1M out", 1),
)


def _num(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _cell(row: pd.Series, metric: str, scale: float) -> str:
    mean = row.get(f"{metric}_mean", math.nan)
    half = row.get(f"{metric}_ci95", math.nan)
    text = _num(float(mean) * scale)
    if isinstance(half, float) and math.isfinite(half):
        text += f" ± {_num(half * scale)}"
    return text


def config_table(by_config: pd.DataFrame, axes: list[str], title: str,
                 limit: int = 40) -> Table:
    """Axes, seeds and key metrics (mean ± 95 % CI half-width when there are several seeds)."""
    table = Table(title=title, header_style="bold")
    for axis in axes:
        table.add_column(axis.removeprefix("cluster.pools.").removeprefix("workload."))
    table.add_column("seeds", justify="right")
    shown = [(m, h, s) for m, h, s in METRICS if f"{m}_mean" in by_config]
    for _, header, _ in shown:
        table.add_column(header, justify="right")
    for _, row in by_config.head(limit).iterrows():
        cells: list[Any] = [str(row[a]) for a in axes]
        cells.append(str(int(row["n_seeds"])))
        cells += [_cell(row, m, s) for m, _, s in shown]
        table.add_row(*cells)
    if len(by_config) > limit:
        table.caption = f"first {limit} of {len(by_config)} configurations"
    return table


class _Bar:
    """Adapts the sweep's progress callback to a rich progress bar on stderr."""

    def __init__(self, name: str) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("runs, [red]{task.fields[failed]} failed"), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True))
        self.name = name
        self.task: Any = None

    def __call__(self, done: int, failed: int, total: int) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task(self.name, total=total, completed=done,
                                               failed=failed)
        else:
            self.progress.update(self.task, completed=done, failed=failed)

    def stop(self) -> None:
        self.progress.stop()


@app.command()
def sweep(
    sweep_file: Annotated[Path, typer.Argument(metavar="SWEEP.yaml", help="Sweep YAML file.")],
    *,
    out: Annotated[Path, typer.Option(help="Results folder (created; reused to resume).")],
    workers: Annotated[int | None, typer.Option(help="Parallel runs (default: one per CPU; "
                                                     "1 runs in this process).")] = None,
    executor: Annotated[str, typer.Option(help="local (process pool) or dask.")] = "local",
    scheduler: Annotated[str | None, typer.Option(help="Dask scheduler address, e.g. "
                                                       "tcp://host:8786 (default: start a "
                                                       "local Dask cluster).")] = None,
    frames: Annotated[bool | None, typer.Option("--frames/--no-frames", help="Save each "
                                                "run's request/step/transfer frames "
                                                "(default: the sweep file's `frames`).")] = None,
    retry_failed: Annotated[bool, typer.Option(help="Rerun runs that failed last time.")] = True,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help=(
        "Show the progress bar (default: when stderr is a terminal)."))] = None,
) -> None:
    """Run every point of a sweep x its seeds; rerun the same command to resume."""
    from simulator.runner.sweep import aggregate, expand, load_sweep, run_sweep

    loaded = load_sweep(sweep_file)
    if frames is not None and frames != loaded.spec.frames:
        loaded = expand(loaded.spec.model_copy(update={"frames": frames}),
                        file=loaded.file, folder=sweep_file.resolve().parent)
    console = make_console()
    seeds = len({t.seed for t in loaded.tasks})
    console.print(f"sweep {loaded.spec.name}: {len(loaded.tasks)} runs "
                  f"({len(loaded.tasks) // max(1, seeds)} points x {seeds} seeds) -> {out}")
    show = progress if progress is not None else sys.stderr.isatty()
    bar = _Bar(loaded.spec.name) if show else None
    try:
        table = run_sweep(loaded, out, executor=executor, workers=workers,
                          scheduler=scheduler, retry_failed=retry_failed, progress=bar)
    finally:
        if bar is not None:
            bar.stop()
    by_config = aggregate(table, loaded.axes)
    if len(by_config):
        console.print(config_table(by_config, loaded.axes, f"{loaded.spec.name}: by "
                                   "configuration (mean ± 95 % CI over seeds)"))
    failed = table[table["status"] != "ok"] if len(table) else table
    if len(failed):
        console.print(f"[red]{len(failed)} run(s) failed[/red]; first errors:")
        for _, row in failed.head(3).iterrows():
            console.print(f"  {row['run_id']}: {row['error']}")
    console.print(f"wrote {out}/results.parquet ({len(table)} runs), "
                  f"{out}/aggregate.parquet ({len(by_config)} configurations)")
    if len(failed) == len(table) and len(table):
        raise typer.Exit(1)
