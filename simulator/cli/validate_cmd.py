"""`disagg-sim validate`, `calibrate` and `validate-serving`: the simulator against measurements."""

from __future__ import annotations

import datetime as dt
import math
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from simulator.cli.app import app
from simulator.cli.render import make_console
from simulator.errors import ConfigError


class Predictor(StrEnum):
    """``cost.predictor`` values (simulator/scenario/schema.py, CostSpec)."""

    auto = "auto"
    roofline = "roofline"
    fitted = "fitted"
    tables = "tables"


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _error_table(frame: Any, title: str) -> Table:
    table = Table(title=title)
    for col in ("op", "device", "rows", "median APE %", "p90 APE %", "median error %"):
        table.add_column(col, justify="left" if col in ("op", "device") else "right")
    for r in frame.to_dict("records"):
        table.add_row(r["op"], r["device"], str(r["count"]), _pct(r["median_ape_pct"]),
                      _pct(r["p90_ape_pct"]), _pct(r["median_error_pct"]))
    return table


def _shape(row: dict[Any, Any]) -> str:
    keys = ("m", "n", "k", "batch", "seq_len", "kv_len", "num_heads", "num_kv_heads", "head_dim",
            "num_gpus", "message_bytes")
    return " ".join(f"{k}={int(row[k])}" for k in keys
                    if isinstance(row.get(k), float) and not math.isnan(row[k]) and row[k])


def _worst_table(frame: Any, n: int) -> Table:
    from simulator.validation.ops import worst_rows

    table = Table(title=f"Worst {n} rows")
    for col in ("line", "op", "device", "shape", "measured us", "predicted us", "error %", "bound"):
        table.add_column(col, justify="right" if col in ("line", "measured us", "predicted us",
                                                         "error %") else "left")
    for r in worst_rows(frame, n).reset_index().to_dict("records"):
        table.add_row(str(int(r["index"]) + 2), r["op"], r["device"], _shape(r),
                      f"{r['measured_latency_us']:,.1f}", f"{r['predicted_latency_us']:,.1f}",
                      f"{r['error'] * 100:+.1f}", str(r["bound"]))
    return table


@app.command()
def validate(
    ops: Annotated[Path, typer.Argument(help="Operator CSV (format: docs/VALIDATION.md).")],
    calibration: Annotated[Path | None, typer.Option(help=(
        "A <device>-calibration.yaml written by `calibrate`: predict with its profiles."))] = None,
    out: Annotated[Path | None, typer.Option(help="Write every row with its prediction "
                                                  "(CSV).")] = None,
    worst: Annotated[int, typer.Option(min=0, help="How many worst rows to list.")] = 10,
    engine: Annotated[str | None, typer.Option(help=(
        "Price GEMM and attention rows on this serving engine's fitted kernel curves for the "
        "row's device "
        "(as the step model prices that engine), where the device profile has them; other "
        "rows, and devices without them, keep the device-wide roofline."))] = None,
) -> None:
    """Predict every operator in OPS with the cost model and report the errors."""
    from simulator.validation.ops import error_table, fitted_engines, predict, read_ops
    from simulator.validation.profile_io import load_calibration

    df = read_ops(ops)
    if engine is not None:
        known = fitted_engines(df)
        engine = engine.strip().lower()
        if engine not in known:
            raise ConfigError(f"no device of the file carries fitted kernel curves for "
                              f"engine {engine!r}; allowed: {', '.join(known) or 'none'}",
                              file=str(ops), key="--engine")
    hw = load_calibration(calibration) if calibration else None
    pred = predict(df, hw, engine)
    console = make_console()
    label = f" with {calibration.name}" if calibration else " (shipped profiles)"
    if engine is not None:
        fitted = int((pred["priced_by"] == f"{engine} fit").sum())
        label += f", {fitted} row{'s' if fitted != 1 else ''} on {engine}'s fitted curves"
    console.print(_error_table(error_table(pred), f"{ops.name}: absolute percentage error{label}"))
    if worst:
        console.print(_worst_table(pred, worst))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        pred.to_csv(out, index=False)
        console.print(f"wrote {out}")


