"""The report's sections for a run, a sweep and a plan."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import yaml

from simulator.report import run_figures, sweep_figures
from simulator.report.page import Markup, Page, table
from simulator.report.sources import Source

_SUMMARY = (("num_requests", "requests"), ("completed", "completed"), ("failed", "failed"),
            ("rejected", "rejected"), ("preemptions", "preemptions"),
            ("duration_s", "simulated time (s)"), ("request_throughput", "throughput (req/s)"),
            ("output_token_throughput", "output tokens/s"), ("devices", "devices"),
            ("goodput_per_device", "goodput per device (req/s)"),
            ("cost_usd_per_hour", "$/hour"),
            ("cost_usd_per_1m_output_tokens", "$ per 1M output tokens"),
            ("energy_j_per_output_token", "J per output token"))


def scenario_section(page: Page, scenario: dict[str, Any], what: str) -> None:
    page.heading("Scenario" if what == "run" else f"Scenario ({what})")
    if scenario.get("description"):
        page.text(str(scenario["description"]))
    from simulator.models.catalog import precision_note

    precision = scenario.get("precision") or {}
    note = precision_note(str(scenario.get("model", "")), precision)
    page.text(f"model {scenario.get('model')}, engine {scenario.get('engine', 'vllm')}, "
              f"{note}")
    pools = (scenario.get("cluster") or {}).get("pools") or []
    rows = [(p.get("name"), p.get("role"), p.get("device"), p.get("instances", 1),
             (p.get("parallelism") or {}).get("tp", 1), (p.get("parallelism") or {}).get("pp", 1),
             p.get("engine") or scenario.get("engine", "vllm")) for p in pools]
    page.raw(table(("pool", "role", "device", "instances", "TP", "PP", "engine"), rows))
    workload = scenario.get("workload") or {}
    page.text("workload: " + json.dumps(workload, sort_keys=False))
    page.details("the scenario as simulated (YAML)", yaml.safe_dump(scenario, sort_keys=False))


def summary_section(page: Page, summary: dict[str, Any], slo: dict[str, Any]) -> None:
    page.heading("Summary and SLOs")
    targets = {k: v for k, v in slo.items() if v}
    if targets:
        att = summary.get("slo_attainment")
        shown = ", ".join(f"{k.removesuffix('_s').upper()} <= {v * 1e3:g} ms"
                          for k, v in targets.items())
        page.text(f"SLO attainment: {fmt_pct(att)} of requests meet every target ({shown}); "
                  f"goodput {summary.get('goodput', float('nan')):.4g} req/s")
    rows, classes = [], []
    for metric in ("ttft", "tpot", "itl", "e2e"):
        cells = [summary.get(f"{metric}_{s}_s") for s in ("mean", "p50", "p90", "p99")]
        target = targets.get(f"{metric}_s")
        p90 = summary.get(f"{metric}_p90_s")
        status = "" if target is None or p90 is None else ("meets" if p90 <= target else "misses")
        rows.append((metric.upper(), *(c * 1e3 if isinstance(c, float) else c for c in cells),
                     target * 1e3 if target else None,
                     Markup(f'<span class="{"ok" if status == "meets" else "miss"}">'
                            f"p90 {status}</span>" if status else "")))
        classes.append("")
    page.raw(table(("latency (ms)", "mean", "p50", "p90", "p99", "SLO", ""), rows, classes))
    page.raw(table(("metric", "value"),
                   [(name, summary[k]) for k, name in _SUMMARY if k in summary]
                   + [(k, v) for k, v in summary.items() if k.startswith("util_")]))


def fmt_pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, float) else "-"


def run_report(source: Source) -> Page:
    from simulator.metrics.monitoring import pool_timeseries

    sc = source.scenario
    page = Page(f"Run report: {sc.get('name', source.folder.name)} (seed {sc.get('seed', 0)})")
    scenario_section(page, sc, "run")
    summary_section(page, source.summary, sc.get("slo") or {})
    requests, steps = source.frames["requests"], source.frames["steps"]
    page.heading("Latency distributions")
    page.figure(run_figures.latency_cdfs(requests, sc.get("slo") or {}) if len(requests) else None,
                "no requests were recorded")
    page.heading("Monitoring per pool")
    interval = float((sc.get("simulation") or {}).get("monitor_interval_s", 10.0))
    if len(steps):
        events = source.frames.get("events", pd.DataFrame())
        page.text(f"sampled every {interval:g} s of simulated time"
                  + ("; vertical lines: the events listed below" if len(events) else ""), "note")
        page.figure(run_figures.monitoring(pool_timeseries(steps, requests, interval), events))
        if len(events):
            page.raw(table(("time (s)", "event", "detail"),
                           [(float(e["time_s"]), str(e["kind"]), str(e["detail"]))
                            for _, e in events.iterrows()]))
    else:
        page.text("the run has no steps", "note")
    page.heading("Phase breakdown per request")
    if len(requests):
        fig, _ = run_figures.phase_breakdown(requests)
        page.figure(fig)
        phases = [c for c, _ in run_figures.PHASES if c in requests]
        negative = requests[(requests[phases] < 0).any(axis=1)] if phases else requests.iloc[:0]
        if len(negative):
            restarted = int((negative.get("restarts", pd.Series(0)) > 0).sum())
            page.text(f"{len(negative)} requests ({restarted} of them restarted after a "
                      "failure) have a negative phase time in the requests table; they are "
                      "drawn as recorded, not corrected.", "note")
    return page


def _aggregate_rows(results: pd.DataFrame) -> tuple[list[str], list[tuple[Any, ...]]]:
    from simulator.plots.common import axis_columns, config_labels, pooled

    axes = axis_columns(results)
    metrics = [m for m in ("slo_attainment", "goodput", "ttft_p90_s", "tpot_p90_s",
                           "output_token_throughput", "cost_usd_per_hour",
                           "cost_usd_per_1m_output_tokens") if m in results]
    table_ = pooled(results, axes or ["config_id"], metrics)
    names = config_labels(table_, axes) if axes else table_["config_id"]
    scales = {"slo_attainment": 100, "ttft_p90_s": 1e3, "tpot_p90_s": 1e3}
    rows = [(name, int(r["n_seeds"]), *(r[f"{m}_mean"] * scales.get(m, 1) for m in metrics))
            for name, (_, r) in zip(names, table_.iterrows(), strict=True)]
    heads = {"slo_attainment": "SLO %", "goodput": "goodput req/s", "ttft_p90_s": "TTFT p90 ms",
             "tpot_p90_s": "TPOT p90 ms", "output_token_throughput": "out tok/s",
             "cost_usd_per_hour": "$/hour", "cost_usd_per_1m_output_tokens": "$/1M out tok"}
    return ["configuration", "seeds", *(heads[m] for m in metrics)], rows


def sweep_report(source: Source) -> Page:
    results = source.frames["results"]
    meta = source.meta
    page = Page(f"Sweep report: {meta.get('name', source.folder.name)}")
    ok = int((results["status"] == "ok").sum()) if "status" in results else len(results)
    page.text(f"{len(results)} runs ({ok} succeeded); axes: {', '.join(meta.get('axes', []))}; "
              f"seeds: {meta.get('seeds', '-')}")
    if meta.get("description"):
        page.text(str(meta["description"]))
    scenario_section(page, source.scenario, "first configuration")
    page.heading("Configurations (means over seeds)")
    heads, rows = _aggregate_rows(results)
    page.raw(table(heads, rows))
    ok_rows = results[results["status"] == "ok"] if "status" in results else results
    page.heading("Latency against load")
    page.figure(sweep_figures.curves(ok_rows, [("ttft_p90_s", "TTFT p90"),
                                               ("tpot_p90_s", "TPOT p90")],
                                     "Latency vs load", log=True),
                "no numeric axis to draw curves along")
    page.heading("SLO attainment and goodput")
    page.figure(sweep_figures.curves(ok_rows, [("slo_attainment", "SLO attainment"),
                                               ("goodput", "goodput")],
                                     "SLO attainment and goodput"),
                "no numeric axis to draw curves along")
    page.heading("Cost vs goodput (Pareto front)")
    page.figure(sweep_figures.sweep_pareto(ok_rows), "the results carry no cost")
    page.heading("Prefill:decode ratio")
    page.figure(sweep_figures.pd_heatmap(ok_rows),
                "the sweep has no prefill and decode instance-count axes")
    return page


def plan_report(source: Source) -> Page:
    ranked, rejected = source.frames["ranked"], source.frames["rejected"]
    name = source.scenario.get("name", source.folder.name).split(":")[0]
    page = Page(f"Plan report: {name}")
    if len(ranked):
        rate = float(ranked["target_rate_per_s"].iloc[0])
        from simulator.runner.planner import RANK_RULE

        page.text(f"target {rate:g} req/s; {len(ranked)} configurations meet the SLO, ranked "
                  f"{RANK_RULE}")
        scenario_section(page, source.scenario, "the top pick")
        for warning in source.meta.get("warnings", []):
            page.text(f"warning: {warning}", "miss")
        page.heading("Ranked configurations")
        heads = {"rank": "#", "label": "configuration", "devices": "devices",
                 "cost_usd_per_hour": "$/hour", "slo_attainment": "SLO %",
                 "ttft_p90_s": "TTFT p90 ms", "tpot_p90_s": "TPOT p90 ms",
                 "goodput_rate_per_s": "goodput req/s",
                 "cost_usd_per_1m_output_tokens": "$/1M out tok"}
        cols = [c for c in heads if c in ranked]
        scales = {"slo_attainment": 100, "ttft_p90_s": 1e3, "tpot_p90_s": 1e3}
        page.raw(table([heads[c] for c in cols],
                       [tuple(r[c] * scales.get(c, 1) if c != "label" else str(r[c])
                              for c in cols) for _, r in ranked.iterrows()]))
        gcol = "goodput_rate_per_s" if "goodput_rate_per_s" in ranked else "goodput"
        page.heading("Cost vs goodput (Pareto front)")
        page.figure(sweep_figures.pareto(
            ranked["cost_usd_per_hour"].to_numpy(float), ranked[gcol].to_numpy(float),
            [f"#{r['rank']} {r['label']}" for _, r in ranked.iterrows()],
            "goodput: max rate meeting the SLO target (req/s)", rate, decimals=2))
        page.heading("Devices and $/hour against the request rate")
        page.figure(sweep_figures.capacity_vs_rate(ranked),
                    "needs the goodput search (plan key goodput_search: true)")
    else:
        page.text("no configuration met the SLO at the target rate", "miss")
    if len(rejected):
        page.heading("Rejected families")
        page.raw(table(("family", "why"), [(r["family"], r["reason"])
                                            for _, r in rejected.iterrows()]))
    return page
