"""The measured-table step-time predictor, on small synthetic tables (no extra needed)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.cli import main
from simulator.cost import BatchShape, InstanceCostModel, LinkSet, Parallelism
from simulator.cost.predictor import StepTimePredictor, TablePredictor, predictor_summary
from simulator.cost.tables import GridTable, KernelTables
from simulator.errors import ConfigError
from simulator.hardware import load_device, load_link
from simulator.models import get_model
from simulator.runner import kernel_tables
from simulator.runner.run import Simulation
from tests.conftest import make_scenario

H100 = load_device("H100-SXM")
M8 = get_model("Llama-3.1-8B")
H = M8.hidden_size  # 4096


def test_grid_is_exact_on_points_and_log_log_between() -> None:
    table = GridTable((np.array([1.0, 4.0]), np.array([10.0, 1000.0])),
                      np.array([[1.0, 100.0], [4.0, 400.0]]))
    assert table.lookup((1, 10)) == pytest.approx(1.0)
    assert table.lookup((4, 1000)) == pytest.approx(400.0)
    # Half-way in log space on both axes: the geometric mean of the four corners.
    assert table.lookup((2, 100)) == pytest.approx((1 * 100 * 4 * 400) ** 0.25)
    # A power law t = m * (n / 10) is reproduced exactly inside the grid.
    assert table.lookup((3, 300)) == pytest.approx(3 * 30)


def test_grid_never_extrapolates_or_bridges_gaps() -> None:
    grid = np.array([[1.0, 2.0], [np.nan, 4.0]])
    table = GridTable((np.array([1.0, 2.0]), np.array([1.0, 2.0])), grid)
    assert table.lookup((0.5, 1)) is None
    assert table.lookup((1, 3)) is None
    assert table.lookup((1.5, 1.5)) is None  # one corner unmeasured
    assert table.lookup((1, 2)) == pytest.approx(2.0)


def test_grid_from_points_keeps_the_median_of_repeats() -> None:
    table = GridTable.from_points([(1, 1), (1, 1), (1, 1), (2, 1)], [1.0, 5.0, 2.0, 3.0])
    assert table.lookup((1, 1)) == pytest.approx(2.0)
    assert table.lookup((2, 1)) == pytest.approx(3.0)
    assert table.lookup((1, 2)) is None


def _gemm_rows(ms: list[int]) -> tuple[list[tuple[int, int, int]], list[float]]:
    """Synthetic bf16 GEMM timings for Llama-3.1-8B's TP1 shapes: 5 us + 1 ns per MAC/1e3."""
    inter = M8.intermediate_size
    qkv = M8.q_width + 2 * M8.num_kv_heads * M8.head_dim
    shapes = [(qkv, H), (H, M8.attn_out_width), (2 * inter, H), (H, inter)]
    pts, secs = [], []
    for m in ms:
        for n, k in shapes:
            pts.append((m, n, k))
            secs.append(5e-6 + m * n * k * 1e-15)
    return pts, secs


def _tables() -> KernelTables:
    pts, secs = _gemm_rows([1, 16, 256, 4096])
    allreduce = {2: GridTable.from_points([(1e3,), (1e8,)], [10e-6, 1e-3])}
    return KernelTables("synthetic", "vllm", "0.0", "built in the test",
                        gemm={"bf16": GridTable.from_points(pts, secs)}, allreduce=allreduce)


def test_table_predictor_prices_covered_gemms_from_the_table() -> None:
    pred = TablePredictor(M8, H100, tables=_tables())
    ops = pred.breakdown(BatchShape.decode(16, 16 * 100))
    inter = M8.intermediate_size
    expected = 2 * 5e-6 + 16 * (2 * inter * H + H * inter) * 1e-15
    assert ops["gemm_ffn"] == pytest.approx(expected * M8.num_layers)
    # Attention and elementwise kernels have no table here: roofline, as the default.
    roof = InstanceCostModel(M8, H100).breakdown(BatchShape.decode(16, 16 * 100))
    assert ops["attention_decode"] == pytest.approx(roof["attention_decode"])
    assert ops["elementwise"] == pytest.approx(roof["elementwise"])
    assert ops["gemm_ffn"] != pytest.approx(roof["gemm_ffn"])


