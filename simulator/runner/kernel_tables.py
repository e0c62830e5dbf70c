"""Read NVIDIA AIConfigurator's measured kernel tables (the optional ``kernels`` extra).

``pip install 'disagg-sim[kernels]'`` installs ``aiconfigurator-core`` (Apache-2.0), whose
``aiconfigurator_core/systems/data/<system>/<op>/<engine>/<version>/*.parquet`` files hold
per-operator latencies measured on each system with each serving engine. Only the
per-operator tables are read: GEMM, context/generation attention, MoE and the engine's
all-reduce. Latencies in the files are milliseconds.
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.cost.predictor import TablePredictor
from simulator.cost.step import InstanceCostModel
from simulator.cost.tables import GridTable, KernelTables
from simulator.errors import ConfigError
from simulator.hardware.profiles import DeviceProfile
from simulator.scenario.schema import CostSpec

PACKAGE = "aiconfigurator_core"
INSTALL_HINT = "pip install 'disagg-sim[kernels]' (installs aiconfigurator-core)"

_DTYPES = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block",
           "nvfp4": "fp4", "fp4": "fp4"}


def tables_root() -> Path | None:
    """``systems/data`` of the installed package, or ``None`` when it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"
    return root if root.is_dir() else None


def devices_with_tables(root: Path, names: list[str] | None,
                        need_sms: bool = False) -> list[DeviceProfile]:
    """The device profiles ``names`` (default: every profile naming a ``kernel_tables``
    system) whose system ``root`` holds; with ``need_sms``, those with an ``sm_count``."""
    from simulator.hardware.registry import device_names, load_device

    devices = [load_device(n) for n in names or device_names()]
    return [d for d in devices if d.kernel_tables is not None
            and (root / d.kernel_tables).is_dir() and (d.sm_count or not need_sms)]


def package_version(root: Path | None = None) -> str:
    """Version of the package holding ``root`` (an unpacked wheel), else of the installed one."""
    if root is not None:
        for info in root.parents[2].glob("aiconfigurator_core-*.dist-info"):
            return info.name.removeprefix("aiconfigurator_core-").removesuffix(".dist-info")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiconfigurator-core")
    except PackageNotFoundError:
        return "unknown"


def _version_key(text: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.\-]", text))


def _pick_version(folder: Path, wanted: str | None, needs: str | None = None) -> Path | None:
    """``wanted`` if present, else the newest version folder (holding ``needs`` if given)."""
    if not folder.is_dir():
        return None
    versions = sorted((p for p in folder.iterdir() if p.is_dir()
                       and (needs is None or (p / needs).is_file())),
                      key=lambda p: _version_key(p.name))
    if not versions:
        return None
    if wanted is not None:
        for p in versions:
            if p.name == wanted:
                return p
    return versions[-1]


def _parts(key: Any) -> tuple[Any, ...]:
    """A pandas group key as a tuple (a scalar for one column)."""
    return tuple(key) if isinstance(key, tuple) else (key,)


