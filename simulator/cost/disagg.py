"""Expected time to first token of a prompt on either path of a P/D cluster.

The conditional-disaggregation policy (``router.conditional.policy: expected_ttft``)
compares, per request, the prefill it would get on the decode instance itself (local)
with a remote prefill followed by the KV hand-off. Both are estimates from the same
cost model the instances step with: the prompt's own prefill behind the prefill work
already queued there, plus, for the remote path, the hand-off's bytes over its slowest
hop. Decode steps that a local prefill shares the instance with are not counted (they
slow it by one decode step per chunk at most).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.cost.batch import BatchShape
from simulator.cost.step import InstanceCostModel


def prefill_wait_s(cost: InstanceCostModel, queued_tokens: int, prompt_tokens: int,
                   cached_tokens: int) -> float:
    """Seconds until a prompt queued behind ``queued_tokens`` of prefill has run."""
    own = cost.step(BatchShape.prefill(prompt_tokens, cached_tokens)).seconds
    ahead = cost.step(BatchShape.prefill(queued_tokens)).seconds if queued_tokens else 0.0
    return ahead + own


def handoff_s(streams: Sequence[tuple[Sequence[float], float]], fixed_s: float) -> float:
    """A hand-off alone on the fabric: each stream's bytes over its slowest resource."""
    worst = 0.0
    for bandwidths, nbytes in streams:
        finite = [b for b in bandwidths if b < float("inf")]
        if finite and nbytes > 0:
            worst = max(worst, nbytes / min(finite))
    return fixed_s + worst


def prefer_local(local_s: float, remote_s: float) -> bool:
    """Prefill locally when that is expected no later than remote prefill + hand-off."""
    return local_s <= remote_s
