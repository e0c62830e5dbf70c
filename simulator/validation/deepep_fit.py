"""Fit DeepEP's dispatch and combine inside one NVLink domain on AIConfigurator's tables.

    pip install 'disagg-sim[kernels]'          # or: --data DIR (an unpacked systems/data)
    python -m simulator.validation.deepep_fit              # held-out errors per device
    python -m simulator.validation.deepep_fit --write      # and update the profiles' deepep

Reads only SGLang's single-node DeepEP tables of each device profile's ``kernel_tables``
system (``comm/sglang/<version>/wideep_deepep_ll_perf.parquet`` and
``wideep_deepep_normal_perf.parquet``, EP 8 over NVLink). How they were measured
(ai-dynamo/aiconfigurator ``collector/deep_collector/test_low_latency.py`` and
``test_intranode.py``): ``num_token`` tokens on *every* rank, top-k of random scores (uniform
routing); the low-latency kernels timed per kernel, FP8 dispatch and BF16 combine; the
normal kernels with FP8 dispatch and BF16 combine at each SM count, best NVLink chunk size.
Only the rows at DeepEP's default 20 SMs (deep_ep/buffer.py ``Buffer.num_sms``, which
SGLang keeps unless ``--deepep-config`` sets another) are fitted.

Each (kernel family, phase) gets the constants of
:class:`simulator.hardware.operator_fits.DeepEPCost`, fitted on log(predicted / measured)
with a quarter of the hidden sizes (:data:`HELD_OUT_HIDDEN`) held out. The report gives, on
those held-out rows, the median and 90th-percentile absolute error and the median signed
error of today's link-bandwidth model (``before``) and of the fit (``after``).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.cost.moe_comm import (
    EPGroup,
    alltoall_seconds,
    low_latency_sms,
    nvlink_copies,
    payload_bytes,
)
from simulator.hardware.operator_fits import DeepEPCost, DeepEPFits
from simulator.hardware.profiles import DeviceProfile
from simulator.hardware.registry import load_device, load_link, profiles_dir
from simulator.runner.kernel_tables import (
    _pick_version,
    devices_with_tables,
    package_version,
    tables_root,
)
from simulator.validation.calibrate import levenberg_marquardt

RANKS = 8
"""EP ranks of every table row (``node_num`` 1, eight GPUs)."""
NORMAL_SMS = 20
"""DeepEP's default SM count of the normal kernels (deep_ep/buffer.py ``Buffer.num_sms``)."""
HELD_OUT_HIDDEN = (6144,)
"""Hidden sizes never seen by the fit: one of the five low-latency sizes (a quarter of the
rows), one of six (normal)."""
TABLES = {"low_latency": ("wideep_deepep_ll_perf.parquet", "dispatch_avg_t_us", "combine_avg_t_us"),
          "normal": ("wideep_deepep_normal_perf.parquet", "dispatch_transmit_us",
                     "combine_transmit_us")}
_OFF_GB_PER_S = 1e5
"""Fitted rates above this are terms the fit switched off (written as 0)."""


def samples(folder: Path, kernel: str, phase: str) -> pd.DataFrame:
    """Rows of one table and phase: hidden, tokens per rank, top-k, experts, microseconds."""
    name, dispatch, combine = TABLES[kernel]
    t = pd.read_parquet(folder / name)
    t = t[t["node_num"] == 1]
    if kernel == "normal":
        t = t[t["dispatch_sms"] == NORMAL_SMS]
    return pd.DataFrame({"hidden": t["hidden_size"].to_numpy(int),
                         "tokens": t["num_token"].to_numpy(float),
                         "top_k": t["num_topk"].to_numpy(int),
                         "experts": t["num_experts"].to_numpy(int),
                         "us": t[dispatch if phase == "dispatch" else combine].to_numpy(float)})


def _inputs(rows: pd.DataFrame, kernel: str, phase: str, sm_count: int) -> dict[str, np.ndarray]:
    copies = {(e, k): nvlink_copies(kernel, RANKS, e, k)  # type: ignore[arg-type]
              for e, k in set(zip(rows["experts"], rows["top_k"], strict=True))}
    return {"tokens": rows["tokens"].to_numpy(float),
            "width": np.array([payload_bytes(phase, h) for h in rows["hidden"]]),  # type: ignore[arg-type]
            "copies": np.array([copies[(e, k)] for e, k in zip(rows["experts"], rows["top_k"],
                                                                strict=True)]),
            "hidden": rows["hidden"].to_numpy(float),
            "experts": rows["experts"].to_numpy(float),
            "sms": np.array([low_latency_sms(e, sm_count) if kernel == "low_latency"
                             else NORMAL_SMS for e in rows["experts"]], dtype=float)}


