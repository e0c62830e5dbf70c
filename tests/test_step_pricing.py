"""First-time step prices: the float fast paths equal the formulas they replace, bit for bit.

One step is priced on plain floats: ``scalar_quantisation`` for the tile/wave multipliers,
the scalar branches of ``decode_units`` and ``OperatorFit.parts``, attention shapes and the
all-reduce curve's log knots computed once per instance. A decode series and the kernel fit
run the same formulas on numpy arrays. :class:`Reference` is the step model as it priced
before those paths existed: its attention and all-reduce methods as they were, the generic
tile counts (``quantisation``, decode blocks through ``wave_factor``) and numpy's
``maximum`` in the fill term (:func:`reference_formulas`). Every field of every price,
one step's and a decode series', must be ``==``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost import BatchShape, InstanceCostModel, LinkSet, Parallelism, Precisions, operators
from simulator.cost.accounting import DecodeSeries, _Acc
from simulator.cost.collectives import allreduce_time
from simulator.cost.host import host_model
from simulator.cost.roofline import (
    DECODE_SPLIT_TOKENS,
    causal_quantisation,
    causal_share,
    decode_blocks,
    decode_tiles,
    decode_units,
    kv_reread_bytes,
    prefill_tiles,
    quantisation,
    scalar_quantisation,
    wave_factor,
    whole_context_quantisation,
)
from simulator.engine.step_prices import BLOCK, WINDOW
from simulator.hardware.engines import engine_names, load_engine
from simulator.hardware.operator_fits import OperatorFit, key_tile_extra
from simulator.hardware.registry import device_names, load_device, load_link
from simulator.models import get_model, model_names


def _array_decode_units(seqs: Any, ctx: Any, kv_heads: Any, split: int) -> Any:
    return kv_heads * np.maximum(seqs, np.asarray(ctx, dtype=float) / split)


def _generic_quantisation(fit: OperatorFit, shape: tuple[Any, ...] | None, sms: int | None,
                          decode: bool = False) -> Any:
    """The tile counts through the generic helpers, decode blocks through ``wave_factor``."""
    if decode and fit.tile_m and shape is not None and sms is not None:
        return wave_factor(*decode_tiles(*shape[:3], fit.tile_m), sms)
    return quantisation(fit, shape, sms, decode)


def _generic_scalar_quantisation(fit: OperatorFit, shape: tuple[Any, ...], sms: int | None,
                                 decode: bool = False) -> float:
    return float(_generic_quantisation(fit, shape, sms, decode))


_PARTS = OperatorFit.parts


def _array_parts(self: OperatorFit, peak: float, bw: float, flops: Any, nbytes: Any,
                 units: Any = 1.0, quant: Any = 1.0, kernels: float = 1.0,
                 streamed: Any = 0.0) -> tuple[Any, Any]:
    return _PARTS(self, peak, bw, flops, nbytes, np.asarray(units), quant, kernels=kernels,
                  streamed=streamed)


@contextmanager
def reference_formulas() -> Iterator[None]:
    """Tile counts through the generic helpers, the fill term through ``np.maximum``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(operators, "quantisation", _generic_quantisation)
        mp.setattr(operators, "scalar_quantisation", _generic_scalar_quantisation)
        mp.setattr(OperatorFit, "parts", _array_parts)
        yield


