"""Figures read well: short layout labels, legends off the data, plain log ticks, error
bars inside what a quantity can be, and no configuration dropped without saying so."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.plots import goodput_vs_rate, latency_cdf, latency_vs_throughput, monitoring_plot
from simulator.runner.labels import axis_cells
from simulator.runner.sweep import expand, load_sweep
from tests.conftest import make_scenario

RATE = "workload.arrival.rate_per_s"
P_D = [{"name": "prefill", "role": "prefill", "device": "H100-SXM", "parallelism": {"tp": 4}},
       {"name": "decode", "role": "decode", "device": "H100-SXM", "parallelism": {"tp": 4}}]
COLOC = [{"name": "main", "role": "colocated", "device": "H100-SXM", "parallelism": {"tp": 8}}]


def layout_sweep(tmp_path: Path, values: list[object]) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": make_scenario().model_dump(mode="json"),
                                    "grid": {"cluster.pools": values, RATE: [2, 4]}}))
    return path


def test_layout_axis_values_get_short_derived_labels(tmp_path: Path) -> None:
    sweep = load_sweep(layout_sweep(tmp_path, [P_D, COLOC]))
    cells = [t.point["cluster.pools"] for t in sweep.tasks]
    assert cells == ["1P1D TP4", "1P1D TP4", "colocated TP8", "colocated TP8"]
    # the scenario itself still gets the whole value
    assert sweep.tasks[0].scenario["cluster"]["pools"][0]["role"] == "prefill"


def test_an_axis_value_may_carry_its_own_label(tmp_path: Path) -> None:
    sweep = load_sweep(layout_sweep(tmp_path, [{"label": "split", "value": P_D}, COLOC]))
    assert [t.point["cluster.pools"] for t in sweep.tasks[::2]] == ["split", "colocated TP8"]
    assert sweep.tasks[0].scenario["cluster"]["pools"][1]["role"] == "decode"


def test_derived_labels_stay_unique_and_given_ones_must_be() -> None:
    h200 = [{**p, "device": "H200-SXM"} for p in P_D]
    assert axis_cells("cluster.pools", [P_D, h200]) == ["1P1D TP4 H100-SXM", "1P1D TP4 H200-SXM"]
    mixed = [{**P_D[0], "parallelism": {"tp": 2}}, {**P_D[1], "instances": 2,
                                                     "parallelism": {"tp": 8}}]
    assert axis_cells("cluster.pools", [mixed]) == ["1P2D TP2/TP8"]
    with pytest.raises(ConfigError, match="label 'x' is given to two different values"):
        axis_cells("cluster.pools", [{"label": "x", "value": P_D}, {"label": "x", "value": COLOC}])


def test_plain_values_stay_values() -> None:
    assert axis_cells(RATE, [2, 4.5]) == [2, 4.5]
    assert axis_cells("engine", ["vllm", "sglang"]) == ["vllm", "sglang"]
    assert axis_cells("x.parallelism", [{"tp": 2, "pp": 1}]) == ["tp=2, pp=1"]


def table(labels: list[str], rates: tuple[float, ...] = (2.0, 4.0),
          seeds: tuple[int, ...] = (0, 1)) -> pd.DataFrame:
    rows = []
    for lab in labels:
        for rate in rates:
            for seed in seeds:
                rows.append({"run_id": f"{lab}{rate}{seed}", "config_id": f"{lab}{rate}",
                             "index": len(rows), "seed": seed, "status": "ok",
                             "cluster.pools": lab, RATE: rate,
                             "ttft_p50_s": 0.01 + 0.009 * seed, "ttft_p90_s": 0.02 + 0.019 * seed,
                             "tpot_p50_s": 0.01, "tpot_p90_s": 0.02,
                             "slo_attainment": 1.0 - 0.1 * seed, "goodput": rate * (1 - seed),
                             "scenario_json": json.dumps({"slo": {"ttft_s": 0.5}})})
    return pd.DataFrame(rows)


def test_long_labels_keep_the_layout_and_the_legend_off_the_panels(tmp_path: Path) -> None:
    long = [json.dumps(P_D), json.dumps(COLOC)]  # what a layout axis used to read
    for fig in (latency_vs_throughput(table(long)), goodput_vs_rate(table(long))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "constrained_layout not applied" was a warning
            fig.savefig(tmp_path / "f.png")
        assert fig.legends, "one legend below the panels"
        assert fig.axes[1].get_legend() is None


def test_single_text_axis_labels_read_alone_with_the_axis_as_title() -> None:
    fig = latency_vs_throughput(table(["1P1D TP4", "colocated TP8"]))
    legend = fig.legends[0]
    texts = [t.get_text() for t in legend.get_texts()]
    assert "1P1D TP4 (p90)" in texts
    assert legend.get_title().get_text() == "pools"


def test_error_bars_stay_in_the_feasible_range() -> None:
    fig = goodput_vs_rate(table(["a"], seeds=(0, 1)))
    ax_att, ax_good = fig.axes[:2]
    for ax, low, high in ((ax_att, 0.0, 100.0), (ax_good, 0.0, np.inf)):
        bars = next(c for c in ax.containers if c.get_label() == "a")
        segments = bars.lines[2][0].get_segments()
        assert segments, "two seeds give an interval"
        ends = np.array([seg[:, 1] for seg in segments])
        assert ends.min() >= low - 1e-9
        assert ends.max() <= high + 1e-9
    fig = latency_vs_throughput(table(["a"]))  # TTFT p90 of 20 and 39 ms: CI reaches below 0
    bars = next(c for c in fig.axes[0].containers if c.get_label() == "a (p90)")
    low_end = bars.lines[2][0].get_segments()[0][:, 1].min()
    assert low_end == pytest.approx(29.5 / 10)  # one decade below the mean, not <= 0


def test_log_ticks_read_as_plain_numbers() -> None:
    fig = latency_vs_throughput(table(["a"]))
    fig.canvas.draw()
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert ticks
    assert not any("10^" in t or "times" in t or "×" in t for t in ticks), ticks
    pools = pd.DataFrame({"time_s": [0.0, 10.0], "pool": ["p", "p"], "queue_len": [1, 2],
                          "running": [3, 4], "kv_usage": [0.1, 0.2], "compute_util": [0.5, 0.5],
                          "memory_util": [0.2, 0.2], "ttft_mean_s": [0.04, 0.05],
                          "tpot_mean_s": [0.03, 0.04]})
    fig = monitoring_plot(pools)
    fig.canvas.draw()
    ticks = [t.get_text() for t in fig.axes[3].get_yticklabels() if t.get_text()]
    assert ticks
    assert not any("×" in t or "math" in t for t in ticks), ticks
    for ax in fig.axes[:4]:  # legends beside the panels, not over the data
        legend = ax.get_legend()
        assert legend is not None
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1


def test_cdf_says_what_it_shows_and_draws_every_run_given(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    frame = pd.DataFrame({"status": ["completed"] * 3, "ttft_s": [0.1, 0.2, 0.3],
                          "tpot_s": [0.01, 0.02, 0.03]})
    fig = latency_cdf({f"run {i}": frame for i in range(12)}, note="12 configurations")
    assert len(fig.axes[0].get_lines()) == 12
    assert "12 configurations" in fig.get_suptitle()
    assert fig.legends
    assert fig.axes[0].get_legend() is None
    # A sweep with more configurations than the CDF draws: the figure and stderr say so.
    from simulator.runner.sweep import run_sweep

    path = tmp_path / "s.yaml"
    base = make_scenario(**{"workload.num_requests": 8}).model_dump(mode="json")
    path.write_text(yaml.safe_dump({"base": base, "grid": {RATE: [1, 2, 3, 4, 5, 6],
                                                            "cluster.pools.main.instances": [1, 2]}}))
    run_sweep(expand(load_sweep(path).spec, folder=tmp_path), tmp_path / "out", workers=1)
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(tmp_path / "out"), "--kind", "cdf", "--format", "png"])
    assert exc.value.code in (0, None)
    assert "the first 10 of 12 configurations" in capsys.readouterr().err


def test_pd_heatmap_cells_show_cost() -> None:
    from simulator.plots import pd_ratio_heatmap

    rows = [{"cluster.pools.prefill.instances": p, "cluster.pools.decode.instances": d,
             RATE: 4.0, "seed": 0, "status": "ok", "slo_attainment": 0.5,
             "cost_usd_per_hour": 34.0 * (p + d)} for p in (1, 2) for d in (1, 2)]
    fig = pd_ratio_heatmap(pd.DataFrame(rows))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "50\n$68/h" in texts
    assert "50\n$136/h" in texts
    assert "$/hour" in fig.get_suptitle()
