"""Serving fidelity: user formats, engine host costs, the closed-loop client, warm-ups,
engine memory reserve, the declared-calibration fit and the generated report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from simulator.cli import app, main
from simulator.cost import BatchShape, InstanceCostModel, LinkSet, Parallelism
from simulator.cost.host import HostModel, host_model
from simulator.errors import ConfigError
from simulator.hardware.engines import engine_ref, load_engine
from simulator.hardware.registry import device_names, load_device, load_link
from simulator.models.catalog import get_model, model_names
from simulator.runner.build import build_plan
from simulator.runner.run import run
from simulator.validation import aliases
from simulator.validation.serving import long_errors, simulate_rows
from simulator.validation.serving_fit import fit, fit_joint
from simulator.validation.serving_io import read_serving, vllm_bench_record
from simulator.validation.serving_report import build, write
from tests.conftest import make_scenario

runner = CliRunner()
H100 = load_device("H100-SXM")
M8 = get_model("Llama-3.1-8B")
ROW = {"model": "meta-llama/Llama-3.1-8B-Instruct", "device": "H100-SXM", "engine": "vllm",
       "tp": 1, "input_len": 128, "output_len": 16, "concurrency": 2, "num_requests": 6,
       "measured_tpot_ms": 7.0, "source": "test"}


def _csv(tmp_path: Path, rows: list[dict[str, object]], name: str = "s.csv") -> Path:
    path = tmp_path / name
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


# ----- aliases --------------------------------------------------------------------------
@pytest.mark.parametrize(("given", "want"), [
    ("bfloat16", "bf16"), ("BF16", "bf16"), ("float16", "fp16"), ("FP8", "fp8"),
    ("fp8_e4m3", "fp8"), ("NVFP4", "fp4"), ("w4a16_awq", "int4"), (" Float32 ", "fp32"),
])
def test_precision_aliases(given: str, want: str) -> None:
    assert aliases.precision(given) == want


def test_unknown_names_list_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"allowed: .*bf16"):
        aliases.precision("bfloat17")
    with pytest.raises(ValueError, match="vllm, trtllm"):
        aliases.engine("llama.cpp")
    with pytest.raises(ValueError, match="shipped: "):
        aliases.device("TPU v5e", device_names())


@pytest.mark.parametrize(("given", "want"), [
    ("meta-llama/Llama-3.1-8B-Instruct", ("Llama-3.1-8B", None)),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", ("Llama-3.1-8B", "fp8")),
    ("meta-llama/Meta-Llama-3.1-70B-Instruct", ("Llama-3.1-70B", None)),
    ("meta-llama/Llama-3.3-70B-Instruct", ("Llama-3.1-70B", None)),
    ("nvidia/Llama-3.3-70B-Instruct-FP4", ("Llama-3.1-70B", "fp4")),
    ("deepseek-ai/DeepSeek-R1", ("DeepSeek-V3", None)),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", ("Mixtral-8x7B", None)),
    ("llama-3.1-8b", ("Llama-3.1-8B", None)),
])
def test_hugging_face_ids_resolve_with_their_precision(given: str, want: tuple[str, str | None]) -> None:
    assert tuple(aliases.model(given, model_names())) == want


@pytest.mark.parametrize(("given", "want"), [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("h100-sxm", "H100-SXM"), ("H100 PCIe", "H100-PCIe"),
    ("NVIDIA H200", "H200-SXM"), ("b200", "B200"), ("A100-SXM4-80GB", "A100-SXM-80GB"),
])
def test_device_names_as_tools_print_them(given: str, want: str) -> None:
    assert aliases.device(given, device_names()) == want


# ----- the serving CSV -------------------------------------------------------------------
def test_csv_headers_and_values_in_any_case(tmp_path: Path) -> None:
    row = {k.upper(): v for k, v in ROW.items()}
    row.update({"ENGINE": "vLLM", "PRECISION": "BFloat16", "DEVICE": "NVIDIA H100 80GB HBM3"})
    df = read_serving(_csv(tmp_path, [row]))
    rec = df.iloc[0]
    assert (rec["model"], rec["device"], rec["engine"], rec["precision"]) == (
        "Llama-3.1-8B", "H100-SXM", "vllm", "bf16")
    assert rec["arrival"] == "closed_loop"
    offline = read_serving(_csv(tmp_path, [{**ROW, "concurrency": None}], "o.csv"))
    assert offline.iloc[0]["arrival"] == "all_at_once"


def test_fp8_checkpoint_sets_the_precision(tmp_path: Path) -> None:
    df = read_serving(_csv(tmp_path, [{**ROW, "model": "nvidia/Llama-3.1-8B-Instruct-FP8"}]))
    assert df.iloc[0]["precision"] == "fp8"
    with pytest.raises(ConfigError, match="fp8 checkpoint"):
        read_serving(_csv(tmp_path, [{**ROW, "model": "nvidia/Llama-3.1-8B-Instruct-FP8",
                                      "precision": "bf16"}], "b.csv"))


@pytest.mark.parametrize(("change", "column"), [
    ({"tp": 0}, "tp"), ({"tp": 1.5}, "tp"), ({"input_len": "long"}, "input_len"),
    ({"concurrency": -4}, "concurrency"), ({"measured_tpot_ms": 0}, "measured_tpot_ms"),
    ({"precision": "bf17"}, "precision"), ({"engine": "llama.cpp"}, "engine"),
    ({"device": "TPU"}, "device"), ({"statistic": "p99"}, "statistic"),
    ({"memory_utilization": 1.5}, "memory_utilization"),
    ({"chunked_prefill": "maybe"}, "chunked_prefill"),
])
def test_bad_cells_name_file_row_and_column(tmp_path: Path, change: dict[str, object],
                                            column: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _csv(tmp_path, [ROW, {**ROW, **change}])
    with pytest.raises(ConfigError) as info:
        read_serving(path)
    assert info.value.file == str(path)
    assert info.value.key == f"row 2 (line 3).{column}"
    with pytest.raises(SystemExit) as code:
        main(["validate-serving", str(path)])
    assert code.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"row 2 (line 3).{column}" in err


def test_wide_out_and_grouped_tables(tmp_path: Path) -> None:
    path = _csv(tmp_path, [ROW, {**ROW, "concurrency": 1, "measured_ttft_ms": 20.0}])
    out = tmp_path / "pred.csv"
    res = runner.invoke(app, ["validate-serving", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    wide = pd.read_csv(out)
    assert len(wide) == 2
    for col in ("model_id", "input_len", "concurrency", "measured_tpot_ms", "predicted_ttft_ms",
                "predicted_tpot_ms", "predicted_itl_ms", "predicted_e2e_ms",
                "predicted_output_tok_s"):
        assert col in wide.columns, col
    assert (wide["predicted_tpot_ms"] > 0).all()
    for by in ("engine", "device", "model", "tp", "concurrency"):
        assert f"absolute error by {by}" in res.output
    assert "bias %" in res.output


# ----- vllm bench serve JSON -------------------------------------------------------------
BENCH = {"date": "20250801-120000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
         "num_prompts": 8, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 2,
         "completed": 8, "total_input_tokens": 1024, "total_output_tokens": 128,
         "output_throughput": 500.0, "mean_ttft_ms": 30.0, "median_ttft_ms": 29.0,
         "mean_tpot_ms": 7.0, "median_tpot_ms": 6.9, "mean_itl_ms": 7.0, "mean_e2el_ms": 140.0,
         "ttfts": [0.03] * 8, "gpu": "H100", "tp": "1"}


def test_vllm_bench_json_fields() -> None:
    rec = vllm_bench_record(BENCH)
    assert rec["input_len"] == 128
    assert rec["output_len"] == 16
    assert rec["concurrency"] == 2
    assert "request_rate" not in rec
    assert rec["measured_ttft_ms"] == 30.0
    assert rec["measured_e2e_ms"] == 140.0
    assert rec["measured_output_tok_s"] == 500.0
    assert "ttfts" not in rec


def test_vllm_bench_json_files_one_or_many(tmp_path: Path) -> None:
    one = tmp_path / "a.json"
    one.write_text(json.dumps(BENCH))
    many = tmp_path / "b.json"  # --append-result: one object per line
    many.write_text(json.dumps({**BENCH, "max_concurrency": 1}) + "\n" + json.dumps(BENCH) + "\n")
    df = read_serving([one, many])
    assert list(df["concurrency"]) == [2, 1, 2]
    assert set(df["device"]) == {"H100-SXM"}  # from --metadata gpu=H100
    bare = tmp_path / "c.json"
    bare.write_text(json.dumps({k: v for k, v in BENCH.items() if k not in ("gpu", "tp")}))
    with pytest.raises(ConfigError, match="device is required"):
        read_serving([bare])
    res = runner.invoke(app, ["validate-serving", str(bare), "--device", "H100-SXM",
                              "--max-requests", "4"])
    assert res.exit_code == 0, res.output
    bad = tmp_path / "d.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON") as info:
        read_serving([bad])
    assert info.value.file == str(bad)
    assert info.value.key == "line 1"


def test_engine_version_selects_a_versioned_profile_when_shipped() -> None:
    assert engine_ref("vllm", "0.21.0") == "vllm"  # no vllm-0.21 file: the default profile
    assert engine_ref("vllm", None) == "vllm"


# ----- host costs (cost/host.py) ---------------------------------------------------------
def test_batches_pad_to_the_next_captured_size() -> None:
    host = HostModel(graph_sizes=(1, 2, 4, 8, 16))
    assert [host.graph_batch(n) for n in (1, 3, 5, 16, 17)] == [1, 4, 8, 16, None]
    assert host.graph_batch(3, prefill_tokens=100) is None
    vllm = host_model(load_engine("vllm"), max_num_seqs=256)
    assert vllm.graph_batch(9) == 16
    assert vllm.graph_batch(250) == 256
    assert vllm.graph_batch(513) is None
    assert host_model(load_engine("vllm"), max_num_seqs=8).graph_sizes[-1] == 16  # 2 x seqs


def test_trtllm_pads_decode_batches_to_the_perf_overview_capture_list() -> None:
    """trtllm-bench's runs capture 1, 2, 4, ..., 256, 384, 512, 1024, ... with padding on; the
    engine keeps the sizes up to its max_batch_size. NIM's list is not published: a graph
    at every batch size, as before."""
    trt = host_model(load_engine("trtllm"), max_num_seqs=640)
    assert [trt.graph_batch(n) for n in (3, 300, 475, 512, 513)] == [4, 384, 512, 512, None]
    assert host_model(load_engine("trtllm"), max_num_seqs=4096).graph_batch(885) == 1024
    nim = host_model(load_engine("nim"), max_num_seqs=640)
    assert [nim.graph_batch(n) for n in (3, 475, 640)] == [3, 475, 640]


def test_each_attention_rank_captures_graphs_up_to_its_own_batch_limit() -> None:
    """With attention data parallelism the captured sizes are one rank's: a per-rank
    max_batch_size of 384 keeps sizes up to 384, so a rank's 375 sequences pad to 384."""
    pool = {"name": "main", "role": "colocated", "device": "H200-SXM",
            "parallelism": {"tp": 1, "dp": 4, "ep": 4},
            "scheduler": {"max_num_seqs": 4 * 384, "max_num_batched_tokens": 4 * 3584}}
    sc = make_scenario(model="Qwen3-235B-A22B", engine="trtllm", **{"cluster.pools": [pool]})
    host = build_plan(sc).pools[0].cost_models[0].host
    assert host.graph_sizes[-1] == 384
    assert host.graph_batch(375) == 384


