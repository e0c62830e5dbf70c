"""Device and link profiles: the physical figures the cost model reads.

Profiles are YAML files in ``hardware_profiles/devices`` and ``hardware_profiles/links``.
Every profile carries ``source:`` so a number can be traced to a datasheet or measurement.
An SRAM-only accelerator (Groq LPU) is a device whose ``memory_kind`` is ``sram``: its
"memory" is on-chip SRAM and nothing else in the simulator treats it specially.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.units import GIB, Precision


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EfficiencyCurve(_Frozen):
    """Shape-dependent efficiency ``eta(w) = eta_max * w / (w + w_half)``.

    ``w`` is the operator's work (FLOPs for compute, bytes for memory). A small GEMM
    cannot fill the machine; the curve rises smoothly to ``eta_max`` for large work.
    Two parameters per curve, fitted on kernel measurements, never on test points.
    """

    eta_max: float = Field(gt=0, le=1, description="Efficiency reached by large operators.")
    half_work: float = Field(
        ge=0, description="Work (FLOPs or bytes) at which efficiency is half of eta_max."
    )

    def at(self, work: float) -> float:
        if self.half_work == 0:
            return self.eta_max
        return self.eta_max * work / (work + self.half_work)


class Efficiency(_Frozen):
    """Fraction of the datasheet peak that real kernels reach on this device."""

    compute: float = Field(gt=0, le=1, description="Large-GEMM fraction of peak FLOP/s.")
    memory: float = Field(gt=0, le=1, description="Streaming fraction of peak memory bandwidth.")
    compute_curve: EfficiencyCurve | None = Field(
        None, description="Optional shape-dependent compute efficiency; overrides `compute`."
    )
    memory_curve: EfficiencyCurve | None = Field(
        None, description="Optional shape-dependent memory efficiency; overrides `memory`."
    )
    compute_by_precision: dict[Precision, float] | None = Field(
        None, description=(
            "Large-GEMM fraction of peak FLOP/s per precision, where it differs from `compute` "
            "(FP8/FP4 GEMMs reach a lower share of their higher peak than BF16). A listed "
            "precision replaces `compute` (and the curve's eta_max) for work at it."))
    calibrated_on: str = Field(description="The kernel-level data these factors came from.")

    @model_validator(mode="after")
    def _fractions(self) -> Efficiency:
        for precision, eta in (self.compute_by_precision or {}).items():
            if not 0 < eta <= 1:
                raise ValueError(f"compute_by_precision.{precision} must be in (0, 1], got {eta}")
        return self

    def eta_compute(self, flops: float, precision: str | None = None) -> float:
        """Compute efficiency of ``flops`` of work (``precision`` selects its peak share)."""
        by_precision = self.compute_by_precision or {}
        if precision in by_precision:
            peak_share = by_precision[precision]  # type: ignore[index]
            if self.compute_curve:
                return peak_share * self.compute_curve.at(flops) / self.compute_curve.eta_max
            return peak_share
        return self.compute_curve.at(flops) if self.compute_curve else self.compute

    def eta_memory(self, nbytes: float) -> float:
        return self.memory_curve.at(nbytes) if self.memory_curve else self.memory


OperatorClass = Literal["gemm", "gemm_fp8", "gemm_fp4", "attention_prefill", "attention_decode",
                        "attention_prefill_kv_fp8", "attention_decode_kv_fp8",
                        "moe", "moe_fp8", "elementwise"]
"""``*_kv_fp8``: attention over an FP8 KV cache, a kernel of its own (see OperatorFit)."""

HEAD_DIM_REF = 128
"""Head dimension at which :attr:`OperatorFit.head_dim_exp` scales nothing."""


class OperatorFit(_Frozen):
    """Roofline of one operator family on one device, fitted on measured kernels.

    With ``F`` FLOPs, ``B`` bytes, ``U`` parallel work units (GEMM rows; attention
    sequences x heads) and ``R`` rows of per-row work (activation elements a low-precision
    GEMM quantises; attention query rows)::

        fill = U / (U + half_units)              # too few units leave SMs idle
        t = max((F * q + F * (1 / fill - 1) + half_flops) / (peak * compute),
                (B / fill + half_bytes) / (bw * memory)) + floor + R * per_row_ps

    ``q`` is the tile/wave multiplier of the FLOPs (``tile_m``; 1 without it): waves x SMs
    over the exact tile count, computed by :func:`simulator.cost.roofline.quantisation`
    from the operator's shape and the device's ``sm_count``.

    Zero work costs nothing. With work growing with the units it spreads over (F, B
    proportional to U) the time never decreases, so the step stays monotone in its batch.
    """

    compute: float = Field(gt=0, le=1, description="Large-operator fraction of peak FLOP/s.")
    half_flops: float = Field(ge=0, description="FLOPs at which compute efficiency is half.")
    memory: float = Field(gt=0, le=1, description="Large-operator fraction of peak bandwidth.")
    half_bytes: float = Field(ge=0, description="Bytes at which memory efficiency is half.")
    half_units: float = Field(0.0, ge=0, description=(
        "Parallel work units (GEMM rows, sequences x heads) at which efficiency is half."))
    floor_us: float = Field(ge=0, description="Fixed latency of one kernel, microseconds.")
    per_row_ps: float = Field(0.0, ge=0, description=(
        "Time per row of per-row work (quantised activation element, query row), picoseconds."))
    row_unit: Literal["query_head", "kv_head"] = Field("query_head", description=(
        "Decode attention only: what one row of per-row work is, a (sequence, query head) "
        "pair, or a (sequence, KV head) pair (grouped-query decode kernels that process the "
        "query heads of one KV head together, e.g. FlashInfer's batch decode with one "
        "thread block per sequence and KV head). "
        "The fit picks the one that fits its training shapes better."))
    tile_m: int = Field(0, ge=0, description=(
        "Tile and wave quantisation (0 = off): the largest tile along the batch axis (GEMM "
        "and grouped-MoE rows, prefill query rows; decode attention: the split-KV partition "
        "in context tokens). With it the FLOPs are multiplied by waves x SMs / tiles "
        "(simulator.cost.roofline.wave_factor; needs the device's `sm_count`)."))
    tile_n: int = Field(0, ge=0, description=(
        "GEMM and grouped-MoE tile along the output columns n (0: columns are not tiled)."))
    split_k: bool = Field(False, description=(
        "GEMM and grouped MoE: a kernel of fewer tiles than SMs splits k over the idle SMs "
        "(cuBLAS split-K, CUTLASS stream-K) instead of leaving them idle."))
    tile_k0: int = Field(0, ge=0, description=(
        "GEMM and grouped MoE: fixed work of each tile (or k-slice) in units of k, its "
        "mainloop pipeline fill and epilogue: a tile of depth k costs as k + tile_k0."))
    tile_dispatch: Literal["", "cutlass_sm90_fp8", "sgl_kernel_sm90_fp8"] = Field("", description=(
        "GEMM: the tile shape follows the kernel library's dispatch by batch size "
        "(simulator.cost.roofline.TILE_DISPATCH: vLLM's and SGLang's CUTLASS FP8 scaled-MM "
        "configs for Hopper) instead of one `tile_m` x `tile_n` (which then only switch tiling on)."))
    pack_gqa: bool = Field(False, description=(
        "Prefill attention: the query heads sharing a KV head are packed into one block's "
        "rows (FlashAttention-3 PackGQA; simulator.cost.roofline.prefill_tiles)."))
    head_dim_exp: float = Field(0.0, ge=-2, le=2, description=(
        "Attention: FLOPs and bytes are scaled by (head_dim / 128) ** head_dim_exp. The "
        "kernels pick their tiles by head dimension (FlashAttention-3 hopper/tile_size.h: "
        "fewer key columns per tile as head_dim grows, for registers and shared memory), so "
        "large head dims run further from peak."))
    group_limit: int = Field(0, ge=0, description=(
        "Decode attention: the most query heads per KV head the grouped-query kernel takes "
        "(0: one kernel for every layout). Head groups above it, and plain multi-head "
        "attention (one query head per KV head), run a kernel with one thread block per "
        "(sequence, query head) that re-reads a KV head for each of its query heads "
        "(TensorRT-LLM: XQA takes groups of 2 to 32 at beam 1, masked multi-head attention "
        "the rest; decoderXQAImplJIT/kernelUtils.cpp `supportConfigCommon`, "
        "`supportConfigHMMA`). The per-row work is then counted per (sequence, KV head) for "
        "the grouped kernel and per (sequence, query head) for the other."))
    group_reread: float = Field(0.0, ge=0, le=1, description=(
        "Decode attention outside the grouped kernel (`group_limit`): the share of each "
        "further query head's KV re-read that reaches memory (the rest hits L2): KV bytes x "
        "(1 + (group - 1) x group_reread)."))
    group_row_share: float = Field(1.0, ge=0, le=1, description=(
        "Decode attention outside the grouped kernel (`group_limit`): the per-row time of "
        "one (sequence, query head) block relative to one grouped (sequence, KV head) block."))
    row_overlap: float = Field(0.0, ge=0, le=1, description=(
        "Decode attention with `group_limit`: the share of the per-row work that runs under "
        "the KV stream of other resident blocks rather than after it: the time is "
        "max(compute, memory) + floor + P - row_overlap x min(max(compute, memory), P), "
        "P the per-row work (rows x per_row_ps). TensorRT-LLM's XQA launches a block per "
        "(sequence, KV head) and split-KV slice (decoderXQAImplJIT.cpp `runImpl`), so at "
        "large batches one block's query load, softmax and output write run while others "
        "stream their keys and values."))
    group_memory: float = Field(1.0, ge=0.5, le=2.0, description=(
        "Decode attention outside the grouped kernel (`group_limit`): its KV bytes relative "
        "to the grouped kernel's at the same bandwidth share (the two kernels reach "
        "different shares of peak): KV bytes x group_memory x (1 + (group - 1) x "
        "group_reread)."))
    group_q_rows: float = Field(0.0, ge=0, le=1, description=(
        "Decode attention in the grouped kernel (`group_limit`): the per-row work of one "
        "(sequence, KV head) block grows with its query heads as 1 + (group - 1) x "
        "group_q_rows (the block's query rows, softmax and output)."))
    rows: int = Field(0, ge=0, description="Measured shapes the constants were fitted on.")

    def decode_group(self, group: Any) -> tuple[Any, Any, Any]:
        """``(unit heads, KV bytes, rows)`` multipliers of decode attention for ``group`` query
        heads per KV head on one device (``rows``: of the per-(sequence, KV head) rows):
        ``(1, 1, 1 + (group - 1) * group_q_rows)`` for the grouped-query kernel, else the
        per-query-head kernel's ``(group, group_memory * (1 + (group - 1) * group_reread),
        group * group_row_share)``."""
        if not self.group_limit:
            return 1.0, 1.0, 1.0
        if isinstance(group, np.ndarray):
            other = (group > self.group_limit) | (group <= 1.0)
            return (np.where(other, group, 1.0),
                    np.where(other, self.group_memory
                             * (1.0 + (group - 1.0) * self.group_reread), 1.0),
                    np.where(other, group * self.group_row_share,
                             1.0 + (group - 1.0) * self.group_q_rows))
        if 1.0 < group <= self.group_limit:
            return 1.0, 1.0, 1.0 + (group - 1.0) * self.group_q_rows
        g = float(group)
        return (g, self.group_memory * (1.0 + (g - 1.0) * self.group_reread),
                g * self.group_row_share)

    def work_scale(self, head_dim: Any) -> Any:
        """Multiplier of an attention operator's FLOPs and bytes for its head dimension."""
        if not self.head_dim_exp:
            return 1.0
        if isinstance(head_dim, np.ndarray):
            return (head_dim / HEAD_DIM_REF) ** self.head_dim_exp
        return float(head_dim / HEAD_DIM_REF) ** self.head_dim_exp

    def parts(self, peak_flops: float, bandwidth: float, flops: Any, nbytes: Any,
              units: Any = 1.0, quant: Any = 1.0) -> tuple[Any, Any]:
        """Compute and memory seconds (floats or numpy arrays).

        ``quant`` is the tile/wave multiplier of the FLOPs (1 without ``tile_m``); the fill
        term adds ``F * (half_units / U)``, which stays constant while F grows with U.
        """
        fewest = np.maximum(units, 1e-9) if isinstance(units, np.ndarray) else max(units, 1e-9)
        under = (units + self.half_units) / fewest if self.half_units else 1.0
        if self.tile_m:
            flops_eff = flops * quant + (flops * (under - 1.0) if self.half_units else 0.0)
        else:
            flops_eff = flops * under
        compute = (flops_eff + self.half_flops) / (peak_flops * self.compute) * (flops > 0)
        memory = (nbytes * under + self.half_bytes) / (bandwidth * self.memory) * (nbytes > 0)
        return compute, memory

    def fixed(self, rows: Any = 0.0, busy: Any = 0.0) -> Any:
        """Seconds added to the larger of compute and memory (``busy``): the floor and the
        per-row work, less the share of that work hidden under ``busy`` (``row_overlap``).
        The sum ``busy + fixed`` never decreases in ``busy`` or ``rows``."""
        per_row = rows * self.per_row_ps * 1e-12
        if not self.row_overlap:
            return self.floor_us * 1e-6 + per_row
        arrays = isinstance(busy, np.ndarray) or isinstance(per_row, np.ndarray)
        hidden = np.minimum(busy, per_row) if arrays else min(busy, per_row)
        return self.floor_us * 1e-6 + per_row - self.row_overlap * hidden

    def seconds(self, peak_flops: float, bandwidth: float, flops: Any, nbytes: Any,
                units: Any = 1.0, rows: Any = 0.0, quant: Any = 1.0) -> Any:
        compute, memory = self.parts(peak_flops, bandwidth, flops, nbytes, units, quant)
        busy = np.maximum(compute, memory)
        return busy + self.fixed(rows, busy)


