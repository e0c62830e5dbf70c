"""Load a scenario YAML; every problem becomes one ConfigError naming file and key."""

from __future__ import annotations

from pathlib import Path

from simulator.config_io import read_yaml, validate
from simulator.errors import ConfigError
from simulator.scenario.schema import Scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file.

    Relative paths inside it (trace files) are resolved against the file's folder when
    the scenario is built; use :func:`scenario_dir` to know which folder that is.
    """
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}",
                          file=str(path))
    scenario = validate(Scenario, data, file=str(path))
    scenario._source = str(Path(path).resolve())
    return scenario


def scenario_dir(path: str | Path) -> Path:
    return Path(path).resolve().parent
