"""Fit each NVLink profile's ``nccl`` block on NVIDIA AIConfigurator's measured NCCL tables.

    python -m simulator.validation.nccl_fit            # held-out errors, before -> after
    python -m simulator.validation.nccl_fit --write    # and update the link profiles
    python -m simulator.validation.nccl_fit --folds    # model forms by size folds (training)

Reads only ``comm/nccl/<version>/nccl_perf.parquet`` of the systems below (16-bit rows;
``message_size`` counts elements, so bytes are twice it). The sizes of the validation CSVs
(``scenarios/validation/ops_nccl_a100_h200_b200.csv`` and the collective rows of
``ops_h100.csv``: 512 B, 2 MiB, 32 MiB, 512 MiB) are held out of every fit, for every op and
group size, and the errors printed are on them: the link's alpha-beta model ("before") and
NCCL's algorithm and protocol choice with the fitted numbers ("after"). The model's form was
chosen on ``--folds``: the training sizes split in four folds, each predicted by a fit on
the other three.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from simulator.cost import nccl
from simulator.cost.nccl import Collective, nccl_time
from simulator.hardware.profiles import LinkProfile, NcclTuning
from simulator.hardware.registry import load_link
from simulator.runner.kernel_tables import tables_root

HELD_OUT_BYTES = (512, 2 * 2**20, 32 * 2**20, 512 * 2**20)
"""Sizes of the validation rows: never in a fit."""

LINK_TABLES: dict[str, list[tuple[str, str, str]]] = {
    "nvlink3": [("A100-SXM-80GB", "a100_sxm", "2.27.3")],
    "nvlink4": [("H100-SXM", "h100_sxm", "2.27.3"), ("H200-SXM", "h200_sxm", "2.26.2")],
    "nvlink5": [("B200", "b200_sxm", "2.27.3")],
}
"""Per link, the devices measured on it: (device profile, system, NCCL version)."""

NVLS_LINKS = {"nvlink4", "nvlink5"}
TUNER_BUS_GB_PER_S = {"nvlink3": 12 * 20.0, "nvlink4": 18 * 20.6, "nvlink5": 18 * 40.1}
"""NCCL's own bus-bandwidth figure per link: NVLink links per GPU x ``SM80_NVLINK_BW`` 20.0,
``SM90_NVLINK_BW`` 20.6, ``SM100_NVLINK_BW`` 40.1 GB/s (``NVIDIA/nccl:src/graph/topo.h``)."""
"""Fabrics with NVLink SHARP: NVSwitch 3 (HGX H100 / H200) and NVSwitch 4 (HGX B200)."""

OPS: dict[str, Collective] = {"all_reduce": "allreduce", "all_gather": "allgather",
                              "reduce_scatter": "reducescatter", "alltoall": "alltoall"}

FORMS: dict[str, dict[str, Any]] = {
    "nccl": {},
    "no-nvls": {"nvls": False},
    "no-ll128": {"ll128": False},
    "fixed-latency": {"scales": False},
    "squared-loss": {"loss": "linear"},
    "alltoall-ring-steps": {"p2p_hops": "ring"},
    "one-bus-bandwidth": {"per_op": False},
}
"""Model forms compared on the training folds; ``nccl`` (all of NCCL's menu, fitted
latency scales) is kept."""


def load_rows(root: Path, link: str) -> pd.DataFrame:
    """The 16-bit rows of the link's devices: device, op, ranks, bytes, us, held_out."""
    frames = []
    for device, system, version in LINK_TABLES[link]:
        df = pd.read_parquet(root / system / "comm" / "nccl" / version / "nccl_perf.parquet")
        df = df[df["nccl_dtype"] == "half"]
        frames.append(pd.DataFrame({
            "device": device, "op": df["op_name"].map(OPS), "ranks": df["num_gpus"].astype(int),
            "bytes": df["message_size"].astype(float) * 2, "us": df["latency"] * 1e3}))
    raw = pd.concat(frames, ignore_index=True).dropna()
    rows = pd.DataFrame(raw.groupby(["device", "op", "ranks", "bytes"], as_index=False)["us"]
                        .median())
    rows["held_out"] = rows["bytes"].isin(HELD_OUT_BYTES)
    return rows


