"""The Chrome/Perfetto trace export: structure per the Trace Event Format, and content.

The format (Google's "Trace Event Format" document, the one chrome://tracing and
ui.perfetto.dev read): a JSON object with a ``traceEvents`` list; complete events
``ph: X`` with ``ts``/``dur`` in microseconds, ``pid``/``tid``; metadata ``ph: M`` named
``process_name``/``thread_name`` (args.name) or ``*_sort_index`` (args.sort_index); flow
events ``s``/``t``/``f`` sharing ``cat``, ``name`` and ``id``, each bound to the slice
enclosing it on its thread (``bp: e`` on the finish); counters ``ph: C`` with numeric
args; instant events ``ph: i`` with a scope ``s``. Complete events on one thread must
nest: two slices either are disjoint or one contains the other.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import simulator
from simulator.cli import app
from simulator.metrics.trace_events import _Lanes, build_trace, step_label, write_trace
from simulator.scenario.load import load_scenario
from tests.conftest import REPO, make_scenario

STEP_CATS = {"prefill", "decode", "mixed", "idle"}
META_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}
EPS_US = 1e-3  # timestamps are on a nanosecond grid


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def check_trace_structure(trace: dict[str, Any]) -> None:
    """Raise AssertionError where ``trace`` breaks the trace-event format."""
    assert isinstance(trace, dict)
    assert isinstance(trace["traceEvents"], list)
    assert trace.get("displayTimeUnit", "ms") in {"ms", "ns"}
    proc_names: set[int] = set()
    thread_names: set[tuple[int, int]] = set()
    used_procs: set[int] = set()
    used_threads: set[tuple[int, int]] = set()
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[tuple[str, str, Any], list[dict[str, Any]]] = defaultdict(list)
    for ev in trace["traceEvents"]:
        ph = ev["ph"]
        assert ph in {"X", "M", "s", "t", "f", "C", "i"}, ev
        assert isinstance(ev["pid"], int), ev
        assert isinstance(ev["name"], str), ev
        assert ev["name"], ev
        if ph == "M":
            assert ev["name"] in META_NAMES, ev
            if ev["name"].endswith("sort_index"):
                assert isinstance(ev["args"]["sort_index"], int), ev
            else:
                assert isinstance(ev["args"]["name"], str), ev
                assert ev["args"]["name"], ev
            if ev["name"] == "process_name":
                proc_names.add(ev["pid"])
            elif ev["name"] == "thread_name":
                thread_names.add((ev["pid"], ev["tid"]))
            continue
        assert _number(ev["ts"]), ev
        assert ev["ts"] >= 0, ev
        used_procs.add(ev["pid"])
        if ph == "C":
            assert ev["args"], ev
            assert all(_number(v) for v in ev["args"].values()), ev
            continue
        assert isinstance(ev["tid"], int), ev
        used_threads.add((ev["pid"], ev["tid"]))
        if ph == "X":
            assert _number(ev["dur"]), ev
            assert ev["dur"] >= 0, ev
            assert isinstance(ev.get("cat", ""), str)
            assert isinstance(ev.get("args", {}), dict)
            slices[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
        elif ph == "i":
            assert ev["s"] in {"g", "p", "t"}, ev
        else:
            assert isinstance(ev["cat"], str), ev
            assert ev["cat"], ev
            flows[(ev["cat"], ev["name"], ev["id"])].append(ev)
    assert used_procs <= proc_names, f"processes without a name: {used_procs - proc_names}"
    assert used_threads <= thread_names, f"threads without a name: {used_threads - thread_names}"
    for track, spans in slices.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[float] = []
        for start, end in spans:
            while stack and stack[-1] <= start + EPS_US:
                stack.pop()
            assert not stack or end <= stack[-1] + EPS_US, (
                f"slices overlap without nesting on {track}: [{start}, {end}] vs end {stack[-1]}")
            stack.append(end)
    for key, evs in flows.items():
        phases = [e["ph"] for e in sorted(evs, key=lambda e: e["ts"])]
        assert phases.count("s") == 1, (key, phases)
        assert phases.count("f") == 1, (key, phases)
        assert phases[0] == "s", (key, phases)
        assert phases[-1] == "f", (key, phases)
        for e in evs:
            if e["ph"] == "f":
                assert e.get("bp") == "e", e
            track = slices[(e["pid"], e["tid"])]
            assert any(a <= e["ts"] <= b for a, b in track), f"flow {key} not on a slice: {e}"


# ----- fixtures ------------------------------------------------------------------------
def disaggregated(**overrides: Any) -> simulator.Scenario:
    """1 prefill + 2 decode Llama-3.1-8B instances on H100, built in code."""
    return make_scenario(**{
        "cluster.pools": [
            {"name": "p", "role": "prefill", "device": "H100-SXM", "parallelism": {"tp": 1}},
            {"name": "d", "role": "decode", "device": "H100-SXM", "instances": 2},
        ],
        "workload.num_requests": 40,
        "workload.output_tokens.min_tokens": 2,
        **overrides,
    })


@pytest.fixture(scope="module")
def disagg_run() -> tuple[simulator.RunResult, dict[str, Any]]:
    result = simulator.run(disaggregated())
    return result, build_trace(result)


def is_scenario_file(path: Path) -> bool:
    """Scenario files have a cluster; sweep files name a `base`, plan files have neither."""
    data = yaml.safe_load(path.read_text())
    return isinstance(data, dict) and "cluster" in data and "base" not in data


def _by(trace: dict[str, Any], ph: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def _names(trace: dict[str, Any]) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    procs = {e["pid"]: e["args"]["name"] for e in _by(trace, "M") if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"]
               for e in _by(trace, "M") if e["name"] == "thread_name"}
    return procs, threads


# ----- structure -----------------------------------------------------------------------
def test_disaggregated_trace_structure(disagg_run: Any) -> None:
    result, trace = disagg_run
    assert len(result.transfers) == len(result.requests) == 40
    check_trace_structure(trace)
    json.dumps(trace, allow_nan=False)  # strict JSON, no NaN


def test_structure_check_rejects_broken_traces(disagg_run: Any) -> None:
    _, trace = disagg_run
    x = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["dur"] > 10)
    crossing = {**x, "ts": x["ts"] + x["dur"] / 2, "dur": x["dur"]}
    with pytest.raises(AssertionError, match="overlap"):
        check_trace_structure({"traceEvents": [*trace["traceEvents"], crossing]})
    unnamed = {**x, "tid": 999}
    with pytest.raises(AssertionError, match="without a name"):
        check_trace_structure({"traceEvents": [*trace["traceEvents"], unnamed]})
    no_finish = [e for e in trace["traceEvents"] if not (e["ph"] == "f" and e["id"] == 0)]
    with pytest.raises(AssertionError):
        check_trace_structure({"traceEvents": no_finish})


# ----- content -------------------------------------------------------------------------
def test_one_track_per_instance_with_every_step(disagg_run: Any) -> None:
    result, trace = disagg_run
    procs, threads = _names(trace)
    steps = [e for e in _by(trace, "X") if e["cat"] in STEP_CATS]
    assert len(steps) == len(result.steps)
    per_track = defaultdict(list)
    for e in steps:
        per_track[threads[(e["pid"], e["tid"])]].append(e)
    assert sorted(per_track) == sorted(result.steps["instance_name"].unique())
    for name, group in result.steps.groupby("instance_name"):
        evs = per_track[name]
        assert len(evs) == len(group)
        assert sum(e["dur"] for e in evs) == pytest.approx(group["duration_s"].sum() * 1e6,
                                                            rel=1e-9, abs=1e-3 * len(evs))
        assert sum(e["args"]["decode_seqs"] for e in evs) == group["decode_seqs"].sum()
        pool = group["pool"].iloc[0]
        assert {procs[e["pid"]] for e in evs} == {procs[evs[0]["pid"]]}
        assert f"'{pool}'" in procs[evs[0]["pid"]]
    for e in steps:
        a = e["args"]
        assert e["cat"] == step_label(a["prefill_seqs"], a["prefill_tokens"],
                                      a["decode_seqs"])[0]
        if e["cat"] == "decode":
            assert f"{a['decode_seqs']} seq" in e["name"]
    # a decode pool never runs prefill, the prefill pool never decodes
    assert {e["cat"] for e in steps if "'p'" in procs[e["pid"]]} == {"prefill"}
    assert {e["cat"] for e in steps if "'d'" in procs[e["pid"]]} == {"decode"}


def test_transfers_on_link_tracks(disagg_run: Any) -> None:
    result, trace = disagg_run
    procs, threads = _names(trace)
    transfers = [e for e in _by(trace, "X") if e["cat"] == "transfer"]
    assert len(transfers) == len(result.transfers)
    links = set(result.transfers["link_name"])
    for e in transfers:
        assert procs[e["pid"]].startswith("links")
        assert threads[(e["pid"], e["tid"])].split(" [")[0] in links
        row = result.transfers.set_index("request_id").loc[e["args"]["request_id"]]
        assert e["ts"] == pytest.approx(row["start_s"] * 1e6, abs=1e-3)
        assert e["dur"] == pytest.approx(row["duration_s"] * 1e6, abs=2e-3)


def test_flows_go_from_prefill_step_to_decode_step(disagg_run: Any) -> None:
    result, trace = disagg_run
    procs, threads = _names(trace)
    step_slices = defaultdict(list)
    for e in _by(trace, "X"):
        if e["cat"] in STEP_CATS:
            step_slices[(e["pid"], e["tid"])].append(e)

    def enclosing(ev: dict[str, Any]) -> dict[str, Any]:
        (s,) = [s for s in step_slices[(ev["pid"], ev["tid"])]
                if s["ts"] <= ev["ts"] <= s["ts"] + s["dur"]]
        return s

    flows = defaultdict(dict)
    for e in trace["traceEvents"]:
        if e["ph"] in "stf" and e.get("cat") == "kv_handoff":
            flows[e["id"]][e["ph"]] = e
    assert sorted(flows) == sorted(result.transfers["request_id"])
    reqs = result.requests.set_index("request_id")
    for rid, f in flows.items():
        src, dst = enclosing(f["s"]), enclosing(f["f"])
        assert threads[(f["s"]["pid"], f["s"]["tid"])] == reqs.loc[rid, "prefill_instance_name"]
        assert threads[(f["f"]["pid"], f["f"]["tid"])] == reqs.loc[rid, "decode_instance_name"]
        assert src["cat"] in {"prefill", "mixed"}
        assert dst["cat"] in {"decode", "mixed"}
        # the prefill step ends when the first token is out; the decode step starts the
        # request's decoding
        assert src["ts"] + src["dur"] == pytest.approx(reqs.loc[rid, "prefill_end_s"] * 1e6,
                                                       abs=1e-2)
        assert dst["ts"] == pytest.approx(reqs.loc[rid, "decode_start_s"] * 1e6, abs=1e-2)
        assert procs[f["t"]["pid"]].startswith("links")


def test_request_spans(disagg_run: Any) -> None:
    result, trace = disagg_run
    spans = [e for e in _by(trace, "X") if e["cat"] == "request"]
    assert len(spans) == len(result.requests)
    reqs = result.requests.set_index("request_id")
    phases = defaultdict(set)
    for e in _by(trace, "X"):
        if e["cat"] == "request_phase":
            phases[e["args"]["request_id"]].add(e["name"])
    for e in spans:
        rid = int(e["name"].split()[0][1:])
        row = reqs.loc[rid]
        assert e["ts"] == pytest.approx(row["arrival_s"] * 1e6, abs=1e-3)
        assert e["ts"] + e["dur"] == pytest.approx(row["completion_s"] * 1e6, abs=2e-3)
        assert e["args"]["ttft_ms"] == pytest.approx(row["ttft_s"] * 1e3)
        assert {"prefill", "KV transfer", "decode"} <= phases[rid]


def test_colocated_trace_has_no_handoffs(tiny: simulator.Scenario) -> None:
    result = simulator.run(tiny.with_(**{"workload.num_requests": 15}))
    trace = build_trace(result, counters=False)
    check_trace_structure(trace)
    assert not _by(trace, "s")
    assert not _by(trace, "C")
    assert not [e for e in _by(trace, "X") if e["cat"] == "transfer"]
    assert len([e for e in _by(trace, "X") if e["cat"] in STEP_CATS]) == len(result.steps)


def test_overlapping_pipeline_steps_get_lanes() -> None:
    """PP micro-batches overlap on one instance; complete events on a track must nest."""
    sc = make_scenario(**{"cluster.pools.main.parallelism.pp": 2,
                          "workload.arrival.rate_per_s": 40, "workload.num_requests": 30})
    result = simulator.run(sc)
    st = result.steps.sort_values("start_s")
    assert (st["start_s"].to_numpy()[1:] < st["end_s"].to_numpy()[:-1]).any()
    trace = build_trace(result, counters=False)
    check_trace_structure(trace)
    _, threads = _names(trace)
    lanes = {t for t in threads.values() if t.startswith("main/0")}
    assert "main/0" in lanes
    assert len(lanes) >= 2
    steps = [e for e in _by(trace, "X") if e["cat"] in STEP_CATS]
    assert len(steps) == len(result.steps)


def test_shipped_disaggregated_scenarios_trace(tmp_path: Path) -> None:
    """The first disaggregated scenario of each folder under scenarios/, cut to 8 requests."""
    files = [p for p in sorted((REPO / "scenarios").rglob("*.yaml")) if is_scenario_file(p)]
    by_folder: dict[Path, Path] = {}
    for path in files:
        if path.parent not in by_folder and load_scenario(path).cluster.disaggregated:
            by_folder[path.parent] = path
    assert by_folder, "expected at least one shipped disaggregated scenario"
    for path in by_folder.values():
        sc = load_scenario(path).with_(**{"workload.num_requests": 8})
        result = simulator.run(sc, base_dir=path.parent, file=str(path))
        out = write_trace(result, tmp_path / f"{path.stem}.json")
        trace = json.loads(out.read_text())
        check_trace_structure(trace)
        assert len(_by(trace, "f")) == len(result.transfers) > 0, path


def test_cli_run_writes_trace(tmp_path: Path) -> None:
    data = disaggregated(**{"workload.num_requests": 10}).model_dump(mode="json")
    scenario = tmp_path / "disagg.yaml"
    scenario.write_text(yaml.safe_dump(data))
    out = tmp_path / "sub" / "trace.json"
    res = CliRunner().invoke(app, ["run", str(scenario), "--trace", str(out)])
    assert res.exit_code == 0, res.output
    trace = json.loads(out.read_text())
    check_trace_structure(trace)
    assert len(_by(trace, "f")) == 10


# ----- helpers -------------------------------------------------------------------------
def test_step_label() -> None:
    assert step_label(2, 700, 0) == ("prefill", "prefill (2 seq / 700 tok)")
    assert step_label(0, 0, 31) == ("decode", "decode (31 seq)")
    assert step_label(1, 64, 30)[0] == "mixed"
    assert step_label(0, 0, 0)[0] == "idle"


def test_lanes_pack_overlapping_spans() -> None:
    lanes = _Lanes()
    assert [lanes.place(0, 10), lanes.place(10, 20), lanes.place(5, 15), lanes.place(12, 13),
            lanes.place(20, 30)] == [0, 0, 1, 2, 0]
    assert lanes.count == 3


def test_thread_ids_unique_across_processes(disagg_run: Any) -> None:
    _, trace = disagg_run
    owners = defaultdict(set)
    for e in trace["traceEvents"]:
        if "tid" in e:
            owners[e["tid"]].add(e["pid"])
    assert all(len(pids) == 1 for pids in owners.values()), owners
