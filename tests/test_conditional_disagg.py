"""Conditional disaggregation: at its extremes it is plain P/D or colocated, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import run
from simulator.errors import ConfigError
from tests.conftest import make_scenario

SCHED = {"max_num_seqs": 64, "max_num_batched_tokens": 4096}
TIMES = ("prefill_start_s", "prefill_end_s", "first_token_s", "completion_s")


def pd(conditional=None, **extra):
    pools = [
        {"name": "prefill", "role": "prefill", "device": "H100-SXM", "parallelism": {"tp": 2},
         "scheduler": SCHED},
        {"name": "decode", "role": "decode", "device": "H100-SXM", "parallelism": {"tp": 2},
         "instances": 2, "scheduler": SCHED},
    ]
    return make_scenario(**{
        "model": "Llama-3.1-70B",
        "cluster.pools": pools,
        "cluster.router": {"conditional": conditional} if conditional else {},
        "workload.arrival.rate_per_s": 4.0,
        "workload.input_tokens": {"kind": "empirical", "values": [200, 600, 6000],
                                  "weights": [3, 2, 1]},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 2, "max_tokens": 60},
        "workload.num_requests": 60,
        **extra,
    })


def same_times(a, b) -> None:
    for col in TIMES:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        assert np.array_equal(np.isnan(x), np.isnan(y)), col
        assert np.array_equal(x[~np.isnan(x)], y[~np.isnan(y)]), col


def test_always_remote_is_plain_disaggregation() -> None:
    plain = run(pd()).requests
    remote = run(pd({"max_local_prefill_length": 0})).requests
    same_times(plain, remote)
    assert (remote["prefill_instance_name"] == "prefill/0").all()


def test_always_local_is_a_colocated_cluster_of_the_decode_instances() -> None:
    local = run(pd({"max_local_prefill_length": 10**9})).requests
    colo = run(make_scenario(**{
        "model": "Llama-3.1-70B",
        "cluster.pools": [{"name": "main", "role": "colocated", "device": "H100-SXM",
                           "parallelism": {"tp": 2}, "instances": 2, "scheduler": SCHED}],
        "workload.arrival.rate_per_s": 4.0,
        "workload.input_tokens": {"kind": "empirical", "values": [200, 600, 6000],
                                  "weights": [3, 2, 1]},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 2, "max_tokens": 60},
        "workload.num_requests": 60,
    })).requests
    same_times(local, colo)
    assert local["prefill_instance_name"].str.startswith("decode/").all()
    assert local["transfer_start_s"].isna().all()


def test_the_threshold_splits_short_prompts_from_long_ones() -> None:
    r = run(pd({"max_local_prefill_length": 1000})).requests
    local = r["prefill_instance_name"].str.startswith("decode/")
    assert (local == (r["prompt_tokens"] <= 1000)).all()
    assert r.loc[local, "transfer_start_s"].isna().all()
    assert r.loc[~local, "transfer_end_s"].notna().all()


def test_a_long_prefill_queue_keeps_prompts_local() -> None:
    r = run(pd({"max_local_prefill_length": 0, "max_prefill_queue_size": 0})).requests
    assert r["prefill_instance_name"].str.startswith("decode/").all()


def test_expected_ttft_policy_sends_long_prompts_remote_and_completes() -> None:
    r = run(pd({"policy": "expected_ttft"})).requests
    assert (r["status"] == "completed").all()
    local = r["prefill_instance_name"].str.startswith("decode/")
    assert local.any()
    assert (~local).any()


def test_conditional_needs_a_decode_pool() -> None:
    with pytest.raises(ConfigError, match="no decode pool"):
        make_scenario(**{"cluster.router": {"conditional": {}}})
