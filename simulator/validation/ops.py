"""Measured operator timings: the CSV format, and predicting every row with the cost model.

One row is one operator measured on one device (format in docs/VALIDATION.md):
``op, device, dtype``, the shape columns the op needs, ``measured_latency_us`` and a
``source``. Compute operators are priced with :func:`simulator.cost.op_time` (one kernel
each) or, with an engine named, GEMMs and attention on that engine's fitted curves for the
device (the step model's rules, :func:`simulator.cost.operators.fitted_gemm_time` and
:func:`simulator.cost.step.fitted_attention_time`); collectives and
point-to-point transfers with the alpha-beta functions in :mod:`simulator.cost.collectives`
on the link the device profile names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.cost import allgather_time, allreduce_time, alltoall_time, op_time, p2p_time
from simulator.cost.batch import BatchShape
from simulator.cost.operators import fitted_gemm_time
from simulator.cost.step import fitted_attention_time
from simulator.errors import ConfigError
from simulator.hardware.profiles import DeviceProfile, LinkProfile
from simulator.hardware.registry import device_names, load_device, load_link
from simulator.units import BYTES_PER_ELEMENT, bytes_per_element
from simulator.validation import aliases

ATTENTION_OPS = ("attention_prefill", "attention_decode")
COMPUTE_OPS = ("gemm", *ATTENTION_OPS)
COLLECTIVE_OPS = ("allreduce", "allgather", "reducescatter", "alltoall")
COMM_OPS = (*COLLECTIVE_OPS, "p2p")
OPS = (*COMPUTE_OPS, *COMM_OPS)

SHAPE_COLUMNS: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k"),
    "attention_prefill": ("batch", "seq_len", "num_heads", "num_kv_heads", "head_dim"),
    "attention_decode": ("batch", "kv_len", "num_heads", "num_kv_heads", "head_dim"),
    **dict.fromkeys(COLLECTIVE_OPS, ("num_gpus", "message_bytes")),
    "p2p": ("message_bytes",),
}
NUMERIC_COLUMNS = ("m", "n", "k", "batch", "seq_len", "kv_len", "num_heads", "num_kv_heads",
                   "head_dim", "num_gpus", "message_bytes", "measured_latency_us")
LINK_ROLES = ("scale_up", "scale_out")


# ----- work of compute operators (pure functions) --------------------------------------
def _out_bytes(dtype: str) -> float:
    # 8- and 4-bit GEMMs write 16-bit outputs (the usual FP8/FP4 kernel epilogue).
    return max(bytes_per_element(dtype), 2.0)


def gemm_work(m: float, n: float, k: float, dtype: str) -> tuple[float, float]:
    """FLOPs and bytes of ``C[m,n] = A[m,k] @ B[k,n]``: inputs read once, output written once."""
    b = bytes_per_element(dtype)
    return 2.0 * m * n * k, (m * k + k * n) * b + m * n * _out_bytes(dtype)


def attention_prefill_work(batch: float, seq_len: float, *, num_heads: float,
                           num_kv_heads: float, head_dim: float, dtype: str,
                           ctx_len: float = 0.0) -> tuple[float, float]:
    """Causal prefill attention of ``seq_len`` new tokens on ``ctx_len`` cached ones.

    Same accounting as the step model: 4 FLOPs per head-dimension per query-key pair
    (scores and values), ``new * (ctx + (new + 1) / 2)`` pairs; bytes are the K/V read for
    every position plus Q read and O written for the new tokens.
    """
    pairs = seq_len * (ctx_len + (seq_len + 1) / 2)
    b = bytes_per_element(dtype)
    flops = 4.0 * num_heads * head_dim * pairs * batch
    kv = (ctx_len + seq_len) * 2 * num_kv_heads * head_dim
    io = seq_len * 2 * num_heads * head_dim
    return flops, batch * (kv + io) * b


def attention_decode_work(batch: float, kv_len: float, *, num_heads: float, num_kv_heads: float,
                          head_dim: float, dtype: str) -> tuple[float, float]:
    """One new token per sequence attending to ``kv_len`` cached tokens."""
    b = bytes_per_element(dtype)
    flops = 4.0 * num_heads * head_dim * kv_len * batch
    nbytes = batch * (kv_len * 2 * num_kv_heads * head_dim + 2 * num_heads * head_dim) * b
    return flops, nbytes


def compute_work(row: Mapping[Any, Any]) -> tuple[float, float]:
    """FLOPs and bytes of one compute row (``op`` in :data:`COMPUTE_OPS`)."""
    g = _getter(row)
    op, dtype = str(row["op"]), str(row["dtype"])
    if op == "gemm":
        return gemm_work(g("m"), g("n"), g("k"), dtype)
    if op == "attention_prefill":
        return attention_prefill_work(g("batch"), g("seq_len"), num_heads=g("num_heads"),
                                      num_kv_heads=g("num_kv_heads"), head_dim=g("head_dim"),
                                      dtype=dtype, ctx_len=g("kv_len"))
    if op == "attention_decode":
        return attention_decode_work(g("batch"), g("kv_len"), num_heads=g("num_heads"),
                                     num_kv_heads=g("num_kv_heads"), head_dim=g("head_dim"),
                                     dtype=dtype)
    raise ValueError(f"{op} is not a compute op")


def _getter(row: Mapping[Any, Any]) -> Callable[[str], float]:
    def get(key: str) -> float:
        value = row.get(key)
        return 0.0 if value is None or _missing(value) else float(value)
    return get


def _missing(value: Any) -> bool:
    """None, NaN or pandas' NA."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


