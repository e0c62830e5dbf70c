"""Transfers on the fabric: a lone transfer is one timer, and ends exactly when re-planning
would end it, whatever joins it, degrades its links or cancels it on the way."""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.fabric import Fabric, Flow, FlowSpec, ResourceSpec

GB = 1e9
OWNERS = ("p/0", "p/1")
RESOURCES = tuple(ResourceSpec(f"r{k}", (10 + 7 * k) * GB, OWNERS[k % 2]) for k in range(4))


def replay(transfers: list[tuple[float, list[FlowSpec]]],
           changes: list[tuple[float, str, int, float]], *, grouped: bool
           ) -> tuple[list[tuple[float, bool]], int]:
    """Run ``transfers`` (start time, flows) and ``changes`` (time, kind, which, value).

    ``grouped``: each transfer as one :meth:`Fabric.transfer` (a lone one may skip the
    re-plans); else as plain flows with ``done`` events, re-planned on every change.
    Returns each transfer's (end time or -1, all got through) and how often the fabric
    re-planned.
    """
    env = simpy.Environment()
    fabric = Fabric(env)
    replans = 0
    replan = fabric._replan

    def counted() -> None:
        nonlocal replans
        replans += 1
        replan()

    fabric._replan = counted  # type: ignore[method-assign]
    ends: list[tuple[float, bool]] = [(-1.0, False)] * len(transfers)  # never ended
    flows: list[list[Flow]] = [[] for _ in transfers]

    def done(i: int, ok: bool) -> None:
        ends[i] = (env.now, ok)

    def begin(i: int, specs: list[FlowSpec]) -> None:
        if grouped:
            flows[i] = fabric.transfer(specs, lambda ok: done(i, ok))
            return
        flows[i] = fabric.start(specs)
        cond = env.all_of([f.done for f in flows[i]])
        cond.callbacks.append(lambda e: done(i, all(e.value.values())))

    def change(kind: str, which: int, value: float) -> None:
        if kind == "degrade":
            fabric.degrade(OWNERS[which % 2], value)
        elif kind == "kill":
            fabric.degrade(OWNERS[which % 2], 0.0, for_good=True)
        else:
            for flow in flows[which % len(flows)]:
                fabric.cancel(flow)

    for i, (at, specs) in enumerate(transfers):
        env.timeout(at).callbacks.append(lambda _e, i=i, specs=specs: begin(i, specs))
    for at, kind, which, value in changes:
        env.timeout(at).callbacks.append(
            lambda _e, k=kind, w=which, v=value: change(k, w, v))
    env.run(until=1e6)
    return ends, replans


routes = st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True).map(
    lambda ks: tuple(RESOURCES[k] for k in sorted(ks)))
flow_specs = st.builds(FlowSpec, routes, st.floats(0.01 * GB, 30 * GB),
                       st.one_of(st.just(float("inf")), st.floats(0.5 * GB, 20 * GB)))
