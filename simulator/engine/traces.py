"""Request traces: Azure LLM inference trace CSVs and Mooncake JSONL, checked row by row.

Every value is checked where it is read; a bad one is an error naming the file, the row
(data rows count from 1, the CSV header is not a row; JSONL rows are lines) and the column,
or, with ``skip_bad_rows``, a counted skip. Timestamps are numbers of seconds (CSV) or of
milliseconds (Mooncake), or datetimes (CSV), never a mix.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import ConfigError

MAX_TOKENS = 2**31 - 1
"""Longest prompt or output a trace row may give (vLLM keeps token ids in int32)."""
CSV_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class Trace:
    """Arrival times (s, from 0), prompt and output lengths, optional prefix block ids."""

    times_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    block_hashes: list[list[int]] | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    """Rows left out with ``skip_bad_rows``, by the column of their first bad value."""
    first_skipped: str = ""
    """Where the first skipped row was and why, for the report."""


class _Rows:
    """Collects per-row problems; the earliest is raised, or, with ``skip``, all counted."""

    def __init__(self, file: str, skip: bool) -> None:
        self.file = file
        self.skip = skip
        self.problems: dict[int, tuple[str, str]] = {}  # row -> (column, what), first kept
        self.blank: set[int] = set()  # JSONL blank lines: not requests, not errors

    @property
    def bad(self) -> set[int]:
        return set(self.problems)

    def problem(self, row: int, column: str, what: str) -> None:
        self.problems.setdefault(row, (column, what))

    def settle(self) -> tuple[dict[str, int], str]:
        """Raise the earliest problem, or (without it) return counts by column and the first."""
        if not self.problems:
            return {}, ""
        row = min(self.problems)
        column, what = self.problems[row]
        where = f"row {row}, column {column}: {what}"
        if not self.skip:
            more = len(self.problems) - 1
            also = f"; {more} more bad row(s)" if more else ""
            raise ConfigError(f"{where}{also} (fix them, or pass --skip-bad-rows to leave bad "
                              "rows out)", file=self.file)
        return dict(Counter(c for c, _ in self.problems.values())), where


def _token_column(values: pd.Series, column: str, rows: _Rows) -> np.ndarray:
    numbers = pd.to_numeric(values.str.strip(), errors="coerce").to_numpy(dtype=float)
    out = np.zeros(len(numbers), dtype=np.int64)
    for i, (raw, x) in enumerate(zip(values.tolist(), numbers.tolist(), strict=True)):
        if not math.isfinite(x) or x != int(x):
            rows.problem(i + 1, column, f"{raw!r} is not a whole number of tokens")
        elif not 1 <= x <= MAX_TOKENS:
            rows.problem(i + 1, column, f"{int(x)} tokens; allowed 1..{MAX_TOKENS}")
        else:
            out[i] = int(x)
    return out


def _timestamps(values: pd.Series, rows: _Rows) -> np.ndarray:
    """Seconds from the first arrival: numbers are seconds; datetimes are datetimes."""
    text = values.str.strip()
    numbers = pd.to_numeric(text, errors="coerce")
    numeric = numbers.notna().to_numpy()
    stamps = pd.to_datetime(text.where(~numeric), errors="coerce", format="mixed", utc=True)
    # The first readable cell decides the kind; unreadable ones before it are bad rows.
    readable = np.flatnonzero(numeric | stamps.notna().to_numpy())
    ref = int(readable[0]) if len(readable) else 0
    first_numeric = bool(numeric[ref]) if len(numeric) else True
    out = np.full(len(text), np.nan)
    if first_numeric:
        seconds = numbers.to_numpy(dtype=float)
        for i, x in enumerate(seconds.tolist()):
            if not numeric[i]:
                rows.problem(i + 1, "TIMESTAMP", f"{text.iloc[i]!r} is not a number of seconds "
                             f"(row {ref + 1} gives seconds; a trace uses one kind of timestamp)")
            elif not math.isfinite(x) or abs(x) > 2**53:
                rows.problem(i + 1, "TIMESTAMP", f"{x!r} seconds; must be finite")
            else:
                out[i] = x
    else:
        for i in range(len(text)):
            if numeric[i]:
                rows.problem(i + 1, "TIMESTAMP", f"{text.iloc[i]!r} is a number, but row "
                             f"{ref + 1} gives a datetime; a trace uses one kind of timestamp")
            elif pd.isna(stamps.iloc[i]):
                rows.problem(i + 1, "TIMESTAMP", f"{text.iloc[i]!r} is neither a number of "
                             "seconds nor a datetime (e.g. 2023-11-16 18:15:46.68)")
        good = stamps.notna().to_numpy() & ~numeric
        if good.any():
            kept = stamps[good]
            out[good] = (kept - kept.min()).dt.total_seconds().to_numpy(dtype=float)
    return out


def _finish(file: str, rows: _Rows, times: np.ndarray, ins: np.ndarray, outs: np.ndarray,
            hashes: list[list[int]] | None) -> Trace:
    skipped, first = rows.settle()
    keep = np.ones(len(times), dtype=bool)
    if rows.bad or rows.blank:
        keep[[r - 1 for r in rows.bad | rows.blank]] = False
    if not keep.any():
        what = "no rows" if not rows.bad else f"no usable rows ({len(rows.bad)} bad)"
        raise ConfigError(f"trace has {what}; a trace needs at least one request", file=file)
    times, ins, outs = times[keep], ins[keep], outs[keep]
    if hashes is not None:
        hashes = [h for h, k in zip(hashes, keep.tolist(), strict=True) if k]
    times = times - times.min()
    order = np.argsort(times, kind="stable")  # rows in any order: arrivals are sorted
    if hashes is not None:
        hashes = [hashes[i] for i in order.tolist()]
    return Trace(times[order], ins[order], outs[order], hashes, skipped, first)


def load_trace(path: str | Path, *, skip_bad_rows: bool = False) -> Trace:
    """Read an Azure LLM trace CSV or a Mooncake JSONL trace (by the ``.jsonl`` suffix)."""
    path = Path(path)
    file = str(path)
    if not path.is_file():
        raise ConfigError("trace file not found" if not path.exists()
                          else "is not a file; expected a trace CSV or JSONL", file=file)
    rows = _Rows(file, skip_bad_rows)
    if path.suffix == ".jsonl":
        return _load_mooncake(path, rows)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig",
                         skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise ConfigError("trace file is empty; expected a header "
                          f"{','.join(CSV_COLUMNS)} and one row per request", file=file) from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise ConfigError(f"cannot parse trace CSV ({type(exc).__name__}: {reason}); expected "
                          "UTF-8 comma-separated values", file=file) from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in CSV_COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(f"trace CSV needs columns {list(CSV_COLUMNS)}; missing {missing} "
                          f"(found {list(df.columns)[:10]})", file=file)
    times = _timestamps(df["TIMESTAMP"], rows)
    ins = _token_column(df["ContextTokens"], "ContextTokens", rows)
    outs = _token_column(df["GeneratedTokens"], "GeneratedTokens", rows)
    return _finish(file, rows, times, ins, outs, None)


def _whole(rec: dict[str, Any], key: str, row: int, rows: _Rows, low: int) -> int:
    value = rec.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or value != int(value):
        rows.problem(row, key, f"{value!r} is not a whole number")
        return 0
    if not low <= value <= MAX_TOKENS:
        rows.problem(row, key, f"{int(value)}; allowed {low}..{MAX_TOKENS}")
        return 0
    return int(value)


def _placeholder(times: list[float], ins: list[int], outs: list[int],
                 hashes: list[list[int]]) -> None:
    """Keep one entry per line (a left-out row) so that rows stay line numbers."""
    times.append(0.0)
    ins.append(0)
    outs.append(0)
    hashes.append([])


def _load_mooncake(path: Path, rows: _Rows) -> Trace:
    """A Mooncake JSONL trace: timestamp (ms), input/output lengths, prefix block hashes."""
    times: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    hashes: list[list[int]] = []
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"cannot read trace ({type(exc).__name__}); expected UTF-8 JSON "
                          "lines", file=str(path)) from None
    for row, line in enumerate(lines, 1):  # one entry per line, so rows are line numbers
        if not line.strip():
            rows.blank.add(row)
            _placeholder(times, ins, outs, hashes)
            continue
        try:
            rec = json.loads(line)  # NaN/Infinity parse, then fail the finiteness checks
        except (json.JSONDecodeError, ValueError, RecursionError) as exc:
            rows.problem(row, "-", f"not a JSON object ({str(exc)[:80]})")
            rec = None
        if not isinstance(rec, dict):
            if rec is not None:
                rows.problem(row, "-", f"expected a JSON object, got {type(rec).__name__}")
            _placeholder(times, ins, outs, hashes)
            continue
        stamp = rec.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(
                stamp) or abs(stamp) > 2**53:
            rows.problem(row, "timestamp", f"{stamp!r} is not a finite number of milliseconds")
            stamp = 0.0
        times.append(float(stamp) / 1000.0)
        ins.append(_whole(rec, "input_length", row, rows, 1))
        outs.append(_whole(rec, "output_length", row, rows, 1))
        ids = rec.get("hash_ids", [])
        if not isinstance(ids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) and 0 <= h <= 2**53 for h in ids):
            rows.problem(row, "hash_ids", "expected a list of block ids (integers >= 0)")
            ids = []
        hashes.append(list(ids))
    return _finish(str(path), rows, np.asarray(times, dtype=float),
                   np.asarray(ins, dtype=np.int64), np.asarray(outs, dtype=np.int64), hashes)
