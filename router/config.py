"""The one YAML parser: a config file -> the typed models of `policies.config`.

Every problem is reported at once, each with its dotted key path and YAML line.
Safe loading only; secrets are never read here (the config only names env vars).
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Hashable, Mapping
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from policies.config import (
    CROSS_REFERENCE,
    Config,
    Loc,
    RouteConfig,
    cross_check,
    target_problem,
)
from router.common.config_error import ConfigError, ConfigProblem

DEFAULT_CONFIG_PATH: Path = Path(__file__).resolve().parent.parent / "config.yaml"

# Pydantic speaks Python; a YAML author thinks in lists and mappings.
_FRIENDLIER = {
    "tuple_type": "Input should be a list",
    "list_type": "Input should be a list",
    "dict_type": "Input should be a mapping",
    "model_type": "Input should be a mapping",
}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that records duplicate keys: a silent override is a classic config bug."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[yaml.MappingNode, yaml.Node, yaml.Node]] = []

    def construct_mapping(
        self, node: yaml.MappingNode, deep: bool = False
    ) -> dict[Hashable, typing.Any]:
        # Checked before the merge keys (<<) are flattened in: overriding a merged key is intended.
        seen: dict[Hashable, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base class rejects it with a proper mark
            if key in seen:
                self.duplicates.append((node, seen[key], key_node))
            seen.setdefault(key, key_node)
        return super().construct_mapping(node, deep=deep)


def _format_path(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += part
        else:
            out += f".{part}" if out else part
    return out


def _node_paths(root: yaml.Node | None) -> dict[int, Loc]:
    """The key path of every mapping node, by id, to name where a duplicate key sits."""
    paths: dict[int, Loc] = {}
    stack: list[tuple[yaml.Node | None, Loc]] = [(root, ())]
    seen: set[int] = set()
    while stack:
        node, loc = stack.pop()
        # Aliases share nodes: visiting each once keeps a "billion laughs" file cheap.
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            paths[id(node)] = loc
            stack += [(value, (*loc, str(key.value))) for key, value in node.value]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(item, (*loc, index)) for index, item in enumerate(node.value)]
    return paths


def _line(root: yaml.Node | None, loc: Loc) -> int | None:
    """The line of the deepest node along `loc`; a mapping entry is placed at its key."""
    if root is None:
        return None
    node, line = root, root.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            # The last match, as in the loaded data where a later duplicate wins.
            entries = [(k, v) for k, v in node.value if str(k.value) == str(part)]
            if not entries:
                break
            key_node, node = entries[-1]
            line = key_node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class whose fields live at `loc`, to list the keys allowed there."""
    annotation: object = Config
    parts = list(loc)
    while True:
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            annotation = next((a for a in args if a is not type(None)), None)
        elif typing.get_origin(annotation) is dict and parts:
            parts.pop(0)  # the mapping's own key, e.g. a backend name
            annotation = args[1]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if not parts:
                return annotation
            field = annotation.model_fields.get(str(parts.pop(0)))
            if field is None:
                return None
            annotation = field.annotation
        else:
            return None


def _message(error: ErrorDetails) -> str:
    if error["type"] == "extra_forbidden":
        model = _model_at(error["loc"][:-1])
        allowed = f" (allowed: {', '.join(model.model_fields)})" if model else ""
        return f"unknown key{allowed}"
    return _FRIENDLIER.get(error["type"], error["msg"].removeprefix("Value error, "))


