"""Capacity planner: the cheapest layouts that meet the SLO at a target request rate.

Given a model, a workload, SLOs, a target rate and the hardware allowed (device types,
how many, prices), the planner

1. enumerates *families*: colocated (one pool) or disaggregated (prefill + decode pools),
   each pool a device type with a TP x PP shape; shapes that cannot hold the model are
   rejected with the memory message;
2. estimates each pool's per-instance capacity (requests/s) with the cost model
   (``cost/``): prefill from the step time of a full prefill batch (``max_num_batched_tokens``
   of mean-length prompts), decode from the step time of the largest batch the KV cache and
   ``max_num_seqs`` allow; a pool whose single-prompt prefill misses the TTFT SLO, or whose
   one-sequence decode step misses TPOT, is rejected. The capacity is optimistic (full
   batches, no queueing), so ``ceil(target / capacity)`` instances is a lower bound: the
   search starts there, and families whose lower-bound cost is out of reach are pruned
   without being simulated;
3. simulates each surviving family at the target rate, starting from its lower bound and
   adding instances to the pool whose SLO is further from being met (TTFT -> prefill,
   TPOT -> decode) until SLO attainment reaches the target, the device limits are hit, or
   the family's best case costs more than the ``top`` cheapest feasible configurations
   found so far (branch and bound);
4. optionally finds each feasible configuration's goodput (highest rate still meeting the
   target, :mod:`simulator.runner.goodput`) for the cost vs goodput Pareto plot.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.errors import ConfigError
from simulator.hardware.profiles import DeviceProfile
from simulator.hardware.registry import load_device
from simulator.runner.build import build_plan
from simulator.runner.executors import Executor, make_executor
from simulator.runner.goodput import GoodputSpec, attainment_of
from simulator.runner.plan_capacity import capacity
from simulator.runner.plan_spec import (
    Candidate,
    Family,
    HardwareOption,
    PlanResult,
    PlanSpec,
    Shape,
    families,
    load_plan,
    scenario_of,
)
from simulator.runner.sweep import RunTask, execute_run, stable_hash

__all__ = ["RANK_RULE", "Candidate", "Family", "HardwareOption", "PlanResult", "PlanSpec",
           "Planner", "Shape", "capacity", "capacity_curve", "families", "load_plan", "plan", "rank_key",
           "scenario_of", "steady_state_warnings"]


def _price(spec: PlanSpec, device: DeviceProfile, name: str) -> float:
    option = next(h for h in spec.hardware if h.device == name)
    if option.usd_per_hour is not None:
        return option.usd_per_hour
    if device.price is None:
        raise ConfigError(f"device {device.name} has no price in its profile; give "
                          "usd_per_hour", key=f"hardware.{name}")
    return device.price.usd_per_hour


# ----- the search -----------------------------------------------------------------------
def _task(spec: PlanSpec, cand: Candidate, index: int, goodput: bool = False) -> RunTask:
    sc = scenario_of(spec, cand.family, cand.counts).model_dump(mode="json")
    gp = (GoodputSpec(target=spec.attainment, start_rate_per_s=spec.rate, rel_tol=0.05,
                      max_probes=10).model_dump(mode="json") if goodput else None)
    run_id = stable_hash(sc if gp is None else {"scenario": sc, "goodput": gp})
    return RunTask(run_id, run_id, index, spec.seed, {}, sc, str(Path.cwd()), None, False, gp)


class Planner:
    def __init__(self, spec: PlanSpec, executor: Executor) -> None:
        self.spec = spec
        self.executor = executor
        self.devices = {h.device: load_device(h.device) for h in spec.hardware}
        self.limits = {h.device: h.max_devices for h in spec.hardware}
        self.rejected: list[dict[str, Any]] = []
        self.simulated: list[Candidate] = []
        self.feasible: list[Candidate] = []

    def candidate(self, family: Family, counts: tuple[int, ...]) -> Candidate | None:
        devices: dict[str, int] = {}
        cost = 0.0
        for shape, n in zip(family.shapes, counts, strict=True):
            devices[shape.device] = devices.get(shape.device, 0) + n * shape.devices
            cost += n * shape.devices * _price(self.spec, self.devices[shape.device],
                                               shape.device)
        if any(devices[d] > self.limits[d] for d in devices):
            return None
        if any(n > self.spec.max_instances_per_pool for n in counts):
            return None
        return Candidate(family, counts, cost, devices)

    def reject(self, family: Family, reason: str) -> None:
        self.rejected.append({"family": family.label(), "layout": family.layout,
                              "reason": reason})

    def bound(self) -> float:
        """Cost of the ``top``-th cheapest feasible configuration so far (inf if fewer)."""
        costs = sorted(c.cost_usd_per_hour for c in self.feasible)
        return costs[self.spec.top - 1] if len(costs) >= self.spec.top else math.inf

    def start(self, family: Family) -> Candidate | None:
        caps, reason = capacity(self.spec, family)
        if reason:
            self.reject(family, reason)
            return None
        counts = tuple(max(1, math.ceil(self.spec.rate / c)) for c in caps)
        cand = self.candidate(family, counts)
        if cand is None:
            need = {s.device: 0 for s in family.shapes}
            for s, n in zip(family.shapes, counts, strict=True):
                need[s.device] += n * s.tp * s.pp
            pools = ", ".join(f"{n} {role} instance(s) (<= {c:.3g} req/s each)"
                              for role, n, c in zip(family.roles, counts, caps, strict=True))
            self.reject(family, f"the cost model's capacity estimate needs at least {pools} "
                        f"= {', '.join(f'{n} {d}' for d, n in need.items())} for "
                        f"{self.spec.rate:g} req/s; limits: "
                        f"{', '.join(f'{self.limits[d]} {d}' for d in need)}, "
                        f"{self.spec.max_instances_per_pool} instances per pool")
        return cand

    def grow(self, cand: Candidate) -> Candidate | None:
        """The next candidate of a family that missed the target: grow the worse phase."""
        s, slo = cand.summary, self.spec.slo
        counts = list(cand.counts)
        if len(counts) == 1:
            pick = 0
        else:
            q = "p90" if self.spec.attainment <= 0.9 else "p99"
            ttft = s.get(f"ttft_{q}_s", math.inf) / (slo.ttft_s or math.inf)
            tpot = s.get(f"tpot_{q}_s", math.inf) / (slo.tpot_s or math.inf)
            e2e = s.get(f"e2e_{q}_s", math.inf) / (slo.e2e_s or math.inf)
            pick = 0 if ttft >= max(tpot, e2e) else 1
        counts[pick] += max(1, counts[pick] // 4)
        return self.candidate(cand.family, tuple(counts))

    def unfit_shapes(self) -> set[Shape]:
        """Shapes that cannot hold the model (weights, or the longest prompt's KV)."""
        from simulator.errors import MemoryFitError

        bad: set[Shape] = set()
        for shape in dict.fromkeys(s for f in families(self.spec) for s in f.shapes):
            try:
                build_plan(scenario_of(self.spec, Family("colocated", (shape,)), (1,)))
            except MemoryFitError as exc:
                bad.add(shape)
                self.rejected.append({"family": f"every pool on {shape.text()}",
                                      "layout": "any", "reason": f"does not fit: {exc.message}"})
            except ConfigError as exc:
                if shape.dp == 1:
                    raise
                bad.add(shape)  # e.g. a dense model, or experts that do not divide over EP
                self.rejected.append({"family": f"every pool on {shape.text()}",
                                      "layout": "any", "reason": exc.message})
        return bad

    def search(self) -> None:
        active: dict[Family, tuple[Candidate, int]] = {}
        unfit = self.unfit_shapes()
        for family in families(self.spec):
            if unfit & set(family.shapes):
                continue
            cand = self.start(family)
            if cand is not None:
                active[family] = (cand, 0)
        while active:
            bound = self.bound()
            for family, (cand, _) in list(active.items()):
                if cand.cost_usd_per_hour > bound:
                    self.reject(family, f"pruned: costs at least ${cand.cost_usd_per_hour:,.2f}/h "
                                f"({cand.family.label(cand.counts)}), more than the "
                                f"{self.spec.top} cheapest feasible configurations")
                    del active[family]
            batch = [_task(self.spec, cand, i) for i, (cand, _) in enumerate(active.values())]
            by_id = {t.run_id: fam for t, fam in zip(batch, list(active), strict=True)}
            for task, outcome in self.executor.map_unordered(execute_run, batch):
                family = by_id[task.run_id]
                cand, tries = active[family]
                row: dict[str, Any] = outcome[0] if isinstance(outcome, tuple) else {
                    "status": "failed", "error": str(outcome)}
                cand.summary = row
                self.simulated.append(cand)
                if row.get("status") != "ok":
                    self.reject(family, f"simulation failed: {row.get('error')}")
                    del active[family]
                elif attainment_of(row) >= self.spec.attainment:  # every class's SLO
                    self.feasible.append(cand)
                    del active[family]
                elif tries + 1 >= self.spec.max_simulations_per_family:
                    self.reject(family, self._miss(cand, "after "
                                f"{tries + 1} simulations (max_simulations_per_family)"))
                    del active[family]
                else:
                    nxt = self.grow(cand)
                    if nxt is None:
                        self.reject(family, self._miss(cand, "at the device/instance limits"))
                        del active[family]
                    else:
                        active[family] = (nxt, tries + 1)

    def _miss(self, cand: Candidate, when: str) -> str:
        s = cand.summary
        return (f"SLO attainment {s.get('slo_attainment', 0):.0%} < {self.spec.attainment:.0%} "
                f"{when}, with {cand.family.label(cand.counts)}: TTFT p90 "
                f"{s.get('ttft_p90_s', math.nan) * 1e3:.0f} ms, TPOT p90 "
                f"{s.get('tpot_p90_s', math.nan) * 1e3:.1f} ms")

    def goodputs(self, ranked: list[Candidate]) -> dict[int, dict[str, Any]]:
        tasks = [_task(self.spec, c, i, goodput=True) for i, c in enumerate(ranked)]
        out: dict[int, dict[str, Any]] = {}
        for task, outcome in self.executor.map_unordered(execute_run, tasks):
            if isinstance(outcome, tuple):
                out[task.index] = outcome[0]
        return out


def _row(spec: PlanSpec, cand: Candidate) -> dict[str, Any]:
    s = cand.summary
    keep = ("slo_attainment", "goodput", "ttft_p90_s", "tpot_p90_s", "e2e_p90_s",
            "output_token_throughput", "cost_usd_per_1m_output_tokens", "energy_j_per_output_token")
    row: dict[str, Any] = {
        "label": cand.family.label(cand.counts), "layout": cand.family.layout,
        "devices": sum(cand.devices.values()), "cost_usd_per_hour": cand.cost_usd_per_hour,
        **{k: s.get(k, math.nan) for k in keep},
        "target_rate_per_s": spec.rate,
    }
    if "slo_attainment_min_class" in s:  # request classes: the class the target binds on
        row["slo_attainment_min_class"] = s["slo_attainment_min_class"]
    for role, shape, n in zip(cand.family.roles, cand.family.shapes, cand.counts, strict=True):
        row[f"{role}_device"], row[f"{role}_tp"] = shape.device, shape.tp
        row[f"{role}_pp"], row[f"{role}_instances"] = shape.pp, n
        row[f"{role}_dp"] = shape.dp
    # Planner prices may override profile prices: recompute $/1M tokens with them.
    tput = s.get("output_token_throughput", 0.0) or math.nan
    row["cost_usd_per_1m_output_tokens"] = cand.cost_usd_per_hour / (tput * 3600) * 1e6
    row["scenario_json"] = json.dumps(scenario_of(spec, cand.family, cand.counts)
                                      .model_dump(mode="json"), sort_keys=True)
    return row


def plan(spec: PlanSpec, *, executor: str = "local", workers: int | None = None,
         scheduler: str | None = None, file: str | None = None) -> PlanResult:
    """Search the layouts of ``spec``; see the module docstring for the method."""
    pool = make_executor(executor, workers, scheduler)
    try:
        planner = Planner(spec, pool)
        try:
            planner.search()
        except ConfigError as exc:
            raise exc.with_file(file or "") from None
        chosen = sorted(planner.feasible, key=lambda c: (
            c.cost_usd_per_hour, -c.summary.get("slo_attainment", 0.0), c.family.label(c.counts)))
        chosen = chosen[: spec.top]
        rows = [_row(spec, c) for c in chosen]
        if spec.goodput_search and chosen:
            for i, g in planner.goodputs(chosen).items():
                rows[i]["goodput_rate_per_s"] = g.get("goodput_rate_per_s", math.nan)
                rows[i]["goodput_rate_per_device"] = g.get("goodput_rate_per_device", math.nan)
    finally:
        pool.close()
    order = sorted(range(len(rows)), key=lambda i: rank_key(rows[i]))
    ranked = [chosen[i] for i in order]
    table = pd.DataFrame([rows[i] for i in order])
    if len(table):
        table.insert(0, "rank", range(1, len(table) + 1))
    rejected = pd.DataFrame(planner.rejected, columns=["family", "layout", "reason"])
    simulated = pd.DataFrame([{**_row(spec, c), "feasible": c in planner.feasible}
                              for c in planner.simulated if c.summary.get("status") == "ok"])
    best = scenario_of(spec, ranked[0].family, ranked[0].counts) if ranked else None
    return PlanResult(spec, table, rejected.reset_index(drop=True), simulated, best,
                      len(planner.feasible), steady_state_warnings(spec, ranked))


RANK_RULE = ("cheapest $/hour first; ties by higher goodput (the highest rate still meeting "
             "the SLO target, when searched), then higher SLO attainment at the target rate, "
             "then fewer devices, then the configuration's name")
"""How the planner orders configurations; the Pareto plot breaks ties the same way."""


def rank_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """Sort key of :data:`RANK_RULE`. Costs are compared to the cent per hour, so figures
    that differ only in float noise tie; $/1M tokens, which moves with the end-of-run drain
    of a fixed request count, is not a criterion."""
    goodput = row.get("goodput_rate_per_s", math.nan)
    return (round(float(row["cost_usd_per_hour"]), 2),
            -(goodput if isinstance(goodput, float) and math.isfinite(goodput) else -math.inf),
            -float(row.get("slo_attainment", 0.0)), int(row["devices"]), str(row["label"]))


def capacity_curve(ranked: pd.DataFrame) -> pd.DataFrame:
    """Devices and $/hour needed against the request rate, from a plan's ranked table:
    for each rate from the target up to the highest goodput found, the cheapest ranked
    configuration whose goodput (highest rate still meeting the SLO target) covers it.

    One row per interval of rates served by one configuration: ``from_rate_per_s``,
    ``to_rate_per_s``, ``devices``, ``cost_usd_per_hour``, ``label``; empty without a
    goodput search. Below the target rate the plan has no answer (cheaper layouts were
    never searched)."""
    columns = ["from_rate_per_s", "to_rate_per_s", "devices", "cost_usd_per_hour", "label"]
    gcol = "goodput_rate_per_s"
    if gcol not in ranked or ranked.empty or not ranked[gcol].notna().any():
        return pd.DataFrame(columns=columns)
    table = ranked[ranked[gcol].notna()]
    target = float(table["target_rate_per_s"].iloc[0])
    ends = sorted({float(g) for g in table[gcol] if g >= target})
    rows: list[list[Any]] = []
    start = target
    for end in ends:
        ok = table[table[gcol] >= end - 1e-9]
        best = ok.sort_values(["cost_usd_per_hour", "devices"], kind="stable").iloc[0]
        if rows and rows[-1][4] == str(best["label"]):
            rows[-1][1] = end  # the same configuration serves this interval too
        else:
            rows.append([start, end, int(best["devices"]), float(best["cost_usd_per_hour"]),
                         str(best["label"])])
        start = end
    return pd.DataFrame(rows, columns=columns)


STEADY_STATE_SHARE = 0.2
"""Largest share of a run's requests that may see the ramp-up or the drain."""


def steady_state_warnings(spec: PlanSpec, ranked: list[Candidate]) -> list[str]:
    """Runs too short to reach steady state, by Little's law: at the target rate a
    configuration holds ``L = rate x mean E2E`` requests in flight, and about ``L``
    requests at each end of a run arrive into a filling or a draining system; with ``N``
    requests that is a share ``2L / N``, which should stay under :data:`STEADY_STATE_SHARE`."""
    w = spec.workload
    n = w.num_requests if w.num_requests is not None else (
        spec.rate * w.duration_s if w.duration_s else None)
    if not n or not ranked:
        return []
    e2e = float(ranked[0].summary.get("e2e_mean_s", math.nan))
    if not math.isfinite(e2e):
        return []
    in_flight = spec.rate * e2e
    share = 2 * in_flight / n
    if share <= STEADY_STATE_SHARE:
        return []
    need = math.ceil(2 * in_flight / STEADY_STATE_SHARE)
    return [f"{n:.0f} requests at {spec.rate:g} req/s are too few for steady state: the top "
            f"pick holds ~{in_flight:.0f} in flight (rate x mean E2E {e2e:.2f} s), so ~"
            f"{share:.0%} of the requests see the ramp-up or the drain; set "
            f"workload.num_requests >= {need} for results that hold in steady state"]
