"""Scheduler policies as pure functions: plain requests and a plain KV ledger in, a step
out — no SimPy environment, no cost model, no recorder."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.request import Request, State
from simulator.engine.scheduler import (
    DecodeFirstChunked,
    EngineLimits,
    PlainLedger,
    PrefillFirst,
    SchedulerView,
)

BS = 16


def waiting(rid: int, prompt: int, out: int = 50) -> Request:
    return Request(rid, 0.0, prompt, out)


def decoding(rid: int, prompt: int, generated: int, ledger: PlainLedger,
             spare: int = 0) -> Request:
    """A running request in decode with KV for its context (+ ``spare`` blocks)."""
    r = Request(rid, 0.0, prompt, 1000)
    r.move_to(State.PREFILL)
    r.move_to(State.DECODE)
    r.prefilled = prompt
    r.generated = generated
    ledger.blocks[rid] = ledger.blocks_for(r.context_tokens) + spare
    return r


def view(waiting_reqs: list[Request], running: list[Request], ledger: PlainLedger, *,
         seqs: int = 8, tokens: int = 256, held: int = 0, decodes: bool = True) -> SchedulerView:
    limits = EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=tokens,
                          max_running=seqs, decodes=decodes)
    return SchedulerView(waiting_reqs, running, held, ledger, limits)


# ----- decode-first chunked prefill (the default so far) ------------------------------
def test_decode_first_schedules_decodes_then_chunks_the_queue_head() -> None:
    ledger = PlainLedger(free=100, block_size=BS)
    run = [decoding(0, 64, 3, ledger, spare=1), decoding(1, 64, 3, ledger, spare=1)]
    head = waiting(2, 1000)
    out = DecodeFirstChunked().schedule(view([head], run, ledger, tokens=256))
    assert out.decodes == run
    # The budget left after two decodes goes to the first chunk of the queue head.
    assert [(r.id, n) for r, n in out.chunks] == [(2, 254)]
    assert [a.request.id for a in out.admitted] == [2]
    assert not out.preempted
    # Its whole prompt's KV (+1 token) was booked at admission.
    assert ledger.blocks[2] == ledger.blocks_for(1001)


def test_decode_first_preempts_the_most_recent_running_request_when_kv_runs_out() -> None:
    ledger = PlainLedger(free=0, block_size=BS)
    old = decoding(0, 32, 1, ledger)  # context 33: 3 blocks
    new = decoding(1, 32, 1, ledger)
    out = DecodeFirstChunked().schedule(view([], [old, new], ledger))
    assert out.preempted == []
    assert out.decodes == [old, new]
    ledger.blocks[0] = ledger.blocks[1] = 2  # each now lacks one block, none is free
    out = DecodeFirstChunked().schedule(view([], [old, new], ledger))
    # ``old`` needs a block: the most recently admitted (``new``) is preempted for it,
    # and its 2 blocks are not enough to admit its recompute (3 blocks) again.
    assert out.preempted == [new]
    assert out.decodes == [old]
    assert out.admitted == []
    assert ledger.blocks == {0: 3}
    assert ledger.free == 1


def test_decode_first_may_readmit_the_request_it_preempted() -> None:
    ledger = PlainLedger(free=0, block_size=BS)
    old = decoding(0, 32, 1, ledger)
    new = decoding(1, 32, 1, ledger, spare=1)  # holds 4 blocks
    ledger.blocks[0] = 2  # ``old`` lacks one
    out = DecodeFirstChunked().schedule(view([], [old, new], ledger))
    assert out.preempted == [new]
    # Freed: 4 blocks; ``old`` takes 1; the recompute of ``new`` (33 tokens + 1) fits in 3.
    assert [a.request for a in out.admitted] == [new]
    assert out.chunks == [(new, 33)]  # its prompt and the token it had generated


def test_prefill_role_never_decodes_nor_preempts() -> None:
    ledger = PlainLedger(free=1000, block_size=BS)
    out = DecodeFirstChunked().schedule(
        view([waiting(0, 100), waiting(1, 100)], [], ledger, decodes=False))
    assert not out.decodes
    assert not out.preempted
    assert [n for _, n in out.chunks] == [100, 100]


def test_held_requests_count_toward_the_running_cap() -> None:
    ledger = PlainLedger(free=1000, block_size=BS)
    out = DecodeFirstChunked().schedule(
        view([waiting(0, 10), waiting(1, 10)], [], ledger, seqs=2, held=1))
    assert [a.request.id for a in out.admitted] == [0]


def test_a_prompt_whose_kv_does_not_fit_stays_queued_and_blocks_the_queue() -> None:
    ledger = PlainLedger(free=2, block_size=BS)
    out = DecodeFirstChunked().schedule(view([waiting(0, 100), waiting(1, 5)], [], ledger))
    assert out.empty
    assert not out.admitted
    assert ledger.free == 2  # nothing booked


def test_prefix_hit_shortens_the_first_chunk() -> None:
    ledger = PlainLedger(free=100, block_size=BS, hits={0: 64})
    out = DecodeFirstChunked().schedule(view([waiting(0, 100)], [], ledger))
    assert out.admitted[0].cached_tokens == 64
    assert out.chunks[0][1] == 36


# ----- prefill-first (chunked prefill off) -------------------------------------------
def test_prefill_first_never_mixes_and_runs_a_long_prompt_alone() -> None:
    ledger = PlainLedger(free=1000, block_size=BS)
    run = [decoding(0, 64, 3, ledger, spare=1)]
    out = PrefillFirst().schedule(view([waiting(1, 100), waiting(2, 500)], run, ledger))
    assert out.decodes == []
    assert [(r.id, n) for r, n in out.chunks] == [(1, 100)]  # 500 does not fit what is left
    out = PrefillFirst().schedule(view([waiting(2, 500)], run, ledger))
    assert [(r.id, n) for r, n in out.chunks] == [(2, 500)]  # larger than the budget: alone
    out = PrefillFirst().schedule(view([], run, ledger))
    assert out.decodes == run
    assert out.chunks == []


# ----- every policy: budget, caps, KV ---------------------------------------------------
POLICIES = [DecodeFirstChunked(), PrefillFirst()]


@settings(max_examples=200, deadline=None)
@given(
    policy=st.sampled_from(POLICIES),
    prompts=st.lists(st.integers(1, 600), max_size=12),
    running=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 40), st.integers(0, 1)),
                     max_size=10),
    free=st.integers(0, 200),
    seqs=st.integers(1, 12),
    tokens=st.integers(1, 1024),
)
def test_every_policy_respects_the_token_budget_and_sequence_cap(
        policy, prompts, running, free, seqs, tokens) -> None:
    ledger = PlainLedger(free=free, block_size=BS)
    run = [decoding(i, p, g, ledger, spare=s) for i, (p, g, s) in enumerate(running)]
    queue = [waiting(100 + i, p) for i, p in enumerate(prompts)]
    cap = max(seqs, len(run))
    tokens = max(tokens, cap)  # vLLM requires max_num_batched_tokens >= max_num_seqs
    out = policy.schedule(view(queue, run, ledger, seqs=cap, tokens=tokens))
    chunk_tokens = sum(n for _, n in out.chunks)
    assert len(out.chunks) + len(out.decodes) <= cap
    if isinstance(policy, PrefillFirst) and len(out.chunks) == 1:
        pass  # a prompt larger than the budget runs alone
    else:
        assert chunk_tokens + len(out.decodes) <= tokens
    assert ledger.free >= 0
    gone = {r.id for r in out.preempted}
    assert not gone & {r.id for r in out.decodes}
    assert all(n > 0 for _, n in out.chunks)
    # Admissions come from the queue head, preempted requests first.
    order = [*reversed(out.preempted), *queue]
    assert [a.request for a in out.admitted] == order[: len(out.admitted)]
