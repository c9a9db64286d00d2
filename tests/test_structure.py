"""The package imports without cycles, between files and between folders, and the engine
reaches the ranks only through the step message (`parashift/step/`) and the executors.

Which imports count: every import that runs, at module level and inside functions alike. A
function's import runs later, but the file still needs the other one to work, so a cycle
closed by a lazy import is still two files (or folders) that cannot be understood, tested or
moved one without the other; laziness only hides it from the interpreter. Imports under
`if TYPE_CHECKING:` do not count: they never run and name a type only (one today:
`kv/block_manager.py` annotates with the engine's `Sequence`).

A folder is a subpackage of `parashift/` (engine, worker, step, parallel, deterministic...); a
module directly in `parashift/` is a unit of its own, and so is the package's front,
`parashift/__init__.py`. Importing `parashift.a.b` counts as an edge to `parashift.a.b` only,
not to the packages above it that Python initialises on the way."""
import ast
import functools
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "parashift"

def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def folder_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "parashift/__init__"


def _imported_names(tree: ast.Module, module: str, is_package: bool):
    """(dotted name, line) of every import that runs (not under `if TYPE_CHECKING:`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package up
                package = module.split(".")[:len(module.split(".")) - node.level + is_package]
                base = ".".join(package + [base] if base else package)
            for alias in node.names:  # `from a import b` imports the module a.b where it is one
                yield f"{base}.{alias.name}", node.lineno


def _module_of(name: str) -> str | None:
    """The package's module that importing `name` runs (a.b.C -> a.b), or None outside it."""
    while name not in MODULES:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


@functools.cache
def module_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in MODULES.items():
        imports = graph.setdefault(module, {})
        for name, line in _imported_names(ast.parse(path.read_text()), module,
                                          path.name == "__init__.py"):
            target = _module_of(name)
            if target is not None and target != module:
                imports.setdefault(target, line)
    return graph


def folder_graph() -> dict[str, dict[str, str]]:
    """folder -> {folder it imports: one import that makes the edge, 'file:line -> module'}."""
    graph: dict[str, dict[str, str]] = {}
    for module, imports in module_graph().items():
        edges = graph.setdefault(folder_of(module), {})
        for target, line in imports.items():
            if folder_of(target) != folder_of(module):
                edges.setdefault(folder_of(target), f"{MODULES[module].relative_to(PACKAGE)}:"
                                                    f"{line} -> {target}")
    return graph


def cycles(graph: dict[str, dict]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one node, as the nodes
    in import order, the first repeated at the end."""
    found, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        path = _path_back(graph, start)
        if path:
            found.append(path)
            done.update(path)
    return found


def _path_back(graph: dict[str, dict], start: str) -> list[str] | None:
    """The shortest import path from start back to itself, by breadth first."""
    came_from, todo = {}, [start]
    while todo:
        node = todo.pop(0)
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if nxt not in came_from:
                came_from[nxt] = node
                todo.append(nxt)
    return None


def _described(graph: dict[str, dict], cycle: list[str]) -> str:
    return "\n  ".join(f"{a} -> {b}: {graph[a][b]}" for a, b in zip(cycle, cycle[1:]))


def test_no_import_cycles_between_files():
    graph = module_graph()
    found = cycles(graph)
    assert not found, "import cycles between files:\n  " + "\n  ".join(
        " -> ".join(cycle) for cycle in found)


def test_no_import_cycles_between_folders():
    graph = folder_graph()
    found = cycles(graph)
    assert not found, "import cycles between folders:\n" + "\n".join(
        "  " + _described(graph, cycle) for cycle in found)


def test_the_engine_imports_nothing_from_the_workers():
    graph = module_graph()
    imports = {(module, target) for module, targets in graph.items() for target in targets
               if folder_of(module) == "engine" and folder_of(target) == "worker"}
    # engine/ reaches a rank only through executor/ and the step message (step/)
    assert not imports, f"engine/ imports worker/: {sorted(imports)}"


def test_the_graph_sees_imports():
    graph = module_graph()
    assert "parashift.step.message" in graph["parashift.engine.replica"]
    # an import inside a function counts (matmul takes the Triton kernels only on CUDA)
    assert "parashift.deterministic.triton_matmul" in graph["parashift.deterministic.matmul"]
    # a type-only one does not
    assert "parashift.engine.sequence" not in graph["parashift.kv.block_manager"]
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) \
        == [["a", "b", "c", "a"]]
    folders = folder_graph()
    assert "step" in folders["worker"] and "worker" not in folders["step"]
