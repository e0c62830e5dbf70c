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


# Parts of an instance that are plain data and arithmetic: the scheduler policies see a
# view and return a step; KV accounting, pipeline timing and lifecycle state need no clock.
PURE_ENGINE = {
    "scheduler": ("simpy", "pandas", "simulator.cost", "simulator.engine.recorder",
                  "simulator.engine.instance", "simulator.engine.process",
                  "simulator.engine.kv_manager", "simulator.engine.prefix_cache"),
    "kv_manager.py": ("simpy", "pandas", "simulator.cost", "simulator.engine.recorder"),
    "pipeline.py": ("simpy", "pandas", "simulator.cost", "simulator.engine.recorder"),
    "lifecycle.py": ("simpy", "pandas", "simulator.cost", "simulator.engine.recorder"),
}


@pytest.mark.parametrize("part", sorted(PURE_ENGINE))
def test_pure_engine_parts_import_no_clock_and_no_cost(part: str) -> None:
    where = PACKAGE / "engine" / part
    files = sorted(where.rglob("*.py")) if where.is_dir() else [where]
    assert files
    for path in files:
        for name in imports(path):
            bad = [f for f in PURE_ENGINE[part] if name == f or name.startswith(f + ".")]
            assert not bad, f"{path.relative_to(REPO)} imports {name}"
