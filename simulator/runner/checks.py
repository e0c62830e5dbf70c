"""Settings a serving engine would refuse for this model, refused before building anything.

The schema checks each section on its own; these rules need the model's shapes too.
Each message names the rule and the engine source that enforces it.
"""

from __future__ import annotations

from simulator.engine.workload_spec import EmpiricalLength, FixedLength, Length, UniformLength
from simulator.errors import ConfigError
from simulator.models.arch import ModelConfig
from simulator.scenario.schema import Scenario

VLLM_HEADS_RULE = ("vLLM (ModelConfig.verify_with_parallel_config in vllm/config) refuses "
                   "to start: total number of attention heads must be divisible by "
                   "tensor parallel size")
VLLM_CONTEXT_RULE = ("vLLM rejects a request whose prompt + max_tokens exceed max_model_len "
                     "(vllm/entrypoints/openai/serving_engine.py, _validate_input)")


def _shortest(spec: Length | None) -> int:
    if isinstance(spec, FixedLength):
        return spec.tokens
    if isinstance(spec, UniformLength):
        return spec.min_tokens
    if isinstance(spec, EmpiricalLength):
        return min(spec.values)
    return spec.min_tokens if spec is not None else 1


def check_model_settings(scenario: Scenario, model: ModelConfig, file: str | None) -> None:
    """Refuse parallelism the model's shapes forbid and MoE settings on a dense model."""
    for i, pool in enumerate(scenario.cluster.pools):
        key = f"cluster.pools[{i}]"
        tp = pool.parallelism.tp
        heads = model.num_attention_heads
        if heads % tp:
            fits = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 64]
            raise ConfigError(
                f"tp={tp} does not divide {model.name}'s {heads} attention heads; "
                f"{VLLM_HEADS_RULE}; allowed tp: {', '.join(map(str, fits))}",
                file=file, key=f"{key}.parallelism.tp")
        if not model.is_moe:
            if pool.parallelism.ep > 1:
                raise ConfigError(
                    f"ep={pool.parallelism.ep} on {model.name}, a dense model (no experts); "
                    "expert parallelism needs a MoE model, use ep: 1",
                    file=file, key=f"{key}.parallelism.ep")
            if pool.moe_imbalance != 1.0:
                raise ConfigError(
                    f"moe_imbalance={pool.moe_imbalance:g} on {model.name}, a dense model "
                    "(no experts); leave it at 1.0", file=file, key=f"{key}.moe_imbalance")


def check_context(scenario: Scenario, model: ModelConfig, file: str | None) -> None:
    """Refuse a workload none of whose requests fits the model's context; longer requests
    among shorter ones are rejected one by one, as the engine does."""
    w = scenario.workload
    if w.is_trace:
        return
    lengths = []
    for src in w.sources:
        n = _shortest(src.input_tokens) + _shortest(src.output_tokens)
        if src.shared_prefix is not None and src.shared_prefix.fraction >= 1.0:
            n += src.shared_prefix.tokens
        lengths.append(n)
    shortest = min(lengths)
    if shortest > model.max_context_tokens:
        raise ConfigError(
            f"the shortest request (prompt + output = {shortest} tokens) exceeds "
            f"{model.name}'s maximum context of {model.max_context_tokens} tokens, so every "
            f"request would be rejected ({VLLM_CONTEXT_RULE})", file=file, key="workload")
