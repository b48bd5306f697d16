"""The one rule of the imports (docs/architecture.md): nothing imports upward.

Layers, bottom first: the shared data types; the definition stage; memory, stores and
models; the engine; the public API (`chatrun/__init__.py`, names imported from `chatrun`);
the clients. A module may import its own layer and the layers below.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "runner" / "chatrun"

LAYERS = {
    "errors": 0, "events": 0, "messages": 0, "version": 0,
    "definition": 1,
    "memory": 2, "store": 2, "models": 2, "toolkinds": 2, "knowledge": 2,
    "engine": 3,
    "cli": 5, "server": 5, "transcripts": 5, "report": 5, "pytest_plugin": 5, "testing": 5, "__main__": 5,
}
PUBLIC_API = 4


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "chatrun":
        return None
    if len(parts) == 1 or parts[1] not in LAYERS:
        return PUBLIC_API  # `chatrun` itself, or a name imported from it
    return LAYERS[parts[1]]


def imports_of(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "chatrun" else [f"chatrun.{a.name}" for a in node.names]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def test_every_top_level_module_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())) and p.stem != "__init__"}
    assert names - set(LAYERS) == set()


def test_nothing_imports_upward():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        own = layer_of(module)
        if module == "chatrun":
            continue  # the public API gathers names from every layer (transcripts' included)
        for line, name in imports_of(path):
            target = layer_of(name)
            if target is not None and target > own:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {module} imports {name}")
    assert upward == []


def runtime_imports_of(path: Path, modules: set[str]) -> list[str]:
    """The chatrun modules `path` imports when it runs: at the top or inside a function (a lazy
    import is still a dependency), but not under `if TYPE_CHECKING:` (annotations only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test).endswith("TYPE_CHECKING") for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from chatrun.server import wire` imports the submodule `wire`; `from chatrun.store
            # import open_store` the package itself (module_graph keeps whichever is a module).
            found += [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                      for a in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def module_graph() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports at run time."""
    def name(path: Path) -> str:
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)

    paths = {name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for module, path in paths.items():
        graph[module] = {m for m in runtime_imports_of(path, set(paths)) if m in paths and m != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while component[-1:] != [v]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_inside_a_package():
    """Modules of one package import each other one way (a cycle, even through a lazy import,
    means neither can be read or replaced alone); `if TYPE_CHECKING:` imports do not count."""
    graph = module_graph()
    within = {m: {d for d in deps if d.split(".")[:2] == m.split(".")[:2]} for m, deps in graph.items()}
    assert cycles(within) == []


def test_the_cycle_check_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# -- the wire protocols' shared plumbing (issue 21) ------------------------------------------------

SERVER = PACKAGE / "server"
# Every module of the server (the wire protocols, their plumbing, the session registry's parts)
# and `chatrun serve`: a function a maintainer can read in one screen.
SHORT_FUNCTION_MODULES = [*sorted(SERVER.glob("*.py")), PACKAGE / "cli" / "serve.py"]
MAX_FUNCTION_LINES = 60


def test_no_function_of_the_server_plumbing_is_longer_than_a_screen():
    long = []
    for path in SHORT_FUNCTION_MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.name} has {lines} lines")
    assert long == []


def test_requests_are_authenticated_and_their_bodies_read_in_one_place():
    """chatrun.server.plumbing: authenticate() and read_json_object(); a wire protocol uses them."""
    found = []
    for path in SERVER.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for needle in ("token_from(", "request.body()", "request.stream()"):
            if needle in text and path.name not in ("plumbing.py", "auth.py"):
                found.append(f"{path.name}: {needle}")
    assert found == []