class Reference(InstanceCostModel):
    """The attention and all-reduce operators as priced before the float fast paths."""

    def _decode_group(self) -> tuple[Any, Any, Any]:
        """The decode kernel's (unit heads, KV bytes, rows) multipliers for this layout."""
        fit = self._fits.get("attention_decode")
        if fit is None or not fit.group_limit or self.model.attention == "mla":
            return 1.0, 1.0, 1.0
        heads = self.model.num_attention_heads / self.parallelism.tp
        return fit.decode_group(heads / self.kv_heads_per_device, self.model.head_dim)

    def _decode_units(self, seqs: Any, ctx: Any, longest: Any = None) -> tuple[Any, Any]:
        # Absorbed MLA attends over one latent head.
        heads = 1.0 if self.model.attention == "mla" else self.kv_heads_per_device
        kvh = heads * self._decode_group()[0]
        fit = self._fits.get("attention_decode")
        split = fit.tile_m if fit is not None and fit.tile_m else DECODE_SPLIT_TOKENS
        if fit is not None and fit.head_tile and self.model.attention == "mla":
            # The heads as padded row tiles; the kernel takes at least its longest block.
            blocks = fit.head_blocks(self.model.num_attention_heads / self.parallelism.tp)[0]
            most = (np.maximum(np.asarray(ctx, dtype=float) - (seqs - 1), 1.0)
                    if longest is None else longest)
            return (_array_decode_units(seqs, ctx, blocks, split),
                    whole_context_quantisation(blocks, ctx, most,
                                               fit.resident_blocks or self._sms))
        return (_array_decode_units(seqs, ctx, kvh, split),
                self._quant("attention_decode", (seqs, ctx, kvh)))

    def _decode_attention_op(self, seqs: int, ctx: Any,
                             given: int = 0) -> tuple[Any, Any, Any, Any]:
        fit = self._fits.get("attention_decode")
        whole = fit is not None and fit.head_tile > 0 and self.model.attention == "mla"
        flops, nbytes = self._decode_attention_work(seqs, ctx)
        units, quant = self._decode_units(seqs, ctx, float(given) if given and whole else None)
        if fit is None or seqs <= 1:
            return flops, nbytes, units, quant
        longest = (np.asarray(float(given)) if given and whole
                   else np.maximum(np.asarray(ctx, dtype=float) - (seqs - 1), 1.0))
        flops1, nbytes1 = self._decode_attention_work(1, longest)
        units1, quant1 = self._decode_units(1, longest, longest)
        batch = np.maximum(*fit.parts(self._peak16, self._bw, flops, nbytes, units, quant))
        alone = np.maximum(*fit.parts(self._peak16, self._bw, flops1, nbytes1, units1, quant1))
        slower = alone > batch
        return (np.where(slower, flops1, flops), np.where(slower, nbytes1, nbytes),
                np.where(slower, units1, units), np.where(slower, quant1, quant))

    def decode_series(self, seqs: int, ctx_sums: np.ndarray) -> DecodeSeries:
        """Priced through ``_decode_attention_op``, then the fit's parts of its choice."""
        if self.parallelism.dp > 1 or self.two_batch_overlap:
            return super().decode_series(seqs, ctx_sums)
        host = self.host
        assert host is not None
        base = self._step(BatchShape.decode(seqs, 0), decode_attention=False)
        padded = host.graph_batch(seqs)
        graphed = padded is not None
        host_s = host.host_s(seqs, self.model.num_layers, graphed)
        rows = max(seqs, padded or 0)
        ctx = np.asarray(ctx_sums, dtype=float)
        layers = self.model.num_layers
        flops, nbytes, units, quant = self._decode_attention_op(rows, ctx)
        dev = self.device
        eff = dev.efficiency
        fit = (self._fits.get(operators.DECODE_BATCH_FIT) if rows > 1 else None) or \
            self._fits.get("attention_decode")
        launch = dev.kernel_launch_us * 1e-6 * (self.graph_launch_factor if graphed else 1.0) * layers
        if fit is not None:
            compute, memory = fit.parts(self._peak16, self._bw, flops, nbytes, units, quant)
            fixed = fit.fixed(rows * (self._decode_row_heads(fit) * self._decode_group()[2]),
                              np.maximum(compute, memory))
            on_compute = compute >= memory
            compute = np.where(on_compute, compute + fixed, compute)
            memory = np.where(on_compute, memory, memory + fixed)
            launch = 0.0
        elif eff.compute_curve is None and eff.memory_curve is None:
            compute = flops * (1.0 / (dev.peak_flops(self._cp) * eff.eta_compute(1.0, self._cp)))
            memory = nbytes * (1.0 / (dev.memory_bandwidth * eff.memory))
        else:
            peak = dev.peak_flops(self._cp)
            compute = np.where(flops > 0, flops / (peak * eff.eta_compute(flops, self._cp)), 0.0)
            memory = np.where(nbytes > 0, nbytes / (dev.memory_bandwidth * eff.eta_memory(nbytes)), 0.0)
        is_compute = compute >= memory
        gpu = sum(base.stage_seconds) + np.maximum(compute, memory) * layers + launch
        seconds = host.step_seconds(gpu, host_s)
        comp = base.compute_s + np.where(is_compute, compute * layers, 0.0)
        mem = base.memory_s + np.where(is_compute, 0.0, memory * layers)
        over = seconds - gpu + (base.overhead_s - (base.seconds - sum(base.stage_seconds))) + launch
        bound = np.where(mem >= comp, 1, 0)
        bound = np.where(np.maximum(comp, mem) < base.communication_s, 2, bound)
        bound = np.where(np.maximum(np.maximum(comp, mem), base.communication_s) < over, 3, bound)
        return DecodeSeries(seconds, bound, comp, mem)

    def _prefill_attention_op(self, b: BatchShape) -> tuple[float, float, float, float]:
        m, t = self.model, self.parallelism.tp
        seqs, tokens, pairs = b.prefill_seqs, b.prefill_tokens, b.prefill_attn_pairs
        heads = m.num_attention_heads / t
        if m.attention == "mla":
            per_pair = 2 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        else:
            per_pair = 4 * heads * m.head_dim
        io_width = (m.q_width + m.attn_out_width) / t
        kv_token = self.kv_elements_per_token_per_layer_device() * self._kvb
        nbytes = b.prefill_kv_tokens * kv_token + tokens * io_width * self._hb
        fit = self._fits.get("attention_prefill")
        if m.attention != "mla":
            reread = kv_reread_bytes(pairs, kv_token)
            if fit is not None and fit.kv_reread_share != 1.0:
                reread *= fit.kv_reread_share
            nbytes += reread
            if fit is not None:
                scale = fit.work_scale(m.head_dim)
                per_pair, nbytes = per_pair * fit.flops_scale(m.head_dim), nbytes * scale
        longest = (min(b.prefill_max_tokens, tokens) if b.prefill_max_tokens
                   else self._longest_chunk(seqs, tokens, pairs))
        longest = max(longest, math.ceil(tokens / seqs))
        shape = prefill_tiles(seqs, float(longest), heads, float(self.kv_heads_per_device),
                              m.head_dim, fit is not None and fit.pack_gqa)
        quant = self._quant("attention_prefill", shape)
        if seqs > 1 and fit is not None and fit.tile_m:
            quant *= seqs * longest / tokens * max(1.0, tokens * (longest + 1) / 2 / pairs)
        if fit is not None and fit.causal_tail and fit.tile_m and self.device.sm_count:
            keys = longest + (b.prefill_kv_tokens - tokens) if seqs <= 1 else longest
            quant = causal_quantisation(quant, causal_share(
                self.device.sm_count, fit.tile_m, heads, longest, keys, pairs), fit.causal_tail)
        extra = (key_tile_extra(fit.key_tiles, m.head_dim, heads / self.kv_heads_per_device)
                 if fit is not None and fit.key_tiles and m.attention != "mla" else 0.0)
        batch = (per_pair * (pairs + tokens * extra), nbytes, seqs * heads, float(quant))
        if fit is None or seqs <= 1:
            return batch
        ctx = b.prefill_kv_tokens - tokens
        alone = self._prefill_attention_op(BatchShape(
            prefill_tokens=longest, prefill_seqs=1,
            prefill_attn_pairs=min(longest * (ctx + (longest + 1) / 2), pairs),
            prefill_kv_tokens=min(ctx + longest, b.prefill_kv_tokens)))
        slower = (max(fit.parts(self._peak16, self._bw, *alone))
                  > max(fit.parts(self._peak16, self._bw, *batch)))
        return alone if slower else batch

    def _decode_attention_work(self, seqs: int, ctx: np.ndarray | float,
                               rows: float | None = None) -> tuple[Any, Any]:
        """FLOPs and bytes; an MLA kernel with head tiles computes ``rows`` query rows per
        sequence padded to whole tiles (default: the heads of one decode token)."""
        m, t = self.model, self.parallelism.tp
        heads = m.num_attention_heads / t
        kv_elems = self.kv_elements_per_token_per_layer_device() * self._decode_group()[1]
        io_width = (m.q_width + m.attn_out_width) / t
        if m.attention == "mla":
            per_ctx = 2 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
            fit = self._fits.get("attention_decode")
            if fit is not None and fit.head_tile:
                per_ctx = per_ctx * fit.head_blocks(heads if rows is None else rows)[1]
            if fit is not None and fit.head_block:  # each further head block re-reads
                kv_elems = kv_elems * (1.0 + (math.ceil(heads / fit.head_block) - 1.0)
                                       * fit.head_block_reread)
        else:
            per_ctx = 4 * heads * m.head_dim
        return per_ctx * ctx, ctx * kv_elems * self._kvb + seqs * io_width * self._hb

    def _attention(self, acc: _Acc, b: BatchShape, count: float, decode: bool = True) -> None:
        heads = self.model.num_attention_heads / self.parallelism.tp
        fit = self._fits.get("attention_decode")
        if (b.prefill_tokens and self.model.attention == "mla"
                and 0 < b.prefill_max_tokens <= 16 and b.prefill_kv_tokens > b.prefill_tokens):
            # MLA verify chunks on the decode kernel: each (query, key) pair at the absorbed cost.
            rows_per_seq = heads * b.prefill_tokens / b.prefill_seqs
            per_pair, _ = self._decode_attention_work(0, 1.0, rows_per_seq)
            _, kv_bytes = self._decode_attention_work(0, float(b.prefill_kv_tokens))
            io = b.prefill_tokens * (self.model.q_width + self.model.attn_out_width) / \
                self.parallelism.tp * self._hb
            units, quant = self._decode_units(b.prefill_seqs, b.prefill_kv_tokens)
            if fit is not None and fit.head_tile:  # the chunk's rows as padded head tiles
                blocks = fit.head_blocks(rows_per_seq)[0]
                kv = b.prefill_kv_tokens
                units = _array_decode_units(b.prefill_seqs, kv, blocks, fit.tile_m)
                quant = whole_context_quantisation(
                    blocks, kv, b.prefill_max_kv or max(kv - (b.prefill_seqs - 1), 1),
                    fit.resident_blocks or self._sms)
            q = (b.prefill_tokens / b.prefill_seqs
                 if fit is not None and fit.row_unit == "query_head" else 1.0)
            rows = b.prefill_seqs * q * (self._decode_row_heads(fit) if fit else heads)
            self._op(acc, float(per_pair * b.prefill_attn_pairs), float(kv_bytes + io), 1, count,
                     "attention_decode", b, float(units), rows, float(quant))
        elif b.prefill_tokens:
            flops, nbytes, units, quant = self._prefill_attention_op(b)
            # The prompt's K and V stored into the cache (OperatorFit.kv_write_ps).
            self._op(acc, float(flops), float(nbytes), 1, count, "attention_prefill", b,
                     float(units), b.prefill_tokens * heads, float(quant),
                     written=b.prefill_tokens * self.kv_elements_per_token_per_layer_device())
        if b.decode_seqs and decode:
            flops, nbytes, units, quant = self._decode_attention_op(
                b.decode_seqs, b.decode_ctx_tokens, b.decode_max_ctx)
            # The fit of a decode-only step of several sequences, as the step model picks it
            # (which fit prices a step is not what these formulas replace).
            batched = (operators.DECODE_BATCH_FIT if b.decode_seqs > 1 and not b.prefill_tokens
                       and operators.DECODE_BATCH_FIT in self._fits else None)
            self._op(acc, float(flops), float(nbytes), 1, count, "attention_decode", b,
                     float(units), b.decode_seqs * (self._decode_row_heads(fit)
                                                    * self._decode_group()[2] if fit else heads),
                     float(quant), fit_label=batched)

    def _allreduce(self, acc: _Acc, nbytes: float, ranks: int, times: float) -> None:
        link = self.links.tp
        if link is None:
            return
        curve = self._ar_curves.get(ranks) if link.name == self.device.scale_up_link else None
        seconds = curve.seconds(nbytes / operators.RESIDUAL_BYTES) if curve is not None else None
        if seconds is None:
            seconds = allreduce_time(nbytes, ranks, link)
        acc.add_comm(seconds * times, "allreduce")