DEFAULT_ATTENTION_KERNELS: dict[str, dict[str, tuple[str, ...]]] = {
    "sglang": {"h100_sxm": ("fa3",), "h200_sxm": ("fa3",), "b200_sxm": ("trtllm_mha",),
               "gb200": ("trtllm_mha",), "l40s": ("flashinfer",)},
    "vllm": {"h100_sxm": ("vllm_flash_attn_fa3",), "h200_sxm": ("vllm_flash_attn_fa3",),
             "b200_sxm": ("vllm_flashinfer_trtllmdecode", "vllm_flashinfer_trtllmprefill"),
             "gb200": ("vllm_flashinfer_trtllmdecode", "vllm_flashinfer_trtllmprefill"),
             "l40s": ("vllm_flash_attn_fa2", "vllm_flashinfer_fidecode",
                      "vllm_flashinfer_fiprefill")},
    "trtllm": {"b200_sxm": ("torch_flow",), "gb200": ("torch_flow",)},
}
"""The attention kernels (the tables' ``kernel_source``) each engine runs by default on each
system; the tables also time other backends a deployment may choose, each on the head
layouts it supports, and those rows are left out (a system or engine not listed keeps every
row). SGLang picks FA3 on Hopper, TensorRT-LLM's MHA kernels (``trtllm_mha``) on Blackwell
and FlashInfer elsewhere when ``--attention-backend`` is not given (sgl-project/sglang
``python/sglang/srt/server_args.py``, ``_get_default_attn_backend``; docs/backend/
attention_backend.md: "FA3 (Default for Hopper Machines)"), never its Triton kernels. vLLM's
V1 selector takes FlashAttention on Hopper (FA3) and Ada (FA2, whose kernels have no FP8 KV
cache, so an FP8 cache runs FlashInfer) and FlashInfer with TensorRT-LLM's decode and
prefill kernels on Blackwell (vllm-project/vllm ``vllm/platforms/cuda.py``,
``get_attn_backend_cls``); its Triton and FA4 rows are other backends. TensorRT-LLM's PyTorch
flow runs its own ``TRTLLM`` attention backend unless ``attn_backend: flashinfer`` is set
(``tensorrt_llm/llmapi/llm_args.py``, ``attn_backend`` default ``TRTLLM``)."""


def default_attention(frame: pd.DataFrame, engine: str, system: str | None) -> pd.DataFrame:
    """The rows of the kernels ``engine`` runs by default on ``system``
    (:data:`DEFAULT_ATTENTION_KERNELS`); every row where none is named."""
    kernels = DEFAULT_ATTENTION_KERNELS.get(engine, {}).get(system or "")
    if not kernels or "kernel_source" not in frame:
        return frame
    return frame[frame["kernel_source"].isin(kernels)]


def plain_attention(frame: pd.DataFrame) -> pd.DataFrame:
    """Full (no sliding window), beam-1 attention rows; ``step`` 0 where not recorded."""
    for column, value in (("window_size", 0), ("beam_width", 1)):
        if column in frame:
            frame = frame[frame[column] == value]
    frame = frame.copy()
    if "step" not in frame:
        frame["step"] = 0
    return frame


def _grid(frame: pd.DataFrame, axes: list[str]) -> GridTable:
    return GridTable.from_points(frame[axes].to_numpy(float), frame["latency"].to_numpy(float) * 1e-3)


def _fastest(frame: pd.DataFrame, shape: list[str]) -> pd.DataFrame:
    """Where several kernels were measured for one shape, the engine's fastest one."""
    return frame.groupby(shape)["latency"].min().reset_index()


