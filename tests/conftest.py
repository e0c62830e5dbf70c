"""Shared fixtures: small scenarios built in code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from simulator.scenario.schema import Scenario

# CI draws the same examples on every run (a red CI always reproduces); a local run explores
# new ones each time. `HYPOTHESIS_PROFILE=explore` forces exploration anywhere.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE",
                                     "ci" if os.environ.get("CI") else "explore"))

REPO = Path(__file__).resolve().parents[1]


def make_scenario(**overrides: Any) -> Scenario:
    """A small colocated Llama-3.1-8B on one H100 scenario, with dotted-path overrides."""
    base: dict[str, Any] = {
        "name": "tiny",
        "seed": 1,
        "model": "Llama-3.1-8B",
        "workload": {
            "arrival": {"kind": "poisson", "rate_per_s": 5.0},
            "input_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 400},
            "output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 60},
            "num_requests": 60,
        },
        "cluster": {"pools": [{"name": "main", "role": "colocated", "device": "H100-SXM"}]},
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
    }
    sc = Scenario.model_validate(base)
    return sc.with_(**overrides) if overrides else sc


@pytest.fixture
def tiny() -> Scenario:
    return make_scenario()


# ----- fuzz tally (tests/test_fuzz_inputs.py) -----------------------------------------
FUZZ_TALLY = pytest.StashKey[dict[str, int]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[FUZZ_TALLY] = {}


@pytest.fixture(scope="session")
def fuzz_tally(request: pytest.FixtureRequest) -> dict[str, int]:
    """Files tried per ``bad|valid/command/family``; reported in the terminal summary."""
    return request.config.stash[FUZZ_TALLY]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    tally = config.stash.get(FUZZ_TALLY, {})
    if not tally:
        return
    bad = sum(n for k, n in tally.items() if k.startswith("bad/"))
    valid = sum(n for k, n in tally.items() if k.startswith("valid/"))
    terminalreporter.section("input fuzzing")
    terminalreporter.write_line(f"{bad} bad input files tried, {valid} valid variations run")
    for key in sorted(tally):
        terminalreporter.write_line(f"  {key}: {tally[key]}")
