"""The import graph of `router`, `policies` and `classifier`: no circle, and dependencies
that point one way (`policies` and `classifier` never reach aiohttp, yaml or `router`).

Read from the source with `ast`, without importing anything: every `import` counts, at
module level, inside functions and under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("router", "policies", "classifier")
FORBIDDEN = {"policies": ("aiohttp", "yaml", "router"), "classifier": ("aiohttp", "yaml", "router")}


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    internal: set[str] = field(default_factory=set)  # modules of PACKAGES it imports
    external: set[str] = field(default_factory=set)  # top-level names of everything else


def _modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join(parts)
            found[name] = Module(name, path, is_package)
    return found


def _imported(module: Module, modules: dict[str, Module]) -> Iterator[str]:
    """Every dotted name `module` imports (absolute), in whatever scope."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                # `from package import submodule` imports the submodule itself
                candidate = f"{source}.{alias.name}"
                yield candidate if candidate in modules else source


def _resolve(name: str, modules: dict[str, Module]) -> str | None:
    """The module of PACKAGES that `name` is, or is inside of (`a.b.C` -> `a.b`)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _ancestors(name: str) -> Iterator[str]:
    parts = name.split(".")[:-1]
    while parts:
        yield ".".join(parts)
        parts.pop()


def import_graph() -> dict[str, Module]:
    modules = _modules()
    for module in modules.values():
        for name in _imported(module, modules):
            target = _resolve(name, modules)
            if target is None:
                module.external.add(name.split(".")[0])
                continue
            if target != module.name:
                module.internal.add(target)
            # Importing a.b.c runs a/__init__ and a/b/__init__ first, unless the importer
            # lives inside that package (then the package is already being imported).
            for parent in _ancestors(target):
                inside = module.name == parent or module.name.startswith(parent + ".")
                if parent in modules and not inside:
                    module.internal.add(parent)
    return modules


def cycles(modules: dict[str, Module]) -> list[tuple[list[str], list[str]]]:
    """Per strongly connected component of more than one module (Tarjan): one circle
    through it, and the component's other members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in sorted(modules[name].internal):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                components.append(component)

    for name in sorted(modules):
        if name not in index:
            visit(name)
    found: list[tuple[list[str], list[str]]] = []
    for component in components:
        circle = _circle(sorted(component), modules)
        found.append((circle, sorted(set(component) - set(circle))))
    return found


def _circle(component: list[str], modules: dict[str, Module]) -> list[str]:
    """A path start -> ... -> start within one component, for the failure message."""
    members = set(component)
    start = component[0]
    paths: dict[str, list[str]] = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest circle through `start`
        following: list[str] = []
        for name in frontier:
            for target in sorted(modules[name].internal & members):
                if target == start:
                    return [*paths[name], start]
                if target not in paths:
                    paths[target] = [*paths[name], target]
                    following.append(target)
        frontier = following
    return component


def reachable(modules: dict[str, Module], start: str) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for target in modules[todo.pop()].internal:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_walk_sees_every_kind_of_import() -> None:
    modules = import_graph()
    assert {"router.cli", "policies.slots", "policies.slots.base", "classifier"} <= set(modules)
    # an import inside a function (cli starts the gateway lazily)
    assert "router.app" in modules["router.cli"].internal
    # a package import runs the package's __init__ for an importer outside it
    assert "policies.slots" in modules["router.dispatch"].internal
    assert "aiohttp" in modules["router.app"].external


def test_no_import_circle() -> None:
    found = cycles(import_graph())
    lines = [" -> ".join(circle) + (f"  (also caught: {', '.join(others)})" if others else "")
             for circle, others in found]
    assert not found, "import circles:\n" + "\n".join(lines)


def test_policies_and_classifier_reach_neither_http_nor_yaml_nor_router() -> None:
    modules = import_graph()
    problems: list[str] = []
    for name in sorted(modules):
        top = name.split(".")[0]
        if top not in FORBIDDEN:
            continue
        for dependency in sorted(reachable(modules, name)):
            if dependency.split(".")[0] in FORBIDDEN[top]:
                problems.append(f"{name} reaches {dependency}")
            for external in sorted(modules[dependency].external & set(FORBIDDEN[top])):
                problems.append(f"{name} reaches {external} (through {dependency})")
    assert not problems, "\n".join(problems)