def read_tables(root: Path, system: str, engine: str, version: str | None = None) -> KernelTables:
    """All tables of one system and engine (each op family at ``version`` or its newest)."""
    base = root / system
    if not base.is_dir():
        shipped = ", ".join(sorted(p.name for p in root.iterdir() if p.is_dir()))
        raise ConfigError(f"no kernel tables for system {system!r}; the package has {shipped}")
    used: dict[str, str] = {}

    def folder(op: str, needs: str) -> Path | None:
        found = _pick_version(base / op / engine, version, needs)
        if found is not None:
            used[op] = found.name
        return found

    gemm: dict[str, GridTable] = {}
    if (d := folder("gemm", "gemm_perf.parquet")) is not None:
        g = pd.read_parquet(d / "gemm_perf.parquet")
        g["dtype"] = g["gemm_dtype"].map(_DTYPES)
        for dtype, part in g.dropna(subset=["dtype"]).groupby("dtype"):
            gemm[str(dtype)] = _grid(_fastest(part, ["m", "n", "k"]), ["m", "n", "k"])

    context: dict[tuple[int, int, int, str], GridTable] = {}
    generation: dict[tuple[int, int, int, str], GridTable] = {}
    if (d := folder("attention", "context_attention_perf.parquet")) is not None:
        key = ["num_heads", "num_key_value_heads", "head_dim", "kv_dtype"]
        for name, target, length in (("context_attention_perf.parquet", context, "isl"),
                                     ("generation_attention_perf.parquet", generation, "kv_len")):
            if not (d / name).is_file():
                continue
            a = default_attention(plain_attention(pd.read_parquet(d / name)), engine, system)
            a["kv_dtype"] = a["kv_cache_dtype"].map(_DTYPES)
            # Generation rows: one new token on isl prompt tokens after `step` decode steps.
            a["kv_len"] = a["isl"] + a["step"]
            for k, part in a.dropna(subset=["kv_dtype"]).groupby(key):
                shape = ["batch_size", length]
                heads, kv_heads, head_dim, kv_dtype = _parts(k)
                hk = (int(heads), int(kv_heads), int(head_dim), str(kv_dtype))
                target[hk] = _grid(_fastest(part, shape), shape)

    allreduce: dict[int, GridTable] = {}
    if (d := folder("comm", "custom_allreduce_perf.parquet")) is not None:
        c = pd.read_parquet(d / "custom_allreduce_perf.parquet")
        if "backend" in c and c["backend"].astype(str).str.endswith("graph").any():
            c = c[c["backend"].astype(str).str.endswith("graph")]
        for n, part in c.groupby("num_gpus"):
            allreduce[int(_parts(n)[0])] = _grid(_fastest(part, ["message_size"]), ["message_size"])

    moe: dict[tuple[str, int, int, int, int, int, int], GridTable] = {}
    if (d := folder("moe", "moe_perf.parquet")) is not None:
        mo = pd.read_parquet(d / "moe_perf.parquet")
        mo = mo[mo["distribution"] == "balanced"].copy()
        mo["dtype"] = mo["moe_dtype"].map(_DTYPES)
        key = ["dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
               "moe_ep_size"]
        for k, part in mo.dropna(subset=["dtype"]).groupby(key):
            dtype, *dims = _parts(k)
            h, inter, topk, experts, tp, ep = (int(v) for v in dims)
            moe[(str(dtype), h, inter, topk, experts, tp, ep)] = _grid(
                _fastest(part, ["num_tokens"]), ["num_tokens"])

    if not used:
        raise ConfigError(f"no {engine} kernel tables for system {system!r}")
    versions = ", ".join(f"{op} {v}" for op, v in used.items())
    source = (f"aiconfigurator-core {package_version(root)}, systems/data/{system}/*/{engine}/ "
              f"({versions})")
    return KernelTables(system, engine, used.get("gemm", version or "newest"), source, gemm,
                        context, generation, allreduce, moe)


@cache
def load_tables(system: str, engine: str, version: str | None = None) -> KernelTables:
    """Tables of the installed package; a clear error naming what to install if absent."""
    root = tables_root()
    if root is None:
        raise ConfigError(f"predictor 'tables' needs the measured kernel tables: {INSTALL_HINT}")
    return read_tables(root, system, engine, version)


def predictor_for(spec: CostSpec, dev: DeviceProfile, engine: str,
                  file: str | None) -> tuple[type[InstanceCostModel], dict[str, Any]]:
    """The step-time predictor ``cost.predictor`` selects, with its keyword arguments."""
    if spec.predictor == "auto":
        return InstanceCostModel, {"fitted": bool(dev.operators)}
    if spec.predictor == "roofline":
        return InstanceCostModel, {}
    if spec.predictor == "fitted":
        return InstanceCostModel, {"fitted": True}
    if dev.kernel_tables is None:
        raise ConfigError(f"device {dev.name} has no measured kernel tables (its profile sets no "
                          "kernel_tables); use predictor: roofline or fitted for it", file=file,
                          key="cost.predictor")
    try:
        tables = load_tables(dev.kernel_tables, engine, spec.tables_version)
    except ConfigError as exc:
        raise ConfigError(exc.message, file=exc.file or file, key="cost.predictor") from None
    return TablePredictor, {"tables": tables, "fitted": True}
