"""docs/DESIGN.md stays true: every name it cites in code formatting exists.

Each backticked token outside fenced blocks (a span may run over a line break, as in
Markdown; its words are then joined by one space) is put in the FIRST category below whose
pattern it has, and checked by that category's rule. A token that has the pattern of a
code name but passes no check fails the test, with its DESIGN.md line number. No database,
no Spark: files on disk, the package read with ``ast``, sqlsink/options.py's KNOWN,
the CLI parser's flags, sql/*.sql.

Not code (skipped, by pattern):
  * fragments without a letter or padded with spaces (`` - ``, `` and ``);
  * SQL: a token with an upper-case SQL keyword as a word (``FOR NO KEY UPDATE``,
    ``UPDATE ... WHERE writer IS NULL``), or an expression with spaces or operators
    beside lower-case SQL (``xmin NOT IN (subquery)``, ``pruned_through + 1``);
  * PostgreSQL's own names: ``pg_*`` catalogs and functions, a type (``bigint[]``),
    a C file of its source (``twophase.c``);
  * a host path (``/proc/...``), a URL scheme (``s3://``, ``file:``), a git commit (hex);
  * a placeholder in angle brackets or with ``…`` (``load-<random>``, ``load-…``);
  * a Spark checkpoint path (``commits/N``, ``offsets/N``, ``metadata``).

Checked:
  * CLI: ``sqlsink CMD [--flag ...]``, ``CMD --flag`` and a bare ``--flag``: CMD is a
    subcommand of sqlsink/cli/parser.py and every flag one of its ``add_argument``s (a
    bare flag: of any subcommand, or a pytest option of tests/fix_*.py); ``sqlsink X``
    that is no command must be an application name sqlsink/postgres/appnames.py builds;
  * a path (has ``/``, or ends .py .sql .sh .md): exists from the repository root, from
    sqlsink/, or from a subpackage of it; a bare file name exists under sqlsink/,
    tests/ or benchmarks/; ``sql/NNN_*.sql`` globs match; ``path::test`` needs the test
    function; ``dir/module.name`` needs ``name`` defined in that module; a path followed
    by arguments (``benchmarks/view_cost.py --runs 40``) is checked as the path;
  * ``[tool.x]``: a table of pyproject.toml;
  * an option: a camelCase name, or ``name=value``, whose name is in options.KNOWN or
    SPARK_OWNED (``lockTimeout``, ``semantic=at_least_once``, ``mode=upsert``);
  * a keyword argument ``name=`` / ``name=value`` not an option: a parameter of a
    function of the package (``checkpoint_location=``, ``order_by_key=True``);
  * a PostgreSQL server setting (``max_prepared_transactions``, with ``= value``): in
    _SETTINGS, the settings this design speaks of (a closed list of PostgreSQL's);
  * Spark, PySpark and Java API names (camelCase or dotted Spark properties): in _SPARK;
  * ``module.attr`` of an importable third-party or standard module (``pyarrow.fs``,
    ``os.register_at_fork``): imported, and ``attr`` looked up on it;
  * Python names of the package (sqlsink/ read with ``ast``, tests/ NOT included):
    ``Class.member`` (a method, class attribute, field or ``self.`` attribute of that
    class or of a base class of it; ``writer.x``: of ForeachBatchWriter); ``module.name``
    (``module`` the last part(s) of a dotted module path, ``name`` defined at its top level,
    ``module.Class.member`` too); ``name()`` or ``name(args)`` (a function or method of
    that name; ``name(kw=...)``: with a parameter ``kw``); a bare name (a top-level def,
    class or assignment of a module, or a member of a class);
  * names of the commit log: ``sqlsink.x[.y]``, ``table.column`` and bare names, an
    identifier of sql/*.sql (tables, columns, functions), also a column suffix like
    ``_detail`` of a column in the text just before it;
  * words the package speaks: a token equal to a whole string literal of sqlsink/
    (JSON fields, enum values, fault points, reasons: ``replay_warning``, ``unsure``);
  * tests: ``test_*`` is a test function in tests/, ``KNOWN`` of tests/sim/checks.py is
    checked there (the only bare name of tests/ the text cites, checked with its file);
  * lower-case single words (``recover``, ``live``, ``writer``) pass any check above
    (a command, a module, a table, a string, a Python name) or are on _ALLOWED.
Anything else, or a check that fails: the name is dead. _ALLOWED lists the few that are
names of nothing this test can read, each with its reason.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
PACKAGE = ROOT / "sqlsink"

# Names of nothing this test can read, each with its reason.
_ALLOWED = {
    "fn": "the user's function passed to foreachBatch, a placeholder",
    "p1": "the text of a gid's part field (p1..p999), not a name",
    "p999": "the text of a gid's part field (p1..p999), not a name",
    "_p0": "the text of a gid's part field, not a name",
    "with": "Python's with statement (the writer's `with writer.batch(...)` block)",
    "None": "Python's None",
    "xmin": "PostgreSQL's system column",
    "xid": "PostgreSQL's xid type, cast from pg_current_xact_id()",
    "security_invoker": "a PostgreSQL view option",
    "tpc_prepare()": "psycopg's DB-API two-phase call",
    "tpc_rollback()": "psycopg's DB-API two-phase call",
    "ThreadPoolExecutor": "concurrent.futures, the standard library",
    "RecordTransactionCommitPrepared": "a function of PostgreSQL's C source",
    "count(*)": "SQL's aggregate",
    "postgres": "the PostgreSQL server program (`postgres --single`), also a subpackage",
    "lint-imports": "import-linter's command",
    "make lint": "a Makefile target",
}

# The PostgreSQL server settings the design speaks of (all are PostgreSQL's GUCs).
_SETTINGS = {
    "application_name",
    "connect_timeout",  # libpq's connection parameter
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "lock_timeout",
    "max_prepared_transactions",
    "statement_timeout",
    "synchronous_commit",
    "synchronous_standby_names",
    "tcp_user_timeout",
    "transaction_timeout",
}

# Spark's, PySpark's and the JVM's names the design speaks of.
_SPARK = {
    "attemptNumber()",
    "batch_df.sparkSession",
    "checkpointLocation",
    "checkpointlocation",  # the same option as Spark hands it to a data source
    "foreachBatch",
    "mapInArrow",
    "minBatchesToRetain",
    "partitionId()",
    "repartition(n)",
    "repartitionByRange(n, …)",
    "runId",
    "setJobDescription",
    "setJobGroup",
    "spark.jobGroup.id",
    "spark.sql.streaming.checkpointLocation",
    "sql.streaming.queryId",
    "streamWriter()",
    "streaming.sql.batchId",
    "streams.active",
    "taskAttemptId",
    "taskAttemptId()",
    "writer()",
    "write()",
    "commit()",
    "abort()",
    "prepare()",
    "commit(N)",
    "abort(N)",
    "commit(messages, N)",
    "abort(messages, N)",
    'df.write.format("sqlsink")',
    'format("sqlsink")',
    "foreach_batch_worker",  # PySpark's Connect foreachBatch worker module
    "timezone=",  # a keyword of a PySpark function's signature in 4.2
}
# Variable names DESIGN.md gives an instance of one of the package's classes.
_INSTANCES = {"writer": "ForeachBatchWriter"}

_SQL_KEYWORDS = frozenset(
    [
        "ABORT",
        "ACCESS",
        "ALL",
        "ALTER",
        "ANALYZE",
        "AND",
        "BEGIN",
        "BY",
        "CLUSTER",
        "COMMIT",
        "CONFLICT",
        "CREATE",
        "DEFINER",
        "DELETE",
        "DESC",
        "DISCARD",
        "DISTINCT",
        "DO",
        "DROP",
        "EXCEPTION",
        "EXCLUSIVE",
        "EXPLAIN",
        "FALSE",
        "FOR",
        "FORMAT",
        "FROM",
        "FULL",
        "IMMUTABLE",
        "IN",
        "INSERT",
        "IS",
        "JSON",
        "KEY",
        "LIKE",
        "NO",
        "NOT",
        "NOWAIT",
        "NULL",
        "ON",
        "OR",
        "ORDER",
        "PREPARE",
        "PREPARED",
        "REPLACE",
        "ROLLBACK",
        "SECURITY",
        "SELECT",
        "SHARE",
        "STABLE",
        "TABLE",
        "TRANSACTION",
        "TRUNCATE",
        "UNION",
        "UPDATE",
        "VACUUM",
        "VIEW",
        "WHERE",
        "WITH",
    ]
)
_FILE_SUFFIXES = (".py", ".sql", ".sh", ".md")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENT}(?:\.{_IDENT})*")
_CALL = re.compile(rf"({_IDENT}(?:\.{_IDENT})*)\((.*)\)")
_CAMEL = re.compile(r"^[a-z][a-z0-9]*[A-Z][A-Za-z0-9]*$")


@dataclass
class _Class:
    members: set[str] = field(default_factory=set)
    bases: set[str] = field(default_factory=set)


@dataclass
class _Module:
    path: Path
    top: set[str] = field(default_factory=set)
    classes: dict[str, _Class] = field(default_factory=dict)


@dataclass
class _Index:
    modules: dict[str, _Module] = field(default_factory=dict)  # "sqlsink.core.gid"
    classes: dict[str, list[_Class]] = field(default_factory=dict)
    functions: dict[str, set[str]] = field(default_factory=dict)  # name -> parameters
    defined: set[str] = field(default_factory=set)  # top-level names and class members
    strings: set[str] = field(default_factory=set)  # whole string literals of sqlsink/
    sql: set[str] = field(default_factory=set)  # identifiers of sql/*.sql
    commands: dict[str, set[str]] = field(default_factory=dict)  # subcommand -> flags
    test_options: set[str] = field(default_factory=set)
    appnames: list[re.Pattern[str]] = field(default_factory=list)
    options: set[str] = field(default_factory=set)  # lower-cased
    test_functions: set[str] = field(default_factory=set)
    basenames: set[str] = field(default_factory=set)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _class(node: ast.ClassDef) -> _Class:
    c = _Class(bases={ast.unparse(b).split(".")[-1].split("[")[0] for b in node.bases})
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            c.members.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                c.members |= _names(t)
        elif isinstance(stmt, ast.AnnAssign):
            c.members |= _names(stmt.target)
    for n in ast.walk(node):  # self.x = ... in its methods
        if (
            isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Store)
            and isinstance(n.value, ast.Name)
            and n.value.id == "self"
        ):
            c.members.add(n.attr)
    return c


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


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    return {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}


def _read_module(path: Path, index: _Index) -> _Module:
    tree = ast.parse(path.read_text(), str(path))
    m = _Module(path)
    for stmt in _top_statements(tree.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            m.top.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                m.top |= _names(t)
        elif isinstance(stmt, ast.AnnAssign):
            m.top |= _names(stmt.target)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)) and path.name == "__init__.py":
            m.top |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
    index.defined |= m.top
    for n in ast.walk(tree):
        if isinstance(n, ast.ClassDef):
            c = _class(n)
            m.classes[n.name] = c
            index.classes.setdefault(n.name, []).append(c)
            index.defined |= c.members | {n.name}
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            index.functions.setdefault(n.name, set()).update(_parameters(n))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            index.strings.add(n.value)
        elif isinstance(n, ast.JoinedStr):  # an f-string's literal parts
            index.strings |= {v.value for v in n.values if isinstance(v, ast.Constant) and v.value}
    return m


def _cli(index: _Index) -> None:
    """Subcommands and their flags, from sqlsink/cli/parser.py's add_parser/add_argument."""
    tree = ast.parse((PACKAGE / "cli" / "parser.py").read_text())
    current = ""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        if not isinstance(call.func, ast.Attribute):
            continue
        literals = [a.value for a in call.args if isinstance(a, ast.Constant)]
        if call.func.attr == "add_parser" and literals:
            current = str(literals[0])
            index.commands.setdefault(current, set())
        elif call.func.attr == "add_argument":
            flags = {str(v) for v in literals if str(v).startswith("--")}
            index.commands.setdefault(current, set()).update(flags)
    for fix in ROOT.glob("tests/fix_*.py"):
        for call in ast.walk(ast.parse(fix.read_text())):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "addoption"
            ):
                index.test_options |= {
                    str(a.value) for a in call.args if isinstance(a, ast.Constant)
                }


