"""Steps as a run keeps them: ordinary rows plus decode stretches, never expanded.

``simulation.record_steps: stretches`` keeps a fast-forward stretch (identical-batch decode
steps on one single-stage instance) as one row plus each step's start and duration. The
steps frame expands them in place: ordinary row ``r`` follows the stretch steps recorded
before it, and stretch ``k`` follows the ``row_at[k]`` ordinary rows recorded before it.
The functions here compute what the summary reads from the steps (inter-token gaps and
their weights, device seconds per pool, the last step's end) from that form directly,
with the same floating-point operations in the same order as on the expanded frame, so
every figure is the same float under every setting. Per-step temporaries are bounded by
:data:`CHUNK` steps; the outputs are one array per step of the frame's order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

CHUNK = 1 << 20
"""Stretch steps handled at once (bounds the per-step temporaries)."""

ROW_COLUMNS = ("instance", "start_s", "duration_s", "busy_s", "decode_seqs", "decode_tokens")
"""The ordinary step columns the summary reads (plus ``pool``, a categorical)."""


@dataclass(frozen=True)
class CompactSteps:
    """Ordinary step rows plus stretches (see the module docstring).

    ``rows`` holds :data:`ROW_COLUMNS` and ``pool`` (categories: every pool, in order) in
    recorded order; per stretch ``instance``, ``steps``, ``decode_seqs`` and ``row_at``;
    per stretch step ``start_s`` and ``duration_s``, stretch after stretch. A stretch's
    device time per device is its duration (one stage), its decode tokens its sequences.
    """

    rows: pd.DataFrame
    instance: np.ndarray
    steps: np.ndarray
    decode_seqs: np.ndarray
    row_at: np.ndarray
    start_s: np.ndarray
    duration_s: np.ndarray
    pool_of_instance: np.ndarray

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, pool_of_instance: np.ndarray) -> CompactSteps:
        """A steps frame as it is: every step an ordinary row, no stretches."""
        empty_i = np.zeros(0, dtype=np.int64)
        empty_f = np.zeros(0)
        return cls(frame, empty_i, empty_i, empty_i, empty_i, empty_f, empty_f,
                   np.asarray(pool_of_instance, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.rows) + int(self.steps.sum())

    @property
    def pools(self) -> list[str]:
        return list(self.rows["pool"].cat.categories)

    # ----- layout -------------------------------------------------------------------
    def _first_step(self) -> np.ndarray:
        """Index (among stretch steps) of each stretch's first step."""
        counts = self.steps.astype(np.int64)
        return np.cumsum(counts) - counts

    def row_positions(self) -> np.ndarray:
        """Where each ordinary row sits in the expanded frame."""
        n = len(self.rows)
        if not len(self.steps):
            return np.arange(n, dtype=np.int64)
        cum = np.concatenate(([0], np.cumsum(self.steps.astype(np.int64))))
        r = np.arange(n, dtype=np.int64)
        return r + cum[np.searchsorted(self.row_at, r, side="right")]

    def stretch_chunks(self) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
        """``(steps, stretch of each, frame position of each)`` for chunks of stretch steps.

        Stretch step ``i`` of stretch ``k`` sits at ``i + row_at[k]`` in the frame.
        """
        total = int(self.steps.sum())
        if not total:
            return
        ends = np.cumsum(self.steps.astype(np.int64))
        row_at = self.row_at.astype(np.int64)
        for a in range(0, total, CHUNK):
            b = min(a + CHUNK, total)
            idx = np.arange(a, b, dtype=np.int64)
            which = np.searchsorted(ends, idx, side="right")
            yield slice(a, b), which, idx + row_at[which]

    def expanded(self, row_values: np.ndarray, stretch_values: np.ndarray | None,
                 per_stretch: np.ndarray | None = None, dtype: type | None = None,
                 extra: int = 0) -> np.ndarray:
        """One value per step in the frame's order (plus ``extra`` zeros at the end).

        Stretch steps take ``stretch_values`` (one per stretch step) or ``per_stretch``
        (one per stretch).
        """
        out = np.zeros(len(self) + extra, dtype=dtype or np.asarray(row_values).dtype)
        if not len(self.steps):
            out[:len(self.rows)] = row_values
            return out
        out[self.row_positions()] = row_values
        for part, which, pos in self.stretch_chunks():
            out[pos] = (stretch_values[part] if stretch_values is not None
                        else per_stretch[which])  # type: ignore[index]
        return out

    # ----- what the summary reads ------------------------------------------------------
    def last_end(self) -> float:
        """The latest step end, ``max(start_s + duration_s)`` over every step."""
        best = -np.inf
        if len(self.rows):
            best = float((self.rows["start_s"] + self.rows["duration_s"]).max())
        for part, _, _ in self.stretch_chunks():
            best = max(best, float((self.start_s[part] + self.duration_s[part]).max()))
        return best

    def since(self, t: float) -> CompactSteps:
        """The steps that start at or after ``t`` (a run's warm-up left out)."""
        keep_rows = (self.rows["start_s"] >= t).to_numpy()
        keep_steps = self.start_s >= t
        kept_before = np.concatenate(([0], np.cumsum(keep_rows)))
        counts = (np.add.reduceat(keep_steps.astype(np.int64), self._first_step())
                  if len(self.steps) else self.steps)
        live = counts > 0
        return CompactSteps(self.rows[keep_rows], self.instance[live], counts[live],
                            self.decode_seqs[live], kept_before[self.row_at[live]],
                            self.start_s[keep_steps], self.duration_s[keep_steps],
                            self.pool_of_instance)

    def itl(self) -> tuple[np.ndarray, np.ndarray, int]:
        """``(gaps, sequences, burst)``: each step's inter-token gap and the sequences it
        advances, in the frame's order, and the zero gaps of speculative bursts.

        The gaps are :func:`simulator.metrics.summary.itl_gaps` of the expanded frame; with
        ``burst > 0`` both arrays carry one more element (gap 0, weight ``burst``).
        """
        rows = self.rows
        row_seqs = rows["decode_seqs"].to_numpy()
        burst = int((rows["decode_tokens"].to_numpy() - row_seqs).sum())
        extra = 1 if burst > 0 else 0
        seqs = self.expanded(row_seqs, None, self.decode_seqs, dtype=_seq_dtype(burst),
                             extra=extra)
        if extra:
            seqs[-1] = burst
        gaps = np.zeros(len(self) + extra)
        row_gaps, first_gaps, whole = self._unit_gaps()
        if len(self.steps):
            gaps[self.row_positions()] = row_gaps
        else:
            gaps[:len(self.rows)] = row_gaps
        first = self._first_step()
        for part, which, pos in self.stretch_chunks():
            s = self.start_s[part]
            e = s + self.duration_s[part]
            prev = np.empty_like(e)
            prev[1:] = e[:-1]
            prev[0] = (self.start_s[part.start - 1] + self.duration_s[part.start - 1]
                       if part.start else np.inf)
            g = np.where(prev <= s, e - prev, e - s)
            starts = first[which] == np.arange(part.start, part.stop)
            g[starts] = first_gaps[which[starts]]
            gaps[pos] = g
        for positions, values in whole:  # instances whose steps end out of order
            gaps[positions] = values
        return gaps, seqs, burst

    def _unit_gaps(self) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """Gaps of the ordinary rows and of each stretch's first step.

        A decoding sequence waits from the end of the previous decode-carrying step of its
        instance. Per instance the decode-carrying rows and stretches ("units") are taken
        in frame order; inside a stretch the previous step is the one before it. An
        instance whose step ends are out of order (overlapping pipeline micro-batches) is
        taken sorted by end, as ``itl_gaps`` does: its rows alone if it has no stretch,
        else its steps expanded (and its gaps returned whole).
        """
        rows = self.rows
        row_gaps = np.zeros(len(rows))
        first_gaps = np.zeros(len(self.steps))
        whole: list[tuple[np.ndarray, np.ndarray]] = []
        r_s = rows["start_s"].to_numpy(dtype=float)
        r_d = rows["duration_s"].to_numpy(dtype=float)
        rid = np.flatnonzero(rows["decode_seqs"].to_numpy() > 0)
        kid = np.flatnonzero(self.decode_seqs > 0)
        inst = np.concatenate((rows["instance"].to_numpy()[rid].astype(np.int64),
                               self.instance[kid].astype(np.int64)))
        order = np.argsort(inst, kind="stable")  # rows first, each in recorded order
        bounds = np.flatnonzero(np.diff(inst[order])) + 1
        del inst
        first = self._first_step()
        has_stretches = len(kid) > 0
        if has_stretches:
            row_pos = self.row_positions()
            mono = self._stretch_monotone()
        n_rid = len(rid)
        for group in np.split(order, bounds):
            g_rows = rid[group[group < n_rid]]
            g_str = kid[group[group >= n_rid] - n_rid]
            if not len(g_str):  # ordinary rows only: itl_gaps on them
                s = r_s[g_rows]
                e = s + r_d[g_rows]
                if len(e) > 1 and (np.diff(e) < 0).any():
                    by_end = np.argsort(e, kind="stable")
                    g_rows, s, e = g_rows[by_end], s[by_end], e[by_end]
                row_gaps[g_rows] = _gaps(s, e, e)
                continue
            last = first[g_str] + self.steps[g_str].astype(np.int64) - 1
            pos = np.concatenate((row_pos[g_rows], self.row_at[g_str].astype(np.int64)
                                  + first[g_str]))
            by_pos = np.argsort(pos, kind="stable")
            k_s = self.start_s[first[g_str]]
            s = np.concatenate((r_s[g_rows], k_s))[by_pos]
            e0 = np.concatenate((r_s[g_rows] + r_d[g_rows],
                                 k_s + self.duration_s[first[g_str]]))[by_pos]
            e1 = np.concatenate((r_s[g_rows] + r_d[g_rows],
                                 self.start_s[last] + self.duration_s[last]))[by_pos]
            if bool(mono[g_str].all()) and not (e0[1:] < e1[:-1]).any():
                g = _gaps(s, e0, e1)
                is_row = by_pos < len(g_rows)
                row_gaps[g_rows[by_pos[is_row]]] = g[is_row]
                first_gaps[g_str[by_pos[~is_row] - len(g_rows)]] = g[~is_row]
            else:
                whole.append(self._expanded_instance_gaps(g_rows, g_str, row_pos))
        return row_gaps, first_gaps, whole

    def _stretch_monotone(self) -> np.ndarray:
        """Per stretch: do its step ends never decrease?"""
        if not len(self.steps):
            return np.zeros(0, dtype=bool)
        bad = np.zeros(len(self.steps), dtype=np.int64)
        first = self._first_step()
        for part, _, _ in self.stretch_chunks():
            lo = max(part.start - 1, 0)
            e = self.start_s[lo:part.stop] + self.duration_s[lo:part.stop]
            drop = e[1:] < e[:-1]  # step i (from lo + 1) ends before step i - 1
            idx = np.arange(lo + 1, part.stop)
            w = np.searchsorted(first, idx, side="right") - 1
            same = first[w] != idx  # both steps in one stretch
            np.add.at(bad, w[drop & same], 1)
        return bad == 0

    def _expanded_instance_gaps(self, g_rows: np.ndarray, g_str: np.ndarray,
                                row_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One instance's decode steps expanded, sorted by end, gaps as in ``itl_gaps``."""
        first = self._first_step()
        rows = self.rows
        pos = [row_pos[g_rows]]
        starts = [rows["start_s"].to_numpy(dtype=float)[g_rows]]
        durs = [rows["duration_s"].to_numpy(dtype=float)[g_rows]]
        for k in g_str:
            a, n = int(first[k]), int(self.steps[k])
            starts.append(self.start_s[a:a + n])
            durs.append(self.duration_s[a:a + n])
            pos.append(int(self.row_at[k]) + a + np.arange(n, dtype=np.int64))
        p = np.concatenate(pos)
        by_pos = np.argsort(p, kind="stable")  # frame order first, as itl_gaps sees it
        s, p = np.concatenate(starts)[by_pos], p[by_pos]
        e = s + np.concatenate(durs)[by_pos]
        by_end = np.argsort(e, kind="stable")
        s, e, p = s[by_end], e[by_end], p[by_end]
        return p, _gaps(s, e, e)

    def busy_by_pool(self) -> tuple[dict[str, float], dict[str, int]]:
        """Device seconds per device summed per pool (pandas' groupby sum over the frame's
        order, so the same compensated sum), and the instances that stepped in each."""
        pools = self.pools
        rows = self.rows
        if not len(self.steps):  # the frame itself: its own groupby
            by_pool = rows.groupby("pool", observed=True)
            return ({str(p): float(v) for p, v in by_pool["busy_s"].sum().items()},
                    {str(p): int(v) for p, v in by_pool["instance"].nunique().items()})
        codes = self.expanded(rows["pool"].cat.codes.to_numpy(), None,
                              self.pool_of_instance[self.instance.astype(np.int64)]
                              if len(self.instance) else self.instance,
                              dtype=np.int8 if len(pools) < 128 else np.int32)
        busy = self.expanded(rows["busy_s"].to_numpy(dtype=float), self.duration_s,
                             dtype=np.float64)
        key = pd.Series(pd.Categorical.from_codes(codes, categories=pd.Index(pools)), copy=False)
        del codes
        sums = pd.Series(busy, copy=False).groupby(key, observed=True).sum()
        del busy, key
        seen: dict[str, set[int]] = {}
        r_inst = rows["instance"].to_numpy()
        r_pool = rows["pool"].cat.codes.to_numpy()
        for code, inst in zip(*_unique_pairs(r_pool, r_inst), strict=True):
            seen.setdefault(pools[code], set()).add(int(inst))
        k_inst = self.instance.astype(np.int64)
        for inst in np.unique(k_inst):
            seen.setdefault(pools[int(self.pool_of_instance[inst])], set()).add(int(inst))
        return ({str(p): float(v) for p, v in sums.items()},
                {p: len(v) for p, v in seen.items()})


def _gaps(start: np.ndarray, end_first: np.ndarray, end_last: np.ndarray) -> np.ndarray:
    """Each unit's gap from the previous unit's last end (``itl_gaps``' rule)."""
    prev = np.empty_like(end_last)
    if len(prev):
        prev[0] = np.inf
        prev[1:] = end_last[:-1]
    return np.where(prev <= start, end_first - prev, end_first - start)


def _seq_dtype(burst: int) -> type:
    """4-byte weights unless the burst of zero gaps needs more (the products are equal)."""
    return np.int32 if burst < 2**31 else np.int64


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(a):
        return a, b
    pairs = np.unique(np.stack([a.astype(np.int64), b.astype(np.int64)]), axis=1)
    return pairs[0], pairs[1]
