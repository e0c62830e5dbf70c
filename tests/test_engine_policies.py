"""Each serving engine's scheduler, driven with plain data from its documented behaviour
(no SimPy environment, no cost model): vLLM V1, TensorRT-LLM, SGLang."""

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
    SglangScheduler,
    TrtllmInflight,
    VllmV1,
)

BS = 16


def waiting(rid: int, prompt: int, out: int = 50, arrival: float = 0.0) -> Request:
    return Request(rid, arrival, prompt, out)


def decoding(rid: int, prompt: int, generated: int, ledger: PlainLedger, *,
             spare: int = 0, out: int = 1000) -> Request:
    """A running request in decode holding KV for its context (+ ``spare`` blocks)."""
    r = Request(rid, 0.0, prompt, out)
    r.move_to(State.PREFILL)
    r.move_to(State.DECODE)
    r.prefilled = prompt
    r.generated = generated
    ledger.blocks[rid] = ledger.blocks_for(r.context_tokens) + spare
    return r


def view(queue: list[Request], running: list[Request], ledger: PlainLedger, *,
         seqs: int = 8, tokens: int = 256, held: int = 0, decodes: bool = True,
         priority=None) -> SchedulerView:
    limits = EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=tokens,
                          max_running=seqs, decodes=decodes)
    return SchedulerView(queue, running, held, ledger, limits, priority)


def lacking(*reqs: Request, ledger: PlainLedger) -> None:
    """Each request now lacks one block for its next token."""
    for r in reqs:
        ledger.blocks[r.id] = ledger.blocks_for(r.context_tokens) - 1


# ----- vLLM V1 ----------------------------------------------------------------------
def test_vllm_preempts_the_most_recent_and_admits_nothing_in_that_step() -> None:
    ledger = PlainLedger(free=0, block_size=BS)
    old, new = decoding(0, 32, 1, ledger), decoding(1, 32, 1, ledger, spare=20)
    lacking(old, ledger=ledger)
    queue = [waiting(2, 10)]
    out = VllmV1().schedule(view(queue, [old, new], ledger))
    assert out.preempted == [new]
    assert out.decodes == [old]
    assert out.admitted == []  # the freed blocks would fit request 2: vLLM waits a step
    assert ledger.free > ledger.blocks_for(11)


def test_vllm_allocates_kv_per_chunk_not_for_the_whole_prompt() -> None:
    ledger = PlainLedger(free=1000, block_size=BS)
    out = VllmV1().schedule(view([waiting(0, 4000)], [], ledger, tokens=256))
    assert out.chunks[0][1] == 256
    assert ledger.blocks[0] == 256 // BS  # the first chunk's blocks only
    legacy = PlainLedger(free=1000, block_size=BS)
    DecodeFirstChunked().schedule(view([waiting(0, 4000)], [], legacy, tokens=256))
    assert legacy.blocks[0] == legacy.blocks_for(4001)  # the old path booked it all


def test_vllm_a_running_chunked_prefill_grows_per_chunk_and_can_preempt() -> None:
    ledger = PlainLedger(free=0, block_size=BS)
    pre = Request(0, 0.0, 1000, 10)
    pre.move_to(State.PREFILL)
    pre.prefilled = 256
    ledger.blocks[0] = 16
    late = decoding(1, 32, 1, ledger, spare=30)
    out = VllmV1().schedule(view([], [pre, late], ledger, tokens=256))
    assert out.preempted == [late]  # the chunk needs 16 more blocks
    assert out.chunks == [(pre, 256)]
    assert ledger.blocks[0] == 32


def test_vllm_max_num_seqs_caps_the_running_requests_not_the_step() -> None:
    ledger = PlainLedger(free=1000, block_size=BS)
    run = [decoding(i, 32, 1, ledger, spare=1) for i in range(4)]
    out = VllmV1().schedule(view([waiting(9, 10)], run, ledger, seqs=4, tokens=256))
    assert out.decodes == run
    assert out.admitted == []  # 4 running = max_num_seqs: the queue waits, budget or not
    # Prefilled requests waiting to send their KV have left vLLM's running list.
    out = VllmV1().schedule(view([waiting(9, 10)], run[:3], ledger, seqs=4, held=5))
    assert [a.request.id for a in out.admitted] == [9]


