"""Built-in model catalog, and loading of a Hugging Face ``config.json``.

Shapes are taken from the models' published configurations (cited per entry); parameter
counts and KV sizes are derived by :class:`ModelConfig`, and tests compare them with the
published totals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator.config_io import validation_to_config_error
from simulator.errors import ConfigError
from simulator.models.arch import ModelConfig

_LLAMA_SRC = "meta-llama/llama-models:models/sku_list.py@364ed4e; HF config.json"
_VIDUR_SRC = "microsoft/vidur:vidur/config/model_config.py; HF config.json"
_OPT_SRC = "Zhang et al., OPT: Open Pre-trained Transformer Language Models (2022), Table 1"



def _llama31(size: str) -> tuple[str, ...]:
    return tuple(f"meta-llama/{p}Llama-3.1-{size}{s}" for p in ("", "Meta-")
                 for s in ("", "-Instruct"))


_ENTRIES: list[dict[str, Any]] = [
    dict(name="Llama-2-7B", released_precision="fp16",
         hf_ids=("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"),
          num_layers=32, hidden_size=4096, num_attention_heads=32,
         num_kv_heads=32, head_dim=128, intermediate_size=11008, vocab_size=32000,
         max_context_tokens=4096, source=_VIDUR_SRC),
    dict(name="Llama-2-70B", released_precision="fp16",
         hf_ids=("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"),
          num_layers=80, hidden_size=8192, num_attention_heads=64,
         num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=32000,
         max_context_tokens=4096, source=_VIDUR_SRC),
    dict(name="Llama-3.1-8B", hf_ids=_llama31("8B"),
          num_layers=32, hidden_size=4096, num_attention_heads=32,
         num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
         max_context_tokens=131072, source=_LLAMA_SRC),
    dict(name="Llama-3.1-70B", hf_ids=_llama31("70B"),
          num_layers=80, hidden_size=8192, num_attention_heads=64,
         num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256,
         max_context_tokens=131072, source=_LLAMA_SRC),
    dict(name="Llama-3.1-405B", hf_ids=_llama31("405B"),
          num_layers=126, hidden_size=16384, num_attention_heads=128,
         num_kv_heads=8, head_dim=128, intermediate_size=53248, vocab_size=128256,
         max_context_tokens=131072, source=_LLAMA_SRC),
    dict(name="Mixtral-8x7B", hf_ids=("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
          num_layers=32, hidden_size=4096, num_attention_heads=32,
         num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=32000,
         max_context_tokens=32768, num_experts=8, num_experts_per_token=2,
         moe_intermediate_size=14336, architecture="MixtralForCausalLM",
         source="Mixtral of Experts, arXiv 2401.04088 Table 1; HF config.json"),
    dict(name="Qwen2.5-72B", hf_ids=("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"),
          num_layers=80, hidden_size=8192, num_attention_heads=64,
         num_kv_heads=8, head_dim=128, intermediate_size=29568, vocab_size=152064,
         max_context_tokens=131072, qkv_bias=True,
         source="HF Qwen/Qwen2.5-72B config.json; Qwen2.5 report arXiv 2412.15115"),
    dict(name="Qwen3-235B-A22B", hf_ids=("Qwen/Qwen3-235B-A22B",),
          num_layers=94, hidden_size=4096, num_attention_heads=64,
         num_kv_heads=4, head_dim=128, intermediate_size=12288, vocab_size=151936,
         max_context_tokens=40960, qk_norm=True, num_experts=128, num_experts_per_token=8,
         moe_intermediate_size=1536, architecture="Qwen3MoeForCausalLM",
         source="HF Qwen/Qwen3-235B-A22B config.json"),
    # released in fp8: config.json quantization_config fmt e4m3, weight_block_size 128x128
    dict(name="DeepSeek-V3", released_precision="fp8",
         hf_ids=("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-0324"),
          num_layers=61, hidden_size=7168, num_attention_heads=128,
         num_kv_heads=128, head_dim=128, intermediate_size=18432, vocab_size=129280,
         max_context_tokens=131072, attention="mla", q_lora_rank=1536, kv_lora_rank=512,
         qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_experts=256,
         num_experts_per_token=8, moe_intermediate_size=2048, num_shared_experts=1,
         first_dense_layers=3, architecture="DeepseekV3ForCausalLM",
         source="deepseek-ai/DeepSeek-V3:inference/configs/config_671B.json@9b4e978"),
    dict(name="OPT-13B", released_precision="fp16", hf_ids=("facebook/opt-13b",),
          num_layers=40, hidden_size=5120, num_attention_heads=40,
         num_kv_heads=40, head_dim=128, intermediate_size=20480, vocab_size=50272,
         max_context_tokens=2048, mlp_kind="plain", norm_kind="layer",
         tie_word_embeddings=True, learned_positions=2050, source=_OPT_SRC),
    dict(name="OPT-66B", released_precision="fp16", hf_ids=("facebook/opt-66b",),
          num_layers=64, hidden_size=9216, num_attention_heads=72,
         num_kv_heads=72, head_dim=128, intermediate_size=36864, vocab_size=50272,
         max_context_tokens=2048, mlp_kind="plain", norm_kind="layer",
         tie_word_embeddings=True, learned_positions=2050, source=_OPT_SRC),
    dict(name="OPT-175B", released_precision="fp16",
          num_layers=96, hidden_size=12288, num_attention_heads=96,
         num_kv_heads=96, head_dim=128, intermediate_size=49152, vocab_size=50272,
         max_context_tokens=2048, mlp_kind="plain", norm_kind="layer",
         tie_word_embeddings=True, learned_positions=2050, source=_OPT_SRC),
]

CATALOG: dict[str, ModelConfig] = {
    e["name"]: ModelConfig(**{k: v for k, v in e.items() if k != "hf_ids"}) for e in _ENTRIES}

HF_IDS: dict[str, str] = {i.lower(): e["name"] for e in _ENTRIES for i in e.get("hf_ids", ())}
"""Hugging Face repository id (lower case) -> catalog name; the weights behind each id are
the catalog entry's released precision."""


