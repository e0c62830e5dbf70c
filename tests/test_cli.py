"""The CLI: run, profiles, and one clear line (no traceback) for each kind of bad input."""

from __future__ import annotations

import json
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
