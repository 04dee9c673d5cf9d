"""The router's layout: its wings (router/request/, router/apis/, ... router/common/) sit
beside or below the spine (the top-level router/*.py modules), and import it only where
listed here with the reason. A new upward import fails with its name; a leaf that every wing
needs belongs in router/common/, which imports nothing else of router. `policies` imports
nothing of router at all.

Read from the source with `ast`, without importing anything: an import counts in any scope
(module level or inside a function). One made only under `if TYPE_CHECKING:` is TYPE_ONLY:
a name for an annotation, never run. Pairs are (wing module, spine module).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUTER = ROOT / "router"

# The spine's entry points the handlers and commands of a wing need at run time.
RUNTIME = {
    # A translated request is validated by the one OpenAI parser (parse_request).
    ("router.apis.anthropic", "router.openai_api"),
    ("router.apis.dialect", "router.openai_api"),
    ("router.apis.responses", "router.openai_api"),
    ("router.batch.check", "router.openai_api"),  # a batch line, as the live endpoint checks
    # Handlers find the Gateway under its app key (GATEWAY is typed by the Gateway itself).
    ("router.apis.anthropic_endpoints", "router.gateway"),
    ("router.apis.responses_socket", "router.gateway"),
    ("router.batch.endpoint", "router.gateway"),
    ("router.console.admin", "router.gateway"),
    ("router.console.pages", "router.gateway"),
    ("router.server.no_route", "router.gateway"),
    ("router.server.runner", "router.gateway"),
    # The admin API's reload is the spine's reload of the config file.
    ("router.console.admin", "router.reload"),
    # Commands beside serving read the config file and start a whole gateway.
    ("router.report.cli", "router.config"),
    ("router.tools.demo", "router.app"),
    ("router.tools.demo", "router.config"),
    ("router.tools.demo_batch", "router.app"),
    ("router.tools.evaluate", "router.app"),
    ("router.tools.evaluate", "router.config"),
    ("router.tools.loadtest", "router.app"),
    ("router.tools.loadtest", "router.config"),
    ("router.tools.workers", "router.app"),
}

# Steps of one request's exchange that dispatch calls with its Exchange or a Backend: the
# types name their parameters and nothing more.
TYPE_ONLY = {
    # The Files and Batches handlers are given the Gateway by router.batch.endpoint.
    ("router.batch.batches_api", "router.gateway"),
    ("router.batch.files_api", "router.gateway"),
    ("router.batch.message_batches_api", "router.gateway"),
    # A replica's drain is given the Gateway by the admin handler, and finds the Backend.
    ("router.fleet.drain", "router.backend"),
    ("router.fleet.drain", "router.gateway"),
    # A drain on one gateway, and the fleet's through Redis, change the Backend they find.
    ("router.fleet.replicas", "router.backend"),
    ("router.fleet.shared_drains", "router.backend"),
    # Discovery changes the Backends of its groups.
    ("router.fleet.groups", "router.backend"),
    ("router.request.objective", "router.backend"),
    ("router.request.options", "router.backend"),
    ("router.request.options", "router.exchange"),
    ("router.request.quota", "router.exchange"),
}


def _modules(top: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(top.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an `if TYPE_CHECKING:` (its body, not its else)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else (
                test.attr if isinstance(test, ast.Attribute) else None)
            if name == "TYPE_CHECKING":
                inside.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return inside


def imports(name: str, path: Path) -> Iterator[tuple[str, int, bool]]:
    """Each dotted name `name` imports: (absolute name, line, only for type checking)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    typing_only = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            # `from package import module` names the module itself
            names = [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for imported in names:
            yield imported, node.lineno, id(node) in typing_only


def _within(name: str, modules: dict[str, Path]) -> str | None:
    """The module of `modules` that `name` is, or is inside of (`a.b.C` -> `a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _spine(modules: dict[str, Path]) -> set[str]:
    return {name for name, path in modules.items()
            if path.parent == ROUTER and path.name != "__init__.py"}


def upward() -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:
    """Every wing -> spine pair, with where it is first imported: (run time, type only).
    A pair imported at run time anywhere is a run-time one."""
    modules = _modules(ROUTER)
    spine = _spine(modules)
    runtime: dict[tuple[str, str], str] = {}
    typing: dict[tuple[str, str], str] = {}
    for name, path in sorted(modules.items()):
        if name in spine or name == "router":
            continue
        for imported, line, typing_only in imports(name, path):
            target = _within(imported, modules)
            if target not in spine:
                continue
            where = f"{path.relative_to(ROOT)}:{line}"
            (typing if typing_only else runtime).setdefault((name, target), where)
    return runtime, {pair: where for pair, where in typing.items() if pair not in runtime}


def _differences(kind: str, found: dict[tuple[str, str], str],
                 allowed: set[tuple[str, str]]) -> list[str]:
    new = [f"  {wing} -> {spine}  ({found[wing, spine]})"
           for wing, spine in sorted(set(found) - allowed)]
    gone = [f"  {wing} -> {spine}" for wing, spine in sorted(allowed - set(found))]
    lines = []
    if new:
        lines += [f"{kind} imports from a wing up to the spine, not allowed:", *new,
                  "  move what is imported below the spine (router/common/), or list the "
                  f"pair in {kind} with the reason it stays"]
    if gone:
        lines += [f"{kind} lists pairs not found among the imports (remove them):", *gone]
    return lines


def test_the_walk_finds_each_kind_of_upward_import() -> None:
    runtime, typing = upward()
    # inside a function (each worker starts its gateway lazily)
    assert ("router.tools.workers", "router.app") in runtime
    # under `if TYPE_CHECKING:` only
    assert ("router.request.quota", "router.exchange") in typing
    # no spine module counts as a wing
    assert not {wing for wing, _ in runtime | typing} & _spine(_modules(ROUTER))


def test_wings_import_the_spine_only_where_listed() -> None:
    runtime, typing = upward()
    problems = (_differences("RUNTIME", runtime, RUNTIME)
                + _differences("TYPE_ONLY", typing, TYPE_ONLY))
    assert not problems, "\n".join(problems)


def test_common_imports_nothing_else_of_router() -> None:
    modules = _modules(ROUTER)
    problems = [f"{name} imports {imported} ({path.relative_to(ROOT)}:{line})"
                for name, path in sorted(modules.items()) if name.startswith("router.common")
                for imported, line, _ in imports(name, path)
                if imported.startswith("router.") and not imported.startswith("router.common")]
    assert not problems, "router/common/ is below the spine and the wings:\n" + "\n".join(
        problems)


def test_policies_import_nothing_of_router() -> None:
    problems = [f"{name} imports {imported} ({path.relative_to(ROOT)}:{line})"
                for name, path in sorted(_modules(ROOT / "policies").items())
                for imported, line, _ in imports(name, path)
                if imported == "router" or imported.startswith("router.")]
    assert not problems, "\n".join(problems)
