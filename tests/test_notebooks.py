"""Notebooks are stored clean and are executed by a plain `pytest` (nbmake runs them; see
`[tool.pytest.ini_options]` in pyproject.toml). This file only checks how they are stored."""

from __future__ import annotations

import re
import tomllib

import nbformat
import pytest

import simulator
from tests.conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# The package's declared public API (plus the lazily imported plots module).
PUBLIC = set(simulator.__all__) | {"plots"}


def test_plain_pytest_executes_notebooks() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "notebooks" in config["testpaths"]
    assert "--nbmake" in config["addopts"].split()
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    for cell in code:
        assert cell.outputs == [], f"{path.name}: a cell was saved with its outputs"
        assert cell.execution_count is None, f"{path.name}: execution counts were saved"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_uses_the_public_api(path) -> None:
    """`simulator.X` names only the public API; no imports from inside the package."""
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                       if c.cell_type == "code")
    assert "import simulator" in source
    assert not re.search(r"from simulator\.(?!plots\b)", source), "imports a private module"
    used = set(re.findall(r"\bsimulator\.(\w+)", source))
    assert used <= PUBLIC, f"non-public names: {used - PUBLIC}"
