"""Validation and calibration: CSV formats, predictions, fits, CLI, and error regressions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from simulator.cli import app, main
from simulator.cost import allgather_time, allreduce_time, op_time, p2p_time
from simulator.errors import ConfigError
from simulator.hardware.engines import load_engine
from simulator.hardware.profiles import Efficiency, EfficiencyCurve
from simulator.hardware.registry import load_device, load_link
from simulator.runner.build import build_plan
from simulator.runner.run import run
from simulator.validation import baseline
from simulator.validation.calibrate import calibrate, fit_compute, fit_link
from simulator.validation.ops import (
    HardwareSet,
    attention_decode_work,
    attention_prefill_work,
    gemm_work,
    predict,
    read_ops,
    split_rows,
)
from simulator.validation.profile_io import file_digest, load_calibration
from simulator.validation.serving import long_errors, read_serving, row_scenario, simulate_rows
from tests.conftest import REPO, make_scenario

runner = CliRunner()
VALID = REPO / "scenarios" / "validation"
BASELINE = json.loads((REPO / "docs" / "validation_baseline.json").read_text())
H100 = load_device("H100-SXM")
NVL = load_link("nvlink4")


def write_csv(tmp_path: Path, rows: list[dict[str, object]], name: str = "ops.csv") -> Path:
    path = tmp_path / name
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


# ----- per-precision efficiency (shared profile change) -----------------------------------
def test_compute_by_precision_selects_the_fp8_share() -> None:
    flops = 2.0 * 8192**3
    t8 = op_time(H100, "fp8", flops, 0.0, kernels=0).seconds
    t16 = op_time(H100, "bf16", flops, 0.0, kernels=0).seconds
    assert t8 == pytest.approx(flops / (1979e12 * 0.62))
    assert t16 == pytest.approx(flops / (989e12 * 0.78))
    curve = Efficiency(compute=0.8, memory=0.8, calibrated_on="x",
                       compute_curve=EfficiencyCurve(eta_max=0.8, half_work=1e9),
                       compute_by_precision={"fp8": 0.6})
    assert curve.eta_compute(1e9, "fp8") == pytest.approx(0.3)  # 0.6 * 1e9 / 2e9
    assert curve.eta_compute(1e9, "bf16") == pytest.approx(0.4)
    with pytest.raises(ValueError, match="compute_by_precision"):
        Efficiency(compute=0.8, memory=0.8, calibrated_on="x", compute_by_precision={"fp8": 1.5})


# ----- work formulas -----------------------------------------------------------------------
def test_work_formulas_by_hand() -> None:
    assert gemm_work(2, 3, 4, "bf16") == (48.0, (2 * 4 + 4 * 3) * 2 + 2 * 3 * 2)
    assert gemm_work(2, 3, 4, "fp8")[1] == (2 * 4 + 4 * 3) * 1 + 2 * 3 * 2  # 16-bit output
    # decode: 4 FLOPs per head-dim per cached token; reads K and V of every cached token
    flops, nbytes = attention_decode_work(2, 100, num_heads=32, num_kv_heads=8, head_dim=128,
                                          dtype="bf16")
    assert flops == 4 * 32 * 128 * 100 * 2
    assert nbytes == 2 * (100 * 2 * 8 * 128 + 2 * 32 * 128) * 2
    # prefill of 4 new tokens on 6 cached: 4 * (6 + 2.5) = 34 causal pairs
    flops, _ = attention_prefill_work(1, 4, num_heads=2, num_kv_heads=1, head_dim=8,
                                      dtype="bf16", ctx_len=6)
    assert flops == 4 * 2 * 8 * 34


# ----- reading operator CSVs ---------------------------------------------------------------
GEMM = {"op": "gemm", "device": "H100-SXM", "dtype": "bf16", "m": 128, "n": 4096, "k": 4096,
        "measured_latency_us": 20.0, "source": "test"}


@pytest.mark.parametrize(("change", "key", "text"), [
    ({"op": "matmul"}, "row 2 (line 3).op", "allowed: gemm"),
    ({"device": "H999"}, "row 2 (line 3).device", "unknown device"),
    ({"m": "lots"}, "row 2 (line 3).m", "not a number"),
    ({"k": None}, "row 2 (line 3).k", "needs k > 0"),
    ({"dtype": "fp7"}, "row 2 (line 3).dtype", "needs dtype"),
    ({"measured_latency_us": -1}, "row 2 (line 3).measured_latency_us", "> 0"),
])
def test_bad_operator_rows_name_row_and_column(tmp_path: Path, change: dict[str, object],
                                               key: str, text: str) -> None:
    path = write_csv(tmp_path, [GEMM, {**GEMM, **change}])
    with pytest.raises(ConfigError) as info:
        read_ops(path)
    assert info.value.key == key
    assert text in info.value.message
    assert info.value.file == str(path)


def test_missing_column_and_file(tmp_path: Path) -> None:
    path = write_csv(tmp_path, [{"op": "gemm", "device": "H100-SXM"}])
    with pytest.raises(ConfigError, match="measured_latency_us"):
        read_ops(path)
    with pytest.raises(ConfigError, match="file not found"):
        read_ops(tmp_path / "nope.csv")


def test_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path, [{**GEMM, "op": "conv"}])
    with pytest.raises(SystemExit) as info:
        main(["validate", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "row 1 (line 2).op" in err
    assert "Traceback" not in err


# ----- GEMMs on an engine's fitted curves (validate --engine) ----------------------------
def test_engine_gemm_is_the_step_models_gemm(tmp_path: Path) -> None:
    """``validate --engine`` prices a GEMM as the step model prices a group of one GEMM on
    that engine's fitted curve: the same function, so a change to one moves the other."""
    from simulator.cost.accounting import LinkSet, _Acc
    from simulator.cost.operators import fitted_gemm_time
    from simulator.cost.parallel import Parallelism, Precisions
    from simulator.cost.step import InstanceCostModel
    from simulator.models.catalog import get_model

    for precision, dtype in (("bf16", "bf16"), ("fp8", "fp8")):
        cost = InstanceCostModel(get_model("Llama-3.1-8B"), H100, Parallelism(tp=1),
                                 Precisions(precision, precision, "bf16"), LinkSet(),
                                 engine="vllm", fitted=True)
        for m, n, k in ((1, 4096, 4096), (384, 28672, 4096), (6000, 4096, 14336)):
            acc = _Acc()
            cost._gemm(acc, m, n * k, n, k, 1.0, kernels=1, label="gemm_ffn",
                       shapes=((n, k),))
            fitted = fitted_gemm_time(H100, "vllm", dtype, m, n, k)
            assert fitted is not None
            assert acc.launch == 0.0  # a fitted floor is kernel time
            assert acc.compute + acc.memory == pytest.approx(max(fitted), rel=1e-12)
    pred = predict(read_ops(write_csv(tmp_path, [GEMM])), engine="vllm")
    assert pred["priced_by"].tolist() == ["vllm fit"]
    assert pred["predicted_latency_us"].iloc[0] == pytest.approx(
        max(fitted_gemm_time(H100, "vllm", "bf16", 128, 4096, 4096) or (0.0,)) * 1e6)
    roof = predict(read_ops(write_csv(tmp_path, [GEMM])))
    assert roof["priced_by"].tolist() == ["roofline"]
    assert roof["predicted_latency_us"].iloc[0] != pred["predicted_latency_us"].iloc[0]


