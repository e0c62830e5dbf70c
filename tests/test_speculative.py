"""Speculative decoding and MTP: acceptance distributions, verify batches, step cost."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

import simulator
from simulator.cost.batch import BatchShape
from simulator.cost.parallel import Parallelism, Precisions
from simulator.cost.speculative import (
    Acceptance,
    SpeculativeConfig,
    speculative_step,
    steps_for,
    verify_batch,
)
from simulator.cost.step import InstanceCostModel, LinkSet
from simulator.hardware.registry import load_device, load_link
from simulator.models.catalog import get_model
from simulator.scenario.schema import Scenario

H100 = load_device("H100-SXM")


def _llama70b() -> InstanceCostModel:
    return InstanceCostModel(get_model("Llama-3.1-70B"), H100, Parallelism(4), Precisions(),
                             LinkSet(tp=load_link("nvlink4")), step_overhead_s=2e-3)


def test_rates_histogram_and_mean_describe_the_same_distribution() -> None:
    by_rates = Acceptance.from_rates([0.8, 0.6, 0.4])
    # 1 + 0.8 + 0.8*0.6 + 0.8*0.6*0.4
    assert by_rates.mean_tokens == pytest.approx(1 + 0.8 + 0.48 + 0.192)
    hist = Acceptance.from_histogram([x * 1000 for x in by_rates.probabilities])
    assert hist.mean_tokens == pytest.approx(by_rates.mean_tokens)
    assert Acceptance.from_mean(2.5, 3).mean_tokens == pytest.approx(2.5, abs=1e-9)


def test_mean_outside_one_to_k_plus_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\[1, 4\]"):
        Acceptance.from_mean(4.5, 3)


def test_verify_batch_samples_every_position() -> None:
    b = verify_batch(contexts_sum=8 * 1000, seqs=8, draft_tokens=3)
    assert b.prefill_tokens == 32
    assert b.logits_seqs == 32
    assert b.decode_seqs == 0
    assert b.prefill_kv_tokens == 8 * 1000 + 32


def test_acceptance_length_one_only_adds_cost() -> None:
    cost = _llama70b()
    seqs, ctx = 32, 32 * 2000
    plain = cost.step(BatchShape.decode(seqs, ctx)).seconds
    never = SpeculativeConfig("mtp", Acceptance.from_rates([0.0, 0.0]))
    step = speculative_step(cost, 80, seqs, ctx, never)
    assert step.tokens_per_seq == 1.0
    assert step.seconds / step.tokens_per_seq > plain
    ngram = SpeculativeConfig("ngram", Acceptance.from_rates([0.0, 0.0]), draft_layers=0.0)
    assert speculative_step(cost, 80, seqs, ctx, ngram).seconds > plain


def test_good_acceptance_lowers_time_per_token_in_a_weight_bound_decode() -> None:
    cost = _llama70b()
    seqs, ctx = 8, 8 * 2000
    plain = cost.step(BatchShape.decode(seqs, ctx)).seconds
    good = SpeculativeConfig("eagle", Acceptance.from_mean(3.0, 3))
    step = speculative_step(cost, 80, seqs, ctx, good)
    assert step.seconds / step.tokens_per_seq < 0.6 * plain


@pytest.mark.parametrize("mean", [1.5, 2.0, 3.2])
def test_acceptance_length_a_cuts_decode_steps_by_about_a(mean: float) -> None:
    acceptance = Acceptance.from_mean(mean, 4)
    rng = np.random.default_rng(7)
    output = 400
    # Each of 300 requests draws tokens per step until its output is done.
    draws = acceptance.sample(rng, 300 * output).reshape(300, output).cumsum(axis=1)
    steps = [int(np.searchsorted(row, output)) + 1 for row in draws]
    assert output / np.mean(steps) == pytest.approx(mean, rel=0.03)
    assert steps_for(output, mean) == pytest.approx(output / mean, abs=1)


# ----- in simulated runs -------------------------------------------------------------------
def _run(speculative: dict | None, requests: int = 1, output: int = 240, seed: int = 0):
    pool = {"name": "main", "role": "colocated", "device": "H100-SXM", "instances": 1,
            "parallelism": {"tp": 1}}
    if speculative is not None:
        pool["speculative"] = speculative
    sc = Scenario.model_validate({
        "name": "spec", "seed": seed, "model": "Llama-3.1-8B", "engine": "vllm",
        "workload": {"arrival": {"kind": "all_at_once"},
                     "input_tokens": {"kind": "fixed", "tokens": 500},
                     "output_tokens": {"kind": "fixed", "tokens": output},
                     "num_requests": requests},
        "cluster": {"pools": [pool]},
    })
    return simulator.run(sc)


def _decode_steps(result) -> int:
    return int((result.steps["decode_seqs"] > 0).sum())


def test_engine_acceptance_length_a_cuts_decode_steps_by_about_a() -> None:
    plain = _run(None)
    spec = _run({"method": "eagle", "draft_tokens": 3, "acceptance_length": 2.5})
    assert spec.requests["generated_tokens"].tolist() == [240]
    ratio = _decode_steps(plain) / _decode_steps(spec)
    assert ratio == pytest.approx(2.5, rel=0.15)
    assert spec.summary["tpot_mean_s"] < plain.summary["tpot_mean_s"]


def test_engine_acceptance_length_one_only_adds_cost() -> None:
    plain = _run(None, requests=4)
    never = _run({"method": "mtp", "draft_tokens": 2, "acceptance_rates": [0.0, 0.0]}, requests=4)
    assert _decode_steps(never) == _decode_steps(plain)
    assert never.summary["tpot_mean_s"] > plain.summary["tpot_mean_s"]
    assert never.summary["e2e_mean_s"] > plain.summary["e2e_mean_s"]


def test_client_itl_sees_bursts() -> None:
    spec = _run({"method": "eagle", "draft_tokens": 3, "acceptance_length": 3.0}, requests=2)
    # Bursts of about 3 tokens per step: two of every three gaps are zero, so the median
    # gap is 0 while TPOT (time over tokens) stays positive.
    assert spec.summary["itl_p50_s"] == 0.0
    assert spec.summary["tpot_mean_s"] > 0


def test_speculative_runs_are_reproducible() -> None:
    cfg = {"method": "mtp", "draft_tokens": 2, "acceptance_histogram": [3, 3, 4]}
    a, b = _run(cfg, requests=3), _run(cfg, requests=3)
    assert a.requests.equals(b.requests)
    assert a.steps.equals(b.steps)


def test_bad_speculative_settings_are_refused() -> None:
    with pytest.raises(ValidationError, match="exactly one of"):
        _run({"method": "eagle", "draft_tokens": 3})
    with pytest.raises(ValidationError, match="exceeds draft_tokens"):
        _run({"method": "eagle", "draft_tokens": 3, "acceptance_length": 4.5})
