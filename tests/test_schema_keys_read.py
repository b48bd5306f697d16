"""Every key the bot schema takes is read by the loader (issue 39): a key the schema calls valid
and the loader drops (as `model: {mcp: ...}` was) tells an author their bot does something it
does not.

The proof walks the schema (both formats' files): for each property it writes a bot holding that
key with a value made from its schema, and the same bot without it, loads both with the real
loader and compares the configs: the key must change something."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from chatrun.definition.config import Location
from chatrun.definition.loader import BOT_SCHEMA, FORMAT2_SCHEMA, check_bot
from chatrun.definition.schemas import load_schema

# Keys that change nothing in the config by design, each with why.
NOT_CONFIG = {
    ("$schema",): "for editors (yaml-language-server): the schema a file is checked against",
    ("include",): "the loader reads it to find the files whose routes and tools it merges (a file per sample is none)",
    ("routes", "*", "description"): "read from the data by the graph and docs (chatrun graph), not a config field",
    ("tools", "*", "description"): "read from the data into the model's tool list (checked by the tools tests)",
    # An `openapi:` operation becomes an `http:` call when the loader reads its document, which a
    # sample has not got: tests/test_openapi_tools.py loads real documents with each of these keys.
    **{("tools", "*", "openapi", *key): "needs an OpenAPI document on disk" for key in (
        ("spec",), ("operation",), ("base_url",), ("headers",), ("idempotency_key", "header"))},
}

PLACEHOLDER = {"routes": "r", "tools": "t"}


def _resolve(node: Any, defs: dict) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _objects(node: Any, defs: dict) -> list[dict]:
    """The object shapes a schema node allows (its oneOf/anyOf alternatives that have properties)."""
    node = _resolve(node, defs)
    if not isinstance(node, dict):
        return []
    shapes = [node] if "properties" in node else []
    for alternative in node.get("oneOf", []) + node.get("anyOf", []):
        shapes += _objects(alternative, defs)
    return shapes


def walk(node: Any, defs: dict, path: tuple = ()) -> list[tuple[tuple, dict, list[dict]]]:
    """(data path, the property's schema, the shapes of the objects along the path) for every property."""
    out: list[tuple[tuple, dict, list[dict]]] = []
    if len(path) > 12:
        return out
    node = _resolve(node, defs)
    for shape in _objects(node, defs):
        for name, prop in shape["properties"].items():
            out.append(((*path, name), prop, [shape]))
            out += [(p, s, [shape, *along]) for p, s, along in walk(prop, defs, (*path, name))]
    if isinstance(node, dict):
        extra = _resolve(node.get("additionalProperties"), defs)
        if isinstance(extra, dict) and (_objects(extra, defs) or extra.get("type") == "array"):
            key = PLACEHOLDER.get(path[-1] if path else "", "k1")
            out += [(p, s, [{}, *along]) for p, s, along in walk(extra, defs, (*path, key))]
        items = _resolve(node.get("items"), defs)
        if isinstance(items, dict):
            out += [(p, s, [{}, *along]) for p, s, along in walk(items, defs, (*path, 0))]
    return out


def sample(schema: Any, defs: dict) -> Any:
    """A value the schema takes that differs from the usual default."""
    schema = _resolve(schema, defs)
    if not isinstance(schema, dict) or not schema:
        return "xyz"
    if schema.get("examples"):
        return copy.deepcopy(schema["examples"][-1])
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][-1]
    alternatives = schema.get("oneOf") or schema.get("anyOf")
    if alternatives:
        return sample(alternatives[-1], defs)
    kind = schema.get("type")
    kind = [k for k in kind if k != "null"][0] if isinstance(kind, list) else kind
    if kind == "boolean":
        return True
    if kind == "integer":
        return min(max(schema.get("minimum", 0), 5), schema.get("maximum", 99))
    if kind == "number":
        return min(max(schema.get("minimum", 0), 1.5), schema.get("maximum", 99))
    if kind == "array":
        return [sample(schema.get("items"), defs)]
    if "properties" in schema:
        return {key: sample(schema["properties"][key], defs) for key in schema.get("required", [])}
    if kind == "object":
        return {"k1": sample(schema.get("additionalProperties"), defs)}
    pattern = schema.get("pattern", "")
    if pattern.startswith("^(state|scope|turn)"):
        return "state.k1"
    if "[smhd]" in pattern:
        return "5m"
    if ":" in pattern:
        return "handlers:run"
    return "k1"