times = st.one_of(st.floats(0.0, 10.0), st.sampled_from([0.0, 0.5, 1.0, 2.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(times, st.lists(flow_specs, min_size=1, max_size=4)),
                min_size=1, max_size=8),
       st.lists(st.tuples(times, st.sampled_from(["degrade", "kill", "cancel"]),
                          st.integers(0, 7), st.floats(0.0, 2.0)), max_size=3))
def test_transfers_end_exactly_when_re_planning_ends_them(transfers, changes) -> None:
    grouped, _ = replay(transfers, changes, grouped=True)
    planned, _ = replay(transfers, changes, grouped=False)
    assert grouped == planned  # bit for bit, not approximately


def test_a_lone_transfer_is_not_re_planned_and_one_that_gets_company_is() -> None:
    nic = RESOURCES[0]
    same_end = [FlowSpec((nic,), 2 * GB), FlowSpec((RESOURCES[1],), 3.4 * GB)]  # 17 GB/s
    ends, replans = replay([(0.0, [FlowSpec((nic,), 2 * GB)]), (5.0, same_end)], [],
                           grouped=True)
    assert ends == [(0.2, True), (5.2, True)]
    assert replans == 0
    # The second transfer starts while the first runs: both are re-planned from then on.
    ends, replans = replay([(0.0, [FlowSpec((nic,), 2 * GB)]),
                            (0.1, [FlowSpec((nic,), 1 * GB)])], [], grouped=True)
    assert ends[0][0] == ends[1][0] == 0.30000000000000004  # 1 GB each at 5 GB/s after 0.1 s
    assert replans > 0
    # Flows of one transfer that would not end together are re-planned too.
    _, replans = replay([(0.0, [FlowSpec((nic,), 1 * GB), FlowSpec((RESOURCES[1],), GB)])],
                        [], grouped=True)
    assert replans > 0


def test_a_lone_transfer_cancelled_or_cut_off_reports_failure() -> None:
    nic = RESOURCES[0]
    ends, _ = replay([(0.0, [FlowSpec((nic,), 2 * GB)])], [(0.1, "cancel", 0, 0.0)],
                     grouped=True)
    assert ends == [(0.1, False)]
    ends, _ = replay([(0.0, [FlowSpec((nic,), 2 * GB)])], [(0.1, "kill", 0, 0.0)],
                     grouped=True)
    assert ends == [(0.1, False)]
    # Half speed from 0.1 s: 1 GB left at 5 GB/s.
    ends, _ = replay([(0.0, [FlowSpec((nic,), 2 * GB)])], [(0.1, "degrade", 0, 0.5)],
                     grouped=True)
    assert abs(ends[0][0] - 0.3) < 1e-12
    assert ends[0][1]


def test_a_lone_transfer_is_one_event_and_reports_from_its_timer() -> None:
    env = simpy.Environment()
    fabric = Fabric(env)
    reports: list[tuple[float, bool, int]] = []
    first = next(env._eid)  # SimPy numbers every scheduled event from this counter
    fabric.transfer([FlowSpec((RESOURCES[0],), 2 * GB)],
                    lambda ok: reports.append((env.now, ok, next(env._eid))))
    env.run()
    # The timer (one event) and nothing else: the report is a call from it, at its time.
    assert reports == [(0.2, True, first + 2)]


def _progressive_filling(flows: list[Flow]) -> list[float]:
    """Max-min fair rates with caps, written as the textbook loop (Bertsekas & Gallager,
    Data Networks 6.5.2): the reference the fabric's allocation must equal bit for bit."""
    left = {r: r.capacity for f in flows for r in f.resources}
    users = {r: sum(r in f.resources for f in flows) for r in left}
    rate = {id(f): 0.0 for f in flows}
    unfrozen = list(flows)
    while unfrozen:
        level = min([f.cap for f in unfrozen] + [max(0.0, left[r]) / n
                                                 for r, n in users.items() if n])
        full = {r for r, n in users.items() if n and max(0.0, left[r]) / n <= level}
        frozen = [f for f in unfrozen if f.cap <= level or any(r in full for r in f.resources)]
        for f in frozen:
            unfrozen.remove(f)
            rate[id(f)] = level
            for r in f.resources:
                left[r] -= level
                users[r] -= 1
    return [rate[id(f)] for f in flows]


@settings(max_examples=300, deadline=None)
@given(st.lists(flow_specs, min_size=1, max_size=12),
       st.lists(st.floats(0.0, 2.0), min_size=4, max_size=4))
def test_allocation_is_progressive_filling_bit_for_bit(specs, factors) -> None:
    fabric = Fabric(simpy.Environment())
    for k, res in enumerate(RESOURCES):
        fabric.resource(res).factor = factors[k]
    flows = [fabric._flow(spec, False) for spec in specs]
    fabric._allocate(dict.fromkeys(flows))
    assert [f.rate for f in flows] == _progressive_filling(flows)
