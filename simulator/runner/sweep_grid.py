"""A sweep file, checked and expanded into runs with stable ids.

A sweep file::

    name: pd-ratio
    base: ../llama70b_tp8_h100.yaml          # a scenario path (relative to this file) or a mapping
    overrides: {workload.num_requests: 300}  # applied to every run
    grid:                                    # every combination of these lists
      cluster.pools.prefill.instances: [1, 2, 3]
      cluster.pools.decode.instances: [1, 2, 3]
    zip:                                     # lists in one group advance together
      - {cluster.pools.prefill.parallelism.tp: [2, 4], cluster.pools.decode.parallelism.tp: [4, 8]}
    seeds: [0, 1, 2]

Grid axes and zip groups are crossed with one another, then with the seeds. A path may
select a pool by name. Each run's id is a hash of its resolved scenario (seed included),
so the same run has the same id in every sweep that contains it. Running the runs is
:mod:`simulator.runner.sweep`'s.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simulator.config_io import read_yaml, validate
from simulator.errors import ConfigError
from simulator.runner.goodput import GoodputSpec
from simulator.runner.labels import axis_cells, unwrap
from simulator.scenario.load import load_scenario, scenario_dir
from simulator.scenario.paths import apply_updates, get_path, split_path
from simulator.scenario.schema import Scenario

MAX_SWEEP_RUNS = 100_000
"""Most runs one sweep may expand to (each is validated and hashed up front)."""


class SweepSpec(BaseModel):
    """The sweep file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("sweep", description="Sweep name.")
    description: str = Field("", description="What the sweep studies.")
    base: str | dict[str, Any] = Field(description=(
        "Base scenario: a YAML path (relative to the sweep file) or an inline mapping."))
    overrides: dict[str, Any] = Field(default_factory=dict, description=(
        "Dotted path -> value, applied to every run before the axes."))
    grid: dict[str, Any] = Field(default_factory=dict, description=(
        "Dotted path -> list of values; every combination of the lists is run."))
    zip: list[dict[str, Any]] = Field(default_factory=list, description=(
        "Groups of dotted path -> list; the lists in a group have one length and advance "
        "together; groups are crossed with the grid."))
    seeds: list[int] | None = Field(None, min_length=1, description=(
        "Seeds run for every point (default: the base scenario's seed)."))
    frames: bool = Field(False, description="Also save each run's requests/steps/transfers.")
    goodput: GoodputSpec | None = Field(None, description=(
        "Make each run a goodput search (highest rate meeting the SLO attainment target) "
        "instead of one simulation."))


@dataclass(frozen=True)
class RunTask:
    """One run of a sweep: everything a worker needs, picklable."""

    run_id: str
    config_id: str
    index: int
    seed: int
    point: dict[str, Any]
    scenario: dict[str, Any]
    base_dir: str
    file: str | None = None
    frames: bool = False
    goodput: dict[str, Any] | None = None

    def head(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "config_id": self.config_id, "index": self.index,
                "seed": self.seed, "status": "ok", "error": "", **self.point}


@dataclass
class Sweep:
    spec: SweepSpec
    tasks: list[RunTask]
    axes: list[str]
    file: str | None = None
    base_dir: Path = field(default_factory=Path.cwd)


