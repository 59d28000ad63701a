"""No import cycle among the package's modules, of any length and at any depth (issue 28
item 4): what lint-imports' ``acyclic_siblings`` contract checks between siblings, and
also a cycle through a package's ``__init__`` and its own modules, which no sibling pair
shows. grimp counts every import: top-level, inside a function, under TYPE_CHECKING (a
knot of knowledge is a knot)."""

from __future__ import annotations

from collections.abc import Mapping, Set

import grimp


def cycles(edges: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each a cycle or
    several), by Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_of_the_package_reaches_itself_through_imports() -> None:
    graph = grimp.build_graph("sqlsink", cache_dir=None)
    modules = graph.modules
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    knots = [
        "\n".join(f"  {a} -> {b}" for a in component for b in sorted(edges[a] & set(component)))
        for component in cycles(edges)
    ]
    assert not knots, "import cycles (cut each along its seam):\n" + "\n\n".join(knots)


def test_the_search_finds_a_cycle_of_any_length() -> None:
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
