"""No module of the package uses another module's ``_private`` name (issue 28 item 4): a
name another module needs is public, or the code that needs it moves to where it lives.
Both ways in are found: ``from sqlsink.x import _name`` (also relative, also inside a
function or ``TYPE_CHECKING``) and ``module._name`` on a module bound by an import."""

from __future__ import annotations

import ast
from pathlib import Path

import sqlsink

PACKAGE = Path(sqlsink.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p) for p in PACKAGE.rglob("*.py")}


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def crossings(source: str, module: str, is_package: bool = False) -> list[str]:
    """Every use in ``source`` (the text of ``module``) of a private name of another
    module of the package."""
    tree = ast.parse(source)
    found: list[str] = []
    modules_bound: dict[str, str] = {}  # local name -> the package's module it is
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            origin = _absolute(module, is_package, node)
            if not origin.startswith("sqlsink"):
                continue
            for alias in node.names:
                if _private(alias.name) and origin != module:
                    found.append(f"line {node.lineno}: from {origin} import {alias.name}")
                if f"{origin}.{alias.name}" in MODULES:
                    modules_bound[alias.asname or alias.name] = f"{origin}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sqlsink"):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"line {node.lineno}: import {alias.name}")
                    if alias.asname:
                        modules_bound[alias.asname] = alias.name
                    else:
                        modules_bound["sqlsink"] = "sqlsink"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        chain, base = [], node.value
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in modules_bound:
            owner = ".".join([modules_bound[base.id], *reversed(chain)])
            if owner in MODULES and owner != module:
                found.append(f"line {node.lineno}: {owner}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for where in crossings(path.read_text(encoding="utf-8"), module, path.stem == "__init__"):
            found.append(f"{path.relative_to(PACKAGE.parent)}: {where}")
    assert not found, "private names used across modules (make them public):\n" + "\n".join(found)


def test_the_finder_sees_each_way_in() -> None:
    """What the test above must catch, on a made-up module of the package."""
    source = (
        "from sqlsink.core.gid import _hidden\n"
        "from ..core.gid import _relative\n"
        "import sqlsink.core.gid as gid\n"
        "from sqlsink.core import model\n"
        "import sqlsink.core.checkpoint_check\n"
        "def f():\n"
        "    from sqlsink.errors import _late\n"
        "    return gid._attr, model._attr, sqlsink.core.checkpoint_check._deep\n"
    )
    found = crossings(source, "sqlsink.spark.example")
    assert found == [
        "line 1: from sqlsink.core.gid import _hidden",
        "line 2: from sqlsink.core.gid import _relative",
        "line 7: from sqlsink.errors import _late",
        "line 8: sqlsink.core.gid._attr",
        "line 8: sqlsink.core.model._attr",
        "line 8: sqlsink.core.checkpoint_check._deep",
    ]
    # its own private names, dunders and public names are not crossings
    own = "from sqlsink.spark.example import _mine\nfrom sqlsink import __version__, errors\n"
    assert crossings(own, "sqlsink.spark.example") == []
