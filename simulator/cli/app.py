"""The typer application object; command modules attach their commands to it."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="disagg-sim",
    help="Discrete-event simulator of LLM inference clusters (colocated, disaggregated, "
         "TP/PP/EP, GPU and LPU).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
profiles_app = typer.Typer(help="List and show hardware, link, engine and model profiles.",
                           no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")
