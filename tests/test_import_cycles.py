"""No new import cycle: the module graph of the product and the benchmarks, counting every import in a module
(function-local ones too, as grimp reads them), has no strongly connected group of modules beyond the ones
listed here, each still to be broken. A cycle that goes away must leave the list too (the test says so)."""

from __future__ import annotations

import grimp

PACKAGES = ("strata", "dashboard", "components", "benchmarks")

# Known cycles, to be broken (docs/architecture.md). Each is the exact set of modules of one cycle.
KNOWN = {
    # job_submit and the transfers ask the quotas, which read the jobs' code and data records back.
    frozenset({"strata.jobs.code", "strata.jobs.data", "strata.jobs.services", "strata.jobs.transfers",
               "strata.quotas.roots", "strata.quotas.services"}),
}


def cycles(graph) -> set[frozenset[str]]:
    """The strongly connected groups (more than one module) of the graph's modules in PACKAGES (Tarjan)."""
    modules = {module for module in graph.modules if module.split(".")[0] in PACKAGES}
    edges = {module: [other for other in graph.find_modules_directly_imported_by(module) if other in modules]
             for module in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
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
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.add(frozenset(group))
    return found


def test_no_new_import_cycle():
    found = cycles(grimp.build_graph(*PACKAGES, cache_dir=None))
    new = [sorted(group) for group in found - KNOWN]
    assert not new, f"new import cycles: {new}"
    gone = [sorted(group) for group in KNOWN - found]
    assert not gone, f"these cycles are broken now: remove them from KNOWN: {gone}"


def test_the_check_finds_a_cycle():
    class Graph:
        modules = {"strata.a", "strata.b", "strata.c", "strata.d"}
        imports = {"strata.a": {"strata.b"}, "strata.b": {"strata.c"}, "strata.c": {"strata.a"},
                   "strata.d": {"strata.a"}}

        def find_modules_directly_imported_by(self, module):
            return self.imports.get(module, set())

    assert cycles(Graph()) == {frozenset({"strata.a", "strata.b", "strata.c"})}