def test_engine_leaves_other_rows_and_devices_on_their_models(tmp_path: Path) -> None:
    rows = [
        {**GEMM, "device": "MI300X"},  # no fitted curves: the device-wide roofline
        {"op": "attention_decode", "device": "H100-SXM", "dtype": "bf16", "batch": 8,
         "kv_len": 2048, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
         "measured_latency_us": 30.0},
        {"op": "allreduce", "device": "H100-SXM", "num_gpus": 8, "message_bytes": 2**20,
         "measured_latency_us": 30.0},
    ]
    df = read_ops(write_csv(tmp_path, rows))
    with_engine, plain = predict(df, engine="trtllm"), predict(df)
    assert with_engine["priced_by"].tolist() == ["roofline", "trtllm fit", "link"]
    assert with_engine["predicted_latency_us"].tolist()[::2] == (
        plain["predicted_latency_us"].tolist()[::2])


def test_validate_engine_unknown_is_a_clear_error(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path, [GEMM])
    with pytest.raises(SystemExit) as info:
        main(["validate", str(path), "--engine", "tgi"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--engine" in err
    assert "allowed: sglang, trtllm, vllm" in err
    assert "Traceback" not in err
    res = runner.invoke(app, ["validate", str(path), "--engine", "VLLM", "--worst", "0"])
    assert res.exit_code == 0, res.output
    assert "1 row on vllm's fitted curves" in " ".join(res.output.split())


# ----- attention on an engine's fitted curves (validate --engine) ------------------------
PREFILL = {"op": "attention_prefill", "device": "H100-SXM", "dtype": "bf16", "batch": 2,
           "seq_len": 1024, "kv_len": 512, "num_heads": 8, "num_kv_heads": 1, "head_dim": 128,
           "measured_latency_us": 100.0, "source": "test"}
DECODE = {"op": "attention_decode", "device": "H100-SXM", "dtype": "bf16", "batch": 16,
          "kv_len": 2048, "num_heads": 8, "num_kv_heads": 1, "head_dim": 128,
          "measured_latency_us": 40.0, "source": "test"}


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_engine_attention_is_the_step_models_attention(tmp_path: Path, engine: str) -> None:
    """``validate --engine`` prices an attention row as the step model prices that engine's
    attention: one layer of Llama-3.1-70B at TP 8 (8 query heads, 1 KV head per device)
    running the row's batch, read off the step's per-operator breakdown."""
    from simulator.cost import BatchShape, InstanceCostModel, LinkSet, Parallelism
    from simulator.models.catalog import get_model

    model = get_model("Llama-3.1-70B")
    cost = InstanceCostModel(model, H100, Parallelism(tp=8), links=LinkSet(tp=NVL),
                             engine=engine, fitted=True)
    pred = predict(read_ops(write_csv(tmp_path, [PREFILL, DECODE])), engine=engine)
    assert pred["priced_by"].tolist() == [f"{engine} fit"] * 2
    batches = {"attention_prefill": BatchShape.build([(1024, 512, True)] * 2),
               "attention_decode": BatchShape.decode(16, 16 * 2048, 2048)}
    for row in pred.to_dict("records"):
        label = str(row["op"])
        step = cost.breakdown(batches[label])[label] / model.num_layers
        assert row["predicted_latency_us"] == pytest.approx(step * 1e6, rel=1e-9), label
    roof = predict(read_ops(write_csv(tmp_path, [PREFILL, DECODE])))
    assert roof["priced_by"].tolist() == ["roofline"] * 2
    assert (roof["predicted_latency_us"] != pred["predicted_latency_us"]).all()


@pytest.mark.parametrize(("change", "key", "text"), [
    ({"batch": 1.5}, "row 2 (line 3).batch", "whole number"),
    ({"seq_len": 0}, "row 2 (line 3).seq_len", "needs seq_len > 0"),
    ({"kv_len": 16.5}, "row 2 (line 3).kv_len", "whole number"),
    ({"kv_len": -1}, "row 2 (line 3).kv_len", "must be >= 0"),
    ({"num_kv_heads": 3}, "row 2 (line 3).num_kv_heads", "multiple of num_kv_heads"),
    ({"head_dim": "wide"}, "row 2 (line 3).head_dim", "not a number"),
])
def test_bad_attention_rows_name_row_and_column(tmp_path: Path, change: dict[str, object],
                                                key: str, text: str) -> None:
    path = write_csv(tmp_path, [PREFILL, {**PREFILL, **change}])
    with pytest.raises(ConfigError) as info:
        read_ops(path)
    assert info.value.key == key
    assert text in info.value.message
    assert info.value.file == str(path)
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(path), "--engine", "vllm"])
    assert exit_info.value.code == 2


