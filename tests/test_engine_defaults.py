"""Scheduler settings a scenario leaves unset take the serving engine's defaults
(simulator/runner/scheduler_defaults.py, each engine's hardware_profiles/engines/*.yaml)."""

from __future__ import annotations

import pytest

from simulator.engine.config import SchedulerSpec
from simulator.engine.scheduler import PrefillFirst, TrtllmInflight, VllmV1, make_scheduler
from simulator.hardware.engines import load_engine
from simulator.hardware.registry import load_device
from simulator.runner.build import build_plan
from simulator.runner.scheduler_defaults import resolve_scheduler
from simulator.validation.serving import row_scenario
from simulator.validation.serving_io import read_serving
from tests.conftest import make_scenario

H100 = load_device("H100-SXM")


def _resolve(engine: str, device=H100, **given: object) -> SchedulerSpec:  # type: ignore[no-untyped-def]
    return resolve_scheduler(SchedulerSpec.model_validate(given), load_engine(engine), None,
                             "k", device)


def test_trtllm_defaults_are_the_llm_api_ones_without_chunked_prefill() -> None:
    """BaseLlmArgs: max_batch_size 2048, max_num_tokens 8192, enable_chunked_prefill off."""
    got = _resolve("trtllm")
    assert (got.limits, got.chunked_prefill) == ((2048, 8192), False)
    assert _resolve("trtllm", entry_point="offline").limits == (2048, 8192)
    assert isinstance(make_scheduler(got), TrtllmInflight)
    assert make_scheduler(got).chunked is False  # type: ignore[attr-defined]


def test_explicit_scheduler_settings_win_over_the_engine_defaults() -> None:
    got = _resolve("trtllm", chunked_prefill=True, max_num_seqs=64, max_num_batched_tokens=4096)
    assert (got.limits, got.chunked_prefill) == ((64, 4096), True)
    assert _resolve("vllm", chunked_prefill=False).chunked_prefill is False


@pytest.mark.parametrize(("engine", "chunked"), [("vllm", True), ("vllm-0.6", True),
                                                 ("sglang", True), ("trtllm", False)])
def test_each_engine_has_its_own_chunked_prefill_default(engine: str, chunked: bool) -> None:
    assert _resolve(engine).chunked_prefill is chunked


def test_sglang_chunk_size_follows_the_gpu_memory() -> None:
    """SGLang 0.4 server args: chunked_prefill_size 8192 on GPUs with >= 25,000 MB, else
    2048; max_running_requests at its 2048 floor."""
    assert _resolve("sglang").limits == (2048, 8192)
    small = load_device("L40S").model_copy(update={"memory_capacity_gib": 22.0})
    assert _resolve("sglang", small).limits == (2048, 2048)
    assert _resolve("sglang", small, max_num_batched_tokens=4096).limits == (2048, 4096)


def test_a_scenario_without_chunked_prefill_runs_the_engine_default_policy() -> None:
    trt = build_plan(make_scenario(engine="trtllm")).instances[0]
    assert trt.scheduler.chunked_prefill is False
    vllm = build_plan(make_scenario()).instances[0]
    assert vllm.scheduler.chunked_prefill is True
    assert isinstance(make_scheduler(vllm.scheduler), VllmV1)
    cont = build_plan(make_scenario(**{"cluster.pools.main.scheduler.policy": "continuous",
                                       "cluster.pools.main.scheduler.chunked_prefill": False})
                      ).instances[0]
    assert isinstance(make_scheduler(cont.scheduler), PrefillFirst)


def test_an_unresolved_spec_has_no_chunking_decision() -> None:
    with pytest.raises(ValueError, match="resolved by the runner"):
        _ = SchedulerSpec().chunked


def test_a_serving_row_can_state_chunked_prefill_and_otherwise_gets_the_engine_default(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd

    base = {"model": "Llama-3.1-8B", "device": "H100-SXM", "engine": "trtllm",
            "input_len": 128, "output_len": 16, "concurrency": 2, "num_requests": 4,
            "measured_tpot_ms": 7.0, "source": "test"}
    path = tmp_path / "s.csv"
    pd.DataFrame([base, {**base, "chunked_prefill": "Yes"},
                  {**base, "engine": "vllm", "chunked_prefill": "off"}]).to_csv(path, index=False)
    rows = read_serving(path).to_dict("records")
    got = [build_plan(row_scenario(r)).instances[0].scheduler.chunked_prefill for r in rows]
    assert got == [False, True, False]


def test_sglang_captures_graphs_up_to_its_device_dependent_max_batch() -> None:
    """SGLang 0.4 cuda_graph_max_bs: 160 on GPUs with >= 25,000 MB, else 80 at TP >= 4 and
    8 below; a larger decode batch runs eagerly."""
    graphs = load_engine("sglang").cuda_graph
    assert max(graphs.captured(None, 79.1, 1)) == 160
    assert graphs.captured(None, 22.0, 1) == (1, 2, 4, 8)
    assert max(graphs.captured(None, 22.0, 4)) == 80
    assert max(graphs.captured()) == 160  # no device given: no device cap
    from simulator.cost.host import host_model
    assert host_model(load_engine("sglang"), 256, 22.0, 1).graph_sizes == (1, 2, 4, 8)
    assert host_model(load_engine("vllm"), 256, 22.0, 1).graph_sizes[-1] == 512  # no rows
    plan = build_plan(make_scenario(engine="sglang"))
    assert plan.pools[0].cost_models[0].host.graph_sizes[-1] == 160  # type: ignore[attr-defined]