def hf_ids() -> list[str]:
    """Every Hugging Face id the catalog resolves, spelled as on the Hub."""
    return [i for e in _ENTRIES for i in e.get("hf_ids", ())]


def released_precisions(model: ModelConfig) -> dict[str, str]:
    """What a scenario runs when it gives no ``precision``: weights (and, for fp8
    releases, GEMM activations, as DeepSeek-V3's block-wise fp8 inference does) in the
    released precision, activations and KV cache in the 16-bit type otherwise."""
    wide = "fp16" if model.released_precision == "fp16" else "bf16"
    return {"weights": model.released_precision,
            "activations": "fp8" if model.released_precision == "fp8" else wide,
            "kv_cache": wide}


def resolve_precisions(model: ModelConfig, *given: Any) -> dict[str, str]:
    """Per field, the first of ``given`` (pool, then scenario ``precision`` mappings or
    specs, ``None`` where unset) that sets it, else the released default. Activations follow
    an overridden weight precision (``weights: bf16`` on an fp8 release runs bf16 GEMMs)."""
    out = released_precisions(model)
    chosen: dict[str, str] = {}
    for spec in given:
        values = spec if isinstance(spec, dict) else (spec.model_dump() if spec else {})
        for key, value in values.items():
            if value is not None and key not in chosen:
                chosen[key] = value
    if "weights" in chosen and "activations" not in chosen and chosen["weights"] != "fp8":
        chosen["activations"] = "fp16" if chosen["weights"] == "fp16" else "bf16"
    out.update(chosen)
    return out


def precision_note(model_name: str, *given: Any) -> str:
    """``weights fp8 (DeepSeek-V3's released precision)`` or ``weights bf16 (overrides
    DeepSeek-V3's released fp8)``; empty when the model is not in the catalog."""
    try:
        model = get_model(model_name)
    except ConfigError:
        return ""
    p = resolve_precisions(model, *given)
    text = f"weights {p['weights']}, activations {p['activations']}, KV cache {p['kv_cache']}"
    if p["weights"] == model.released_precision:
        return f"{text} ({model.name}'s released precision)"
    return f"{text} (overrides {model.name}'s released {model.released_precision})"


def model_names() -> list[str]:
    return list(CATALOG)


def get_model(name: str) -> ModelConfig:
    """A catalog model by name or Hugging Face id (``deepseek-ai/DeepSeek-V3``), case
    insensitive, or a HF ``config.json`` by path."""
    by_lower = {k.lower(): v for k, v in CATALOG.items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    if name.lower() in HF_IDS:
        return CATALOG[HF_IDS[name.lower()]]
    path = Path(name)
    if path.suffix == ".json" or path.is_dir():
        return from_hf_config(path)
    hint = ""
    if "/" in name and not path.exists():
        hint = (" (a Hugging Face id the catalog does not know: download its config.json and "
                "give its path)")
    raise ConfigError(
        f"unknown model {name!r}{hint}; catalog: {', '.join(CATALOG)}; Hugging Face ids: "
        f"{', '.join(sorted({i for e in _ENTRIES for i in e.get('hf_ids', ())[:1]}))} and "
        "their -Instruct variants (or give a path to a Hugging Face config.json)"
    )


# Model types whose transformers config class defaults `tie_word_embeddings` to False
# (configuration_llama.py, _mistral, _mixtral, _qwen2, _qwen2_moe, _qwen3, _qwen3_moe,
# _deepseek_v2, _deepseek_v3, _phi3); every other type inherits PretrainedConfig's True.
UNTIED_BY_DEFAULT = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
                               "qwen3_moe", "deepseek_v2", "deepseek_v3", "phi3"})


