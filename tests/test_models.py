"""Model catalog: derived parameter counts and KV sizes against the published figures."""

from __future__ import annotations

import json

import pytest

from simulator.errors import ConfigError
from simulator.models import CATALOG, from_hf_config, get_model

# (total params in billions, active, KV KiB/token bf16) from shared reference section 2
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
