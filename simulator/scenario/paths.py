"""Dotted key paths into a scenario: `workload.arrival.rate_per_s`, `cluster.pools.decode.instances`.

A path segment after a list selects an element by index or, for pools, by name. Used by
``Scenario.with_`` and by sweep axes.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from simulator.config_io import validate
from simulator.errors import ConfigError

if TYPE_CHECKING:
    from simulator.scenario.schema import Scenario


def _step(node: Any, segment: str, path: str) -> tuple[Any, Any]:
    """Return (container, key) for ``segment`` inside ``node``."""
    if isinstance(node, dict):
        return node, segment
    if isinstance(node, list):
        if segment.lstrip("-").isdigit():
            index = int(segment)
            if not -len(node) <= index < len(node):
                raise ConfigError(f"index {index} out of range (list has {len(node)} items)",
                                  key=path)
            return node, index
        for i, item in enumerate(node):
            if isinstance(item, dict) and item.get("name") == segment:
                return node, i
        names = [item.get("name") for item in node if isinstance(item, dict)]
        raise ConfigError(f"no item named {segment!r}; names: {names}", key=path)
    raise ConfigError(f"cannot descend into a {type(node).__name__} value", key=path)


def split_path(path: str) -> list[str]:
    """``cluster.pools[0].parallelism`` (the spelling of error messages) = ``cluster.pools.0...``."""
    return re.sub(r"\[(-?\d+)\]", r".\1", path).split(".")


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` in a nested dict/list structure in place (missing dict keys are created)."""
    segments = split_path(path)
    node: Any = data
    for depth, segment in enumerate(segments[:-1]):
        container, key = _step(node, segment, ".".join(segments[: depth + 1]))
        if isinstance(container, dict) and (key not in container or container[key] is None):
            container[key] = {}
        node = container[key]
    container, key = _step(node, segments[-1], path)
    container[key] = value


def get_path(data: Any, path: str) -> Any:
    node = data
    segments = split_path(path)
    for depth, segment in enumerate(segments):
        container, key = _step(node, segment, ".".join(segments[: depth + 1]))
        if isinstance(container, dict) and key not in container:
            raise ConfigError("no such key", key=".".join(segments[: depth + 1]))
        node = container[key]
    return node


def apply_updates(scenario: Scenario, updates: dict[str, Any], file: str | None = None) -> Scenario:
    data = scenario.model_dump(mode="python", exclude_unset=False)
    data = copy.deepcopy(data)
    for path, value in updates.items():
        set_path(data, path, value)
    return validate(type(scenario), data, file=file)
