"""User documentation carries no dates and no tracker numbers (the project's rule: a
measurement's date and command live with its results, under benchmarks/). Checked on the
Markdown itself: README.md and every page of mkdocs.yml's nav but docs/DESIGN.md (the
design record), outside fenced code blocks. The JSON contract's example timestamps
(``2026-11-23T17:29:47…``) are example values, not dates of a measurement."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.docs.pages import REPO

DESIGN_RECORD = "DESIGN.md"
EXAMPLE_TIMESTAMPS = "docs/reference/json.md"

DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}(?!\d)")
TIME_OF_DAY = re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\s?UTC\b")
# "issue 16", "items 1", "stop 38", "#31" (not an anchor "#31-heading", an entity "&#31;"
# nor a colour in code "`#333`"), "owner/repo#40"
TRACKER = re.compile(
    r"\b(?:issues?|items?|stops?|tickets?|PRs?|pull requests?)\s+#?\d+\b"
    r"|(?<![&\w.`])#\d+(?![\w-])"
    r"|\b[\w.-]+/[\w.-]+#\d+\b",
    re.IGNORECASE,
)
_FENCED = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)


def nav_pages(nav: Any) -> Iterator[str]:
    """The Markdown files of mkdocs.yml's nav, relative to docs/."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for entry in nav:
            yield from nav_pages(entry)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from nav_pages(value)


def user_documentation() -> list[Path]:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    site = [REPO / config["docs_dir"] / page for page in nav_pages(config["nav"])]
    return [REPO / "README.md", *(p for p in site if p.name != DESIGN_RECORD)]


def dated(text: str, *, example_timestamps: bool = False) -> list[tuple[int, str]]:
    """Each date, time of day and tracker reference of a page's text outside its fenced
    blocks, with its line; ``example_timestamps``: the page's ISO timestamps are examples."""
    # a fenced block becomes as many empty lines, so that line numbers stay true
    prose = _FENCED.sub(lambda block: "\n" * block.group(0).count("\n"), text)
    found = []
    for pattern in (DATE, TIME_OF_DAY, TRACKER):
        for match in pattern.finditer(prose):
            if pattern is DATE and example_timestamps and prose.startswith("T", match.end()):
                continue
            found.append((prose.count("\n", 0, match.start()) + 1, match.group(0)))
    return sorted(found)


def test_the_nav_is_read() -> None:
    pages = {p.relative_to(REPO).as_posix() for p in user_documentation()}
    assert {"README.md", "docs/index.md", "docs/performance.md"} <= pages
    assert "docs/reference/json.md" in pages
    assert "docs/DESIGN.md" not in pages
    assert all((REPO / page).is_file() for page in pages)


def test_user_documentation_carries_no_dates_and_no_tracker_numbers() -> None:
    found = []
    for page in user_documentation():
        name = page.relative_to(REPO).as_posix()
        text = page.read_text(encoding="utf-8")
        examples = name == EXAMPLE_TIMESTAMPS
        found += [f"{name}:{line}: {hit}" for line, hit in dated(text, example_timestamps=examples)]
    assert found == [], (
        "user documentation carries no dates and no tracker numbers: say the command and "
        "the machine, and point to the results under benchmarks/ that carry the date:\n"
        + "\n".join(found)
    )


def test_what_counts() -> None:
    text = (
        "Measured on 2026-11-24 at 03:48 UTC (issue 16, see #31 and dlt-hub/dlt#40).\n"
        "Fixed in stop 38.\n"
        "```sh\n"
        "make bench  # 2026-11-24, issue 16\n"
        "```\n"
        "An anchor [a](DESIGN.md#51-mariadb), [b](#data-loss), colours `#333` and #fff, &#38;,\n"
        "a timestamp 2026-11-23T17:29:47, and 12:30 without a zone.\n"
    )
    assert dated(text) == [
        (1, "#31"),
        (1, "03:48 UTC"),
        (1, "2026-11-24"),
        (1, "dlt-hub/dlt#40"),
        (1, "issue 16"),
        (2, "stop 38"),
        (7, "2026-11-23"),
    ]
    assert dated(text, example_timestamps=True)[-1] == (2, "stop 38")
