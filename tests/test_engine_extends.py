"""Engine profiles that extend another (``extends``), and the engine whose kernels price a
profile (``kernels``): the NIM profile is TensorRT-LLM's with its own frontend and memory
reserve, priced on TensorRT-LLM's kernel fits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.errors import ConfigError
from simulator.hardware.engines import load_engine
from simulator.runner.build import build_plan
from simulator.runner.run import run
from simulator.validation.serving import long_errors, simulate_rows
from simulator.validation.serving_io import read_serving
from tests.conftest import make_scenario

CALIBRATION = Path(__file__).resolve().parents[1] / "scenarios" / "validation" / \
    "serving_calibration.csv"


def _write(tmp_path: Path, name: str, data: dict[str, object]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_nim_is_trtllm_with_its_own_frontend_and_reserve() -> None:
    nim, trt = load_engine("nim"), load_engine("trtllm")
    assert nim.name == "nim"
    assert nim.kernel_engine == "trtllm"
    assert nim.scheduler == trt.scheduler
    assert nim.per_sequence_overhead_us == trt.per_sequence_overhead_us
    assert nim.allreduce_norm_fusion == trt.allreduce_norm_fusion
    assert nim.runtime_reserve_gib > 0 == trt.runtime_reserve_gib
    assert nim.frontend.per_prompt_token_us > 0 == trt.frontend.per_prompt_token_us
    # Its own notes; its sources follow the base's, which still back what it inherits.
    assert nim.notes != trt.notes
    assert nim.source[:len(trt.source)] == trt.source
    assert len(nim.source) > len(trt.source)


def test_a_child_merges_nested_keys_and_replaces_the_rest(tmp_path: Path) -> None:
    path = _write(tmp_path, "mine.yaml", {
        "name": "mine", "extends": "trtllm", "version": "x",
        "frontend": {"per_prompt_token_us": 3.0},
        "cuda_graph": {"sizes": [1, 2]}})
    mine, trt = load_engine(str(path)), load_engine("trtllm")
    assert mine.frontend.per_prompt_token_us == 3.0
    assert mine.frontend.jitter_cv == trt.frontend.jitter_cv
    assert mine.frontend.round_trip_us == trt.frontend.round_trip_us
    assert mine.cuda_graph.sizes == [1, 2]
    assert mine.kernel_engine == "trtllm"
    assert mine.block_size == trt.block_size


def test_a_profile_that_extends_another_runs_on_the_base_engines_kernels(
        tmp_path: Path) -> None:
    """A TensorRT-LLM child prices its steps on TensorRT-LLM's fitted curves, not on the
    fallback (vLLM's) a name the device profile does not list would get: with nothing but
    its name changed it simulates exactly what trtllm does."""
    path = _write(tmp_path, "renamed.yaml", {"name": "renamed", "extends": "trtllm",
                                             "version": "same"})
    base = make_scenario(engine="trtllm")
    child = make_scenario(engine=str(path))
    plan = build_plan(child)
    assert {c.engine for p in plan.pools for c in p.cost_models} == {"trtllm"}
    a, b = run(base).requests, run(child).requests
    pd.testing.assert_frame_equal(a, b)
    vllm_priced = run(make_scenario(engine="vllm")).requests
    assert not np.allclose(a["tpot_s"].fillna(0), vllm_priced["tpot_s"].fillna(0))


def test_vllm_v0_is_priced_on_vllms_kernels() -> None:
    """vllm-0.6 names vLLM's kernels, so the kernel tables and fits it asks for are
    vLLM's (a profile name the tables do not know had no tables under predictor: tables)."""
    assert load_engine("vllm-0.6").kernel_engine == "vllm"
    plan = build_plan(make_scenario(engine="vllm-0.6"))
    assert {c.engine for p in plan.pools for c in p.cost_models} == {"vllm"}


def test_a_users_file_may_extend_the_profile_it_is_named_after(tmp_path: Path) -> None:
    path = _write(tmp_path, "trtllm.yaml", {"name": "trtllm-mine", "extends": "trtllm",
                                            "version": "mine", "runtime_reserve_gib": 2.0})
    assert load_engine(str(path)).runtime_reserve_gib == 2.0


@pytest.mark.parametrize("base", ["tensorrt", 3])
def test_extending_an_unknown_profile_is_a_clear_error(tmp_path: Path, base: object) -> None:
    path = _write(tmp_path, "bad.yaml", {"name": "bad", "extends": base, "version": "x"})
    with pytest.raises(ConfigError) as info:
        load_engine(str(path))
    assert info.value.key == "extends"
    assert info.value.file == str(path)
    assert "not a shipped engine profile" in info.value.message
    assert "trtllm" in info.value.message  # lists what is allowed


def test_a_child_is_validated_like_any_profile(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.yaml", {"name": "bad", "extends": "trtllm", "version": "x",
                                         "runtime_reserve_gib": -1})
    with pytest.raises(ConfigError) as info:
        load_engine(str(path))
    assert "runtime_reserve_gib" in str(info.value)


def test_nim_rows_resolve_to_the_nim_profile() -> None:
    cal = read_serving(CALIBRATION)
    nim = cal[cal["engine"] == "nim"]
    assert len(nim) == 2
    wide = simulate_rows(nim.iloc[:1], max_requests=2)
    assert wide["engine_profile"].tolist() == ["nim"]


def test_the_nim_reserve_zeroes_its_calibration_rows_tpot_error(tmp_path: Path) -> None:
    """The committed runtime_reserve_gib is the fit's (python -m
    simulator.validation.serving_fit): a zero TPOT error on the NIM concurrency-200 row,
    within the 0.01 GiB rounding of the profile; without the reserve (the trtllm
    profile's memory rule) the pool holds more requests and TPOT is several % high."""
    cal = read_serving(CALIBRATION)
    row = cal[(cal["engine"] == "nim") & (cal["concurrency"] == 200)]
    assert len(row) == 1
    assert pd.isna(row.iloc[0].get("measured_ttft_ms"))
    err = long_errors(simulate_rows(row))
    tpot = float(err[err["metric"] == "tpot_ms"]["error"].iloc[0])
    assert abs(tpot) < 0.005  # errors are fractions
    data = load_engine("nim").model_dump(mode="json")
    data["runtime_reserve_gib"] = 0.0
    flat = tmp_path / "nim-no-reserve.yaml"
    flat.write_text(json.dumps(data))
    err0 = long_errors(simulate_rows(row.assign(engine=str(flat), engine_version=None)))
    assert float(err0[err0["metric"] == "tpot_ms"]["error"].iloc[0]) > 0.03


def test_a_kernels_name_no_table_holds_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "typo.yaml", {"name": "typo", "extends": "trtllm", "version": "x",
                                          "kernels": "trtlm"})
    with pytest.raises(ConfigError) as info:
        load_engine(str(path))
    assert info.value.key == "kernels"
    assert "'vllm', 'trtllm' or 'sglang'" in info.value.message


def test_a_profile_extending_one_without_measured_kernels_sets_none(tmp_path: Path) -> None:
    """The LPU profile's name is no kernel table's engine: a child of it names no kernels
    (and prices as its base does), rather than failing on the base's name."""
    path = _write(tmp_path, "lpu.yaml", {"name": "lpu-mine", "extends": "groq", "version": "x"})
    mine = load_engine(str(path))
    assert mine.kernels is None
    assert mine.kernel_engine == "lpu-mine"
