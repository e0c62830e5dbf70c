"""Fit a device's efficiency factors and its links' alpha-beta terms to measured operators.

Compute and memory (one fit per device, all compute rows together): the roofline of
:func:`simulator.cost.op_time` with

* a large-operator compute efficiency per precision present in the data,
* one smooth shape term for compute, ``eta(F) = eta_max * F / (F + F_half)`` (the
  profile's ``compute_curve``: small GEMMs cannot fill the machine),
* a memory efficiency, and a per-kernel overhead (launch plus ramp of a small kernel),

minimising the squared log-ratio of predicted to measured time (relative errors, so a
4 ms GEMM and a 10 us one count alike) with a small Levenberg-Marquardt solver in numpy.

Collectives: per op and group size, ``t = alpha + factor * bytes / bw`` by weighted linear
least squares (what the data says); per link, the terms the link profile can express
(``collective_base_us``, ``collective_hop_us``, ``efficiency``, and
``per_transfer_overhead_us`` when point-to-point rows exist) fitted on all rows together; the
calibrated link is priced by those terms (a shipped link's ``nccl`` block is dropped).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import ConfigError
from simulator.hardware.profiles import DeviceProfile, Efficiency, EfficiencyCurve, LinkProfile
from simulator.hardware.registry import load_device, load_link
from simulator.validation.ops import (
    COLLECTIVE_OPS,
    COMM_OPS,
    COMPUTE_OPS,
    HardwareSet,
    compute_work,
    error_table,
    predict,
)

WIDE = ("bf16", "fp16", "fp32")


# ----- compute and memory -----------------------------------------------------------------
@dataclass(frozen=True)
class ComputeFit:
    eta_by_precision: dict[str, float]
    half_flops: float
    eta_memory: float
    kernel_launch_us: float
    rows: int


def _sigmoid(z: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def levenberg_marquardt(fun: Callable[[np.ndarray], np.ndarray], x0: np.ndarray,
                        iterations: int = 200) -> tuple[np.ndarray, float]:
    """Minimise ``sum(fun(x) ** 2)`` from ``x0``; forward-difference Jacobian."""
    x = np.asarray(x0, dtype=float)
    r = fun(x)
    cost = float(r @ r)
    lam = 1e-3
    for _ in range(iterations):
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            dx = np.zeros_like(x)
            dx[j] = 1e-6 * max(1.0, abs(x[j]))
            jac[:, j] = (fun(x + dx) - r) / dx[j]
        a, g = jac.T @ jac, jac.T @ r
        improved = False
        while lam < 1e12:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12), -g)
            r_new = fun(x + step)
            new_cost = float(r_new @ r_new)
            if new_cost < cost:
                converged = cost - new_cost < 1e-12 * (1 + cost)
                x, r, cost, lam, improved = x + step, r_new, new_cost, max(lam / 3, 1e-12), True
                break
            lam *= 4
        if not improved or converged:
            break
    return x, cost


def fit_compute(rows: pd.DataFrame, device: DeviceProfile) -> ComputeFit | None:
    """Fit the roofline terms on the compute rows of one device; None if there are none."""
    rows = rows[rows["op"].isin(COMPUTE_OPS)]
    if rows.empty:
        return None
    work = np.array([compute_work(r) for r in rows.to_dict("records")])
    flops, nbytes = work[:, 0], work[:, 1]
    measured = rows["measured_latency_us"].to_numpy(dtype=float) * 1e-6
    dtypes = rows["dtype"].astype(str).to_numpy()
    precisions = sorted(set(dtypes))
    peak = np.array([device.peak_flops(p) for p in dtypes])
    index = np.array([precisions.index(p) for p in dtypes])
    bandwidth = device.memory_bandwidth
    eff = device.efficiency
    k = len(precisions)

    def times(x: np.ndarray) -> np.ndarray:
        eta_c = np.asarray(_sigmoid(x[:k]))[index]
        half = math.exp(min(x[k], 35.0))
        eta_m = _sigmoid(x[k + 1])
        launch = math.exp(min(x[k + 2], 10.0)) * 1e-6
        compute = (flops + half) / (peak * eta_c)
        memory = nbytes / (bandwidth * eta_m)
        return np.maximum(compute, memory) + launch

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(times(x)) - np.log(measured)

    start_eta = [eff.compute_by_precision.get(p, eff.compute)  # type: ignore[call-overload]
                 if eff.compute_by_precision else eff.compute for p in precisions]
    best: tuple[np.ndarray, float] | None = None
    for half0 in (1e8, 1e10, 1e12):
        for launch0 in (1.0, max(device.kernel_launch_us, 0.1), 8.0):
            x0 = np.array([*(_logit(e) for e in start_eta), math.log(half0),
                           _logit(eff.memory), math.log(launch0)])
            x, cost = levenberg_marquardt(residual, x0)
            if best is None or cost < best[1]:
                best = (x, cost)
    assert best is not None
    x = best[0]
    return ComputeFit(
        eta_by_precision={p: float(_sigmoid(x[i])) for i, p in enumerate(precisions)},
        half_flops=float(math.exp(min(x[k], 35.0))),
        eta_memory=float(_sigmoid(x[k + 1])),
        kernel_launch_us=float(math.exp(min(x[k + 2], 10.0))),
        rows=len(rows),
    )


def apply_compute_fit(device: DeviceProfile, fit: ComputeFit, calibrated_on: str) -> DeviceProfile:
    eff = device.efficiency
    by_precision: dict[str, float] = {str(p): v for p, v in
                                      (eff.compute_by_precision or {}).items()}
    compute = eff.compute
    for precision, eta in fit.eta_by_precision.items():
        if precision in WIDE:
            compute = eta
            by_precision.pop(precision, None)
        else:
            by_precision[precision] = eta
    new_eff = Efficiency(
        compute=round(compute, 4),
        memory=round(fit.eta_memory, 4),
        compute_curve=EfficiencyCurve(eta_max=round(compute, 4),
                                      half_work=float(f"{fit.half_flops:.4g}")),
        memory_curve=None,
        compute_by_precision={p: round(v, 4) for p, v in by_precision.items()}  # type: ignore[misc]
        or None,
        calibrated_on=calibrated_on,
    )
    return device.model_copy(update={"efficiency": new_eff,
                                     "kernel_launch_us": round(fit.kernel_launch_us, 3)})


# ----- collectives ------------------------------------------------------------------------
def volume_factor(op: str, ranks: int) -> float:
    """Bytes through each rank's link per byte of buffer (ring algorithms)."""
    if op == "allreduce":
        return 2 * (ranks - 1) / ranks
    if op in ("allgather", "reducescatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


def latency_steps(op: str, ranks: int) -> int:
    return 2 * (ranks - 1) if op == "allreduce" else ranks - 1


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (small active-set loop)."""
    free = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        if (sol >= 0).all():
            coef[free] = sol
            return coef
        free.pop(int(np.argmin(sol)))
    return coef


def fit_collective_groups(rows: pd.DataFrame) -> list[dict[str, object]]:
    """``alpha`` and achieved link bandwidth of each (op, group size) with >= 2 sizes."""
    out: list[dict[str, object]] = []
    comm = rows[rows["op"].isin(COMM_OPS)].copy()
    comm["ranks"] = comm["num_gpus"].fillna(2).astype(int)
    for _, grp in comm.groupby(["op", "ranks"], sort=True):
        op, ranks = str(grp["op"].iloc[0]), int(grp["ranks"].iloc[0])
        t = grp["measured_latency_us"].to_numpy(dtype=float) * 1e-6
        volume = grp["message_bytes"].to_numpy(dtype=float) * volume_factor(op, ranks)
        if len(np.unique(volume)) < 2:
            continue
        a = np.column_stack([np.ones_like(t), volume]) / t[:, None]
        alpha, inv_bw = _nnls(a, np.ones_like(t))
        pred = alpha + volume * inv_bw
        out.append({
            "op": op, "num_gpus": ranks, "rows": len(grp),
            "alpha_us": round(alpha * 1e6, 3),
            "link_gb_per_s": round(1 / inv_bw / 1e9, 2) if inv_bw > 0 else None,
            "median_ape_pct": round(float(np.median(np.abs(pred / t - 1))) * 100, 2),
        })
    return out


def fit_link(rows: pd.DataFrame, link: LinkProfile) -> dict[str, float]:
    """The link terms each group of rows identifies, from the rows that cross the link.

    Rows are sorted by which term dominates them under the shipped link profile: where the
    bytes term is under a tenth of the measured time, the rows fix the latency terms
    (``collective_base_us`` and ``collective_hop_us`` by relative least squares, or
    ``per_transfer_overhead_us`` from point-to-point rows); where the latency term is under
    a tenth, they fix ``efficiency`` (median achieved bandwidth over the line rate). The
    rows in between (1-32 MB messages, where NCCL switches protocols) fit neither term of
    an alpha-beta model; they are left out of the fit and show up in the errors. A term
    with no rows keeps the shipped value (absent from the result).
    """
    t = rows["measured_latency_us"].to_numpy(dtype=float) * 1e-6
    ops = rows["op"].astype(str).to_numpy()
    ranks = [int(r) for r in rows["num_gpus"].fillna(2)]
    is_p2p = ops == "p2p"
    steps = np.array([0 if p else latency_steps(o, r)
                      for o, r, p in zip(ops, ranks, is_p2p, strict=True)])
    volume = rows["message_bytes"].to_numpy(dtype=float) * np.array(
        [volume_factor(o, r) for o, r in zip(ops, ranks, strict=True)])
    line_rate = link.bandwidth_gb_per_s * 1e9
    fixed_p2p = (link.per_transfer_overhead_us + link.latency_us) * 1e-6
    alpha = np.where(is_p2p, fixed_p2p,
                     (link.collective_base_us + steps * link.collective_hop_us) * 1e-6)
    beta = volume / link.effective_bandwidth
    out: dict[str, float] = {}
    small = beta < 0.1 * t
    coll_small = small & ~is_p2p
    if coll_small.any():
        target = (t - beta)[coll_small]
        if len(set(steps[coll_small])) > 1:
            a = np.column_stack([np.ones(coll_small.sum()), steps[coll_small]]) / target[:, None]
            base, hop = _nnls(a, np.ones(coll_small.sum()))
            out["collective_base_us"], out["collective_hop_us"] = base * 1e6, hop * 1e6
        else:
            hop = link.collective_hop_us * 1e-6
            base = float(np.median(target - steps[coll_small] * hop))
            out["collective_base_us"] = max(0.0, base) * 1e6
    p2p_small = small & is_p2p
    if p2p_small.any():
        overhead = float(np.median((t - beta)[p2p_small])) - link.latency_us * 1e-6
        out["per_transfer_overhead_us"] = max(0.0, overhead) * 1e6
    base_us = out.get("collective_base_us", link.collective_base_us)
    hop_us = out.get("collective_hop_us", link.collective_hop_us)
    overhead_us = out.get("per_transfer_overhead_us", link.per_transfer_overhead_us)
    alpha = np.where(is_p2p, (overhead_us + link.latency_us) * 1e-6,
                     (base_us + steps * hop_us) * 1e-6)
    large = (alpha < 0.1 * t) & (volume > 0)
    if large.any() and line_rate > 0:
        achieved = volume[large] / (t - alpha)[large]
        out["efficiency"] = float(min(1.0, np.median(achieved) / line_rate))
    return out


# ----- the whole calibration --------------------------------------------------------------
@dataclass
class Calibration:
    device: str
    base: DeviceProfile
    calibrated: DeviceProfile
    links: dict[str, LinkProfile]
    compute: ComputeFit | None
    collective_groups: list[dict[str, object]]
    fitted_rows: int
    fitted_on: dict[str, object]
    errors: dict[str, pd.DataFrame] = field(default_factory=dict)

    def hardware(self) -> HardwareSet:
        return HardwareSet({self.device: self.calibrated},
                           {(self.device, name): link for name, link in self.links.items()})


def rows_for_device(df: pd.DataFrame, device: str, file: str | None = None) -> pd.DataFrame:
    profile = load_device(device)
    mask = df["device"].map(lambda d: load_device(d).name == profile.name)
    if not mask.any():
        present = ", ".join(sorted(df["device"].unique()))
        raise ConfigError(f"no rows for device {device!r}; the file has: {present}",
                          file=file, key="device")
    return df[mask]


def calibrate(train: pd.DataFrame, device: str, fitted_on: dict[str, object],
              holdout: pd.DataFrame | None = None) -> Calibration:
    """Fit ``device`` on its rows of ``train``; errors before/after on train (and holdout)."""
    file = str(fitted_on.get("file")) if fitted_on.get("file") else None
    rows = rows_for_device(train, device, file)
    base = load_device(device)
    name = base.name
    before = predict(rows)
    fit = fit_compute(rows, base)
    counts = rows["op"].value_counts().sort_index().to_dict()
    record = (f"disagg-sim calibrate on {fitted_on.get('file', '<in code>')} "
              f"(sha256 {str(fitted_on.get('sha256', '-'))[:12]}, fitted "
              f"{fitted_on.get('date', '-')}): {len(rows)} rows of {name} "
              f"({', '.join(f'{op} {n}' for op, n in counts.items())}). "
              f"Base profile: {base.efficiency.calibrated_on.strip()}")
    calibrated = apply_compute_fit(base, fit, record) if fit else base
    calibrated = calibrated.model_copy(update={"name": f"{name}-calibrated",
                                               "source": [*base.source, record]})
    hw = HardwareSet({name: calibrated})
    comm = rows[rows["op"].isin(COMM_OPS)]
    links: dict[str, LinkProfile] = {}
    if not comm.empty:
        link_names = [hw.link_name(name, _role(r), _ranks(r)) for r in comm.to_dict("records")]
        comm = comm.assign(_link=link_names)
        for link_name, grp in comm.groupby("_link", sort=True):
            link = load_link(str(link_name))
            terms = {k: round(float(v), 4) for k, v in fit_link(grp, link).items()}
            # The fitted alpha-beta terms price the calibrated link: its table-fitted NCCL
            # block (if any) gives way to the user's measurements.
            links[str(link_name)] = link.model_copy(update={
                **terms, "nccl": None, "name": f"{link.name}-{name}-calibrated",
                "source": [*link.source, f"{record.split('. Base profile', maxsplit=1)[0]}; "
                           f"{len(grp)} {link.name} rows"]})
    cal = Calibration(name, base, calibrated, links, fit, fit_collective_groups(rows),
                      len(rows), fitted_on)
    after = predict(rows, cal.hardware())
    cal.errors = {"train_before": error_table(before), "train_after": error_table(after)}
    if holdout is not None:
        held = holdout[holdout["device"].map(lambda d: load_device(d).name == name)]
        if not held.empty:
            cal.errors["holdout_before"] = error_table(predict(held))
            cal.errors["holdout_after"] = error_table(predict(held, cal.hardware()))
    return cal


def _ranks(row: dict[Any, Any]) -> int:
    value = row.get("num_gpus")
    if isinstance(value, float | int) and not math.isnan(value):
        return int(value)
    return 2


def _role(row: dict[Any, Any]) -> str | None:
    value = row.get("link")
    return value.strip() if isinstance(value, str) and value.strip() else None


__all__ = ["COLLECTIVE_OPS", "Calibration", "ComputeFit", "calibrate", "fit_collective_groups",
           "fit_compute", "fit_link", "levenberg_marquardt"]
