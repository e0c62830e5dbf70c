"""HTML reports: one offline page per run, sweep and plan folder, rendered in a real
browser (headless Chromium) to check that every plot drew and carries its data."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import simulator
from simulator.cli import main
from simulator.report import render, write_report
from simulator.runner.planner import PlanSpec, plan
from simulator.runner.sweep import run_sweep
from tests.conftest import make_scenario

RATE = "workload.arrival.rate_per_s"
P_D = [{"name": "prefill", "role": "prefill", "device": "H100-SXM"},
       {"name": "decode", "role": "decode", "device": "H100-SXM"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report")
    run = simulator.run(make_scenario(**{"cluster.pools": P_D, "workload.num_requests": 40}))
    run.save(root / "run")
    base = make_scenario(**{"cluster.pools": P_D, "workload.num_requests": 20})
    (root / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "pd", "base": base.model_dump(mode="json"),
        "grid": {"cluster.pools.prefill.instances": [1, 2],
                 "cluster.pools.decode.instances": [1, 2], RATE: [2, 8]},
        "seeds": [0, 1]}))
    run_sweep(root / "sweep.yaml", root / "sweep", workers=1)
    spec = PlanSpec.model_validate({
        "name": "tiny-plan", "model": "Llama-3.1-8B",
        "workload": {"arrival": {"kind": "poisson", "rate_per_s": 4},
                     "input_tokens": {"kind": "uniform", "min_tokens": 100, "max_tokens": 300},
                     "output_tokens": {"kind": "uniform", "min_tokens": 10, "max_tokens": 40},
                     "num_requests": 60},
        "slo": {"ttft_s": 0.5, "tpot_s": 0.05}, "hardware": [{"device": "H100-SXM",
                                                               "max_devices": 2}],
        "tp": [1], "layouts": ["colocated"], "top": 2})
    from simulator.cli.plan_cmd import _write

    _write(plan(spec, workers=1), root / "plan")
    return {"run": root / "run", "sweep": root / "sweep", "plan": root / "plan"}


def _figure_count(text: str) -> int:
    return len(re.findall(r'<div id="figure-\d+"', text))


@pytest.mark.parametrize(("kind", "sections", "figures"), [
    ("run", ["Summary and SLOs", "Latency distributions", "Monitoring per pool",
             "Phase breakdown per request"], 3),
    ("sweep", ["Latency against load", "SLO attainment and goodput", "Pareto front",
               "Prefill:decode ratio"], 4),
    ("plan", ["Ranked configurations", "Pareto front", "Devices and $/hour"], 2),
])
def test_report_sections_and_figures(folders: dict[str, Path], kind: str,
                                     sections: list[str], figures: int) -> None:
    text, source = render(folders[kind])
    assert source.kind == kind
    for section in sections:
        assert section in text
    assert _figure_count(text) >= figures
    # self-contained: plotly.js inline, no script or stylesheet fetched from anywhere
    assert "<script src" not in text
    assert 'rel="stylesheet"' not in text
    assert len(text) > 3_000_000  # plotly.js is a few MB


def test_report_is_deterministic(folders: dict[str, Path]) -> None:
    assert render(folders["sweep"])[0] == render(folders["sweep"])[0]


def test_report_cli_writes_the_page_and_rejects_other_folders(
        folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    with pytest.raises(SystemExit) as exc:
        main(["report", str(folders["run"]), "--out", str(out)])
    assert exc.value.code in (0, None)
    assert out.stat().st_size > 1_000_000
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path}: no summary.json (run), results.parquet (sweep)")
    assert "\n" not in err


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed; .ci/run installs Debian's `chromium` package "
                    "(apt-get install -y chromium), and CI must render the HTML report")
    pytest.skip("no chromium on this machine (CI installs it and runs this test)")


def _dom(page: Path, tmp_path: Path) -> str:
    """The page's DOM after its scripts ran, from headless Chromium."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=20000",
           "--dump-dom", page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _rendered(dom: str) -> dict[str, str]:
    """figure id -> its rendered markup (from its div to the next figure's)."""
    parts = re.split(r'(?=<div id="figure-\d+")', dom)
    return {re.match(r'<div id="(figure-\d+)"', p).group(1): p  # type: ignore[union-attr]
            for p in parts if p.startswith('<div id="figure-')}