def test_shipped_attention_rows_are_read_and_priced_by_each_engine() -> None:
    df = read_ops(VALID / "ops_attention_a100.csv")
    assert sorted(df["op"].unique()) == ["attention_decode", "attention_prefill"]
    assert (df["device"] == "A100-SXM-80GB").all()
    assert df["source"].str.startswith("microsoft/vidur:data/profiling/a100/attention.csv@").all()
    for engine in ("vllm", "trtllm", "sglang"):
        pred = predict(df, engine=engine)
        assert (pred["priced_by"] == f"{engine} fit").all(), engine


# ----- predictions use the cost functions ------------------------------------------------
def test_predictions_equal_the_cost_functions(tmp_path: Path) -> None:
    rows = [
        GEMM,
        {"op": "attention_decode", "device": "H100-SXM", "dtype": "bf16", "batch": 8,
         "kv_len": 2048, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
         "measured_latency_us": 30.0},
        {"op": "allreduce", "device": "H100-SXM", "num_gpus": 8, "message_bytes": 2**20,
         "measured_latency_us": 30.0},
        {"op": "allgather", "device": "H100-SXM", "num_gpus": 16, "message_bytes": 2**20,
         "measured_latency_us": 90.0},
        {"op": "p2p", "device": "H100-SXM", "message_bytes": 2**26, "link": "scale_out",
         "measured_latency_us": 1500.0},
    ]
    pred = predict(read_ops(write_csv(tmp_path, rows)))
    us = pred["predicted_latency_us"].to_numpy()
    flops, nbytes = gemm_work(128, 4096, 4096, "bf16")
    assert us[0] == pytest.approx(op_time(H100, "bf16", flops, nbytes).seconds * 1e6)
    flops, nbytes = attention_decode_work(8, 2048, num_heads=32, num_kv_heads=8, head_dim=128,
                                          dtype="bf16")
    assert us[1] == pytest.approx(op_time(H100, "bf16", flops, nbytes).seconds * 1e6)
    assert us[2] == pytest.approx(allreduce_time(2**20, 8, NVL) * 1e6)
    ndr = load_link("ib-ndr")  # 16 GPUs leave the 8-GPU NVLink domain
    assert us[3] == pytest.approx(allgather_time(2**20, 16, ndr) * 1e6)
    assert us[4] == pytest.approx(p2p_time(2**26, ndr) * 1e6)
    assert pred["error"].iloc[0] == pytest.approx(us[0] / 20.0 - 1)
    assert list(pred["bound"])[2:] == ["nvlink4", "ib-ndr", "ib-ndr"]


