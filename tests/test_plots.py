"""Plots: figures carry the data, titles, units and legends; the CLI writes PNG and SVG."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure

import simulator
from simulator.cli import main
from simulator.errors import ConfigError
from simulator.metrics.monitoring import busy_per_bin as _busy
from simulator.plots import (
    cost_vs_goodput,
    goodput_vs_rate,
    latency_cdf,
    latency_vs_throughput,
    pareto_front,
    pd_ratio_heatmap,
    run_timeline,
    save,
)
from tests.conftest import make_scenario

RATE = "workload.arrival.rate_per_s"
TP = "cluster.pools.main.parallelism.tp"


def sweep_table() -> pd.DataFrame:
    """A results table: 2 TP sizes x 3 rates x 3 seeds with known metric values."""
    rows = []
    slo = json.dumps({"slo": {"ttft_s": 0.5, "tpot_s": 0.05}})
    for tp in (4, 8):
        for rate in (2.0, 4.0, 8.0):
            for seed in range(3):
                rows.append({
                    "run_id": f"{tp}-{rate}-{seed}", "config_id": f"{tp}-{rate}",
                    "index": len(rows), "seed": seed, "status": "ok", "error": "",
                    RATE: rate, TP: tp,
                    "ttft_p50_s": 0.01 * rate / tp + 0.001 * seed,
                    "ttft_p90_s": 0.02 * rate / tp + 0.001 * seed,
                    "tpot_p50_s": 0.001 * rate, "tpot_p90_s": 0.002 * rate,
                    "request_throughput": rate * 0.9, "output_token_throughput": rate * 100,
                    "slo_attainment": 1.0 - 0.05 * rate / tp, "goodput": rate * 0.8,
                    "cost_usd_per_hour": 34.0, "scenario_json": slo,
                })
    return pd.DataFrame(rows)


def series(ax, label: str):  # type: ignore[no-untyped-def]
    """The data line of the error-bar series called ``label``."""
    return next(c.lines[0] for c in ax.containers if c.get_label() == label)


def test_latency_plot_draws_means_per_configuration() -> None:
    frame = sweep_table()
    fig = latency_vs_throughput(frame)
    assert isinstance(fig, Figure)
    ax_ttft, ax_tpot = fig.axes[:2]
    assert "offered request rate (req/s)" in ax_ttft.get_xlabel()
    assert ax_ttft.get_ylabel() == "TTFT (ms)"
    assert ax_tpot.get_ylabel() == "TPOT (ms)"
    assert "Time to first token" in ax_ttft.get_title()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]  # one legend below the panels
    assert "tp=4 (p90)" in labels
    assert "tp=8 (p50)" in labels
    assert "SLO 50 ms" in labels
    line = series(ax_ttft, "tp=4 (p90)")
    expected = frame[frame[TP] == 4].groupby(RATE)["ttft_p90_s"].mean() * 1e3
    np.testing.assert_allclose(line.get_xdata(), expected.index)
    np.testing.assert_allclose(line.get_ydata(), expected.to_numpy())
    assert "mean of 3 seeds" in fig.get_suptitle()
    bars = next(c for c in ax_ttft.containers if c.get_label() == "tp=4 (p90)")
    assert bars.has_yerr  # 95 % CI over the three seeds
    half = bars.lines[2][0].get_segments()[0][:, 1]  # (low, high) of the first point
    spread = frame[(frame[TP] == 4) & (frame[RATE] == 2.0)]["ttft_p90_s"] * 1e3
    expected_half = 4.303 * spread.std(ddof=1) / np.sqrt(3)
    np.testing.assert_allclose(half, [spread.mean() - expected_half, spread.mean() + expected_half])


def test_latency_against_achieved_throughput() -> None:
    fig = latency_vs_throughput(sweep_table(), x="output_token_throughput")
    line = series(fig.axes[0], "tp=8 (p90)")
    np.testing.assert_allclose(line.get_xdata(), [200, 400, 800])
    assert fig.axes[0].get_xlabel() == "output throughput (tokens/s)"


def test_goodput_plot_has_attainment_target_and_goodput() -> None:
    fig = goodput_vs_rate(sweep_table(), target=0.9)
    ax_att, ax_good = fig.axes[:2]
    assert ax_att.get_ylabel() == "SLO attainment (% of requests)"
    assert any(ln.get_label() == "target 90%" for ln in ax_att.get_lines())
    line = series(ax_att, "tp=4")
    np.testing.assert_allclose(line.get_ydata(), [97.5, 95.0, 90.0])
    assert "req/s" in ax_good.get_ylabel()


def test_pareto_front_on_known_points() -> None:
    cost = np.array([10.0, 12.0, 12.0, 20.0, 25.0, 30.0])
    good = np.array([5.0, 4.0, 8.0, 8.0, 12.0, 0.0])
    assert list(pareto_front(cost, good)) == [0, 2, 4]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 100), st.floats(0.1, 100)), min_size=1, max_size=30))
def test_pareto_front_is_exactly_the_undominated_points(points: list[tuple[float, float]]) -> None:
    cost = np.array([p[0] for p in points])
    good = np.array([p[1] for p in points])
    front = set(pareto_front(cost, good).tolist())
    for i in range(len(points)):
        dominated = any((cost[j] <= cost[i] and good[j] > good[i])
                        or (cost[j] < cost[i] and good[j] >= good[i]) for j in range(len(points)))
        duplicate_kept = any(j in front and cost[j] == cost[i] and good[j] == good[i]
                             for j in range(len(points)) if j != i)
        if dominated:
            assert i not in front
        elif not duplicate_kept:
            assert i in front


def test_cost_vs_goodput_from_a_rate_sweep() -> None:
    frame = sweep_table()
    fig = cost_vs_goodput(frame, target=0.9)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "cluster cost ($/hour)"
    assert "max swept rate with SLO attainment >= 90%" in ax.get_ylabel()
    front = next(ln for ln in ax.get_lines() if "Pareto" in str(ln.get_label()))
    # tp=8 holds 90 % up to 8 req/s, tp=4 up to 8 as well (90 % at 8): same cost -> one point.
    np.testing.assert_allclose(front.get_ydata(), [8.0])


def test_pd_heatmap_cells_are_the_seed_means() -> None:
    rows = []
    for p in (1, 2):
        for d in (1, 2, 3):
            for seed in (0, 1):
                rows.append({"cluster.pools.prefill.instances": p,
                             "cluster.pools.decode.instances": d, RATE: 4.0, "seed": seed,
                             "status": "ok", "slo_attainment": 0.1 * p + 0.2 * d + 0.01 * seed})
    fig = pd_ratio_heatmap(pd.DataFrame(rows))
    image = fig.axes[0].get_images()[0].get_array()
    assert image.shape == (2, 3)
    assert image[1, 2] == pytest.approx(100 * (0.2 + 0.6 + 0.005))
    assert fig.axes[0].get_xlabel().startswith("decode instances")
    assert fig.axes[0].get_title() == "offered rate 4 req/s"
    with pytest.raises(ConfigError, match="prefill and decode"):
        pd_ratio_heatmap(sweep_table())


def test_run_plots_from_a_disaggregated_run(tmp_path: Path) -> None:
    sc = make_scenario(**{"cluster.pools": [
        {"name": "prefill", "role": "prefill", "device": "H100-SXM"},
        {"name": "decode", "role": "decode", "device": "H100-SXM", "instances": 2}]})
    res = simulator.run(sc)
    fig = run_timeline(res.steps, bins=50)
    ax_act, ax_q, ax_kv = fig.axes[:3]
    busy = ax_act.get_images()[0].get_array()
    assert busy.shape == (3, 50)
    assert float(busy.max()) <= 1.0 + 1e-9
    assert [t.get_text() for t in ax_act.get_yticklabels()] == ["decode/0", "decode/1",
                                                                  "prefill/0"]
    assert ax_kv.get_ylabel() == "KV blocks in use (%)"
    assert ax_kv.get_xlabel() == "simulated time (s)"
    assert {str(ln.get_label()) for ln in ax_q.get_lines()} >= {"prefill: waiting",
                                                                 "decode: running"}
    fig = latency_cdf({"run": res.requests}, slo={"ttft_s": 1.0})
    line = fig.axes[0].get_lines()[0]
    assert line.get_ydata()[-1] == pytest.approx(1.0)
    assert len(line.get_xdata()) == (res.requests["status"] == "completed").sum()
    paths = save(fig, tmp_path / "cdf")
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_busy_time_per_bin_adds_up() -> None:
    start = np.array([0.0, 1.5, 4.0])
    end = np.array([1.0, 3.5, 4.25])
    edges = np.linspace(0, 5, 11)
    busy = _busy(start, end, edges)
    assert busy.sum() == pytest.approx((end - start).sum())
    np.testing.assert_allclose(busy[:4], [0.5, 0.5, 0.0, 0.5])


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from simulator.runner.sweep import run_sweep

    folder = tmp_path_factory.mktemp("plots")
    base = make_scenario().model_dump(mode="json")
    (folder / "sweep.yaml").write_text(yaml.safe_dump({
        "base": base, "grid": {RATE: [2, 6], "cluster.pools.main.instances": [1, 2]},
        "seeds": [0, 1]}))
    run_sweep(folder / "sweep.yaml", folder / "out", workers=1)
    return folder / "out"


@pytest.mark.parametrize("kind", ["latency", "goodput", "pareto", "cdf", "timeline"])
def test_cli_plot_writes_png_and_svg(sweep_dir: Path, kind: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(sweep_dir), "--kind", kind])
    assert exc.value.code in (0, None)
    name = kind.replace("-", "_")
    for suffix in ("png", "svg"):
        assert (sweep_dir / "plots" / f"{name}.{suffix}").stat().st_size > 1000
    assert "wrote" in capsys.readouterr().out


def test_cli_plot_errors_are_one_line(sweep_dir: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(sweep_dir), "--kind", "pd-heatmap"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {sweep_dir}: the P:D heatmap needs two axes")
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(tmp_path), "--kind", "latency"])
    assert exc.value.code == 2
    assert "no results.parquet" in capsys.readouterr().err


def test_cli_plot_of_a_single_run_folder(tmp_path: Path) -> None:
    res = simulator.run(make_scenario())
    res.save(tmp_path / "run")
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(tmp_path / "run"), "--kind", "timeline", "--format", "png"])
    assert exc.value.code in (0, None)
    assert (tmp_path / "run" / "plots" / "timeline.png").is_file()
    assert not (tmp_path / "run" / "plots" / "timeline.svg").exists()
