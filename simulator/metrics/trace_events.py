"""A run as a Chrome/Perfetto trace-event file (the JSON "Trace Event Format").

Open the file in https://ui.perfetto.dev (drag and drop) or chrome://tracing. Layout:

- one process per pool, one thread (track) per instance: every engine step is a complete
  ("X") event named ``prefill``/``decode``/``mixed`` with its batch size, its numbers in
  ``args``; counters for KV blocks used and queue length per instance;
- one process ``links``, one track per link: each KV hand-off is a complete event;
- one process ``requests``: a span per request from arrival to completion, with its phases
  (queue, prefill, KV transfer, decode) nested inside;
- flow events (``s`` → ``t`` → ``f``) from the prefill step that finished a request,
  through its transfer, to the decode step it joined;
- instant events for whatever the run logged in ``result.events`` (faults, scaling).

Timestamps are microseconds of simulated time. Events on one track must nest (the
format's rule for complete events), so overlapping spans — pipeline micro-batches on one
instance, concurrent transfers on a shared link, concurrent requests — are spread over as
many lanes as they need.
"""

from __future__ import annotations

import heapq
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from simulator.runner.result import RunResult

Event = dict[str, Any]

_US = 1e6
_FLOW_NAME = "KV hand-off"
_FLOW_CAT = "kv_handoff"
_EPS_US = 2e-3  # two grid points: times computed two ways may round apart by one


def _us(seconds: float) -> float:
    """Seconds to microseconds, on a nanosecond grid so equal times stay equal."""
    return round(float(seconds) * _US, 3)


def _finite(x: Any) -> bool:
    return x is not None and isinstance(x, int | float | np.number) and math.isfinite(x)


def _meta(pid: int, name: str, value: Any, tid: int | None = None) -> Event:
    ev: Event = {"ph": "M", "pid": pid, "name": name, "args": {}}
    if tid is not None:
        ev["tid"] = tid
    ev["args"]["sort_index" if name.endswith("sort_index") else "name"] = value
    return ev


class _Lanes:
    """Interval partitioning: the fewest lanes such that spans in one lane never overlap.

    A span goes to the lowest-numbered free lane, so the first lanes stay the busiest.
    """

    def __init__(self) -> None:
        self._busy: list[tuple[float, int]] = []  # (end of its last span, lane)
        self._free: list[int] = []
        self.count = 0

    def place(self, start: float, end: float) -> int:
        while self._busy and self._busy[0][0] <= start:
            heapq.heappush(self._free, heapq.heappop(self._busy)[1])
        if self._free:
            lane = heapq.heappop(self._free)
        else:
            lane = self.count
            self.count += 1
        heapq.heappush(self._busy, (end, lane))
        return lane


def step_label(prefill_seqs: int, prefill_tokens: int, decode_seqs: int) -> tuple[str, str]:
    """(category, name) of one step row: what kind of batch and how big."""
    if prefill_tokens and decode_seqs:
        kind = "mixed"
        name = (f"mixed (prefill {prefill_seqs} seq / {prefill_tokens} tok"
                f" + decode {decode_seqs} seq)")
    elif prefill_tokens:
        kind, name = "prefill", f"prefill ({prefill_seqs} seq / {prefill_tokens} tok)"
    elif decode_seqs:
        kind, name = "decode", f"decode ({decode_seqs} seq)"
    else:
        kind, name = "idle", "idle"
    return kind, name


def _instance_order(result: RunResult) -> list[tuple[str, str]]:
    """(pool, instance name) for every instance: the scenario's, then any the frames add."""
    seen: dict[str, str] = {}
    for pool in result.scenario.cluster.pools:
        for j in range(pool.instances):
            seen.setdefault(f"{pool.name}/{j}", pool.name)
    if len(result.steps):
        for name, pool in zip(result.steps["instance_name"], result.steps["pool"], strict=True):
            seen.setdefault(str(name), str(pool))
    return [(pool, name) for name, pool in seen.items()]


def _pool_label(result: RunResult, pool: str) -> str:
    for spec in result.scenario.cluster.pools:
        if spec.name == pool:
            par = spec.parallelism
            shape = f"TP{par.tp}" + (f" PP{par.pp}" if par.pp != 1 else "") + (
                f" EP{par.ep}" if par.ep != 1 else "")
            return f"{spec.role} pool {pool!r}: {spec.instances} x {spec.device} {shape}"
    return f"pool {pool!r}"


