"""`disagg-sim run SCENARIO.yaml`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simulator.cli.app import app
from simulator.cli.outputs import check_out_file, check_out_folder, staged_folder
from simulator.cli.overrides import apply_sets
from simulator.cli.progress import run_progress
from simulator.cli.render import make_console, precision_lines, print_json, print_summary
from simulator.errors import ConfigError, InterruptedRunError

if TYPE_CHECKING:
    from rich.console import Console

    from simulator.runner.result import RunResult
    from simulator.scenario.schema import Scenario


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    out: Annotated[Path | None, typer.Option(help="Write summary, frames and the resolved "
                                                  "scenario to this folder.")] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="Override the scenario's seed.")] = None,
    trace: Annotated[Path | None, typer.Option(help="Write a Chrome/Perfetto trace-event "
                                                    "JSON file of the run.")] = None,
    step_by_step: Annotated[bool, typer.Option(help="Disable decode fast-forward "
                                                    "(for checking).")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help=(
        "Override a scenario key, e.g. --set workload.arrival.rate_per_s=3 or "
        "--set cluster.pools.decode.instances=2 (repeatable; values are YAML)."))] = None,
    skip_bad_rows: Annotated[bool, typer.Option(help="Leave out trace rows with bad values "
                                                     "(counted and reported) instead of "
                                                     "stopping at the first.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors "
                                                             "(files are still written).")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object "
                                                       "(no table, no progress).")] = False,
) -> None:
    """Simulate one scenario and print its summary."""
    from simulator.runner.run import run as run_scenario
    from simulator.scenario.load import load_scenario, scenario_dir

    sc = apply_sets(load_scenario(scenario), set_, str(scenario))
    if step_by_step:
        sc = sc.with_(**{"simulation.fast_forward": False})
    if skip_bad_rows:
        sc = with_skip_bad_rows(sc, str(scenario))
    check_outputs(out, trace)
    console = make_console(quiet=quiet or json_)
    try:
        with run_progress(console, enabled=not (quiet or json_)) as progress:
            result = run_scenario(sc, seed=seed, base_dir=scenario_dir(scenario),
                                  file=str(scenario), progress=progress)
    except KeyboardInterrupt:
        raise InterruptedRunError("interrupted before the run ended; nothing was written") from None
    if json_:
        print_json(result.summary)
    print_summary(result.summary, f"{sc.name} (seed {result.scenario.seed})", console)
    console.print(precision_lines(sc))
    console.print(f"simulated {len(result.requests)} requests, {len(result.steps)} steps in "
                  f"{result.wall_s:.2f} s wall")
    report_skipped(result, console)
    if not quiet:
        for warning in result.warnings:  # on stderr, so --json output stays one object
            typer.echo(f"warning: {warning}", err=True)
    if out is not None:
        with staged_folder(out) as tmp:
            result.save(tmp)
        console.print(f"wrote {out}/summary.json, requests/steps/transfers.parquet, "
                      "scenario.resolved.yaml")
    if trace is not None:
        from simulator.metrics.trace_events import write_trace

        write_trace(result, trace)
        console.print(f"wrote {trace} (open in https://ui.perfetto.dev or chrome://tracing)")


def check_outputs(out: Path | None, trace: Path | None) -> None:
    """Refuse unusable output paths before simulating, not after."""
    if out is not None:
        check_out_folder(out)
    if trace is not None:
        check_out_file(trace, "--trace")
        if out is not None and trace.resolve().is_relative_to(out.resolve()):
            raise ConfigError("the trace file lies inside the --out folder, which is "
                              "replaced as a whole; write it elsewhere", file=str(trace),
                              key="--trace")


def with_skip_bad_rows(sc: Scenario, file: str) -> Scenario:
    if sc.workload.arrival is None or sc.workload.arrival.kind != "trace":
        raise ConfigError("--skip-bad-rows is for trace workloads (workload.arrival.kind: "
                          f"trace), this one is "
                          f"{sc.workload.arrival.kind if sc.workload.arrival else 'classes'!r}",
                          file=file,
                          key="--skip-bad-rows")
    return sc.with_(**{"workload.arrival.skip_bad_rows": True})


def report_skipped(result: RunResult, console: Console) -> None:
    skipped = result.summary.get("trace_rows_skipped") or 0
    if skipped:
        console.print(f"skipped {skipped} bad trace row(s) (--skip-bad-rows)")
