"""The attention fits and the tables predictor read the kernels an engine runs by default on
a system (runner/kernel_tables.py ``DEFAULT_ATTENTION_KERNELS``), not the fastest of every
backend the tables also time (SGLang's Triton kernels, vLLM's FA4 and Triton ones)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simulator.runner.kernel_tables import default_attention, read_tables
from simulator.validation.kernel_fit_samples import attention_samples


def _rows(source: str, latency_ms: float, batch: int) -> list[dict[str, object]]:
    return [{"framework": "SGLang", "version": "0.5.14", "device": "x", "op_name": "attn",
             "kernel_source": source, "batch_size": batch, "isl": isl, "num_heads": 32,
             "num_key_value_heads": 8, "head_dim": 128, "window_size": 0, "beam_width": 1,
             "attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "step": 0,
             "latency": latency_ms * isl / 1024} for isl in (256, 512, 1024, 2048, 4096)]


def _tables(root: Path, system: str, engine: str = "sglang") -> Path:
    folder = root / system / "attention" / engine / "0.5.14"
    folder.mkdir(parents=True)
    # The default kernel (FA3 on Hopper) and a faster Triton kernel on the same shapes, and
    # Triton alone on shapes the default kernel was not timed on (batch 64).
    frame = pd.DataFrame(_rows("fa3", 0.2, 8) + _rows("triton", 0.1, 8)
                         + _rows("triton", 0.3, 64))
    for name in ("context_attention_perf.parquet", "generation_attention_perf.parquet"):
        frame.to_parquet(folder / name)
    return folder


def test_the_filter_keeps_the_default_kernel_of_a_listed_system() -> None:
    frame = pd.DataFrame(_rows("fa3", 0.2, 8) + _rows("triton", 0.1, 8))
    assert set(default_attention(frame, "sglang", "h100_sxm")["kernel_source"]) == {"fa3"}
    assert set(default_attention(frame, "sglang", "b200_sxm")["kernel_source"]) == set()
    # A system or engine without an entry keeps every row.
    assert len(default_attention(frame, "sglang", "a100_sxm")) == len(frame)
    assert len(default_attention(frame, "someengine", "h100_sxm")) == len(frame)


def test_fit_samples_are_the_default_kernels_timings(tmp_path: Path) -> None:
    folder = _tables(tmp_path, "h100_sxm")
    decode = next(s for s in attention_samples(folder) if s.op == "attention_decode")
    # Five shapes at batch 8 timed on FA3 (0.2 ms per 1,024 tokens), not Triton's 0.1 ms;
    # the Triton-only shapes are not the engine's.
    assert len(decode.seconds) == 5
    assert decode.seconds.max() == pytest.approx(0.2e-3 * 4096 / 1024)
    other = next(s for s in attention_samples(_tables(tmp_path, "a100_sxm"))
                 if s.op == "attention_decode")
    assert len(other.seconds) == 10  # no default named: the fastest of each shape, as before


def test_the_tables_predictor_reads_the_default_kernels(tmp_path: Path) -> None:
    _tables(tmp_path, "h100_sxm")
    tables = read_tables(tmp_path, "h100_sxm", "sglang")
    assert tables.generation_attention_s((32, 8, 128, "bf16"), 8, 1024) == pytest.approx(0.2e-3)
    assert tables.context_attention_s((32, 8, 128, "bf16"), 8, 1024) == pytest.approx(0.2e-3)


def test_prefill_rows_on_the_decode_kernel_can_be_left_out(tmp_path: Path) -> None:
    """vLLM's FlashInfer backend runs a 1-token prompt down its decode path, and its B200 and
    L40S prefill tables time those rows on the decode kernel (kernel_fit_samples.
    DECODE_PATH_KERNELS): a prefill family may be fitted without them."""
    folder = tmp_path / "b200_sxm" / "attention" / "vllm" / "0.24.0"
    folder.mkdir(parents=True)
    prefill = [dict(row, framework="vLLM", kernel_source="vllm_flashinfer_trtllmprefill")
               for row in _rows("x", 0.2, 8)]
    one_token = dict(prefill[0], isl=1, kernel_source="vllm_flashinfer_trtllmdecode",
                     latency=0.01)
    decode = [dict(row, kernel_source="vllm_flashinfer_trtllmdecode") for row in prefill]
    pd.DataFrame([*prefill, one_token]).to_parquet(folder / "context_attention_perf.parquet")
    pd.DataFrame(decode).to_parquet(folder / "generation_attention_perf.parquet")

    def family(op: str, decode_path: bool) -> int:
        return len(next(s for s in attention_samples(folder, decode_path=decode_path)
                        if s.op == op).seconds)
    assert family("attention_prefill", True) == 6  # as the tables hold them
    assert family("attention_prefill", False) == 5  # the prefill kernel's rows only
    # Decode families keep every row of the decode kernel.
    assert family("attention_decode", False) == family("attention_decode", True) == 5