PRECISIONS = [("bf16", "bf16", "bf16"), ("bf16", "bf16", "fp8"), ("fp8", "fp8", "fp8"),
              ("fp8", "bf16", "bf16")]


def _cost(cls: type[InstanceCostModel], device: str, engine: str, fitted: bool, model: str,
          tp: int, precision: tuple[str, str, str], link: str | None, imbalance: float,
          max_seqs: int | None) -> InstanceCostModel:
    dev, eng = load_device(device), load_engine(engine)
    return cls(get_model(model), dev, Parallelism(tp=tp), Precisions(*precision),
               LinkSet(tp=load_link(link or dev.scale_up_link or "ideal") if tp > 1 else None),
               step_overhead_s=eng.step_overhead_us * 1e-6,
               per_sequence_overhead_s=eng.per_sequence_overhead_us * 1e-6,
               graph_launch_factor=eng.graph_launch_factor if eng.cuda_graphs else 1.0,
               moe_imbalance=imbalance, engine=eng.name, fitted=fitted,
               host=host_model(eng, max_seqs, dev.memory_capacity_gib, tp))


@st.composite
def batches(draw: st.DrawFn) -> BatchShape:
    """Prefill chunks (new tokens on cached ones) and decodes (their count and context sum)."""
    chunks = draw(st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 32_768),
                                     st.booleans()), max_size=4))
    seqs = draw(st.integers(0, 512))
    ctx = draw(st.integers(seqs, 4_000_000)) if seqs else 0
    b = BatchShape.build(chunks)
    b = replace(b, decode_seqs=seqs, decode_ctx_tokens=ctx, logits_seqs=b.logits_seqs + seqs)
    return replace(b, prefill_max_tokens=0) if draw(st.booleans()) else b