def build_trace(result: RunResult, *, counters: bool = True) -> dict[str, Any]:
    """The trace-event JSON object of a run (``{"traceEvents": [...], ...}``)."""
    events: list[Event] = []
    instances = _instance_order(result)
    pools = list(dict.fromkeys(pool for pool, _ in instances))
    pool_pid = {pool: i + 1 for i, pool in enumerate(pools)}
    inst_tid = {name: i + 1 for i, (_, name) in enumerate(instances)}
    inst_pid = {name: pool_pid[pool] for pool, name in instances}
    for pool, pid in pool_pid.items():
        events.append(_meta(pid, "process_name", _pool_label(result, pool)))
        events.append(_meta(pid, "process_sort_index", pid))
    for i, (_, name) in enumerate(instances):
        events.append(_meta(inst_pid[name], "thread_name", name, inst_tid[name]))
        events.append(_meta(inst_pid[name], "thread_sort_index", i, inst_tid[name]))

    # Thread ids are unique across the whole trace, not only within a process, so no
    # viewer can merge two tracks that share a number.
    step_spans, next_tid = _step_events(result.steps, inst_pid, inst_tid, events, counters,
                                        first_tid=len(instances) + 1)
    links_pid = len(pools) + 1
    transfer_spans, next_tid = _transfer_events(result.transfers, links_pid, events,
                                                first_tid=next_tid)
    requests_pid = links_pid + 1
    next_tid = _request_events(result.requests, requests_pid, events, first_tid=next_tid)
    _flow_events(result.requests, result.transfers, step_spans=step_spans,
                 transfer_spans=transfer_spans, inst_pid=inst_pid, links_pid=links_pid,
                 events=events)
    if len(result.events):
        events_pid = requests_pid + 1
        events.append(_meta(events_pid, "process_name", "events"))
        events.append(_meta(events_pid, "process_sort_index", events_pid))
        events.append(_meta(events_pid, "thread_name", "events", next_tid))
        for rec in result.events.to_dict("records"):
            events.append({"ph": "i", "s": "g", "name": str(rec["kind"]), "cat": "event",
                           "ts": _us(rec["time_s"]), "pid": events_pid, "tid": next_tid,
                           "args": {"detail": str(rec["detail"])}})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"scenario": result.scenario.name, "seed": result.scenario.seed,
                      "time_unit": "simulated microseconds"},
    }


_STEP_ARGS = ("prefill_seqs", "prefill_tokens", "decode_seqs", "decode_ctx_tokens",
              "kv_used_blocks", "kv_total_blocks", "queue_len", "running")


class _StepSpans:
    """One instance's steps (microseconds), for binding flow arrows to them."""

    def __init__(self, starts: list[float], ends: list[float], tids: list[int]) -> None:
        self.starts = np.asarray(starts)  # sorted (steps are emitted in start order)
        self.ends = np.asarray(ends)
        self.tids = tids
        self._by_end = np.argsort(self.ends, kind="stable")

    def _at(self, i: int) -> tuple[float, int]:
        return round(float(self.starts[i] + self.ends[i]) / 2, 3), self.tids[i]

    def ending_at(self, t_us: float) -> tuple[float, int] | None:
        """(midpoint, tid) of the step that finished at ``t_us``."""
        ends = self.ends[self._by_end]
        j = int(np.searchsorted(ends, t_us - _EPS_US, side="left"))
        if j >= len(ends) or ends[j] > t_us + _EPS_US:
            return None
        return self._at(int(self._by_end[j]))

    def starting_at(self, t_us: float) -> tuple[float, int] | None:
        """(midpoint, tid) of the first step that started at or after ``t_us``."""
        i = int(np.searchsorted(self.starts, t_us - _EPS_US, side="left"))
        return None if i >= len(self.starts) else self._at(i)


