"""Host (CPU) time of an engine step, and how much of it the GPU waits for.

An engine step is host work (schedule the batch, prepare inputs, launch kernels or replay
a CUDA graph, process the sampled tokens) around GPU work. Three engine behaviours decide
what the GPU waits for (figures and sources per engine in hardware_profiles/engines/):

- **Fixed and per-sequence host time** per step (scheduler, input preparation, output
  processing), a **per-layer time** every step pays (per-layer runtime work of an engine
  build that the operator model does not price), and a **per-layer launch gap** when the
  step does not replay a CUDA graph.
- **CUDA-graph capture sizes**: a graph-replayed batch pads up to the next captured size
  (vLLM ``cudagraph_capture_sizes``, SGLang ``--cuda-graph-bs``, TensorRT-LLM
  ``cuda_graph_config.batch_sizes`` with padding); a batch above the largest size runs
  eagerly and pays the launch gaps.
- **Async scheduling**: the host prepares step n+1 while the GPU runs step n (TensorRT-LLM
  overlap scheduler, SGLang zero-overhead scheduler, vLLM ``--async-scheduling``). With a
  share ``overlap`` of the host work hidden, a step takes
  ``gpu + host - overlap * min(host, gpu)``; at ``overlap = 1`` that is ``max(host, gpu)``,
  so a host-bound engine's step time stops depending on the GPU (flat TPOT across TP).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.hardware.engines import ServingEngineProfile


@dataclass(frozen=True, slots=True)
class HostModel:
    """An engine's host costs per step, in seconds (pure data, priced by the methods)."""

    step_s: float = 0.0
    per_seq_s: float = 0.0
    layer_s: float = 0.0
    """Per layer, every step."""
    eager_layer_s: float = 0.0
    """Per layer, steps that replay no CUDA graph only."""
    overlap: float = 0.0
    graph_sizes: tuple[int, ...] = ()
    """Captured batch sizes, ascending; empty = graphs at any decode batch size."""
    graph_mixed: bool = False
    """Steps with prefill tokens replay (piecewise) graphs too."""
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        if min(self.step_s, self.per_seq_s, self.layer_s, self.eager_layer_s) < 0:
            raise ValueError("host times must be >= 0")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap}")
        if list(self.graph_sizes) != sorted(set(self.graph_sizes)) or any(
                s < 1 for s in self.graph_sizes):
            raise ValueError("graph_sizes must be ascending, distinct and >= 1")

    def graph_batch(self, decode_seqs: int, prefill_tokens: int = 0) -> int | None:
        """The batch size a step runs at when it replays a CUDA graph (the next captured
        size at or above its tokens), or ``None`` when it runs eagerly."""
        if not self.cuda_graphs or (prefill_tokens and not self.graph_mixed):
            return None
        tokens = decode_seqs + prefill_tokens
        if not self.graph_sizes:
            return tokens if not prefill_tokens else None
        i = bisect_left(self.graph_sizes, tokens)
        return self.graph_sizes[i] if i < len(self.graph_sizes) else None

    def host_s(self, seqs: int, layers: float, graphed: bool) -> float:
        """Host seconds of one step with ``seqs`` sequences."""
        per_layer = self.layer_s if graphed else self.layer_s + self.eager_layer_s
        return self.step_s + self.per_seq_s * seqs + per_layer * layers

    def step_seconds(self, gpu_s: Any, host_s: float) -> Any:
        """Wall time of a step from its GPU and host seconds (numpy arrays allowed)."""
        if self.overlap == 0.0:
            return gpu_s + host_s
        if isinstance(gpu_s, np.ndarray):
            return gpu_s + host_s - self.overlap * np.minimum(gpu_s, host_s)
        return gpu_s + host_s - self.overlap * min(gpu_s, host_s)


def host_model(engine: ServingEngineProfile, max_num_seqs: int | None = None,
               memory_gib: float | None = None, tp: int = 1) -> HostModel:
    """The host costs of a serving-engine profile, with its captured CUDA-graph sizes on a
    device of ``memory_gib`` at TP ``tp`` (None: no device-dependent cap)."""
    graphs = engine.cuda_graph
    return HostModel(
        step_s=engine.step_overhead_us * 1e-6,
        per_seq_s=engine.per_sequence_overhead_us * 1e-6,
        layer_s=engine.per_layer_overhead_us * 1e-6,
        eager_layer_s=engine.per_layer_eager_us * 1e-6,
        overlap=engine.async_overlap,
        graph_sizes=graphs.captured(max_num_seqs, memory_gib, tp),
        graph_mixed=graphs.mixed_steps,
        cuda_graphs=engine.cuda_graphs,
    )
