"""The package's layering, read from the source with `ast` (nothing is imported):

- module-level imports form no cycle, so every module can be imported on its own and a reader
  can follow the dependencies one way;
- `t5x_like.errors` imports nothing and `t5x_like.config` only `errors`: any module may raise a
  user-facing error or check a setting without pulling in gin registration;
- the library never imports `t5x_like.tasks` (the directory `tasks/`, installed under the
  project's name: it registers tasks and depends on the library), except `gin_setup`, the
  entry points' registration; nothing imports it as a top-level `tasks`, the name a wheel does
  not install;
- only entry points import `gin_setup`;
- the core (every library module outside `t5x_like.families`, except `gin_setup`, which
  registers the families for gin) imports no model family, even inside a function: it reads a
  model through `t5x_like.models.base` only, so a new family is a new package, not an edit of
  the core;
- a family imports no entry point (train, eval, ...): the entry points drive the families.

The checks are proven to fail on a hand-built graph with a cycle (`test_a_cycle_is_found`).
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("t5x_like", "tasks", "benchmarks")
# A directory's import name where it is not the directory's own (pyproject.toml's package-dir).
IMPORT_NAMES = {"tasks": "t5x_like.tasks"}
TASKS = IMPORT_NAMES["tasks"]
ENTRY_POINTS = {
    "t5x_like.cli",
    "t5x_like.plan",
    "t5x_like.train",
    "t5x_like.eval",
    "t5x_like.infer",
    "t5x_like.convert",
    "t5x_like.report",
}


def _modules() -> dict[str, str]:
    """Module name -> path for every .py file of the project's packages."""
    found = {}
    for package in PACKAGES:
        for directory, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    top, _, rest = module.partition(".")
                    module = ".".join(filter(None, (IMPORT_NAMES.get(top, top), rest)))
                    found[module.removesuffix(".__init__")] = path
    return found


def _imported(module: str, path: str, known: set[str], module_level_only: bool) -> set[str]:
    """The project modules `module` imports: at module level (including under `if`/`try`),
    or anywhere (functions too) when not `module_level_only`."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    is_package = path.endswith("__init__.py")
    if module_level_only:
        nodes = [
            n
            for top in tree.body
            for n in (ast.walk(top) if isinstance(top, (ast.If, ast.Try)) else [top])
        ]
    else:
        nodes = list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.add(full if full in known else base)
    resolved = set()
    for name in names:  # `import a.b.c` depends on the deepest project module it names
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            resolved.add(name)
    return resolved


def _graph(module_level_only: bool = True) -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imported(m, p, set(modules), module_level_only) for m, p in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_relative_and_package_imports():
    graph = _graph()
    assert "t5x_like.errors" in graph["t5x_like.config"]
    assert "t5x_like.host_runtime" in graph["t5x_like"]  # `from t5x_like import host_runtime`


def test_module_level_imports_form_no_cycle():
    assert find_cycle(_graph()) is None


def test_errors_and_config_are_leaves():
    graph = _graph(module_level_only=False)
    assert graph["t5x_like.errors"] == set()
    # `t5x_like` itself is the package's __init__, which every submodule import runs anyway.
    assert graph["t5x_like.config"] - {"t5x_like"} == {"t5x_like.errors"}


def _is_tasks(module: str) -> bool:
    return module == TASKS or module.startswith(TASKS + ".")


def _is_library(module: str) -> bool:
    return module.startswith("t5x_like") and not _is_tasks(module)


def test_the_library_never_imports_tasks():
    graph = _graph(module_level_only=False)
    offenders = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if _is_library(m) and m != "t5x_like.gin_setup"
        for d in deps
        if _is_tasks(d)
    )
    assert offenders == []


def test_nothing_imports_tasks_by_its_top_level_name():
    """In a checkout `import tasks` would still work (the working directory is on sys.path)
    and register every task a second time beside `t5x_like.tasks`; an installed wheel has no
    `tasks` at all. Tests included: one import name per process."""
    offenders = []
    paths = list(_modules().values()) + [
        os.path.join(ROOT, "tests", name)
        for name in os.listdir(os.path.join(ROOT, "tests"))
        if name.endswith(".py")
    ]
    for path in paths:
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            offenders += [
                f"{os.path.relpath(path, ROOT)}: {n}" for n in names if n.split(".")[0] == "tasks"
            ]
    assert offenders == []


def test_the_library_never_imports_the_benchmarks():
    """`benchmarks/` runs from a checkout and is not installed: the library cannot need it."""
    graph = _graph(module_level_only=False)
    offenders = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if m.startswith("t5x_like")
        for d in deps
        if d.split(".")[0] == "benchmarks"
    )
    assert offenders == []


def test_only_entry_points_import_gin_setup():
    graph = _graph(module_level_only=False)
    importers = {m for m, deps in graph.items() if _is_library(m) and "t5x_like.gin_setup" in deps}
    assert importers <= ENTRY_POINTS, importers - ENTRY_POINTS


FAMILIES = "t5x_like.families"


def _is_family(module: str) -> bool:
    return module == FAMILIES or module.startswith(FAMILIES + ".")


def family_imports_of_the_core(graph: dict[str, set[str]]) -> list[str]:
    """`core module -> family module` for every import of a family by the core."""
    return sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if _is_library(m) and not _is_family(m) and m != "t5x_like.gin_setup"
        for d in deps
        if _is_family(d)
    )


def test_the_core_imports_no_family():
    assert family_imports_of_the_core(_graph(module_level_only=False)) == []


def test_a_family_import_of_the_core_is_found():
    graph = {
        "t5x_like.trainer": {"t5x_like.families.t5.model"},
        "t5x_like.gin_setup": {"t5x_like.families.t5.network"},
        "t5x_like.families.bert.model": {"t5x_like.models.base"},
    }
    assert family_imports_of_the_core(graph) == ["t5x_like.trainer -> t5x_like.families.t5.model"]


def test_every_family_is_a_package_of_its_own():
    packages = {m.split(".")[2] for m in _modules() if _is_family(m) and m != FAMILIES}
    assert packages == {"t5", "bert", "gpt"}


def test_no_family_imports_an_entry_point():
    graph = _graph(module_level_only=False)
    offenders = sorted(
        f"{m} -> {d}" for m, deps in graph.items() if _is_family(m) for d in deps & ENTRY_POINTS
    )
    assert offenders == []
