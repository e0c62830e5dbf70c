"""What a flow on the :class:`~simulator.engine.fabric.Fabric` crosses, and how a hand-off
between two instances travels: plain frozen specs, built once per route (runner/paths.py)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from simulator.hardware.profiles import LinkProfile

INF = float("inf")


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """What a flow crosses: a key naming the physical thing, and its byte rate."""

    key: str
    bandwidth: float
    """Bytes per second in this direction (after protocol efficiency)."""
    owner: str | None = None
    """Instance whose outgoing hand-offs this resource carries (link faults target it)."""


class FlowSpec(NamedTuple):
    """A flow to start (a tuple: a hand-off builds a few of them for every request)."""

    resources: tuple[ResourceSpec, ...]
    nbytes: float
    cap: float = INF
    """Largest rate this flow may take, bytes per second."""


@dataclass(frozen=True)
class TransferPath:
    """How a hand-off between two instances travels."""

    key: str
    """Label in the transfers frame: the hops (slowest first when host-staged) and source."""
    profile: LinkProfile
    """The slowest hop of the route."""
    streams: tuple[tuple[tuple[ResourceSpec, ...], float], ...]
    """Each stream's resources and its bytes per prompt token."""
    fixed_s: float
    """Set-up overhead and latency of every hop, paid once per hand-off."""
    conversion_s_per_byte: float = 0.0
    conversion_s_per_token: float = 0.0

    @cached_property
    def bytes_per_token(self) -> float:
        """Bytes on the wire per prompt token, every replicated copy counted (summed once
        per path: a path is asked for at every hand-off)."""
        return sum(b for _, b in self.streams)
