"""How a serving engine turns its memory fraction into a KV-cache pool.

Three conventions exist, and the same number means different pools under them:

- ``device``: the fraction is of the whole device, and weights, the activation peak, the
  runtime and CUDA graphs all come out of it (vLLM ``--gpu-memory-utilization``: the KV
  pool is what the profile run leaves, ``vllm/v1/worker/gpu_worker.py``
  ``determine_available_memory``). :func:`simulator.cost.memory.plan_memory` computes this.
- ``weights_and_kv``: the fraction holds the weights and the KV pool only; activations,
  CUDA graphs and the runtime live in the rest of the device (SGLang
  ``--mem-fraction-static``: ``rest_memory = available_after_load - total * (1 -
  mem_fraction_static)``, ``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py``
  ``profile_max_num_token``, v0.5.8; ``model_runner.py`` in v0.4).
- ``free_after_weights``: the fraction is of what is left once weights and the profiled
  activation peak are in place (TensorRT-LLM ``KvCacheConfig.free_gpu_memory_fraction``).

With attention data parallelism every rank holds its own pool, so the instance's KV
capacity is ``dp`` pools.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.cost.memory import MemoryPlan

CONVENTIONS = ("device", "weights_and_kv", "free_after_weights")


def apply_convention(plan: MemoryPlan, fraction: float, convention: str,
                     dp: int = 1) -> MemoryPlan:
    """``plan`` (priced with ``fraction`` of the device) re-sized for ``convention``."""
    if convention == "device":
        return plan
    taken = plan.weight_bytes + plan.activation_bytes
    if convention == "free_after_weights":
        kv = max(plan.capacity_bytes - taken, 0.0) * fraction
    elif convention == "weights_and_kv":
        kv = max(plan.capacity_bytes * fraction - plan.weight_bytes, 0.0)
    else:
        raise ValueError(f"unknown memory convention {convention!r}; allowed: {', '.join(CONVENTIONS)}")
    tokens = int(kv // plan.kv_bytes_per_token) // plan.block_size * plan.block_size * dp
    return replace(plan, usable_bytes=taken + kv, kv_capacity_tokens=tokens)
