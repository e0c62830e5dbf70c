"""The wide-EP study of docs/wide_ep.md and docs/parallelism.md, as priced steps.

``python -m simulator.runner.wide_ep_study`` prints the tables those pages show. Every
number is a step priced by the instance cost model that the shipped scenario
``scenarios/wide_ep/dsv3_pd_ep32_ep72_h100.yaml`` builds (with the variations named in
each row), so the tables move whenever the cost model does.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from simulator._paths import data_dir
from simulator.cost.batch import BatchShape
from simulator.errors import ConfigError
from simulator.runner.build import PoolPlan, build_plan
from simulator.scenario.schema import Scenario

SCENARIO = data_dir("scenarios") / "wide_ep" / "dsv3_pd_ep32_ep72_h100.yaml"
PREFILL_TOKENS_PER_RANK = 16384
PROMPT_TOKENS = 2000
DECODE_SEQS_PER_RANK = 256
DECODE_CONTEXT = 2000
SEQS_PER_GPU = (0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256)


def _base() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(Path(SCENARIO).read_text())
    return data


def _plan(data: dict[str, Any]) -> list[PoolPlan]:
    return build_plan(Scenario.model_validate(data), SCENARIO.parent, str(SCENARIO)).pools


def _with_moe(data: dict[str, Any], pools: range, **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for i in pools:  # the shipped pools share one YAML anchor: copy before changing
        moe = out["cluster"]["pools"][i]["moe"] = copy.deepcopy(out["cluster"]["pools"][i]["moe"])
        for key, value in changes.items():
            if key.startswith("load_"):
                moe["expert_load"][key.removeprefix("load_")] = value
            else:
                moe[key] = value
    return out


def _prefill_rate(pool: PoolPlan) -> tuple[float, float]:
    par = pool.parallelism
    prompts = par.dp * PREFILL_TOKENS_PER_RANK // PROMPT_TOKENS
    step = pool.cost_models[0].step(BatchShape.build([(PROMPT_TOKENS, 0, True)] * prompts))
    nodes = par.devices / pool.device.devices_per_node
    return prompts * PROMPT_TOKENS / step.seconds / nodes, step.seconds


def _decode_rate(pool: PoolPlan) -> tuple[float, float]:
    par = pool.parallelism
    seqs = par.dp * DECODE_SEQS_PER_RANK
    step = pool.cost_models[0].step(BatchShape.decode(seqs, seqs * DECODE_CONTEXT,
                                                      DECODE_CONTEXT))
    nodes = par.devices / pool.device.devices_per_node
    return seqs / step.seconds / nodes, step.seconds


def sglang_rows() -> list[str]:
    """Rows of the SGLang 12-node comparison (docs/wide_ep.md)."""
    base = _base()
    both = range(2)
    rows = []
    for name, data in (
        ("as shipped (TBO, EPLB + 32 redundant, Zipf 0.6)", base),
        ("no two-batch overlap", _with_moe(base, both, two_batch_overlap=False)),
        ("uniform routing, no two-batch overlap",
         _with_moe(base, both, two_batch_overlap=False, load_popularity="uniform")),
    ):
        pre, dec = _plan(data)
        p_rate, p_s = _prefill_rate(pre)
        d_rate, d_s = _decode_rate(dec)
        rows.append(f"| {name} | {p_rate:,.0f} | {d_rate:,.0f} | {p_s:.2f} s | "
                    f"{d_s * 1e3:.0f} ms | {pre.cost_models[0].moe_imbalance:.2f} / "
                    f"{dec.cost_models[0].moe_imbalance:.2f} |")
    static = []
    for tbo in (True, False):
        data = _with_moe(base, range(1), two_batch_overlap=tbo, load_eplb=False,
                         load_redundant_experts=0)
        pre = _plan(data)[0]
        static.append((*_prefill_rate(pre), pre.cost_models[0].moe_imbalance))
    (r1, s1, imb), (r2, s2, _) = static
    rows.append(f"| prefill without EPLB (static placement), with / without TBO | "
                f"{r1:,.0f} / {r2:,.0f} | | {s1:.2f} / {s2:.2f} s | | {imb:.2f} |")
    return rows


def _decode_pool(data: dict[str, Any], model: str, par: dict[str, int],
                 precision: dict[str, str] | None, overlap: bool) -> PoolPlan:
    out = copy.deepcopy(data)
    out["model"] = model
    if precision is not None:
        out["precision"] = precision
    pool = out["cluster"]["pools"][1]
    pool.update(role="colocated", parallelism=par)
    dp = par.get("dp", 1)
    pool["scheduler"] = {"max_num_seqs": 256 * dp, "max_num_batched_tokens": 256 * dp}
    if dp == 1:
        pool.pop("moe")
    else:
        pool["moe"] = dict(pool["moe"], two_batch_overlap=overlap)
    out["cluster"]["pools"] = [pool]
    return _plan(out)[0]


def crossover_row(model: str, label: str, par: dict[str, int],
                  precision: dict[str, str] | None = None) -> str:
    """Decode tok/s per GPU @ TPOT ms at each of SEQS_PER_GPU (the better of TBO on/off)."""
    base = _base()
    pools = [_decode_pool(base, model, par, precision, overlap) for overlap in (True, False)]
    devices = pools[0].parallelism.devices
    capacity = pools[0].memory.kv_capacity_tokens
    cells = []
    for per_gpu in SEQS_PER_GPU:
        seqs = int(per_gpu * devices)
        if seqs * DECODE_CONTEXT > capacity:
            cells.append("KV")
            continue
        shape = BatchShape.decode(seqs, seqs * DECODE_CONTEXT, DECODE_CONTEXT)
        seconds = min(p.cost_models[0].step(shape).seconds for p in pools)
        cells.append(f"{seqs / seconds / devices:,.0f} @ {seconds * 1e3:.0f}")
    held = capacity / DECODE_CONTEXT / devices
    return f"| {label} ({held:.0f} seqs/GPU fit) | " + " | ".join(cells) + " |"


CROSSOVER = (
    ("DeepSeek-V3", None, (("TP16 EP16, 2 nodes", {"tp": 16, "ep": 16}),
                           ("DP16 EP16, 2 nodes", {"tp": 1, "dp": 16, "ep": 16}),
                           ("DP32 EP32, 4 nodes", {"tp": 1, "dp": 32, "ep": 32}),
                           ("DP72 EP72, 9 nodes", {"tp": 1, "dp": 72, "ep": 72}))),
    ("Qwen3-235B-A22B", {"weights": "fp8", "activations": "fp8"},
     (("TP8 EP8, 1 node", {"tp": 8, "ep": 8}),
      ("DP8 EP8, 1 node", {"tp": 1, "dp": 8, "ep": 8}),
      ("TP16 EP16, 2 nodes", {"tp": 16, "ep": 16}),
      ("DP32 EP32, 4 nodes", {"tp": 1, "dp": 32, "ep": 32}))),
)


def main() -> None:
    print("| configuration | prefill tok/s per node | decode tok/s per node | prefill step | "
          "decode step | hottest-rank factor (P / D) |")
    for row in sglang_rows():
        print(row)
    for model, precision, configs in CROSSOVER:
        print(f"\n{model}: decode tok/s per GPU @ TPOT ms, {DECODE_CONTEXT}-token contexts")
        print("| seqs / GPU | " + " | ".join(f"{s:g}" for s in SEQS_PER_GPU) + " |")
        for label, par in configs:
            try:
                print(crossover_row(model, label, par, precision))
            except ConfigError as exc:
                print(f"| {label} | {exc} |")


if __name__ == "__main__":
    main()
