"""Cost and energy of a run, from the device profiles' dated prices and power figures.

Pure functions of a cluster plan (which devices, how many, in which pool) and a run's
summary (duration, throughput, per-pool utilisation). Definitions, also in docs/sweeps.md:

- ``cost_usd_per_hour`` = sum over pools of devices x ``price.usd_per_hour``;
- ``cost_usd_per_1m_output_tokens`` = cost per hour / (output tokens per second x 3600) x 1e6,
  and the same over input + output tokens for ``cost_usd_per_1m_tokens``;
- energy: each device draws ``idle_w + (tdp_w - idle_w) x u`` where ``u`` is its pool's
  utilisation (share of the run it spent in steps); a profile without ``idle_w`` counts
  idle draw as 0 W, so its energy is a lower bound. ``energy_kwh`` covers the run's
  duration; ``energy_j_per_output_token`` divides it by the output tokens produced.

A figure that needs a price or power figure some device lacks is NaN, never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from simulator.hardware.profiles import DeviceProfile

NAN = float("nan")


class _PoolLike(Protocol):
    """What this module reads from a ``runner.build.PoolPlan``."""

    device: DeviceProfile

    @property
    def devices(self) -> int: ...


def cluster_usd_per_hour(pools: Iterable[tuple[DeviceProfile, float]]) -> float:
    """Hourly price of ``(device profile, device count)`` pairs; NaN if a price is missing."""
    total = 0.0
    for device, count in pools:
        if count <= 0:
            continue
        if device.price is None:
            return NAN
        total += device.price.usd_per_hour * count
    return total


def powered_cost_summary(device_hours: Iterable[tuple[DeviceProfile, float]],
                         output_tokens: float) -> dict[str, float]:
    """``device_hours``, what they cost, and that cost per million output tokens.

    ``device_hours`` pairs each instance's device with the device-hours it was powered,
    so an autoscaled pool pays only for the time its instances were on.
    """
    pairs = list(device_hours)
    hours = sum(h for _, h in pairs)
    paid = cluster_usd_per_hour(pairs)  # price x device-hours = dollars
    return {
        "device_hours": hours,
        "cost_usd_powered": paid,
        "cost_usd_per_1m_output_tokens_powered": paid / output_tokens * 1e6
        if output_tokens else NAN,
    }


def device_power_w(device: DeviceProfile, utilisation: float) -> float:
    """Mean draw of one device busy ``utilisation`` of the time; NaN without power figures."""
    if device.power is None or not math.isfinite(utilisation):
        return NAN
    if not 0.0 <= utilisation <= 1.0 + 1e-9:
        raise ValueError(f"utilisation {utilisation:.6g} of {device.name} is outside [0, 1]")
    idle = device.power.idle_w or 0.0
    return idle + (device.power.tdp_w - idle) * min(utilisation, 1.0)


def _per_million(usd_per_hour: float, tokens_per_s: float) -> float:
    if not math.isfinite(usd_per_hour) or not tokens_per_s or not math.isfinite(tokens_per_s):
        return NAN
    return usd_per_hour / (tokens_per_s * 3600.0) * 1e6


def cost_summary(plan: Any, summary: dict[str, Any]) -> dict[str, float]:
    """Cost and energy keys to merge into a run's summary.

    ``plan`` is a ``ClusterPlan`` (anything with ``.pools`` of objects that have
    ``.device``, ``.devices`` and ``.spec.name``); ``summary`` is what
    :func:`simulator.metrics.summary.summarize` returned.
    """
    pools: list[_PoolLike] = list(plan.pools)
    usd_h = cluster_usd_per_hour((p.device, p.devices) for p in pools)
    out: dict[str, float] = {
        "cost_usd_per_hour": usd_h,
        "cost_usd_per_1m_output_tokens": _per_million(
            usd_h, float(summary.get("output_token_throughput", 0.0))),
        "cost_usd_per_1m_tokens": _per_million(
            usd_h, float(summary.get("total_token_throughput", 0.0))),
    }
    duration = float(summary.get("duration_s", NAN))
    watts = 0.0
    for pool in pools:
        # A pool that never ran a step has no util_ key: it idled the whole run.
        util = float(summary.get(f"util_{pool.spec.name}", 0.0))  # type: ignore[attr-defined]
        watts += device_power_w(pool.device, util) * pool.devices
    joules = watts * duration if math.isfinite(duration) else NAN
    out["power_w"] = watts
    out["energy_kwh"] = joules / 3.6e6
    duration_tokens = float(summary.get("output_token_throughput", 0.0)) * duration
    out["energy_j_per_output_token"] = (joules / duration_tokens
                                        if duration_tokens and math.isfinite(duration_tokens)
                                        else NAN)
    return out
