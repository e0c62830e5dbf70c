"""Every project document the code or the docs point at exists (a stale pointer misleads)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A project path such as docs/metrics.md; `owner/repo:docs/x.md` citations of other projects
# are preceded by ':' or '/' and are not ours.
PROJECT_DOC = re.compile(r"(?<![\w/.:-])docs/[\w/.-]+\.md")
MD_LINK = re.compile(r"\]\(([^)#\s]+)")


def test_code_points_only_at_existing_docs() -> None:
    missing = [f"{path.relative_to(REPO)}: {m.group(0)}"
               for path in sorted((REPO / "simulator").rglob("*.py"))
               for m in PROJECT_DOC.finditer(path.read_text(encoding="utf-8"))
               if not (REPO / m.group(0)).exists()]
    assert not missing, missing


def test_relative_links_in_docs_and_notebooks_resolve() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "benchmarks").glob("*.md")), *sorted((REPO / "notebooks").glob("*.ipynb"))]
    missing = []
    for page in pages:
        for m in MD_LINK.finditer(page.read_text(encoding="utf-8")):
            target = m.group(1)
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(REPO)}: {target}")
    assert not missing, missing
