"""Progress display of a long single `disagg-sim run` (rich; only on a terminal)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.text import Text

from simulator.runner.progress import ProgressCallback, RunProgress


def progress_line(p: RunProgress, wall_s: float) -> str:
    """``simulated 312.4 s of 600 s, 1,204 / 2,000 requests, 515 req/s, ETA 2 s``."""
    parts = [f"simulated {p.sim_time_s:,.1f} s" + (f" of {p.end_time_s:,.0f} s"
                                                    if p.end_time_s else "")]
    parts.append(f"{p.finished_requests:,}" + (f" / {p.total_requests:,}" if p.total_requests
                                               else "") + " requests")
    if wall_s > 0:
        parts.append(f"{p.finished_requests / wall_s:,.0f} req/s")
    fractions = []
    if p.total_requests:
        fractions.append(p.finished_requests / p.total_requests)
    if p.end_time_s:
        fractions.append(p.sim_time_s / p.end_time_s)
    done = max(fractions, default=0.0)
    if 0 < done < 1:
        parts.append(f"ETA {wall_s * (1 - done) / done:,.0f} s")
    return ", ".join(parts)


@contextmanager
def run_progress(console: Console, enabled: bool = True) -> Iterator[ProgressCallback | None]:
    """A callback that keeps one status line up to date, or ``None`` (no display) when
    ``enabled`` is false or the output is not a terminal."""
    if not enabled or not console.is_terminal:
        yield None
        return
    start = time.perf_counter()
    with Live(Text("starting"), console=console, transient=True,
              refresh_per_second=4) as live:

        def update(p: RunProgress) -> None:
            live.update(Text(progress_line(p, time.perf_counter() - start)))

        yield update
