"""Conditional disaggregation: prefill a request on its decode instance, or remotely.

Dynamo's disaggregated serving (ai-dynamo/dynamo v0.1: the decode worker receives the
request and asks ``DisaggregatedRouter.prefill_remote(prompt_length, prefix_hit_length,
queue_size)``, ``examples/python_rs/llm/vllm_nixl/router/disagg_router.py``) prefills
remotely only when the prompt's tokens after the decode worker's prefix hit exceed
``max_local_prefill_length`` and the prefill queue holds fewer than
``max_prefill_queue_size`` requests; SGLang's and vLLM's P/D proxies expose the same
kind of switch. The ``expected_ttft`` policy instead prices both paths with the cost
model (:mod:`simulator.cost.disagg`) and takes the faster one.

The decode instance is picked by the entry policy, as the client's request reaches a
decode worker first in Dynamo's flow, so that with the rule at "always local" a P/D
cluster behaves exactly as a colocated cluster of its decode instances, and at "always
remote" exactly as plain P/D (tests/test_conditional_disagg.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from simulator.cost.disagg import handoff_s, prefer_local, prefill_wait_s
from simulator.engine.fabric import TransferPath
from simulator.engine.kv_config import ConditionalDisaggregation
from simulator.engine.request import Request
from simulator.engine.router import Policy, RouterState

if TYPE_CHECKING:
    from simulator.engine.instance import Instance


class ConditionalRouter:
    """Decides, per request, where its prefill runs (see the module docstring)."""

    def __init__(self, rule: ConditionalDisaggregation, policy: Policy,
                 state: RouterState) -> None:
        self.rule = rule
        self.policy = policy
        self.state = state

    def place(self, req: Request, local: Sequence[Instance], entry: Sequence[Instance],
              queue: int, path: Callable[[Instance, Instance], TransferPath]
              ) -> Instance | None:
        """The instance to prefill ``req`` on, or None to leave it to the entry policy.

        ``local`` are the decode instances that could serve it, ``entry`` the prefill
        instances, ``queue`` the requests waiting for a prefill instance.
        """
        rule = self.rule
        if rule.policy == "threshold":
            hit = max(d.prefix_match_tokens(req) for d in local)
            remote = (req.prefill_target - hit > rule.max_local_prefill_length
                      and (rule.max_prefill_queue_size is None
                           or queue < rule.max_prefill_queue_size))
            if remote and entry:
                return None
            return self.policy(local, req, self.state, "local")  # type: ignore[return-value]
        dst: Instance = self.policy(local, req, self.state, "local")  # type: ignore[assignment]
        if not entry:
            return dst
        tokens = req.prefill_target
        local_s = prefill_wait_s(dst.cost, dst.queued_tokens, tokens,
                                 dst.prefix_match_tokens(req))
        best_s, best = float("inf"), entry[0]
        for src in entry:
            route = path(src, dst)
            streams = [([r.bandwidth for r in res], bpt * tokens) for res, bpt in route.streams]
            remote_s = prefill_wait_s(src.cost, src.queued_tokens, tokens,
                                      src.prefix_match_tokens(req))
            total = remote_s + handoff_s(streams, route.fixed_s)
            if total < best_s:
                best_s, best = total, src
        return dst if prefer_local(local_s, best_s) else best