def candidates(schema: Any, defs: dict) -> list[Any]:
    """Values to try for a key: its examples, its choices, and one made from its type."""
    schema = _resolve(schema, defs)
    found = [*schema.get("examples", []), *schema.get("enum", [])] if isinstance(schema, dict) else []
    for alternative in (schema.get("oneOf") or schema.get("anyOf") or []) if isinstance(schema, dict) else []:
        found += candidates(alternative, defs)
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "boolean" or (isinstance(kind, list) and "boolean" in kind):
        found += [True, False]
    plain = {k: v for k, v in schema.items() if k != "examples"} if isinstance(schema, dict) else schema
    return [*found, sample(plain, defs)]


def _set(data: dict, path: tuple, value: Any, shapes: list[dict], defs: dict) -> None:
    """Put `value` at `path`, making each object on the way with its required keys."""
    node: Any = data
    for i, step in enumerate(path[:-1]):
        fresh: Any = [] if isinstance(path[i + 1], int) else {}
        if isinstance(node, list):
            while len(node) <= step:
                node.append(fresh)
            child = node[step]
        else:
            child = node.setdefault(step, fresh)
        inner = shapes[i + 1]
        for key in inner.get("required", []):
            if isinstance(child, dict) and key not in child and key != path[i + 1]:
                child[key] = _required_sample(inner["properties"][key], defs, path[-1])
        node = child
    if isinstance(node, list):
        node.append(value)
    else:
        node[path[-1]] = value


# A memory's `type` decides which of its keys apply: the one each key needs.
MEMORY_TYPE = {"max_messages": "message_window", "max_tokens": "token_window", "encoding": "token_window",
               "keep_messages": "summary", "summary_model": "summary", "summary_prompt": "summary",
               "clear_tool_results": "message_window"}


def _required_sample(schema: Any, defs: dict, leaf: Any) -> Any:
    value = sample(schema, defs)
    return MEMORY_TYPE.get(leaf, value) if value in MEMORY_TYPE.values() else value


def normal(value: Any) -> Any:
    """A config as plain data, without places (they move when a line is added)."""
    if isinstance(value, Location):
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: normal(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in ("where", "content_version", "path", "root", "places") and not f.name.startswith("_")}
    if isinstance(value, dict):
        return {str(k): normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normal(v) for v in value]
    return value if value is None or isinstance(value, str | int | float | bool) else repr(value)


def _config(tmp: Path, name: str, data: dict) -> Any:
    file = tmp / f"{name}.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    config, _ = check_bot(file)
    assert config is not None, name
    return normal(config)


def _cases(schema_file: str, fmt: int) -> list[tuple[str, tuple, dict, list[dict]]]:
    schema = load_schema(schema_file)
    defs = schema["$defs"]
    seen: dict[tuple, tuple] = {}
    for path, prop, shapes in walk(schema, defs):
        if path[:1] == ("format",) or any(p == ("*",) for p in path):
            continue
        seen.setdefault(path, (prop, shapes))
    return [(schema_file, path, prop, shapes) for path, (prop, shapes) in seen.items()]


def _generic(path: tuple) -> tuple:
    return tuple("*" if i == 1 and path[0] in PLACEHOLDER else p for i, p in enumerate(path))


@pytest.mark.parametrize("schema_file, fmt", [(BOT_SCHEMA, 3), (FORMAT2_SCHEMA, 2)])
def test_every_key_the_schema_takes_changes_what_the_loader_builds(tmp_path, schema_file, fmt):
    defs = load_schema(schema_file)["$defs"]
    base = {"name": "b", "format": fmt, "routes": {"r": {"default": True, "system": "S"}}, "tools": {"t": {}}}
    dropped = []
    for _, path, prop, shapes in _cases(schema_file, fmt):
        if _generic(path) in NOT_CONFIG or _objects(prop, defs) or isinstance(path[-1], int):
            continue  # a section: its keys are the proof
        without = copy.deepcopy(base)
        _set(without, path, None, shapes, defs)
        _drop(without, path)
        absent = _config(tmp_path, "without", without)
        for value in candidates(prop, defs):  # one of them may be the default: any that changes the config
            with_key = copy.deepcopy(base)
            _set(with_key, path, value, shapes, defs)
            if _config(tmp_path, "with", with_key) != absent:
                break
        else:
            dropped.append(".".join(map(str, path)))
    assert dropped == [], "\n".join(dropped)


def _drop(data: Any, path: tuple) -> None:
    node = data
    for step in path[:-1]:
        node = node[step]
    if isinstance(node, list):
        node.pop()
    else:
        node.pop(path[-1], None)
