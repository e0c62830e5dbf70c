"""How a serving engine turns its memory fraction into a KV-cache pool.

Two conventions exist, and the same number means different pools under them:

- ``device``: the fraction is of the whole device, and weights, the activation peak, the
  runtime and CUDA graphs all come out of it (vLLM ``--gpu-memory-utilization``, SGLang
  ``--mem-fraction-static``). :func:`simulator.cost.memory.plan_memory` computes this.
- ``free_after_weights``: the fraction is of what is left once weights and the profiled
  activation peak are in place (TensorRT-LLM ``KvCacheConfig.free_gpu_memory_fraction``).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.cost.memory import MemoryPlan

CONVENTIONS = ("device", "free_after_weights")


def apply_convention(plan: MemoryPlan, fraction: float, convention: str) -> MemoryPlan:
    """``plan`` (priced with ``fraction`` of the device) re-sized for ``convention``."""
    if convention == "device":
        return plan
    if convention != "free_after_weights":
        raise ValueError(f"unknown memory convention {convention!r}; allowed: {', '.join(CONVENTIONS)}")
    taken = plan.weight_bytes + plan.activation_bytes
    kv = max(plan.capacity_bytes - taken, 0.0) * fraction
    tokens = int(kv // plan.kv_bytes_per_token) // plan.block_size * plan.block_size
    return replace(plan, usable_bytes=taken + kv, kv_capacity_tokens=tokens)