class CollectiveCurve(_Frozen):
    """Measured time of the engine's all-reduce over ``ranks`` devices of one scale-up domain.

    Knots ``[bytes, microseconds]`` as the engine runs it (custom one-/two-shot kernels for
    small messages, NCCL above), interpolated in log-log; outside the knots the link's
    alpha-beta model applies.
    """

    ranks: int = Field(ge=2, description="Devices in the all-reduce group.")
    points: list[tuple[float, float]] = Field(min_length=2, description=(
        "Message bytes and measured microseconds, increasing in bytes."))

    @model_validator(mode="after")
    def _increasing(self) -> CollectiveCurve:
        sizes = [b for b, _ in self.points]
        if any(b <= 0 for b in sizes) or any(t <= 0 for _, t in self.points):
            raise ValueError("points must be positive")
        if any(b2 <= b1 for b1, b2 in itertools.pairwise(sizes)):
            raise ValueError("points must increase in bytes")
        return self

    def log_knots(self) -> tuple[np.ndarray, np.ndarray]:
        """Log bytes and log microseconds of the knots, as :meth:`seconds` interpolates them
        (a caller pricing many messages computes them once and passes them in)."""
        return np.log([b for b, _ in self.points]), np.log([t for _, t in self.points])

    def seconds(self, nbytes: float,
                knots: tuple[np.ndarray, np.ndarray] | None = None) -> float | None:
        sizes, times = knots if knots is not None else self.log_knots()
        if nbytes <= 0:
            return None
        at = math.log(nbytes)
        if not sizes[0] <= at <= sizes[-1]:
            return None
        return float(np.exp(np.interp(at, sizes, times))) * 1e-6


