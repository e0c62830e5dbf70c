"""The layer rules of DESIGN.md §2: imports only point downwards."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "simulator"

# layer -> modules it must never import
FORBIDDEN = {
    "cost": ("simpy", "pandas", "matplotlib", "simulator.engine", "simulator.runner",
             "simulator.scenario", "simulator.cli", "simulator.plots", "simulator.metrics"),
    "hardware": ("simpy", "pandas", "matplotlib", "simulator.engine", "simulator.runner",
                 "simulator.scenario", "simulator.cli", "simulator.plots", "simulator.cost"),
    "models": ("simpy", "pandas", "matplotlib", "simulator.engine", "simulator.runner",
               "simulator.scenario", "simulator.cli", "simulator.plots", "simulator.cost"),
    "engine": ("matplotlib", "simulator.runner", "simulator.scenario", "simulator.cli",
               "simulator.plots"),
    "metrics": ("matplotlib", "simpy", "simulator.cli", "simulator.plots"),
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_point_downwards(layer: str) -> None:
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files
    for path in files:
        for name in imports(path):
            bad = [f for f in FORBIDDEN[layer] if name == f or name.startswith(f + ".")]
            assert not bad, f"{path.relative_to(REPO)} imports {name}"