def test_outside_the_table_falls_back_to_the_roofline_and_says_so() -> None:
    pred = TablePredictor(M8, H100, tables=_tables())
    roof = InstanceCostModel(M8, H100)
    big = BatchShape.prefill(8192)  # m = 8192 > the table's 4096
    assert pred.breakdown(big)["gemm_ffn"] == pytest.approx(roof.breakdown(big)["gemm_ffn"])
    prov = pred.provenance
    assert "gemm_ffn" in prov.fallback_ops
    assert any("m=8192" in s for s in prov.fallback_shapes["gemm_ffn"])
    assert 0.0 <= prov.table_share < 1.0


def test_all_reduce_from_the_engine_table() -> None:
    links = LinkSet(tp=load_link("nvlink4"))
    pred = TablePredictor(M8, H100, Parallelism(tp=2), links=links, tables=_tables())
    elements = 16 * H  # 16 tokens: the table counts elements of the 16-bit hidden state
    table_s = _tables().allreduce_s(elements, 2)
    assert table_s is not None
    ops = pred.breakdown(BatchShape.decode(16, 1600))
    assert ops["allreduce"] == pytest.approx(2 * M8.num_layers * table_s)


def test_decode_series_equals_step_by_step() -> None:
    pred = TablePredictor(M8, H100, tables=_tables())
    ctx = np.array([1600, 1616, 1632, 5000])
    series = pred.decode_series(16, ctx)
    for j, c in enumerate(ctx):
        assert series.seconds[j] == pytest.approx(pred.step(BatchShape.decode(16, int(c))).seconds)


def test_both_predictors_follow_the_protocol() -> None:
    assert isinstance(InstanceCostModel(M8, H100), StepTimePredictor)
    assert isinstance(TablePredictor(M8, H100, tables=_tables()), StepTimePredictor)
    assert predictor_summary([InstanceCostModel(M8, H100)]) == {"cost_predictor": "roofline"}


def test_breakdown_sums_to_the_step() -> None:
    cm = InstanceCostModel(M8, H100, Parallelism(tp=2), links=LinkSet(tp=load_link("nvlink4")),
                           step_overhead_s=3e-4, graph_launch_factor=0.5)
    for shape in (BatchShape.decode(8, 800), BatchShape.build([(300, 100, True)], [500, 700])):
        assert sum(cm.breakdown(shape).values()) == pytest.approx(cm.step(shape).seconds)


def test_run_summary_records_provenance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_tables, "load_tables", lambda *a, **k: _tables())
    res = Simulation(make_scenario(**{"cost.predictor": "tables"})).run()
    s = res.summary
    assert s["cost_predictor"] == "tables"
    assert 0.0 < s["cost_table_share"] < 1.0
    assert s["cost_table_s"] > 0
    assert s["cost_roofline_s"] > 0
    assert "elementwise" in s["cost_fallback_ops"]
    plain = Simulation(make_scenario(**{"cost.predictor": "roofline"})).run()
    assert plain.summary["cost_predictor"] == "roofline"
    assert not math.isclose(res.summary["e2e_mean_s"], plain.summary["e2e_mean_s"])


def test_tables_without_the_extra_is_a_clear_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(kernel_tables, "tables_root", lambda: None)
    kernel_tables.load_tables.cache_clear()
    data = make_scenario(**{"cost.predictor": "tables"}).model_dump(mode="json")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit) as exc:
        main(["run", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(path) in err
    assert "cost.predictor" in err
    assert "pip install 'disagg-sim[kernels]'" in err
    assert "Traceback" not in err


def test_device_without_tables_is_refused() -> None:
    sc = make_scenario(**{"cost.predictor": "tables", "cluster.pools.main.device": "MI300X"})
    with pytest.raises(ConfigError, match="MI300X has no measured kernel tables"):
        Simulation(sc)


@pytest.mark.kernels  # deselected by default; `pytest -m kernels` with the extra installed
def test_real_tables_price_an_h100_decode_step() -> None:
    tables = kernel_tables.load_tables("h100_sxm", "vllm")
    pred = TablePredictor(M8, H100, tables=tables)
    step = pred.step(BatchShape.decode(32, 32 * 1000))
    assert 0 < step.seconds < 0.1
    assert pred.provenance.table_share > 0.5
