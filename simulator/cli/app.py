"""The typer application object; command modules attach their commands to it."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    name="disagg-sim",
    help="Discrete-event simulator of LLM inference clusters (colocated, disaggregated, "
         "TP/PP/EP, GPU and LPU).",
    no_args_is_help=True,
    add_completion=True,  # typer's --install-completion / --show-completion
    pretty_exceptions_enable=False,
)
profiles_app = typer.Typer(help="List and show hardware, link, engine and model profiles.",
                           no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")


def _version(value: bool) -> None:
    if value:
        from simulator import __version__

        typer.echo(f"disagg-sim {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Discrete-event simulator of LLM inference clusters (colocated, disaggregated,
    TP/PP/EP, GPU and LPU)."""
