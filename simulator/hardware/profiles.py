"""Device and link profiles: the physical figures the cost model reads.

Profiles are YAML files in ``hardware_profiles/devices`` and ``hardware_profiles/links``.
Every profile carries ``source:`` so a number can be traced to a datasheet or measurement.
An SRAM-only accelerator (Groq LPU) is a device whose ``memory_kind`` is ``sram``: its
"memory" is on-chip SRAM and nothing else in the simulator treats it specially.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from simulator.hardware.operator_fits import (
    CollectiveCurve,
    DeepEPFits,
    OperatorFit,
    OperatorFits,
)
from simulator.hardware.operator_fits import Frozen as _Frozen
from simulator.units import GIB, Precision


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
    deepep: DeepEPFits | None = Field(None, description=(
        "DeepEP dispatch and combine measured inside one NVLink domain (both kernel "
        "families); with `cost.predictor: fitted` they price the NVLink leg of the MoE "
        "all-to-all instead of the scale-up link's bandwidth (simulator/cost/moe_comm.py)."))

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


class NcclTuning(_Frozen):
    """How NCCL runs collectives on this link (:mod:`simulator.cost.nccl`).

    NCCL's tuner prices ring, tree and NVLink SHARP with the LL, LL128 and Simple protocols on
    its own constants and runs the one it predicts cheapest (``NVIDIA/nccl:src/graph/
    tuning.cc``); the numbers here say what that choice then costs on this link, fitted per
    link on measured NCCL collectives (``python -m simulator.validation.nccl_fit``).
    """

    hardware: Literal["nvlink", "pcie", "network"] = Field(
        description="Which row of NCCL's per-hop latency table (`hwLat`) the link uses.")
    bus_bandwidth_gb_per_s: float = Field(
        gt=0, description="Bus bandwidth of NCCL's ring with the Simple protocol, GB/s per GPU.")
    tuner_bus_bandwidth_gb_per_s: float | None = Field(
        None, gt=0, description=(
            "The bus bandwidth NCCL's tuner assumes when it ranks the choices, GB/s per GPU: "
            "NVLink links x NCCL's per-link figure (`src/graph/topo.h`: 20.0 GB/s SM80, 20.6 "
            "SM90, 40.1 SM100). Default: `bus_bandwidth_gb_per_s`."))
    op_bus_bandwidth_gb_per_s: dict[
        Literal["allgather", "reducescatter", "alltoall"], float] = Field(
        default_factory=dict, description=(
            "The Simple bus bandwidth on the link of the collectives where it differs from "
            "the all-reduce's `bus_bandwidth_gb_per_s`, GB/s per GPU, fitted per collective."))
    ll_bandwidth_gb_per_s: float = Field(
        gt=0, description=(
            "Bus bandwidth the LL protocol reaches on the link, GB/s per GPU, fitted (NCCL's "
            "tuner assumes a quarter of the bus bandwidth for an all-reduce, capped at 87.7)."))
    ll128: bool = Field(
        True, description="Whether NCCL enables LL128 here (NVLink: yes; PCIe, network: no).")
    base_scale: float = Field(
        1.0, gt=0, description="Multiplier on NCCL's base latencies (`baseLat`), fitted.")
    hop_scale: float = Field(
        1.0, gt=0, description="Multiplier on NCCL's per-hop latencies (`hwLat`), fitted.")
    nvls: bool = Field(
        False, description=(
            "Whether the fabric has NVLink SHARP (NVSwitch multicast: HGX H100/H200/B200, "
            "NVL72); NCCL then also weighs NVLS for groups of more than 2 GPUs."))
    nvls_bandwidth_gb_per_s: float | None = Field(
        None, gt=0, description=(
            "Algorithm bandwidth of an NVLS all-reduce, GB/s (buffer bytes per second); "
            "required with `nvls`."))
    nvls_latency_us: float = Field(
        23.0, ge=0, description="Latency of one NVLS call, us (NCCL's NVLink `hwLat` 23).")
    fitted_on: str = Field(description="The measurements the fitted numbers came from.")

    @model_validator(mode="after")
    def _nvls_needs_bandwidth(self) -> NcclTuning:
        for op, value in self.op_bus_bandwidth_gb_per_s.items():
            if not value > 0:
                raise ValueError(f"op_bus_bandwidth_gb_per_s.{op} must be > 0, got {value}")
        if self.nvls and self.nvls_bandwidth_gb_per_s is None:
            raise ValueError("nvls_bandwidth_gb_per_s is required when nvls is true")
        return self


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
    nccl: NcclTuning | None = Field(
        None, description=(
            "NCCL's algorithm and protocol choice on this link; when set, all-reduce, "
            "all-gather, reduce-scatter and all-to-all use it instead of the alpha-beta "
            "fields above."))
    source: list[str] = Field(min_length=1, description="Citations for the figures above.")

    @property
    def effective_bandwidth(self) -> float:
        """Achievable bytes per second per direction (infinite for an ideal link)."""
        if self.kind == "ideal" or self.bandwidth_gb_per_s == 0:
            return float("inf")
        return self.bandwidth_gb_per_s * 1e9 * self.efficiency
