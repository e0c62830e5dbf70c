"""Fuzzing what a scenario points at and what the command line adds.

Families (each counted in the "input fuzzing" summary, ``bad|valid/<command>/<family>``):

- ``trace_csv`` / ``trace_jsonl``: trace files with valid and broken rows and cells, in
  any order, size and encoding. A trace with no bad row must run and complete every row;
  one with bad rows must exit 2 naming the first bad row (file, row and column), and with
  ``--skip-bad-rows`` must run the good rows and count the others.
- ``hf_config``: Hugging Face ``config.json`` files with wrong types, missing fields and
  contradictory shapes.
- ``numeric_extreme``: ±inf, NaN, 1e308, 2**63, denormals, their quoted spellings and
  ``1e400`` at every numeric field of the fuzzing's base scenarios.
- ``cli_options``: ``run`` options and ``--set`` values, well- and ill-formed.
- ``output_path``: ``--out`` / ``--trace`` at files, folders, missing parents, unwritable
  places, odd and over-long names.

Every case runs in-process under a time limit; the outcome must be exit 0, or exit 2 with
one line (``error: ...``; click's own usage message for a malformed command line), never a
traceback, an "internal error" or a hang.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import typer
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simulator.cli import app
from simulator.errors import EXIT_BAD_INPUT, EXIT_OK
from tests.fuzzing import Outcome, dump, feed_argv, key_path, replaced
from tests.test_fuzz_inputs import RUN, build_index, fuzz_settings

CASE_LIMIT_S = 60
MODEL = "Llama-3.1-8B"


@pytest.fixture(scope="module")
def cli() -> click.Command:
    return typer.main.get_command(app)


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail a case that runs longer than ``seconds`` (a hang) instead of waiting forever."""

    def expire(_signum: int, _frame: Any) -> None:
        raise TimeoutError(f"case ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_case(cli: click.Command, argv: list[str]) -> Outcome:
    with time_limit(CASE_LIMIT_S):
        return feed_argv(cli, argv)


def check_clean(got: Outcome, about: str, *, usage_ok: bool = False) -> None:
    """Exit 0, or exit 2 with one clear line; never a traceback or an internal error."""
    text = f"[{about}] exit {got.code}, stderr {got.err!r}"
    assert "Traceback" not in got.err, text
    assert "internal error" not in got.err, text
    assert got.code in (EXIT_OK, EXIT_BAD_INPUT), text
    if got.code == EXIT_BAD_INPUT:
        lines = got.err.splitlines()
        if usage_ok and any(line.startswith(("Usage:", "Error:")) for line in lines):
            return  # click's usage message for a malformed command line
        assert len(lines) == 1, text
        assert lines[0].startswith("error: "), text


def scenario_for_trace(folder: Path, trace: str) -> Path:
    doc = {"name": "fuzz-trace", "model": MODEL,
           "workload": {"arrival": {"kind": "trace", "path": trace}},
           "cluster": {"pools": [{"name": "main", "device": "H100-SXM"}]}}
    path = folder / "trace scenario.yaml"
    path.write_text(dump(doc))
    return path


# ----- trace files -------------------------------------------------------------------
GOOD_TOKENS = st.integers(1, 60).map(str)
BAD_TOKENS = st.sampled_from(["0", "-1", "", "nan", "inf", "2.5", "1e400", "abc", "-0",
                              "99999999999999"])
GOOD_SECONDS = st.floats(0, 600, allow_nan=False).map(lambda x: f"{x:.4f}")
BAD_SECONDS = st.sampled_from(["", "nan", "inf", "-inf", "soon", "1e400"])
ENCODINGS = st.sampled_from(["utf-8", "utf-8-sig", "latin-1", "utf-16"])


@st.composite
def csv_traces(draw: Any) -> tuple[list[list[str]], set[int], str]:
    """Rows of cells, the data rows (1-based) that are bad, and the file's encoding."""
    n = draw(st.integers(1, 40))
    rows, bad = [], set()
    broken_rows = set(draw(st.lists(st.integers(1, n), min_size=1, max_size=3))) if draw(
        st.booleans()) else set()
    for i in range(1, n + 1):
        broken = i in broken_rows
        column = draw(st.integers(0, 2)) if broken else -1
        cells = [draw(BAD_SECONDS if column == 0 else GOOD_SECONDS),
                 draw(BAD_TOKENS if column == 1 else GOOD_TOKENS),
                 draw(BAD_TOKENS if column == 2 else GOOD_TOKENS)]
        if broken:
            bad.add(i)
        rows.append(cells)
    return rows, bad, draw(ENCODINGS)


@fuzz_settings(60)
@given(case=csv_traces(), skip=st.booleans(), spaces=st.booleans())
def test_trace_csv(case: tuple[list[list[str]], set[int], str], skip: bool, spaces: bool,
                   tmp_path_factory: pytest.TempPathFactory, cli: click.Command,
                   fuzz_tally: dict[str, int]) -> None:
    rows, bad, encoding = case
    fuzz_tally["bad/run/trace_csv" if bad else "valid/run/trace_csv"] = fuzz_tally.get(
        "bad/run/trace_csv" if bad else "valid/run/trace_csv", 0) + 1
    folder = tmp_path_factory.mktemp("trace")
    sep = ", " if spaces else ","
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        sep.join(r) + "\n" for r in rows)
    (folder / "t.csv").write_bytes(text.encode(encoding))
    argv = ["run", str(scenario_for_trace(folder, "t.csv")), "--out", str(folder / "out")]
    got = run_case(cli, argv + (["--skip-bad-rows"] if skip else []))
    check_clean(got, f"{len(rows)} rows, bad {sorted(bad)}, {encoding}")
    if encoding == "utf-16":  # not UTF-8: a clear error, whatever the rows
        assert got.code == EXIT_BAD_INPUT, got.err
        return
    if bad and (not skip or len(bad) == len(rows)):
        assert got.code == EXIT_BAD_INPUT, got.err
        if not skip:
            assert f"row {min(bad)}, column" in got.err, got.err
        return
    assert got.code == EXIT_OK, got.err
    summary = json.loads((folder / "out" / "summary.json").read_text())
    assert summary["completed"] == len(rows) - len(bad)  # nothing lost, nothing invented
    assert summary["trace_rows_skipped"] == len(bad)


