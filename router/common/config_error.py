"""A config that cannot be used: `ConfigError`, listing every `ConfigProblem` with its key
path and YAML line. `from_env` reads a setting from the environment variable the config
names (a secret) and raises it when that variable is unset; the YAML parser is
`router.config`'s."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigProblem:
    path: str  # "backends.llama-70b.slots", "routes.chat.fallbacks[1]"; "" for the root
    message: str
    line: int | None  # 1-based

    def __str__(self) -> str:
        where = f"{self.line}: " if self.line is not None else ""
        return f"{where}{self.path}: {self.message}" if self.path else f"{where}{self.message}"


class ConfigError(Exception):
    """A config that cannot be used; `problems` lists every reason, in file order."""

    def __init__(self, problems: list[ConfigProblem], source: str = "<string>") -> None:
        self.problems = problems
        self.source = source
        # "FILE:LINE: path: message", the shape compilers use, so editors can jump to it.
        lines = (f"{source}:{p}" if p.line else f"{source}: {p}" for p in problems)
        super().__init__("\n".join(lines))


def from_env(value: str | None, env: str | None, key: str) -> str | None:
    """A setting given in the file (`value`) or in the environment variable it names
    (`env`, for secrets such as a DSN with a password); None when neither is set."""
    if env is None:
        return value
    found = os.environ.get(env)
    if not found:
        raise ConfigError([ConfigProblem(key, f"environment variable {env} is not set", None)],
                          "environment")
    return found