# ----- fits recover known parameters -----------------------------------------------------
def _synthetic_gemms() -> pd.DataFrame:
    rows = []
    for m in (1, 4, 16, 64, 256, 1024, 4096):
        for n, k in ((1024, 8192), (8192, 8192), (28672, 8192), (8192, 28672)):
            for dtype in ("bf16", "fp8"):
                rows.append({**GEMM, "m": m, "n": n, "k": k, "dtype": dtype,
                             "measured_latency_us": 1.0})
    return pd.DataFrame(rows)


def test_compute_fit_recovers_the_parameters_that_made_the_data(tmp_path: Path) -> None:
    truth = H100.model_copy(update={"kernel_launch_us": 6.0, "efficiency": Efficiency(
        compute=0.6, memory=0.75, calibrated_on="synthetic",
        compute_curve=EfficiencyCurve(eta_max=0.6, half_work=5e9),
        compute_by_precision={"fp8": 0.45})})
    df = _synthetic_gemms()
    df["measured_latency_us"] = predict(df, HardwareSet({"H100-SXM": truth}))[
        "predicted_latency_us"]
    path = write_csv(tmp_path, df.to_dict("records"))
    fit = fit_compute(read_ops(path), H100)
    assert fit is not None
    assert fit.eta_by_precision["bf16"] == pytest.approx(0.6, rel=0.02)
    assert fit.eta_by_precision["fp8"] == pytest.approx(0.45, rel=0.02)
    assert fit.eta_memory == pytest.approx(0.75, rel=0.02)
    assert fit.kernel_launch_us == pytest.approx(6.0, rel=0.05)
    assert fit.half_flops == pytest.approx(5e9, rel=0.1)


def test_link_fit_recovers_latency_and_bandwidth_terms(tmp_path: Path) -> None:
    truth = NVL.model_copy(update={"collective_base_us": 7.0, "collective_hop_us": 1.3,
                                   "efficiency": 0.7, "per_transfer_overhead_us": 9.0,
                                   "nccl": None})
    rows = [{"op": op, "device": "H100-SXM", "num_gpus": n, "message_bytes": size,
             "measured_latency_us": 1.0}
            for op in ("allreduce", "allgather") for n in (2, 4, 8) for size in (512, 2**29)]
    rows += [{"op": "p2p", "device": "H100-SXM", "message_bytes": s, "link": "scale_up",
              "measured_latency_us": 1.0} for s in (256, 2**29)]
    df = read_ops(write_csv(tmp_path, rows))
    df["measured_latency_us"] = predict(df, HardwareSet({}, {("H100-SXM", "nvlink4"): truth}))[
        "predicted_latency_us"]
    terms = fit_link(df, NVL)
    assert terms["collective_base_us"] == pytest.approx(7.0, rel=0.05)
    assert terms["collective_hop_us"] == pytest.approx(1.3, rel=0.05)
    assert terms["efficiency"] == pytest.approx(0.7, rel=0.02)
    assert terms["per_transfer_overhead_us"] == pytest.approx(9.0, rel=0.05)


