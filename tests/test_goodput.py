"""Goodput search: bisection over the request rate for the SLO-attainment target."""

from __future__ import annotations

import pytest

import simulator
from simulator.errors import ConfigError
from simulator.runner.goodput import GoodputSpec, search_goodput
from tests.conftest import make_scenario

SPEC = GoodputSpec(target=0.9, rel_tol=0.05, max_probes=16)


def small(**overrides: object):  # type: ignore[no-untyped-def]
    base = {"workload.num_requests": 150, "slo.ttft_s": 0.2, "slo.tpot_s": 0.02}
    return make_scenario(**{**base, **overrides})


def test_found_rate_passes_and_a_slightly_higher_one_fails() -> None:
    found = search_goodput(small(), SPEC)
    assert found.rate_per_s > 0
    assert not found.capped
    assert found.attainment >= 0.9
    # The bracket: a failing probe within rel_tol above the answer.
    above = [(r, a) for r, a in found.probes if r > found.rate_per_s]
    assert above
    assert min(r for r, _ in above) <= found.rate_per_s * (1 + SPEC.rel_tol) + 1e-9
    assert all(a < 0.9 for _, a in above)
    # An independent simulation at the answer meets the target.
    check = simulator.run(small(**{"workload.arrival.rate_per_s": found.rate_per_s}))
    assert check.summary["slo_attainment"] >= 0.9
    assert found.result is not None
    assert found.result.summary["slo_attainment"] == check.summary["slo_attainment"]


def test_per_device_goodput_and_more_capacity_more_goodput() -> None:
    one = search_goodput(small(), SPEC)
    two = search_goodput(small(**{"cluster.pools.main.instances": 2}), SPEC)
    assert one.devices == 1
    assert two.devices == 2
    assert two.rate_per_device == pytest.approx(two.rate_per_s / 2)
    assert two.rate_per_s > 1.3 * one.rate_per_s
    assert one.as_row()["goodput_rate_per_device"] == one.rate_per_s


def test_tighter_slo_lowers_goodput() -> None:
    loose = search_goodput(small(**{"slo.ttft_s": 1.0}), SPEC)
    tight = search_goodput(small(**{"slo.ttft_s": 0.05}), SPEC)
    assert tight.rate_per_s < loose.rate_per_s


def test_impossible_slo_gives_zero() -> None:
    found = search_goodput(small(**{"slo.ttft_s": 1e-6}), GoodputSpec(max_probes=6))
    assert found.rate_per_s == 0.0
    assert found.result is None
    assert all(a < 0.9 for _, a in found.probes)


def test_target_held_up_to_the_cap_is_reported() -> None:
    found = search_goodput(small(**{"slo.ttft_s": 100.0, "slo.tpot_s": 10.0}),
                           GoodputSpec(max_rate_per_s=40.0, max_probes=8))
    assert found.capped
    assert found.rate_per_s == 40.0


def test_needs_an_slo_and_a_rate() -> None:
    with pytest.raises(ConfigError, match="at least one SLO"):
        search_goodput(make_scenario(slo={}))
    closed = make_scenario(**{"workload.arrival": {"kind": "closed_loop", "concurrency": 4}})
    with pytest.raises(ConfigError, match="rate_per_s") as err:
        search_goodput(closed)
    assert err.value.key == "goodput.rate_path"
