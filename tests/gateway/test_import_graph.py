"""No import cycles among the project's modules.

Every module under gateway/ and state/ is parsed with `ast`; ALL its imports count: top
level, inside functions and under `if TYPE_CHECKING:`, so a cycle cannot hide behind a
guard or a late import. A package's `__init__` stands for the package, and importing
`pkg.mod` from outside `pkg` imports `pkg` too (Python runs its `__init__` first).
"""

from __future__ import annotations

import ast
import re
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
    assert "gateway.pipeline.intake" in graph and "state.sqlite.writer" in graph
    assert "gateway.services" in graph["gateway.pipeline.intake"]  # top level
    assert "gateway.agent.openai" in graph["gateway.wiring"]  # inside a function
    assert "state.sqlite.store" in graph["state"]  # a package's relative import
    assert "gateway.reset" in graph["gateway.wiring"]  # through gateway.reset.policy


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
    assert graph["gateway.topology.coordinator"] == set()
    assert graph["gateway.vocab"] == set()


# The layers of gateway/, top to bottom, and what each may import besides itself. A module
# belongs to the entry naming it or its nearest package; `core` holds the leaves anything
# may use. The app serves the dashboard, so web/ sits under it (web reads the config, the
# adapters' sections and core only). Adapters sit beside the pipeline's chain: the pipeline
# and the app use them (the registry), they use only their kit and core.
LAYERS: dict[str, tuple[str, ...]] = {
    "top": ("app", "web", "config", "pipeline", "topology", "agent", "adapters", "kit", "core"),
    "app": ("web", "config", "pipeline", "topology", "agent", "adapters", "kit", "core"),
    "web": ("config", "adapters", "kit", "core"),
    "config": ("adapters", "kit", "core"),
    "pipeline": ("topology", "agent", "adapters", "kit", "core"),
    "topology": ("core",),
    "agent": ("core",),
    "adapters": ("kit", "core"),
    "kit": ("core",),
    "core": (),
}
LAYER_OF: dict[str, str] = {
    "gateway": "core",
    "gateway.__main__": "top",
    "gateway.cli": "top",
    "gateway.ops": "top",
    "gateway.web": "web",
    "gateway.app": "app",
    "gateway.run": "app",
    "gateway.health": "app",
    "gateway.wiring": "app",
    "gateway.home": "app",
    "gateway.ops.envfile": "app",  # the daemon's helpers among the operator's tools
    "gateway.ops.heap": "app",
    "gateway.ops.notify": "app",
    "gateway.ops.send": "app",
    "gateway.config": "config",
    "gateway.pipeline": "pipeline",
    "gateway.turns": "pipeline",
    "gateway.services": "pipeline",
    "gateway.sessions": "pipeline",
    "gateway.commands": "pipeline",
    "gateway.session_commands": "pipeline",
    "gateway.handoff": "pipeline",
    "gateway.reset": "pipeline",
    "gateway.access": "pipeline",
    "gateway.topology": "topology",  # the coordinators, leases and routes among them
    "gateway.index": "topology",
    "gateway.agent": "agent",
    "gateway.adapters": "adapters",
    "gateway.adapters.kit": "kit",
    "gateway.messages": "core",
    "gateway.errors": "core",
    "gateway.vocab": "core",
    "gateway.session_keys": "core",
    "gateway.deadlines": "core",
    "gateway.faults": "core",
    "gateway.timefmt": "core",
    "gateway.wording": "core",
    "gateway.sections": "core",
    "gateway.event_loops": "core",
    "gateway.pairing": "core",
    "gateway.shards": "core",  # the shard ledger adapters ask (no import of its own)
    "gateway.ops.metrics": "core",  # the counters every layer increments
}
# Edges that go upward today, each with its reason; the list only shrinks.
UPWARD_TODAY = {
    # the api adapter answers `switchboard send`'s bad targets with ops.send's error
    ("gateway.adapters.api_send", "gateway.ops.send"),
}


def layer_of(module: str) -> str | None:
    name = module
    while name:
        if name in LAYER_OF:
            return LAYER_OF[name]
        name = name.rpartition(".")[0]
    return None


