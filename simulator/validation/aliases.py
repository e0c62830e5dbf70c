"""Names as users write them, mapped to the simulator's: precisions, engines, devices,
Hugging Face model ids and CSV column headers.

One place for every alias, so the operator CSV of ``validate``, the serving CSV of
``validate-serving`` and the ``vllm bench serve`` JSON reader accept the same spellings.
Every function is case-insensitive and raises :class:`ValueError` with the allowed values
(callers turn it into a :class:`~simulator.errors.ConfigError` naming file, row, column).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from simulator.units import BYTES_PER_ELEMENT

# Spellings seen in engine flags and model cards: vLLM --dtype/--kv-cache-dtype
# (auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2), TensorRT-LLM quant_algo (FP8, NVFP4,
# W4A16_AWQ), Hugging Face torch_dtype (bfloat16, float16, float32).
_PRECISIONS: dict[str, str] = {
    **{p: p for p in BYTES_PER_ELEMENT},
    "bfloat16": "bf16", "bf-16": "bf16",
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "float8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "e4m3": "fp8", "f8e4m3": "fp8",
    "fp8-dynamic": "fp8", "fp8_dynamic": "fp8", "w8a8-fp8": "fp8",
    "nvfp4": "fp4", "mxfp4": "fp4", "float4": "fp4", "fp4_e2m1": "fp4",
    "w8a8": "int8", "int8_weight_only": "int8", "w8a16": "int8",
    "w4a16": "int4", "awq": "int4", "gptq": "int4", "w4a16_awq": "int4", "int4_awq": "int4",
}

_ENGINES: dict[str, str] = {
    "vllm": "vllm", "v-llm": "vllm",
    "trtllm": "trtllm", "trt-llm": "trtllm", "tensorrt-llm": "trtllm", "tensorrtllm": "trtllm",
    "tensorrt_llm": "trtllm", "trt_llm": "trtllm", "trtllm-serve": "trtllm",
    "nim": "nim", "nvidia-nim": "nim", "nim-llm": "nim",
    "sglang": "sglang", "sgl": "sglang",
    "groq": "groq",
}

# Device names as nvidia-smi, cloud SKUs and benchmark pages write them -> profile names.
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"gb200", "GB200-NVL72"),
    (r"b200", "B200"),
    (r"h200", "H200-SXM"),
    (r"h100.*(pcie|nvl)", "H100-PCIe"),
    (r"h100", "H100-SXM"),
    (r"a100", "A100-SXM-80GB"),
    (r"l40s", "L40S"),
    (r"mi300x", "MI300X"),
    (r"groq|lpu", "GroqLPU-v1"),
)

# Hugging Face repository names -> catalog names; quantisation suffixes give the precision.
_MODEL_FAMILIES: tuple[tuple[str, str], ...] = (
    (r"^(meta-)?llama-3(\.[123])?-8b", "Llama-3.1-8B"),
    (r"^(meta-)?llama-3(\.[13])?-70b", "Llama-3.1-70B"),
    (r"^(meta-)?llama-3\.1-405b", "Llama-3.1-405B"),
    (r"^llama-2-7b", "Llama-2-7B"),
    (r"^llama-2-70b", "Llama-2-70B"),
    (r"^mixtral-8x7b", "Mixtral-8x7B"),
    (r"^qwen2\.5-72b", "Qwen2.5-72B"),
    (r"^qwen3-235b-a22b", "Qwen3-235B-A22B"),
    (r"^deepseek-(v3|r1)(-0324|-0528)?$", "DeepSeek-V3"),
    (r"^opt-13b", "OPT-13B"),
    (r"^opt-66b", "OPT-66B"),
    (r"^opt-175b", "OPT-175B"),
)
_QUANT_SUFFIXES: tuple[tuple[str, str], ...] = (
    (r"(nv)?fp4", "fp4"),
    (r"fp8", "fp8"),
    (r"w8a8|int8", "int8"),
    (r"awq|gptq|w4a16|int4", "int4"),
)

# Serving-CSV headers: what users (and older versions of this format) write -> canonical.
COLUMN_ALIASES: dict[str, str] = {
    "input_tokens": "input_len", "isl": "input_len", "prompt_len": "input_len",
    "output_tokens": "output_len", "osl": "output_len",
    "kv_cache_precision": "kv_precision", "kv_cache_dtype": "kv_precision",
    "measured_output_tokens_per_s": "measured_output_tok_s",
    "measured_output_throughput": "measured_output_tok_s",
    "measured_e2el_ms": "measured_e2e_ms",
    "max_concurrency": "concurrency",
    "enable_attention_dp": "attention_dp",
    "num_prompts": "num_requests",
    "gpu": "device",
    "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp",
    "expert_parallel_size": "ep", "data_parallel_size": "dp",
    "version": "engine_version",
    "rate_per_s": "request_rate", "request_rate_per_s": "request_rate",
}


class ModelRef(NamedTuple):
    """A catalog model and the precision its name implies (``None``: not stated)."""

    name: str
    precision: str | None


def _key(value: object) -> str:
    return str(value).strip().lower()


def precision(value: object) -> str:
    """``bfloat16``, ``BF16``, ``fp8_e4m3``, ``NVFP4`` ... -> a simulator precision."""
    key = _key(value).replace(" ", "")
    if key in _PRECISIONS:
        return _PRECISIONS[key]
    raise ValueError(f"unknown precision {value!r}; allowed: {', '.join(sorted(BYTES_PER_ELEMENT))} "
                     "(or an alias such as bfloat16, float16, fp8_e4m3, nvfp4)")


def precision_or_same(value: object) -> object:
    """The canonical precision of a cell, or the cell unchanged when it is not one (so the
    caller's own check reports it with the allowed values)."""
    try:
        return precision(value)
    except ValueError:
        return value


def device_or_same(value: object, known: list[str]) -> object:
    """The shipped profile a device name means, or the name unchanged."""
    try:
        return device(value, known)
    except ValueError:
        return value


def engine(value: object) -> str:
    """``vLLM``, ``TensorRT-LLM``, ``SGLang`` ... -> an engine profile name."""
    key = _key(value).replace(" ", "")
    if key in _ENGINES:
        return _ENGINES[key]
    raise ValueError(f"unknown engine {value!r}; allowed: vllm, trtllm (TensorRT-LLM), "
                     "nim (NVIDIA NIM for LLMs), sglang, groq")


def device(value: object, known: list[str]) -> str:
    """A profile name as given (any case), or a product name such as ``NVIDIA H100 80GB
    HBM3`` matched to a shipped profile."""
    key = _key(value)
    by_lower = {k.lower(): k for k in known}
    if key in by_lower:
        return by_lower[key]
    squashed = re.sub(r"[\s_]+", "-", key)
    for pattern, name in _DEVICE_PATTERNS:
        if re.search(pattern, squashed) and name in known:
            return name
    raise ValueError(f"unknown device {value!r}; shipped: {', '.join(known)}")


def model(value: object, catalog: list[str]) -> ModelRef:
    """A catalog name, or a Hugging Face id (``meta-llama/Llama-3.1-8B-Instruct``,
    ``nvidia/Llama-3.1-8B-Instruct-FP8``) with the precision its suffix names."""
    text = str(value).strip()
    by_lower = {k.lower(): k for k in catalog}
    if text.lower() in by_lower:
        return ModelRef(by_lower[text.lower()], None)
    repo = text.rsplit("/", 1)[-1].lower()
    quant = None
    for pattern, prec in _QUANT_SUFFIXES:
        if re.search(rf"[-_.]({pattern})([-_.]|$)", repo):
            quant = prec
            break
    for pattern, name in _MODEL_FAMILIES:
        if re.search(pattern, repo) and name in catalog:
            return ModelRef(name, quant)
    raise ValueError(f"unknown model {value!r}; catalog: {', '.join(catalog)} (or a Hugging Face "
                     "id of one of them, e.g. meta-llama/Llama-3.1-8B-Instruct)")


def column(name: object) -> str:
    """A CSV header, trimmed and lower-cased, with its alias resolved."""
    key = _key(name).replace(" ", "_").replace("-", "_")
    return COLUMN_ALIASES.get(key, key)
