"""A request's state and timestamps as it moves through the cluster."""

from __future__ import annotations

import math

NAN = math.nan


class Request:
    """One inference request. Plain slots, no SimPy: it is data the processes update."""

    __slots__ = (
        "arrival_s",
        "block_hashes",
        "blocks",
        "cache_pins",
        "cached_tokens",
        "completion_s",
        "decode_admit_s",
        "decode_instance",
        "decode_start_s",
        "first_token_s",
        "generated",
        "id",
        "in_flight",
        "output_tokens",
        "preemptions",
        "prefill_end_s",
        "prefill_instance",
        "prefill_saved_s",
        "prefill_start_s",
        "prefill_target",
        "prefilled",
        "prefix_group",
        "prefix_tokens",
        "prompt_tokens",
        "reason",
        "restarts",
        "second_token_s",
        "src_blocks",
        "status",
        "transfer_end_s",
        "transfer_start_s",
        "transfer_wait_s",
    )

    def __init__(self, rid: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 prefix_group: int = -1, prefix_tokens: int = 0) -> None:
        self.id = rid
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.prefix_group = prefix_group
        self.prefix_tokens = prefix_tokens
        self.prefilled = 0
        self.prefill_target = prompt_tokens
        self.generated = 0
        self.blocks = 0
        self.in_flight = False  # part of a micro-batch still in the pipeline
        self.src_blocks = 0  # KV blocks still held on the prefill instance during a hand-off
        self.cache_pins = 0  # leading prefix-cache blocks this request pins where it is
        self.cached_tokens = 0  # prompt tokens its first prefill found in the prefix cache
        self.prefill_saved_s = 0.0  # estimated prefill time those cached tokens saved
        self.block_hashes: list[int] | None = None
        self.preemptions = 0
        self.restarts = 0  # times a failure sent it back to be prefilled or placed again
        self.status = "queued"
        self.reason = ""
        self.prefill_instance = -1
        self.decode_instance = -1
        self.prefill_start_s = NAN
        self.prefill_end_s = NAN
        self.first_token_s = NAN
        self.transfer_wait_s = NAN
        self.transfer_start_s = NAN
        self.transfer_end_s = NAN
        self.decode_admit_s = NAN
        self.decode_start_s = NAN
        self.second_token_s = NAN
        self.completion_s = NAN

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV a decode step attends over (prompt + generated so far)."""
        return self.prompt_tokens + self.generated

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_target

    @property
    def done(self) -> bool:
        return self.generated >= self.output_tokens

    def reset_for_recompute(self, *, preempted: bool = True) -> None:
        """Drop the KV: the next prefill recomputes prompt and generated tokens."""
        self.prefilled = 0
        self.prefill_target = self.prompt_tokens + self.generated
        self.blocks = 0
        if preempted:
            self.preemptions += 1