@st.composite
def jsonl_traces(draw: Any) -> tuple[list[str], set[int]]:
    n = draw(st.integers(1, 30))
    lines, bad = [], set()
    broken = draw(st.booleans())
    for i in range(1, n + 1):
        rec: Any = {"timestamp": draw(st.integers(0, 600_000)),
                    "input_length": draw(st.integers(1, 60)),
                    "output_length": draw(st.integers(1, 60)),
                    "hash_ids": draw(st.lists(st.integers(0, 50), max_size=3))}
        how = draw(st.integers(0, 12)) if broken else -1
        if how == 0:
            rec["input_length"] = draw(st.sampled_from([0, -5, 2.5, "7", None, True]))
        elif how == 1:
            rec["timestamp"] = draw(st.sampled_from([float("nan"), float("inf"), "x", None]))
        elif how == 2:
            rec["hash_ids"] = draw(st.sampled_from([[-1], ["a"], 5, [1.5]]))
        elif how == 3:
            rec = draw(st.sampled_from([[1, 2], "text", 3]))
        if 0 <= how <= 3:
            bad.add(i)
        lines.append(json.dumps(rec))
    if broken and draw(st.booleans()):
        lines.append("{not json")
        bad.add(len(lines))
    return lines, bad


@fuzz_settings(40)
@given(case=jsonl_traces())
def test_trace_jsonl(case: tuple[list[str], set[int]], tmp_path_factory: pytest.TempPathFactory,
                     cli: click.Command, fuzz_tally: dict[str, int]) -> None:
    lines, bad = case
    key = "bad/run/trace_jsonl" if bad else "valid/run/trace_jsonl"
    fuzz_tally[key] = fuzz_tally.get(key, 0) + 1
    folder = tmp_path_factory.mktemp("jsonl")
    (folder / "t.jsonl").write_text("\n".join(lines) + "\n")
    got = run_case(cli, ["run", str(scenario_for_trace(folder, "t.jsonl"))])
    check_clean(got, f"{len(lines)} lines, bad {sorted(bad)}")
    if bad:
        assert got.code == EXIT_BAD_INPUT
        assert f"row {min(bad)}, column" in got.err, got.err
    else:
        assert got.code == EXIT_OK, got.err


