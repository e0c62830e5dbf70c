"""Only a GEMM's input is at the activation precision: what kernels hand each other otherwise
(GEMM and attention outputs, the residual and norms, MoE token traffic) is 16-bit, as the
kernel tables the fits come from time it (validation/kernel_fit_samples.py) — so an FP8 or
NVFP4 model's step prices those bytes as the fits were fitted on (cost/operators.py
``OperatorPricing._hb``)."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.cost import BatchShape, InstanceCostModel, Parallelism, Precisions
from simulator.hardware.registry import load_device
from simulator.models import get_model


def _ops(precision: str, shape: BatchShape, model: str = "Llama-3.1-8B",
         ) -> dict[str, list[tuple[float, float]]]:
    """(FLOPs, bytes) of every operator one step prices, by label."""
    cost = InstanceCostModel(get_model(model), load_device("H100-SXM"), Parallelism(),
                             Precisions(precision, precision, "fp8"))
    seen: dict[str, list[tuple[float, float]]] = {}
    real = cost._op

    def record(acc: Any, flops: float, nbytes: float, *args: Any, **kwargs: Any) -> None:
        label = args[2] if len(args) > 2 else kwargs.get("label", "other")
        seen.setdefault(label, []).append((flops, nbytes))
        real(acc, flops, nbytes, *args, **kwargs)

    cost._op = record  # type: ignore[method-assign]
    cost.step(shape)
    return seen


def test_an_fp8_gemm_writes_a_16_bit_output() -> None:
    m = get_model("Llama-3.1-8B")
    tokens = 96
    (_, nbytes), = _ops("fp8", BatchShape.prefill(tokens))["lm_head"]
    # A GEMM of the kernel tables: (m*k + k*n) at FP8, the m x n output at 2 bytes.
    k, n = m.hidden_size, m.vocab_size
    assert nbytes == pytest.approx((1 * k + k * n) * 1.0 + 1 * n * 2.0)  # one logits row


@pytest.mark.parametrize("label", ["attention_prefill", "attention_decode"])
def test_attention_reads_and_writes_16_bit_queries_and_outputs(label: str) -> None:
    shape = (BatchShape.prefill(512) if label == "attention_prefill"
             else BatchShape.decode(32, 32 * 700))
    # The same FP8 KV cache in both: only the activation precision differs.
    assert _ops("fp8", shape)[label] == _ops("bf16", shape)[label]


def test_elementwise_traffic_is_16_bit_but_the_quantised_gemm_inputs() -> None:
    m = get_model("Llama-3.1-8B")
    tokens = 256
    h, f = m.hidden_size, m.intermediate_size
    (_, fp8), = _ops("fp8", BatchShape.prefill(tokens))["elementwise"]
    (_, bf16), = _ops("bf16", BatchShape.prefill(tokens))["elementwise"]
    assert bf16 == pytest.approx(tokens * (8 * h + 3 * f) * 2.0)
    # The two normed hidden states and the gated activation are written at one byte.
    assert fp8 == pytest.approx(bf16 - tokens * (2 * h + f) * 1.0)


def test_moe_token_traffic_is_16_bit() -> None:
    m = get_model("Mixtral-8x7B")
    seqs = 64
    shape = BatchShape.decode(seqs, seqs * 500)
    (_, fp8), = _ops("fp8", shape, "Mixtral-8x7B")["moe"]
    (_, bf16), = _ops("bf16", shape, "Mixtral-8x7B")["moe"]
    # Only the expert weights the batch touches shrink with the precision (2 bytes -> 1).
    touched = m.num_experts * (1 - (1 - m.num_experts_per_token / m.num_experts) ** seqs)
    assert bf16 - fp8 == pytest.approx(touched * m.ffn_params(m.moe_intermediate_size))
