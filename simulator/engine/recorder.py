"""Plain, compact records of a run, turned into DataFrames once at the end."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pandas as pd

from simulator.engine.request import Request

# Compact column types: 4-byte counters, 8-byte times (a million-request run has tens of
# millions of steps, so every byte per row counts).
STEP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("instance", "i"),
    ("start_s", "d"),
    ("duration_s", "d"),
    ("busy_s", "d"),
    ("prefill_tokens", "i"),
    ("prefill_seqs", "i"),
    ("decode_seqs", "i"),
    ("decode_ctx_tokens", "q"),
    ("kv_used_blocks", "i"),
    ("kv_total_blocks", "i"),
    ("queue_len", "i"),
    ("running", "i"),
    ("bound", "b"),
    ("compute_s", "f"),
    ("memory_s", "f"),
    ("decode_tokens", "q"),
)
BOUNDS = ("compute", "memory", "communication", "overhead")
_BOUND_CODE = {name: i for i, name in enumerate(BOUNDS)}

TRANSFER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("request_id", "l"),
    ("source", "l"),
    ("destination", "l"),
    ("link", "l"),
    ("bytes", "d"),
    ("start_s", "d"),
    ("end_s", "d"),
    ("exposed_s", "d"),
)


class Recorder:
    """Column arrays for steps and transfers; requests are kept as objects."""

    def __init__(self) -> None:
        self.steps: dict[str, array[Any]] = {name: array(code) for name, code in STEP_COLUMNS}
        self.transfers: dict[str, array[Any]] = {
            name: array(code) for name, code in TRANSFER_COLUMNS}
        self.requests: list[Request] = []
        self.events: list[tuple[float, str, str]] = []

    def step(self, instance: int, start_s: float, duration_s: float, busy_s: float,
             prefill_tokens: int,
             prefill_seqs: int, decode_seqs: int, decode_ctx_tokens: int, kv_used: int,
             kv_total: int, queue_len: int, running: int, bound: str, compute_s: float,
             memory_s: float, decode_tokens: int | None = None) -> None:
        s = self.steps
        s["instance"].append(instance)
        s["start_s"].append(start_s)
        s["duration_s"].append(duration_s)
        s["busy_s"].append(busy_s)
        s["prefill_tokens"].append(prefill_tokens)
        s["prefill_seqs"].append(prefill_seqs)
        s["decode_seqs"].append(decode_seqs)
        s["decode_ctx_tokens"].append(decode_ctx_tokens)
        s["kv_used_blocks"].append(kv_used)
        s["kv_total_blocks"].append(kv_total)
        s["queue_len"].append(queue_len)
        s["running"].append(running)
        s["bound"].append(_BOUND_CODE[bound])
        s["compute_s"].append(compute_s)
        s["memory_s"].append(memory_s)
        s["decode_tokens"].append(decode_seqs if decode_tokens is None else decode_tokens)

    def steps_bulk(self, instance: int, starts: np.ndarray, durations: np.ndarray,
                   decode_seqs: int, decode_ctx: np.ndarray, kv_used: np.ndarray,
                   kv_total: int, queue_len: np.ndarray, running: np.ndarray, bounds: np.ndarray,
                   compute_s: np.ndarray, memory_s: np.ndarray) -> None:
        """Rows of ``len(starts)`` consecutive decode-only steps (a fast-forward jump)."""
        n = len(starts)
        s = self.steps
        s["instance"].extend([instance] * n)
        s["start_s"].extend(starts.tolist())
        s["duration_s"].extend(durations.tolist())
        s["busy_s"].extend(durations.tolist())  # one stage: the device is busy all step
        s["prefill_tokens"].extend([0] * n)
        s["prefill_seqs"].extend([0] * n)
        s["decode_seqs"].extend([decode_seqs] * n)
        s["decode_ctx_tokens"].extend(np.asarray(decode_ctx, dtype=np.int64).tolist())
        s["kv_used_blocks"].extend(np.asarray(kv_used, dtype=np.int64).tolist())
        s["kv_total_blocks"].extend([kv_total] * n)
        s["queue_len"].extend(np.asarray(queue_len, dtype=np.int64).tolist())
        s["running"].extend(np.asarray(running, dtype=np.int64).tolist())
        s["bound"].extend(np.asarray(bounds, dtype=np.int8).tolist())
        s["compute_s"].extend(np.asarray(compute_s, dtype=float).tolist())
        s["memory_s"].extend(np.asarray(memory_s, dtype=float).tolist())
        s["decode_tokens"].extend([decode_seqs] * n)

    def transfer(self, request_id: int, source: int, destination: int, link: int,
                 nbytes: float, start_s: float, end_s: float, exposed_s: float) -> None:
        t = self.transfers
        t["request_id"].append(request_id)
        t["source"].append(source)
        t["destination"].append(destination)
        t["link"].append(link)
        t["bytes"].append(nbytes)
        t["start_s"].append(start_s)
        t["end_s"].append(end_s)
        t["exposed_s"].append(exposed_s)

    def event(self, time_s: float, kind: str, detail: str) -> None:
        self.events.append((time_s, kind, detail))

    # ----- frames ----------------------------------------------------------------------
    def steps_frame(self, instance_names: list[str], pool_names: list[str]) -> pd.DataFrame:
        cols: dict[str, Any] = {k: np.frombuffer(v, dtype=v.typecode) if len(v) else
                                np.array([], dtype=v.typecode) for k, v in self.steps.items()}
        df = pd.DataFrame(cols, copy=False)
        df["bound"] = pd.Categorical.from_codes(df["bound"].to_numpy(np.int8),
                                                categories=pd.Index(list(BOUNDS)))
        codes = df["instance"].to_numpy()
        # Names as categoricals: one small int per row instead of an object pointer.
        df.insert(1, "instance_name", pd.Series(pd.Categorical.from_codes(
            codes, categories=pd.Index(instance_names)), index=df.index))
        pools = list(dict.fromkeys(pool_names))
        pool_codes = np.asarray([pools.index(p) for p in pool_names], dtype=np.int32)
        df.insert(2, "pool", pd.Series(pd.Categorical.from_codes(
            pool_codes[codes] if len(codes) else codes, categories=pd.Index(pools)),
            index=df.index))
        df["end_s"] = df["start_s"] + df["duration_s"]
        return df

    def transfers_frame(self, instance_names: list[str], link_names: list[str]) -> pd.DataFrame:
        cols = {k: np.frombuffer(v, dtype=v.typecode) if len(v) else
                np.array([], dtype=v.typecode) for k, v in self.transfers.items()}
        df = pd.DataFrame(cols)
        names = np.asarray(instance_names, dtype=object)
        df["source_name"] = names[df["source"].to_numpy()] if len(df) else []
        df["destination_name"] = names[df["destination"].to_numpy()] if len(df) else []
        df["link_name"] = (np.asarray(link_names, dtype=object)[df["link"].to_numpy()]
                           if len(df) else [])
        df["duration_s"] = df["end_s"] - df["start_s"]
        return df

    def requests_frame(self, instance_names: list[str]) -> pd.DataFrame:
        reqs = self.requests
        fields = ("id", "arrival_s", "prompt_tokens", "output_tokens", "generated",
                  "prefix_tokens", "cached_tokens", "prefill_saved_s", "prefill_start_s",
                  "prefill_end_s", "first_token_s", "transfer_wait_s", "transfer_start_s",
                  "transfer_end_s", "decode_admit_s", "decode_start_s", "second_token_s",
                  "completion_s", "preemptions", "restarts", "prefill_instance",
                  "decode_instance", "status", "reason", "session", "turn",
                  "dram_hit_tokens", "ssd_hit_tokens", "remote_hit_tokens", "kv_load_s",
                  "decode_cached_tokens")
        data = {f: [getattr(r, f) for r in reqs] for f in fields}
        data["status"] = [s.value for s in data["status"]]  # plain strings, not State
        df = pd.DataFrame(data)
        df = df.rename(columns={"id": "request_id", "generated": "generated_tokens"})
        names = np.asarray([*instance_names, ""], dtype=object)
        df["prefill_instance_name"] = names[df["prefill_instance"].to_numpy()] if len(df) else []
        df["decode_instance_name"] = names[df["decode_instance"].to_numpy()] if len(df) else []
        return df.sort_values("request_id", kind="stable").reset_index(drop=True)