# ----- profiles used for a prediction ----------------------------------------------------
@dataclass(frozen=True)
class HardwareSet:
    """Device and link profiles for predictions.

    Shipped profiles are looked up by the names in the CSV; ``devices`` replaces a device
    (keyed by the CSV name) and ``links`` replaces the link a device uses (keyed by
    ``(device name, link profile name)``), which is how a calibration is evaluated.
    """

    devices: dict[str, DeviceProfile] = field(default_factory=dict)
    links: dict[tuple[str, str], LinkProfile] = field(default_factory=dict)

    def device(self, name: str) -> DeviceProfile:
        return self.devices.get(name) or load_device(name)

    def link_name(self, device: str, role_or_name: str | None, num_gpus: int) -> str:
        """The link profile a transfer crosses: a role of the shipped device, or a name."""
        base = load_device(device)
        role = role_or_name or ("scale_up" if num_gpus <= base.scale_up_domain else "scale_out")
        if role not in LINK_ROLES:
            return role
        name = base.scale_up_link if role == "scale_up" else base.scale_out_link
        if name is None:
            name = base.scale_out_link if role == "scale_up" else base.scale_up_link
        if name is None:
            raise ConfigError(f"device {device} has no {role} link profile")
        return name

    def link(self, device: str, role_or_name: str | None, num_gpus: int) -> LinkProfile:
        name = self.link_name(device, role_or_name, num_gpus)
        return self.links.get((device, name)) or load_link(name)


# ----- reading the CSV -------------------------------------------------------------------
def read_ops(path: str | Path) -> pd.DataFrame:
    """Read and check an operator CSV; every problem is a ConfigError naming row and column."""
    file = str(path)
    try:
        df = pd.read_csv(path, comment="#", skipinitialspace=True, dtype={"link": "string"})
    except FileNotFoundError:
        raise ConfigError("file not found", file=file) from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ConfigError(f"cannot read CSV ({type(exc).__name__}: {exc})", file=file) from None
    df.columns = [str(c).strip().lower() for c in df.columns]
    missing = [c for c in ("op", "device", "measured_latency_us") if c not in df.columns]
    if missing:
        raise ConfigError(f"missing column(s) {missing}; see docs/VALIDATION.md for the format",
                          file=file, key="header")
    if df.empty:
        raise ConfigError("no rows", file=file)
    for col in NUMERIC_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
        converted = pd.to_numeric(df[col], errors="coerce")
        bad = converted.isna() & df[col].notna()
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise ConfigError(f"not a number: {df[col].iloc[i]!r}", file=file, key=_key(i, col))
        df[col] = converted.astype(float)
    for col in ("dtype", "link", "source"):
        if col not in df.columns:
            df[col] = pd.NA
        df[col] = df[col].astype("string").str.strip()
    df["op"] = df["op"].astype(str).str.strip().str.lower()
    # bfloat16 / BF16 / fp8_e4m3 and "NVIDIA H100 80GB HBM3" spellings, as in validate-serving.
    df["dtype"] = df["dtype"].map(aliases.precision_or_same, na_action="ignore").astype("string")
    names = device_names()
    df["device"] = [str(aliases.device_or_same(str(d).strip(), names)) for d in df["device"]]
    for i, row in enumerate(df.to_dict("records")):
        _check_row(row, i, file)
    return df.reset_index(drop=True)


