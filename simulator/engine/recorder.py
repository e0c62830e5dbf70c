"""Plain, compact records of a run, turned into DataFrames once at the end.

Steps are recorded at the granularity ``simulation.record_steps`` asks for (see
:data:`RECORD_STEPS`). Under ``stretches`` and ``none`` a fast-forward stretch (a run of
identical-batch decode steps) is kept as one row of what is constant over it (instance,
sequences, queue, the first step's context) plus five per-step numbers (start, duration,
compute and memory seconds, bound, KV used): 29 bytes a step instead of 81. The steps
frame expanded from them equals the per-step frame of ``all`` bit for bit, so every metric
computed from it is identical.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pandas as pd

from simulator.engine.request_log import REQUEST_COLUMN_NAMES, REQUEST_FIELDS, RequestLog
from simulator.metrics.compact import ROW_COLUMNS, CompactSteps

__all__ = ["BOUNDS", "RECORD_STEPS", "REQUEST_COLUMN_NAMES", "REQUEST_FIELDS", "Recorder",
           "RequestLog"]

Column: TypeAlias = "np.ndarray | array[Any] | Sequence[Any]"
"""Per-step values: a numpy array, an ``array`` or a list."""
Plain: TypeAlias = "list[Any] | array[Any]"
"""Per-step values as a list, or an ``array`` of the column's own type code."""

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

RECORD_STEPS = ("all", "stretches", "none")
"""``all``: one row per step, as recorded; ``stretches``: one row per fast-forward stretch
plus its per-step times, the steps frame expanded on demand; ``none``: the same compact
records during the run, and no steps frame in the result (the summary is computed first)."""