def test_breakdown_lists_the_host_time_the_step_pays() -> None:
    host = HostModel(step_s=100e-6, per_seq_s=2e-6, eager_layer_s=10e-6, graph_sizes=(1, 8))
    cm = InstanceCostModel(M8, H100, host=host)
    assert cm.breakdown(BatchShape.decode(8, 8000))["host"] == pytest.approx(116e-6)
    eager = cm.breakdown(BatchShape.decode(9, 9000))["host"]
    assert eager == pytest.approx(100e-6 + 18e-6 + 10e-6 * M8.num_layers)


def test_padding_and_eager_launch_gaps_cost_time() -> None:
    pad = HostModel(graph_sizes=(1, 64), eager_layer_s=20e-6)
    plain = InstanceCostModel(M8, H100)
    padded = InstanceCostModel(M8, H100, host=pad)
    ctx = 3 * 1000
    assert padded.step(BatchShape.decode(3, ctx)).seconds > plain.step(BatchShape.decode(3, ctx)).seconds
    assert padded.step(BatchShape.decode(64, ctx)).seconds == pytest.approx(
        padded.step(BatchShape.decode(3, ctx)).seconds, rel=0.02)
    eager = padded.step(BatchShape.decode(65, ctx)).seconds
    graphed = padded.step(BatchShape.decode(64, ctx)).seconds
    assert eager - graphed > 0.9 * 20e-6 * M8.num_layers