@pytest.mark.parametrize("engine", engine_names())
@pytest.mark.parametrize("device", device_names())
@settings(max_examples=12, deadline=None)
@given(fitted=st.booleans(), model=st.sampled_from(model_names()),
       tp=st.sampled_from([1, 2, 4, 8]), precision=st.sampled_from(PRECISIONS),
       link=st.sampled_from([None, "ib-ndr"]), imbalance=st.sampled_from([1.0, 1.37]),
       max_seqs=st.sampled_from([None, 64]), batch=batches(),
       ctx=st.lists(st.integers(0, 4_000_000), min_size=1, max_size=8))
def test_first_time_prices_equal_the_formulas_they_replace(
        device: str, engine: str, fitted: bool, model: str, tp: int,
        precision: tuple[str, str, str], link: str | None, imbalance: float,
        max_seqs: int | None, batch: BatchShape, ctx: list[int]) -> None:
    args = (device, engine, fitted, model, tp, precision, link, imbalance, max_seqs)
    new, ref = _cost(InstanceCostModel, *args), _cost(Reference, *args)
    got = new.step(batch), new.breakdown(batch)
    again = new.step(batch)  # a second time, from what the first call remembered
    n = max(batch.decode_seqs, 1)
    series = new.decode_series(n, np.asarray(ctx) + n)
    with reference_formulas():
        want = ref.step(batch), ref.breakdown(batch)
        want_series = ref.decode_series(n, np.asarray(ctx) + n)
    assert got == want
    assert again == want[0]
    for a, b in zip(series, want_series, strict=True):
        assert np.array_equal(a, b)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("engine", engine_names())
