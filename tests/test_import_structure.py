"""The import structure of the packages: one room per concern, read from every import statement.

Layers, lowest first: ``rao_core`` < ``infra`` < ``tasks`` < ``flows`` < ``research`` < ``rao_cli``. A module may
import modules of its own layer and of the layers below it, never of a layer above; no chain of imports
leads from a file back to itself; every module in ``tasks/`` defines a Prefect task. Every import counts:
top-level, function-local, under ``if TYPE_CHECKING:`` and relative (``from . import x``). ``tests/`` and
``scripts/`` stand outside the layers. Docs: docs/files.md (the file map).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The layers, lowest first: a module may import its own layer and those before it.
LAYERS = ("rao_core", "infra", "tasks", "flows", "research", "rao_cli")
#: Decorators (and callables) that make a Prefect task: prefect's own and the pipeline's resumable stage.
TASK_MAKERS = {("prefect", "task"), ("infra.stage_io", "stage")}


@dataclass
class Module:
    name: str  # dotted, e.g. "tasks.stages" ("rao_core.envs" for rao_core/envs/__init__.py)
    path: Path
    is_package: bool
    tree: ast.Module
    imports: dict[str, int] = field(default_factory=dict)  # internal module imported -> first line

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    @property
    def layer(self) -> int:
        return LAYERS.index(self.name.split(".")[0])


def _modules() -> dict[str, Module]:
    out = {}
    for top in LAYERS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            out[name] = Module(name, path, is_package, ast.parse(path.read_text(), filename=str(path)))
    return out


def _resolve(name: str, modules: dict[str, Module]) -> str | None:
    """The module ``name`` is, or the one holding it (``a.b.c`` -> ``a.b`` when ``c`` is a name in ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _absolute(mod: Module, node: ast.ImportFrom) -> str:
    """The absolute module of ``from <node.module> import ...`` written in ``mod`` (relative forms resolved)."""
    if not node.level:
        return node.module or ""
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    parts = package.split(".")
    base = parts[:len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _graph() -> dict[str, Module]:
    modules = _modules()
    for mod in modules.values():
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(mod, node)
                targets = [f"{base}.{a.name}" if a.name != "*" else base for a in node.names]
            else:
                continue
            for t in targets:
                r = _resolve(t, modules)
                if r is not None and r != mod.name:
                    mod.imports.setdefault(r, node.lineno)
    return modules


GRAPH = _graph()


def test_the_graph_sees_every_package_and_its_imports():
    found = {m.name.split(".")[0] for m in GRAPH.values()}
    assert found == set(LAYERS), f"packages without a module: {sorted(set(LAYERS) - found)}"
    # function-local imports count: tasks.stages imports rao_core.judge.stage only inside a function
    assert "rao_core.judge.stage" in GRAPH["tasks.stages"].imports


def upward(graph: dict[str, Module]) -> list[str]:
    """``file:line: module (layer) imports module (layer, a higher layer)`` for each import against the layers."""
    return [f"{m.rel}:{line}: {m.name} ({LAYERS[m.layer]}) imports {t} ({LAYERS[graph[t].layer]}, a higher layer)"
            for m in graph.values() for t, line in sorted(m.imports.items()) if graph[t].layer > m.layer]


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    up = upward(GRAPH)
    assert not up, ("imports against the layers " + " < ".join(LAYERS) + " (move the code to the layer it "
                    "belongs to):\n" + "\n".join(up))


def cycles(graph: dict[str, Module]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v].imports:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in components:  # the shortest way back from the component's first module to itself
        members, start = set(comp), comp[0]
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v].imports):
                    if w in members and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while prev[path[-1]] != start:
            path.append(prev[path[-1]])
        cycles.append([start, *reversed(path[1:]), start])
    return cycles


def cycle_lines(graph: dict[str, Module]) -> list[str]:
    """One entry per cycle: its modules, then each import of it as ``file:line: module imports module``."""
    lines = []
    for cycle in cycles(graph):
        steps = [f"{graph[a].rel}:{graph[a].imports[b]}: {a} imports {b}" for a, b in zip(cycle, cycle[1:])]
        lines.append(" -> ".join(cycle) + "\n  " + "\n  ".join(steps))
    return lines


def test_no_file_imports_itself_through_a_chain():
    lines = cycle_lines(GRAPH)
    assert not lines, "import cycles (move the shared code to a module both can import):\n" + "\n".join(lines)


