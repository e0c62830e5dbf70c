"""vLLM V1's running pass, its leading decodes booked at once when the KV they lack fits
(``VllmV1._decode_prefix``), must decide exactly what the pass request by request
decides: same decodes, chunks, preemptions, admissions and KV booked."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.request import Request, State
from simulator.engine.scheduler import EngineLimits, PlainLedger, SchedulerView
from simulator.engine.scheduler.vllm_v1 import VllmV1

BS = 16


def _build(spec: dict[str, Any]) -> tuple[list[Request], list[Request], PlainLedger]:
    """Fresh requests and ledger from ``spec`` (called twice: one copy per pass)."""
    ledger = PlainLedger(free=spec["free"], block_size=BS)
    running = []
    for i, (prompt, generated, spare, prefilling, in_flight) in enumerate(spec["running"]):
        r = Request(i, float(i), prompt, 1000)
        r.priority = i % 3
        r.move_to(State.PREFILL)
        if prefilling:
            r.prefilled = prompt // 2
            ledger.blocks[i] = ledger.blocks_for(r.prefilled)
        else:
            r.move_to(State.DECODE)
            r.prefilled = prompt
            r.generated = generated
            ledger.blocks[i] = max(0, ledger.blocks_for(r.context_tokens) - 1 + spare)
        r.in_flight = in_flight
        running.append(r)
    queue = [Request(100 + i, 100.0 + i, p, 50) for i, p in enumerate(spec["prompts"])]
    return running, queue, ledger


def _schedule(spec: dict[str, Any], one_by_one: bool) -> tuple[Any, ...]:
    running, queue, ledger = _build(spec)
    policy = VllmV1(chunked=spec["chunked"])
    if one_by_one:
        policy._decode_prefix = lambda *args: 0  # type: ignore[method-assign]
    cap = max(spec["seqs"], len(running))
    limits = EngineLimits(max_num_seqs=cap, max_num_batched_tokens=spec["tokens"],
                          max_running=cap, lookahead=spec["lookahead"])
    priority = (lambda r: float(r.priority)) if spec["priority"] else None
    out = policy.schedule(SchedulerView(queue, running, 0, ledger, limits, priority))
    return ([r.id for r in out.decodes], [(r.id, n) for r, n in out.chunks],
            [r.id for r in out.preempted], [(a.request.id, a.cached_tokens) for a in out.admitted],
            ledger.free, sorted(ledger.blocks.items()), policy.stable(
                SchedulerView(queue, running, 0, ledger, limits, priority)))


@settings(max_examples=300, deadline=None)
@given(
    running=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 60), st.integers(0, 2),
                               st.sampled_from([False, False, False, True]),
                               st.sampled_from([False, False, False, False, True])),
                     max_size=12),
    prompts=st.lists(st.integers(1, 500), max_size=6),
    free=st.integers(0, 40),
    seqs=st.integers(1, 16),
    tokens=st.integers(1, 600),
    lookahead=st.sampled_from([0, 0, 2]),
    chunked=st.booleans(),
    priority=st.booleans(),
)
def test_the_decode_pass_at_once_decides_as_the_pass_one_by_one(
        running, prompts, free, seqs, tokens, lookahead, chunked, priority) -> None:
    spec = {"running": running, "prompts": prompts, "free": free, "seqs": seqs,
            "tokens": tokens, "lookahead": lookahead, "chunked": chunked,
            "priority": priority}
    assert _schedule(spec, one_by_one=False) == _schedule(spec, one_by_one=True)


def _decoding(n: int, free: int) -> tuple[list[Request], PlainLedger]:
    ledger = PlainLedger(free=free, block_size=BS)
    running = []
    for i in range(n):
        r = Request(i, 0.0, BS * 2, 100)
        r.move_to(State.PREFILL)
        r.move_to(State.DECODE)
        r.prefilled = r.prompt_tokens
        r.generated = 1
        ledger.blocks[i] = 2  # full: the next token needs a block
        running.append(r)
    return running, ledger


def test_the_leading_decodes_are_booked_at_once_only_when_they_cannot_preempt() -> None:
    running, ledger = _decoding(4, free=4)
    assert VllmV1._decode_prefix(running, ledger, 8, 0, out := []) == 4
    assert out == running
    assert ledger.free == 0
    assert all(ledger.blocks[r.id] == 3 for r in running)
    # One block short: the pass one by one preempts; nothing is booked here.
    running, ledger = _decoding(4, free=3)
    assert VllmV1._decode_prefix(running, ledger, 8, 0, out := []) == 0
    assert out == []
    assert ledger.free == 3
    # A budget of 3 tokens: the first three decodes.
    running, ledger = _decoding(4, free=4)
    assert VllmV1._decode_prefix(running, ledger, 3, 0, out := []) == 3
    assert out == running[:3]
    # A prefilling request ends the leading decodes.
    running, ledger = _decoding(4, free=4)
    running[2].move_to(State.QUEUED)
    running[2].move_to(State.PREFILL)
    assert VllmV1._decode_prefix(running, ledger, 8, 0, out := []) == 2
    assert out == running[:2]
    assert ledger.free == 2