@pytest.mark.parametrize("device", device_names())
@settings(max_examples=8, deadline=None)
@given(fitted=st.booleans(), model=st.sampled_from(model_names()),
       tp=st.sampled_from([1, 2, 4, 8]), precision=st.sampled_from(PRECISIONS),
       max_seqs=st.sampled_from([None, 64]), seqs=st.integers(1, 600),
       block=st.integers(0, 8000))
def test_decode_windows_equal_the_step_formulas_bit_for_bit(
        device: str, engine: str, fitted: bool, model: str, tp: int,
        precision: tuple[str, str, str], max_seqs: int | None, seqs: int, block: int) -> None:
    """A kept window (``WINDOW`` consecutive context sums from a block edge, as the engine
    asks for them) on every shipped device and engine: the same bits as the series priced
    through one step's attention formulas, for one sequence (no longest-sequence choice)
    and for batches, padded to a captured graph size or not."""
    args = (device, engine, fitted, model, tp, precision, None, 1.0, max_seqs)
    new, ref = _cost(InstanceCostModel, *args), _cost(Reference, *args)
    ctx = block * BLOCK + np.arange(WINDOW, dtype=np.int64)
    ctx = np.maximum(ctx, seqs)  # a batch holds at least a token per sequence
    got = new.decode_series(seqs, ctx)
    with reference_formulas():
        want = ref.decode_series(seqs, ctx)
    for a, b in zip(got, want, strict=True):
        assert _same_bits(a, b)


