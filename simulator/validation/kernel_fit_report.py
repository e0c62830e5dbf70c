"""The Operators tables of docs/VALIDATION.md from docs/kernel_fit_errors.json.

    python -m simulator.validation.kernel_fit --engine E --json docs/kernel_fit_errors.json
    python -m simulator.validation.kernel_fit_report docs/kernel_fit_errors.json \\
        [--previous OLD.json]

Prints the per-device table of one engine (``--engine``, vLLM by default), the per-engine
summary (median over devices of the per-device median APE on held-out shapes), with the
previous fit's figures beside this one's where ``--previous`` gives them, and the cells (one
engine's operator on one device) whose held-out median APE is at or above the 10 % target.
:func:`interpolation_errors` checks the tables predictor (``kernel_fit --interpolation``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from simulator.hardware.profiles import DeviceProfile

Rows = dict[str, list[dict[str, Any]]]


def interpolation_errors(root: Path, device: DeviceProfile, engine: str,
                         version: str | None = None) -> list[dict[str, Any]]:
    """How well ``cost.predictor: tables`` interpolates between measured points.

    Every other grid value along the batch axis (GEMM ``m``, attention sequence length /
    context) is dropped, the table is rebuilt from the rest and the dropped points are
    looked up: the error of the log-log interpolation at the points it did not see.
    """
    from simulator.cost.tables import GridTable
    from simulator.runner.kernel_tables import read_tables

    assert device.kernel_tables is not None
    full = read_tables(root, device.kernel_tables, engine, version)
    out = []
    families: list[tuple[str, dict[Any, GridTable], int]] = [
        ("gemm", dict(full.gemm), 0), ("attention_prefill", dict(full.context_attention), 1),
        ("attention_decode", dict(full.generation_attention), 1)]
    for name, tables, axis in families:
        apes: list[float] = []
        for table in tables.values():
            values = table.axes[axis]
            if len(values) < 3:
                continue
            keep = np.ones(len(values), bool)
            keep[1:-1:2] = False  # interior points only: never extrapolate
            axes = list(table.axes)
            axes[axis] = values[keep]
            reduced = GridTable(tuple(axes), np.compress(keep, table.seconds, axis=axis))
            dropped = np.compress(~keep, table.seconds, axis=axis)
            for idx in zip(*np.nonzero(np.isfinite(dropped)), strict=True):
                point = [float(table.axes[d][i]) if d != axis else float(values[~keep][i])
                         for d, i in enumerate(idx)]
                got = reduced.lookup(point)
                if got is not None:
                    apes.append(abs(got / float(dropped[idx]) - 1) * 100)
        if apes:
            out.append({"device": device.name, "engine": engine, "op": name, "points": len(apes),
                        "median_ape": round(float(np.median(apes)), 1),
                        "p90_ape": round(float(np.percentile(apes, 90)), 1)})
    return out


def _family(op: str) -> str:
    return "allreduce" if op.startswith("allreduce") else op


def _label(op: str) -> str:
    if op.endswith("_all_kv"):
        return f"{op.removesuffix('_all_kv')} (BF16 + FP8 KV)"
    return f"all-reduce ×{op.split('_')[1]}" if op.startswith("allreduce") else op


def _index(rows: Rows) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(e, r["device"], r["op"]): r for e, table in rows.items() for r in table}


def device_table(rows: Rows, previous: Rows, engine: str) -> list[str]:
    old = _index(previous)
    out = ["| device | operator | held-out shapes | roofline % | previous fit % | this fit % "
           "| p90 % | bias % | tiles | used |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows.get(engine, []):
        # Attention over both KV caches: the previous file's row of both where it has one,
        # else the previous single curve.
        prev = (old.get((engine, r["device"], r["op"]))
                or old.get((engine, r["device"], r["op"].removesuffix("_all_kv"))))
        used = "yes" if r["kept"] else "no (device-wide kept)"
        out.append(f"| {r['device']} | {_label(r['op'])} | {r['held_out_rows']} | "
                   f"{r['median_ape_before']} | {prev['median_ape_after'] if prev else '–'} | "
                   f"**{r['median_ape_after']}** | {r['p90_ape_after']} | "
                   f"{r['median_error_after']:+} | {r.get('tiles', '-')} | {used} |")
    return out


def _by_device(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Per device, the median of ``key`` over its rows (all-reduce: over group sizes)."""
    devices: dict[str, list[float]] = {}
    for r in rows:
        devices.setdefault(r["device"], []).append(r[key])
    return {d: float(np.median(v)) for d, v in devices.items()}


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return round(float(np.median(list(_by_device(rows, key).values()))), 1)


def summary_table(rows: Rows, previous: Rows) -> list[str]:
    out = ["| engine | operator family | devices | roofline | previous fit | this fit "
           "| devices ≤ 10 % |", "|---|---|---|---|---|---|---|"]
    for engine, table in rows.items():
        families: dict[str, list[dict[str, Any]]] = {}
        for r in table:
            families.setdefault(_family(r["op"]), []).append(r)
        old: dict[str, list[dict[str, Any]]] = {}
        for r in previous.get(engine, []):
            old.setdefault(_family(r["op"]), []).append(r)
        for fam, part in families.items():
            # Attention over both KV caches is comparable with one fit of both.
            was = fam if fam in old else fam.removesuffix("_all_kv")
            after = _by_device(part, "median_ape_after")
            then = [r for r in old.get(was, []) if r["device"] in after]  # same devices
            prev = f"{_median(then, 'median_ape_after')}" if then else "–"
            met = sum(v <= 10 for v in after.values())
            out.append(f"| {engine} | {fam} | {len(after)} | {_median(part, 'median_ape_before')} "
                       f"| {prev} | **{_median(part, 'median_ape_after')}** | {met} |")
    return out


TARGET_APE = 10.0
"""Held-out median APE a cell must stay below (the operator-level target)."""


CLOSEST = 5
"""Cells listed, the highest first, when none is at or above the target."""


def above_table(rows: Rows, limit: float = TARGET_APE) -> list[str]:
    """The cells at or above ``limit`` % held out, worst first, and how many of all; where
    there are none, the :data:`CLOSEST` highest."""
    cells = sorted((r for table in rows.values() for r in table),
                   key=lambda r: (-r["median_ape_after"], r["engine"], r["device"], r["op"]))
    above = [r for r in cells if r["median_ape_after"] >= limit]
    head = f"{len(above)} of {len(cells)} cells at or above {limit:g} % held out"
    if not above:
        above = cells[:CLOSEST]
        head += f"; the {len(above)} highest"
    out = [head + ":", "",
           "| engine | device | operator | held-out shapes | this fit % | p90 % | bias % |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {r['engine']} | {r['device']} | {_label(r['op'])} | {r['held_out_rows']} | "
            f"**{r['median_ape_after']}** | {r['p90_ape_after']} | {r['median_error_after']:+} |"
            for r in above]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("errors", type=Path, help="kernel_fit --json output (all engines).")
    parser.add_argument("--previous", type=Path, help="The same file from the previous fit.")
    parser.add_argument("--engine", default="vllm", help="Engine of the per-device table.")
    args = parser.parse_args(argv)
    rows: Rows = json.loads(args.errors.read_text())
    previous: Rows = json.loads(args.previous.read_text()) if args.previous else {}
    print("\n".join(device_table(rows, previous, args.engine)))
    print()
    print("\n".join(summary_table(rows, previous)))
    print()
    print("\n".join(above_table(rows)))


if __name__ == "__main__":
    main()
