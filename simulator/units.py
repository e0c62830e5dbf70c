"""Numeric precisions and unit constants shared by every layer."""

from __future__ import annotations

from typing import Literal

Precision = Literal["fp32", "bf16", "fp16", "fp8", "int8", "fp4", "int4"]

BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    # NVFP4: E2M1 values plus one FP8 (E4M3) scale per 16-element block (NVIDIA Blackwell
    # NVFP4 format, as TensorRT-LLM and ModelOpt store it): 4 + 8/16 bits per element.
    "fp4": 0.5 + 1 / 16,
    "int4": 0.5,
}

GIB = 1024**3


def bytes_per_element(precision: str) -> float:
    return BYTES_PER_ELEMENT[precision]


def compute_precision(weights: str, activations: str) -> str:
    """Precision a GEMM runs at: the wider of its two operands (W8A16 runs at 16 bit)."""
    wide = weights if BYTES_PER_ELEMENT[weights] >= BYTES_PER_ELEMENT[activations] else activations
    # Integer and float 4/8-bit weights with 16-bit activations are dequantised to 16 bit.
    return {"int4": "int8", "fp32": "fp32"}.get(wide, wide)
