"""HTML reports: one self-contained page per run, sweep or plan folder.

``disagg-sim report DIR [--out report.html]`` wraps :func:`write_report`. The page holds
its data and plotly.js inline, so it opens from a mail attachment with no server and no
network; figures are interactive (hover for values, click legend entries to hide series).
"""

from __future__ import annotations

from pathlib import Path

from simulator.report.sources import Source, load_source


def render(path: str | Path) -> tuple[str, Source]:
    """The report page of a `run`, `sweep` or `plan` output folder, and what it read."""
    from simulator.report.build import plan_report, run_report, sweep_report

    source = load_source(path)
    build = {"run": run_report, "sweep": sweep_report, "plan": plan_report}[source.kind]
    return build(source).html(), source


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of ``path`` to ``out`` (default ``path/report.html``)."""
    text, _ = render(path)
    target = Path(out) if out is not None else Path(path) / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


__all__ = ["Source", "load_source", "render", "write_report"]