@pytest.mark.parametrize(("overlap", "fitted"), [(0.0, False), (0.5, False), (1.0, False),
                                                (0.0, True)])
def test_decode_series_equals_steps_with_host_costs(overlap: float, fitted: bool) -> None:
    """Fast-forwarded decode equals step-by-step pricing, padding rows included (the
    fitted per-operator attention also sees the captured batch size)."""
    host = HostModel(step_s=300e-6, per_seq_s=5e-6, eager_layer_s=10e-6, overlap=overlap,
                     graph_sizes=(1, 2, 4, 8, 16, 32))
    cm = InstanceCostModel(M8, H100, host=host, fitted=fitted, engine="vllm")
    for seqs in (3, 16, 40):
        ctx = np.array([seqs * 500.0, seqs * 900.0])
        series = cm.decode_series(seqs, ctx)
        for j, c in enumerate(ctx):
            assert series.seconds[j] == pytest.approx(cm.step(BatchShape.decode(seqs, int(c))).seconds,
                                                      rel=1e-9)


def test_async_overlap_hides_host_time_up_to_the_gpu_step() -> None:
    gpu = InstanceCostModel(M8, H100).step(BatchShape.decode(8, 8000)).seconds
    for host_s in (0.2 * gpu, 3.0 * gpu):
        sync = InstanceCostModel(M8, H100, host=HostModel(step_s=host_s))
        hidden = InstanceCostModel(M8, H100, host=HostModel(step_s=host_s, overlap=1.0))
        b = BatchShape.decode(8, 8000)
        assert sync.step(b).seconds == pytest.approx(gpu + host_s)
        assert hidden.step(b).seconds == pytest.approx(max(gpu, host_s))


