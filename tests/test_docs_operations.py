"""docs/operations.md states the commands its figures come from (simulator/docs_operations.py)."""

from __future__ import annotations

import pytest

from simulator.docs_operations import MOONCAKE, OPS, POLICIES, cli_overrides, ideal_hit_rate
from simulator.scenario.load import load_scenario
from tests.conftest import REPO

PAGE = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")


def test_the_ideal_hit_rates_on_the_page_are_the_traces() -> None:
    n, first_15_min = ideal_hit_rate(900_000)
    assert n == 2728
    assert f"**{first_15_min * 100:.1f} %** over the same 15 minutes" in PAGE
    _, whole = ideal_hit_rate()
    assert f"({whole * 100:.1f} % over the whole hour)" in PAGE


@pytest.mark.parametrize(("scenario", "sets"), [
    *(("prefix_caching_mooncake.yaml", s) for s in MOONCAKE.values() if s),
    *(("bursty_autoscaled.yaml", s) for s in POLICIES.values()),
])
def test_each_row_names_the_overrides_it_was_run_with(scenario: str, sets: dict) -> None:
    assert f"`{cli_overrides(sets)}`" in PAGE
    load_scenario(OPS / scenario).with_(**sets)  # and they are valid
