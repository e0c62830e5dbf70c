"""Rich tables for summaries (the CLI's only output format besides files)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

_GROUPS = (
    ("Requests", ("num_requests", "completed", "failed", "rejected", "shed", "cancelled",
                  "retried", "in_flight", "preemptions")),
    ("Throughput", ("duration_s", "request_throughput", "input_token_throughput",
                    "output_token_throughput", "total_token_throughput")),
    ("SLO", ("slo_attainment", "slo_attainment_min_class", "goodput", "goodput_per_device")),
    ("KV cache", ("prefix_hit_rate", "hit_rate_hbm", "hit_rate_dram", "hit_rate_ssd",
                  "hit_rate_remote", "kv_load_seconds", "ttft_seconds_saved",
                  "handoff_tokens_saved", "local_prefill_share")),
)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def summary_table(summary: dict[str, Any], title: str) -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for group, keys in _GROUPS:
        table.add_section()
        for key in keys:
            if key in summary:
                table.add_row(f"{group}: {key}", _fmt(summary[key]))
    table.add_section()
    for metric in ("ttft", "tpot", "itl", "e2e"):
        cells = [summary.get(f"{metric}_{s}_s") for s in ("mean", "p50", "p90", "p99")]
        if any(c is not None for c in cells):
            text = "  ".join(f"{s}={_fmt(c * 1e3 if isinstance(c, float) else c)}"
                             for s, c in zip(("mean", "p50", "p90", "p99"), cells, strict=True))
            table.add_row(f"{metric.upper()} (ms)", text)
    table.add_section()
    for key, value in summary.items():
        if key.startswith(("util_", "cost_", "energy_")):
            table.add_row(key, _fmt(value))
    return table


_CLASS_COLUMNS = (("requests", "requests", 1.0), ("completed", "completed", 1.0),
                  ("shed", "shed", 1.0), ("cancelled", "cancelled", 1.0),
                  ("retried", "retried", 1.0), ("attainment", "slo_attainment", 1.0),
                  ("goodput (req/s)", "goodput", 1.0), ("TTFT p90 (ms)", "ttft_p90_s", 1e3),
                  ("TPOT p90 (ms)", "tpot_p90_s", 1e3), ("E2E p90 (s)", "e2e_p90_s", 1.0))


def classes_table(summary: dict[str, Any]) -> Table | None:
    """One row per request class, each against its own SLO; None without classes."""
    from simulator.metrics.classes import class_names

    names = class_names(summary)
    if not names:
        return None
    table = Table(title="per class (each against its own SLO)", header_style="bold")
    table.add_column("class")
    for label, _, _ in _CLASS_COLUMNS:
        table.add_column(label, justify="right")
    for name in names:
        cells = []
        for _, key, scale in _CLASS_COLUMNS:
            value = summary.get(f"class_{name}_{key}")
            cells.append(_fmt(value * scale if isinstance(value, float) else value))
        table.add_row(name, *cells)
    return table


def print_summary(summary: dict[str, Any], title: str, console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(summary, title))
    per_class = classes_table(summary)
    if per_class is not None:
        console.print(per_class)


def precision_lines(scenario: Any) -> str:
    """``precision: weights fp8, ... (DeepSeek-V3's released precision)``, plus one line per
    pool that sets its own."""
    from simulator.models.catalog import precision_note

    lines = [f"precision: {precision_note(scenario.model, scenario.precision) or 'as given'}"]
    for pool in scenario.cluster.pools:
        if pool.precision is not None:
            note = precision_note(scenario.model, pool.precision, scenario.precision)
            lines.append(f"  pool {pool.name}: {note or 'as given'}")
    return "\n".join(lines)


def print_json(summary: dict[str, Any]) -> None:
    """The summary as one JSON object on stdout (NaN as null), for scripts."""
    import json
    import sys

    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else
                 v.item() if hasattr(v, "item") else v) for k, v in summary.items()}
    sys.stdout.write(json.dumps(clean) + "\n")


def make_console(quiet: bool = False) -> Console:
    """A console that does not squeeze wide tables when output is piped or captured
    (unless ``COLUMNS`` says how wide the reader's screen is); ``quiet`` prints nothing."""
    import os

    if quiet:
        return Console(quiet=True)
    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(width=200)