def test_a_host_bound_engine_has_flat_tpot_from_tp1_to_tp8() -> None:
    """SGLang-style overlap scheduling with host work above the GPU step: TP stops helping."""
    m70 = get_model("Llama-3.1-70B")
    nvl = load_link("nvlink4")
    host = HostModel(step_s=40e-3, overlap=1.0)
    steps = []
    for tp in (2, 4, 8):
        cm = InstanceCostModel(m70, H100, Parallelism(tp=tp), links=LinkSet(tp=nvl), host=host)
        steps.append(cm.step(BatchShape.decode(16, 16 * 1000)).seconds)
        gpu_only = InstanceCostModel(m70, H100, Parallelism(tp=tp), links=LinkSet(tp=nvl))
        assert gpu_only.step(BatchShape.decode(16, 16000)).seconds < 40e-3
    assert max(steps) == pytest.approx(min(steps), rel=1e-9)


def test_bad_host_models_are_refused() -> None:
    with pytest.raises(ValueError, match="overlap"):
        HostModel(overlap=1.5)
    with pytest.raises(ValueError, match="ascending"):
        HostModel(graph_sizes=(8, 4))


# ----- the closed-loop client ------------------------------------------------------------
def _closed(cv: float, turnaround: float = 0.002, warmup: int = 0, seed: int = 3) -> object:
    return make_scenario(**{
        "seed": seed,
        "workload.arrival": {"kind": "closed_loop", "concurrency": 8, "turnaround_s": turnaround,
                             "turnaround_cv": cv, "warmup_requests": warmup},
        "workload.input_tokens": {"kind": "fixed", "tokens": 512},
        "workload.output_tokens": {"kind": "fixed", "tokens": 40},
        "workload.num_requests": 64,
    })


def test_fixed_lengths_without_spread_run_in_lock_step_waves() -> None:
    steps = run(_closed(cv=0.0)).steps
    prefills = steps[steps["prefill_seqs"] > 0]["prefill_seqs"]
    assert (prefills == 8).all()  # every wave prefilled together, forever