def _task_makers(mod: Module) -> set[str]:
    """Local names in ``mod`` that are a Prefect task maker (:data:`TASK_MAKERS`), and ``prefect`` when imported."""
    names = set()
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(mod, node)
            names |= {a.asname or a.name for a in node.names if (base, a.name) in TASK_MAKERS}
        elif isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name == "prefect"}
    return names


def _makes_task(expr: ast.expr, makers: set[str]) -> bool:
    """``expr`` is ``task``, ``task(...)``, ``prefect.task(...)`` or ``stage(...)`` (names of :func:`_task_makers`)."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Name):
        return expr.id in makers
    return (isinstance(expr, ast.Attribute) and expr.attr == "task" and isinstance(expr.value, ast.Name)
            and expr.value.id in makers)


def prefect_tasks(mod: Module) -> list[str]:
    """The Prefect tasks ``mod`` defines: decorated functions and module-level ``name = task(fn, ...)``."""
    makers = _task_makers(mod)
    found = []
    for node in ast.walk(mod.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(_makes_task(d, makers) for d in node.decorator_list):
                found.append(node.name)
    for node in mod.tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _makes_task(node.value, makers):
            found += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return found


def test_every_module_in_tasks_defines_a_prefect_task():
    def empty(mod: Module) -> bool:  # a package marker: at most a docstring
        return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in mod.tree.body)

    without = [f"{m.rel}:1: {m.name} defines no Prefect task (@task, or @stage of infra.stage_io); move it to the "
               "layer its code belongs to (infra, rao_core) or to research"
               for m in GRAPH.values() if m.name.split(".")[0] == "tasks" and not (m.is_package and empty(m))
               and not prefect_tasks(m)]
    assert not without, "\n".join(without)


def test_the_stage_decorator_makes_a_prefect_task():
    from prefect import Task

    from infra.stage_io import stage
    from infra.stage_records import StageRecord

    def fn(ctx, iteration):
        return StageRecord()

    fn.__annotations__ = {"iteration": int, "return": StageRecord}  # resolved here, not in this module's globals
    assert isinstance(stage("check")(fn), Task)
    assert prefect_tasks(GRAPH["tasks.warm_start"]) == ["warm_start"]  # found through @stage(...)


def test_the_checks_find_what_they_look_for():
    """Each check fails on a made-up module that breaks its rule (so a pass means the rule holds)."""
    src = ("from prefect import task as t\nimport prefect\nfrom . import stages\n\n@t\ndef a(): ...\n\n"
           "@prefect.task(name='b')\ndef b(): ...\n\ndef c():\n    from research import studies\n")
    mod = Module("tasks.fake", ROOT / "tasks/fake.py", False, ast.parse(src))
    assert prefect_tasks(mod) == ["a", "b"]
    assert _absolute(mod, mod.tree.body[2]) == "tasks"  # from . import stages -> tasks.stages
    assert _resolve("tasks.stages", GRAPH) == "tasks.stages"
    assert _resolve("rao_core.envs.get_env", GRAPH) == "rao_core.envs"
    assert not prefect_tasks(Module("tasks.none", ROOT / "tasks/none.py", False, ast.parse("def f(): ...\n")))


def test_a_made_up_cycle_and_upward_import_are_reported_with_file_and_line():
    def module(name: str, imports: dict[str, int]) -> Module:
        path = ROOT / (name.replace(".", "/") + ".py")
        return Module(name, path, False, ast.parse(""), imports)

    graph = {m.name: m for m in (module("rao_core.a", {"rao_core.b": 3}), module("rao_core.b", {"rao_core.c": 4}),
                                 module("rao_core.c", {"rao_core.a": 5, "tasks.d": 6}), module("tasks.d", {}))}
    assert cycle_lines(graph) == ["rao_core.a -> rao_core.b -> rao_core.c -> rao_core.a\n"
                                  "  rao_core/a.py:3: rao_core.a imports rao_core.b\n"
                                  "  rao_core/b.py:4: rao_core.b imports rao_core.c\n"
                                  "  rao_core/c.py:5: rao_core.c imports rao_core.a"]
    assert upward(graph) == ["rao_core/c.py:6: rao_core.c (rao_core) imports tasks.d (tasks, a higher layer)"]