@app.command()
def calibrate(
    ops: Annotated[Path, typer.Argument(help="Operator CSV (format: docs/VALIDATION.md).")],
    device: Annotated[str, typer.Option(help="Device profile to fit (rows of other devices "
                                             "are ignored).")],
    out: Annotated[Path, typer.Option(help="Folder for the calibrated profiles and the "
                                           "manifest.")] = Path("calibrated"),
    holdout: Annotated[float, typer.Option(min=0.0, max=0.9, help=(
        "Share of each (device, op) group held out of the fit and reported separately."))] = 0.0,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the hold-out split.")] = 0,
) -> None:
    """Fit DEVICE's efficiency factors and link terms to OPS; write a calibrated profile."""
    import numpy as np

    from simulator.validation.calibrate import calibrate as run_calibration
    from simulator.validation.ops import read_ops, split_rows
    from simulator.validation.profile_io import file_digest, write_calibration

    df = read_ops(ops)
    if holdout > 0:
        train, held = split_rows(df, np.random.default_rng(seed), 1.0 - holdout)
    else:
        train, held = df, None
    fitted_on = {
        "file": ops.name, "sha256": file_digest(ops), "date": dt.date.today().isoformat(),
        "rows_in_file": len(df), "holdout": holdout, "seed": seed,
        "fitted_lines": [int(i) + 2 for i in train.index] if held is not None else "all",
    }
    cal = run_calibration(train, device, fitted_on, held)
    paths = write_calibration(cal, out)
    console = make_console()
    _print_fit(console, cal)
    for key, frame in cal.errors.items():
        console.print(_error_table(frame, key.replace("_", " ")))
    console.print("wrote " + ", ".join(str(p) for p in paths))


def _print_fit(console: Console, cal: Any) -> None:
    if cal.compute is not None:
        c = cal.compute
        etas = ", ".join(f"{p} {v:.3f}" for p, v in c.eta_by_precision.items())
        console.print(f"compute efficiency: {etas}; half-efficiency work {c.half_flops:.3g} FLOP; "
                      f"memory efficiency {c.eta_memory:.3f}; per-kernel overhead "
                      f"{c.kernel_launch_us:.2f} us ({c.rows} rows)")
    for name, link in cal.links.items():
        console.print(f"{name}: base {link.collective_base_us:.2f} us, hop "
                      f"{link.collective_hop_us:.2f} us, efficiency {link.efficiency:.3f}, "
                      f"per-transfer overhead {link.per_transfer_overhead_us:.2f} us")
    if cal.collective_groups:
        table = Table(title="alpha-beta per collective and group size (what the data says)")
        for col in ("op", "GPUs", "rows", "alpha us", "link GB/s", "median APE %"):
            table.add_column(col, justify="left" if col == "op" else "right")
        for g in cal.collective_groups:
            bw = "-" if g["link_gb_per_s"] is None else f"{g['link_gb_per_s']:.1f}"
            table.add_row(g["op"], str(g["num_gpus"]), str(g["rows"]), f"{g['alpha_us']:.2f}",
                          bw, f"{g['median_ape_pct']:.1f}")
        console.print(table)