def _passive(module: str, modules: dict[str, Path]) -> bool:
    """A package whose `__init__` imports nothing of the project: importing one of its
    modules pulls in nothing else through it."""
    path = modules[module]
    return path.name == "__init__.py" and not imports_of(module, path, modules)


def test_every_gateway_module_has_a_layer() -> None:
    unplaced = [m for m in project_modules() if m.startswith("gateway") and layer_of(m) is None]
    assert unplaced == []


def test_no_gateway_module_imports_a_higher_layer() -> None:
    """cli/ops -> app/wiring -> (web ->) config -> ..., app/wiring -> pipeline -> topology
    -> core, and adapters -> kit -> core: nothing imports upward."""
    modules = project_modules()
    upward = []
    for module, targets in import_graph().items():
        here = layer_of(module)
        if here is None or not module.startswith("gateway"):
            continue
        for target in sorted(targets):
            there = layer_of(target)
            if there is None or there == here or there in LAYERS[here]:
                continue
            if _passive(target, modules) or (module, target) in UPWARD_TODAY:
                continue
            upward.append(f"{module} ({here}) -> {target} ({there})")
    assert upward == []


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {"gateway.turns": {"gateway.app"}, "gateway.app": {"gateway.turns"}}
    found = [
        (m, t)
        for m, ts in graph.items()
        for t in ts
        if layer_of(t) != layer_of(m) and layer_of(t) not in LAYERS[layer_of(m) or "core"]
    ]
    assert found == [("gateway.turns", "gateway.app")]


def test_only_the_wiring_chooses_by_backend() -> None:
    """`backend == ...` (or `!=`) appears in gateway/ only in wiring.py: everything else
    asks wiring (`replicated`) or is handed what wiring built."""
    choosing = re.compile(r"\bbackend\s*[!=]=")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "gateway").rglob("*.py"))
        if path != ROOT / "gateway" / "wiring.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if choosing.search(line)
    ]
    assert found == []


# The door into state/ from gateway/: the package itself (Store, ClusterStore, the records,
# errors, states and content rules it exports), and the four modules it is made of that
# hold nothing but interfaces, shapes, errors and state names. Never a backend
# (state.sqlite, state.pg, state.hermes) and never a module of shared rules directly.
STATE_PUBLIC = frozenset({"state", "state.api", "state.records", "state.errors", "state.vocab"})
BACKENDS = ("state.sqlite", "state.pg")