def _appnames(index: _Index) -> None:
    """The application names appnames.py builds, as patterns (a placeholder: one word)."""
    tree = ast.parse((PACKAGE / "postgres" / "appnames.py").read_text())
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            parts = [
                re.escape(v.value) if isinstance(v, ast.Constant) else r"\S+" for v in n.values
            ]
            index.appnames.append(re.compile("".join(parts)))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            index.appnames.append(re.compile(re.escape(n.value)))


@functools.cache
def _index() -> _Index:
    index = _Index()
    for sql in (ROOT / "sql").glob("*.sql"):
        text = re.sub(r"--[^\n]*", "", sql.read_text())  # identifiers, not comments
        index.sql |= set(re.findall(r"\w+", text))
    for path in sorted(PACKAGE.rglob("*.py")):
        index.basenames.add(path.name)
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        index.modules[".".join(parts)] = _read_module(path, index)
    for top in ("tests", "benchmarks"):
        for path in (ROOT / top).rglob("*.py"):
            index.basenames.add(path.name)
            if top == "tests":
                index.test_functions |= set(
                    re.findall(r"^\s*(?:async )?def (test_\w+)\(", path.read_text(), re.M)
                )
    _cli(index)
    _appnames(index)
    options = importlib.import_module("sqlsink.options")
    index.options = set(options.KNOWN) | set(options.SPARK_OWNED)
    return index