class OperatorFits(_Frozen):
    """Per-operator roofline constants of a device for one serving engine's kernels."""

    source: str = Field(description="Package, version and tables the fits come from.")
    fits: dict[OperatorClass, OperatorFit] = Field(description="Constants per operator family.")
    allreduce: list[CollectiveCurve] = Field(default_factory=list, description=(
        "The engine's all-reduce inside one scale-up domain, per group size."))


class Price(_Frozen):
    usd_per_hour: float = Field(ge=0, description="Price of one device for one hour, USD.")
    date: str = Field(description="When the price was quoted (YYYY-MM or YYYY-MM-DD).")
    source: str = Field(description="Where the price comes from.")


class Power(_Frozen):
    tdp_w: float = Field(gt=0, description="Thermal design power of one device, watts.")
    idle_w: float | None = Field(None, ge=0, description="Idle draw of one device, watts.")
    source: str = Field(description="Where the power figures come from.")


class DeviceProfile(_Frozen):
    """One accelerator: rates, memory, efficiency, links, power and price."""

    name: str = Field(description="Profile name used in scenarios, e.g. `H100-SXM`.")
    vendor: str = Field(description="Maker of the device.")
    memory_kind: Literal["hbm", "gddr", "sram"] = Field(
        description="What holds weights and KV: off-chip HBM/GDDR, or on-chip SRAM only."
    )
    peak_tflops: dict[Precision, float] = Field(
        description="Dense (non-sparse) peak tensor rate per precision, TFLOP/s (TOP/s for int)."
    )
    memory_capacity_gib: float = Field(
        gt=0, description=(
            "Memory per device as the runtime sees it, GiB (2**30 bytes): the total CUDA/ROCm "
            "reports, which serving engines multiply by their memory fraction. An '80 GB' "
            "H100 is 80 GiB of HBM of which the runtime sees about 79.1 GiB."))
    memory_capacity_source: str = Field(
        description="Where the capacity comes from (driver/runtime report, datasheet).")
    memory_bandwidth_gb_per_s: float = Field(gt=0, description="Peak memory bandwidth, GB/s.")
    l2_cache_mb: float | None = Field(None, ge=0, description="Last-level cache, MB.")
    sm_count: int | None = Field(None, ge=1, description=(
        "Streaming multiprocessors (AMD: compute units) the runtime reports, for the wave "
        "quantisation of fitted operators (`OperatorFit.tile_m`); cite the datasheet."))
    kernel_tables: str | None = Field(None, description=(
        "System name of this device in NVIDIA AIConfigurator's measured kernel tables "
        "(`h100_sxm`, ...), used by `cost.predictor: tables`; unset where none exist."))
    kernel_launch_us: float = Field(
        ge=0, description="Fixed cost per kernel (launch + tail), microseconds."
    )
    efficiency: Efficiency = Field(description="Achievable fractions of the peaks.")
    operators: dict[str, OperatorFits] | None = Field(None, description=(
        "Per-operator roofline constants fitted on measured kernel tables, per serving engine "
        "(`vllm`, `trtllm`, `sglang`; other engines use vLLM's). Operators without a fit use "
        "`efficiency` and `kernel_launch_us`."))

    def operator_fits(self, engine: str | None) -> dict[str, OperatorFit]:
        """The fits for ``engine`` (else vLLM's, else the first listed), or none."""
        chosen = self._engine_fits(engine)
        return {str(k): v for k, v in chosen.fits.items()} if chosen else {}

    def _engine_fits(self, engine: str | None) -> OperatorFits | None:
        if not self.operators:
            return None
        return (self.operators.get(engine or "vllm") or self.operators.get("vllm")
                or next(iter(self.operators.values())))

    def allreduce_curves(self, engine: str | None) -> dict[int, CollectiveCurve]:
        """The engine's measured all-reduce curves by group size (same choice as the fits)."""
        chosen = self._engine_fits(engine)
        return {c.ranks: c for c in chosen.allreduce} if chosen else {}
    scale_up_link: str | None = Field(
        None, description="Link profile between devices of one scale-up domain (NVLink, C2C)."
    )
    scale_up_domain: int = Field(
        1, ge=1, description="Devices in one scale-up domain (8 for HGX, 72 for NVL72)."
    )
    scale_out_link: str | None = Field(
        None, description="Link profile to devices in other domains (InfiniBand, RoCE)."
    )
    host_link: str | None = Field(None, description="Link profile to host memory (PCIe).")
    devices_per_node: int = Field(8, ge=1, description="Devices in one server/node.")
    scale_out_nics_per_node: int | None = Field(
        None, ge=1, description=(
            "Scale-out NIC ports per node, shared evenly by its devices; default one per "
            "device (DGX/HGX H100: 8 x ConnectX-7 400G, one per GPU)."))
    power: Power | None = Field(None, description="Power figures, if known.")
    price: Price | None = Field(None, description="Dated rental price, if known.")
    notes: str | None = Field(None, description="Caveats: uncertain figures, assumptions.")
    source: list[str] = Field(min_length=1, description="Citations for the figures above.")

    @model_validator(mode="before")
    @classmethod
    def _no_decimal_capacity(cls, data: object) -> object:
        if isinstance(data, dict) and "memory_capacity_gb" in data:
            raise ValueError(
                "memory_capacity_gb is no longer read: give memory_capacity_gib (binary GiB, "
                "as the runtime reports it, e.g. 79.1 for an 80 GB H100) and "
                "memory_capacity_source")
        return data

    @model_validator(mode="after")
    def _has_a_rate(self) -> DeviceProfile:
        if not self.peak_tflops:
            raise ValueError("peak_tflops must list at least one precision")
        for precision, rate in self.peak_tflops.items():
            if rate <= 0:
                raise ValueError(f"peak_tflops.{precision} must be > 0, got {rate}")
        for engine, engine_fits in (self.operators or {}).items():
            tiled = [op for op, f in engine_fits.fits.items() if f.tile_m]
            if tiled and self.sm_count is None:
                raise ValueError(f"operators.{engine}.fits.{tiled[0]} sets tile_m: the device "
                                 "needs sm_count (streaming multiprocessors) for its waves")
        nics = self.scale_out_nics_per_node
        if nics is not None and self.devices_per_node % nics:
            raise ValueError(f"scale_out_nics_per_node ({nics}) must divide devices_per_node "
                             f"({self.devices_per_node}): devices share NICs evenly")
        return self

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s at ``precision``; a missing low precision falls back to a wider one."""
        for candidate in _FALLBACK[precision]:
            if candidate in self.peak_tflops:
                return self.peak_tflops[candidate] * 1e12  # type: ignore[index]
        raise KeyError(f"device {self.name} has no rate for {precision}")

    @property
    def memory_bytes(self) -> float:
        return self.memory_capacity_gib * GIB

    @property
    def memory_bandwidth(self) -> float:
        return self.memory_bandwidth_gb_per_s * 1e9


# A device without fp8 tensor cores runs fp8 work at its 16-bit rate (after dequantising).
_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp32": ("fp32", "bf16", "fp16"),
    "bf16": ("bf16", "fp16"),
    "fp16": ("fp16", "bf16"),
    "fp8": ("fp8", "int8", "bf16", "fp16"),
    "int8": ("int8", "fp8", "bf16", "fp16"),
    "fp4": ("fp4", "fp8", "int8", "bf16", "fp16"),
    "int4": ("int4", "int8", "fp8", "bf16", "fp16"),
}


class LinkProfile(_Frozen):
    """A point-to-point or switched link: NVLink, PCIe, InfiniBand, RoCE, LPU C2C."""

    name: str = Field(description="Profile name used in scenarios, e.g. `nvlink4`.")
    kind: Literal["nvlink", "pcie", "infiniband", "roce", "ethernet", "c2c", "ideal"] = Field(
        description="Family of the link."
    )
    bandwidth_gb_per_s: float = Field(
        ge=0, description="Line rate per direction per device/port, GB/s (0 only for `ideal`)."
    )
    efficiency: float = Field(
        gt=0, le=1, description="Fraction of line rate that large transfers reach."
    )
    latency_us: float = Field(ge=0, description="One-way latency of a hop, microseconds.")
    per_transfer_overhead_us: float = Field(
        0.0, ge=0, description="Fixed set-up cost of one transfer (registration, handshake), us."
    )
    collective_base_us: float = Field(
        0.0, ge=0, description="Fixed cost of one collective call on this link, microseconds."
    )
    collective_hop_us: float = Field(
        0.0, ge=0, description="Latency per ring/tree step of a collective, microseconds."
    )
    source: list[str] = Field(min_length=1, description="Citations for the figures above.")

    @property
    def effective_bandwidth(self) -> float:
        """Achievable bytes per second per direction (infinite for an ideal link)."""
        if self.kind == "ideal" or self.bandwidth_gb_per_s == 0:
            return float("inf")
        return self.bandwidth_gb_per_s * 1e9 * self.efficiency
