"""`disagg-sim init DIR`: copy the shipped scenarios, sweeps, plans and traces to edit."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from simulator.cli.app import app
from simulator.errors import ConfigError


@app.command()
def init(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="New folder for the examples.")],
    force: Annotated[bool, typer.Option(help="Copy into DIR even if it is not empty "
                                             "(files of the same name are replaced).")] = False,
) -> None:
    """Copy the shipped scenarios, sweeps, plans and traces (from the installed package)."""
    from simulator._paths import data_dir

    source = data_dir("scenarios")
    if folder.exists() and not folder.is_dir():
        raise ConfigError("exists and is not a folder", file=str(folder))
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise ConfigError("the folder is not empty; give a new folder, or --force to copy "
                          "into it", file=str(folder))
    shutil.copytree(source, folder, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    files = sum(1 for p in folder.rglob("*") if p.is_file())
    typer.echo(f"copied {files} files to {folder}; try: disagg-sim run {folder / 'quickstart.yaml'}")
