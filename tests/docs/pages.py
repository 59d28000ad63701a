"""The documentation's pages and their fenced blocks, as the docs tests read them."""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
# a fenced block's marker, on the line before its opening fence
RUNNABLE = "<!-- runnable -->"
EXEMPT = re.compile(r"<!-- exempt: (.+?) -->")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int
    language: str
    code: str
    marker: str  # "runnable", "exempt: <why>", or ""

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        exempt = EXEMPT.fullmatch(before)
        marker = (
            "runnable" if before == RUNNABLE else f"exempt: {exempt.group(1)}" if exempt else ""
        )
        line = text.count("\n", 0, match.start()) + 1
        page = str(path.relative_to(REPO))
        found.append(Block(page, line, match.group(1), match.group(2), marker))
    return found


def gen_docs() -> ModuleType:
    """scripts/gen_docs.py, imported as a module."""
    if "gen_docs" in sys.modules:
        return sys.modules["gen_docs"]
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module
    spec.loader.exec_module(module)
    return module