def _state_modules_imported_by(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    return {m for m in imports_of(module, path, modules) if m == "state" or m.startswith("state.")}


def test_gateway_imports_state_only_through_its_public_modules() -> None:
    modules = project_modules()
    wrong = {
        f"{name} imports {target}"
        for name, path in modules.items()
        if name.startswith("gateway")
        for target in _state_modules_imported_by(name, path, modules)
        if target not in STATE_PUBLIC
    }
    assert sorted(wrong) == []


def test_the_public_door_check_sees_a_backend_import(tmp_path: Path) -> None:
    for pkg in ("gateway", "state", "state/pg"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "state" / "pg" / "store.py").write_text("")
    (tmp_path / "gateway" / "app.py").write_text("def f():\n    from state.pg.store import X\n")
    modules = {
        "gateway": tmp_path / "gateway/__init__.py",
        "gateway.app": tmp_path / "gateway/app.py",
        "state": tmp_path / "state/__init__.py",
        "state.pg": tmp_path / "state/pg/__init__.py",
        "state.pg.store": tmp_path / "state/pg/store.py",
    }
    found = _state_modules_imported_by("gateway.app", modules["gateway.app"], modules)
    assert found - STATE_PUBLIC == {"state.pg", "state.pg.store"}


def _folder(module: str) -> str:
    """The folder a module of state/ lives in: `state`, `state.sqlite`, `state.pg`, ..."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else "state"


def _private_names_across_folders(module: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """`from X import _name` where X is a module of state/ in another folder than `module`'s."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    out: list[str] = []
    foreign_modules: dict[str, str] = {}  # local name -> a module of another folder
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            anchor = base[: len(base) - (node.level - 1)]
            source = ".".join([*anchor, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        for alias in node.names:
            whole = f"{source}.{alias.name}"
            if whole in modules and _folder(whole) != _folder(module):
                foreign_modules[alias.asname or alias.name] = whole  # `from ..sqlite import store`
        target = _resolve(source, modules)
        if target is None or not target.startswith("state") or _folder(target) == _folder(module):
            continue
        out += [
            f"{module} imports {target}.{alias.name}"
            for alias in node.names
            if _is_private(alias.name)
        ]
    for node in ast.walk(tree):  # `store._open(...)` on a module imported from another folder
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in foreign_modules
            and _is_private(node.attr)
        ):
            out.append(f"{module} uses {foreign_modules[node.value.id]}.{node.attr}")
    return out


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_of_state_crosses_a_folder() -> None:
    """Neither backend (nor the Hermes layer, nor the shared rules) uses another folder's
    `_private` names: what both backends share is public, in the shared modules."""
    modules = project_modules()
    found = [
        hit
        for name, path in modules.items()
        if name.startswith("state")
        for hit in _private_names_across_folders(name, path, modules)
    ]
    assert found == []


# a test of a `shared` or `_shared` attribute (a session key's `key.shared`, whether
# a group's session is everyone's, is another matter)
SHARED_TEST = re.compile(r"(?<!key)\.shared\b|\b_shared\b")


def test_only_the_wiring_and_the_topology_know_about_replicas() -> None:
    """No module outside wiring.py and gateway/topology/ tests a `shared` attribute: the
    pipeline asks its topology (one daemon or replicas) and never which one it has."""
    allowed = (ROOT / "gateway" / "wiring.py", ROOT / "gateway" / "topology")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "gateway").rglob("*.py"))
        if not any(path == a or a in path.parents for a in allowed)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if SHARED_TEST.search(line)
    ]
    assert found == []


def test_the_replica_check_finds_a_branch_on_shared() -> None:
    lines = ["if self._shared is None:", "if coordinator.shared:", "if key.shared:"]
    assert [bool(SHARED_TEST.search(line)) for line in lines] == [True, True, False]


MAX_MODULE_LINES = 600


def test_no_gateway_module_is_over_600_lines() -> None:
    too_long = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / "gateway").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}


def test_the_private_name_check_sees_one(tmp_path: Path) -> None:
    for pkg in ("state", "state/pg", "state/sqlite"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "state/sqlite/lineage.py").write_text("_MAX = 1\nPUBLIC = 2\n")
    (tmp_path / "state/pg/lineage.py").write_text(
        "from ..sqlite import lineage\nfrom ..sqlite.lineage import PUBLIC, _MAX\nlineage._MAX\n"
    )
    modules = {
        "state": tmp_path / "state/__init__.py",
        "state.sqlite.lineage": tmp_path / "state/sqlite/lineage.py",
        "state.pg.lineage": tmp_path / "state/pg/lineage.py",
    }
    found = _private_names_across_folders("state.pg.lineage", modules["state.pg.lineage"], modules)
    assert found == [
        "state.pg.lineage imports state.sqlite.lineage._MAX",
        "state.pg.lineage uses state.sqlite.lineage._MAX",
    ]


def test_the_sqlite_backend_never_imports_the_postgresql_one() -> None:
    """psycopg is an extra: the default store, and everything it loads, runs without it."""
    modules = project_modules()
    graph = import_graph()
    sqlite_side = [name for name in modules if _folder(name) in ("state.sqlite", "state.hermes")]
    sqlite_side += [name for name in modules if _folder(name) == "state" and name != "state.api"]
    wrong = sorted(
        f"{name} imports {target}"
        for name in sqlite_side
        for target in graph[name]
        if _folder(target) == "state.pg"
    )
    assert wrong == []


MAX_STATE_MODULE_LINES = 600


def test_no_module_in_state_is_over_600_lines() -> None:
    too_long = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / "state").rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_STATE_MODULE_LINES
    }
    assert too_long == {}