def _key(i: int, col: str) -> str:
    return f"row {i + 1} (line {i + 2}).{col}"


def _check_row(row: dict[Any, Any], i: int, file: str) -> None:
    op = row["op"]
    if op not in OPS:
        raise ConfigError(f"unknown op {op!r}; allowed: {', '.join(OPS)}", file=file,
                          key=_key(i, "op"))
    try:
        device = load_device(str(row["device"]))
    except ConfigError as exc:
        raise ConfigError(exc.message, file=file, key=_key(i, "device")) from None
    if not float(row["measured_latency_us"]) > 0:
        raise ConfigError("measured_latency_us must be > 0", file=file,
                          key=_key(i, "measured_latency_us"))
    needed = list(SHAPE_COLUMNS[str(op)])
    for col in needed:
        value = row[col]
        if _missing(value) or float(value) <= 0:
            raise ConfigError(f"op {op} needs {col} > 0 (needs {', '.join(needed)})",
                              file=file, key=_key(i, col))
    kv_len = row["kv_len"]
    if op == "attention_prefill" and not _missing(kv_len) and float(kv_len) < 0:
        raise ConfigError("kv_len (cached context) must be >= 0", file=file, key=_key(i, "kv_len"))
    if op in ATTENTION_OPS:
        for col in (*needed, "kv_len"):
            value = row[col]
            if not _missing(value) and not float(value).is_integer():
                raise ConfigError(f"op {op} needs {col} a whole number, got {value!r}",
                                  file=file, key=_key(i, col))
        if float(row["num_heads"]) % float(row["num_kv_heads"]):
            raise ConfigError(f"num_heads ({row['num_heads']:g}) must be a multiple of "
                              f"num_kv_heads ({row['num_kv_heads']:g})", file=file,
                              key=_key(i, "num_kv_heads"))
    if op in COMPUTE_OPS:
        dtype = row["dtype"]
        if not isinstance(dtype, str) or dtype.strip() not in BYTES_PER_ELEMENT:
            raise ConfigError(f"op {op} needs dtype, one of {', '.join(BYTES_PER_ELEMENT)}",
                              file=file, key=_key(i, "dtype"))
    if op in COLLECTIVE_OPS and float(row["num_gpus"]) < 2:
        raise ConfigError("a collective needs num_gpus >= 2", file=file, key=_key(i, "num_gpus"))
    link = row["link"]
    if op in COMM_OPS and isinstance(link, str) and link.strip():
        name = link.strip()
        if name not in LINK_ROLES:
            try:
                load_link(name)
            except ConfigError as exc:
                raise ConfigError(f"{exc.message}; or a role: {', '.join(LINK_ROLES)}",
                                  file=file, key=_key(i, "link")) from None
        elif (device.scale_up_link or device.scale_out_link) is None:
            raise ConfigError(f"device {device.name} has no link profiles", file=file,
                              key=_key(i, "device"))


# ----- predicting -------------------------------------------------------------------------
def predict_row(row: Mapping[Any, Any], hw: HardwareSet | None = None,
                engine: str | None = None) -> tuple[float, str, str]:
    """Predicted seconds of one row, what bounds it (compute, memory or the link) and what
    priced it: ``engine``'s fitted GEMM or attention curve on the row's device where it has
    one (``<engine> fit``, as the step model prices that engine's GEMMs and attention), else
    the device-wide roofline, or the link's collective model."""
    hw = hw or HardwareSet()
    op, device_name = str(row["op"]), str(row["device"])
    g = _getter(row)
    if op in COMPUTE_OPS:
        device = hw.device(device_name)
        if engine is not None:
            fitted = (fitted_gemm_time(device, engine, str(row["dtype"]), g("m"), g("n"), g("k"))
                      if op == "gemm" else _fitted_attention(row, device, engine))
            if fitted is not None:
                compute, memory = fitted
                return (max(compute, memory), "compute" if compute >= memory else "memory",
                        f"{engine} fit")
        flops, nbytes = compute_work(row)
        t = op_time(device, str(row["dtype"]), flops, nbytes, kernels=1)
        return t.seconds, t.bound, "roofline"
    link_value = row.get("link")
    role = link_value.strip() if isinstance(link_value, str) and link_value.strip() else None
    ranks = int(g("num_gpus")) or 2
    link = hw.link(device_name, role, ranks)
    nbytes = g("message_bytes")
    if op == "allreduce":
        return allreduce_time(nbytes, ranks, link), link.name, "link"
    if op in ("allgather", "reducescatter"):
        return allgather_time(nbytes, ranks, link, op), link.name, "link"
    if op == "alltoall":
        return alltoall_time(nbytes, ranks, link), link.name, "link"
    return p2p_time(nbytes, link), link.name, "link"