class _Reader:
    """Typed access to a config.json: a wrong type names the key, never a crash later."""

    def __init__(self, cfg: dict[str, Any], file: str) -> None:
        self.cfg, self.file = cfg, file

    def _bad(self, key: str, want: str) -> ConfigError:
        return ConfigError(f"must be {want}, got {self.cfg[key]!r}", file=self.file, key=key)

    def whole(self, *keys: str, default: int | None = None) -> int | None:
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise self._bad(key, "an integer")
            if not 0 <= value <= 2**53:
                raise self._bad(key, "an integer in 0..2**53")
            return value
        return default

    def flag(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def text(self, key: str, default: str = "") -> str:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value


def _released(cfg: dict[str, Any]) -> str:
    """fp8 for an fp8 ``quantization_config`` (DeepSeek-V3, the -FP8 releases), else the
    ``torch_dtype``'s 16-bit type."""
    quant = cfg.get("quantization_config") or {}
    if isinstance(quant, dict) and (quant.get("quant_method") == "fp8"
                                    or str(quant.get("fmt", "")).startswith("e4m3")):
        return "fp8"
    return "fp16" if str(cfg.get("torch_dtype", "")) == "float16" else "bf16"


def _architecture(cfg: dict[str, Any]) -> str:
    """The first of ``architectures`` (the class the engines load), else ''."""
    names = cfg.get("architectures")
    return str(names[0]) if isinstance(names, list) and names else ""


def from_hf_config(path: str | Path, name: str | None = None) -> ModelConfig:
    """Build a :class:`ModelConfig` from a Hugging Face ``config.json`` (file or folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    file = str(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("model config file not found", file=file) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not valid JSON ({exc})", file=file) from None
    except RecursionError:
        raise ConfigError("not valid JSON (nested too deeply)", file=file) from None
    except OSError as exc:
        raise ConfigError(f"cannot read file ({exc.strerror or exc})", file=file) from None
    if not isinstance(cfg, dict):
        raise ConfigError("expected a JSON object", file=file)
    r = _Reader(cfg, file)
    model_type = r.text("model_type")
    hidden = r.whole("hidden_size", "d_model")
    heads = r.whole("num_attention_heads", "n_head")
    max_context = r.whole("max_position_embeddings", "n_positions", default=4096)
    fields: dict[str, Any] = {
        "name": name or r.text("_name_or_path") or path.parent.name or "hf-model",
        "num_layers": r.whole("num_hidden_layers", "n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": r.whole("num_key_value_heads", default=heads),
        "intermediate_size": r.whole("intermediate_size", "ffn_dim"),
        "vocab_size": r.whole("vocab_size"),
        "max_context_tokens": max_context,
        "tie_word_embeddings": r.flag("tie_word_embeddings",
                                      model_type not in UNTIED_BY_DEFAULT),
        "source": f"Hugging Face config.json at {file}",
        "architecture": _architecture(cfg),
        "released_precision": _released(cfg),
    }
    head_dim = r.whole("head_dim")
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    fields["head_dim"] = head_dim
    if model_type == "opt":
        fields.update(mlp_kind="plain", norm_kind="layer", learned_positions=(
            (max_context or 2048) + 2))
    if model_type.startswith("qwen2") or r.flag("attention_bias", False):
        fields["qkv_bias"] = True
    if model_type.startswith("qwen3"):
        fields["qk_norm"] = True
    experts = r.whole("num_local_experts", "num_experts", "n_routed_experts", default=0)
    if experts:
        fields.update(
            num_experts=experts,
            num_experts_per_token=r.whole("num_experts_per_tok", default=0),
            moe_intermediate_size=r.whole("moe_intermediate_size") or fields["intermediate_size"],
            num_shared_experts=r.whole("n_shared_experts", default=0),
            first_dense_layers=r.whole("first_k_dense_replace", default=0),
        )
    if r.whole("kv_lora_rank"):
        nope = r.whole("qk_nope_head_dim", default=0) or 0
        rope = r.whole("qk_rope_head_dim", default=0) or 0
        fields.update(
            attention="mla",
            q_lora_rank=r.whole("q_lora_rank", default=0),
            kv_lora_rank=r.whole("kv_lora_rank"),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=r.whole("v_head_dim", default=0),
            head_dim=nope + rope,
        )
    missing = [k for k, v in fields.items() if v is None]
    if missing:
        raise ConfigError(f"missing required key(s) {missing} for a transformer config", file=file)
    try:
        return ModelConfig(**fields)
    except ValidationError as exc:
        raise validation_to_config_error(exc, file) from None