# ----- Hugging Face configs ----------------------------------------------------------
HF_BASE = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512,
           "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1024,
           "vocab_size": 32000, "max_position_embeddings": 4096}
HF_WRONG = st.one_of(st.text(max_size=5), st.floats(allow_nan=True), st.booleans(),
                     st.none(), st.lists(st.integers(), max_size=2),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                     st.integers(-10**20, 10**20))
HF_EXTRA = {"num_local_experts": st.integers(-2, 10), "num_experts_per_tok": st.integers(-2, 12),
            "kv_lora_rank": st.integers(-1, 64), "v_head_dim": st.integers(-1, 64),
            "head_dim": st.integers(-1, 256), "first_k_dense_replace": st.integers(-1, 10),
            "tie_word_embeddings": st.one_of(st.booleans(), st.text(max_size=4))}


@st.composite
def hf_configs(draw: Any) -> dict[str, Any]:
    cfg = dict(HF_BASE)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.integers(0, 2))
        if how == 0:
            cfg[draw(st.sampled_from(sorted(HF_BASE)))] = draw(HF_WRONG)
        elif how == 1:
            cfg.pop(draw(st.sampled_from(sorted(cfg))), None)
        else:
            key = draw(st.sampled_from(sorted(HF_EXTRA)))
            cfg[key] = draw(HF_EXTRA[key])
    return cfg


@fuzz_settings(80)
@given(cfg=hf_configs())
def test_hf_config(cfg: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
                   cli: click.Command, fuzz_tally: dict[str, int]) -> None:
    fuzz_tally["bad/run/hf_config"] = fuzz_tally.get("bad/run/hf_config", 0) + 1
    folder = tmp_path_factory.mktemp("hf")
    (folder / "config.json").write_text(json.dumps(cfg))
    doc = {"model": "config.json",
           "workload": {"arrival": {"kind": "poisson", "rate_per_s": 5},
                        "input_tokens": {"kind": "fixed", "tokens": 32},
                        "output_tokens": {"kind": "fixed", "tokens": 4}, "num_requests": 3},
           "cluster": {"pools": [{"name": "main", "device": "H100-SXM"}]}}
    (folder / "s.yaml").write_text(dump(doc))
    check_clean(run_case(cli, ["run", str(folder / "s.yaml")]), json.dumps(cfg))


# ----- numeric extremes at every numeric field ---------------------------------------
EXTREMES = st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -1e308,
                            2**63, -(2**63), 2**64, 5e-324, -5e-324, 2.2250738585072014e-308,
                            "inf", "-inf", "nan", "Infinity", "1e400", "-1e400", "NaN"])


@fuzz_settings(200)
@given(data=st.data())
def test_numeric_extreme(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory,
                         cli: click.Command, fuzz_tally: dict[str, int]) -> None:
    fuzz_tally["bad/run/numeric_extreme"] = fuzz_tally.get("bad/run/numeric_extreme", 0) + 1
    spot = data.draw(st.sampled_from(build_index(RUN).numbers))
    value = data.draw(EXTREMES)
    folder = tmp_path_factory.mktemp("extreme")
    path = folder / "s.yaml"
    path.write_text(dump(replaced(spot.base, spot.path, value)))
    got = run_case(cli, ["run", str(path)])
    check_clean(got, f"{key_path(spot.path)} = {value!r}")


# ----- command-line options and --set values ------------------------------------------
SET_KEYS = st.one_of(st.sampled_from([key_path(s.path) for s in build_index(RUN).values]),
                     st.from_regex(r"[a-z_.\[\]0-9]{1,30}", fullmatch=True))