def _raw_checks(data: object, errors: list[ErrorDetails]) -> list[tuple[Loc, str]]:
    """The whole-model checks, re-run on the raw data where validation skipped them.

    Pydantic runs a model's own validator only once all its fields are valid; these
    let one `config check` report, say, an unknown backend next to a bad `slots`.
    """
    if not isinstance(data, Mapping):
        return []
    backends, routes = data.get("backends"), data.get("routes")
    problems: list[tuple[Loc, str]] = []
    judged = {e["loc"] for e in errors}  # an error at a backend's own loc: already checked
    for name, raw in backends.items() if isinstance(backends, Mapping) else ():
        loc: Loc = ("backends", name)
        if isinstance(name, str | int) and isinstance(raw, Mapping) and loc not in judged:
            if problem := target_problem(raw.get("url"), raw.get("simulated"),
                                         raw.get("endpoints")):
                problems.append((loc, problem))
    if any(e["type"] == CROSS_REFERENCE for e in errors):
        return problems
    names = [k for k in backends if isinstance(k, str)] if isinstance(backends, Mapping) else []
    checkable: dict[str, RouteConfig] = {}
    for name, raw in routes.items() if isinstance(routes, Mapping) else ():
        if not (isinstance(raw, Mapping) and isinstance(raw.get("primary"), str)):
            continue
        fallbacks = raw.get("fallbacks")
        if not (isinstance(fallbacks, list) and all(isinstance(f, str) for f in fallbacks)):
            fallbacks = []  # unusable; validation reports it
        # model_construct: a partial view for the cross-check only, never handed out.
        checkable[str(name)] = RouteConfig.model_construct(
            primary=raw["primary"], fallbacks=tuple(fallbacks)
        )
    return [*problems, *cross_check(names, checkable)]


def _validate(
    data: object, root: yaml.Node | None, source: str, found: list[ConfigProblem]
) -> Config:
    """Build the Config, or raise with `found` plus every validation problem."""
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # An unknown key lands on the key's own line; the rest at their key or list item.
        pairs = [(e["loc"], _message(e)) for e in errors] + _raw_checks(data, errors)
        found = found + [ConfigProblem(_format_path(loc), m, _line(root, loc)) for loc, m in pairs]
    if found:
        raise ConfigError(sorted(found, key=lambda p: (p.line or 0, p.path)), source)
    return config


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse and validate YAML text; ConfigError lists every problem found."""
    loader = _StrictLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.context_mark and exc.problem:
            message += f" ({exc.context} at line {exc.context_mark.line + 1})"
        raise ConfigError(
            [ConfigProblem("", f"YAML syntax: {message}", mark.line + 1 if mark else None)], source
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem("", f"YAML syntax: {exc}", None)], source) from exc
    finally:
        loader.dispose()
    paths = _node_paths(root)
    duplicates = [
        ConfigProblem(
            _format_path((*paths.get(id(mapping), ()), str(key.value))),
            f"duplicate key (first at line {first.start_mark.line + 1}; a silent override)",
            key.start_mark.line + 1,
        )
        for mapping, first, key in loader.duplicates
    ]
    return _validate(data, root, source, duplicates)


def load_config(path: str | Path | None = None) -> Config:
    """Load a config file (the embedded default when `path` is None)."""
    path = DEFAULT_CONFIG_PATH if path is None else Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem("", f"cannot read: {exc}", None)], str(path)) from exc
    return parse_config(text, str(path))


def config_from_dict(data: Mapping[str, object]) -> Config:
    """Validate already-loaded data (tests, programmatic use); problems carry no lines."""
    return _validate(dict(data), None, "<dict>", [])


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """`slotgate config check`: its words go to `check_main` as they are."""
    parser.add_argument("words", nargs=argparse.REMAINDER)
    parser.set_defaults(func=lambda args: check_main(args.words))


def check_main(argv: list[str]) -> int:
    """`slotgate config check FILE`: 0 valid, 1 invalid, 2 unreadable or bad usage."""
    if len(argv) != 1:
        print("usage: slotgate config check FILE", file=sys.stderr)
        return 2
    name = argv[0]
    try:
        text = Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{name}: cannot read: {exc}", file=sys.stderr)
        return 2
    try:
        config = parse_config(text, name)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{name}: OK ({len(config.backends)} backends, {len(config.routes)} routes)")
    return 0