def _cost(x: np.ndarray, n: int, sm_term: bool) -> DeepEPCost:
    v = [math.exp(min(float(z), 60.0)) for z in x]

    def rate(r: float) -> float:
        return 0.0 if r > _OFF_GB_PER_S else r
    return DeepEPCost(floor_us=v[0], expert_ns=v[1], channel_ns=v[2], copy_gb_per_s=rate(v[3]),
                      token_gb_per_s=rate(v[4]), sm_gb_per_s=rate(v[5]) if sm_term else 0.0,
                      rows=n)


def _rounded(c: DeepEPCost) -> DeepEPCost:
    def sig(v: float) -> float:
        return float(f"{v:.4g}") if v > 1e-4 else 0.0
    return DeepEPCost(floor_us=round(c.floor_us, 3), expert_ns=sig(c.expert_ns),
                      channel_ns=sig(c.channel_ns), copy_gb_per_s=sig(c.copy_gb_per_s),
                      token_gb_per_s=sig(c.token_gb_per_s), sm_gb_per_s=sig(c.sm_gb_per_s),
                      rows=c.rows)


def predict(cost: DeepEPCost, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Microseconds the constants give for the rows behind ``inputs``."""
    return np.asarray(cost.seconds(inputs["tokens"], inputs["width"], inputs["copies"],
                                   inputs["hidden"], inputs["experts"], inputs["sms"])) * 1e6


def fit(rows: pd.DataFrame, kernel: str, phase: str, sm_count: int) -> DeepEPCost:
    """Least squares on log(predicted / measured) over every row given, from three starts."""
    inputs, meas = _inputs(rows, kernel, phase, sm_count), rows["us"].to_numpy(float)
    sm_term = kernel == "low_latency"  # the normal kernels' SM count is fixed (NORMAL_SMS)

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(predict(_cost(x, 0, sm_term), inputs) / meas)

    best: tuple[np.ndarray, float] | None = None
    for start in ((10.0, 5.0, 1.0, 300.0, 300.0, 10.0), (25.0, 0.1, 3.0, 200.0, 100.0, 3.0),
                  (10.0, 10.0, 0.1, 800.0, 1000.0, 50.0)):
        x, cost = levenberg_marquardt(residual, np.log(start), iterations=300)
        if best is None or cost < best[1]:
            best = (x, cost)
    assert best is not None
    return _rounded(_cost(best[0], len(rows), sm_term))


def _before(rows: pd.DataFrame, kernel: str, phase: str, device: DeviceProfile) -> np.ndarray:
    """Today's model: the scale-up link's latency and effective bandwidth."""
    link = load_link(device.scale_up_link) if device.scale_up_link else None
    group = EPGroup(RANKS, RANKS, link, None)
    return np.array([alltoall_seconds(phase, kernel, t, h, e, k, group) * 1e6  # type: ignore[arg-type]
                     for t, h, e, k in zip(rows["tokens"], rows["hidden"], rows["experts"],
                                           rows["top_k"], strict=True)])


def _errors(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float, float]:
    ape = np.abs(pred / meas - 1) * 100
    return (round(float(np.median(ape)), 1), round(float(np.percentile(ape, 90)), 1),
            round(float(np.median(pred / meas - 1) * 100), 1))


def fit_device(root: Path, device: DeviceProfile, version: str | None
               ) -> tuple[DeepEPFits, list[dict[str, Any]]] | None:
    """The device's constants and their held-out errors, or None without tables."""
    assert device.kernel_tables is not None
    assert device.sm_count
    folder = _pick_version(root / device.kernel_tables / "comm" / "sglang", version,
                           TABLES["normal"][0])
    if folder is None or not (folder / TABLES["low_latency"][0]).is_file():
        return None
    costs: dict[str, dict[str, DeepEPCost]] = {"low_latency": {}, "normal": {}}
    report = []
    for kernel, per_phase in costs.items():
        for phase in ("dispatch", "combine"):
            rows = samples(folder, kernel, phase)
            held = rows["hidden"].isin(HELD_OUT_HIDDEN).to_numpy()
            cost = fit(rows[~held], kernel, phase, device.sm_count)
            per_phase[phase] = cost
            test = rows[held]
            meas = test["us"].to_numpy(float)
            after = predict(cost, _inputs(test, kernel, phase, device.sm_count))
            before = _before(test, kernel, phase, device)
            b, a = _errors(before, meas), _errors(after, meas)
            report.append({"device": device.name, "kernel": kernel, "phase": phase,
                           "fit_rows": int((~held).sum()), "held_out_rows": int(held.sum()),
                           "median_ape_before": b[0], "p90_ape_before": b[1],
                           "median_error_before": b[2], "median_ape_after": a[0],
                           "p90_ape_after": a[1], "median_error_after": a[2]})
    source = (f"aiconfigurator-core {package_version(root)} systems/data/{device.kernel_tables}/"
              f"comm/sglang/{folder.name}/{{{TABLES['low_latency'][0]}, {TABLES['normal'][0]}}} "
              f"(EP {RANKS}, one node; normal kernels at {NORMAL_SMS} SMs; fitted by "
              f"simulator/validation/deepep_fit.py, hidden sizes "
              f"{', '.join(map(str, HELD_OUT_HIDDEN))} held out)")
    fits = DeepEPFits(source=source, ranks=RANKS, normal_sms=NORMAL_SMS,
                      low_latency=costs["low_latency"], normal=costs["normal"])  # type: ignore[arg-type]
    return fits, report


_BLOCK = re.compile(r"\n# DeepEP dispatch/combine measured[^\n]*\n(?:#[^\n]*\n)*deepep:\n(?:  [^\n]*\n)*")


def write_profile(device: DeviceProfile, fits: DeepEPFits) -> Path:
    """Rewrite the ``deepep:`` block of the device's YAML (before any ``operators:`` block)."""
    path = next(p for p in sorted((profiles_dir() / "devices").glob("*.yaml"))
                if load_device(p.stem).name == device.name)
    text = _BLOCK.sub("\n", path.read_text())
    lines = ["", "# DeepEP dispatch/combine measured inside one NVLink domain;",
             "# regenerate with: python -m simulator.validation.deepep_fit --write", "deepep:",
             f"  source: \"{fits.source}\"", f"  ranks: {fits.ranks}",
             f"  normal_sms: {fits.normal_sms}"]
    for kernel in ("low_latency", "normal"):
        lines.append(f"  {kernel}:")
        for phase, cost in getattr(fits, kernel).items():
            fields = ", ".join(f"{k}: {v:.6g}" if isinstance(v, float) else f"{k}: {v}"
                               for k, v in cost.model_dump().items() if v or k == "floor_us")
            lines.append(f"    {phase}: {{{fields}}}")
    block = "\n".join(lines) + "\n"
    marker = "\n# Per-operator roofline"
    if marker in text:
        head, tail = text.split(marker, 1)
        text = head.rstrip("\n") + "\n" + block + marker + tail
    else:
        text = text.rstrip("\n") + "\n" + block
    path.write_text(text)
    load_device.cache_clear()
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="systems/data folder (default: installed package)")
    parser.add_argument("--version", help="SGLang version of the tables (default: newest).")
    parser.add_argument("--device", action="append", help="Device profile(s) (default: all).")
    parser.add_argument("--write", action="store_true", help="Write the constants into the profiles.")
    args = parser.parse_args(argv)
    root = args.data or tables_root()
    if root is None:
        sys.exit("deepep_fit needs the tables: pip install 'disagg-sim[kernels]' or --data DIR")
    table: list[dict[str, Any]] = []
    for device in devices_with_tables(root, args.device, need_sms=True):
        found = fit_device(root, device, args.version)
        if found is None:
            continue
        fits, rows = found
        table += rows
        if args.write:
            print(f"wrote {write_profile(device, fits)}", file=sys.stderr)
    cols = ("device", "kernel", "phase", "fit_rows", "held_out_rows", "median_ape_before",
            "p90_ape_before", "median_error_before", "median_ape_after", "p90_ape_after",
            "median_error_after")
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in table:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
