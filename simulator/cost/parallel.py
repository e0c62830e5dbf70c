"""Parallelism and precision of an instance, as plain values for the pure cost layer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Parallelism:
    """TP x PP devices; EP splits each MoE layer's experts over ``ep`` of the TP ranks."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    balanced_stages: bool = False
    """Stages get an equal, possibly fractional, share of the layers (a compiler that
    splits layers across chips, as on the LPU) instead of whole layers each (vLLM PP)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.tp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide tp ({self.tp})")

    @property
    def devices(self) -> int:
        return self.tp * self.pp

    @property
    def expert_tp(self) -> int:
        """Ranks that split one expert's FFN (the rest of TP is used for EP)."""
        return self.tp // self.ep


@dataclass(frozen=True, slots=True)
class Precisions:
    weights: str = "bf16"
    activations: str = "bf16"
    kv_cache: str = "bf16"
