"""Regression tests: inputs that used to be accepted, crash or lose data.

Each test names what happened before the fix: a number that became infinity, a trace
read wrongly or silently cut, a setting no serving engine would start with, an output
path found unusable only after simulating, a Hugging Face default read wrongly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.cli import main
from simulator.engine.workload import load_trace
from simulator.errors import EXIT_BAD_INPUT, EXIT_OK, ConfigError
from simulator.models import from_hf_config, get_model
from tests.conftest import REPO
from tests.test_exit_codes import SMALL, exit_code, scenario

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def trace_scenario(tmp_path: Path, rows: str, name: str = "t.csv") -> Path:
    (tmp_path / name).write_text(HEADER + rows, encoding="utf-8")
    data: dict[str, Any] = {"model": "Llama-3.1-8B",
                            "workload": {"arrival": {"kind": "trace", "path": name}},
                            "cluster": {"pools": [{"name": "main", "device": "H100-SXM"}]}}
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ----- non-finite numbers in every spelling -------------------------------------------
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400", "Infinity", "1e300"])
def test_quoted_and_overflowing_numbers_are_rejected(tmp_path: Path, value: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`"inf"` and `1e400` (a string to YAML 1.1) used to become float('inf')."""
    path = scenario(tmp_path, **{"workload.arrival.rate_per_s": value})
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT, err
    assert "workload.arrival" in err
    assert "rate_per_s" in err
    assert ("finite" in err) or ("out of range" in err)