def _tuning(x: np.ndarray, nvls: bool, ll128: bool, scales: bool,
            tuner_bus: float | None = None, per_op: bool = True) -> NcclTuning:
    v = np.exp(x)
    by_op: dict[Literal["allgather", "reducescatter", "alltoall"], float] = (
        {"allgather": float(v[6]), "reducescatter": float(v[7]), "alltoall": float(v[8])}
        if per_op else {})
    return NcclTuning.model_construct(
        op_bus_bandwidth_gb_per_s=by_op,
        tuner_bus_bandwidth_gb_per_s=tuner_bus,
        hardware="nvlink", bus_bandwidth_gb_per_s=float(v[0]), ll_bandwidth_gb_per_s=float(v[1]),
        ll128=ll128, base_scale=float(v[2]) if scales else 1.0,
        hop_scale=float(v[3]) if scales else 1.0, nvls=nvls,
        nvls_bandwidth_gb_per_s=float(v[4]) if nvls else None,
        nvls_latency_us=float(v[5]) if nvls else 23.0, fitted_on="")


def predict_us(t: NcclTuning | LinkProfile, rows: pd.DataFrame) -> np.ndarray:
    """Microseconds of each row with a tuning (NCCL's choice) or a link (its own model)."""
    from simulator.cost.collectives import allgather_time, allreduce_time, alltoall_time

    out = []
    for op, n, b in zip(rows["op"], rows["ranks"], rows["bytes"], strict=True):
        if isinstance(t, NcclTuning):
            out.append(nccl_time(op, b, int(n), t))
        elif op == "allreduce":
            out.append(allreduce_time(b, int(n), t))
        elif op == "alltoall":
            out.append(alltoall_time(b, int(n), t))
        else:
            out.append(allgather_time(b, int(n), t, op))
    return np.array(out) * 1e6


def fit(rows: pd.DataFrame, nvls: bool, ll128: bool = True, scales: bool = True,
        loss: str = "soft_l1", tuner_bus: float | None = None,
        per_op: bool = True) -> NcclTuning:
    """Least squares on log(predicted / measured) from a few starts (robust loss)."""
    from scipy.optimize import least_squares

    meas = rows["us"].to_numpy(float)

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log(predict_us(_tuning(x, nvls, ll128, scales, tuner_bus, per_op), rows) / meas)

    best = None
    for bus, lat in ((300.0, 1.0), (450.0, 1.5), (700.0, 2.0)):
        x0 = np.log([bus, bus / 2, lat, lat, bus * 0.6, 23.0, bus, bus, bus])
        r = least_squares(resid, x0, loss=loss, f_scale=0.05, max_nfev=400)
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    return _tuning(best.x, nvls, ll128, scales, tuner_bus, per_op)


def _ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.abs(pred / meas - 1) * 100


def report(link: str, rows: pd.DataFrame, tuned: NcclTuning) -> list[dict[str, Any]]:
    """Held-out median APE per device x op x group size, before -> after."""
    old = load_link(link).model_copy(update={"nccl": None})
    held = rows[rows["held_out"]]
    out = []
    for (device, op, n), part in held.groupby(["device", "op", "ranks"]):
        meas = part["us"].to_numpy(float)
        before, after = predict_us(old, part), predict_us(tuned, part)
        out.append({"link": link, "device": device, "op": op, "ranks": int(n),  # type: ignore[call-overload]
                    "rows": len(part),
                    "median_ape_before": round(float(np.median(_ape(before, meas))), 1),
                    "median_ape_after": round(float(np.median(_ape(after, meas))), 1)})
    return out


def fold_errors(rows: pd.DataFrame, nvls: bool, tuner_bus: float | None,
                folds: int = 4) -> dict[str, tuple[float, float]]:
    """Median and p90 APE of each model form on the training sizes, each fold fitted on the others."""
    train = rows[~rows["held_out"]]
    sizes = np.sort(train["bytes"].unique())
    out = {}
    for name, form in FORMS.items():
        errs = []
        nccl.P2P_HOPS = form.get("p2p_hops", "one")
        for k in range(folds):
            test = train["bytes"].isin(sizes[k::folds])
            t = fit(train[~test], nvls and form.get("nvls", True),
                    form.get("ll128", True), form.get("scales", True),
                    form.get("loss", "soft_l1"), form.get("tuner_bus", tuner_bus),
                    form.get("per_op", True))
            errs.append(_ape(predict_us(t, train[test]), train[test]["us"].to_numpy(float)))
        e = np.concatenate(errs)
        out[name] = (round(float(np.median(e)), 1), round(float(np.percentile(e, 90)), 1))
    nccl.P2P_HOPS = "one"
    return out


