"""The requests of a run, in the order recorded; an ended request kept as plain values.

A million-request run used to hold every :class:`Request` object (about 640 bytes with
its timestamps) until the requests frame was built at the end, and then the frame as well.
:meth:`RequestLog.ended` turns a request that is over into one row of typed columns (8
bytes a number) and lets the object go, so the run holds objects only for the requests
still in flight, and the frame's numeric columns come straight from those arrays.

The frame is the one built from the objects' own values: one column per field, sorted by
id (stable: as recorded among equal ids), each column's dtype inferred from its values
alone. A row is kept as plain values only when each of its values has the field's exact
type (``float`` for times and seconds, ``int`` for counts and ids, ``str`` for text),
which the arrays give back unchanged; a request with any other value (an ``int`` where
floats are usual, say) stays an object, and a column holding such values is built from
the values as Python objects, as before.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd

from simulator.engine.request import Request, State

REQUEST_FIELDS = ("id", "arrival_s", "prompt_tokens", "output_tokens", "generated",
                  "prefix_tokens", "cached_tokens", "prefill_saved_s", "prefill_start_s",
                  "prefill_end_s", "first_token_s", "transfer_wait_s", "transfer_start_s",
                  "transfer_end_s", "decode_admit_s", "decode_start_s", "second_token_s",
                  "completion_s", "preemptions", "swaps", "swap_bytes", "restarts",
                  "prefill_instance",
                  "decode_instance", "status", "reason", "session", "turn",
                  "dram_hit_tokens", "ssd_hit_tokens", "remote_hit_tokens", "kv_load_s",
                  "decode_cached_tokens", "klass", "priority", "attempt", "root_id",
                  "cancel_s")
"""The :class:`Request` attributes of the requests frame, in its column order."""
REQUEST_COLUMN_NAMES = {"id": "request_id", "generated": "generated_tokens", "klass": "class"}

TEXT_FIELDS = ("status", "reason", "klass")
FLOAT_FIELDS = tuple(f for f in REQUEST_FIELDS if f.endswith("_s") or f == "swap_bytes")
INT_FIELDS = tuple(f for f in REQUEST_FIELDS if f not in TEXT_FIELDS and f not in FLOAT_FIELDS)
_NUMERIC = (*FLOAT_FIELDS, *INT_FIELDS)
_NUMERIC_TYPES = (float,) * len(FLOAT_FIELDS) + (int,) * len(INT_FIELDS)
_N_FLOAT = len(FLOAT_FIELDS)
_numeric_values = attrgetter(*_NUMERIC)
# One row's numbers packed at once, native byte order as ``array`` stores them: the floats'
# bits and the ints' values unchanged, about a third of the cost of extending the two
# arrays value by value (an int beyond 8 bytes raises ``struct.error``).
_ROW = struct.Struct(f"={_N_FLOAT}d{len(INT_FIELDS)}q")
_FLOAT_BYTES = 8 * _N_FLOAT
# Each state's ``status`` text by a dict lookup (an enum member's ``value`` is a property).
_STATUS_TEXT = {s: s.value for s in State}


class RequestLog:
    """``append`` at submission, ``ended`` when a request is over, ``frame`` at the end.

    Iterating yields the requests not yet ended, in the order recorded.
    """

    def __init__(self) -> None:
        self._count = 0
        self._live: dict[int, tuple[Request, list[int]]] = {}  # id(obj) -> obj, positions
        self._kept: list[tuple[int, Request]] = []  # ended, with a value of another type
        self._order = array("q")  # position (order recorded) of each plain row
        # Plain rows, row after row: the float fields, and the int fields.
        self._floats, self._ints = array("d"), array("q")
        self._text: dict[str, list[str]] = {f: [] for f in TEXT_FIELDS}

    def append(self, req: Request) -> None:
        entry = self._live.get(id(req))
        if entry is None:
            self._live[id(req)] = (req, [self._count])
        else:
            entry[1].append(self._count)
        self._count += 1

    def __len__(self) -> int:
        """Requests recorded so far (ended or not)."""
        return self._count

    def __iter__(self) -> Iterator[Request]:
        live = sorted((pos, req) for req, positions in self._live.values() for pos in positions)
        return iter([req for _, req in live])

    def ended(self, req: Request) -> None:
        """``req`` is over: keep its values, let the object go (no-op if not recorded)."""
        entry = self._live.pop(id(req), None)
        if entry is None:
            return
        positions = entry[1]
        values = _numeric_values(req)
        text = (_STATUS_TEXT[req.status], req.reason, req.klass)
        if (tuple(map(type, values)) != _NUMERIC_TYPES
                or tuple(map(type, text)) != (str, str, str)):
            self._kept.extend((pos, req) for pos in positions)
            return
        try:
            row = _ROW.pack(*values)
        except struct.error:  # an int beyond 8 bytes: keep the object
            self._kept.extend((pos, req) for pos in positions)
            return
        floats, ints = row[:_FLOAT_BYTES], row[_FLOAT_BYTES:]
        for pos in positions:
            self._floats.frombytes(floats)
            self._ints.frombytes(ints)
            self._order.append(pos)
        for _ in positions:
            for f, v in zip(TEXT_FIELDS, text, strict=True):
                self._text[f].append(v)

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def frame(self, instance_names: list[str]) -> pd.DataFrame:
        """One row per request, by id (stable: as recorded among equal ids)."""
        objects = self._kept + sorted(
            (pos, req) for req, positions in self._live.values() for pos in positions)
        floats = _array(self._floats).reshape(-1, _N_FLOAT)
        ints = _array(self._ints).reshape(-1, len(INT_FIELDS))
        ids = np.concatenate((ints[:, INT_FIELDS.index("id")],
                              np.asarray([r.id for _, r in objects], dtype=np.int64)))
        pos = np.concatenate((_array(self._order),
                              np.asarray([p for p, _ in objects], dtype=np.int64)))
        order = np.lexsort((pos, ids))
        del ids, pos
        columns: dict[str, Any] = {}
        for field in REQUEST_FIELDS if len(order) else ():
            name = REQUEST_COLUMN_NAMES.get(field, field)
            if field in TEXT_FIELDS:
                plain: list[Any] = self._text[field]
            else:
                plain_values = (floats[:, FLOAT_FIELDS.index(field)] if field in FLOAT_FIELDS
                                else ints[:, INT_FIELDS.index(field)])
                if not objects:  # every value of the field's own type: its dtype
                    columns[name] = pd.Series(plain_values[order])  # float64 or int64
                    continue
                plain = plain_values.tolist()
            rest = [r.status.value if field == "status" else getattr(r, field)
                    for _, r in objects]
            values = plain + rest if rest else plain
            columns[name] = pd.Series([values[i] for i in order.tolist()])
            del values, rest
        if not len(order):  # no values to infer from: what a frame of empty lists holds
            columns = {REQUEST_COLUMN_NAMES.get(f, f): [] for f in REQUEST_FIELDS}
        df = pd.DataFrame(columns, copy=False)
        del columns
        names = np.asarray([*instance_names, ""], dtype=object)
        df["prefill_instance_name"] = names[df["prefill_instance"].to_numpy()] if len(df) else []
        df["decode_instance_name"] = names[df["decode_instance"].to_numpy()] if len(df) else []
        return df


def _array(values: array[Any]) -> np.ndarray:
    return (np.frombuffer(values, dtype=values.typecode) if len(values)
            else np.array([], dtype=values.typecode))
