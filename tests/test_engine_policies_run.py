"""Each engine's policy inside the simulator: every request ends, the step-by-step and
fast-forward runs agree exactly, and the policy's documented behaviour shows."""

from __future__ import annotations

import pytest

from simulator.errors import ConfigError
from simulator.runner.run import Simulation, run
from tests.conftest import make_scenario
from tests.test_engine_colocated import _check_invariants
from tests.test_fast_forward import assert_identical, both

POLICIES = [
    {"policy": "vllm_v1"},
    {"policy": "vllm_v1", "chunked_prefill": False},
    {"policy": "trtllm"},
    {"policy": "trtllm", "capacity_scheduler_policy": "max_utilization"},
    {"policy": "sglang"},
    {"policy": "sglang", "schedule_policy": "fcfs"},
    {"policy": "continuous"},
]


def _pressure(sched: dict, **over):
    """A small KV (Llama-3.1-8B on L40S at low memory utilisation) under a burst, with
    shared prefixes, so that admission limits, preemption and the prefix cache all act."""
    return make_scenario(**{
        "workload.arrival": {"kind": "poisson", "rate_per_s": 30.0},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 100, "max_tokens": 3000},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 400},
        "workload.shared_prefix": {"tokens": 1024, "groups": 3, "fraction": 0.8},
        "workload.prefix_block_tokens": 256,
        "workload.num_requests": 80,
        "cluster.pools.main.device": "L40S",
        "cluster.pools.main.scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 4096,
                                         "memory_utilization": 0.45, "prefix_caching": True,
                                         **sched},
        **over,
    })


@pytest.mark.parametrize("sched", POLICIES, ids=lambda s: "-".join(map(str, s.values())))
def test_policy_runs_every_request_and_fast_forward_is_exact(sched: dict) -> None:
    fast, slow = both(_pressure(sched))
    assert fast.summary["completed"] == 80
    assert_identical(fast, slow)
    plain = run(_pressure({**sched, "prefix_caching": False}))
    _check_invariants(plain)  # (its prefill-token count assumes no cache hits)
    assert plain.summary["completed"] == 80


def test_guaranteed_no_evict_never_preempts_where_vllm_does() -> None:
    vllm = run(_pressure({"policy": "vllm_v1"}))
    trt = run(_pressure({"policy": "trtllm"}))
    assert vllm.summary["preemptions"] > 0
    assert trt.summary["preemptions"] == 0


def test_the_engine_profile_picks_the_policy() -> None:
    for engine, policy in (("vllm", "vllm_v1"), ("trtllm", "trtllm"), ("sglang", "sglang")):
        plan = Simulation(make_scenario(engine=engine)).plan
        assert plan.instances[0].scheduler.policy == policy
    plan = Simulation(make_scenario(**{"engine": "vllm",
                                       "cluster.pools.main.scheduler.policy": "sglang"})).plan
    assert plan.instances[0].scheduler.policy == "sglang"


def test_a_key_of_another_engines_policy_is_refused_by_name() -> None:
    sc = make_scenario(**{"cluster.pools.main.scheduler": {
        "policy": "vllm_v1", "capacity_scheduler_policy": "max_utilization"}})
    with pytest.raises(ConfigError, match=r"scheduler\.capacity_scheduler_policy.*trtllm"):
        Simulation(sc)


# ----- unset limits: the engine's defaults for the device and entry point --------------
def _limits(**overrides: object) -> tuple[int | None, int | None]:
    spec = Simulation(make_scenario(**overrides)).plan.instances[0].scheduler
    return spec.max_num_seqs, spec.max_num_batched_tokens


def test_unset_vllm_limits_follow_its_defaults_by_device_class_and_entry_point() -> None:
    """vllm/engine/arg_utils.py: >= 70 GiB and not an A100: 1024 sequences, 8192 tokens
    (API server) or 16384 (LLM class); otherwise 256 and 2048 / 8192."""
    assert _limits(engine="vllm") == (1024, 8192)
    assert _limits(**{"engine": "vllm", "cluster.pools.main.device": "H200-SXM"}) == (1024, 8192)
    assert _limits(**{"engine": "vllm",
                      "cluster.pools.main.scheduler.entry_point": "offline"}) == (1024, 16384)
    assert _limits(**{"engine": "vllm",
                      "cluster.pools.main.device": "A100-SXM-80GB"}) == (256, 2048)
    assert _limits(**{"engine": "vllm", "cluster.pools.main.device": "A100-SXM-80GB",
                      "cluster.pools.main.scheduler.entry_point": "offline"}) == (256, 8192)


def test_explicit_limits_win_and_a_default_seq_cap_stays_within_the_token_budget() -> None:
    assert _limits(**{"engine": "vllm", "cluster.pools.main.scheduler.max_num_seqs": 64}) \
        == (64, 8192)
    # vLLM: max_num_seqs = min(default, max_num_batched_tokens)
    assert _limits(**{"engine": "vllm",
                      "cluster.pools.main.scheduler.max_num_batched_tokens": 512}) == (512, 512)
    assert _limits(**{"engine": "vllm", "cluster.pools.main.scheduler.max_num_seqs": 2048,
                      "cluster.pools.main.scheduler.max_num_batched_tokens": 512}) \
        == (2048, 512)


def test_each_engine_profile_gives_its_own_unset_limits() -> None:
    """TensorRT-LLM LLM API: 2048 / 8192; SGLang 0.4 on a GPU >= 25,000 MB: 2048 / 8192;
    the V0 profile has no device rule and keeps 256 / 8192."""
    for engine, want in (("trtllm", (2048, 8192)), ("sglang", (2048, 8192)),
                         ("vllm-0.6", (256, 8192))):
        assert _limits(engine=engine) == want

