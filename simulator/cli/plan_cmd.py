"""`disagg-sim plan PLAN.yaml`: the cheapest configurations that meet the SLO at a rate."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import yaml
from rich.table import Table

from simulator.cli.app import app
from simulator.cli.render import make_console

if TYPE_CHECKING:
    from simulator.runner.planner import PlanResult


def _f(value: object, scale: float = 1.0, digits: str = ".3g") -> str:
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "-"
    return format(value * scale, digits)


@app.command()
def plan(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN.yaml", help="Plan YAML file.")],
    *,
    out: Annotated[Path | None, typer.Option(help="Write plan.parquet, rejected.csv, "
                                                  "simulated.parquet, best.yaml and the "
                                                  "Pareto plot here.")] = None,
    workers: Annotated[int | None, typer.Option(help="Parallel simulations (default: one "
                                                     "per CPU).")] = None,
    executor: Annotated[str, typer.Option(help="local (process pool) or dask.")] = "local",
    scheduler: Annotated[str | None, typer.Option(help="Dask scheduler address.")] = None,
) -> None:
    """Search colocated and disaggregated layouts; rank those meeting the SLO by cost."""
    from simulator.runner.planner import load_plan
    from simulator.runner.planner import plan as run_plan

    spec = load_plan(plan_file)
    if out is not None:  # before the search, not after it
        from simulator.runner.store import writable_folder

        writable_folder(out)
    console = make_console()
    targets = ", ".join(f"{k} <= {v:g} s" for k, v in spec.slo.model_dump().items() if v)
    console.print(f"plan {spec.name}: {spec.model} at {spec.rate:g} req/s, SLO attainment >= "
                  f"{spec.attainment:.0%} ({targets})")
    from simulator.models.catalog import precision_note

    note = precision_note(spec.model, spec.precision)
    if note:
        console.print(f"precision: {note}")
    result = run_plan(spec, executor=executor, workers=workers, scheduler=scheduler,
                      file=str(plan_file))
    from simulator.runner.planner import RANK_RULE

    table = Table(title=f"{spec.name}: configurations meeting the SLO at {spec.rate:g} req/s, "
                        "cheapest first", header_style="bold", caption=f"order: {RANK_RULE}")
    for header in ("#", "configuration", "devices", "$/hour", "SLO %", "TTFT p90 ms",
                   "TPOT p90 ms", "goodput req/s", "goodput/device", "$/1M out tok"):
        table.add_column(header, justify="left" if header == "configuration" else "right")
    for _, r in result.ranked.iterrows():
        table.add_row(str(r["rank"]), r["label"], str(r["devices"]),
                      _f(r["cost_usd_per_hour"], digits=",.2f"), _f(r["slo_attainment"], 100),
                      _f(r["ttft_p90_s"], 1e3), _f(r["tpot_p90_s"], 1e3),
                      _f(r.get("goodput_rate_per_s")), _f(r.get("goodput_rate_per_device")),
                      _f(r["cost_usd_per_1m_output_tokens"]))
    if result.feasible_count > len(result.ranked):
        table.caption = (f"the {len(result.ranked)} cheapest of {result.feasible_count} feasible "
                         f"configurations found (plan key `top`); order: {RANK_RULE}")
    console.print(table)
    for warning in result.warnings:
        console.print(f"[yellow]warning: {warning}[/yellow]")
    if len(result.rejected):
        rejected = Table(title="Rejected families", header_style="bold")
        rejected.add_column("family")
        rejected.add_column("why")
        for _, r in result.rejected.iterrows():
            rejected.add_row(r["family"], r["reason"])
        console.print(rejected)
    console.print(f"{len(result.simulated)} simulations")
    if result.best is None:
        console.print("[red]no configuration meets the SLO at the target rate[/red]")
    if out is not None:
        _write(result, out)
        console.print(f"wrote {out}/plan.parquet, plan.json, rejected.csv, simulated.parquet"
                      + (", best.yaml, pareto.png/svg" if result.best is not None else "")
                      + (", capacity.png/svg" if (out / "capacity.png").is_file() else ""))
    if result.best is None:
        raise typer.Exit(1)


def _write(result: PlanResult, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from simulator.plots import capacity_vs_rate, cost_vs_goodput, save

    out.mkdir(parents=True, exist_ok=True)
    from simulator.runner.planner import RANK_RULE

    meta = {"name": result.spec.name, "model": result.spec.model,
            "target_rate_per_s": result.spec.rate, "rank_rule": RANK_RULE,
            "warnings": result.warnings, "feasible": result.feasible_count}
    (out / "plan.json").write_text(json.dumps(meta, indent=2) + "\n")
    result.ranked.to_parquet(out / "plan.parquet", index=False)
    result.rejected.to_csv(out / "rejected.csv", index=False)
    result.simulated.to_parquet(out / "simulated.parquet", index=False)
    if result.best is None:
        return
    (out / "best.yaml").write_text(
        f"# Cheapest configuration found by `disagg-sim plan` for {result.spec.name}.\n"
        + yaml.safe_dump(result.best.model_dump(mode="json"), sort_keys=False))
    ranked = result.ranked
    goodput = "goodput_rate_per_s" if "goodput_rate_per_s" in ranked else "goodput"
    fig = cost_vs_goodput(ranked, labels=ranked["label"], goodput=goodput,
                          target_rate=result.spec.rate)
    save(fig, out / "pareto")
    if "goodput_rate_per_s" in ranked and ranked["goodput_rate_per_s"].notna().any():
        save(capacity_vs_rate(ranked), out / "capacity")
