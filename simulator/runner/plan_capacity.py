"""The cost model's optimistic capacity of one instance of each pool of a family: the
lower bound the planner's search starts from."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.cost.batch import BatchShape
from simulator.engine.workload import sample_lengths
from simulator.runner.build import build_plan
from simulator.runner.plan_spec import Family, PlanSpec, scenario_of


def _mean_lengths(spec: PlanSpec) -> tuple[float, float]:
    """Mean prompt and output lengths; with request classes, weighted by class rate."""
    rng = np.random.default_rng(spec.seed)
    prompts, outputs, weights = [], [], []
    for src in spec.workload.sources:
        prompt = float(sample_lengths(src.input_tokens, rng, 8192).mean())  # type: ignore[arg-type]
        output = float(sample_lengths(src.output_tokens, rng, 8192).mean())  # type: ignore[arg-type]
        if src.shared_prefix is not None:
            prompt += src.shared_prefix.tokens * src.shared_prefix.fraction
        prompts.append(prompt)
        outputs.append(output)
        weights.append(float(getattr(src.arrival, "rate_per_s", 1.0)))
    if len(prompts) == 1:
        return prompts[0], outputs[0]
    return (float(np.average(prompts, weights=weights)),
            float(np.average(outputs, weights=weights)))


def capacity(spec: PlanSpec, family: Family) -> tuple[list[float], str | None]:
    """Optimistic requests/s of one instance of each pool, or a reason the family fails."""
    from simulator.errors import MemoryFitError

    try:
        plan = build_plan(scenario_of(spec, family, (1,) * len(family.shapes)))
    except MemoryFitError as exc:
        return [], f"does not fit: {exc.message}"
    prompt, output = _mean_lengths(spec)
    caps: list[float] = []
    for role, pool in zip(family.roles, plan.pools, strict=True):
        cap = _pool_capacity(spec, role, pool, prompt, output)
        if isinstance(cap, str):
            return [], cap
        caps.append(cap)
    return caps, None


def _pool_capacity(spec: PlanSpec, role: str, pool: Any, prompt: float,
                   output: float) -> float | str:
    """Requests/s one instance of ``pool`` (a ``PoolPlan``) serves, or why it cannot."""
    sched, slo = pool.spec.scheduler, spec.slo  # the limits as the build resolved them
    cost = pool.cost_models[0]
    pipelined = pool.parallelism.pp > 1  # throughput follows the slowest stage

    def seconds(batch: BatchShape) -> float:
        step = cost.step(batch)
        return step.slowest_stage_s if pipelined else step.seconds

    tokens = max(1, round(prompt))
    one_prefill = cost.step(BatchShape.prefill(tokens)).seconds
    if role != "decode" and slo.ttft_s is not None and one_prefill > slo.ttft_s:
        return (f"{role} pool: prefill of a mean prompt ({tokens} tokens) takes "
                f"{one_prefill * 1e3:.0f} ms alone, above the TTFT SLO")
    k = max(1, int(sched.max_num_batched_tokens // tokens))
    t_prefill = seconds(BatchShape.build([(tokens, 0, True)] * k)) / k
    ctx = prompt + output / 2  # a sequence's mean context over its decode
    b_max = max(1, min(sched.max_num_seqs, int(pool.memory.kv_capacity_tokens // ctx)))

    def t_decode(b: int) -> float:
        return seconds(BatchShape.decode(b, int(b * ctx), int(ctx)))

    if slo.tpot_s is not None and role != "prefill" and t_decode(1) > slo.tpot_s:
        return (f"{role} pool: one decode step of a single sequence takes "
                f"{t_decode(1) * 1e3:.1f} ms, above the TPOT SLO")
    # Largest batch memory and the scheduler allow: no instance decodes faster than this,
    # whatever the SLO (a TPOT-limited batch would not be a bound: the SLO is on a
    # percentile, so real batches may exceed it for some steps).
    decode_s_per_request = output * t_decode(b_max) / b_max
    if role == "prefill":
        return 1.0 / t_prefill
    if role == "decode":
        return 1.0 / decode_s_per_request
    # Colocated: chunked prefill lets decodes ride in prefill steps, so the two phases'
    # times overlap; neither can go faster than alone.
    return 1.0 / max(t_prefill, decode_s_per_request)
