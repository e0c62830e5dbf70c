"""Queueing theory: degenerate clusters that are textbook single-server queues.

With one output token a request is a single prefill step, and with ``max_num_seqs: 1``
an instance serves one request at a time, first come first served. Poisson arrivals then
make each instance an M/G/1 queue whose service time is the cost model's price of that
request's prefill, ``S = step(BatchShape.prefill(prompt)).seconds``.

Two checks per configuration:

* **Sample path (exact).** The engine's waiting times equal Lindley's recursion
  ``W[n+1] = max(0, W[n] + S[n] - A[n+1])`` fed with the run's own arrival times and
  service times, to floating-point accuracy. This shows the instance is a FCFS
  single server on every request, independently of statistical noise.
* **Long-run mean (statistical).** The mean wait matches the Pollaczek-Khinchine formula
  for M/G/1, ``Wq = lambda E[S^2] / (2 (1 - lambda E[S]))`` (Kleinrock, *Queueing Systems*
  vol. 1, 1975, eq. 5.105; M/D/1 and M/M/1 are its special cases), with ``E[S]`` and
  ``E[S^2]`` taken from the run's own service times. That is exact for any service
  distribution, so it is the honest formula here: service is an affine-plus-attention
  function of the prompt length, so no length distribution makes it exactly exponential.

  The relative standard deviation of a mean wait over n requests at utilisation 0.3 is
  about 2.2 % at n = 20,000 and 0.6-0.7 % at n = 400,000 (measured with a Lindley
  recursion over 30 seeds per setting, deterministic and exponential service). The
  default run uses 20,000 requests and a 3-sigma bound (8 %); the ``slow`` tests use
  400,000 requests and the 2 % bound.

Multi-server, two ways:

* With push routing, each request goes to an instance on arrival. Routing at random is
  exact there: an independent random split of a Poisson stream gives each instance a
  Poisson stream of rate lambda / c, so the pool is c independent M/G/1 queues.
* With ``router.dispatch: central_queue`` requests wait in one FIFO and go to the first
  instance that frees a slot: an M/G/c queue. Its sample path must equal the FCFS
  c-server recursion exactly (Kiefer-Wolfowitz: each customer waits for the earliest
  free server), and with service of coefficient of variation about 1 its mean wait must
  match Erlang-C, ``Wq = C(c, a) / (c mu - lambda)``, scaled by the Allen-Cunneen factor
  ``(1 + Cs^2) / 2`` for the run's own service variability (1 for exponential service).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from simulator.cost import BatchShape
from simulator.runner import Simulation
from tests.conftest import make_scenario

UTILISATION = 0.3
FAST_N, FAST_TOLERANCE = 20_000, 0.08
SLOW_N, SLOW_TOLERANCE = 400_000, 0.02
PROBE = 2_000  # the prompt length whose service time sets the arrival rate


def geometric_lengths(mean_tokens: float, step: int = 64, count: int = 400) -> dict[str, Any]:
    """Prompt lengths 64, 128, ... with exponentially decaying weights (mean ~ mean_tokens)."""
    values = [step * k for k in range(1, count + 1)]
    weights = [float(np.exp(-v / mean_tokens)) for v in values]
    return {"kind": "empirical", "values": values, "weights": weights}


def queue_scenario(lengths: dict[str, Any], requests: int, instances: int = 1,
                   policy: str = "least_outstanding", rate_per_s: float = 1.0,
                   dispatch: str = "push") -> Any:
    return make_scenario(**{
        "seed": 1,
        "workload": {"arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
                     "input_tokens": lengths,
                     "output_tokens": {"kind": "fixed", "tokens": 1},
                     "num_requests": requests},
        "cluster.pools.main.instances": instances,
        "cluster.pools.main.scheduler": {"max_num_seqs": 1, "max_num_batched_tokens": 32768},
        "cluster.router.policy": policy,
        "cluster.router.dispatch": dispatch,
    })


@dataclass
class QueueRun:
    arrivals: np.ndarray
    service: np.ndarray
    waits: np.ndarray
    instance: np.ndarray
    rate_per_s: float


def run_queue(lengths: dict[str, Any], requests: int, instances: int = 1,
              policy: str = "least_outstanding", dispatch: str = "push",
              utilisation: float = UTILISATION) -> QueueRun:
    """Run at ``utilisation``, the rate set from the mean service time of the length mix."""
    probe = Simulation(queue_scenario(lengths, requests, instances, policy))
    cost = probe.plan.instances[0].cost
    if lengths["kind"] == "fixed":
        mean_service = cost.step(BatchShape.prefill(lengths["tokens"])).seconds
    else:
        values = np.asarray(lengths["values"])
        weights = np.asarray(lengths["weights"]) / np.sum(lengths["weights"])
        mean_service = float(sum(w * cost.step(BatchShape.prefill(int(v))).seconds
                                 for v, w in zip(values, weights, strict=True)))
    rate = utilisation * instances / mean_service
    sim = Simulation(queue_scenario(lengths, requests, instances, policy, rate, dispatch))
    res = sim.run()
    r = res.requests
    assert (r["status"] == "completed").all()
    assert (r["generated_tokens"] == 1).all()
    costs = [spec.cost for spec in sim.plan.instances]
    inst = r["prefill_instance"].to_numpy()
    prompts = r["prompt_tokens"].to_numpy()
    priced: dict[tuple[int, int], float] = {}
    service = np.empty(len(r))
    for i, (j, n) in enumerate(zip(inst, prompts, strict=True)):
        key = (int(j), int(n))
        if key not in priced:
            priced[key] = costs[key[0]].step(BatchShape.prefill(key[1])).seconds
        service[i] = priced[key]
    return QueueRun(r["arrival_s"].to_numpy(), service, r["queue_s"].to_numpy(), inst, rate)


def lindley(arrivals: np.ndarray, service: np.ndarray) -> np.ndarray:
    """FCFS single-server waiting times of customers in arrival order."""
    waits = np.empty(len(arrivals))
    w = 0.0
    for n in range(len(arrivals)):
        waits[n] = w
        if n + 1 < len(arrivals):
            w = max(0.0, w + service[n] - (arrivals[n + 1] - arrivals[n]))
    return waits


def pollaczek_khinchine(rate_per_s: float, service: np.ndarray) -> float:
    es, es2 = float(service.mean()), float((service**2).mean())
    rho = rate_per_s * es
    assert rho < 1
    return rate_per_s * es2 / (2 * (1 - rho))


def check_sample_path(q: QueueRun) -> None:
    for j in np.unique(q.instance):
        mine = q.instance == j
        order = np.argsort(q.arrivals[mine], kind="stable")
        expected = lindley(q.arrivals[mine][order], q.service[mine][order])
        assert np.abs(q.waits[mine][order] - expected).max() < 1e-6


def check_mean_wait(q: QueueRun, tolerance: float) -> None:
    """Pooled mean wait vs the count-weighted P-K value of each instance's own queue."""
    expected = 0.0
    for j in np.unique(q.instance):
        mine = q.instance == j
        arrivals = q.arrivals[mine]
        rate = (mine.sum() - 1) / (arrivals.max() - arrivals.min())
        expected += mine.mean() * pollaczek_khinchine(rate, q.service[mine])
    assert q.waits.mean() == pytest.approx(expected, rel=tolerance)