@settings(max_examples=500, deadline=None)
@given(seqs=st.integers(-1, 600), kv_heads=st.integers(0, 16),
       tile_m=st.sampled_from([0, 64, 128, 256, 512]), sms=st.sampled_from([108, 132]),
       ctx=st.lists(st.one_of(st.integers(0, 10**8), st.floats(0, 1e8)), min_size=1,
                    max_size=16))
def test_decode_blocks_equal_decode_units_and_tile_counts(seqs: int, kv_heads: int,
                                                          tile_m: int, sms: int,
                                                          ctx: list[float]) -> None:
    """Units and multiplier of a decode series in one pass: the same bits as
    ``decode_units`` and ``quantisation`` (decode blocks through ``wave_factor``), also where
    a count may fall below 1 (no sequence or no KV head) and the floors apply."""
    x = np.asarray(ctx, dtype=float)
    units, quant = decode_blocks(seqs, x, kv_heads, tile_m, sms)
    split = tile_m or DECODE_SPLIT_TOKENS
    assert _same_bits(units, _array_decode_units(seqs, x, kv_heads, split))
    if not tile_m:
        assert quant == 1.0
        return
    fitted = OperatorFit(compute=0.7, half_flops=0, memory=0.8, half_bytes=0, floor_us=1,
                         tile_m=tile_m)
    assert _same_bits(quant, _generic_quantisation(fitted, (seqs, x, kv_heads), sms, True))


fits = st.builds(
    OperatorFit, compute=st.floats(0.05, 1.0), half_flops=st.floats(0, 1e10),
    memory=st.floats(0.05, 1.0), half_bytes=st.floats(0, 1e8),
    half_units=st.sampled_from([0.0, 11.9, 140.3]), floor_us=st.floats(0, 20),
    tile_m=st.sampled_from([16, 64, 128, 256, 512, 1024]),
    tile_n=st.sampled_from([0, 64, 128, 256]), split_k=st.booleans(),
    tile_k0=st.sampled_from([0, 128, 256, 2048]),
    tile_dispatch=st.sampled_from(["", "cutlass_sm90_fp8", "sgl_kernel_sm90_fp8",
                                   "flashinfer_cutlass_sm100_nvfp4", "cublas_fastest"]),
    moe_kernel=st.sampled_from(["", "flashinfer_cutlass_sm90"]))