@pytest.mark.parametrize("value", ["'inf'", ".inf", ".nan", "'1e400'", "-.inf"])
def test_set_rejects_non_finite(tmp_path: Path, value: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_code(["run", str(scenario(tmp_path)), "--set",
                           f"workload.duration_s={value}"], capsys)
    assert code == EXIT_BAD_INPUT, err
    assert "workload.duration_s" in err


def test_api_rejects_infinity() -> None:
    from tests.conftest import make_scenario

    with pytest.raises(ConfigError, match="finite"):
        make_scenario(**{"workload.arrival.rate_per_s": float("inf")})


# ----- traces -------------------------------------------------------------------------
def test_numeric_timestamps_are_seconds(tmp_path: Path) -> None:
    """pandas read 0, 0.5, 1.25, 3600 as nanoseconds since the epoch: all arrived at once."""
    (tmp_path / "t.csv").write_text(HEADER + "0,10,2\n0.5,10,2\n1.25,10,2\n3600,10,2\n")
    assert load_trace(tmp_path / "t.csv").times_s.tolist() == [0.0, 0.5, 1.25, 3600.0]


def test_datetime_timestamps_are_datetimes(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(HEADER + "2023-11-16 18:15:46.5,10,2\n"
                                    "2023-11-16 18:15:46,10,2\n2023-11-16 19:15:46,10,2\n")
    assert load_trace(tmp_path / "t.csv").times_s.tolist() == [0.0, 0.5, 3600.0]


def test_a_blank_first_timestamp_does_not_decide_the_kind(tmp_path: Path) -> None:
    """Row 1 with no timestamp is one bad row; the numeric rows after it stay seconds."""
    for first in ("", "nan", "soon"):
        (tmp_path / "t.csv").write_text(HEADER + f"{first},10,2\n0,10,2\n1.5,10,2\n")
        trace = load_trace(tmp_path / "t.csv", skip_bad_rows=True)
        assert trace.times_s.tolist() == [0.0, 1.5], first


@pytest.mark.parametrize(("rows", "says"), [
    ("0,10,2\n1,-3,2\n", "row 2, column ContextTokens"),
    ("0,10,2\n1,10,0\n", "row 2, column GeneratedTokens"),
    ("0,10,2\n1,,2\n", "row 2, column ContextTokens"),
    ("0,10,2\n1,nan,2\n", "row 2, column ContextTokens"),
    ("0,10,2\n1,2.5,2\n", "row 2, column ContextTokens"),
    ("0,10,2\nsoon,10,2\n", "row 2, column TIMESTAMP"),
    ("0,10,2\ninf,10,2\n", "row 2, column TIMESTAMP"),
    ("2023-11-16 18:15:46,10,2\n5,10,2\n", "row 2, column TIMESTAMP"),
    ("", "no rows"),
])
def test_bad_trace_rows_name_row_and_column(tmp_path: Path, rows: str, says: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Negative or zero counts used to complete, NaN rows vanished, an empty trace exited 0."""
    code, err = exit_code(["run", str(trace_scenario(tmp_path, rows))], capsys)
    assert code == EXIT_BAD_INPUT, err
    assert len(err.splitlines()) == 1
    assert says in err
    assert "t.csv" in err


def test_skip_bad_rows_counts_what_it_leaves_out(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = trace_scenario(tmp_path, "0,10,2\n1,-3,2\n2,nan,2\n3,10,2\n")
    code = EXIT_OK
    try:
        main(["run", str(path), "--skip-bad-rows", "--out", str(tmp_path / "out")])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert code == EXIT_OK, captured.err
    assert "skipped 2 bad trace row(s)" in captured.out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["trace_rows_skipped"] == 2
    assert summary["completed"] == 2


@pytest.mark.parametrize(("line", "says"), [
    ('{"timestamp": NaN, "input_length": 5, "output_length": 2}', "column timestamp"),
    ('{"timestamp": 1, "input_length": 0, "output_length": 2}', "column input_length"),
    ('{"timestamp": 1, "input_length": true, "output_length": 2}', "column input_length"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [-1]}',
     "column hash_ids"),
    ("[1, 2]", "expected a JSON object"),
    ("{", "not a JSON object"),
])
def test_bad_mooncake_lines(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n\n' + line + "\n")
    with pytest.raises(ConfigError, match="row 3") as info:
        load_trace(path)
    assert says in str(info.value)


# ----- what serving engines refuse ----------------------------------------------------
@pytest.mark.parametrize(("model", "tp"), [("Llama-3.1-8B", 3), ("Llama-3.1-70B", 7),
                                           ("Llama-3.1-8B", 64)])
def test_tp_must_divide_the_attention_heads(tmp_path: Path, model: str, tp: int,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, model=model, **{"cluster.pools.0.parallelism": {"tp": tp},
                                              "cluster.pools.0.device": "B200"})
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT, err
    assert "cluster.pools[0].parallelism.tp" in err
    assert "divisible" in err


@pytest.mark.parametrize("updates", [{"cluster.pools.0.parallelism": {"tp": 2, "ep": 2}},
                                     {"cluster.pools.0.moe_imbalance": 1.5}])
def test_moe_settings_on_a_dense_model(tmp_path: Path, updates: dict[str, Any],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_code(["run", str(scenario(tmp_path, **updates))], capsys)
    assert code == EXIT_BAD_INPUT, err
    assert "dense model" in err


def test_requests_past_the_context_are_rejected_as_vllm_does(tmp_path: Path) -> None:
    from simulator.runner.run import run
    from tests.conftest import make_scenario

    sc = make_scenario(model="Llama-2-70B", **{
        "cluster.pools.main.parallelism.tp": 8, "cluster.pools.main.device": "H200-SXM",
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 100, "max_tokens": 6000},
        "workload.num_requests": 30})
    result = run(sc)
    long = result.requests[result.requests["prompt_tokens"] + result.requests["output_tokens"]
                           > 4096]
    assert len(long) > 0
    assert (long["status"] == "rejected").all()
    assert long["reason"].str.contains("maximum context").all()


def test_a_workload_that_never_fits_the_context(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, **{"workload.input_tokens.tokens": 200_000})
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT
    assert "maximum context" in err


# ----- validation messages ------------------------------------------------------------
def test_every_error_and_did_you_mean(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, **{"workload.arrival": {"kind": "poisson", "rate": 3},
                                 "workload.num_request": 5})
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT
    assert len(err.splitlines()) == 1
    assert "did you mean 'rate_per_s'" in err
    assert "did you mean 'num_requests'" in err
    assert "$defs.PoissonArrival" in err
    assert "more error" not in err


def test_set_accepts_the_index_spelling_of_messages(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_code(["run", str(scenario(tmp_path)), "--set",
                           "cluster.pools[0].parallelism.tp=3"], capsys)
    assert code == EXIT_BAD_INPUT
    assert "cluster.pools[0].parallelism.tp" in err
    assert "divisible" in err


# ----- output paths -------------------------------------------------------------------
def _run(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return EXIT_OK


@pytest.mark.parametrize("where", ["file", "proc", "trace-dir", "foreign"])
def test_bad_output_paths_fail_before_simulating(tmp_path: Path, where: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.runner.run import Simulation

    def never(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("simulated before checking the output path")

    monkeypatch.setattr(Simulation, "run", never)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    extra = {"file": ["--out", str(tmp_path / "a-file")],
             "proc": ["--out", "/proc/disagg-sim-out"],
             "trace-dir": ["--trace", str(tmp_path)],
             "foreign": ["--out", str(tmp_path / "foreign")]}[where]
    code = _run(["run", str(scenario(tmp_path)), *extra])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert len(err.splitlines()) == 1
    assert "internal error" not in err
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "mine"


def test_reused_out_keeps_no_stale_files(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert _run(["run", str(scenario(tmp_path)), "--out", str(out)]) == EXIT_OK
    (out / "events.parquet").write_text("from an earlier run")
    assert _run(["run", str(scenario(tmp_path)), "--out", str(out)]) == EXIT_OK
    assert not (out / "events.parquet").exists()
    assert (out / "summary.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_corrupt_parquet_given_to_plot(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "results.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    code = _run(["plot", str(bad), "--kind", "latency"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert "results.parquet" in err
    assert "internal error" not in err


# ----- Hugging Face configs -----------------------------------------------------------
def _hf(tmp_path: Path, **cfg: Any) -> Path:
    base = {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 256,
            "num_attention_heads": 4, "intermediate_size": 1024, "vocab_size": 1000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **cfg}))
    return path


def test_tie_word_embeddings_defaults_as_in_transformers(tmp_path: Path) -> None:
    """PretrainedConfig ties by default; LlamaConfig (and a few others) do not."""
    assert from_hf_config(_hf(tmp_path)).tie_word_embeddings is True
    assert from_hf_config(_hf(tmp_path, model_type="llama")).tie_word_embeddings is False
    assert from_hf_config(_hf(tmp_path, tie_word_embeddings=False)).tie_word_embeddings is False


@pytest.mark.parametrize(("key", "value"), [("hidden_size", "256"), ("num_hidden_layers", 2.5),
                                            ("tie_word_embeddings", "false"),
                                            ("kv_lora_rank", "512"), ("model_type", 3),
                                            ("num_attention_heads", True)])
def test_hf_config_with_wrong_types(tmp_path: Path, key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        get_model(str(_hf(tmp_path, **{key: value})))
    assert info.value.key == key


def test_small_scenario_still_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert SMALL["model"] == "Llama-3.1-8B"
    assert _run(["run", str(scenario(tmp_path))]) == EXIT_OK


@pytest.mark.parametrize("command", ["sweep", "plan"])
@pytest.mark.parametrize("where", ["a-file", "a-file/below", "/proc/disagg-sim-out"])
def test_sweep_and_plan_out_at_unwritable_places(tmp_path: Path, command: str, where: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """These were internal errors (FileExistsError, NotADirectoryError)."""
    (tmp_path / "a-file").write_text("keep")
    out = where if where.startswith("/") else str(tmp_path / where)
    if command == "sweep":
        spec = {"base": SMALL, "grid": {"workload.arrival.rate_per_s": [1, 2]}}
        path = tmp_path / "sweep.yaml"
        path.write_text(yaml.safe_dump(spec))
        argv = ["sweep", str(path), "--out", out, "--workers", "1"]
    else:
        argv = ["plan", str(REPO / "scenarios/plans/llama8b_chat.yaml"), "--out", out]
    code = _run(argv)
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert "--out" in err
    assert "internal error" not in err
    assert (tmp_path / "a-file").read_text() == "keep"


@pytest.mark.parametrize("extra", [["--workers", "0"], ["--workers", "-1"],
                                   ["--workers", "1000000000"], ["--executor", "bogus"],
                                   ["--scheduler", "tcp://nowhere:1"]])
def test_sweep_options_are_checked_even_when_all_runs_are_done(
        tmp_path: Path, extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """With every run already saved these options used to be accepted unread."""
    spec = {"base": SMALL, "grid": {"workload.arrival.rate_per_s": [1, 2]}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    argv = ["sweep", str(path), "--out", str(tmp_path / "out"), "--no-progress"]
    assert _run([*argv, "--workers", "1"]) == EXIT_OK
    capsys.readouterr()
    code = _run([*argv, *extra])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert extra[0] in err