@pytest.mark.parametrize(("kind", "expect"), [
    ("run", {"figure-1": ["TTFT", "SLO TTFT 1000 ms"], "figure-2": ["prefill", "decode"],
             "figure-3": ["decode", "prefill"]}),
    ("sweep", {"figure-1": ["decode×1, prefill×1", "SLO TTFT 1000 ms"],
               "figure-3": ["Pareto front"], "figure-4": ["SLO %"]}),
    ("plan", {"figure-1": ["Pareto front", "target 4 req/s"], "figure-2": ["devices"]}),
])
def test_report_renders_in_a_real_browser(folders: dict[str, Path], tmp_path: Path,
                                          kind: str, expect: dict[str, list[str]]) -> None:
    page = write_report(folders[kind], tmp_path / f"{kind}.html")
    figures = _rendered(_dom(page, tmp_path))
    assert len(figures) == _figure_count(page.read_text())
    for fid, markup in figures.items():
        assert 'class="main-svg"' in markup, f"{fid} did not render"
        # traces drew marks: scatter paths/points, bars or heatmap images
        assert re.search(r'class="(trace|point|heatmaplayer|hm)', markup), fid
    for fid, texts in expect.items():
        for text in texts:
            assert text in figures[fid], (fid, text)


def test_planner_capacity_figure_follows_the_goodput(folders: dict[str, Path]) -> None:
    import pandas as pd

    from simulator.report.sweep_figures import capacity_vs_rate

    ranked = pd.read_parquet(folders["plan"] / "plan.parquet")
    fig = capacity_vs_rate(ranked)
    assert fig is not None
    devices: Any = fig.data[0]
    assert next(iter(devices.x)) == pytest.approx(4.0)  # starts at the target rate
    assert max(devices.x) == pytest.approx(ranked["goodput_rate_per_s"].max())
    assert list(devices.y) == sorted(devices.y)  # more rate never needs fewer devices


def test_capacity_curve_steps_once_per_configuration() -> None:
    import pandas as pd

    from simulator.runner.planner import capacity_curve

    ranked = pd.DataFrame({
        "label": ["a", "b", "c", "d"], "devices": [2, 2, 3, 4],
        "cost_usd_per_hour": [8.5, 8.5, 12.75, 17.0],
        "goodput_rate_per_s": [50.0, 43.0, 58.0, 40.0], "target_rate_per_s": 30.0})
    curve = capacity_curve(ranked)
    assert curve.to_dict("records") == [
        {"from_rate_per_s": 30.0, "to_rate_per_s": 50.0, "devices": 2,
         "cost_usd_per_hour": 8.5, "label": "a"},
        {"from_rate_per_s": 50.0, "to_rate_per_s": 58.0, "devices": 3,
         "cost_usd_per_hour": 12.75, "label": "c"}]
    assert capacity_curve(ranked.drop(columns="goodput_rate_per_s")).empty


def test_plan_report_shows_the_rule_and_warnings(folders: dict[str, Path],
                                                 tmp_path: Path) -> None:
    import json

    meta = json.loads((folders["plan"] / "plan.json").read_text())
    assert meta["rank_rule"].startswith("cheapest $/hour first")
    copy = tmp_path / "plan"
    shutil.copytree(folders["plan"], copy)
    meta["warnings"] = ["60 requests at 4 req/s are too few for steady state"]
    (copy / "plan.json").write_text(json.dumps(meta))
    text, _ = render(copy)
    assert "warning: 60 requests at 4 req/s are too few for steady state" in text
    assert "<th>configuration</th>" in text
