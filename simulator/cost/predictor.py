"""Step-time predictors: batch shape + instance layout in, seconds and where they went out.

Two implementations share one set of operator equations (:mod:`simulator.cost.step`):

* :class:`InstanceCostModel`, the calibrated roofline (default, no extra dependency);
* :class:`TablePredictor`, which prices every operator it finds in a measured kernel table
  (:class:`simulator.cost.tables.KernelTables`) by interpolation and falls back to the
  roofline for the rest, keeping count of which was which (its :class:`Provenance`).

The engine only calls ``step``, ``decode_series`` and reads ``parallelism``; any object
with those (the :class:`StepTimePredictor` protocol) can price an instance's steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from simulator.cost.batch import BatchShape
from simulator.cost.operators import RESIDUAL_BYTES
from simulator.cost.parallel import Parallelism
from simulator.cost.step import DecodeSeries, InstanceCostModel, StepCost, _Acc
from simulator.cost.tables import KernelTables

_BOUNDS = ("compute", "memory", "communication", "overhead")
MAX_FALLBACK_SHAPES = 50
"""Distinct fallback shapes kept per operator family (the count covers all of them)."""


@runtime_checkable
class StepTimePredictor(Protocol):
    """What the engine needs from a cost model."""

    parallelism: Parallelism

    def step(self, batch: BatchShape) -> StepCost: ...

    def decode_series(self, seqs: int, ctx_sums: np.ndarray,
                      longest: np.ndarray | None = None) -> DecodeSeries: ...

    def breakdown(self, batch: BatchShape) -> dict[str, float]: ...


@dataclass
class Provenance:
    """How much of the priced time came from measured tables, and what fell back."""

    table_s: float = 0.0
    roofline_s: float = 0.0
    fallback_ops: dict[str, int] = field(default_factory=dict)
    fallback_shapes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def table_share(self) -> float:
        total = self.table_s + self.roofline_s
        return self.table_s / total if total else math.nan

    def fell_back(self, label: str, shape: str, seconds: float) -> None:
        self.roofline_s += seconds
        self.fallback_ops[label] = self.fallback_ops.get(label, 0) + 1
        shapes = self.fallback_shapes.setdefault(label, [])
        if shape not in shapes and len(shapes) < MAX_FALLBACK_SHAPES:
            shapes.append(shape)

    def merge(self, other: Provenance) -> None:
        self.table_s += other.table_s
        self.roofline_s += other.roofline_s
        for label, n in other.fallback_ops.items():
            self.fallback_ops[label] = self.fallback_ops.get(label, 0) + n
        for label, shapes in other.fallback_shapes.items():
            mine = self.fallback_shapes.setdefault(label, [])
            for shape in shapes:
                if shape not in mine and len(mine) < MAX_FALLBACK_SHAPES:
                    mine.append(shape)


_TABLE_DTYPES = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp4": "fp4"}


@dataclass
class TablePredictor(InstanceCostModel):
    """The roofline with every operator a measured table covers priced from the table.

    Operators and the table each uses (AIConfigurator's collectors; shapes per device):

    * GEMMs (QKV, O, gate+up, down, LM head): ``gemm[dtype]`` at ``(tokens, n, k)``; a
      group (QKV + O) comes from the table only if every member does;
    * prefill attention: ``context_attention`` at ``(sequences, isl)``, where ``isl`` is
      the causal length with the step's query-key pairs per sequence (exact for prompts
      without cached context, an equal-FLOPs stand-in for chunks on a prefix);
    * decode attention: ``generation_attention`` at ``(sequences, mean context)``;
    * TP all-reduce: ``allreduce[tp]`` at the message size (the engine's own kernels);
    * routed experts: ``moe[...]`` at the step's tokens (balanced routing).

    MLA attention, elementwise kernels, the router and shared experts, PP transfers and
    host time stay on the roofline. Operator time from a table replaces the roofline's
    compute/memory split by the roofline's own label (compute- or memory-bound).
    """

    tables: KernelTables | None = None
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tables is None:
            raise ValueError("TablePredictor needs kernel tables")
        m, t = self.model, self.parallelism.tp
        self._heads = m.num_attention_heads // t if m.num_attention_heads % t == 0 else None
        self._kv_dtype = _TABLE_DTYPES.get(self.precisions.kv_cache, self.precisions.kv_cache)
        self._gemm_dtype = _TABLE_DTYPES.get(self._cp, self._cp)

    # ----- operator hook ---------------------------------------------------------------
    def _op(self, acc: _Acc, flops: float, nbytes: float, kernels: int, times: float,
            label: str = "other", key: Any = None, units: float = 1.0, rows: float = 0.0,
            quant: float = 1.0, groups: float = 0.0, fit_label: str | None = None,
            depth: float = 0.0, written: float = 0.0, blocks: float = 0.0,
            streamed: float = 0.0) -> None:
        compute, memory, launch = self._roofline(label, flops, nbytes, kernels, units, rows,
                                                 quant, groups, fit_label, depth, written,
                                                 blocks, streamed)
        measured = self._lookup(label, key) if key is not None else None
        if measured is None:
            acc.add_op(compute, memory, launch, times, label)
            self.provenance.fell_back(label, _describe(label, key),
                                      (max(compute, memory) + launch) * times)
            return
        # The table's time replaces the roofline's; its bound keeps the roofline's label.
        if compute >= memory:
            acc.add_op(measured, 0.0, 0.0, times, label)
        else:
            acc.add_op(0.0, measured, 0.0, times, label)
        self.provenance.table_s += measured * times

    def _allreduce(self, acc: _Acc, nbytes: float, ranks: int, times: float) -> None:
        assert self.tables is not None
        measured = self.tables.allreduce_s(nbytes / RESIDUAL_BYTES, ranks)  # elements
        if measured is None:
            before = acc.comm
            super()._allreduce(acc, nbytes, ranks, times)
            self.provenance.fell_back("allreduce", f"{ranks} ranks, {nbytes:.0f} B",
                                      acc.comm - before)
            return
        acc.add_comm(measured * times, "allreduce")
        self.provenance.table_s += measured * times

    def _lookup(self, label: str, key: Any) -> float | None:
        tables = self.tables
        assert tables is not None
        if label.startswith("gemm") or label == "lm_head":
            tokens, shapes = key
            total = 0.0
            for n, k in shapes:
                t = tables.gemm_s(tokens, n, k, self._gemm_dtype)
                if t is None:
                    return None
                total += t
            return total
        if label in ("attention_prefill", "attention_decode"):
            if self.model.attention == "mla" or self._heads is None:
                return None
            b: BatchShape = key
            akey = (self._heads, self.kv_heads_per_device, self.model.head_dim, self._kv_dtype)
            if label == "attention_prefill":
                per_seq = b.prefill_attn_pairs / b.prefill_seqs
                isl = (math.sqrt(1.0 + 8.0 * per_seq) - 1.0) / 2.0
                return tables.context_attention_s(akey, b.prefill_seqs, isl)
            return tables.generation_attention_s(akey, b.decode_seqs,
                                                 b.decode_ctx_tokens / b.decode_seqs)
        if label == "moe":
            m, par = self.model, self.parallelism
            for dtype in (self._gemm_dtype, f"{self._gemm_dtype}_block"):
                mkey = (dtype, m.hidden_size, m.moe_intermediate_size, m.num_experts_per_token,
                        m.num_experts, par.expert_tp, par.ep)
                t = tables.moe_s(mkey, key)
                if t is not None:
                    return t
            return None
        return None

    # ----- decode stretches: priced step by step (tables are not affine in context) -----
    def decode_series(self, seqs: int, ctx_sums: np.ndarray,
                      longest: np.ndarray | None = None) -> DecodeSeries:
        if self.parallelism.pp != 1:
            raise ValueError("decode_series prices single-stage instances only")
        ctx = np.asarray(ctx_sums)
        seconds = np.empty(len(ctx))
        bound = np.empty(len(ctx), dtype=np.int64)
        compute = np.empty(len(ctx))
        memory = np.empty(len(ctx))
        for j, total in enumerate(ctx):
            cost = self.step(BatchShape.decode(seqs, int(total),
                                               0 if longest is None else int(longest[j])))
            seconds[j] = cost.seconds
            bound[j] = _BOUNDS.index(cost.bound)
            compute[j] = cost.compute_s
            memory[j] = cost.memory_s
        return DecodeSeries(seconds, bound, compute, memory)


def _describe(label: str, key: Any) -> str:
    if key is None:
        return "no table for this operator"
    if isinstance(key, BatchShape):
        if label == "attention_prefill":
            return f"{key.prefill_seqs} seqs, {key.prefill_tokens} new tokens"
        return f"{key.decode_seqs} seqs, {key.decode_ctx_tokens} context tokens"
    if isinstance(key, tuple) and len(key) == 2:
        tokens, shapes = key
        return f"m={tokens} " + ", ".join(f"{n:.0f}x{k:.0f}" for n, k in shapes)
    return f"{key} tokens"


def _innermost(predictor: Any) -> Any:
    """The predictor that prices operators, under wrappers such as speculative decoding."""
    while hasattr(predictor, "inner"):
        predictor = predictor.inner
    return predictor


def predictor_summary(predictors: list[Any]) -> dict[str, Any]:
    """Run-summary entries of the predictors of a run's instances."""
    predictors = [_innermost(p) for p in predictors]
    tables = [p for p in predictors if isinstance(p, TablePredictor)]
    if not tables:
        kinds: dict[str, list[str]] = {}
        for p in predictors:
            kind = "fitted" if getattr(p, "fitted", False) else "roofline"
            names = kinds.setdefault(kind, [])
            if p.device.name not in names:
                names.append(p.device.name)
        if len(kinds) <= 1:
            return {"cost_predictor": next(iter(kinds), "roofline")}
        # Pools on devices with and without fitted constants: say which priced which.
        return {"cost_predictor": ", ".join(f"{k} ({', '.join(v)})"
                                            for k, v in sorted(kinds.items()))}
    total = Provenance()
    for p in tables:
        total.merge(p.provenance)
    first = tables[0].tables
    assert first is not None
    return {
        "cost_predictor": "tables",
        "cost_tables": f"{first.system} {first.engine} {first.version} ({first.source})",
        "cost_table_share": total.table_share,
        "cost_table_s": total.table_s,
        "cost_roofline_s": total.roofline_s,
        "cost_fallback_ops": ", ".join(f"{k}: {v}" for k, v in sorted(total.fallback_ops.items())),
        "cost_fallback_shapes": "; ".join(
            f"{k}: {' | '.join(v)}" for k, v in sorted(total.fallback_shapes.items())),
    }
