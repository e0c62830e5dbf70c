"""The roofline: time of one operator from its FLOPs and bytes."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.hardware.profiles import DeviceProfile


@dataclass(frozen=True, slots=True)
class OpTime:
    seconds: float
    compute_s: float
    memory_s: float
    launch_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def roofline(
    flops: float,
    nbytes: float,
    peak_flops: float,
    bandwidth: float,
    eta_compute: float,
    eta_memory: float,
    launch_s: float = 0.0,
) -> OpTime:
    """``max(flops / (peak * eta_c), bytes / (bw * eta_m)) + launch``.

    Defined for every non-negative input: zero work costs only the launch, and the time
    never decreases when FLOPs or bytes grow (efficiencies are fixed for the call).
    """
    if flops < 0 or nbytes < 0:
        raise ValueError(f"work must be non-negative, got flops={flops}, bytes={nbytes}")
    compute_s = flops / (peak_flops * eta_compute) if flops else 0.0
    memory_s = nbytes / (bandwidth * eta_memory) if nbytes else 0.0
    return OpTime(max(compute_s, memory_s) + launch_s, compute_s, memory_s, launch_s)


def op_time(device: DeviceProfile, precision: str, flops: float, nbytes: float,
            kernels: int = 1) -> OpTime:
    """Roofline time of an operator on ``device``, with the profile's efficiency curves."""
    eff = device.efficiency
    return roofline(
        flops,
        nbytes,
        device.peak_flops(precision),
        device.memory_bandwidth,
        eff.eta_compute(flops, precision),
        eff.eta_memory(nbytes),
        kernels * device.kernel_launch_us * 1e-6,
    )
