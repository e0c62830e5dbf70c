"""A maintained least-key index over a pool's instances, for the least-something routers.

``min(candidates, key=...)`` reads every instance's load for every request; on a pool of
32 instances that is over a hundred gated reads per routed request. This index keeps a
heap of each member's last-read key and re-reads only what may have changed:

* a member whose key may have gone **down** (or anywhere) since it was read is *marked*
  (``LoadIndex.mark``): the instance reports it when its queue, batch, hand-offs or
  freed KV change, and the cluster when it fails, recovers, drains or is switched;
* a key may go **up** unannounced: a decode jump books its KV lazily, so the KV load a
  router would read rises with the clock without an event. A stored key is therefore a
  lower bound of the member's key, and :meth:`LoadIndex.pick` re-reads the top of the
  heap until the re-read key equals the stored one: that member's key is then no larger
  than any other's, the same choice as ``min`` (keys end with the instance index, so
  there are no ties).

The picks are those of ``min`` over the accepted members, exactly (tests/test_load_index.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Key = tuple[Any, ...]


class LoadIndex(Generic[T]):
    """Least ``key(member)`` among ``members`` that ``accept`` admits, kept between picks.

    Members compare by identity (a marked member is kept in a set until the next pick).
    """

    def __init__(self, members: Sequence[T], key: Callable[[T], Key]) -> None:
        self._members = list(members)
        self._key = key
        self._stored: list[Key | None] = [None] * len(self._members)
        self._version = [0] * len(self._members)
        # (key, slot, version): an entry is current while its version is the slot's.
        self._heap: list[tuple[Key, int, int]] = []
        self._slot = {id(m): i for i, m in enumerate(self._members)}
        # Members marked since the last pick; a set of the members themselves, so that
        # marking is the set's own ``add`` (called for every change an instance reports,
        # several per routed request, most of them repeats).
        self._marked: set[T] = set(self._members)
        self.mark: Callable[[T], None] = self._marked.add
        """``member``'s key may have changed in any direction: re-read it at the next pick
        (a member not in the index is ignored)."""

    def pick(self, accept: Callable[[T], bool]) -> T | None:
        """The accepted member of least key now, or None if none is accepted."""
        heap, members, key_of, version = self._heap, self._members, self._key, self._version
        # Slots whose key was read in this call: nothing runs between two reads of one
        # pick, so a second read would give the same key.
        fresh: set[int] | tuple[()] = ()
        marked = self._marked
        if marked:
            slot_of, stored = self._slot, self._stored
            fresh = {slot_of.get(id(m), -1) for m in marked}
            fresh.discard(-1)  # not a member
            marked.clear()
            # In the members' order, the same in every run: a read books the member's
            # running jump, which may evict from its prefix cache to a shared tier below.
            for slot in sorted(fresh):
                key = key_of(members[slot])
                if key != stored[slot]:
                    stored[slot] = key
                    version[slot] += 1
                    heapq.heappush(heap, (key, slot, version[slot]))
            if len(heap) > 4 * len(members) + 16:  # drop superseded entries
                heap[:] = [e for e in heap if e[2] == version[e[1]]]
                heapq.heapify(heap)
        passed: list[tuple[Key, int, int]] = []
        found: T | None = None
        while heap:
            key, slot, ver = heap[0]
            if ver != version[slot]:  # superseded by a later read
                heapq.heappop(heap)
                continue
            member = members[slot]
            if slot not in fresh:
                now = key_of(member)
                if now != key:  # it rose unannounced: put it where it belongs, look again
                    self._stored[slot] = now
                    version[slot] = ver + 1
                    heapq.heapreplace(heap, (now, slot, ver + 1))
                    continue
            if accept(member):  # the least: its entry stays where it is
                found = member
                break
            passed.append(heapq.heappop(heap))
        for entry in passed:  # every member keeps its current entry
            heapq.heappush(heap, entry)
        return found
