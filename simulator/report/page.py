"""One self-contained HTML page: sections of tables and plotly figures, plotly.js inline
(no server and no network when it is opened)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from simulator.report.numbers import fmt

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.note { color: #555; font-size: 0.9em; } .miss { color: #b00020; font-weight: bold; }
.ok { color: #1b5e20; } pre { background: #f6f6f6; padding: 1em; overflow: auto; }
"""


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
          classes: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(
            f"<td>{c}</td>" if isinstance(c, Markup) else
            f'<td style="text-align:left">{html.escape(str(c))}</td>' if isinstance(c, str)
            else f"<td>{html.escape(fmt(c))}</td>" for c in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


class Markup(str):
    """Text already escaped (inserted into a table cell as it is)."""


class Page:
    """Sections appended in order; ``html()`` renders the whole document."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figures = 0

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def text(self, text: str, cls: str = "") -> None:
        self.parts.append(f'<p class="{cls}">{html.escape(text)}</p>' if cls
                          else f"<p>{html.escape(text)}</p>")

    def raw(self, markup: str) -> None:
        self.parts.append(markup)

    def figure(self, fig: go.Figure | None, missing: str = "") -> None:
        """A plotly figure (its data inline); ``missing`` says why there is none."""
        if fig is None:
            if missing:
                self.text(missing, "note")
            return
        self.figures += 1
        self.parts.append(fig.to_html(full_html=False, include_plotlyjs=False,
                                      div_id=f"figure-{self.figures}",
                                      config={"displaylogo": False, "responsive": True}))

    def details(self, summary: str, body: str) -> None:
        self.parts.append(f"<details><summary>{html.escape(summary)}</summary>"
                          f"<pre>{html.escape(body)}</pre></details>")

    def html(self) -> str:
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><style>{STYLE}</style>"
                f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
                f"<h1>{html.escape(self.title)}</h1>\n" + "\n".join(self.parts)
                + "\n</body></html>\n")
