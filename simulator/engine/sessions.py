"""Multi-turn conversations: turn k's prompt is the whole conversation so far.

A session's token stream is ``u1 o1 u2 o2 ...`` (user messages, replies). Turn k sends
``u1 o1 ... u_k`` and gets ``o_k`` back; the next turn follows ``think_time_s`` (mean,
exponential) after the reply's last token. Hash block ``i`` of the stream has the same
id in every turn of the session, since a block's content (and in vLLM its chained hash)
only depends on the tokens up to it; a request carries the ids of every full block of
its prompt and reply, so that a turn finds its history in the prefix cache (or a lower
KV tier) and a finished turn can leave its reply's blocks cached for the next one.

Session block ids live in their own range, ``2**62 + session * 2**24 + block``, apart
from trace hash ids (small, >= 0) and synthetic shared prefixes (negative).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import simpy

from simulator.engine.request import Request

if TYPE_CHECKING:
    from simulator.engine.workload import Workload

_BASE = 1 << 62
_PER_SESSION = 1 << 24


@dataclass(slots=True)
class _Session:
    index: int
    turns_left: int
    history: int = 0
    """Tokens of the conversation so far (earlier prompts' new parts and replies)."""
    turn: int = 0


class Sessions:
    """The open sessions of one workload; it calls back into the workload to submit."""

    def __init__(self, workload: Workload) -> None:
        self.w = workload
        spec = workload.spec.sessions
        assert spec is not None
        self.spec = spec
        self.rng = workload.rngs["session"]
        self.started = 0
        self.planned = 0  # turns of the sessions started so far
        self.open = 0  # sessions with turns still to send
        self._by_request: dict[int, _Session] = {}

    def _turns(self) -> int:
        from simulator.engine.workload import sample_lengths

        return int(sample_lengths(self.spec.turns, self.rng, 1)[0])

    def start(self, limit: int | None) -> None:
        """An arrival: open a session (its turns capped so ``limit`` is never passed)."""
        turns = self._turns()
        if limit is not None:
            turns = min(turns, limit - self.planned)
        s = _Session(self.started, turns)
        self.started += 1
        self.planned += turns
        self.open += 1
        self._send(s)

    def _send(self, s: _Session) -> None:
        w = self.w
        user, output, _, _ = next(w._lengths)
        s.turn += 1
        s.turns_left -= 1
        prompt = s.history + user
        req = w._make(w.env.now, prompt, output)
        req.session, req.turn = s.index, s.turn
        blocks = (prompt + output) // w.spec.prefix_block_tokens
        first = _BASE + s.index * _PER_SESSION
        req.block_hashes = list(range(first, first + blocks))
        s.history = prompt + output
        self._by_request[req.id] = s
        w.submit(req)

    def on_finished(self, req: Request) -> None:
        s = self._by_request.pop(req.id, None)
        if s is None:
            return
        if s.turns_left <= 0 or req.status != "completed":
            self.open -= 1  # the last turn, or the conversation broke off
            return
        think = self.spec.think_time_s
        delay = float(self.rng.exponential(think)) if think > 0 else 0.0
        if delay > 0:
            self.w.env.process(self._later(s, delay))
        else:
            self._send(s)

    def _later(self, s: _Session, delay: float) -> Generator[simpy.Event, Any, None]:
        yield self.w.env.timeout(delay)
        self._send(s)