def _step_events(steps: pd.DataFrame, inst_pid: dict[str, int], inst_tid: dict[str, int],
                 events: list[Event], counters: bool, *,
                 first_tid: int) -> tuple[dict[str, _StepSpans], int]:
    """Step slices, one track per instance (more lanes where steps overlap: PP micro-batches).

    Returns the steps of each instance for the flow arrows, and the next unused thread id.
    """
    spans: dict[str, _StepSpans] = {}
    next_tid = first_tid
    if not len(steps):
        return spans, next_tid
    ordered = steps.sort_values(["instance_name", "start_s"], kind="stable")
    for key, group in ordered.groupby("instance_name", sort=False):
        name = str(key)
        pid = inst_pid[name]
        lane_tid = {0: inst_tid[name]}
        lanes = _Lanes()
        starts = [_us(s) for s in group["start_s"].tolist()]
        ends = [_us(e) for e in group["end_s"].tolist()]
        tids: list[int] = []
        columns = {c: group[c].astype("int64").tolist() for c in _STEP_ARGS}
        bounds = group["bound"].astype(str).tolist()
        for i, (ts, end) in enumerate(zip(starts, ends, strict=True)):
            lane = lanes.place(ts, end)
            if lane not in lane_tid:
                lane_tid[lane] = next_tid
                events.append(_meta(pid, "thread_name", f"{name} [{lane + 1}]", next_tid))
                events.append(_meta(pid, "thread_sort_index", next_tid, next_tid))
                next_tid += 1
            tid = lane_tid[lane]
            tids.append(tid)
            args: dict[str, Any] = {c: columns[c][i] for c in _STEP_ARGS}
            args["bound"] = bounds[i]
            cat, label = step_label(args["prefill_seqs"], args["prefill_tokens"],
                                    args["decode_seqs"])
            events.append({"ph": "X", "name": label, "cat": cat, "ts": ts,
                           "dur": round(end - ts, 3), "pid": pid, "tid": tid, "args": args})
            if counters:
                events.append({"ph": "C", "name": f"{name} KV blocks used", "ts": ts,
                               "pid": pid, "args": {"blocks": args["kv_used_blocks"]}})
                events.append({"ph": "C", "name": f"{name} queue", "ts": ts, "pid": pid,
                               "args": {"waiting": args["queue_len"],
                                        "running": args["running"]}})
        spans[name] = _StepSpans(starts, ends, tids)
    return spans, next_tid


def _transfer_events(transfers: pd.DataFrame, pid: int, events: list[Event], *,
                     first_tid: int) -> tuple[dict[int, tuple[int, float, float]], int]:
    """Transfer slices on link lanes.

    Returns request id -> (tid, start_us, end_us), and the next unused thread id.
    """
    out: dict[int, tuple[int, float, float]] = {}
    events.append(_meta(pid, "process_name", "links (KV hand-offs)"))
    events.append(_meta(pid, "process_sort_index", pid))
    next_tid = first_tid
    if not len(transfers):
        return out, next_tid
    for link, group in transfers.sort_values(["link_name", "start_s"], kind="stable").groupby(
            "link_name", sort=True):
        lanes = _Lanes()
        lane_tid: dict[int, int] = {}
        for row in group.to_dict("records"):
            ts, end = _us(row["start_s"]), _us(row["end_s"])
            lane = lanes.place(ts, end)
            if lane not in lane_tid:
                lane_tid[lane] = next_tid
                label = str(link) if lane == 0 else f"{link} [{lane + 1}]"
                events.append(_meta(pid, "thread_name", label, next_tid))
                events.append(_meta(pid, "thread_sort_index", next_tid, next_tid))
                next_tid += 1
            tid = lane_tid[lane]
            rid = int(row["request_id"])
            out[rid] = (tid, ts, end)
            events.append({
                "ph": "X", "name": f"KV r{rid}", "cat": "transfer", "ts": ts,
                "dur": round(end - ts, 3), "pid": pid, "tid": tid,
                "args": {"request_id": rid, "MB": round(float(row["bytes"]) / 1e6, 3),
                         "source": str(row["source_name"]),
                         "destination": str(row["destination_name"]),
                         "exposed_ms": round(float(row["exposed_s"]) * 1e3, 6)},
            })
    return out, next_tid


_PHASES = (  # (label, start column, end column)
    ("queue", "arrival_s", "prefill_start_s"),
    ("prefill", "prefill_start_s", "prefill_end_s"),
    ("KV transfer", "transfer_start_s", "transfer_end_s"),
    ("decode", "decode_start_s", "completion_s"),
)


