"""Goodput search: the highest request rate at which SLO attainment stays >= a target.

This is the method of DistServe (Zhong et al., "DistServe: Disaggregating Prefill and
Decoding for Goodput-optimized Large Language Model Serving", OSDI 2024, sections 2.1 and
4): a configuration's goodput is the maximum request rate it serves with at least the
target share of requests (90 % by default) meeting every SLO, found by bisection over the
rate; per-GPU goodput is that rate divided by the devices used.

The search simulates the same scenario at different rates with the same seed (common
random numbers: Poisson gaps are one set of exponential draws scaled by 1/rate), so
attainment changes with the rate, not with the sample. It assumes attainment falls as the
rate grows, which holds for queueing systems up to sampling noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simulator.errors import ConfigError
from simulator.runner.result import RunResult
from simulator.scenario.paths import get_path
from simulator.scenario.schema import Scenario


class GoodputSpec(BaseModel):
    """How to search for a configuration's goodput."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: float = Field(0.9, gt=0, le=1, description=(
        "SLO attainment to hold: share of requests meeting every SLO (with request "
        "classes: in every class, against its own SLO)."))
    rate_path: str = Field("workload.arrival.rate_per_s", description=(
        "Dotted path of the request rate the search varies (with request classes, the "
        "default scales every class's rate by one factor, keeping the mix)."))
    start_rate_per_s: float | None = Field(None, gt=0, description=(
        "First rate tried (default: the scenario's own rate)."))
    min_rate_per_s: float = Field(0.01, gt=0, description=(
        "Below this the configuration is reported as meeting the target at no rate."))
    max_rate_per_s: float = Field(10_000.0, gt=0, description=(
        "The search stops growing the rate here."))
    rel_tol: float = Field(0.02, gt=0, lt=1, description=(
        "Stop when the bracket [passing, failing] is narrower than this share of the rate."))
    max_probes: int = Field(24, ge=2, description="Most simulations one search may run.")


@dataclass
class GoodputResult:
    """Outcome of one search; ``rate_per_s`` is 0 when even the smallest rate fails."""

    rate_per_s: float
    attainment: float
    devices: int
    probes: list[tuple[float, float]] = field(default_factory=list)
    """Every (rate, attainment) simulated, in the order tried."""
    result: RunResult | None = None
    """The run at ``rate_per_s`` (the last passing rate), if any rate passed."""
    capped: bool = False
    """True when no failing rate was found (``max_rate_per_s`` or ``max_probes`` reached)."""

    @property
    def rate_per_device(self) -> float:
        return self.rate_per_s / self.devices if self.devices else math.nan

    def as_row(self) -> dict[str, Any]:
        return {
            "goodput_rate_per_s": self.rate_per_s,
            "goodput_rate_per_device": self.rate_per_device,
            "goodput_attainment": self.attainment,
            "goodput_probes": len(self.probes),
            "goodput_capped": self.capped,
        }


CLASS_MIX = "workload.arrival.rate_per_s"
"""With request classes, the default rate path scales every class's rate by one factor."""


def attainment_of(summary: dict[str, Any]) -> float:
    """The attainment a target is held against: with request classes, the worst class's
    (every class must meet its own SLO), else the run's."""
    value = summary.get("slo_attainment_min_class", summary.get("slo_attainment", math.nan))
    return float(value) if value is not None else math.nan


def class_rates(scenario: Scenario) -> list[float] | None:
    """Each class's request rate, or None if the workload has no classes."""
    classes = scenario.workload.classes
    if classes is None:
        return None
    return [float(getattr(c.arrival, "rate_per_s", math.nan)) for c in classes]


def with_rate(scenario: Scenario, path: str, rate: float) -> Scenario:
    """``scenario`` at ``rate``: the value at ``path``, or, for the default path on a
    workload with classes, every class's rate scaled so that they sum to ``rate``."""
    rates = class_rates(scenario)
    if rates is None or path != CLASS_MIX:
        return scenario.with_(**{path: rate})
    factor = rate / sum(rates)
    return scenario.with_(**{f"workload.classes.{i}.arrival.rate_per_s": r * factor
                             for i, r in enumerate(rates)})


