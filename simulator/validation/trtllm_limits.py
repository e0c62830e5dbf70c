"""The scheduler limits ``trtllm-bench throughput`` picks for a dataset, recomputed.

``trtllm-bench`` sizes ``max_batch_size`` and ``max_num_tokens`` from the GPU memory, the
checkpoint's parameter count and the dataset's ISL/OSL
(NVIDIA/TensorRT-LLM ``tensorrt_llm/bench/build/tuning.py@a7e572f``, ``calc_engine_setting``
and ``finetune_setting``; the memory is NVML's total in GiB, ``bench/build/utils.py``
``get_device_memory``). The TensorRT-LLM serving rows in ``scenarios/validation/`` carry the
values this module gives; tests/test_serving_trtllm_limits.py holds them to it.

The arithmetic, for a group of ``tp * pp`` GPUs:

- weights (GiB) = checkpoint element count x bytes per element of the quantisation
  (1 for FP8, 0.5 for NVFP4, 2 otherwise), with the element count as the Hugging Face
  safetensors metadata gives it (:func:`checkpoint_elements`);
- KV (GiB per token) = 2 x layers x max(tp, KV heads) x head size x KV bytes per element;
- requests = 0.95 x (tp x pp x device GiB - weights) / (KV per token x (ISL + OSL));
- per pipeline stage b = min(requests, 4096) / pp, and t = min(b x (1 + ISL / OSL), 32768);
- max_num_seqs = b rounded up to 32 (at least 64) below 256, to 128 below 1024, else to 256;
- max_num_batched_tokens = t rounded up to 256 (at least 2048) below 4096, to 512 below
  8192, else to 1024.

``python -m simulator.validation.trtllm_limits`` prints the limits of every row of the
shipped TensorRT-LLM throughput files next to the values they carry.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simulator._paths import data_dir
from simulator.models.arch import ModelConfig
from simulator.models.catalog import get_model

GIB = 1024 ** 3
KV_FRACTION = 0.95
"""``calc_engine_setting``'s default ``kv_cache_gpu_mem_fraction``, which trtllm-bench
uses for the estimate whatever fraction the runtime is later given."""

BYTES = {"fp8": 1.0, "fp4": 0.5}
"""Bytes per element by quantisation, as ``tuning.py`` counts them (anything else: 2)."""

DEVICE_MIB = {
    "H100-SXM": 81_559,     # nvidia-smi, H100 80GB HBM3
    "H200-SXM": 143_771,    # nvidia-smi, H200
    "B200": 183_359,        # nvidia-smi, B200 (hardware_profiles/devices/B200.yaml)
    "GB200-NVL72": 189_471,  # nvidia-smi, GB200 (hardware_profiles/devices/GB200-NVL72.yaml)
}
"""Total memory NVML reports per GPU (MiB), what ``get_device_memory`` reads."""

FILES = ("serving_trtllm_llama8b.csv", "serving_trtllm_dense.csv", "serving_trtllm_fp4.csv",
         "serving_trtllm_dense_devguide.csv", "serving_trtllm_moe.csv")
"""The shipped trtllm-bench files. With ``attention_dp`` a row's limits are per attention rank:
``trtllm-bench --tp N`` sizes them for the N GPUs as for TP N, and every rank's executor takes
them (see :func:`simulator.validation.serving.row_scenario`)."""


def checkpoint_elements(model: ModelConfig, weights: str) -> int:
    """Elements of the checkpoint as the safetensors metadata counts them.

    FP8 (and 16-bit) checkpoints store one element per parameter (the per-tensor FP8
    scales are a few scalars per layer, left out). A ModelOpt NVFP4 checkpoint quantises
    the Linear layers of the transformer blocks only: it stores their weights two per
    ``uint8`` element plus one FP8 scale per block of 16 weights; the embedding, LM head and
    norms stay 16-bit, one element each.
    """
    total = model.params_total()
    if weights != "fp4":
        return total
    kept = model.embedding_params() + model.num_layers * model.norm_params_per_layer()
    linear = total - kept
    return linear // 2 + linear // 16 + kept


def _round_seqs(b: float) -> int:
    if b < 256:
        return max(64, 32 * math.ceil(b / 32))
    if b < 1024:
        return 128 * math.ceil(b / 128)
    return 256 * math.ceil(b / 256)


def _round_tokens(t: float) -> int:
    if t < 4096:
        return max(2048, 256 * math.ceil(t / 256))
    if t < 8192:
        return 512 * math.ceil(t / 512)
    return 1024 * math.ceil(t / 1024)


def kv_cache_requests(model: ModelConfig, weights: str, kv: str, device_mib: float, tp: int,
                      pp: int, isl: int, osl: int) -> float:
    """Requests of ISL + OSL tokens the heuristic expects the KV cache to hold."""
    gib_weights = checkpoint_elements(model, weights) * BYTES.get(weights, 2.0) / GIB
    gib_total = device_mib * 1024 ** 2 / GIB * tp * pp
    gib_token = (2 * model.num_layers * max(tp, model.num_kv_heads) * model.head_dim
                 * BYTES.get(kv, 2.0) / GIB)
    if gib_total <= gib_weights:
        raise ValueError(f"{model.name} {weights} needs {gib_weights:.1f} GiB, "
                         f"{tp * pp} GPUs hold {gib_total:.1f}")
    return KV_FRACTION * (gib_total - gib_weights) / (gib_token * (isl + osl))


def limits(model: ModelConfig, weights: str, kv: str, device_mib: float, tp: int, pp: int,
           isl: int, osl: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) as ``trtllm-bench`` sets them."""
    requests = kv_cache_requests(model, weights, kv, device_mib, tp, pp, isl, osl)
    b = min(requests, 4096) / pp
    t = min(b * (1 + isl / osl), 32768)
    return _round_seqs(b), _round_tokens(t)


def row_limits(row: Mapping[Any, Any]) -> tuple[int, int]:
    """The limits for one canonical serving row (:func:`serving_io.read_serving`)."""
    pp = row.get("pp")
    return limits(get_model(str(row["model"])), str(row["precision"]),
                  str(row["kv_precision"]), DEVICE_MIB[str(row["device"])], int(row["tp"]),
                  1 if pp is None or math.isnan(pp) else int(pp), int(row["input_len"]),
                  int(row["output_len"]))


def main(argv: list[str] | None = None) -> None:
    from simulator.validation.serving_io import read_serving

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    folder = data_dir("scenarios") / "validation"
    paths = args.files or [folder / f for f in FILES if (folder / f).exists()]
    for path in paths:
        for row in read_serving(path).to_dict("records"):
            seqs, tokens = row_limits(row)
            flag = "" if (seqs, tokens) == (row.get("max_num_seqs"),
                                            row.get("max_num_batched_tokens")) else "  DIFFERS"
            print(f"{path.name}:{row['line']} {row['model']} {row['device']} tp{row['tp']} "
                  f"{row['precision']} {row['input_len']}/{row['output_len']}: "
                  f"{seqs} seqs, {tokens} tokens (row: {row.get('max_num_seqs')}, "
                  f"{row.get('max_num_batched_tokens')}){flag}")


if __name__ == "__main__":
    main()
