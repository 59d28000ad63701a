"""MkDocs hooks of mkdocs.yml: the performance page's plots, taken from where the
benchmarks write them (benchmarks/results/), so no copy of them lives under docs/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# the site's name of each plot -> the benchmark's file
PLOTS = {
    "img/results.png": "results.png",
    "img/scaling.png": "results_issue16.png",
    "img/commit_phases.png": "commit_phases.png",
    "img/view_cost.png": "view_cost.png",
    "img/mariadb_peers.png": "mariadb_peers_quiet.png",
}


def on_files(files: Files, config: Any) -> Files:
    for uri, name in PLOTS.items():
        files.append(File.generated(config, uri, abs_src_path=str(RESULTS / name)))
    return files


# docs/DESIGN.md's section 7 is the project's own list of gaps being closed, by tracker
# item and with dates: kept in the repository's copy, not shown on the site (user
# documentation carries no dates and no tracker numbers)
DESIGN_TRACKER = "\n## 7. Known gaps being closed"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri == "DESIGN.md" and DESIGN_TRACKER in markdown:
        return markdown.split(DESIGN_TRACKER, 1)[0]
    return markdown
