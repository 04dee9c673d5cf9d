"""Rules of the house that no single feature test would notice: test modules share helpers
through tests/support.py (never by importing one another), and the intents the policies
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


def imported_modules(tree: ast.Module) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def test_no_test_module_imports_another_test_module() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offenders += [f"{path.relative_to(TESTS.parent)}: {module}"
                      for module in imported_modules(tree) if is_test_module(module)]
    assert offenders == [], "put shared helpers in tests/support.py"


def test_the_policies_accept_exactly_the_classifiers_intents() -> None:
    assert list(get_args(Intent)) == list(INTENTS)
    assert set(SIMPLE_INTENTS) == DEFAULT_SIMPLE
    assert set(COMPLEX_INTENTS) == {
        intent for intent, level in INTENT_COMPLEXITY.items() if level == Complexity.COMPLEX}
