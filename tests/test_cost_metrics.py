"""Cost and energy of a run (metrics/cost.py) and multi-seed statistics (metrics/stats.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.hardware.registry import load_device
from simulator.metrics.cost import cluster_usd_per_hour, cost_summary, device_power_w
from simulator.metrics.stats import T_975, aggregate_seeds, mean_ci95, t_critical_95
from tests.conftest import make_scenario


def _plan(*pools: tuple[str, str, int]) -> SimpleNamespace:
    return SimpleNamespace(pools=[
        SimpleNamespace(spec=SimpleNamespace(name=name), device=load_device(dev), devices=n)
        for name, dev, n in pools])


def test_cost_per_hour_and_per_million_tokens() -> None:
    h100, h200 = load_device("H100-SXM"), load_device("H200-SXM")
    plan = _plan(("prefill", "H100-SXM", 8), ("decode", "H200-SXM", 4))
    summary = {"output_token_throughput": 2000.0, "total_token_throughput": 10000.0,
               "duration_s": 100.0, "util_prefill": 0.5, "util_decode": 1.0}
    out = cost_summary(plan, summary)
    per_hour = 8 * h100.price.usd_per_hour + 4 * h200.price.usd_per_hour  # type: ignore[union-attr]
    assert out["cost_usd_per_hour"] == pytest.approx(per_hour)
    # $/h over tokens per hour, per million.
    assert out["cost_usd_per_1m_output_tokens"] == pytest.approx(per_hour / (2000 * 3600) * 1e6)
    assert out["cost_usd_per_1m_tokens"] == pytest.approx(per_hour / (10000 * 3600) * 1e6)


def test_energy_from_tdp_idle_and_utilisation() -> None:
    h100 = load_device("H100-SXM")  # tdp 700 W, idle 75 W
    assert h100.power is not None
    assert h100.power.idle_w is not None
    plan = _plan(("main", "H100-SXM", 2))
    summary = {"output_token_throughput": 100.0, "total_token_throughput": 500.0,
               "duration_s": 3600.0, "util_main": 0.4}
    out = cost_summary(plan, summary)
    watts = 2 * (h100.power.idle_w + (h100.power.tdp_w - h100.power.idle_w) * 0.4)
    assert out["power_w"] == pytest.approx(watts)
    assert out["energy_kwh"] == pytest.approx(watts / 1000)  # one hour
    assert out["energy_j_per_output_token"] == pytest.approx(watts * 3600 / (100 * 3600))
    # A pool that never stepped draws idle power; a utilisation above 1 is a bug upstream,
    # never silently clamped to TDP.
    assert device_power_w(h100, 0.0) == h100.power.idle_w
    assert device_power_w(h100, 1.0) == h100.power.tdp_w
    with pytest.raises(ValueError, match="outside"):
        device_power_w(h100, 3.0)


def test_missing_price_gives_nan_not_a_guess() -> None:
    l40s = load_device("L40S")
    assert l40s.price is None
    assert math.isnan(cluster_usd_per_hour([(l40s, 2), (load_device("H100-SXM"), 1)]))
    out = cost_summary(_plan(("main", "L40S", 1)), {"output_token_throughput": 10.0,
                                                     "duration_s": 1.0, "util_main": 0.5})
    assert math.isnan(out["cost_usd_per_hour"])
    assert math.isnan(out["cost_usd_per_1m_output_tokens"])
    assert out["power_w"] > 0  # L40S has a TDP


def test_run_summary_carries_cost() -> None:
    res = simulator.run(make_scenario(**{"cluster.pools.main.instances": 2}))
    s = res.summary
    assert s["cost_usd_per_hour"] == pytest.approx(2 * 4.25)  # H100-SXM list price
    assert s["cost_usd_per_1m_output_tokens"] == pytest.approx(
        8.5 / (s["output_token_throughput"] * 3600) * 1e6)
    assert s["energy_kwh"] > 0


# ----- statistics -------------------------------------------------------------------
def _t_two_sided_coverage(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom, by quadrature."""
    x = np.linspace(0.0, t, 400_001)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    pdf = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
    return float(2 * np.trapezoid(pdf, x))


@pytest.mark.parametrize("df", sorted(T_975))
def test_t_table_matches_the_t_distribution(df: int) -> None:
    # Three-decimal table values: coverage within rounding of 95 %.
    assert _t_two_sided_coverage(T_975[df], df) == pytest.approx(0.95, abs=2e-4)


@pytest.mark.parametrize("df", [31, 35, 45, 55, 70, 90, 150, 1000])
def test_interpolated_t_values_are_close(df: int) -> None:
    t = t_critical_95(df)
    assert _t_two_sided_coverage(t, df) == pytest.approx(0.95, abs=3e-4)
    assert t_critical_95(df - 1) >= t  # decreasing in df


def test_mean_ci95_known_values_and_edge_cases() -> None:
    mean, half, n = mean_ci95([1.0, 2.0, 3.0])
    assert (mean, n) == (2.0, 3)
    assert half == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    mean, half, n = mean_ci95([5.0, float("nan")])
    assert (mean, n) == (5.0, 1)
    assert math.isnan(half)
    assert mean_ci95([])[2] == 0
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_critical_95(0)


def test_ci_covers_the_true_mean_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(7)
    samples = rng.normal(10.0, 3.0, size=(4000, 4))
    hits = 0
    for row in samples:
        mean, half, _ = mean_ci95(row)
        hits += abs(mean - 10.0) <= half
    assert hits / len(samples) == pytest.approx(0.95, abs=0.015)


def test_aggregate_seeds_groups_and_names_columns() -> None:
    frame = pd.DataFrame({"tp": [2, 2, 2, 4, 4, 4], "seed": [0, 1, 2] * 2,
                          "goodput": [1.0, 2.0, 3.0, 10.0, 10.0, 10.0]})
    out = aggregate_seeds(frame, ["tp"])
    assert list(out["tp"]) == [2, 4]
    assert list(out["n_seeds"]) == [3, 3]
    assert out["goodput_mean"].tolist() == [2.0, 10.0]
    assert out["goodput_ci95"].iloc[0] == pytest.approx(4.303 / math.sqrt(3))
    assert out["goodput_ci95"].iloc[1] == 0.0
    assert "seed_mean" not in out