def _request_events(requests: pd.DataFrame, pid: int, events: list[Event], *,
                    first_tid: int) -> int:
    """A span per request (arrival to its last known time) with its phases nested inside.

    Returns the next unused thread id.
    """
    events.append(_meta(pid, "process_name", "requests"))
    events.append(_meta(pid, "process_sort_index", pid))
    if not len(requests):
        return first_tid
    time_cols = [c for c in ("arrival_s", "prefill_start_s", "prefill_end_s", "first_token_s",
                             "transfer_start_s", "transfer_end_s", "decode_start_s",
                             "completion_s") if c in requests]
    last = requests[time_cols].max(axis=1, skipna=True)
    order = requests.assign(_end=last).sort_values(["arrival_s", "request_id"], kind="stable")
    lanes = _Lanes()
    named: set[int] = set()
    for row in order.to_dict("records"):
        ts, end = _us(row["arrival_s"]), _us(row["_end"])
        lane = lanes.place(ts, end)
        tid = first_tid + lane
        if tid not in named:
            named.add(tid)
            events.append(_meta(pid, "thread_name", f"requests [{lane + 1}]", tid))
            events.append(_meta(pid, "thread_sort_index", lane, tid))
        rid = int(row["request_id"])
        args: dict[str, Any] = {
            k: (row[k].item() if hasattr(row[k], "item") else row[k])
            for k in ("prompt_tokens", "output_tokens", "generated_tokens", "preemptions",
                      "status") if k in row}
        for key in ("prefill_instance_name", "decode_instance_name", "reason"):
            if row.get(key):
                args[key] = str(row[key])
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            if _finite(row.get(key)):
                args[key.replace("_s", "_ms")] = round(float(row[key]) * 1e3, 6)
        events.append({"ph": "X", "name": f"r{rid} {row['status']}", "cat": "request",
                       "ts": ts, "dur": round(end - ts, 3), "pid": pid, "tid": tid,
                       "args": args})
        cursor = ts
        for label, a, b in _PHASES:
            if not (_finite(row.get(a)) and _finite(row.get(b))):
                continue
            p0, p1 = _us(row[a]), _us(row[b])
            # Children must nest in the span and not overlap each other; a layer-wise
            # transfer overlaps prefill and is left to the link track.
            if p0 < cursor or p1 > end or p1 < p0:
                continue
            events.append({"ph": "X", "name": label, "cat": "request_phase", "ts": p0,
                           "dur": round(p1 - p0, 3), "pid": pid, "tid": tid,
                           "args": {"request_id": rid}})
            cursor = p1
    return first_tid + lanes.count


def _flow_events(requests: pd.DataFrame, transfers: pd.DataFrame, *,
                 step_spans: dict[str, _StepSpans],
                 transfer_spans: dict[int, tuple[int, float, float]],
                 inst_pid: dict[str, int], links_pid: int, events: list[Event]) -> None:
    """Arrows: prefill step -> KV transfer on its link -> decode step, one per hand-off.

    Each end sits at the midpoint of its step, so it binds to that slice (the format binds
    a flow event to the slice enclosing it on its thread).
    """
    if not len(requests) or not len(transfers):
        return
    handed = requests[requests["request_id"].isin(transfers["request_id"])]
    for row in handed.to_dict("records"):
        src, dst = str(row["prefill_instance_name"]), str(row["decode_instance_name"])
        if src not in step_spans or dst not in step_spans:
            continue
        if not (_finite(row["prefill_end_s"]) and _finite(row["decode_start_s"])):
            continue
        start = step_spans[src].ending_at(_us(row["prefill_end_s"]))
        finish = step_spans[dst].starting_at(_us(row["decode_start_s"]))
        if start is None or finish is None or finish[0] <= start[0]:
            continue
        rid = int(row["request_id"])
        common = {"name": _FLOW_NAME, "cat": _FLOW_CAT, "id": rid}
        events.append({"ph": "s", "ts": start[0], "pid": inst_pid[src], "tid": start[1],
                       **common})
        span = transfer_spans.get(rid)
        if span is not None:
            tid, t0, t1 = span
            mid = round((t0 + t1) / 2, 3)
            if start[0] < mid < finish[0] and t1 > t0:
                events.append({"ph": "t", "ts": mid, "pid": links_pid, "tid": tid, **common})
        events.append({"ph": "f", "bp": "e", "ts": finish[0], "pid": inst_pid[dst],
                       "tid": finish[1], **common})


def write_trace(result: RunResult, path: str | Path, *, counters: bool = True) -> Path:
    """Write ``result`` as a trace-event JSON file; returns the path."""
    out = Path(path)
    if out.parent != Path():
        out.parent.mkdir(parents=True, exist_ok=True)
    trace = build_trace(result, counters=counters)
    # json.dumps uses the C encoder; json.dump to a file would encode in Python (5x slower)
    out.write_text(json.dumps(trace, separators=(",", ":"), allow_nan=False), encoding="utf-8")
    return out