MD1 = {"kind": "fixed", "tokens": PROBE}
MM1_LIKE = geometric_lengths(PROBE)


def test_md1_sample_path_and_mean_wait() -> None:
    """M/D/1: every request has the same prompt, so the same service time."""
    q = run_queue(MD1, FAST_N)
    assert np.ptp(q.service) == 0
    check_sample_path(q)
    check_mean_wait(q, FAST_TOLERANCE)


def test_mg1_near_exponential_service_sample_path_and_mean_wait() -> None:
    """M/M/1-like: geometric prompt lengths make service times nearly exponential.

    The service coefficient of variation must be well away from 0 (deterministic), so the
    E[S^2] term of the formula is really exercised; it is about 1.0 with today's costs.
    """
    q = run_queue(MM1_LIKE, FAST_N)
    cv = q.service.std() / q.service.mean()
    assert cv > 0.7
    check_sample_path(q)
    check_mean_wait(q, FAST_TOLERANCE)


def test_random_routing_is_independent_mg1_queues() -> None:
    """Four instances, random routing: four M/G/1 queues each fed at rate lambda / 4."""
    q = run_queue(MM1_LIKE, FAST_N, instances=4, policy="random")
    counts = np.bincount(q.instance, minlength=4)
    assert counts.min() > 0.2 * len(q.instance)  # the split really is even-ish
    check_sample_path(q)
    check_mean_wait(q, FAST_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize(("lengths", "instances", "policy"), [
    (MD1, 1, "least_outstanding"),
    (MM1_LIKE, 1, "least_outstanding"),
    (MM1_LIKE, 4, "random"),
], ids=["M/D/1", "M/G/1 near-exponential", "4 x M/G/1 random routing"])
def test_long_run_mean_wait_within_two_percent(lengths: dict[str, Any], instances: int,
                                               policy: str) -> None:
    q = run_queue(lengths, SLOW_N, instances, policy)
    check_sample_path(q)
    check_mean_wait(q, SLOW_TOLERANCE)


# ----- M/G/c with a central queue: Erlang-C ---------------------------------------------
def fcfs_multi_server(arrivals: np.ndarray, service: np.ndarray, servers: int) -> np.ndarray:
    """Waiting times of a FCFS c-server queue: each customer takes the earliest free server."""
    free = [0.0] * servers
    waits = np.empty(len(arrivals))
    for n, (a, s) in enumerate(zip(arrivals, service, strict=True)):
        start = max(a, heapq.heappop(free))
        waits[n] = start - a
        heapq.heappush(free, start + s)
    return waits


def erlang_c_wait(rate_per_s: float, mean_service: float, servers: int) -> float:
    """Mean wait in an M/M/c queue (Erlang-C)."""
    a = rate_per_s * mean_service  # offered load in Erlangs
    rho = a / servers
    assert rho < 1
    terms = sum(a**k / math.factorial(k) for k in range(servers))
    top = a**servers / math.factorial(servers) / (1 - rho)
    p_wait = top / (terms + top)
    return p_wait * mean_service / (servers * (1 - rho))


@pytest.mark.parametrize(("requests", "tolerance"), [
    (FAST_N, FAST_TOLERANCE),
    pytest.param(SLOW_N, SLOW_TOLERANCE, marks=pytest.mark.slow),
])
def test_central_queue_is_an_mgc_queue_matching_erlang_c(requests: int,
                                                         tolerance: float) -> None:
    servers = 4
    q = run_queue(MM1_LIKE, requests, instances=servers, dispatch="central_queue",
                  utilisation=0.7)
    order = np.argsort(q.arrivals, kind="stable")
    expected = fcfs_multi_server(q.arrivals[order], q.service[order], servers)
    assert np.abs(q.waits[order] - expected).max() < 1e-6  # the exact sample path
    assert len(np.unique(q.instance)) == servers
    rate = (len(q.arrivals) - 1) / (q.arrivals.max() - q.arrivals.min())
    es = float(q.service.mean())
    cs2 = float(q.service.var() / es**2)
    assert 0.8 < cs2 < 1.2  # near-exponential service
    predicted = erlang_c_wait(rate, es, servers) * (1 + cs2) / 2
    assert q.waits.mean() == pytest.approx(predicted, rel=tolerance)
