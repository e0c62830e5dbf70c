"""Short, readable labels for sweep axis values (table cells, legends, report series).

An axis value may carry its own label, ``{label: 1P1D, value: [...]}``; otherwise numbers,
strings and booleans are their own label, a list of pools reads as its layout
(``1P1D TP4``, ``colocated TP8``, ``2P1D TP2/TP8``) and any other mapping or list as
``key=value`` pairs. Labels on one axis are unique: derived ones add the device, then a
``#n`` suffix, when two values would otherwise read the same.
"""

from __future__ import annotations

import json
from typing import Any

from simulator.errors import ConfigError


def is_labelled(value: Any) -> bool:
    """``{label: ..., value: ...}`` (exactly these two keys, a string label)."""
    return (isinstance(value, dict) and set(value) == {"label", "value"}
            and isinstance(value["label"], str) and bool(value["label"].strip()))


def unwrap(value: Any) -> Any:
    """The value a scenario receives: the ``value`` of a labelled axis value."""
    return value["value"] if is_labelled(value) else value


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _pools(value: Any) -> list[dict[str, Any]] | None:
    if isinstance(value, list) and value and all(
            isinstance(p, dict) and ("role" in p or "device" in p) for p in value):
        return value
    return None


def _tp(pool: dict[str, Any]) -> str:
    par = pool.get("parallelism") or {}
    tp, pp = par.get("tp", 1), par.get("pp", 1)
    return f"TP{tp}" + (f"xPP{pp}" if pp not in (1, None) else "")


def pools_label(pools: list[dict[str, Any]], with_device: bool = False) -> str:
    """``1P1D TP4``, ``2P1D TP2/TP8``, ``colocated TP8``, ``2x colocated TP4``."""
    roles = [p.get("role", "colocated") for p in pools]
    devices = "/".join(dict.fromkeys(str(p.get("device", "?")) for p in pools))
    if all(r == "colocated" for r in roles):
        n = sum(int(p.get("instances", 1)) for p in pools)
        shapes = "/".join(dict.fromkeys(_tp(p) for p in pools))
        text = f"{f'{n}x ' if n > 1 else ''}colocated {shapes}"
    else:
        prefill = [p for p in pools if p.get("role") == "prefill"]
        decode = [p for p in pools if p.get("role") == "decode"]
        n_p = sum(int(p.get("instances", 1)) for p in prefill)
        n_d = sum(int(p.get("instances", 1)) for p in decode)
        kinds = list(dict.fromkeys(_tp(p) for p in [*prefill, *decode]))
        tp = kinds[0] if len(kinds) == 1 else "/".join(
            "+".join(dict.fromkeys(_tp(p) for p in side)) for side in (prefill, decode))
        text = f"{n_p}P{n_d}D {tp}"
    return f"{text} {devices}" if with_device else text


def _flat(value: Any, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        out: list[str] = []
        for k, v in value.items():
            out += _flat(v, f"{prefix}{k}.")
        return out
    if isinstance(value, list) and not all(_is_scalar(v) for v in value):
        return [f"{prefix}[{i}]." + s.removeprefix(prefix) for i, v in enumerate(value)
                for s in _flat(v, prefix)]
    shown = value if _is_scalar(value) else json.dumps(value)
    return [f"{prefix.rstrip('.')}={shown}"]


def derived_label(value: Any, with_device: bool = False) -> str:
    pools = _pools(value)
    if pools is not None:
        return pools_label(pools, with_device)
    if isinstance(value, dict) and "role" in value:  # one pool
        return pools_label([value], with_device)
    if isinstance(value, dict | list):
        return ", ".join(_flat(value)) or "{}"
    return str(value)


def axis_cells(path: str, values: list[Any]) -> list[Any]:
    """One table cell per axis value: the value itself when every value is a number, a
    string or a boolean (of one kind), else a unique short label."""
    plain = [unwrap(v) for v in values]
    labelled = any(is_labelled(v) for v in values)
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in plain)
    if not labelled and (numeric or all(isinstance(v, str) for v in plain)
                         or all(isinstance(v, bool) for v in plain)):
        return plain
    given = [v["label"].strip() if is_labelled(v) else None for v in values]
    keys = [json.dumps(v, sort_keys=True, default=str) for v in plain]
    for level in (False, True):
        cells = [g if g is not None else derived_label(v, level)
                 for g, v in zip(given, plain, strict=True)]
        if _unique(cells, keys):
            return cells
    for label in given:
        if label is not None and len({k for c, k in zip(cells, keys, strict=True)
                                      if c == label}) > 1:
            raise ConfigError(f"label {label!r} is given to two different values; labels on "
                              "one axis must be unique", key=path)
    seen: dict[str, list[str]] = {}
    out = []
    for cell, key in zip(cells, keys, strict=True):
        ids = seen.setdefault(cell, [])
        if key not in ids:
            ids.append(key)
        out.append(cell if len({k for c, k in zip(cells, keys, strict=True) if c == cell}) == 1
                   else f"{cell} #{ids.index(key) + 1}")
    return out


def _unique(cells: list[str], keys: list[str]) -> bool:
    by_cell: dict[str, set[str]] = {}
    for cell, key in zip(cells, keys, strict=True):
        by_cell.setdefault(cell, set()).add(key)
    return all(len(k) == 1 for k in by_cell.values())
