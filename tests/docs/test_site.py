"""The documentation site builds in strict mode (mkdocs.yml: strict, every link and
anchor validated), so a broken link or a page missing from the nav fails the test
command; and a broken link does fail it (the second test)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.docs.pages import REPO

MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [*MKDOCS, "-f", str(root / "mkdocs.yml"), "-d", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    for page in ("index.html", "operations/runbook/index.html", "reference/api/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site" / "reference/api/index.html").read_text(encoding="utf-8")
    assert "delete_column" in api and "wrap" in api  # the writer's API, from its docstrings
    assert undated(tmp_path / "site") == []


# a tracker's numbers, and a date that is not a timestamp of an example (2026-11-23T...)
TRACKER = re.compile(r"\b[Ii]ssues? #?\d+|\b[Ii]tems? \d+\b|\b20\d\d-\d\d-\d\d\b(?!T)")


def undated(site: Path) -> list[str]:
    """User documentation carries no dates and no tracker numbers: every built page's text,
    the performance page's too (its measurements name their command and point to
    benchmarks/, whose results carry the date); DESIGN.md's own tracker section is left out
    of the site by its hook. tests/docs/test_no_dates.py checks the Markdown itself."""
    found = []
    for page in sorted(site.rglob("*.html")):
        relative = page.relative_to(site).as_posix()
        if relative.startswith(("search/", "assets/")) or relative == "404.html":
            continue
        text = re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))
        found += [f"{relative}: {m.group(0)}" for m in TRACKER.finditer(text)]
    return found


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(REPO / "docs", copy / "docs")
    for shared in ("sqlsink", "scripts", "benchmarks"):
        (copy / shared).symlink_to(REPO / shared)
    page = copy / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_the_readmes_links_lead_to_pages() -> None:
    """README.md is outside the site, so mkdocs does not check it: every relative link of
    it names a file of the repository, and an anchor a heading of that page."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        page = REPO / path
        missing = not page.is_file()
        if missing or (anchor and anchor not in _anchors(page.read_text(encoding="utf-8"))):
            broken.append(target)
    assert broken == []


def _anchors(page: str) -> set[str]:
    """The ids MkDocs gives the page's headings (lower case, words joined by '-')."""
    headings = re.findall(r"^#+ (.+)$", page, re.M)
    return {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h).strip().lower()) for h in headings}
