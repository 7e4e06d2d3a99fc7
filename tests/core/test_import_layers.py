"""The import graph: no cycles, and each layer imports only what is below it.

Read from the source with ``ast`` (imports inside functions too, which is
where cycles hide), so it needs nothing running. Layers, lowest first: agentd
(no Django, no fleet), fleet.models, fleet.services, then everything that
calls services (consumers, gateway, API, admin, tasks, commands, pages).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentd", "fleet", "llmgw_site")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "migrations" not in path.parts:
                found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    """The project modules ``name`` imports, each resolved to a module that exists."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # "from pkg import mod" imports the module pkg.mod; "from mod import f" imports mod.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_one():
    # A test that cannot fail proves nothing: a planted cycle is found.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _offenders(graph, importer_prefix, forbidden_prefixes):
    return sorted(
        f"{src} -> {dst}"
        for src, dsts in graph.items()
        if src == importer_prefix or src.startswith(importer_prefix + ".")
        for dst in dsts
        if any(dst == f or dst.startswith(f + ".") for f in forbidden_prefixes)
    )


def test_the_agent_imports_nothing_of_the_control_plane():
    graph = _graph()
    assert _offenders(graph, "agentd", ["fleet", "llmgw_site"]) == []
    for path in (ROOT / "agentd").rglob("*.py"):
        assert "import django" not in path.read_text() and "from django" not in path.read_text()


def test_models_and_services_import_nothing_above_them():
    graph = _graph()
    above = [
        "fleet.sockets",
        "fleet.gateway",
        "fleet.api",
        "fleet.admin",
        "fleet.tasks",
        "fleet.management",
        "fleet.routing",
        "fleet.devstack",
        "fleet.console",
    ]
    assert _offenders(graph, "fleet.models", ["fleet.services", *above]) == []
    assert _offenders(graph, "fleet.services", above) == []


def test_asking_for_a_pass_loads_neither_the_pass_nor_the_tasks():
    graph = _graph()
    reachable, todo = set(), ["fleet.services.reconciler.ask"]
    while todo:
        for dst in graph[todo.pop()]:
            if dst not in reachable:
                reachable.add(dst)
                todo.append(dst)
    assert "fleet.services.reconciler.passes" not in reachable
    assert "fleet.tasks" not in reachable
