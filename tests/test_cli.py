"""The CLI: run, profiles, and one clear line (no traceback) for each kind of bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.cli import app, main
from tests.conftest import REPO

runner = CliRunner()

SMALL = {
    "name": "cli-small",
    "model": "Llama-3.1-8B",
    "workload": {
        "arrival": {"kind": "poisson", "rate_per_s": 4},
        "input_tokens": {"kind": "fixed", "tokens": 256},
        "output_tokens": {"kind": "fixed", "tokens": 16},
        "num_requests": 20,
    },
    "cluster": {"pools": [{"name": "main", "device": "H100-SXM"}]},
}


def write(tmp_path: Path, data: object, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_run_writes_outputs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = runner.invoke(app, ["run", str(write(tmp_path, SMALL)), "--out", str(out), "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "TTFT" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 20
    for f in ("requests.parquet", "steps.parquet", "transfers.parquet", "scenario.resolved.yaml"):
        assert (out / f).is_file()
    assert yaml.safe_load((out / "scenario.resolved.yaml").read_text())["seed"] == 3


def test_shipped_quickstart_runs() -> None:
    res = runner.invoke(app, ["run", str(REPO / "scenarios/quickstart.yaml")])
    assert res.exit_code == 0, res.output
    assert "completed" in res.output


def test_profiles_list_and_show() -> None:
    res = runner.invoke(app, ["profiles", "list"])
    assert res.exit_code == 0
    assert "H100-SXM" in res.output
    assert "Llama-3.1-70B" in res.output
    res = runner.invoke(app, ["profiles", "show", "nvlink4"])
    assert res.exit_code == 0
    assert "bandwidth_gb_per_s: 450" in res.output


def bad(tmp_path: Path, data: object, capsys: pytest.CaptureFixture[str]) -> str:
    path = write(tmp_path, data)
    with pytest.raises(SystemExit) as exc:
        main(["run", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1
    assert str(path) in err
    return err


def with_(path: str, value: object) -> dict:
    data = json.loads(json.dumps(SMALL))
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    last = keys[-1]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(("path", "value", "expect"), [
    ("workload.arrival.rate_per_s", -1, "workload.arrival.poisson.rate_per_s"),
    ("workload.arrival.rate_per_s", "fast", "rate_per_s"),
    ("workload.arrivl", 3, "workload.arrivl: unknown key"),
    ("cluster.pools.0.device", "H900", "cluster.pools[0].device: unknown device profile 'H900'"),
    ("model", "Llama-9", "model: unknown model"),
    ("cluster.pools.0.parallelism", {"tp": 0}, "cluster.pools[0].parallelism.tp"),
    ("workload.num_requests", KeyError, "bound the workload"),
])
def test_bad_input_one_line(tmp_path, capsys, path, value, expect) -> None:
    err = bad(tmp_path, with_(path, value), capsys)
    assert expect in err


def test_model_does_not_fit_names_need_and_fix(tmp_path, capsys) -> None:
    data = with_("model", "Llama-3.1-70B")
    err = bad(tmp_path, data, capsys)
    assert "cluster.pools[0].parallelism" in err
    assert "does not fit on H100-SXM" in err
    assert "GiB" in err
    assert "raise tp or pp" in err


@pytest.mark.parametrize(("text", "expect"), [
    ("", "file is empty"),
    ("model: [unclosed", "malformed YAML"),
    ("- just\n- a list\n", "expected a mapping"),
])
def test_malformed_files(tmp_path, capsys, text, expect) -> None:
    assert expect in bad(tmp_path, text, capsys)


def test_missing_file(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "does/not/exist.yaml"])
    assert exc.value.code == 2
    assert "file not found" in capsys.readouterr().err


def test_compare_shows_cost_and_fits_80_columns(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    a = write(tmp_path, {**SMALL, "name": "one-H100-colocated-serving"}, "a.yaml")
    b = write(tmp_path, {**SMALL, "name": "b"}, "b.yaml")
    csv = tmp_path / "c.csv"
    monkeypatch.setenv("COLUMNS", "80")
    res = runner.invoke(app, ["compare", str(a), str(b), "--csv", str(csv)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in res.output  # no number cut short
    assert "$/hour" in res.output
    assert "$/1M out tok" in res.output
    row = next(line for line in lines if "$/hour" in line)
    assert any(ch.isdigit() for ch in row)  # one H100 at its dated price
    import pandas as pd

    table = pd.read_csv(csv)
    assert {"cost_usd_per_hour", "cost_usd_per_1m_output_tokens"} <= set(table.columns)
    assert table["cost_usd_per_hour"].notna().all()


def test_version_and_shell_completion() -> None:
    import simulator

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0
    assert res.output.strip() == f"disagg-sim {simulator.__version__}"
    res = runner.invoke(app, ["--help"])
    assert "--install-completion" in res.output


def test_profiles_list_shows_native_precisions_and_plain_numbers() -> None:
    res = runner.invoke(app, ["profiles", "list"])
    assert res.exit_code == 0, res.output
    lpu = next(line for line in res.output.splitlines() if "GroqLPU-v1" in line)
    assert "fp16 188, int8 750" in lpu  # the precisions the chip has, not "0 bf16"
    assert "80,000" in lpu  # SRAM bandwidth, thousands separated
    h100 = next(line for line in res.output.splitlines() if "H100-SXM " in line)
    assert "bf16 989" in h100
    assert "fp8 1,979" in h100
    assert "e+0" not in res.output
    deepseek = next(line for line in res.output.splitlines() if "DeepSeek-V3" in line)
    assert "fp8" in deepseek
    assert "deepseek-ai/DeepSeek-V3" in deepseek


def test_api_names_match_the_cli_plot_kinds() -> None:
    import simulator
    from simulator.cli.plot_cmd import Kind

    for kind in Kind:
        assert callable(getattr(simulator.plots, kind.value.replace("-", "_")))
    for name in ("GoodputSpec", "PlanSpec", "SweepSpec", "PlanResult", "GoodputResult",
                 "write_report"):
        assert name in simulator.__all__
        assert getattr(simulator, name) is not None


def test_device_yaml_path_is_relative_to_the_scenario_file(tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "study"
    (folder / "devices").mkdir(parents=True)
    shutil.copy(REPO / "hardware_profiles/devices/H100-SXM.yaml", folder / "devices/my-gpu.yaml")
    scenario = {**SMALL, "cluster": {"pools": [
        {"name": "main", "device": "devices/my-gpu.yaml", "device_usd_per_hour": 2.0}]}}
    path = write(folder, scenario)
    out = tmp_path / "out"
    res = runner.invoke(app, ["run", str(path), "--out", str(out)])  # run from another cwd
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cost_usd_per_hour"] == pytest.approx(2.0)  # the pool's price override
    missing = write(folder, {**SMALL, "cluster": {"pools": [
        {"name": "main", "device": "devices/nope.yaml"}]}}, "missing.yaml")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(missing)])
    assert exc.value.code == 2


def test_missing_device_file_error_names_the_path_tried(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    missing = write(tmp_path, {**SMALL, "cluster": {"pools": [
        {"name": "main", "device": "devices/nope.yaml"}]}}, "missing.yaml")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(missing)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "cluster.pools[0].device" in err
    assert f"looked for {tmp_path / 'devices' / 'nope.yaml'}" in err


def test_run_json_and_quiet_for_scripts(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL)
    res = runner.invoke(app, ["run", str(path), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["completed"] == 20
    res = runner.invoke(app, ["run", str(path), "--quiet", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0
    assert res.output == ""
    assert (tmp_path / "o" / "summary.json").is_file()
    res = runner.invoke(app, ["run", str(path)])
    assert "precision: weights bf16, activations bf16, KV cache bf16 (Llama-3.1-8B's " \
           "released precision)" in res.output


def test_run_progress_is_event_for_event_the_same_run() -> None:
    import simulator
    from simulator.cli.progress import progress_line, run_progress
    from simulator.runner.progress import EVENTS_PER_CALL, RunProgress
    from tests.conftest import make_scenario

    sc = make_scenario(**{"workload.num_requests": 1000, "workload.arrival.rate_per_s": 20.0,
                          "simulation.fast_forward": False})
    seen: list[RunProgress] = []
    with_progress = simulator.run(sc, progress=seen.append)
    plain = simulator.run(sc)
    assert plain.sim_events > EVENTS_PER_CALL
    assert len(seen) == plain.sim_events // EVENTS_PER_CALL
    assert seen[-1].total_requests == 1000
    assert 0 < seen[-1].finished_requests <= 1000
    assert with_progress.requests.equals(plain.requests)
    assert with_progress.steps.equals(plain.steps)
    line = progress_line(RunProgress(30.0, 100, 400, None), wall_s=2.0)
    assert line == "simulated 30.0 s, 100 / 400 requests, 50 req/s, ETA 6 s"
    from rich.console import Console

    with run_progress(Console(file=open(os.devnull, "w"))) as callback:
        assert callback is None  # not a terminal: no display
    with run_progress(Console(force_terminal=True, file=open(os.devnull, "w"))) as callback:
        assert callback is not None
        callback(RunProgress(1.0, 1, 2, None))


def test_profiles_show_takes_a_hugging_face_id() -> None:
    res = runner.invoke(app, ["profiles", "show", "deepseek-ai/DeepSeek-V3"])
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(res.output)
    assert data["name"] == "DeepSeek-V3"
    assert data["released_precision"] == "fp8"
    assert data["derived"]["default_precision"]["weights"] == "fp8"
    assert "deepseek-ai/DeepSeek-V3" in data["derived"]["hugging_face_ids"]
