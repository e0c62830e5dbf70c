"""Request classes (tenants): their random streams and the per-class admission gate.

Each class draws its arrivals, lengths and prefixes from its own generators, seeded from
the run's seed and the class *name* (not its position), so adding, removing or reordering
a class leaves every other class's draws unchanged.

The admission gate is the gateway's concurrency limit per tenant (as an API gateway's
per-key limit does in front of vLLM or llm-d): a class with ``max_outstanding`` set never
has more requests in the cluster at once; one more is shed at arrival with a reason.
"""

from __future__ import annotations

import zlib

import numpy as np

from simulator.engine.request import Request
from simulator.engine.workload_spec import RequestClass

CLASS_STREAMS = ("arrival", "input", "output", "prefix")
DEFAULT_CLASS = "default"
"""The class of a workload without ``classes``; a class of this name draws from the run's
own streams, so ``classes: [{name: default, ...}]`` is that workload written out."""


def class_rngs(seed: int, name: str, run_rngs: dict[str, np.random.Generator]
               ) -> dict[str, np.random.Generator]:
    """The generators of class ``name``: one per stream, from (seed, name) only (the
    run's own streams for :data:`DEFAULT_CLASS`)."""
    if name == DEFAULT_CLASS:
        return {stream: run_rngs[stream] for stream in CLASS_STREAMS}
    root = np.random.SeedSequence([seed, zlib.crc32(name.encode())])
    return {stream: np.random.default_rng(child)
            for stream, child in zip(CLASS_STREAMS, root.spawn(len(CLASS_STREAMS)),
                                     strict=True)}


class Admission:
    """Requests of each class now in the cluster, against the class's limit."""

    def __init__(self, classes: list[RequestClass]) -> None:
        self.limits = {c.name: c.max_outstanding for c in classes
                       if c.max_outstanding is not None}
        self.outstanding = dict.fromkeys(self.limits, 0)
        self.peak = dict.fromkeys(self.limits, 0)
        self.shed = dict.fromkeys(self.limits, 0)
        self._inside: set[int] = set()

    def admit(self, req: Request) -> str | None:
        """Let ``req`` in (None) or say why it is shed."""
        limit = self.limits.get(req.klass)
        if limit is None:
            return None
        n = self.outstanding[req.klass]
        if n >= limit:
            self.shed[req.klass] += 1
            return (f"shed: class {req.klass} has {n} requests outstanding "
                    f"(max_outstanding {limit})")
        self.outstanding[req.klass] = n + 1
        self.peak[req.klass] = max(self.peak[req.klass], n + 1)
        self._inside.add(req.id)
        return None

    def release(self, req: Request) -> None:
        """``req`` has ended (completed, failed, cancelled): its place is free."""
        if req.id in self._inside:
            self._inside.discard(req.id)
            self.outstanding[req.klass] -= 1