def test_vllm_priority_orders_the_queue_and_preempts_the_lowest_priority() -> None:
    ledger = PlainLedger(free=0, block_size=BS)
    a, b = decoding(0, 32, 1, ledger, spare=3), decoding(1, 32, 1, ledger)
    lacking(b, ledger=ledger)
    prio = {0: 5.0, 1: 0.0, 2: 1.0, 3: 0.0}.__getitem__
    out = VllmV1().schedule(view([], [a, b], ledger, priority=lambda r: prio(r.id)))
    assert out.preempted == [a]  # a has the larger value: lowest priority
    assert out.decodes == [b]
    ledger = PlainLedger(free=100, block_size=BS)
    out = VllmV1().schedule(view([waiting(2, 10), waiting(3, 10)], [], ledger,
                                 priority=lambda r: prio(r.id)))
    assert [x.request.id for x in out.admitted] == [3, 2]


# ----- TensorRT-LLM -------------------------------------------------------------------
def test_trtllm_guaranteed_no_evict_queues_what_cannot_finish_and_never_preempts() -> None:
    ledger = PlainLedger(free=40, block_size=BS)
    run = decoding(0, 64, 1, ledger, out=400)
    lacking(run, ledger=ledger)  # holds 4 blocks; to completion: ceil(464/16) - 4 = 25
    big = waiting(1, 100, out=200)  # prompt: 7 blocks; to completion: 19
    out = TrtllmInflight("guaranteed_no_evict").schedule(view([big], [run], ledger))
    assert out.preempted == []
    assert out.admitted == []  # 19 > 40 - 25 reserved: it waits although its prompt fits
    assert out.decodes == [run]
    small = waiting(2, 100, out=50)  # to completion: 10 blocks
    out = TrtllmInflight("guaranteed_no_evict").schedule(view([small], [run], ledger))
    assert [a.request for a in out.admitted] == [small]


def test_trtllm_guaranteed_no_evict_skips_a_decode_rather_than_evict() -> None:
    ledger = PlainLedger(free=0, block_size=BS)
    a, b = decoding(0, 32, 1, ledger), decoding(1, 32, 1, ledger)
    lacking(a, b, ledger=ledger)
    out = TrtllmInflight("guaranteed_no_evict").schedule(view([], [a, b], ledger))
    assert out.preempted == []
    assert out.decodes == []


def test_trtllm_max_utilization_packs_the_request_no_evict_queues() -> None:
    ledger = PlainLedger(free=40, block_size=BS)
    run = decoding(0, 64, 1, ledger, out=400)
    lacking(run, ledger=ledger)
    big = waiting(1, 100, out=200)
    out = TrtllmInflight("max_utilization").schedule(view([big], [run], ledger))
    assert [a.request for a in out.admitted] == [big]  # its next step fits: in it goes
    assert out.preempted == []


def test_trtllm_max_utilization_pauses_the_last_scheduled_generation() -> None:
    ledger = PlainLedger(free=0, block_size=BS)
    a, b = decoding(0, 32, 1, ledger), decoding(1, 32, 1, ledger, spare=1)
    lacking(a, ledger=ledger)
    out = TrtllmInflight("max_utilization").schedule(view([], [b, a], ledger))
    assert out.preempted == [b]  # scheduled before a, the only generation to pause
    assert out.decodes == [a]


def test_trtllm_max_utilization_pauses_the_last_started_when_none_is_scheduled() -> None:
    """The first generation cannot grow and nothing is scheduled yet to pause: the last
    started generation is paused (here b, not visited yet), or the request itself when it is
    the only one. Before, scheduling stopped with the KV full: no step and no event, and
    the instance stalled until the clock stopped."""
    ledger = PlainLedger(free=0, block_size=BS)
    a, b = decoding(0, 32, 1, ledger), decoding(1, 32, 1, ledger)
    lacking(a, ledger=ledger)
    out = TrtllmInflight("max_utilization").schedule(view([], [a, b], ledger))
    assert out.preempted == [b]
    assert out.decodes == [a]
    ledger = PlainLedger(free=0, block_size=BS)
    alone = decoding(2, 32, 1, ledger)
    lacking(alone, ledger=ledger)
    out = TrtllmInflight("max_utilization").schedule(view([], [alone], ledger))
    assert out.preempted == [alone]
    assert out.decodes == []


