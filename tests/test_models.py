"""Model catalog: derived parameter counts and KV sizes against the published figures."""

from __future__ import annotations

import json

import pytest

from simulator.errors import ConfigError
from simulator.models import CATALOG, from_hf_config, get_model

# (total params in billions, active, KV KiB/token bf16) recounted from the models' published
# configs (meta-llama/llama-models models/sku_list.py, Mixtral arXiv 2401.04088 Table 1,
# Qwen's Hugging Face configs, deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json)
PUBLISHED = {
    "Llama-2-7B": (6.74, 6.74, 512),
    "Llama-2-70B": (68.98, 68.98, 320),
    "Llama-3.1-8B": (8.03, 8.03, 128),
    "Llama-3.1-70B": (70.55, 70.55, 320),
    "Llama-3.1-405B": (405.85, 405.85, 504),
    "Mixtral-8x7B": (46.70, 12.88, 128),
    "Qwen2.5-72B": (72.71, 72.71, 320),
    "Qwen3-235B-A22B": (235.1, 22.2, 188),
    "DeepSeek-V3": (671.0, 37.6, 68.625),
    "OPT-13B": (12.85, 12.85, 800),
    "OPT-66B": (65.7, 65.7, 2304),
    "OPT-175B": (174.6, 174.6, 4608),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_counts_match_published(name: str) -> None:
    total, active, kv_kib = PUBLISHED[name]
    m = get_model(name)
    assert m.params_total() / 1e9 == pytest.approx(total, rel=0.005)
    assert m.params_active() / 1e9 == pytest.approx(active, rel=0.01)
    assert m.kv_bytes_per_token("bf16") / 1024 == pytest.approx(kv_kib, rel=0.001)


def test_catalog_is_complete() -> None:
    assert set(PUBLISHED) == set(CATALOG)


def test_deepseek_mla_kv_is_latent_plus_rope() -> None:
    m = get_model("DeepSeek-V3")
    assert m.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2
    assert m.kv_bytes_per_token("fp8") == 61 * (512 + 64)


def test_hf_config_import_roundtrip(tmp_path) -> None:
    cfg = {
        "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = from_hf_config(path, name="mine")
    assert m.params_total() == get_model("Llama-3.1-8B").params_total()
    assert get_model(str(path)).kv_bytes_per_token() == 128 * 1024


def test_hf_config_moe_and_mla(tmp_path) -> None:
    cfg = {
        "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
        "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "vocab_size": 129280, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 163840,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = from_hf_config(path)
    assert m.params_total() == get_model("DeepSeek-V3").params_total()


def test_bad_model_names_and_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="unknown model"):
        get_model("Llama-9")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        from_hf_config(bad)
    bad.write_text(json.dumps({"hidden_size": 10}))
    with pytest.raises(ConfigError, match="missing required key"):
        from_hf_config(bad)


# ----- released precision and Hugging Face ids -------------------------------------------
def test_hugging_face_ids_resolve_to_the_catalog() -> None:
    from simulator.models.catalog import get_model

    assert get_model("meta-llama/Llama-3.1-70B-Instruct") is CATALOG["Llama-3.1-70B"]
    assert get_model("deepseek-ai/DeepSeek-V3") is CATALOG["DeepSeek-V3"]
    with pytest.raises(ConfigError, match="a Hugging Face id the catalog does not know"):
        get_model("someone/Unknown-7B")


def test_catalog_entries_carry_their_released_precision() -> None:
    assert CATALOG["DeepSeek-V3"].released_precision == "fp8"
    assert CATALOG["Llama-3.1-70B"].released_precision == "bf16"
    assert CATALOG["OPT-13B"].released_precision == "fp16"


def test_scenario_precision_defaults_to_the_release_and_overrides_are_shown() -> None:
    from simulator.models.catalog import precision_note
    from simulator.runner.build import build_plan
    from tests.conftest import make_scenario

    pools = [{"name": "main", "role": "colocated", "device": "H200-SXM",
              "parallelism": {"tp": 8}}]
    sc = make_scenario(**{"model": "deepseek-ai/DeepSeek-V3", "cluster.pools": pools})
    plan = build_plan(sc)
    weights = plan.pools[0].memory.weight_bytes
    assert weights / 8 < 90e9  # fp8: ~671 GB over 8 H200; bf16 would be ~168 GB per GPU
    assert "released precision" in precision_note(sc.model, sc.precision)
    bf16 = sc.with_(**{"precision.weights": "bf16"})
    assert precision_note(bf16.model, bf16.precision).startswith(
        "weights bf16, activations bf16")
    assert "overrides DeepSeek-V3's released fp8" in precision_note(bf16.model, bf16.precision)


def test_hf_config_records_an_fp8_release(tmp_path) -> None:
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
           "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000,
           "quantization_config": {"quant_method": "fp8"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert from_hf_config(path).released_precision == "fp8"