# One row per stretch: what is constant over its steps. ``row_at`` is the number of
# ordinary step rows recorded before it (where its steps go in the expanded frame);
# ``offset`` where its per-step values start in STRETCH_STEP_COLUMNS.
STRETCH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("instance", "i"),
    ("steps", "i"),
    ("decode_seqs", "i"),
    ("decode_ctx_start", "q"),
    ("kv_total_blocks", "i"),
    ("queue_len", "i"),
    ("running", "i"),
    ("queue_len_last", "i"),
    ("running_last", "i"),
    ("row_at", "q"),
)
STRETCH_STEP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("start_s", "d"),
    ("duration_s", "d"),
    ("compute_s", "f"),
    ("memory_s", "f"),
    ("bound", "b"),
    ("kv_used_blocks", "i"),
)

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
    """Column arrays for steps and transfers; requests in a :class:`RequestLog` (objects
    while in flight, plain values once ended)."""

    def __init__(self, record_steps: str = "all") -> None:
        if record_steps not in RECORD_STEPS:
            raise ValueError(f"record_steps must be one of {', '.join(RECORD_STEPS)}, "
                             f"not {record_steps!r}")
        self.record_steps = record_steps
        self.steps: dict[str, array[Any]] = {name: array(code) for name, code in STEP_COLUMNS}
        # Each table's arrays in its columns' order (the ``_arrays`` tuples), unpacked at once
        # by the writers: one tuple unpacking instead of a dict lookup per column.
        self._step_arrays = tuple(self.steps.values())
        self.stretches: dict[str, array[Any]] = {
            name: array(code) for name, code in STRETCH_COLUMNS}
        self.stretch_steps: dict[str, array[Any]] = {
            name: array(code) for name, code in STRETCH_STEP_COLUMNS}
        self._stretch_arrays = tuple(self.stretches.values())
        self._stretch_step_arrays = tuple(self.stretch_steps.values())
        self.transfers: dict[str, array[Any]] = {
            name: array(code) for name, code in TRANSFER_COLUMNS}
        self._transfer_arrays = tuple(self.transfers.values())
        self.requests = RequestLog()
        self.events: list[tuple[float, str, str]] = []

    def step(self, instance: int, start_s: float, duration_s: float, busy_s: float,
             prefill_tokens: int,
             prefill_seqs: int, decode_seqs: int, decode_ctx_tokens: int, kv_used: int,
             kv_total: int, queue_len: int, running: int, bound: str, compute_s: float,
             memory_s: float, decode_tokens: int | None = None) -> None:
        (inst, start, dur, busy, p_tokens, p_seqs, d_seqs, d_ctx, kv_used_col, kv_total_col,
         queue, run, bound_col, comp, mem, d_tokens) = self._step_arrays
        inst.append(instance)
        start.append(start_s)
        dur.append(duration_s)
        busy.append(busy_s)
        p_tokens.append(prefill_tokens)
        p_seqs.append(prefill_seqs)
        d_seqs.append(decode_seqs)
        d_ctx.append(decode_ctx_tokens)
        kv_used_col.append(kv_used)
        kv_total_col.append(kv_total)
        queue.append(queue_len)
        run.append(running)
        bound_col.append(_BOUND_CODE[bound])
        comp.append(compute_s)
        mem.append(memory_s)
        d_tokens.append(decode_seqs if decode_tokens is None else decode_tokens)

    def steps_bulk(self, instance: int, starts: Sequence[float], durations: Column,
                   decode_seqs: int, decode_ctx: Sequence[int], kv_used: Sequence[int],
                   kv_total: int, queue_len: Sequence[int], running: Sequence[int],
                   bounds: Column, compute_s: Column, memory_s: Column) -> None:
        """Rows of ``len(starts)`` consecutive decode-only steps (a fast-forward jump).

        The per-step values come as lists or numpy arrays (the priced series)."""
        n = len(starts)
        if self.record_steps != "all" and n:
            self._stretch(instance, starts, durations, decode_seqs, decode_ctx, kv_used,
                          kv_total, queue_len, running, bounds, compute_s, memory_s)
            return
        (inst, start, dur, busy, p_tokens, p_seqs, d_seqs, d_ctx, kv_used_col, kv_total_col,
         queue, run, bound_col, comp, mem, d_tokens) = self._step_arrays
        # Constant columns as a one-value array repeated, the priced columns as their bytes
        # where their numpy type is the column's: fewer interpreted steps per jump than
        # lists of Python numbers (the values are the same, bit for bit).
        inst.extend(array("i", (instance,)) * n)
        start.extend(starts)
        _extend(dur, durations)
        _extend(busy, durations)  # one stage: the device is busy all step
        zeros = array("i", (0,)) * n
        p_tokens.extend(zeros)
        p_seqs.extend(zeros)
        d_seqs.extend(array("i", (decode_seqs,)) * n)
        d_ctx.extend(decode_ctx)
        kv_used_col.extend(kv_used)
        kv_total_col.extend(array("i", (kv_total,)) * n)
        queue.extend(queue_len)
        run.extend(running)
        _extend(bound_col, bounds)
        _extend(comp, compute_s)
        _extend(mem, memory_s)
        d_tokens.extend(array("q", (decode_seqs,)) * n)

    def _stretch(self, instance: int, starts: Sequence[float], durations: Column,
                 decode_seqs: int, decode_ctx: Sequence[int], kv_used: Sequence[int],
                 kv_total: int, queue_len: Sequence[int], running: Sequence[int],
                 bounds: Column, compute_s: Column, memory_s: Column) -> None:
        """One stretch row; only the last step's queue and batch may differ (a cut)."""
        n = len(starts)
        q0, r0, c0 = queue_len[0], running[0], decode_ctx[0]
        if n > 1 and (list(queue_len[:-1]).count(q0) != n - 1
                      or list(running[:-1]).count(r0) != n - 1
                      or not (decode_ctx.step == decode_seqs if isinstance(decode_ctx, range)
                              else all(decode_ctx[j] == c0 + decode_seqs * j
                                       for j in range(n)))):
            raise ValueError("a stretch's steps must share queue, batch and context growth")
        codes = dict(STRETCH_STEP_COLUMNS)
        self.stretch(instance, _plain(starts, codes["start_s"]),
                     _plain(durations, codes["duration_s"]), decode_seqs, int(c0),
                     _plain(kv_used, codes["kv_used_blocks"]), kv_total, int(q0), int(r0),
                     int(queue_len[-1]), int(running[-1]), _plain(bounds, codes["bound"]),
                     _plain(compute_s, codes["compute_s"]), _plain(memory_s, codes["memory_s"]))

    def stretch(self, instance: int, starts: Plain, durations: Plain, decode_seqs: int,
                ctx_start: int, kv_used: Plain, kv_total: int, queue_len: int, running: int,
                queue_last: int, running_last: int, bounds: Plain, compute_s: Plain,
                memory_s: Plain) -> None:
        """One stretch row of ``len(starts)`` decode-only steps (``record_steps`` other than
        ``all``): their context sum starts at ``ctx_start`` and grows by ``decode_seqs`` a
        step; every step but the last has ``queue_len`` queued and ``running`` running, the
        last ``queue_last`` and ``running_last``. :meth:`steps_bulk` checks that its
        per-step values are such a stretch; a jump records its steps here directly.

        Each per-step column comes as a list or an ``array`` of its own type code in
        :data:`STRETCH_STEP_COLUMNS` (what a jump holds: its priced series), appended as
        it is."""
        (inst, steps, seqs, ctx_col, total, queue, run, queue_last_col, run_last,
         row_at) = self._stretch_arrays
        inst.append(instance)
        steps.append(len(starts))
        seqs.append(decode_seqs)
        ctx_col.append(ctx_start)
        total.append(kv_total)
        queue.append(queue_len)
        run.append(running)
        queue_last_col.append(queue_last)
        run_last.append(running_last)
        row_at.append(len(self._step_arrays[0]))
        start, dur, comp, mem, bound, used = self._stretch_step_arrays
        start.extend(starts)
        dur.extend(durations)
        comp.extend(compute_s)
        mem.extend(memory_s)
        bound.extend(bounds)
        used.extend(kv_used)

    def transfer(self, request_id: int, source: int, destination: int, link: int,
                 nbytes: float, start_s: float, end_s: float, exposed_s: float) -> None:
        ids, src, dst, links, sizes, starts, ends, exposed = self._transfer_arrays
        ids.append(request_id)
        src.append(source)
        dst.append(destination)
        links.append(link)
        sizes.append(nbytes)
        starts.append(start_s)
        ends.append(end_s)
        exposed.append(exposed_s)

    def event(self, time_s: float, kind: str, detail: str) -> None:
        self.events.append((time_s, kind, detail))

    # ----- frames ----------------------------------------------------------------------
    def steps_frame(self, instance_names: list[str], pool_names: list[str],
                    columns: tuple[str, ...] | None = None,
                    instance: int | None = None) -> pd.DataFrame:
        """One row per step in the order recorded, stretches expanded in place.

        ``columns`` keeps only these recorded columns (plus the instance's name and pool,
        and ``end_s`` only if named), for a caller that needs a few of them from a large
        run; ``instance`` only that instance's rows (the frame's rows of that instance, in
        order, with a fresh index).
        """
        cols = self._step_columns(columns, instance)
        df = pd.DataFrame(cols, copy=False)
        if "bound" in df:
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
        if "start_s" in df and "duration_s" in df and (columns is None or "end_s" in columns):
            df["end_s"] = df["start_s"] + df["duration_s"]
        return df

    def compact_steps(self, instance_names: list[str], pool_names: list[str]) -> CompactSteps:
        """The steps as kept, for the summary: the ordinary rows' columns it reads, and the
        stretches with their per-step times (views of the records, nothing expanded)."""
        rows = pd.DataFrame({k: _column(self.steps[k]) for k in ROW_COLUMNS}, copy=False)
        pools = list(dict.fromkeys(pool_names))
        pool_of = np.asarray([pools.index(p) for p in pool_names], dtype=np.int64)
        codes = rows["instance"].to_numpy()
        rows["pool"] = pd.Categorical.from_codes(pool_of[codes] if len(codes) else codes,
                                                 categories=pd.Index(pools))
        t, p = self.stretches, self.stretch_steps
        return CompactSteps(rows, _column(t["instance"]), _column(t["steps"]),
                            _column(t["decode_seqs"]), _column(t["row_at"]),
                            _column(p["start_s"]), _column(p["duration_s"]), pool_of)

    def stretches_frame(self, instance_names: list[str], pool_names: list[str]) -> pd.DataFrame:
        """One row per fast-forward stretch recorded compactly (``stretches``/``none``).

        ``start_s``/``end_s`` span its steps; ``kv_used_start``/``kv_used_end`` are the KV
        of its first and last step (each after its own allocation); ``queue_len`` and
        ``running`` hold for every step but the last, which records ``*_last`` (the state
        when the stretch was cut); ``busy_s`` is the sum of its step durations.
        """
        t = {k: _column(v) for k, v in self.stretches.items()}
        p = {k: _column(v) for k, v in self.stretch_steps.items()}
        counts = t["steps"].astype(np.int64)
        first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        last = first + counts - 1
        df = pd.DataFrame({k: v for k, v in t.items() if k != "row_at"})
        names = np.asarray(instance_names, dtype=object)
        pools = np.asarray(pool_names, dtype=object)
        inst = t["instance"]
        df.insert(1, "instance_name", names[inst] if len(inst) else [])
        df.insert(2, "pool", pools[inst] if len(inst) else [])
        if len(counts):
            df["start_s"] = p["start_s"][first]
            df["end_s"] = p["start_s"][last] + p["duration_s"][last]
            df["busy_s"] = np.add.reduceat(p["duration_s"], first)
            df["kv_used_start"] = p["kv_used_blocks"][first]
            df["kv_used_end"] = p["kv_used_blocks"][last]
        else:
            for col in ("start_s", "end_s", "busy_s", "kv_used_start", "kv_used_end"):
                df[col] = []
        return df

    def _step_columns(self, columns: tuple[str, ...] | None = None,
                      instance: int | None = None) -> dict[str, np.ndarray]:
        names = [n for n, _ in STEP_COLUMNS
                 if columns is None or n in columns or n == "instance"]
        cols = {k: _column(self.steps[k]) for k in names}
        t = {k: _column(v) for k, v in self.stretches.items()}
        p = {k: _column(v) for k, v in self.stretch_steps.items()}
        if instance is not None:
            cols, t, p = _one_instance(cols, t, p, instance)
        if not len(t["instance"]):
            return cols
        counts = t["steps"].astype(np.int64)
        total_stretch = int(counts.sum())
        n_rows = len(cols["instance"])
        # Where each stretch's first step and each ordinary row go in the expanded frame:
        # a stretch follows the ``row_at`` ordinary rows recorded before it, plus the steps
        # of the stretches before it; an ordinary row follows the stretches recorded
        # before it.
        before = np.concatenate(([0], np.cumsum(counts)[:-1]))
        first = t["row_at"] + before
        # Row positions fit 4 bytes on any run below 2**31 steps (half the temporaries).
        pos = np.int32 if n_rows + total_stretch < 2**31 else np.int64
        which = np.repeat(np.arange(len(counts), dtype=pos), counts)  # stretch of each step
        within = np.arange(total_stretch, dtype=pos) - before.astype(pos)[which]
        stretch_pos = first.astype(pos)[which] + within
        is_stretch = np.zeros(n_rows + total_stretch, dtype=bool)
        is_stretch[stretch_pos] = True
        last = within == counts.astype(pos)[which] - 1
        out: dict[str, np.ndarray] = {}
        for name, code in STEP_COLUMNS:
            if name not in cols:
                continue
            full = np.empty(n_rows + total_stretch, dtype=np.dtype(code))
            full[~is_stretch] = cols[name]
            if name in p:
                values = p[name]
            elif name == "instance":
                values = t["instance"][which]
            elif name == "busy_s":
                values = p["duration_s"]  # one stage: the device is busy all step
            elif name in ("prefill_tokens", "prefill_seqs"):
                values = np.zeros(total_stretch, dtype=np.int64)
            elif name in ("decode_seqs", "decode_tokens"):
                values = t["decode_seqs"][which]
            elif name == "decode_ctx_tokens":
                values = t["decode_ctx_start"][which] + t["decode_seqs"][which].astype(
                    np.int64) * within
            elif name in ("queue_len", "running"):
                values = np.where(last, t[f"{name}_last"][which], t[name][which])
            else:  # kv_total_blocks
                values = t[name][which]
            # Per-step values were appended stretch after stretch: already in this order.
            full[stretch_pos] = values
            out[name] = full
        return out

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
        """One row per request, by id (stable: as recorded among equal ids); see
        :mod:`simulator.engine.request_log`."""
        return self.requests.frame(instance_names)


