"""The figures docs/VALIDATION.md reports, computed from the shipped datasets and profiles.

``python -m simulator.validation.baseline --json docs/validation_baseline.json`` records
them (the regression test in tests/test_validation.py compares fresh figures with that
file); ``--markdown`` prints the tables the document shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator._paths import data_dir
from simulator.cost import (
    BatchShape,
    InstanceCostModel,
    LinkSet,
    Parallelism,
    Precisions,
    allreduce_time,
    op_time,
    p2p_time,
)
from simulator.hardware.registry import load_device, load_link
from simulator.models.catalog import get_model
from simulator.validation.calibrate import calibrate
from simulator.validation.ops import error_table, gemm_work, predict, read_ops, split_rows

OPS_FILES = ("ops_h100.csv", "ops_nccl_a100_h200_b200.csv")
SERVING_FILE = "serving_trtllm_llama8b.csv"
HOLDOUT_SEED = 0


def validation_dir() -> Path:
    return data_dir("scenarios") / "validation"


def load_ops() -> pd.DataFrame:
    return pd.concat([read_ops(validation_dir() / f) for f in OPS_FILES], ignore_index=True)


def _rounded(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): (round(float(v), 2) if isinstance(v, float) else v) for k, v in r.items()}
            for r in frame.to_dict("records")]


def ops_figures() -> list[dict[str, Any]]:
    """Error per op and device of every shipped operator row, shipped profiles."""
    return _rounded(error_table(predict(load_ops())))


def holdout_figures(seed: int = HOLDOUT_SEED) -> dict[str, list[dict[str, Any]]]:
    """Calibrate each device on a random half of its rows; errors on the other half."""
    df = load_ops()
    train, held = split_rows(df, np.random.default_rng(seed))
    out: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for device in sorted(df["device"].unique()):
        cal = calibrate(train, device, {"file": "shipped ops CSVs", "seed": seed}, held)
        out["before"] += _rounded(cal.errors["holdout_before"])
        out["after"] += _rounded(cal.errors["holdout_after"])
    return out


def kernel_figures() -> list[dict[str, Any]]:
    """Aggregate kernel figures of the reference (section 1.6-1.7) against the cost model."""
    rows: list[dict[str, Any]] = []

    def gemm_rate(device: str, dtype: str, shape: tuple[int, int, int], what: str) -> float:
        flops, nbytes = gemm_work(*shape, dtype)
        seconds = op_time(load_device(device), dtype, flops, nbytes).seconds
        return (flops if what == "TFLOP/s" else nbytes) / seconds / 1e12

    big, stream = (8192, 8192, 8192), (8, 8192, 8192)
    aic = ("AIConfigurator TRT-LLM 1.3.0rc20 GEMM sweep median (ai-dynamo/aiconfigurator "
           "systems/data/<sku>/gemm/trtllm/1.3.0rc20/gemm_perf.parquet@095f58a; m,n,k >= 4096, "
           "or m <= 8 and n,k >= 8192 for weight streaming)")
    for device, dtype, shape, unit, measured in (
        ("H100-SXM", "bf16", big, "TFLOP/s", 771), ("H100-SXM", "fp8", big, "TFLOP/s", 1219),
        ("H100-SXM", "bf16", stream, "TB/s", 2.81),
        ("H200-SXM", "bf16", big, "TFLOP/s", 774), ("H200-SXM", "fp8", big, "TFLOP/s", 1245),
        ("H200-SXM", "bf16", stream, "TB/s", 4.00),
        ("B200", "bf16", big, "TFLOP/s", 1471), ("B200", "fp8", big, "TFLOP/s", 2374),
        ("B200", "fp4", big, "TFLOP/s", 3525), ("B200", "bf16", stream, "TB/s", 6.13),
    ):
        predicted = gemm_rate(device, dtype, shape, unit)
        label = ("m,n,k >= 4096 (model: 8192^3)" if shape == big
                 else "m <= 8 (model: 8 x 8192 x 8192)")
        rows.append({"figure": f"{device} {dtype} GEMM {label}", "unit": unit,
                     "measured": measured, "predicted": round(predicted, 3), "source": aic})
    vidur = ("Vidur profiling, torch.distributed + CUDA graphs (microsoft/vidur "
             "data/profiling/network/{h100_dgx,a100_dgx}/{all_reduce,send_recv}.csv@7d47513)")
    size = 536870912
    for device, ranks, algbw in (("H100-SXM", 2, 290), ("H100-SXM", 4, 226), ("H100-SXM", 8, 217),
                                 ("A100-SXM-80GB", 8, 114)):
        dev = load_device(device)
        t = allreduce_time(size, ranks, load_link(str(dev.scale_up_link)))
        rows.append({"figure": f"{device} all-reduce {ranks} GPUs large-message algbw",
                     "unit": "GB/s", "measured": algbw, "predicted": round(size / t / 1e9, 1),
                     "source": vidur})
    for name, link, gbps in (("H100 intra-node send/recv bandwidth", "nvlink4", 362),
                             ("H100 inter-node send/recv bandwidth", "ib-ndr", 34)):
        t = p2p_time(size, load_link(link))
        rows.append({"figure": name, "unit": "GB/s", "measured": gbps,
                     "predicted": round(size / t / 1e9, 1), "source": vidur})
    for r in rows:
        r["error_pct"] = round((r["predicted"] / r["measured"] - 1) * 100, 1)
    return rows


def phase_figures() -> dict[str, list[dict[str, Any]]]:
    """The qualitative phase checks of the calibration reference, as numbers."""
    h100 = load_device("H100-SXM")
    nvl = load_link("nvlink4")
    m70 = get_model("Llama-2-70B")
    decode = []
    for tp in (4, 8):
        cm = InstanceCostModel(m70, h100, Parallelism(tp=tp), Precisions(), LinkSet(tp=nvl))
        one = cm.step(BatchShape.decode(1, 1024, 1024)).seconds
        for seqs in (1, 8, 16, 32, 64, 128, 256):
            t = cm.step(BatchShape.decode(seqs, 1024 * seqs, 1024)).seconds
            decode.append({"tp": tp, "seqs": seqs, "step_ms": round(t * 1e3, 3),
                           "relative_to_1": round(t / one, 3)})
    m8 = get_model("Llama-3.1-8B")
    cm8 = InstanceCostModel(m8, h100)
    prefill = []
    for tokens in (128, 512, 2048, 8192, 32768):
        t = cm8.step(BatchShape.prefill(tokens)).seconds
        prefill.append({"prompt_tokens": tokens, "prefill_ms": round(t * 1e3, 3),
                        "us_per_token": round(t / tokens * 1e6, 3)})
    return {"decode_llama2_70b_h100": decode, "prefill_llama31_8b_h100": prefill}


def serving_figures(devices: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    from simulator.validation.serving import long_errors, simulate_rows
    from simulator.validation.serving_io import read_serving

    path = validation_dir() / SERVING_FILE
    df = read_serving(path)
    if devices is not None:
        df = df[df["device"].isin(devices)]
    pred = long_errors(simulate_rows(df, file=str(path)))
    keep = ("row", "device", "engine", "input_len", "output_len", "metric", "measured",
            "predicted", "error", "ape")
    return [{k: (round(float(r[k]), 4) if isinstance(r[k], float) else r[k]) for k in keep}
            for r in pred.to_dict("records")]


def all_figures() -> dict[str, Any]:
    return {"ops": ops_figures(), "holdout": holdout_figures(), "kernels": kernel_figures(),
            "phases": phase_figures(), "serving": serving_figures()}


def _markdown(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |\n"
                          for r in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="Write the figures to this JSON file.")
    parser.add_argument("--markdown", action="store_true", help="Print the tables.")
    args = parser.parse_args(argv)
    figures = all_figures()
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    if args.markdown:
        cols = ("op", "device", "count", "median_ape_pct", "p90_ape_pct", "median_error_pct")
        out = ["## ops\n", _markdown(figures["ops"], cols)]
        for key in ("before", "after"):
            out += [f"## holdout {key}\n", _markdown(figures["holdout"][key], cols)]
        out += ["## kernels\n", _markdown(figures["kernels"], ("figure", "unit", "measured",
                                                                "predicted", "error_pct"))]
        for key, rows in figures["phases"].items():
            out += [f"## {key}\n", _markdown(rows, tuple(rows[0]))]
        out += ["## serving\n", _markdown(figures["serving"], (
            "row", "device", "input_len", "output_len", "measured", "predicted", "error"))]
        sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