# ----- calibrating on one half improves the other half --------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_calibrating_on_half_improves_the_held_out_half(seed: int) -> None:
    df = read_ops(VALID / "ops_h100.csv")
    train, held = split_rows(df, np.random.default_rng(seed))
    assert set(train.index).isdisjoint(held.index)
    cal = calibrate(train, "H100-SXM", {"file": "ops_h100.csv"}, held)
    before = cal.errors["holdout_before"].set_index("op")
    after = cal.errors["holdout_after"].set_index("op")
    for op in ("gemm", "all"):
        assert after.loc[op, "median_ape_pct"] < 0.7 * before.loc[op, "median_ape_pct"]
        assert after.loc[op, "p90_ape_pct"] < before.loc[op, "p90_ape_pct"]


def test_calibrate_and_validate_cli_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "cal"
    ops = VALID / "ops_h100.csv"
    res = runner.invoke(app, ["calibrate", str(ops), "--device", "H100-SXM", "--out", str(out),
                              "--holdout", "0.5"])
    assert res.exit_code == 0, res.output
    assert "holdout after" in res.output
    manifest = yaml.safe_load((out / "H100-SXM-calibration.yaml").read_text())
    assert manifest["fitted_on"]["sha256"] == file_digest(ops)
    assert len(manifest["fitted_on"]["fitted_lines"]) < len(read_ops(ops))
    device = load_device(str(out / "H100-SXM-calibrated.yaml"))
    assert "ops_h100.csv" in device.efficiency.calibrated_on
    assert device.efficiency.compute_curve is not None
    assert {g["op"] for g in manifest["collective_groups"]} >= {"allreduce"}
    hw = load_calibration(out / "H100-SXM-calibration.yaml")
    assert hw.device("H100-SXM").name == "H100-SXM-calibrated"
    assert hw.link("H100-SXM", "scale_up", 8).name == "nvlink4-H100-SXM-calibrated"
    pred_file = tmp_path / "pred.csv"
    res = runner.invoke(app, ["validate", str(ops), "--calibration",
                              str(out / "H100-SXM-calibration.yaml"), "--out", str(pred_file)])
    assert res.exit_code == 0, res.output
    pred = pd.read_csv(pred_file)
    assert len(pred) == len(read_ops(ops))
    gemm = pred[pred["op"] == "gemm"]
    shipped = predict(read_ops(ops))
    assert gemm["ape"].median() < shipped[shipped["op"] == "gemm"]["ape"].median()


def test_calibrate_unknown_device_rows(tmp_path: Path) -> None:
    res = runner.invoke(app, ["calibrate", str(VALID / "ops_h100.csv"), "--device", "B200",
                              "--out", str(tmp_path)])
    assert res.exit_code != 0
    assert isinstance(res.exception, ConfigError)
    assert "no rows for device 'B200'" in str(res.exception)


# ----- serving validation ------------------------------------------------------------------
SERVE = {"model": "Llama-3.1-8B", "device": "H100-SXM", "tp": 1, "engine": "vllm",
         "precision": "bf16", "input_len": 256, "output_len": 32,
         "concurrency": 4, "num_requests": 24,
         "measured_ttft_ms": 40.0, "measured_tpot_ms": 9.0, "source": "test row"}


