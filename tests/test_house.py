"""Rules of the house that no single feature test would notice: test modules share helpers
through tests/support/ (never by importing one another), and the intents the policies
accept are exactly the classifier's labels."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from classifier.labels import DEFAULT_SIMPLE, INTENT_COMPLEXITY, INTENTS, Complexity
from policies.config import COMPLEX_INTENTS, SIMPLE_INTENTS, Intent

TESTS = Path(__file__).parent


def is_test_module(module: str) -> bool:
    return module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")


def imported_modules(tree: ast.Module, package: str) -> list[str]:
    """Every module `tree` imports, relative imports resolved against `package`."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # from . import x, from ..y import z
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found.append(module)
            found += [f"{module}.{alias.name}" for alias in node.names]
    return found


def test_no_test_module_imports_another_test_module() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = ".".join(path.relative_to(TESTS.parent).parent.parts)
        offenders += [f"{path.relative_to(TESTS.parent)}: {module}"
                      for module in imported_modules(tree, package) if is_test_module(module)]
    assert offenders == [], "put shared helpers in tests/support/"


def test_the_import_check_sees_plain_and_relative_imports() -> None:
    tree = ast.parse("import tests.test_a\nfrom tests.test_b import x\nfrom .test_c import y\n"
                     "from . import test_d\nfrom tests.support import MESSAGES\n")
    found = [m for m in imported_modules(tree, "tests.hostile") if is_test_module(m)]
    assert found == ["tests.test_a", "tests.test_b", "tests.hostile.test_c", "tests.hostile.test_d"]


def test_the_policies_accept_exactly_the_classifiers_intents() -> None:
    assert list(get_args(Intent)) == list(INTENTS)
    assert set(SIMPLE_INTENTS) == DEFAULT_SIMPLE
    assert set(COMPLEX_INTENTS) == {
        intent for intent, level in INTENT_COMPLEXITY.items() if level == Complexity.COMPLEX}
