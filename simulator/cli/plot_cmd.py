"""`disagg-sim plot RESULTS --kind KIND`: figures from a sweep, a plan or a single run."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer

from simulator.cli.app import app
from simulator.cli.outputs import check_out_file
from simulator.errors import ConfigError


class Kind(StrEnum):
    latency = "latency"
    goodput = "goodput"
    pareto = "pareto"
    pd_heatmap = "pd-heatmap"
    cdf = "cdf"
    timeline = "timeline"
    monitoring = "monitoring"
    capacity = "capacity"
    class_cdf = "class-cdf"


SWEEP_KINDS = {Kind.latency, Kind.goodput, Kind.pareto, Kind.pd_heatmap, Kind.capacity}
X_ALIASES = {"rate": "workload.arrival.rate_per_s", "throughput": "request_throughput",
             "tokens": "output_token_throughput"}


def _read_parquet(path: Path) -> pd.DataFrame:
    """A Parquet table; an unreadable one is bad input naming the file."""
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        reason = " ".join(str(exc).split())[:160]
        raise ConfigError(f"not a readable Parquet table ({type(exc).__name__}: {reason})",
                          file=str(path)) from None


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    from simulator.config_io import read_yaml

    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping (a resolved scenario)", file=str(path))
    return data


def _interval(value: Any, path: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 2**53:
        raise ConfigError(f"must be a positive number of seconds, got {value!r}",
                          file=str(path), key="simulation.monitor_interval_s")
    return float(value)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"not readable JSON ({type(exc).__name__})", file=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", file=str(path))
    return data


def _table(results: Path) -> tuple[pd.DataFrame, Path]:
    """The results table and the folder it lives in."""
    if results.is_file() and results.suffix == ".parquet":
        return _read_parquet(results), results.parent
    for name in ("results.parquet", "plan.parquet"):
        if (results / name).is_file():
            return _read_parquet(results / name), results
    raise ConfigError("no results.parquet (sweep) or plan.parquet (plan) here; give a sweep "
                      "or plan output folder, or a .parquet file", file=str(results))


MAX_CDF_RUNS = 10
"""Most curves the CDF plot draws unless runs are chosen with ``--run`` (one colour each)."""


def _run_frames(results: Path, run_ids: list[str] | None, kind: Kind
                ) -> tuple[dict[str, dict[str, pd.DataFrame]], dict[str, float], str]:
    """{label: {"requests": df, "steps": df}}, the SLO, and a note saying what is shown
    when it is not everything, from a run folder or a sweep."""
    if (results / "requests.parquet").is_file():  # `disagg-sim run --out` folder
        resolved = results / "scenario.resolved.yaml"
        slo = (_read_yaml_mapping(resolved).get("slo") or {}) if resolved.is_file() else {}
        frames = {n: _read_parquet(results / f"{n}.parquet") for n in ("requests", "steps")}
        return {results.name: frames}, {k: v for k, v in slo.items() if v}, ""
    table, folder = _table(results)
    if "run_id" not in table:
        raise ConfigError(f"the {kind.value} plot needs a run folder or a sweep folder",
                          file=str(results))
    ok = table[table["status"] == "ok"]
    if run_ids:
        chosen = ok[ok["run_id"].apply(lambda r: any(r.startswith(p) for p in run_ids))]
        if chosen.empty:
            raise ConfigError(f"no successful run matches {run_ids}", file=str(results),
                              key="--run")
    elif kind == Kind.timeline:
        chosen = ok.head(1)
    else:  # one run per configuration (lowest seed)
        chosen = ok.sort_values("seed").drop_duplicates("config_id").sort_values("index")
    note = ""
    configs = ok["config_id"].nunique()
    if kind != Kind.timeline and not run_ids and len(chosen) > MAX_CDF_RUNS:
        note = (f"the first {MAX_CDF_RUNS} of {configs} configurations (lowest seed each); "
                "choose others with --run")
        chosen = chosen.head(MAX_CDF_RUNS)
    elif kind != Kind.timeline and not run_ids and configs > 1:
        note = f"all {configs} configurations (lowest seed each)"
    meta_path = folder / "sweep.json"
    meta = _read_json(meta_path) if meta_path.is_file() else {}
    from simulator.plots.common import axis_columns, config_labels
    from simulator.plots.sweep import slo_targets

    axes = axis_columns(chosen)
    labels = config_labels(chosen, axes) if axes else chosen["run_id"]
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for (_, row), name in zip(chosen.iterrows(), labels, strict=True):
        out[f"{name} (seed {row['seed']})"] = _load_or_rerun(folder, row, meta)
    return out, slo_targets(chosen), note


def _class_ttft_targets(results: Path, slo: dict[str, float]) -> dict[str, float]:
    """Each request class's TTFT target, from a run folder's resolved scenario (a class
    without its own SLO has the scenario's)."""
    resolved = results / "scenario.resolved.yaml"
    if not resolved.is_file():
        return {}
    workload = _read_yaml_mapping(resolved).get("workload") or {}
    out: dict[str, float] = {}
    for cls in workload.get("classes") or []:
        target = ((cls.get("slo") or {}).get("ttft_s") if isinstance(cls, dict) else None)
        target = target or slo.get("ttft_s")
        if isinstance(cls, dict) and target:
            out[str(cls.get("name"))] = float(target)
    return out


def _load_or_rerun(folder: Path, row: pd.Series, meta: dict[str, Any]) -> dict[str, pd.DataFrame]:
    saved = folder / "runs" / row["run_id"]
    if (saved / "requests.parquet").is_file():
        return {n: _read_parquet(saved / f"{n}.parquet") for n in ("requests", "steps")}
    # Frames were not saved: runs are deterministic, so simulate this one again.
    from simulator.runner.run import run
    from simulator.scenario.schema import Scenario

    scenario = Scenario.model_validate(json.loads(row["scenario_json"]))
    base_dir = Path(meta.get("base_dir") or folder)
    result = run(scenario, base_dir=base_dir, file=meta.get("file"))
    return {"requests": result.requests, "steps": result.steps}


@app.command()
def plot(
    results: Annotated[Path, typer.Argument(help="Sweep or plan output folder, a .parquet "
                                                 "table, or a `run --out` folder.")],
    *,
    kind: Annotated[Kind, typer.Option(help="Which figure.")] = Kind.latency,
    out: Annotated[Path | None, typer.Option(help="Folder for the images "
                                                  "(default: RESULTS/plots).")] = None,
    x: Annotated[str, typer.Option(help="x axis of latency/goodput plots: rate, throughput, "
                                        "tokens, or a column name.")] = "rate",
    metric: Annotated[str, typer.Option(help="Colour of the P:D heatmap (a results "
                                             "column).")] = "slo_attainment",
    run_id: Annotated[list[str] | None, typer.Option("--run", help="Run id (or prefix) for "
                                                     "cdf/timeline/class-cdf; repeatable.")] = None,
    target: Annotated[float, typer.Option(help="SLO attainment target.")] = 0.9,
    formats: Annotated[str, typer.Option("--format", help="Comma-separated image "
                                                          "formats.")] = "png,svg",
) -> None:
    """Draw a figure (PNG and SVG) from results."""
    import matplotlib

    matplotlib.use("Agg")
    from simulator import plots

    if not 0 < target <= 1:  # NaN fails this too
        raise ConfigError(f"must be a share in (0, 1], got {target}", file="command line",
                          key="--target")
    if not results.exists():
        raise ConfigError("not found; give a sweep, plan or run output folder, or a .parquet "
                          "table", file=str(results))
    folder = results if results.is_dir() else results.parent
    out = out or folder / "plots"
    check_out_file(out / kind.value.replace("-", "_"), "--out")
    fmts = [f.strip() for f in formats.split(",") if f.strip()]
    try:
        fig = _figure(results, kind, xcol=X_ALIASES.get(x, x), metric=metric, run_id=run_id,
                      target=target)
    except ConfigError as exc:
        raise exc.with_file(str(results)) from None
    paths = plots.save(fig, out / kind.value.replace("-", "_"), fmts)
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


def _figure(results: Path, kind: Kind, *, xcol: str, metric: str,
            run_id: list[str] | None, target: float) -> Any:
    from simulator import plots

    if kind in SWEEP_KINDS:
        table, _ = _table(results)
        if kind == Kind.latency:
            fig = plots.latency_vs_throughput(table, x=xcol)
        elif kind == Kind.goodput:
            fig = plots.goodput_vs_rate(table, x=xcol, target=target)
        elif kind == Kind.pd_heatmap:
            fig = plots.pd_ratio_heatmap(table, metric=metric)
        elif kind == Kind.capacity:
            if "label" not in table:
                raise ConfigError("the capacity plot is drawn from a plan folder (plan.parquet)")
            fig = plots.capacity_vs_rate(table)
        elif "label" in table:  # a planner table: one row per configuration
            rate = (float(table["target_rate_per_s"].iloc[0])
                    if "target_rate_per_s" in table else None)
            fig = plots.cost_vs_goodput(table, labels=table["label"], target_rate=rate)
        else:
            fig = plots.cost_vs_goodput(table, target=target)
    else:
        frames, slo, note = _run_frames(results, run_id, kind)
        if kind == Kind.cdf:
            if note.startswith("the first"):
                typer.echo(f"note: the CDF shows {note}", err=True)
            fig = plots.latency_cdf({k: v["requests"] for k, v in frames.items()}, slo=slo,
                                    note=note)
        elif kind == Kind.class_cdf:
            fig = plots.class_ttft_cdf({k: v["requests"] for k, v in frames.items()},
                                       _class_ttft_targets(results, slo))
        elif kind == Kind.monitoring:
            from simulator.metrics.monitoring import pool_timeseries

            name, first = next(iter(frames.items()))
            interval = 10.0
            resolved = results / "scenario.resolved.yaml"
            if resolved.is_file():
                sim = _read_yaml_mapping(resolved).get("simulation") or {}
                interval = _interval(sim.get("monitor_interval_s", interval), resolved)
            events_path = results / "events.parquet"
            events = _read_parquet(events_path) if events_path.is_file() else None
            fig = plots.monitoring_plot(
                pool_timeseries(first["steps"], first["requests"], interval), events,
                title=f"Monitoring: {name}")
        else:
            name, first = next(iter(frames.items()))
            fig = plots.run_timeline(first["steps"], title=f"Run timeline: {name}")
    return fig