def attention_batch(row: Mapping[Any, Any]) -> BatchShape:
    """The step an attention row runs: ``batch`` prefill chunks of ``seq_len`` new tokens on
    ``kv_len`` cached ones each, or ``batch`` decode sequences of ``kv_len`` context each."""
    g = _getter(row)
    batch, kv_len = int(g("batch")), int(g("kv_len"))
    if str(row["op"]) == "attention_prefill":
        return BatchShape.build([(int(g("seq_len")), kv_len, True)] * batch)
    return BatchShape.decode(batch, batch * kv_len, kv_len)


def _fitted_attention(row: Mapping[Any, Any], device: DeviceProfile,
                      engine: str) -> tuple[float, float] | None:
    g = _getter(row)
    return fitted_attention_time(device, engine, str(row["dtype"]), attention_batch(row),
                                 num_heads=int(g("num_heads")),
                                 num_kv_heads=int(g("num_kv_heads")),
                                 head_dim=int(g("head_dim")))


def fitted_engines(df: pd.DataFrame) -> list[str]:
    """The engines some device of ``df`` carries fitted kernel curves for, sorted."""
    names: set[str] = set()
    for device in df["device"].dropna().unique():
        names.update(load_device(str(device)).operators or {})
    return sorted(names)


def predict(df: pd.DataFrame, hw: HardwareSet | None = None,
            engine: str | None = None) -> pd.DataFrame:
    """The rows with ``predicted_latency_us``, ``bound``, ``priced_by``, ``error`` (signed)
    and ``ape``; ``engine`` prices GEMMs and attention on that engine's fitted curves
    (:func:`predict_row`)."""
    hw = hw or HardwareSet()
    out = df.copy()
    preds = [predict_row(r, hw, engine) for r in df.to_dict("records")]
    out["predicted_latency_us"] = [p[0] * 1e6 for p in preds]
    out["bound"] = [p[1] for p in preds]
    out["priced_by"] = [p[2] for p in preds]
    out["error"] = out["predicted_latency_us"] / out["measured_latency_us"] - 1.0
    out["ape"] = out["error"].abs()
    return out


def error_table(pred: pd.DataFrame) -> pd.DataFrame:
    """Per op and device: count, median and p90 absolute percentage error, median signed."""
    rows = []
    for (op, device), grp in pred.groupby(["op", "device"], sort=True):
        rows.append(_stats(str(op), str(device), grp))
    for device, grp in pred.groupby("device", sort=True):
        rows.append(_stats("all", str(device), grp))
    return pd.DataFrame(rows)


def _stats(op: str, device: str, grp: pd.DataFrame) -> dict[str, object]:
    ape = grp["ape"].to_numpy(dtype=float)
    return {
        "op": op,
        "device": device,
        "count": len(grp),
        "median_ape_pct": float(np.median(ape) * 100),
        "p90_ape_pct": float(np.percentile(ape, 90) * 100),
        "median_error_pct": float(np.median(grp["error"].to_numpy(dtype=float)) * 100),
    }


def worst_rows(pred: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    return pred.sort_values("ape", ascending=False).head(n)


def split_rows(df: pd.DataFrame, rng: np.random.Generator,
               fraction: float = 0.5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Random ``fraction`` of each (device, op) group for fitting, the rest held out."""
    train: list[int] = []
    for _, grp in df.groupby(["device", "op"], sort=True):
        idx = grp.index.to_numpy()
        picked = rng.permutation(idx)[: max(1, round(len(idx) * fraction))] if len(idx) > 1 else idx
        train.extend(int(i) for i in picked)
    mask = df.index.isin(train)
    return df[mask], df[~mask]