def _check(scenario: Scenario, spec: GoodputSpec, file: str | None) -> float:
    s = scenario.slo
    classes = scenario.workload.classes or []
    if (s.ttft_s is None and s.tpot_s is None and s.e2e_s is None
            and not any(c.slo is not None for c in classes)):
        raise ConfigError("goodput search needs at least one SLO (slo.ttft_s, slo.tpot_s or "
                          "slo.e2e_s)", file=file, key="slo")
    rates = class_rates(scenario)
    if rates is not None and spec.rate_path == CLASS_MIX:
        if not all(math.isfinite(r) for r in rates):
            raise ConfigError("goodput search scales every class's rate_per_s; give each "
                              "class a poisson, gamma or constant arrival, or set "
                              "goodput.rate_path", file=file, key="goodput.rate_path")
        return sum(rates)
    data = scenario.model_dump(mode="python")
    try:
        base = get_path(data, spec.rate_path)
    except ConfigError:
        kind = scenario.workload.arrival.kind if scenario.workload.arrival else "classes"
        raise ConfigError(
            f"goodput search varies `{spec.rate_path}`, which this scenario does not have "
            f"(arrival kind {kind!r}); use an arrival with "
            "rate_per_s (poisson, gamma, constant) or set goodput.rate_path",
            file=file, key="goodput.rate_path") from None
    if not isinstance(base, int | float) or isinstance(base, bool):
        raise ConfigError(f"`{spec.rate_path}` is not a number", file=file,
                          key="goodput.rate_path")
    return float(base)


def search_goodput(scenario: Scenario, spec: GoodputSpec | None = None, *,
                   base_dir: Path | None = None, file: str | None = None) -> GoodputResult:
    """Bisect over the request rate for the highest rate meeting ``spec.target``."""
    from simulator.runner.run import Simulation

    spec = spec or GoodputSpec()
    own_rate = _check(scenario, spec, file)
    start = spec.start_rate_per_s or own_rate
    start = min(max(start, spec.min_rate_per_s), spec.max_rate_per_s)
    runs: dict[float, RunResult] = {}
    probes: list[tuple[float, float]] = []
    devices = 0

    def attainment(rate: float) -> float:
        nonlocal devices
        sim = Simulation(with_rate(scenario, spec.rate_path, rate), base_dir, file)
        devices = sum(p.devices for p in sim.plan.pools)
        res = sim.run()
        value = attainment_of(res.summary)
        runs[rate] = res
        probes.append((rate, value))
        return value if math.isfinite(value) else 0.0

    lo: float | None = None  # highest rate known to pass
    hi: float | None = None  # lowest rate known to fail
    if attainment(start) >= spec.target:
        lo = start
        while len(probes) < spec.max_probes and lo < spec.max_rate_per_s:
            rate = min(lo * 2.0, spec.max_rate_per_s)
            if attainment(rate) >= spec.target:
                lo = rate
            else:
                hi = rate
                break
    else:
        hi = start
        while len(probes) < spec.max_probes and hi > spec.min_rate_per_s:
            rate = max(hi / 2.0, spec.min_rate_per_s)
            if attainment(rate) >= spec.target:
                lo = rate
                break
            hi = rate
    if lo is not None and hi is not None:
        while len(probes) < spec.max_probes and (hi - lo) > spec.rel_tol * lo:
            mid = 0.5 * (lo + hi)
            if attainment(mid) >= spec.target:
                lo = mid
            else:
                hi = mid
    if lo is None:
        return GoodputResult(0.0, float("nan"), devices, probes, None)
    best = runs[lo]
    return GoodputResult(lo, attainment_of(best.summary), devices, probes, best,
                         capped=hi is None)