def test_validate_serving_matches_a_direct_run(tmp_path: Path) -> None:
    rows = [SERVE, {**SERVE, "concurrency": None, "request_rate": 5.0,
                    "statistic": "median", "measured_output_tok_s": 100.0,
                    "engine": "sglang"}]
    path = write_csv(tmp_path, rows, "serve.csv")
    df = read_serving(path)
    wide = simulate_rows(df, file=str(path))
    pred = long_errors(wide)
    assert len(pred) == 5  # 2 metrics + 3 metrics
    first = df.to_dict("records")[0]
    direct = run(row_scenario(first)).summary
    frontend = load_engine("vllm").frontend.seconds(int(first["input_len"]))
    ttft = pred[(pred["row"] == 1) & (pred["metric"] == "ttft_ms")].iloc[0]
    assert ttft["predicted"] == pytest.approx((direct["ttft_mean_s"] + frontend) * 1e3)
    assert ttft["error"] == pytest.approx(ttft["predicted"] / 40.0 - 1)
    second = run(row_scenario(df.to_dict("records")[1])).summary
    tpot = pred[(pred["row"] == 2) & (pred["metric"] == "tpot_ms")].iloc[0]
    assert tpot["predicted"] == pytest.approx(second["tpot_p50_s"] * 1e3)
    res = runner.invoke(app, ["validate-serving", str(path), "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 0, res.output
    assert "output_tok_s" in res.output
    assert "sglang" in res.output


@pytest.mark.parametrize(("change", "key"), [
    ({"arrival": "bursty"}, "row 1 (line 2).arrival"),
    ({"measured_ttft_ms": None, "measured_tpot_ms": None}, "row 1 (line 2).measured_*"),
    ({"model": "GPT-5"}, "row 1 (line 2).model"),
    ({"arrival": "closed_loop", "concurrency": None}, "row 1 (line 2).concurrency"),
    ({"model": "Llama-3.1-405B"}, "row 1 (line 2).cluster.pools[0].parallelism"),
])
def test_bad_serving_rows(tmp_path: Path, change: dict[str, object], key: str) -> None:
    path = write_csv(tmp_path, [{**SERVE, **change}], "serve.csv")
    with pytest.raises(ConfigError) as info:
        simulate_rows(read_serving(path), file=str(path))
    assert info.value.key == key


def test_engine_profiles_are_cited_and_selectable() -> None:
    for name, block in (("trtllm", 32), ("sglang", 1)):
        engine = load_engine(name)
        assert engine.source
        assert all(s.strip() for s in engine.source)
        plan = build_plan(make_scenario(engine=name))
        assert plan.engine.name == name
        assert plan.instances[0].block_size == block


# ----- the recorded errors must not regress -----------------------------------------------
Row = dict[str, object]


def _index(rows: list[Row], *keys: str) -> dict[tuple[object, ...], Row]:
    return {tuple(r[k] for k in keys): r for r in rows}


def test_operator_errors_do_not_regress() -> None:
    recorded = _index(BASELINE["ops"], "op", "device")
    fresh = _index(baseline.ops_figures(), "op", "device")
    assert fresh.keys() == recorded.keys()
    for key, row in fresh.items():
        assert row["count"] == recorded[key]["count"], key
        for stat in ("median_ape_pct", "p90_ape_pct"):
            assert row[stat] <= recorded[key][stat] + 0.5, (key, stat)  # type: ignore[operator]


def test_holdout_errors_do_not_regress() -> None:
    fresh = baseline.holdout_figures()
    for side in ("before", "after"):
        recorded = _index(BASELINE["holdout"][side], "op", "device")
        for key, row in _index(fresh[side], "op", "device").items():
            for stat in ("median_ape_pct", "p90_ape_pct"):
                assert row[stat] <= recorded[key][stat] + 0.5, (side, key, stat)  # type: ignore[operator]


def test_kernel_figures_do_not_regress() -> None:
    recorded = _index(BASELINE["kernels"], "figure")
    for key, row in _index(baseline.kernel_figures(), "figure").items():
        assert abs(row["error_pct"]) <= abs(recorded[key]["error_pct"]) + 0.5, key  # type: ignore[arg-type]


def test_phase_checks_of_the_calibration_reference() -> None:
    phases = baseline.phase_figures()
    decode = {(r["tp"], r["seqs"]): r["relative_to_1"] for r in phases["decode_llama2_70b_h100"]}
    for tp in (4, 8):  # "nearly flat in batch size up to ~16-32 sequences" on 4-8 GPUs
        assert decode[(tp, 32)] < 1.15
        assert decode[(tp, 256)] > 1.5  # then KV reads take over
    per_token = [r["us_per_token"] for r in phases["prefill_llama31_8b_h100"]]
    assert per_token[-1] > 1.3 * min(per_token)  # super-linear for long prompts


def _check_serving(devices: tuple[str, ...]) -> None:
    recorded = _index(BASELINE["serving"], "row", "metric")
    fresh = baseline.serving_figures(devices)
    assert fresh
    for row in fresh:
        rec = recorded[(row["row"], row["metric"])]
        assert row["device"] in devices
        assert row["ape"] <= rec["ape"] + 0.01, (row["row"], row["ape"], rec["ape"])  # type: ignore[operator]


def test_serving_errors_do_not_regress_h100() -> None:
    _check_serving(("H100-SXM",))


@pytest.mark.slow
def test_serving_errors_do_not_regress_all_rows() -> None:
    _check_serving(("H100-SXM", "H200-SXM"))


def test_shipped_datasets_cite_every_row() -> None:
    for name in baseline.OPS_FILES:
        df = read_ops(VALID / name)
        assert df["source"].notna().all(), name
        assert (df["source"].str.len() > 10).all(), name
    serving = read_serving(VALID / baseline.SERVING_FILE)
    assert serving["source"].notna().all()
    assert math.isclose(len(serving), 20)
