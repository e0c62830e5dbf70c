"""Hardware split: SRAM-only LPU sizing and speed, GPU-prefill -> LPU-decode hand-off."""

from __future__ import annotations

import pytest

from simulator import ConfigError, Simulation, load_scenario, run
from tests.conftest import REPO, make_scenario

LPU = {"name": "lpu", "role": "colocated", "device": "GroqLPU-v1", "engine": "groq",
       "parallelism": {"tp": 8, "pp": "auto", "layer_split": "balanced"},
       "kv_budget_tokens": 4096 * 64,
       "precision": {"weights": "int8", "activations": "int8", "kv_cache": "int8"},
       "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 512}}


def lpu_scenario(**overrides):
    base = {"model": "Llama-2-70B", "cluster.pools": [LPU],
            "workload.arrival": {"kind": "closed_loop", "concurrency": 1},
            "workload.input_tokens": {"kind": "fixed", "tokens": 512},
            "workload.output_tokens": {"kind": "fixed", "tokens": 200},
            "workload.num_requests": 4}
    base.update(overrides)
    return make_scenario(**base)


def test_llama2_70b_int8_needs_hundreds_of_chips() -> None:
    sim = Simulation(lpu_scenario())
    pool = sim.plan.pools[0]
    assert 300 <= pool.devices <= 1000  # the public deployment used ~576
    # Weights alone: 69 GB of int8 over 230 MB chips (x 0.96 usable) -> > 300 chips.
    assert pool.devices * 0.23e9 * 0.96 > sim.plan.model.weight_bytes("int8")
    assert pool.memory.kv_capacity_tokens >= 4096 * 64
    # One fewer stage could not hold the same budget.
    fewer = lpu_scenario(**{"cluster.pools": [{**LPU, "parallelism": {
        "tp": 8, "pp": pool.parallelism.pp - 1, "layer_split": "balanced"}}]})
    with pytest.raises(ConfigError, match="needs at least tp=8 x pp="):
        Simulation(fewer)


def test_single_user_decode_is_hundreds_of_tokens_per_second() -> None:
    s = run(lpu_scenario()).summary
    assert 100 < s["per_user_tokens_per_s_mean"] < 2000
    assert s["completed"] == 4


def hetero(network: str | None = None):
    sc = load_scenario(REPO / "scenarios/lpu/llama270b_h100_prefill_lpu_decode.yaml")
    return sc.with_(**{"workload.num_requests": 30,
                       "cluster.kv_transfer.network": network})


def test_gpu_to_lpu_handoff_is_visible(tmp_path) -> None:
    res = run(hetero(), base_dir=REPO / "scenarios/lpu")
    t = res.transfers
    assert len(t) == res.summary["completed"]
    assert set(t["link_name"].str.split(":").str[0]) == {"pcie-gen5+ethernet-100g+pcie-gen4"}
    req = res.requests.set_index("request_id")
    # The client's first token comes from the LPU after the hand-off: TTFT contains it.
    gap = req["ttft_s"] - req["prefill_ttft_s"]
    assert (gap.loc[t["request_id"]] >= t.set_index("request_id")["exposed_s"]).all()
    assert set(req["prefill_instance_name"]) == {"prefill/0"}
    assert set(req["decode_instance_name"]) == {"lpu-decode/0"}


def _link(tmp_path, name: str, gbps: float) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nkind: ethernet\nbandwidth_gb_per_s: {gbps}\n"
                    "efficiency: 0.94\nlatency_us: 10\nper_transfer_overhead_us: 17\n"
                    "source: ['100 GbE scaled for a what-if']\n")
    return str(path)


def test_network_speed_matters_for_the_handoff(tmp_path) -> None:
    def gap(network: str | None) -> float:
        res = run(hetero(network), base_dir=REPO / "scenarios/lpu")
        r = res.requests
        return float((r["ttft_s"] - r["prefill_ttft_s"]).mean())  # hand-off + first step

    base = gap(None)
    slow = gap(_link(tmp_path, "eth-10g", 1.25))
    fast = gap(_link(tmp_path, "eth-1t", 125.0))
    assert slow > 2 * base
    assert fast < 0.8 * base


def test_context_too_long_for_sram_kv() -> None:
    """The fewest chips that hold the weights leave room for only a few thousand KV tokens."""
    smallest = Simulation(lpu_scenario(**{"cluster.pools": [{**LPU, "kv_budget_tokens": 16}]}))
    pp = smallest.plan.pools[0].parallelism.pp
    room = smallest.plan.pools[0].memory.kv_capacity_tokens
    pool = {**LPU, "kv_budget_tokens": None,
            "parallelism": {"tp": 8, "pp": pp, "layer_split": "balanced"}}
    sc = lpu_scenario(**{"cluster.pools": [pool],
                         "workload.input_tokens": {"kind": "fixed", "tokens": room + 100}})
    with pytest.raises(ConfigError, match="less than the longest prompt") as exc:
        Simulation(sc)
    assert "GroqLPU-v1" in str(exc.value)


def test_pp_auto_requires_a_budget() -> None:
    pool = {k: v for k, v in LPU.items() if k != "kv_budget_tokens"}
    with pytest.raises(ConfigError, match="kv_budget_tokens"):
        lpu_scenario(**{"cluster.pools": [pool]})


def test_lpu_is_a_profile_not_a_special_case() -> None:
    """The same engine code runs it; only the profile (SRAM memory) differs."""
    import inspect

    import simulator.engine.instance as inst
    from simulator.cost import step

    for module in (inst, step):
        src = inspect.getsource(module)
        assert "Groq" not in src
        assert "LPU" not in src.replace("LPU chip", "")
