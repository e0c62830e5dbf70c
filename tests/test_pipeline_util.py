"""Pipeline parallelism: utilisation is device time per device, and max_num_seqs caps the
whole engine (vLLM V1), not each micro-batch."""

from __future__ import annotations

import pytest

from simulator import run
from tests.conftest import make_scenario


def _pp(pp: int, seqs: int = 32, engine: str = "vllm"):
    return make_scenario(**{
        "engine": engine,
        "model": "Llama-3.1-70B",
        "workload.arrival": {"kind": "all_at_once"},
        "workload.num_requests": 120,
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 200, "max_tokens": 800},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 200},
        "cluster.pools": [{"name": "main", "device": "H100-SXM",
                           "parallelism": {"tp": 4, "pp": pp},
                           "scheduler": {"max_num_seqs": seqs}}],
    })


@pytest.mark.parametrize("pp", [2, 4])
def test_pipeline_utilisation_is_at_most_one(pp: int) -> None:
    res = run(_pp(pp))
    util = res.summary["util_main"]
    assert 0.0 < util <= 1.0
    # Micro-batches overlap: their latencies add up to more than the run...
    assert res.steps["duration_s"].sum() > res.summary["duration_s"]
    # ...but each step's device time is its host + stage work spread over the stages.
    assert res.steps["busy_s"].sum() <= res.summary["duration_s"] * (1 + 1e-9)
    assert res.summary["power_w"] <= 4 * pp * 700.0 + 1e-6  # H100 SXM TDP, not clamped


def test_single_stage_busy_equals_step_time() -> None:
    res = run(make_scenario())
    assert (res.steps["busy_s"] == res.steps["duration_s"]).all()


def test_max_num_seqs_caps_the_whole_engine_under_pp() -> None:
    res = run(_pp(2, seqs=16))
    assert int(res.steps["running"].max()) == 16
    assert int(res.steps["decode_seqs"].max()) <= 16