def yaml_block(t: NcclTuning) -> str:
    lines = ["nccl:                            # python -m simulator.validation.nccl_fit",
             f"  hardware: {t.hardware}",
             f"  tuner_bus_bandwidth_gb_per_s: {t.tuner_bus_bandwidth_gb_per_s:.1f}",
             f"  bus_bandwidth_gb_per_s: {t.bus_bandwidth_gb_per_s:.1f}",
             "  op_bus_bandwidth_gb_per_s: {"
             + ", ".join(f"{k}: {v:.1f}" for k, v in t.op_bus_bandwidth_gb_per_s.items()) + "}",
             f"  ll_bandwidth_gb_per_s: {t.ll_bandwidth_gb_per_s:.1f}",
             f"  ll128: {str(t.ll128).lower()}",
             f"  base_scale: {t.base_scale:.3f}",
             f"  hop_scale: {t.hop_scale:.3f}",
             f"  nvls: {str(t.nvls).lower()}"]
    if t.nvls and t.nvls_bandwidth_gb_per_s is not None:
        lines += [f"  nvls_bandwidth_gb_per_s: {t.nvls_bandwidth_gb_per_s:.1f}",
                  f"  nvls_latency_us: {t.nvls_latency_us:.2f}"]
    lines.append(f"  fitted_on: \"{t.fitted_on}\"")
    return "\n".join(lines) + "\n"


def write_block(path: Path, block: str) -> None:
    """Replace the file's ``nccl:`` block, or put it before ``source:``."""
    text = path.read_text()
    pattern = re.compile(r"^nccl:.*?(?=^\S)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(block, text, count=1)
    else:
        text = text.replace("\nsource:", "\n" + block + "source:", 1)
    path.write_text(text)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, help="an unpacked systems/data folder")
    ap.add_argument("--write", action="store_true", help="update the link profiles")
    ap.add_argument("--folds", action="store_true", help="compare model forms on training folds")
    ap.add_argument("--links", nargs="*", default=list(LINK_TABLES))
    args = ap.parse_args(argv)
    root = args.data or tables_root()
    if root is None:
        print("aiconfigurator-core is not installed (pip install 'disagg-sim[kernels]')",
              file=sys.stderr)
        return 2
    print("held out: sizes " + ", ".join(f"{b:,} B" for b in HELD_OUT_BYTES)
          + " of every op and group (the rows of scenarios/validation/"
          "ops_nccl_a100_h200_b200.csv and ops_h100.csv)")
    for link in args.links:
        rows = load_rows(root, link)
        nvls = link in NVLS_LINKS
        if args.folds:
            folds = fold_errors(rows, nvls, TUNER_BUS_GB_PER_S[link])
            print(f"{link} training folds, (median, p90) APE %: {folds}")
        train = rows[~rows["held_out"]]
        t = fit(train, nvls, tuner_bus=TUNER_BUS_GB_PER_S[link])
        t = t.model_copy(update={"fitted_on": "AIConfigurator nccl_perf "
                                 + ", ".join(f"{s} NCCL {v}" for _, s, v in LINK_TABLES[link])
                                 + f", 16-bit, {len(train)} rows; sizes "
                                 "512 B / 2 / 32 / 512 MiB held out"})
        t = NcclTuning.model_validate(t.model_dump())
        print(f"\n{link}: " + ", ".join(f"{k}={v}" for k, v in t.model_dump().items()
                                       if k not in ("fitted_on", "hardware")))
        train_err = _ape(predict_us(t, train), train["us"].to_numpy(float))
        print(f"  training rows {len(train)}: median APE {np.median(train_err):.1f} %")
        print(f"  {'device':<15}{'op':<14}{'GPUs':>5}  held-out median APE before -> after")
        for r in report(link, rows, t):
            print(f"  {r['device']:<15}{r['op']:<14}{r['ranks']:>5}  "
                  f"{r['median_ape_before']:6.1f} -> {r['median_ape_after']:5.1f} %")
        if args.write:
            path = Path(__file__).resolve().parents[2] / "hardware_profiles" / "links" / f"{link}.yaml"
            write_block(path, yaml_block(t))
            print(f"  wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["HELD_OUT_BYTES", "fit", "load_rows", "main"]
