"""No import cycles among the project's modules (issue 16).

Every module under gateway/ and state/ is parsed with `ast`; ALL its imports count: top
level, inside functions and under `if TYPE_CHECKING:`, so a cycle cannot hide behind a
guard or a late import. A package's `__init__` stands for the package, and importing
`pkg.mod` from outside `pkg` imports `pkg` too (Python runs its `__init__` first).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "state")


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` stands for, or None if it is not ours."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]  # `pkg.mod.attr` names the module `pkg.mod`
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                prefix = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            # `from pkg import mod` imports the module pkg.mod if there is one, else pkg
            names = [f"{prefix}.{alias.name}" for alias in node.names] + [prefix]
            names = [n for n in names[:-1] if n in modules] or [prefix]
        for name in names:
            target = _resolve(name, modules)
            if target is None:
                continue
            # Importing pkg.sub runs pkg/__init__ first: from outside pkg, that is an
            # import of pkg too (a module inside pkg only loads once pkg is loading).
            parts = target.split(".")
            for n in range(1, len(parts) + 1):
                outer = ".".join(parts[:n])
                inside = module == outer or module.startswith(outer + ".")
                if outer in modules and not inside:
                    found.add(outer)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None (depth-first, white/grey/black)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert "gateway.pipeline.intake" in graph and "state.writer" in graph
    assert "gateway.services" in graph["gateway.pipeline.intake"]  # top level
    assert "gateway.agent.openai" in graph["gateway.app"]  # inside a function
    assert "state.store" in graph["state"]  # a package's relative import
    assert "gateway.reset" in graph["gateway.app"]  # through gateway.reset.policy


def test_a_cycle_is_found_even_under_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "gateway"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from gateway.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway import a\n"
    )
    modules = {"gateway": pkg / "__init__.py", "gateway.a": pkg / "a.py", "gateway.b": pkg / "b.py"}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert find_cycle(graph) == ["gateway.a", "gateway.b", "gateway.a"]


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_coordinator_and_the_vocabulary_are_leaves() -> None:
    """Anything may import them (a replicated coordinator swaps in without new edges)."""
    graph = import_graph()
    assert graph["gateway.coordinator"] == set()
    assert graph["gateway.vocab"] == set()