sizes = st.one_of(st.integers(1, 10**7), st.floats(1e-3, 1e7))


@settings(max_examples=2000, deadline=None)
@given(fit=fits, groups=st.one_of(st.just(1.0), sizes), m=sizes, n=sizes, k=sizes,
       sms=st.sampled_from([108, 132, 142, 148, 304]))
def test_scalar_tile_counts_equal_the_generic_ones(fit: OperatorFit, groups: float, m: float,
                                                   n: float, k: float, sms: int) -> None:
    shape = (groups, m, n, k)
    assert scalar_quantisation(fit, shape, sms) == quantisation(fit, shape, sms)
    decode = (m, n, k)  # sequences, context tokens, KV heads
    got = scalar_quantisation(fit, decode, sms, decode=True)
    assert isinstance(got, float)
    assert got == quantisation(fit, decode, sms, decode=True)
    assert got == _generic_quantisation(fit, decode, sms, decode=True)
    blocks = (np.array([m, 1.0]), np.array([n, 7.0]), k)
    assert np.array_equal(quantisation(fit, blocks, sms, decode=True),
                          _generic_quantisation(fit, blocks, sms, decode=True))


def test_scalar_tile_counts_need_the_devices_sm_count() -> None:
    fit = OperatorFit(compute=0.7, half_flops=0, memory=0.8, half_bytes=0, floor_us=1,
                      tile_m=128)
    with pytest.raises(ValueError, match="sm_count"):
        scalar_quantisation(fit, (1.0, 64.0, 4096.0, 4096.0), None)


@settings(max_examples=500, deadline=None)
@given(seqs=st.integers(1, 4096), ctx=st.one_of(st.integers(0, 10**8), st.floats(0, 1e8)),
       kv_heads=st.integers(1, 128), split=st.sampled_from([128, 256, 512, 1024]))
def test_one_steps_decode_units_equal_the_array_formula(seqs: int, ctx: float, kv_heads: int,
                                                         split: int) -> None:
    want = _array_decode_units(seqs, np.array([ctx]), kv_heads, split)[0]
    assert decode_units(seqs, ctx, kv_heads, split) == want
    assert decode_units(seqs, np.array([ctx]), kv_heads, split)[0] == want


SHIPPED_FITS = [fit for name in device_names() for fits_ in (load_device(name).operators or {})
                .values() for fit in fits_.fits.values()]


@settings(max_examples=500, deadline=None)
@given(fit=st.sampled_from(SHIPPED_FITS), flops=st.floats(0, 1e15), nbytes=st.floats(0, 1e12),
       units=st.one_of(st.floats(0, 1e6), st.integers(0, 10**6)), quant=st.floats(1.0, 20.0))
def test_one_steps_fill_term_equals_the_array_formula(fit: OperatorFit, flops: float,
                                                       nbytes: float, units: float,
                                                       quant: float) -> None:
    got = fit.parts(1e15, 3e12, flops, nbytes, units, quant)
    want = fit.parts(1e15, 3e12, np.array([flops]), np.array([nbytes]), np.array([units]),
                     np.array([quant]))
    assert got == (want[0][0], want[1][0])


CURVES = [c for name in device_names() for fits_ in (load_device(name).operators or {}).values()
          for c in fits_.allreduce]


@settings(max_examples=300, deadline=None)
@given(curve=st.sampled_from(CURVES), nbytes=st.floats(0, 1e10))
def test_allreduce_curve_with_knots_kept_equals_one_without(curve: Any, nbytes: float) -> None:
    assert curve.seconds(nbytes, curve.knots()) == curve.seconds(nbytes)
