"""Parallelism and precision of an instance, as plain values for the pure cost layer."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.models.arch import ModelConfig


@dataclass(frozen=True, slots=True)
class Parallelism:
    """TP x PP devices; EP splits each MoE layer's experts over ``ep`` of the TP ranks.

    With ``dp > 1`` the instance runs data-parallel attention (SGLang
    ``--enable-dp-attention``, vLLM ``--data-parallel-size`` with ``--enable-expert-parallel``):
    ``dp`` attention ranks of ``tp`` devices each hold their own requests and KV, and the
    MoE layers span all ``dp x tp`` devices with expert parallelism (``ep = dp x tp``).
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    balanced_stages: bool = False
    """Stages get an equal, possibly fractional, share of the layers (a compiler that
    splits layers across chips, as on the LPU) instead of whole layers each (vLLM PP)."""
    dp: int = 1
    """Data-parallel attention ranks inside the instance (1 = TP attention)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.dp > 1:
            if self.pp > 1:
                raise ValueError("data-parallel attention is modelled with pp = 1 only")
            if self.ep != self.dp * self.tp:
                raise ValueError(f"data-parallel attention needs ep = dp x tp "
                                 f"({self.dp} x {self.tp} = {self.dp * self.tp}), got ep={self.ep}")
        elif self.tp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide tp ({self.tp})")

    @property
    def attention(self) -> str:
        """``"dp"`` (data-parallel attention) or ``"tp"``."""
        return "dp" if self.dp > 1 else "tp"

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def expert_tp(self) -> int:
        """Ranks that split one expert's FFN (the rest of the group is used for EP)."""
        return self.tp * self.dp // self.ep


@dataclass(frozen=True, slots=True)
class Precisions:
    weights: str = "bf16"
    activations: str = "bf16"
    kv_cache: str = "bf16"


def split_layers(layers: int, pp: int, balanced: bool = False) -> list[float]:
    """Layers per stage: whole layers (earlier stages take the remainder), or equal shares."""
    if balanced:
        return [layers / pp] * pp
    base, extra = divmod(layers, pp)
    return [float(base + (1 if i < extra else 0)) for i in range(pp)]


def stage_moe_layers(model: ModelConfig, stage_layers: list[float]) -> list[float]:
    out, start = [], 0.0
    for n in stage_layers:
        end = start + n
        dense = max(0.0, min(end, model.first_dense_layers) - start) if model.is_moe else n
        out.append(n - dense)
        start = end
    return out
