"""docs/DESIGN.md cites code by name; every cited name must exist in the code today.

Each backticked token of DESIGN.md is classified by the rules below (in this order) and,
if it is a code reference, looked up. No database, no Spark: files on disk, and the
package's and the tests' source read with ``ast``.

Skipped (not a reference to this project's code):
  * tokens inside fenced code blocks, empty tokens, tokens with whitespace (SQL, shell
    commands, prose), tokens with characters no code name has (``= < > … * " $ , ' :``
    outside ``::``, a leading ``-``, ``/`` or ``...``): CLI flags, option assignments,
    URLs, placeholders, literals;
  * camelCase (a lowercase-initial word with a capital in it): Spark/Java API names and
    the sink's options (``checkpointLocation``, ``batch_df.sparkSession``);
  * a name starting ``pg_``: PostgreSQL catalogs and functions;
  * all-capitals without an underscore: SQL keywords (``DELETE``);
  * a single lowercase word without an underscore and without ``()``: ordinary prose
    words and enum values (``recover``, ``live``);
  * a dotted name whose first part is no module, class or instance name of the package
    but an importable module (``os.register_at_fork``, ``pyarrow.fs``): third-party or
    standard library;
  * a call with a string literal argument (``format("sqlsink")``): usage of an API;
  * a file name whose suffix is not ``.py``/``.sql``/``.sh``/``.md`` (``twophase.c``),
    and a path in a Spark checkpoint (first part ``commits``/``offsets``);
  * the few names of ``_ALLOWED`` below, each with its reason.

Checked:
  * a path (has ``/`` or ends ``.py``...): exists relative to the repository root or to
    ``sqlsink/`` (a bare ``x.py``: some file of that name under ``sqlsink/`` or
    ``tests/``); ``path::test_name`` also needs the function in that file;
    ``dir/module.name`` needs ``name`` in that module;
  * ``module.name[.attr]``: ``module`` is the last part(s) of a module's dotted path under
    ``sqlsink/`` (``locks``, ``checks.rules``, ``core.admission``); ``name`` is defined
    or imported at its top level, ``attr`` is a member of that class;
  * ``Class.member``: a class of that name in ``sqlsink/`` or ``tests/`` has the member
    (method, class attribute, field, ``self.`` attribute), or a base class named in it has;
    ``writer.member`` likewise for ``ForeachBatchWriter`` (``_INSTANCES``: the variable
    names DESIGN.md gives an instance of the package's classes);
  * ``name(args)``: checked as ``name()`` (the arguments are the text's);
  * ``sqlsink.x[.y]`` and ``table.column`` otherwise: every part is a word of ``sql/*.sql``
    (database objects);
  * a bare name (with ``_``, a capital, or ``()``): defined in ``sqlsink/`` or ``tests/``
    (function, class, assignment, attribute, parameter); a name without ``()`` may also be
    a word of ``sql/*.sql`` or of a string in the package (a column, a setting), and a
    ``_suffix`` may end such a word (the columns ``checkpoint_detail``, ...).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"

# Genuine exceptions, each with its reason.
_ALLOWED = {
    "ThreadPoolExecutor": "concurrent.futures, the standard library",
    "RecordTransactionCommitPrepared": "a function of PostgreSQL's C source",
    "tpc_prepare": "psycopg's DB-API two-phase call",
    "tpc_rollback": "psycopg's DB-API two-phase call",
    "_p0": "the text of a gid's part field, not a name",
    "streams.active": "Spark's spark.streams.active",
    "repartition": "a Spark DataFrame method",
    "xid": "PostgreSQL's xid type, cast from pg_current_xact_id()",
    "security_invoker": "a PostgreSQL view option",
}
# Variable names DESIGN.md uses for an instance of one of the package's classes.
_INSTANCES = {"writer": "ForeachBatchWriter"}
_FILE_SUFFIXES = (".py", ".sql", ".sh", ".md")
_BAD_CHARS = re.compile(r"[\s=<>…*\"$,']|^[-/]|^\.\.\.")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_CALL = re.compile(rf"^({_IDENT}(?:\.{_IDENT})*)\((.*)\)$")
_DOTTED = re.compile(rf"^{_IDENT}(?:\.{_IDENT})*$")
_CAMEL = re.compile(r"(?:^|[._/])[a-z][a-z0-9]*[A-Z]")


@dataclass
class _Class:
    members: set[str] = field(default_factory=set)
    bases: set[str] = field(default_factory=set)


@dataclass
class _Module:
    top: set[str] = field(default_factory=set)
    classes: dict[str, _Class] = field(default_factory=dict)


@dataclass
class _Index:
    modules: dict[str, _Module] = field(default_factory=dict)  # "sqlsink.core.gid"
    classes: dict[str, list[_Class]] = field(default_factory=dict)
    functions: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)  # any defined name
    words: set[str] = field(default_factory=set)  # words of sql/ and of strings
    sql_words: set[str] = field(default_factory=set)
    basenames: set[str] = field(default_factory=set)


def _targets(node: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]


def _class(node: ast.ClassDef) -> _Class:
    c = _Class(bases={b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases})
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            c.members.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            c.members.add(n.attr)
    for stmt in node.body:
        if isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                c.members.update(_targets(t))
        elif isinstance(stmt, ast.AnnAssign):
            c.members.update(_targets(stmt.target))
    return c


def _module(tree: ast.Module, index: _Index, in_package: bool) -> _Module:
    m = _Module()
    for stmt in _top_statements(tree.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            m.top.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                m.top.update(_targets(t))
        elif isinstance(stmt, ast.AnnAssign):
            m.top.update(_targets(stmt.target))
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            m.top.update((a.asname or a.name).split(".")[0] for a in stmt.names)
    for n in ast.walk(tree):
        if isinstance(n, ast.ClassDef):
            c = _class(n)
            m.classes[n.name] = c
            index.classes.setdefault(n.name, []).append(c)
            index.names.add(n.name)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            index.functions.add(n.name)
            index.names.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            index.names.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            index.names.add(n.attr)
        elif isinstance(n, ast.arg):
            index.names.add(n.arg)
        elif in_package and isinstance(n, ast.Constant) and isinstance(n.value, str):
            index.words.update(re.findall(r"\w+", n.value))
    return m


def _top_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, ast.If):
            out += _top_statements(stmt.body) + _top_statements(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            out += _top_statements(stmt.body)
            for h in stmt.handlers:
                out += _top_statements(h.body)
    return out


@functools.cache
def _build_index() -> _Index:
    index = _Index()
    for sql in (ROOT / "sql").glob("*.sql"):
        index.sql_words.update(re.findall(r"\w+", sql.read_text()))
    index.words |= index.sql_words
    for top in ("sqlsink", "tests"):
        for path in (ROOT / top).rglob("*.py"):
            index.basenames.add(path.name)
            tree = ast.parse(path.read_text(), str(path))
            m = _module(tree, index, top == "sqlsink")
            if top == "sqlsink":
                parts = path.relative_to(ROOT).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                index.modules[".".join(parts)] = m
    return index


def _tokens(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out += [(number, t) for t in re.findall(r"`([^`]+)`", line)]
    return out


def _member(index: _Index, cls: _Class, name: str, seen: frozenset[int] = frozenset()) -> bool:
    if name in cls.members:
        return True
    return any(
        _member(index, base, name, seen | {id(cls)})
        for b in cls.bases
        for base in index.classes.get(b.split(".")[-1], [])
        if id(base) not in seen
    )


def _modules_named(index: _Index, head: str) -> list[_Module]:
    return [m for dotted, m in index.modules.items() if ("." + dotted).endswith("." + head)]


def _resolve_in_module(index: _Index, m: _Module, rest: list[str]) -> bool:
    if rest[0] not in m.top:
        return False
    if len(rest) == 1:
        return True
    c = m.classes.get(rest[0])
    return c is not None and len(rest) == 2 and _member(index, c, rest[1])


def _dotted(index: _Index, name: str) -> bool:
    parts = name.split(".")
    for split in range(len(parts) - 1, 0, -1):  # longest module prefix first
        for m in _modules_named(index, ".".join(parts[:split])):
            if _resolve_in_module(index, m, parts[split:]):
                return True
    if name in index.modules or "sqlsink." + name in index.modules:
        return True
    if len(parts) == 2:
        cls = _INSTANCES.get(parts[0], parts[0])
        if any(_member(index, c, parts[1]) for c in index.classes.get(cls, [])):
            return True
    # a database object: sqlsink.table[.column] or table.column
    db = parts[1:] if parts[0] == "sqlsink" else parts
    return all(p in index.sql_words for p in db)


def _path(index: _Index, token: str) -> str | None:
    """None if the path resolves, else why not."""
    path, _, test = token.partition("::")
    if "/" not in path:
        ok = path in index.basenames or (ROOT / path).exists()
        return None if ok else "no such file in sqlsink/ or tests/"
    # from the root, sqlsink/, or a subpackage of sqlsink/ the text speaks of (views/...)
    packages = [p.parent for p in (ROOT / "sqlsink").rglob("__init__.py")]
    for base in [ROOT, *packages]:
        if (base / path).exists():
            if test and not re.search(
                rf"^\s*(async )?def {test}\(", (base / path).read_text(), re.M
            ):
                return f"{path} has no function {test}"
            return None
        mod, _, attr = path.rpartition(".")
        if not path.endswith(_FILE_SUFFIXES) and (base / (mod + ".py")).exists():
            dotted = ".".join((base / mod).relative_to(ROOT).parts)
            if dotted in index.modules:
                ok = _resolve_in_module(index, index.modules[dotted], [attr])
            else:  # a file of tests/
                top = rf"^(async def |def |class )?{attr}\b"
                ok = re.search(top, (base / (mod + ".py")).read_text(), re.M) is not None
            return None if ok else f"{mod}.py has no {attr}"
    return "no such path (from the repository root or from a package of sqlsink/)"


def _check(index: _Index, token: str) -> str | None:
    """None if the token is fine or is not a code reference, else the reason it is dead."""
    token = token.strip()
    call = _CALL.match(token)
    if call and re.search(r"[\"']", call.group(2)):
        return None  # code using an API with a literal: df.write.format("sqlsink")
    if call:  # the arguments are the text's: Scope.live(run, N)
        token = call.group(1) + "()"
    if not token or _BAD_CHARS.search(token) or ":" in token.replace("::", ""):
        return None
    if _CAMEL.search(token) or token.startswith("pg_") or token in _ALLOWED:
        return None
    if "/" in token or token.endswith(_FILE_SUFFIXES):
        if token.split("/")[0] in ("commits", "offsets"):
            return None
        return _path(index, token)
    if re.search(r"\.[a-z]$", token):  # a file of another language: twophase.c
        return None
    call = _CALL.match(token)
    name = call.group(1) if call else token
    if not _DOTTED.match(name) or name in _ALLOWED or name.strip("_") == "":
        return None
    if "." in name:
        first = name.split(".")[0]
        ours = (
            first in ("sqlsink", "tests")
            or first in _INSTANCES
            or first in index.classes
            or _modules_named(index, first)
        )
        if not ours and importlib.util.find_spec(first):
            return None  # a module of another package: pyarrow.fs
        return None if _dotted(index, name) else "not found in the package"
    if name.isupper() and "_" not in name:
        return None
    if name.islower() and "_" not in name and not call:
        return None
    if call:
        return None if name in index.functions else "no function of that name"
    if name in index.names or name in index.words:
        return None
    if name.startswith("_") and any(w.endswith(name) for w in index.sql_words):
        return None
    return "not defined in sqlsink/ or tests/"


def _dead_names(text: str) -> list[str]:
    index = _build_index()
    dead = []
    for number, token in _tokens(text):
        why = _check(index, token)
        if why:
            dead.append(f"docs/DESIGN.md:{number}: `{token}`: {why}")
    return dead


def test_every_name_design_md_cites_exists() -> None:
    dead = _dead_names(DESIGN.read_text())
    assert not dead, (
        "docs/DESIGN.md cites names the code no longer has; rename each in DESIGN.md to "
        "what the code has now, or fix the code:\n  " + "\n  ".join(dead)
    )


def test_a_dead_name_is_caught() -> None:
    text = "`committer.no_such_function`, `Committer.nothing`, `core/nothing.py`, `gone_fn()`"
    assert len(_dead_names(text)) == 4
