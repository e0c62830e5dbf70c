"""Measured kernel tables: latency on a grid of operator shapes, interpolated in log-log.

Pure numpy. The tables themselves are read elsewhere (``simulator.runner.kernel_tables``
reads NVIDIA AIConfigurator's parquet files when the ``kernels`` extra is installed); this
module only holds them and answers "how long does this shape take", or ``None`` when the
shape lies outside what was measured, so the caller can fall back to the roofline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GridTable:
    """Seconds measured on the grid ``axes[0] x axes[1] x ...`` (NaN where not measured).

    ``lookup`` interpolates ``log(seconds)`` multilinearly in ``log(shape)``: GEMM and
    attention latencies are close to power laws between grid points, so this is exact on
    the grid and follows both the flat (launch-bound) and the linear (throughput-bound)
    parts. A point outside the measured range, or whose surrounding cell has an
    unmeasured corner, returns ``None``: tables never extrapolate.
    """

    axes: tuple[np.ndarray, ...]
    seconds: np.ndarray
    _log_axes: tuple[np.ndarray, ...] = field(init=False, repr=False, compare=False)
    _log_values: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.seconds.ndim != len(self.axes):
            raise ValueError(f"{self.seconds.ndim}-d values for {len(self.axes)} axes")
        for i, axis in enumerate(self.axes):
            if axis.ndim != 1 or len(axis) != self.seconds.shape[i]:
                raise ValueError(f"axis {i} has {len(axis)} points, values {self.seconds.shape}")
            if len(axis) and (axis[0] <= 0 or np.any(np.diff(axis) <= 0)):
                raise ValueError(f"axis {i} must be positive and strictly increasing")
        object.__setattr__(self, "_log_axes", tuple(np.log(a) for a in self.axes))
        with np.errstate(divide="ignore", invalid="ignore"):
            object.__setattr__(self, "_log_values", np.log(self.seconds))

    @classmethod
    def from_points(cls, points: Sequence[Sequence[float]] | np.ndarray,
                    seconds: Sequence[float] | np.ndarray) -> GridTable:
        """Build from scattered ``(shape..., seconds)`` measurements on a (partial) grid.

        Repeated shapes keep their median.
        """
        pts = np.asarray(points, dtype=float)
        secs = np.asarray(seconds, dtype=float)
        if pts.ndim != 2 or len(pts) != len(secs) or len(pts) == 0:
            raise ValueError("points must be a non-empty (n, d) array matching seconds")
        axes = tuple(np.unique(pts[:, d]) for d in range(pts.shape[1]))
        index = tuple(np.searchsorted(axes[d], pts[:, d]) for d in range(pts.shape[1]))
        grid = np.full(tuple(len(a) for a in axes), np.nan)
        groups: dict[tuple[int, ...], list[float]] = {}
        for key, value in zip(zip(*index, strict=True), secs, strict=True):
            groups.setdefault(tuple(int(k) for k in key), []).append(float(value))
        for key, values in groups.items():
            grid[key] = float(np.median(values))
        return cls(axes, grid)

    def lookup(self, point: Sequence[float]) -> float | None:
        if len(point) != len(self.axes):
            raise ValueError(f"{len(point)}-d point for a {len(self.axes)}-d table")
        lower: list[int] = []
        weight: list[float] = []
        for axis, log_axis, x in zip(self.axes, self._log_axes, point, strict=True):
            if not x > 0 or x < axis[0] or x > axis[-1]:
                return None
            i = int(np.searchsorted(axis, x, side="right")) - 1
            if i >= len(axis) - 1:  # exactly the last grid point
                lower.append(len(axis) - 1)
                weight.append(0.0)
                continue
            lower.append(i)
            weight.append((math.log(x) - log_axis[i]) / (log_axis[i + 1] - log_axis[i]))
        total = 0.0
        for corner in range(1 << len(lower)):
            w = 1.0
            idx = []
            for d, (i, f) in enumerate(zip(lower, weight, strict=True)):
                upper = (corner >> d) & 1
                if upper:
                    if f == 0.0:
                        w = 0.0
                        break
                    w *= f
                    idx.append(i + 1)
                else:
                    w *= 1.0 - f
                    idx.append(i)
            if w == 0.0:
                continue
            value = float(self._log_values[tuple(idx)])
            if not math.isfinite(value):
                return None
            total += w * value
        return math.exp(total)


@dataclass(frozen=True)
class KernelTables:
    """One system's measured kernels for one serving engine and version.

    Keys name what fixes a kernel; the grid holds what varies with the batch:

    * ``gemm[dtype]``: ``(m, n, k)``, dtype ``bf16``/``fp8``/``fp4``;
    * ``context_attention[(heads, kv_heads, head_dim, kv_dtype)]``: ``(batch, isl)``, causal
      prefill of ``isl`` new tokens per sequence;
    * ``generation_attention[(heads, kv_heads, head_dim, kv_dtype)]``: ``(batch, kv_len)``;
    * ``allreduce[num_gpus]``: ``(message_bytes,)``, the engine's all-reduce (custom one-/
      two-shot kernels for small messages, NCCL above) as its collector measured it;
    * ``moe[(dtype, hidden, inter, topk, experts, moe_tp, moe_ep)]``: ``(tokens,)``.
    """

    system: str
    engine: str
    version: str
    source: str
    gemm: Mapping[str, GridTable] = field(default_factory=dict)
    context_attention: Mapping[tuple[int, int, int, str], GridTable] = field(default_factory=dict)
    generation_attention: Mapping[tuple[int, int, int, str], GridTable] = field(
        default_factory=dict)
    allreduce: Mapping[int, GridTable] = field(default_factory=dict)
    moe: Mapping[tuple[str, int, int, int, int, int, int], GridTable] = field(default_factory=dict)

    def gemm_s(self, m: float, n: float, k: float, dtype: str) -> float | None:
        table = self.gemm.get(dtype)
        return table.lookup((m, n, k)) if table else None

    def context_attention_s(self, key: tuple[int, int, int, str], batch: float,
                            isl: float) -> float | None:
        table = self.context_attention.get(key)
        return table.lookup((batch, isl)) if table else None

    def generation_attention_s(self, key: tuple[int, int, int, str], batch: float,
                               kv_len: float) -> float | None:
        table = self.generation_attention.get(key)
        return table.lookup((batch, kv_len)) if table else None

    def allreduce_s(self, elements: float, ranks: int) -> float | None:
        """The engine's all-reduce of ``elements`` 16-bit elements over ``ranks`` GPUs (the
        collector's ``message_size`` counts elements)."""
        table = self.allreduce.get(ranks)
        return table.lookup((elements,)) if table else None

    def moe_s(self, key: tuple[str, int, int, int, int, int, int], tokens: float) -> float | None:
        table = self.moe.get(key)
        return table.lookup((tokens,)) if table else None