SET_VALUES = st.one_of(st.sampled_from(["", "inf", ".inf", ".nan", "'inf'", "1e400", "[",
                                        "{a: 1}", "null", "-1", "0", "2e9", "true", "~",
                                        "&a [*a]", "!!python/object:os.system ls",
                                        "9" * 5000]),
                       st.integers(-10**9, 10**9).map(str), st.text(max_size=12))
OPTIONS = st.one_of(
    st.tuples(st.just("--seed"), st.one_of(st.integers(-5, 2**70).map(str),
                                           st.sampled_from(["x", "", "1.5", "nan"]))),
    st.tuples(st.just("--set"), st.tuples(SET_KEYS, SET_VALUES).map("=".join)),
    st.tuples(st.just("--set"), st.text(max_size=10)),
    st.tuples(st.sampled_from(["--skip-bad-rows", "--step-by-step", "--bogus"])),
)


@fuzz_settings(150)
@given(options=st.lists(OPTIONS, min_size=1, max_size=3), base=st.sampled_from(RUN.bases))
def test_cli_options(options: list[tuple[str, ...]], base: dict[str, Any],
                     tmp_path_factory: pytest.TempPathFactory, cli: click.Command,
                     fuzz_tally: dict[str, int]) -> None:
    fuzz_tally["bad/run/cli_options"] = fuzz_tally.get("bad/run/cli_options", 0) + 1
    folder = tmp_path_factory.mktemp("cli")
    path = folder / "s.yaml"
    path.write_text(dump(base))
    argv = ["run", str(path), *[part for option in options for part in option]]
    check_clean(run_case(cli, argv), " ".join(argv[2:])[:300], usage_ok=True)


# ----- output paths ------------------------------------------------------------------
@st.composite
def output_paths(draw: Any) -> tuple[str, str]:
    kind = draw(st.sampled_from(["file", "folder", "foreign", "below-file", "missing-parent",
                                 "proc", "long", "odd", "empty", "dot"]))
    flag = draw(st.sampled_from(["--out", "--trace"]))
    return kind, flag


@fuzz_settings(60)
@given(case=output_paths(), name=st.text(st.characters(blacklist_categories=("Cs",),
                                                       blacklist_characters="/\x00"),
                                         min_size=1, max_size=20))
def test_output_path(case: tuple[str, str], name: str, tmp_path_factory: pytest.TempPathFactory,
                     cli: click.Command, fuzz_tally: dict[str, int]) -> None:
    fuzz_tally["bad/run/output_path"] = fuzz_tally.get("bad/run/output_path", 0) + 1
    kind, flag = case
    folder = tmp_path_factory.mktemp("outp")
    (folder / "a-file").write_text("keep")
    (folder / "foreign").mkdir()
    (folder / "foreign" / "notes.txt").write_text("keep")
    target = {"file": folder / "a-file", "folder": folder / "fresh",
              "foreign": folder / "foreign", "below-file": folder / "a-file" / "x",
              "missing-parent": folder / "a" / "b" / "c", "proc": Path("/proc/no-such/x"),
              "long": folder / ("n" * 300), "odd": folder / name, "empty": Path(""),
              "dot": Path(".")}[kind]
    path = folder / "s.yaml"
    small = replaced(RUN.bases[0], ("workload", "num_requests"), 3)
    path.write_text(dump(small))
    got = run_case(cli, ["run", str(path), flag, str(target)])
    check_clean(got, f"{flag} {kind}: {str(target)[:80]!r}", usage_ok=True)
    if not (kind == "file" and flag == "--trace"):  # a trace file may be overwritten
        assert (folder / "a-file").read_text() == "keep"
    assert (folder / "foreign" / "notes.txt").read_text() == "keep"
    must_fail = {"below-file", "proc", "long", "empty", "dot"} | (
        {"file", "foreign"} if flag == "--out" else set())
    if kind in must_fail:
        assert got.code == EXIT_BAD_INPUT, got.err


def test_yaml_of_extremes_is_valid_yaml() -> None:
    """The numeric-extreme family writes real YAML (dump round-trips every value kind)."""
    assert yaml.safe_load(dump({"a": float("inf"), "b": "1e400", "c": 2**63}))["c"] == 2**63