def _tokens(text: str) -> list[tuple[int, str]]:
    """(line number, token) of each code span outside fenced blocks; a span may run over
    a line break (not over a blank line), as Markdown's do: its words joined by a space."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        fence = line.lstrip().startswith("```")
        fenced = fenced != fence
        lines.append("" if fence or fenced else line)
    kept = "\n".join(lines)
    return [
        (kept.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
        for m in re.finditer(r"`((?:[^`\n]|\n(?![ \t]*\n))+)`", kept)
    ]


def _member(index: _Index, cls: _Class, name: str, seen: frozenset[int] = frozenset()) -> bool:
    if name in cls.members:
        return True
    return any(
        _member(index, base, name, seen | {id(cls)})
        for b in cls.bases
        for base in index.classes.get(b, [])
        if id(base) not in seen
    )


def _modules_named(index: _Index, tail: str) -> list[_Module]:
    return [m for dotted, m in index.modules.items() if ("." + dotted).endswith("." + tail)]


def _in_module(index: _Index, m: _Module, rest: list[str]) -> bool:
    if rest[0] not in m.top:
        return False
    if len(rest) == 1:
        return True
    c = m.classes.get(rest[0])
    return c is not None and len(rest) == 2 and _member(index, c, rest[1])


def _python_dotted(index: _Index, name: str) -> bool:
    parts = name.split(".")
    for split in range(len(parts) - 1, 0, -1):  # the longest module path first
        for m in _modules_named(index, ".".join(parts[:split])):
            if _in_module(index, m, parts[split:]):
                return True
    if _modules_named(index, name):
        return True
    if len(parts) == 2:
        cls = _INSTANCES.get(parts[0], parts[0])
        return any(_member(index, c, parts[1]) for c in index.classes.get(cls, []))
    return False


def _sql_name(index: _Index, name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "sqlsink" and len(parts) > 1:
        parts = parts[1:]
    return all(p in index.sql for p in parts)


def _third_party(name: str) -> str | None:
    """None if name is module.attr of an importable module outside the package, else why."""
    first, _, rest = name.partition(".")
    if first in ("sqlsink", "tests") or importlib.util.find_spec(first) is None:
        return "no such module"
    obj: object = importlib.import_module(first)
    for part in rest.split(".") if rest else []:
        if not hasattr(obj, part):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")  # type: ignore[attr-defined]
                continue
            except ImportError:
                return f"{first} has no {part}"
        obj = getattr(obj, part)
    return None


def _path(index: _Index, token: str) -> str | None:
    """None if the path exists, else why not."""
    token = token.split()[0]  # a path with arguments
    path, _, test = token.partition("::")
    if "/" not in path:
        return None if path in index.basenames else "no such file"
    if "*" in path:  # sql/NNN_*.sql: N a digit
        return None if list(ROOT.glob(path.replace("N", "[0-9]"))) else "no file matches"
    bases = [ROOT, PACKAGE, *(p.parent for p in PACKAGE.rglob("__init__.py"))]
    for base in bases:
        if (base / path).exists():
            if test and not re.search(
                rf"^\s*(async )?def {test}\(", (base / path).read_text(), re.M
            ):
                return f"{path} has no test {test}"
            return None
        mod, _, attr = path.rpartition(".")
        if not path.endswith(_FILE_SUFFIXES) and (base / (mod + ".py")).exists():
            dotted = ".".join((base / mod).relative_to(ROOT).parts)
            if dotted in index.modules and _in_module(
                index, index.modules[dotted], attr.split(".")
            ):
                return None
            return f"{mod}.py defines no {attr}"
    return "no such path"


def _cli_check(index: _Index, token: str) -> str | None:
    words = token.split()
    if words[0] == "sqlsink":
        words = words[1:]
    if not words[0].startswith("--"):
        command = words[0]
        if command not in index.commands:
            if any(p.fullmatch(token) for p in index.appnames) or token in index.strings:
                return None  # an application name: sqlsink planner, sqlsink <id> commit
            return f"no subcommand {command!r} in cli/parser.py, nor an application name"
        flags = index.commands[command]
    else:
        flags = set().union(*index.commands.values()) | index.test_options
    bad = [w for w in words if w.startswith("--") and w not in flags]
    return f"no flag {', '.join(bad)}" if bad else None


def _is_cli(index: _Index, token: str) -> bool:
    words = token.split()
    if token.startswith("--") or (words[0] == "sqlsink" and len(words) > 1):
        return True
    return len(words) > 1 and words[0] in index.commands and words[1].startswith("--")


def _not_code(token: str) -> bool:
    """The patterns of tokens that are not names of code (the docstring's first list)."""
    if not re.search(r"[A-Za-z]", token) or token != token.strip():
        return True
    if set(re.findall(r"\b[A-Z]+\b", token)) & _SQL_KEYWORDS:
        return True  # SQL
    if re.search(r"\s[-+<>/]|[<>]\s", token) and not token.startswith(("sqlsink ", "--")):
        return True  # an expression: pruned_through + 1, <> ALL, runTimeout / 3
    if token.startswith(("pg_", "/")) or "(pg_" in token or "://" in token or token.endswith(":"):
        return True  # PostgreSQL's names, host paths, URL schemes, label-like text
    if re.fullmatch(r"[a-z]+\[\]|[0-9a-f]{7,40}|\w+\.c", token):
        return True  # a type, a commit, a C source file
    if re.search(r"<\w[^>]*>|…", token) and not token.startswith("repartition"):
        return True  # a placeholder
    first = token.split("/")[0]
    return first in ("commits", "offsets") or token == "metadata"


def _check(index: _Index, token: str) -> str | None:
    """None if the token is fine or is not a code reference, else why it is dead."""
    if token in _ALLOWED or token in _SPARK or token in _SETTINGS:
        return None
    if _not_code(token):
        return None
    if _is_cli(index, token):
        return _cli_check(index, token)
    if re.fullmatch(r"\[tool\.[\w.]+\]", token):
        table = token[1:-1]
        return None if f"[{table}]" in (ROOT / "pyproject.toml").read_text() else "no such table"
    if "/" in token or token.split("::")[0].endswith(_FILE_SUFFIXES):
        return _path(index, token)
    setting = re.fullmatch(rf"({_IDENT}) = (\w+|'[^']*')", token)
    if setting:  # a server setting, or a column of the commit log given a value
        name = setting.group(1)
        return None if name in _SETTINGS or name in index.sql else "no such setting or column"
    assignment = re.fullmatch(rf"({_IDENT})=(.*)", token)
    if assignment:
        name = assignment.group(1)
        if name.lower() in index.options:
            return None
        if any(name in params for params in index.functions.values()):
            return None
        return "neither an option nor a parameter of the package"
    if _CAMEL.fullmatch(token):
        return None if token.lower() in index.options else "not an option (options.KNOWN)"
    inner = re.fullmatch(r"foreachBatch\((.*)\)", token)
    if inner:  # foreachBatch(writer.wrap(fn)): the package's part
        return _check(index, _CALL.sub(r"\1", inner.group(1)))
    call = _CALL.fullmatch(token)
    if call:
        name, args = call.group(1), call.group(2)
        keywords = re.findall(rf"({_IDENT})=", args)
        if "." in name:
            ok = _python_dotted(index, name)
            return None if ok else "no such function or method"
        params = index.functions.get(name)
        if params is None:
            return "no function or method of that name"
        bad = [k for k in keywords if k not in params]
        return f"{name} has no parameter {', '.join(bad)}" if bad else None
    if token.startswith("with "):  # with writer.batch(batch_id)
        return _check(index, token[len("with ") :])
    columns = re.fullmatch(rf"(?:({_IDENT}) )?\(({_IDENT}(?:, {_IDENT})*)\)", token)
    if columns:  # an index and its columns: markers_batch (sink_id, batch_id)
        names = [columns.group(1) or "", *columns.group(2).split(", ")]
        bad = [n for n in names if n and n not in index.sql]
        return f"not in sql/: {', '.join(bad)}" if bad else None
    if token.startswith("...::"):  # the test file of the line before
        test = token[len("...::") :]
        return None if test in index.test_functions else f"no test {test}"
    literal = re.fullmatch(r'"([^"]*)"', token)
    if literal:
        return None if literal.group(1) in index.strings else "no such string in the package"
    if token.endswith("-"):  # a prefix the package builds: load-
        return None if any(s.startswith(token) for s in index.strings) else "no such prefix"
    if not _DOTTED.fullmatch(token):
        return "not a name this test knows how to check"
    return _name(index, token)


def _name(index: _Index, token: str) -> str | None:
    if token.startswith("test_"):
        return None if token in index.test_functions else "no test function of that name"
    if token == "KNOWN":  # tests/sim/checks.py's, the text says so
        text = (ROOT / "tests" / "sim" / "checks.py").read_text()
        return None if re.search(r"^KNOWN\b", text, re.M) else "tests/sim/checks.py has no KNOWN"
    if "." in token:
        first = token.split(".")[0]
        ours = (
            first in ("sqlsink", *_INSTANCES)
            or first in index.classes
            or _modules_named(index, first)
            or first in index.sql
        )
        if not ours:
            return _third_party(token)
        if _python_dotted(index, token) or _sql_name(index, token):
            return None
        return "not found in the package (module, class member) nor in sql/"
    if token in index.defined or token in index.functions:
        return None
    if token in index.sql or token in index.strings or token in index.commands:
        return None
    if _modules_named(index, token):
        return None
    if token.startswith("_") and any(w.endswith(token) for w in index.sql):
        return None  # a column suffix: checkpoint_detail, ...
    return "not defined in sqlsink/, sql/, or the package's strings"


def _dead(text: str) -> list[str]:
    index = _index()
    return [
        f"docs/DESIGN.md:{number}: `{token}`: {why}"
        for number, token in _tokens(text)
        if (why := _check(index, token)) is not None
    ]


def test_every_name_design_md_cites_exists() -> None:
    dead = _dead(DESIGN.read_text())
    assert not dead, (
        "docs/DESIGN.md cites names the code does not have; rename each in DESIGN.md to "
        "what the code has now (or fix the code):\n  " + "\n  ".join(dead)
    )


def test_the_parts_table_names_the_newest_migration() -> None:
    """Section 1.3's row of the commit log's DDL names the range of migrations: a new one
    in sql/ must move its end (it once said 001-005 when there were 8)."""
    newest = max(p.name for p in (ROOT / "sql").glob("[0-9][0-9][0-9]_*.sql"))
    (row,) = [
        line for line in DESIGN.read_text().splitlines() if line.startswith("| commit log DDL |")
    ]
    assert f"`sql/{newest}`" in row, f"the parts table's DDL row does not name sql/{newest}: {row}"


def test_each_kind_of_dead_name_is_caught() -> None:
    dead = [
        "`core/nothing.py`",
        "`tests/pg/test_forget.py::test_nothing`",
        "`cli/status.nothing`",
        "`sql/099_*.sql`",
        "`Committer.nothing`",
        "`locks.nothing`",
        "`core.admission.nothing`",
        "`gone_function()`",
        "`plan_write(nothing=1)`",
        "`no_such_name`",
        "`noSuchOption`",
        "`noSuchOption=1`",
        "`sqlsink nothing`",
        "`sqlsink recover --no-such-flag`",
        "`--no-such-flag`",
        "`sqlsink.no_such_table`",
        "`pyarrow.no_such_thing`",
        "`test_no_such_test`",
        "`[tool.nothing]`",
        "`writer.nothing`",
    ]
    found = _dead("\n".join(dead))
    assert [re.search(r"`.*`", line).group(0) for line in found] == dead  # type: ignore[union-attr]


def test_what_is_not_code_or_is_known_passes() -> None:
    fine = [
        "`FOR NO KEY UPDATE`",
        "`pg_prepared_xacts`",
        "`max_prepared_transactions = 0`",
        "`lockTimeout`",
        "`semantic=at_least_once`",
        "`sqlsink recover --sink-id S --commit-lost K`",
        "`sqlsink planner`",
        "`sqlsink <id> commit`",
        "`Committer.abort_batch`",
        "`locks.sink_lock`",
        "`core/gid.py`",
        "`sql/009_batch_figures.sql`",
        "`commit_batch(load=True)`",
        "`sqlsink.decisions`",
        "`pyarrow.fs`",
        "`commits/N`",
    ]
    assert _dead("\n".join(fine)) == []
