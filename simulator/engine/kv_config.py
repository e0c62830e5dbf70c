"""Scenario settings of the KV hierarchy and of where prefills run (docs/kv_tiers.md):
KV tiers below HBM, the KV-aware router, conditional disaggregation."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Spec(BaseModel):
    """Base of every engine-section setting (this module, config.py, workload_spec.py)."""

    # No field means "unbounded" by infinity; NaN compares false with every bound.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


TierKind = Literal["dram", "ssd", "remote"]


class KvTierSpec(Spec):
    """One KV tier below HBM (see docs/kv_tiers.md for the figures and their sources)."""

    kind: TierKind = Field(description=(
        "`dram`: pinned host memory of the instance's node, reached over each GPU's host "
        "link (PCIe); `ssd`: local NVMe of the node; `remote`: a pool shared by the whole "
        "cluster (Mooncake Store / LMCache server), reached over each GPU's scale-out NIC."))
    capacity_gib: float = Field(gt=0, description=(
        "KV this tier holds, GiB: per instance for `dram` and `ssd`, for the whole cluster "
        "for `remote` (every pool that lists a `remote` tier shares the same pool)."))
    read_gb_per_s: float | None = Field(None, gt=0, description=(
        "Rate this tier serves loads at, GB/s, for one instance (`remote`: for the whole "
        "pool). Empty: `dram` and `remote` are limited only by the GPUs' host links / "
        "NICs on the fabric; `ssd` reads 6.9 GB/s (one PCIe Gen4 U.2 drive, Kioxia CM6-R "
        "datasheet sequential read; DGX H100 carries 8 such data drives)."))
    write_gb_per_s: float | None = Field(None, gt=0, description=(
        "Rate this tier absorbs offloads at, GB/s; empty as for reads (`ssd`: 4.2 GB/s, "
        "the same datasheet's sequential write)."))
    latency_us: float | None = Field(None, ge=0, description=(
        "Fixed time of one load before its bytes flow, microseconds. Empty: 10 (`dram`, "
        "a cudaMemcpyAsync launch and completion), 100 (`ssd`, NVMe read latency class "
        "of the datasheet), 20 (`remote`, an RDMA read round trip plus the pool's "
        "metadata lookup); the last two are assumptions, not measurements."))


class KvRouterSpec(Spec):
    """Settings of the `kv_aware` policy (Dynamo's KV router, llm-d's prefix scorers)."""

    kv_overlap_score_weight: float = Field(1.0, ge=0, description=(
        "Weight of the prompt's uncached tokens against the instance's load (Dynamo "
        "`--kv-overlap-score-weight`, default 1): 0 routes on load alone."))
    temperature: float = Field(0.0, ge=0, description=(
        "0: the cheapest instance; > 0: sample with softmax(-cost / temperature) of the "
        "normalised costs (Dynamo `--router-temperature`)."))
    knowledge: Literal["exact", "approximate"] = Field("exact", description=(
        "`exact`: the router sees each instance's prefix cache (KV events); "
        "`approximate`: it guesses from the prompts it routed (Dynamo `--no-kv-events`, "
        "llm-d's approximate prefix-cache scorer)."))
    approximate_ttl_s: float = Field(120.0, gt=0, description=(
        "Approximate knowledge: how long a routed prompt's blocks count as cached there "
        "(Dynamo's default 120 s)."))
    hash_sample: int = Field(1, ge=1, description=(
        "Approximate knowledge: record only every k-th hash block of a prompt."))
    staleness_s: float = Field(0.0, ge=0, description=(
        "Age the load view may reach before it is refreshed (a metrics scrape interval); "
        "0 = always current."))


class ConditionalDisaggregation(Spec):
    """Per-request choice between prefilling on the decode instance and remotely.

    As Dynamo's disaggregated router decides it (ai-dynamo/dynamo v0.1,
    ``examples/python_rs/llm/vllm_nixl/router/disagg_router.py`` and the Rust
    ``DisaggregatedRouter::prefill_remote``): remote only when the prompt's tokens after
    its prefix hit exceed ``max_local_prefill_length`` and the prefill queue is shorter
    than ``max_prefill_queue_size``; otherwise the decode instance prefills it itself.
    """

    policy: Literal["threshold", "expected_ttft"] = Field("threshold", description=(
        "`threshold`: Dynamo's rule on the two limits below; `expected_ttft`: prefill "
        "where the expected time to the first token is lower (queued prefill work + the "
        "prompt's prefill, plus the hand-off for the remote path, priced by the cost "
        "model)."))
    max_local_prefill_length: int = Field(1000, ge=0, description=(
        "Prompt tokens left after the decode side's prefix hit up to which the decode "
        "instance prefills locally (Dynamo's `max_local_prefill_length`, default 1000). "
        "0 = always remote (the prefill queue permitting)."))
    max_prefill_queue_size: int | None = Field(None, ge=0, description=(
        "Requests waiting for a prefill instance at and above which a prompt is "
        "prefilled locally whatever its length (Dynamo's `max_prefill_queue_size`); empty "
        "= no limit."))