def test_turnaround_spread_desynchronises_the_clients() -> None:
    result = run(_closed(cv=1.0))
    prefills = result.steps[result.steps["prefill_seqs"] > 0]["prefill_seqs"]
    assert prefills.iloc[0] == 8  # all clients start together, as the tools do
    assert prefills.iloc[len(prefills) // 2:].max() < 8
    assert result.summary["completed"] == 64
    again = run(_closed(cv=1.0))
    pd.testing.assert_frame_equal(result.requests, again.requests)


def test_turnaround_delays_the_next_request() -> None:
    reqs = run(_closed(cv=0.0, turnaround=0.05)).requests.sort_values("request_id")
    first, second = reqs.iloc[0], reqs.iloc[8]  # client 0's first and second request
    assert second["arrival_s"] == pytest.approx(first["completion_s"] + 0.05)


def test_a_request_waiting_out_its_turnaround_is_still_sent() -> None:
    # Two clients, three requests, a turnaround far longer than a request: client 0's
    # second request waits out its turnaround while client 1's first request ends with
    # nothing left in flight. The run is not over then: the third request is still to
    # be sent (it used to end the run and drop it).
    result = run(make_scenario(**{
        "seed": 1,
        "workload.arrival": {"kind": "closed_loop", "concurrency": 2, "turnaround_s": 1.0},
        "workload.input_tokens": {"kind": "fixed", "tokens": 64},
        "workload.output_tokens": {"kind": "fixed", "tokens": 8},
        "workload.num_requests": 3,
    }))
    reqs = result.requests.sort_values("request_id")
    assert result.summary["completed"] == 3
    assert reqs.iloc[2]["arrival_s"] == pytest.approx(reqs.iloc[0]["completion_s"] + 1.0)


def _ramped(ramp: float, warmup: int = 0) -> object:
    return make_scenario(**{
        "seed": 2,
        "workload.arrival": {"kind": "closed_loop", "concurrency": 4, "ramp_s": ramp,
                             "warmup_requests": warmup},
        "workload.input_tokens": {"kind": "fixed", "tokens": 64},
        "workload.output_tokens": {"kind": "fixed", "tokens": 4000},
        "workload.num_requests": 8,
    })


def test_a_concurrency_ramp_starts_the_clients_one_by_one() -> None:
    # aiperf --concurrency-ramp-duration 3 at concurrency 4: one client at t = 0 and one
    # more every second, the fourth at 3 s (requests long enough that none ends before).
    reqs = run(_ramped(3.0)).requests.sort_values("request_id")
    assert reqs["arrival_s"].iloc[:4].tolist() == pytest.approx([0.0, 1.0, 2.0, 3.0])
    assert (reqs["arrival_s"].iloc[4:] > 3.0).all()
    assert (run(_ramped(0.0)).requests["arrival_s"].iloc[:4] == 0.0).all()


def test_the_measured_phase_ramps_again_after_the_warmups() -> None:
    result = run(_ramped(3.0, warmup=4))
    reqs = result.requests.sort_values("request_id")
    warm, measured = reqs[reqs["warmup"]], reqs[~reqs["warmup"]]
    start = warm["completion_s"].max()
    assert (measured["arrival_s"].iloc[:4] - start).tolist() == pytest.approx([0, 1, 2, 3])
    assert result.summary["completed"] == 8


def test_the_csv_ramp_column_reaches_the_client(tmp_path: Path) -> None:
    from simulator.validation.serving import row_scenario

    rows = read_serving(_csv(tmp_path, [{**ROW, "concurrency": 4, "concurrency_ramp_s": 2.5,
                                          "measured_ttft_ms": 10.0}]))
    assert row_scenario(rows.to_dict("records")[0]).workload.arrival.ramp_s == 2.5
    bare = read_serving(_csv(tmp_path, [{**ROW, "concurrency": 4, "measured_ttft_ms": 10.0}]))
    assert row_scenario(bare.to_dict("records")[0]).workload.arrival.ramp_s == 0.0
    with pytest.raises(ConfigError, match="concurrency_ramp_s"):
        read_serving(_csv(tmp_path, [{**ROW, "concurrency": 4, "concurrency_ramp_s": "soon",
                                      "measured_ttft_ms": 10.0}]))


def test_warmup_requests_are_sent_first_and_left_out() -> None:
    result = run(_closed(cv=0.0, warmup=8))
    reqs = result.requests
    assert len(reqs) == 72
    assert int(reqs["warmup"].sum()) == 8
    warm, measured = reqs[reqs["warmup"]], reqs[~reqs["warmup"]]
    assert measured["arrival_s"].min() >= warm["completion_s"].max()
    assert result.summary["num_requests"] == 64
    assert result.summary["completed"] == 64


# ----- memory as the engine sizes it -----------------------------------------------------
def test_cuda_graph_reserve_comes_out_of_the_kv_pool(tmp_path: Path) -> None:
    base = load_engine("vllm").model_dump(mode="json")
    path = tmp_path / "vllm-graphs.yaml"
    path.write_text(json.dumps({**base, "cuda_graph_reserve_gib": 4.0}))
    plain = build_plan(make_scenario(engine="vllm")).instances[0]
    reserved = build_plan(make_scenario(engine=str(path))).instances[0]
    lost = (plain.kv_blocks - reserved.kv_blocks) * plain.block_size
    per_token = 2 * M8.num_layers * M8.num_kv_heads * M8.head_dim * 2
    assert lost * per_token == pytest.approx(4.0 * 1024**3, rel=0.01)


# ----- calibration fit and report --------------------------------------------------------
def test_fit_recovers_the_host_time_that_made_the_measurement(tmp_path: Path) -> None:
    truth = 700.0
    base = load_engine("vllm").model_dump(mode="json")
    path = tmp_path / "truth.yaml"
    path.write_text(json.dumps({**base, "step_overhead_us": truth}))
    rows = read_serving(_csv(tmp_path, [{**ROW, "concurrency": 1, "num_requests": 2,
                                          "output_len": 32}]))
    made = simulate_rows(rows.assign(engine=str(path)))
    rows = rows.assign(measured_tpot_ms=float(made.iloc[0]["predicted_tpot_ms"]))
    assert fit(rows, "vllm", "step_overhead_us", tol=2.0) == pytest.approx(truth, abs=3.0)


def test_a_per_layer_time_is_paid_on_every_step_graphed_or_not() -> None:
    hm = HostModel(step_s=100e-6, layer_s=30e-6, eager_layer_s=10e-6)
    assert hm.host_s(4, 32, graphed=True) == pytest.approx(100e-6 + 32 * 30e-6)
    assert hm.host_s(4, 32, graphed=False) == pytest.approx(100e-6 + 32 * 40e-6)
    v0 = host_model(load_engine("vllm-0.6"))
    assert v0.layer_s == pytest.approx(load_engine("vllm-0.6").per_layer_overhead_us * 1e-6)


def test_joint_fit_recovers_a_step_and_a_per_layer_time_from_two_models(
        tmp_path: Path) -> None:
    truth = {"step_overhead_us": 250.0, "per_layer_overhead_us": 40.0}
    base = load_engine("vllm-0.6").model_dump(mode="json")
    path = tmp_path / "truth.yaml"
    path.write_text(json.dumps({**base, **truth}))
    batch = {"device": "H100-SXM", "engine": "vllm", "engine_version": "0.6",
             "input_len": 32, "output_len": 16, "concurrency": "", "num_requests": 8,
             "source": "test"}
    rows = read_serving(_csv(tmp_path, [
        {**batch, "model": "meta-llama/Llama-3.1-8B-Instruct", "tp": 1,
         "measured_e2e_ms": 1.0},
        {**batch, "model": "Llama-3.1-70B", "tp": 4, "measured_e2e_ms": 1.0}]))
    made = simulate_rows(rows.assign(engine=str(path), engine_version=None))
    rows = rows.assign(measured_e2e_ms=made["predicted_e2e_ms"].to_numpy())
    got = fit_joint(rows, "vllm-0.6", tuple(truth))
    assert got["step_overhead_us"] == pytest.approx(250.0, abs=2.0)
    assert got["per_layer_overhead_us"] == pytest.approx(40.0, abs=0.1)


def test_the_v0_constants_zero_the_errors_of_their_calibration_rows() -> None:
    """The committed vllm-0.6 constants are the fit's (python -m
    simulator.validation.serving_fit) on the declared calibration set."""
    cal = read_serving(Path("scenarios/validation/serving_calibration.csv"))
    rows = cal[cal["engine_version"] == "0.6"]
    assert len(rows) == 2
    assert {engine_ref("vllm", "0.6")} == {"vllm-0.6"}
    errors = long_errors(simulate_rows(rows))["error"]
    assert errors.abs().max() < 0.002


def test_report_keeps_calibration_apart_and_writes_its_section(tmp_path: Path) -> None:
    folder = tmp_path / "validation"
    folder.mkdir()
    cal = {**ROW, "concurrency": 1, "num_requests": 2}
    _csv(folder, [cal], "serving_calibration.csv")
    _csv(folder, [cal, {**ROW, "num_requests": 4}], "serving_other.csv")
    report = build(folder)
    assert len(report.calibration) == 1
    assert len(report.validation) == 1  # the repeated calibration point is not validation
    assert set(report.validation["class"]) == {"dense"}
    doc = tmp_path / "V.md"
    doc.write_text("# head\n<!-- serving-report:start -->old<!-- serving-report:end -->\ntail\n")
    write(report, doc, tmp_path / "img" / "parity.png")
    text = doc.read_text()
    assert "old" not in text
    assert text.startswith("# head")
    assert text.endswith("tail\n")
    assert "Calibration set" in text
    assert "Validation, MoE models" in text
    assert (tmp_path / "img" / "parity.png").stat().st_size > 1000
    assert long_errors(simulate_rows(read_serving(folder / "serving_other.csv"))).shape[0] == 2


def test_operator_csv_takes_the_same_aliases(tmp_path: Path) -> None:
    from simulator.validation.ops import predict, read_ops

    rows = [{"OP": "GEMM", "Device": "NVIDIA H100 80GB HBM3", "DType": "BFloat16", "m": 128,
             "n": 4096, "k": 4096, "measured_latency_us": 30.0, "source": "test"},
            {"OP": "gemm", "Device": "H100-SXM", "DType": "bf16", "m": 128,
             "n": 4096, "k": 4096, "measured_latency_us": 30.0, "source": "test"}]
    df = read_ops(_csv(tmp_path, rows, "ops.csv"))
    assert list(df["dtype"]) == ["bf16", "bf16"]
    assert list(df["device"]) == ["H100-SXM", "H100-SXM"]
    pred = predict(df)
    assert pred["predicted_latency_us"].iloc[0] == pred["predicted_latency_us"].iloc[1]
    with pytest.raises(ConfigError, match="needs dtype"):
        read_ops(_csv(tmp_path, [{**rows[1], "DType": "bfloat17"}], "bad.csv"))


def test_errors_give_the_file_line_after_comments(tmp_path: Path) -> None:
    path = _csv(tmp_path, [ROW, {**ROW, "tp": 0}])
    path.write_text("# a comment\n\n" + path.read_text())
    with pytest.raises(ConfigError) as info:
        read_serving(path)
    assert info.value.key == "row 2 (line 5).tp"


def test_parallelism_columns_reach_the_scenario(tmp_path: Path) -> None:
    from simulator.validation.serving import row_scenario

    row = {**ROW, "model": "mistralai/Mixtral-8x7B-Instruct-v0.1", "tp": 4, "ep": 2, "dp": 3,
           "request_rate": 2.0, "concurrency": None, "memory_utilization": 0.8,
           "max_num_seqs": 64}
    rec = read_serving(_csv(tmp_path, [row])).to_dict("records")[0]
    sc = row_scenario(rec)
    pool = sc.cluster.pools[0]
    assert (pool.parallelism.tp, pool.parallelism.ep, pool.instances) == (4, 2, 3)
    assert sc.workload.arrival.kind == "poisson"
    assert (pool.scheduler.memory_utilization, pool.scheduler.max_num_seqs) == (0.8, 64)
    assert sc.workload.num_requests == ROW["num_requests"]


def test_attention_dp_runs_the_tp_ranks_data_parallel_with_per_rank_limits(
        tmp_path: Path) -> None:
    """trtllm-bench --tp 4 --ep 4 with enable_attention_dp: four attention ranks, each with
    its own requests and KV, the experts over all four; the engine's limits are per rank."""
    from simulator.validation.serving import row_scenario

    row = {**ROW, "model": "nvidia/Qwen3-235B-A22B-FP8", "device": "H200-SXM", "tp": 4,
           "ep": None, "attention_dp": "true", "concurrency": None, "max_num_seqs": 512,
           "max_num_batched_tokens": 3584}
    rec = read_serving(_csv(tmp_path, [row])).to_dict("records")[0]
    assert (rec["tp"], rec["ep"], rec["attention_dp"]) == (4, 4, True)
    pool = row_scenario(rec).cluster.pools[0]
    par = pool.parallelism
    assert (par.tp, par.dp, par.ep, pool.instances) == (1, 4, 4, 1)
    assert (pool.scheduler.max_num_seqs, pool.scheduler.max_num_batched_tokens) == (2048, 14336)
    plain = read_serving(_csv(tmp_path, [{**row, "attention_dp": None}], "p.csv"))
    pool = row_scenario(plain.to_dict("records")[0]).cluster.pools[0]
    assert (pool.parallelism.tp, pool.parallelism.dp, pool.scheduler.max_num_seqs) == (4, 1, 512)


@pytest.mark.parametrize(("change", "column", "says"), [
    ({"ep": 2}, "ep", "ep must be 4"),
    ({"tp": 1, "ep": None}, "tp", "tp >= 2"),
    ({"model": "meta-llama/Llama-3.1-8B-Instruct", "ep": None}, "attention_dp", "dense"),
    ({"attention_dp": "sometimes"}, "attention_dp", "true or false"),
])
def test_bad_attention_dp_rows_name_the_row_and_column(tmp_path: Path, change: dict[str, object],
                                                       column: str, says: str) -> None:
    row = {**ROW, "model": "nvidia/Qwen3-235B-A22B-FP8", "device": "H200-SXM", "tp": 4,
           "ep": 4, "attention_dp": "true", **change}
    path = _csv(tmp_path, [row])
    with pytest.raises(ConfigError, match=says) as info:
        read_serving(path)
    assert info.value.key == f"row 1 (line 2).{column}"


def test_the_report_keeps_moe_fp4_rows_out_of_the_dense_fp4_and_moe_groups() -> None:
    from simulator.validation.serving_report import row_class

    assert row_class("Llama-3.1-70B", "fp4") == "FP4"
    assert row_class("Qwen3-235B-A22B", "fp4") == "MoE FP4"
    assert row_class("Qwen3-235B-A22B", "fp8") == "MoE"
    assert row_class("Llama-3.1-70B", "fp8") == "dense"


def test_the_predictor_option_prices_every_row_with_it(tmp_path: Path) -> None:
    path = _csv(tmp_path, [ROW])
    wide = {}
    for predictor in ("auto", "roofline"):
        out = tmp_path / f"{predictor}.csv"
        res = runner.invoke(app, ["validate-serving", str(path), "--out", str(out),
                                  "--predictor", predictor])
        assert res.exit_code == 0, res.output
        wide[predictor] = pd.read_csv(out).iloc[0]
    assert (wide["auto"]["cost_predictor"], wide["roofline"]["cost_predictor"]) == (
        "fitted", "roofline")
    assert wide["auto"]["predicted_tpot_ms"] != wide["roofline"]["predicted_tpot_ms"]
    res = runner.invoke(app, ["validate-serving", str(path), "--predictor", "guess"])
    assert res.exit_code == 2


def test_the_predictor_choices_are_the_scenario_schemas() -> None:
    from typing import get_args

    from simulator.cli.validate_cmd import Predictor
    from simulator.scenario.schema import CostSpec

    allowed = get_args(CostSpec.model_fields["predictor"].annotation)
    assert [p.value for p in Predictor] == list(allowed)


def test_every_shipped_serving_row_cites_its_source() -> None:
    folder = Path(__file__).resolve().parents[1] / "scenarios" / "validation"
    files = sorted(folder.glob("serving_*.csv"))
    assert len(files) >= 5
    for path in files:
        rows = read_serving(path)
        assert len(rows), path.name
        assert rows["source"].notna().all(), path.name
        assert (rows["source"].str.len() > 20).all(), path.name


def test_every_shipped_serving_row_builds_its_simulation() -> None:
    """What `validate-serving --report` runs: each shipped row resolves to a scenario whose
    cluster builds (memory fits, limits valid), attention-DP rows included."""
    from simulator.validation.serving import check_rows

    folder = Path(__file__).resolve().parents[1] / "scenarios" / "validation"
    for path in sorted(folder.glob("serving_*.csv")):
        check_rows(read_serving(path), str(path))


def test_the_frontend_pays_per_prompt_token_in_ttft_and_in_the_turnaround(
        tmp_path: Path) -> None:
    """A per-prompt-token frontend time (tokeniser, detokeniser priming) is added to the
    client-visible TTFT and delays the closed-loop client's next request."""
    base = load_engine("vllm").model_dump(mode="json")
    slow = tmp_path / "slow.yaml"
    slow.write_text(json.dumps({**base, "frontend": {"round_trip_us": 0.0,
                                                     "per_prompt_token_us": 100.0,
                                                     "jitter_cv": 0.0}}))
    rows = read_serving(_csv(tmp_path, [{**ROW, "concurrency": 1, "num_requests": 2,
                                          "measured_ttft_ms": 10.0}]))
    from simulator.validation.serving import row_scenario

    scenario = row_scenario({**rows.to_dict("records")[0], "engine": str(slow),
                             "engine_version": None})
    assert scenario.workload.arrival.turnaround_s == pytest.approx(128 * 100e-6)
    fast = simulate_rows(rows.assign(measured_ttft_ms=10.0))
    made = simulate_rows(rows.assign(engine=str(slow), engine_version=None))
    gap = float(made.iloc[0]["predicted_ttft_ms"] - fast.iloc[0]["predicted_ttft_ms"])
    assert gap == pytest.approx(128 * 0.1 - base["frontend"]["round_trip_us"] * 1e-3, abs=1e-6)


def test_the_frontend_fit_recovers_a_per_prompt_token_time(tmp_path: Path) -> None:
    truth = 7.5
    base = load_engine("vllm").model_dump(mode="json")
    path = tmp_path / "truth.yaml"
    base["frontend"] = {**base["frontend"], "per_prompt_token_us": truth}
    path.write_text(json.dumps(base))
    rows = read_serving(_csv(tmp_path, [{**ROW, "concurrency": 1, "num_requests": 2,
                                          "input_len": 2000, "measured_ttft_ms": 1.0}]))
    made = simulate_rows(rows.assign(engine=str(path)))
    rows = rows.assign(measured_ttft_ms=float(made.iloc[0]["predicted_ttft_ms"]))
    got = fit(rows, "vllm", "frontend.per_prompt_token_us", hi=50.0, tol=0.01,
              metric="ttft_ms")
    assert got == pytest.approx(truth, abs=0.05)


def test_the_vllm_v1_step_time_zeroes_the_median_error_of_its_calibration_rows() -> None:
    """The committed vllm (V1) step_overhead_us is the fit's (python -m
    simulator.validation.serving_fit) over the current kernel fits: a zero median TPOT error
    on the two vLLM 0.21 calibration rows, within the 1 us rounding of the profile."""
    cal = read_serving(Path("scenarios/validation/serving_calibration.csv"))
    rows = cal[(cal["engine"] == "vllm") & (cal["engine_version"] != "0.6")]
    assert len(rows) == 2
    errors = long_errors(simulate_rows(rows))
    tpot = errors[errors["metric"] == "tpot_ms"]["error"]
    assert len(tpot) == 2
    assert abs(float(tpot.median())) < 0.002


def test_the_trtllm_frontend_constant_zeroes_its_calibration_ttft() -> None:
    """The committed per-prompt-token time is the fit's on the calibration set's TTFT row."""
    cal = read_serving(Path("scenarios/validation/serving_calibration.csv"))
    rows = cal[cal["measured_ttft_ms"].notna()]
    assert len(rows) == 1
    errors = long_errors(simulate_rows(rows))
    ttft = errors[errors["metric"] == "ttft_ms"]["error"]
    assert ttft.abs().max() < 0.002


def test_the_tables_say_how_each_point_was_loaded() -> None:
    """A Poisson row is labelled by its rate, not as offline; a closed-loop row by its
    concurrency; only an all-at-once row is offline."""
    base = {"file": "f.csv", "row": 0, "line": 2, "engine": "sglang", "device": "H200-SXM",
            "model": "m", "tp": 1, "input_len": 8, "output_len": 8, "split": "validation",
            "precision": "bf16", "measured_tpot_ms": 10.0, "predicted_tpot_ms": 9.0}
    wide = pd.DataFrame([
        {**base, "arrival": "poisson", "request_rate": 2.0, "concurrency": np.nan},
        {**base, "arrival": "closed_loop", "request_rate": np.nan, "concurrency": 5.0},
        {**base, "arrival": "all_at_once", "request_rate": np.nan, "concurrency": np.nan}])
    assert list(long_errors(wide)["concurrency"]) == ["2 req/s", "5", "offline"]
