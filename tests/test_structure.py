"""The package's folders import each other without cycles (type-only imports aside)."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "parashift"


def _unit(path: pathlib.Path) -> str:
    """A folder of the package, or a top-level module."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _runtime_imports(tree: ast.AST):
    """Modules imported outside `if TYPE_CHECKING:` blocks."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        src = _unit(path)
        for module in _runtime_imports(ast.parse(path.read_text())):
            parts = module.split(".")
            if parts[0] == "parashift" and len(parts) > 1 and parts[1] != src:
                graph.setdefault(src, set()).add(parts[1])
    return graph


def test_no_import_cycles_between_folders():
    graph = import_graph()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps
                     if reaches(b, a)})
    assert cycles == []


def test_the_graph_sees_imports():
    graph = import_graph()
    assert "worker" in graph["engine"] and "engine" not in graph.get("worker", set())
