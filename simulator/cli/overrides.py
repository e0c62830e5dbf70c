"""`--set dotted.path=value` overrides shared by the commands that load scenarios."""

from __future__ import annotations

from typing import Any

import yaml

from simulator.errors import ConfigError
from simulator.scenario.schema import Scenario


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``["a.b=3", "c=[1, 2]"]`` -> ``{"a.b": 3, "c": [1, 2]}`` (values are YAML)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except (yaml.YAMLError, ValueError, OverflowError, RecursionError):
            shown = raw if len(raw) <= 40 else f"{raw[:37]}... ({len(raw)} characters)"
            raise ConfigError(f"--set {key}: value {shown!r} is not valid YAML (or a number "
                              "of more than 4,300 digits)") from None
    return out


def apply_sets(scenario: Scenario, items: list[str] | None, file: str | None) -> Scenario:
    updates = parse_sets(items)
    if not updates:
        return scenario
    from simulator.scenario.paths import apply_updates

    try:
        return apply_updates(scenario, updates, file=file)
    except ConfigError as exc:
        raise ConfigError(exc.message, file=file, key=exc.key) from None