@app.command("validate-serving")
def validate_serving(
    results: Annotated[list[Path] | None, typer.Argument(help=(
        "Serving-results CSV files and/or `vllm bench serve --save-result` JSON files "
        "(format: docs/VALIDATION.md)."))] = None,
    max_requests: Annotated[int | None, typer.Option(min=1, help=(
        "Simulate at most this many requests per row (faster; throughput of an offline "
        "run then includes more ramp-up and drain)."))] = None,
    out: Annotated[Path | None, typer.Option(help=(
        "Write a wide CSV: every input column plus predicted_ttft_ms, predicted_tpot_ms, "
        "predicted_itl_ms, predicted_e2e_ms, predicted_output_tok_s."))] = None,
    device: Annotated[str | None, typer.Option(help=(
        "Device for JSON results whose --metadata does not name one."))] = None,
    engine: Annotated[str | None, typer.Option(help="Engine for JSON results (default vllm).")] = None,
    engine_version: Annotated[str | None, typer.Option(help="Engine version for JSON results.")] = None,
    tp: Annotated[int | None, typer.Option(min=1, help="TP for JSON results.")] = None,
    precision: Annotated[str | None, typer.Option(help="Precision for JSON results.")] = None,
    predictor: Annotated[Predictor, typer.Option(help=(
        "Step-time predictor for every row (`cost.predictor`): auto, roofline, fitted, or "
        "tables (measured kernel tables; needs the `kernels` extra)."))] = Predictor.auto,
    report: Annotated[bool, typer.Option("--report", help=(
        "Regenerate the serving section of docs/VALIDATION.md and docs/img/serving_parity.png "
        "from the shipped scenarios/validation/serving_*.csv (calibration set apart)."))] = False,
) -> None:
    """Simulate every serving point in RESULTS; print errors by engine, device, model, TP
    and concurrency (median and p90 absolute error, signed bias)."""
    from simulator.validation.serving import long_errors, serving_error_table, simulate_rows
    from simulator.validation.serving_io import read_serving

    console = make_console()
    if report:
        from simulator.validation.serving_report import build, write

        doc, image = Path("docs/VALIDATION.md"), Path("docs/img/serving_parity.png")
        if not doc.is_file():
            raise ConfigError("run --report from the repository root (docs/VALIDATION.md "
                              "not found)", file=str(doc))
        write(build(max_requests=max_requests), doc, image)
        console.print(f"wrote {doc} (serving section) and {image}")
        return
    if not results:
        raise ConfigError("give at least one results file (or --report)", key="RESULTS")
    defaults = {k: v for k, v in (("device", device), ("engine", engine), ("tp", tp),
                                  ("engine_version", engine_version),
                                  ("precision", precision)) if v is not None}
    df = read_serving(results, defaults)
    wide = simulate_rows(df, max_requests=max_requests, predictor=predictor.value)
    errors = long_errors(wide)
    table = Table(title="simulated vs measured")
    for col in ("file", "line", "model", "device", "TP", "engine", "ISL/OSL", "concurrency",
                "metric", "measured", "predicted", "error %"):
        table.add_column(col, justify="right" if col in ("line", "TP", "measured",
                                                         "predicted", "error %") else "left")
    for r in errors.to_dict("records"):
        table.add_row(Path(str(r["file"])).name, str(r["line"]), str(r["model"]),
                      str(r["device"]), str(r["tp"]), str(r["engine"]),
                      f"{r['input_len']}/{r['output_len']}", str(r["concurrency"]),
                      r["metric"], f"{r['measured']:,.4g}", f"{r['predicted']:,.4g}",
                      f"{r['error'] * 100:+.1f}")
    console.print(table)
    for by in ("engine", "device", "model", "tp", "concurrency"):
        keys = ("engine",) if by == "engine" else ("engine", by)
        summary = Table(title=f"absolute error by {by}")
        for col in ("metric", *keys, "rows", "median abs %", "p90 abs %", "bias %"):
            summary.add_column(col, justify="right" if col in ("rows", "median abs %",
                                                               "p90 abs %", "bias %") else "left")
        for r in serving_error_table(errors, keys).to_dict("records"):
            summary.add_row(r["metric"], *(str(r[k]) for k in keys), str(r["count"]),
                            _pct(r["median_ape_pct"]), _pct(r["p90_ape_pct"]),
                            f"{r['bias_pct']:+.1f}")
        console.print(summary)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        wide.to_csv(out, index=False)
        console.print(f"wrote {out}")