def test_trtllm_without_chunking_a_context_larger_than_the_tokens_left_waits() -> None:
    ledger = PlainLedger(free=1000, block_size=BS)
    run = [decoding(0, 32, 1, ledger, spare=1)]
    queue = [waiting(1, 200), waiting(2, 300)]
    out = TrtllmInflight(chunked=False).schedule(view(queue, run, ledger, tokens=256))
    assert [(r.id, n) for r, n in out.chunks] == [(1, 200)]  # 300 > the 55 left: waits
    assert out.decodes == run
    ledger = PlainLedger(free=1000, block_size=BS)
    run = [decoding(0, 32, 1, ledger, spare=1)]
    out = TrtllmInflight(chunked=True).schedule(view(queue, run, ledger, tokens=256))
    assert [(r.id, n) for r, n in out.chunks] == [(1, 200), (2, 48)]  # 55 left: 3 blocks


def prefilling(rid: int, prompt: int, done: int, ledger: PlainLedger) -> Request:
    """A running request part-way through a chunked prefill (KV for ``done`` tokens)."""
    r = Request(rid, 0.0, prompt, 50)
    r.move_to(State.PREFILL)
    r.prefilled = done
    ledger.blocks[rid] = ledger.blocks_for(done)
    return r


def test_trtllm_a_context_in_chunked_prefill_counts_against_max_batch_size() -> None:
    """TensorRT-LLM 1.0+, tensorrt_llm/_torch/pyexecutor/scheduler.py: PyCapacityScheduler
    stops at len(scheduled_requests) >= max_num_requests over contexts (CONTEXT_INIT, a
    chunked context stays in it) and generations alike, and PyMicroBatchScheduler counts
    both toward max_batch_size (scheduled_req_count)."""
    for capacity in ("guaranteed_no_evict", "max_utilization"):
        ledger = PlainLedger(free=1000, block_size=BS)
        run = [decoding(0, 32, 1, ledger, spare=1), prefilling(1, 600, 256, ledger)]
        out = TrtllmInflight(capacity, chunked=True).schedule(
            view([waiting(2, 10)], run, ledger, seqs=2, tokens=512))
        assert out.admitted == []  # 1 decoding + 1 prefilling = max_batch_size 2
        assert out.decodes == [run[0]]
        assert [(r.id, n) for r, n in out.chunks] == [(1, 344)]  # the rest of its prompt


# ----- SGLang ------------------------------------------------------------------------
def test_sglang_orders_the_queue_by_longest_prefix_match() -> None:
    ledger = PlainLedger(free=10_000, block_size=BS, hits={1: 64, 2: 512})
    queue = [waiting(0, 600), waiting(1, 600), waiting(2, 600)]
    out = SglangScheduler("lpm").schedule(view(queue, [], ledger, tokens=4096))
    assert [a.request.id for a in out.admitted] == [2, 1, 0]
    out = SglangScheduler("fcfs").schedule(view(queue, [], PlainLedger(10_000, BS),
                                                 tokens=4096))
    assert [a.request.id for a in out.admitted] == [0, 1, 2]


def test_sglang_new_token_ratio_holds_admission_back_then_decays() -> None:
    ledger = PlainLedger(free=100, block_size=BS)  # 1600 tokens
    run = [decoding(i, 16, 1, ledger, out=2000) for i in range(2)]
    ledger.free = 100
    # Reserved at the initial ratio 0.7: 2 x 1999 x 0.7 = 2799 tokens > 1600 free.
    sched = SglangScheduler()
    out = sched.schedule(view([waiting(5, 100, out=10)], run, ledger))
    assert out.admitted == []
    assert out.decodes == run  # a decode step instead
    sched.advance(10_000)  # the ratio decays to its floor 0.098: 392 reserved
    assert sched.new_token_ratio == sched.min_ratio
    out = sched.schedule(view([waiting(5, 100, out=10)], run, ledger))
    assert [a.request.id for a in out.admitted] == [5]
    assert out.decodes == []  # prefill and decode never share an SGLang step