def stable_hash(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ----- loading and checking ---------------------------------------------------------
def load_sweep(path: str | Path) -> Sweep:
    """Read, check and expand a sweep file; every problem is one :class:`ConfigError`."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", file=str(path))
    spec = validate(SweepSpec, data, file=str(path))
    return expand(spec, file=str(path), folder=Path(path).resolve().parent)


def _base(spec: SweepSpec, file: str | None, folder: Path) -> tuple[Scenario, Path]:
    if isinstance(spec.base, str):
        path = Path(spec.base)
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            raise ConfigError(f"base scenario {spec.base!r} not found (looked for {path})",
                              file=file, key="base")
        return load_scenario(path), scenario_dir(path)
    return validate(Scenario, spec.base, file=file, prefix="base"), folder


def _check_values(key: str, values: Any) -> list[Any]:
    if not isinstance(values, list):
        raise ConfigError(f"an axis is a list of values, got {type(values).__name__} "
                          f"(write [{values!r}] for a single value)", key=key)
    if not values:
        raise ConfigError("empty axis: give at least one value", key=key)
    return values


def _check_path(data: dict[str, Any], path: str, key: str) -> None:
    """Fail with the allowed keys when ``path`` names nothing in the scenario."""
    if path == "seed":
        raise ConfigError("vary the seed with `seeds:`, not as an axis", key=key)
    node: Any = data
    segments = split_path(path)
    for depth, segment in enumerate(segments):
        where = ".".join(segments[:depth]) or "the scenario"
        if isinstance(node, dict):
            if segment not in node:
                close = difflib.get_close_matches(segment, [str(k) for k in node], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown path {path!r}: {where} has no key {segment!r}; "
                                  f"keys there: {', '.join(node)}{hint}", key=key)
            node = node[segment]
        elif isinstance(node, list):
            try:
                node = get_path(node, segment)
            except ConfigError as exc:
                raise ConfigError(f"unknown path {path!r}: {exc.message} (at {where})",
                                  key=key) from None
        elif node is None:
            return  # an unset optional section: the scenario's validation checks the rest
        else:
            raise ConfigError(f"unknown path {path!r}: {where} is a value, not a section",
                              key=key)


def _dimensions(spec: SweepSpec, file: str | None
                ) -> tuple[list[list[dict[str, Any]]], dict[str, str]]:
    """The axes as lists of partial points, and each axis path's key in the sweep file."""
    dims: list[list[dict[str, Any]]] = []
    keys: dict[str, str] = {}
    repeated: set[str] = set()
    try:
        for path, values in spec.grid.items():
            dims.append([{path: v} for v in _check_values(f"grid.{path}", values)])
            keys[path] = f"grid.{path}"
        for g, group in enumerate(spec.zip):
            if not group:
                raise ConfigError("empty zip group: give paths with lists", key=f"zip[{g}]")
            lengths = {p: len(_check_values(f"zip[{g}].{p}", v)) for p, v in group.items()}
            if len(set(lengths.values())) > 1:
                shown = ", ".join(f"{p}: {n}" for p, n in lengths.items())
                raise ConfigError(f"zipped lists must have the same length; got {shown}",
                                  key=f"zip[{g}]")
            n = next(iter(lengths.values()))
            dims.append([{p: group[p][i] for p in group} for i in range(n)])
            repeated |= set(group) & set(keys)
            keys.update({p: f"zip[{g}].{p}" for p in group})
    except ConfigError as exc:
        raise exc.with_file(file or "") from None
    repeated |= set(keys) & set(spec.overrides)
    if repeated:
        raise ConfigError(f"each path may appear in one place only (overrides, grid or one zip "
                          f"group); repeated: {sorted(repeated)}", file=file)
    return dims, keys


def _cells(points: list[dict[str, Any]], axes: list[str]) -> list[dict[str, Any]]:
    """Axis values as table cells: numbers and strings stay, anything else becomes a short
    label (its own ``label:`` or one derived from the value, :mod:`simulator.runner.labels`)."""
    out: list[dict[str, Any]] = [{} for _ in points]
    for axis in axes:
        cells = axis_cells(axis, [p[axis] for p in points])
        for row, cell in zip(out, cells, strict=True):
            row[axis] = cell
    return out


def expand(spec: SweepSpec, *, file: str | None = None, folder: Path | None = None) -> Sweep:
    """Every run of the sweep, in order: grid axes, then zip groups, then seeds."""
    folder = folder or Path.cwd()
    base, base_dir = _base(spec, file, folder)
    try:
        base = apply_updates(base, spec.overrides)
    except ConfigError as exc:
        raise ConfigError(exc.message, file=file, key=f"overrides.{exc.key or ''}".rstrip(".")
                          ) from None
    dims, keys = _dimensions(spec, file)
    axes = list(keys)
    data = base.model_dump(mode="python")
    for path, key in keys.items():
        try:
            _check_path(data, path, key)
        except ConfigError as exc:
            raise exc.with_file(file or "") from None
    seeds = spec.seeds or [base.seed]
    runs = math.prod(len(d) for d in dims) * len(seeds)
    if runs > MAX_SWEEP_RUNS:
        sizes = " x ".join(str(len(d)) for d in dims) or "1"
        raise ConfigError(f"{runs:,} runs ({sizes} points x {len(seeds)} seeds); at most "
                          f"{MAX_SWEEP_RUNS:,} per sweep: use fewer axis values or seeds, or "
                          "split the sweep", file=file, key="grid")
    points: list[dict[str, Any]] = []
    for combo in itertools.product(*dims):
        point: dict[str, Any] = {}
        for part in combo:
            point.update(part)
        points.append(point)
    try:
        cells = _cells(points, axes)
    except ConfigError as exc:
        raise exc.with_file(file or "") from None
    goodput = spec.goodput.model_dump(mode="json") if spec.goodput else None
    tasks: list[RunTask] = []
    seen: dict[str, int] = {}
    for p, (point, cell) in enumerate(zip(points, cells, strict=True)):
        try:
            scenario = apply_updates(base, {k: unwrap(v) for k, v in point.items()})
        except ConfigError as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in point.items())
            raise ConfigError(f"point {p} ({shown}) is not a valid scenario: "
                              f"{exc.key or 'scenario'}: {exc.message}", file=file) from None
        config_json = {k: v for k, v in scenario.model_dump(mode="json").items() if k != "seed"}
        for seed in seeds:
            resolved = scenario.model_copy(update={"seed": seed}).model_dump(mode="json")
            run_id = stable_hash(resolved if goodput is None
                                 else {"scenario": resolved, "goodput": goodput})
            if run_id in seen:
                raise ConfigError(f"points {seen[run_id]} and {p} resolve to the same run; "
                                  "remove the repeated axis value", file=file)
            seen[run_id] = p
            tasks.append(RunTask(run_id, stable_hash(config_json), len(tasks), seed, cell,
                                 resolved, str(base_dir), file, spec.frames, goodput))
    return Sweep(spec, tasks, axes, file, base_dir)
