"""`disagg-sim report DIR [--out report.html]`: one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simulator.cli.app import app


@app.command()
def report(
    results: Annotated[Path, typer.Argument(metavar="RUN_OR_SWEEP_OR_PLAN_DIR", help=(
        "The --out folder of `disagg-sim run`, `sweep` or `plan`."))],
    out: Annotated[Path | None, typer.Option(help="HTML file to write (default: "
                                                  "DIR/report.html).")] = None,
) -> None:
    """Write an interactive HTML report (plotly.js inline: opens offline, mails as one file)."""
    from simulator.report import write_report

    path = write_report(results, out)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