def _one_instance(cols: dict[str, np.ndarray], t: dict[str, np.ndarray],
                  p: dict[str, np.ndarray], instance: int
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The records of one instance, laid out as a recorder of its own would hold them."""
    rows = np.flatnonzero(cols["instance"] == instance)
    mine = t["instance"] == instance
    counts = t["steps"].astype(np.int64)
    first = np.cumsum(counts) - counts
    n = counts[mine]
    steps = np.repeat(first[mine] - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
    sub_t = {k: v[mine] for k, v in t.items()}
    # A stretch follows the instance's rows recorded before it.
    sub_t["row_at"] = np.searchsorted(rows, t["row_at"][mine], side="left")
    return ({k: v[rows] for k, v in cols.items()}, sub_t, {k: v[steps] for k, v in p.items()})


def _extend(col: array[Any], values: Column) -> None:
    """Append ``values`` to ``col``: an ``array`` or numpy array of the column's own type
    at once, anything else (lists, other types) value by value, as ``array`` converts it."""
    if type(values) is list or (type(values) is array and values.typecode == col.typecode):
        col.extend(values)  # a jump's lists and priced series: at once
        return
    if isinstance(values, array):
        col.extend(values if values.typecode == col.typecode else values.tolist())
        return
    if isinstance(values, np.ndarray):
        if values.dtype.char == col.typecode:
            col.frombytes(values.tobytes())
            return
        values = values.tolist()
    col.extend(values)


def _plain(values: Column, code: str) -> Plain:
    """``values`` as :meth:`Recorder.stretch` takes them: a list, or an ``array`` of type
    code ``code`` (converted as :func:`_extend` converts them)."""
    if type(values) is list or (isinstance(values, array) and values.typecode == code):
        return values  # type: ignore[return-value]
    return values.tolist() if isinstance(values, (array, np.ndarray)) else list(values)


def _column(values: array[Any]) -> np.ndarray:
    return (np.frombuffer(values, dtype=values.typecode) if len(values)
            else np.array([], dtype=values.typecode))