def test_sglang_retracts_fewest_generated_to_the_back_and_resets_the_ratio() -> None:
    ledger = PlainLedger(free=0, block_size=BS)
    a = decoding(0, 32, 5, ledger, spare=2)
    b = decoding(1, 32, 1, ledger, spare=2)
    c = decoding(2, 32, 9, ledger)
    lacking(a, c, ledger=ledger)
    sched = SglangScheduler()
    out = sched.schedule(view([], [a, b, c], ledger))
    assert out.preempted == [b]  # fewest generated tokens
    assert out.preempted_to_front is False
    assert out.decodes == [a, c]
    assert sched.new_token_ratio == min(1.0, (5 + 9 + 20 * 2) / 2000)


def test_sglang_the_chunked_request_counts_against_max_running_requests() -> None:
    """SGLang 0.4-0.5, python/sglang/srt/managers/scheduler.py get_new_batch_prefill: the
    chunked request is added to the PrefillAdder's can_run_list first, and admission stops
    at len(adder.can_run_list) >= get_num_allocatable_reqs(running_bs), which is
    max_running_requests less the running batch; so decoding + chunked + new <= the cap."""
    ledger = PlainLedger(free=1000, block_size=BS)
    chunked = prefilling(1, 600, 256, ledger)
    run = [decoding(0, 32, 1, ledger, spare=1, out=60), chunked]
    out = SglangScheduler("fcfs").schedule(view([waiting(2, 10)], run, ledger, seqs=2,
                                                tokens=512))
    assert [(r.id, n) for r, n in out.chunks] == [(1, 344)]  # the rest of its prompt
    assert out.admitted == []  # 1 running + the chunked one = max_running_requests 2
    out = SglangScheduler("fcfs").schedule(view([waiting(2, 10)], run, ledger, seqs=3,
                                                tokens=512))
    assert [a.request.id for a in out.admitted] == [2]  # room for one more


# ----- every policy: budget, caps ---------------------------------------------------
POLICIES = [DecodeFirstChunked(), PrefillFirst(), VllmV1(), VllmV1(chunked=False),
            TrtllmInflight("guaranteed_no_evict"), TrtllmInflight("max_utilization", True),
            SglangScheduler("lpm"), SglangScheduler("fcfs")]


@settings(max_examples=300, deadline=None)
@given(
    which=st.integers(0, len(POLICIES) - 1),
    prompts=st.lists(st.integers(1, 600), max_size=12),
    running=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 40), st.integers(0, 1)),
                     max_size=10),
    free=st.integers(0, 200),
    seqs=st.integers(1, 12),
    tokens=st.integers(1, 1024),
)
def test_every_policy_respects_the_token_budget_and_sequence_cap(
        which, prompts, running, free, seqs, tokens) -> None:
    policy = POLICIES[which]
    ledger = PlainLedger(free=free, block_size=BS)
    run = [decoding(i, p, g, ledger, spare=s) for i, (p, g, s) in enumerate(running)]
    queue = [waiting(100 + i, p) for i, p in enumerate(prompts)]
    cap = max(seqs, len(run))
    tokens = max(tokens, cap)  # vLLM requires max_num_batched_tokens >= max_num_seqs
    out = policy.schedule(view(queue, run, ledger, seqs=cap, tokens=tokens))
    assert len(out.chunks) + len(out.decodes) <= cap
    chunk_tokens = sum(n for _, n in out.chunks)
    if chunk_tokens + len(out.decodes) > tokens:
        # Only without chunked prefill, one prompt larger than the budget left.
        assert not getattr(policy, "chunked", False)
        assert len(out.chunks) == 1
    assert ledger.free >= 0
    assert all(n > 0 for _, n in out.chunks)
    gone = {r.id for r in out.preempted}
    assert not gone & {r.id for r in out.decodes}
    assert len(run) - len(gone) + len(out.admitted) <= cap


def test_without_chunking_a_prompt_larger_than_the_budget_runs_as_the_only_prefill() -> None:
    """vLLM and TensorRT-LLM refuse a budget smaller than the longest prompt without
    chunked prefill; here such a prompt must not stall."""
    for policy in (VllmV1(chunked=False), TrtllmInflight(chunked=False)):
        ledger = PlainLedger(free=1000, block_size=BS)
        run = [decoding(5, 32, 1, ledger, spare=1)]
        out = policy.schedule(view([waiting(0, 300), waiting(1, 10)], run, ledger,
                                   tokens=256))
        assert [(r.id, n) for r, n in out.chunks] == [(0, 300)]
        assert out.decodes == run
