"""Where chatrun's JSON Schemas live, and how they are compiled for speed.

Shared by the bot loader and the transcript loader: `schema_path`/`load_schema` find a
schema (inside the wheel, or the checkout's schemas/), `inline_refs` removes local
`$ref`s (resolving them is most of jsonschema's time; ours never recurse), and
`compile_check` is a yes/no fast path for valid documents.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:  # jsonschema loads only when a document fails compile_check's fast path
    from jsonschema.exceptions import ValidationError

_REPO_SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
# Where `chatrun init` puts a bot's own copies of the schemas, relative to the bot's directory (its
# modelines, and those of transcripts /save writes, point at them).
BOT_SCHEMA_DIR = Path(".chatrun") / "schemas"

def schema_path(name: str) -> Path:
    """The path of a schema file (e.g. "bot.schema.json").

    Installed wheels carry the schemas inside the package (hatch force-include puts
    them in chatrun/schemas); a source checkout keeps them in the repository's schemas/.
    """
    try:
        packaged = resources.files("chatrun") / "schemas" / name
        if packaged.is_file():
            return Path(str(packaged))
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        pass
    return _REPO_SCHEMAS / name


@lru_cache(maxsize=8)
def load_schema(name: str) -> dict[str, Any]:
    return json.loads(schema_path(name).read_text(encoding="utf-8"))


class Violation(Protocol):
    """A jsonschema ValidationError as a validator's `iter_errors` yields it.

    The stubs type `validator`, `validator_value`, `instance` and `schema` as `... | Unset`
    because an error built by hand may lack them; one from a validator always has them.
    `violation()` says so once, instead of a check or a cast at every use."""

    message: str
    validator: str
    validator_value: Any  # the failing keyword's value in the schema
    instance: Any  # the part of the document that failed
    schema: Mapping[str, Any] | bool  # the (sub)schema holding the keyword; `false` fails everything
    path: deque[str | int]
    relative_path: deque[str | int]
    schema_path: deque[str | int]
    context: list[ValidationError]  # for oneOf/anyOf: each alternative's errors

    @property
    def absolute_path(self) -> Sequence[str | int]: ...


def violation(error: ValidationError) -> Violation:
    return cast(Violation, error)


def properties(schema: Mapping[str, Any] | bool) -> Mapping[str, Any]:
    """The `properties` a schema declares ({} for the `true`/`false` schemas)."""
    return schema.get("properties", {}) if isinstance(schema, Mapping) else {}


def inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every local `#/$defs/...` reference replaced by its definition."""
    if isinstance(node, list):
        return [inline_refs(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: inline_refs(v, defs) for k, v in node.items() if k not in ("$ref", "$defs")}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        # Siblings of $ref (description, examples) are annotations: the referenced keywords win.
        out = {**out, **inline_refs(defs[ref.removeprefix("#/$defs/")], defs)}
    return out


# -- a fast path for valid documents --------------------------------------------------
# jsonschema spends ~0.5 ms per route or tool; a big bot has thousands. Most bots are
# valid, so first ask a compiled yes/no check of the same schema (only the keywords our
# schema uses). "Yes" is exact; anything it does not know answers "no", and "no" means:
# run jsonschema for the messages. tests/test_validate.py checks both agree.

_ANNOTATIONS = frozenset({"description", "examples", "title", "$schema", "$id", "$comment", "default",
                          "enumDescriptions", "markdownDescription"})


def _never(_value: Any) -> bool:
    return False


def _always(_value: Any) -> bool:
    return True


_IS_TYPE = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
}


_COUNTS: dict[str, tuple[type, Callable[[Any], int], Callable[[int, int], bool]]] = {
    "minItems": (list, len, lambda n, bound: n >= bound),
    "maxItems": (list, len, lambda n, bound: n <= bound),
    "minLength": (str, len, lambda n, bound: n >= bound),  # code points, as JSON Schema counts
    "maxLength": (str, len, lambda n, bound: n <= bound),
    "minProperties": (dict, len, lambda n, bound: n >= bound),
    "maxProperties": (dict, len, lambda n, bound: n <= bound),
}


def compile_check(schema: Any) -> Callable[[Any], bool]:
    """A function answering "is this value valid under `schema`?" (True only when sure)."""
    if schema is True:
        return _always
    if schema is False or not isinstance(schema, dict):
        return _never
    checks: list[Callable[[Any], bool]] = []
    fused = _object_check(schema)
    done = _FUSED if fused is not None else frozenset()
    if fused is not None:
        checks.append(fused)
    for key, value in schema.items():
        if key in done:
            continue
        check = _keyword(key, value, schema)
        if check is None:
            continue
        checks.append(check)
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    checks_tuple = tuple(checks)

    def every(v: Any) -> bool:  # a plain loop: generators cost more on this hot path
        for check in checks_tuple:
            if not check(v):
                return False
        return True

    return every


_FUSED = frozenset({"type", "properties", "additionalProperties", "required"})


def _object_check(schema: dict) -> Callable[[Any], bool] | None:
    """`type: object` with `properties`, `additionalProperties` (true or false) and `required` as
    one pass over the mapping (the shape of every route, tool and action: most of a bot's nodes),
    instead of four checks each walking it; None for other schemas."""
    extra = schema.get("additionalProperties", True)
    if schema.get("type") != "object" or extra not in (True, False) \
            or not isinstance(schema.get("properties"), dict) or "patternProperties" in schema:
        return None
    props = {k: compile_check(s) for k, s in schema["properties"].items()}
    needed = tuple(schema.get("required", ()))
    closed = extra is False

    def object_check(v: Any) -> bool:
        if not isinstance(v, dict):
            return False
        for k, item in v.items():
            check = props.get(k)
            if check is None:
                if closed:
                    return False
            elif not check(item):
                return False
        for k in needed:
            if k not in v:
                return False
        return True

    return object_check


def _keyword(key: str, value: Any, schema: dict) -> Callable[[Any], bool] | None:  # a dispatch table: long, not complex
    if key in _ANNOTATIONS or key in ("then", "else"):
        return None
    if key == "type":
        tests = [_IS_TYPE[t] for t in (value if isinstance(value, list) else [value])]
        if len(tests) == 1:
            return tests[0]
        return lambda v: any(t(v) for t in tests)
    if key == "properties":
        props = {k: compile_check(s) for k, s in value.items()}

        def properties(v: Any) -> bool:
            if not isinstance(v, dict):
                return True
            for k, item in v.items():
                check = props.get(k)
                if check is not None and not check(item):
                    return False
            return True

        return properties
    if key == "additionalProperties":
        known = set(schema.get("properties", {}))
        if "patternProperties" in schema:
            return _never
        extra = compile_check(value)
        return lambda v: not isinstance(v, dict) or all(extra(v[k]) for k in v.keys() - known)
    if key == "required":
        needed = list(value)
        return lambda v: not isinstance(v, dict) or all(k in v for k in needed)
    if key == "propertyNames":
        names = compile_check(value)
        return lambda v: not isinstance(v, dict) or all(names(k) for k in v)
    if key == "dependentRequired":
        deps = dict(value)
        return lambda v: not isinstance(v, dict) or all(d in v for k, ds in deps.items() if k in v for d in ds)
    if key == "items":
        item = compile_check(value)
        return lambda v: not isinstance(v, list) or all(item(x) for x in v)
    if key == "uniqueItems":
        if not value:
            return None
        return lambda v: not isinstance(v, list) or (all(isinstance(x, str) for x in v) and len(set(v)) == len(v))
    if key in ("minItems", "maxItems"):
        bound = value
        fits = (lambda n: n >= bound) if key == "minItems" else (lambda n: n <= bound)
        return lambda v: not isinstance(v, list) or fits(len(v))
    if key in ("minLength", "maxLength"):
        bound = value
        fits = (lambda n: n >= bound) if key == "minLength" else (lambda n: n <= bound)
        # Astral characters count as one in JSON Schema and in Python: len() agrees.
        return lambda v: not isinstance(v, str) or fits(len(v))
    if key == "pattern":
        search = re.compile(value).search
        return lambda v: not isinstance(v, str) or search(v) is not None
    if key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": lambda a: a >= value, "maximum": lambda a: a <= value,
              "exclusiveMinimum": lambda a: a > value, "exclusiveMaximum": lambda a: a < value}[key]
        is_number = _IS_TYPE["number"]
        return lambda v: not is_number(v) or op(v)
    if key in _COUNTS:
        kind, size, compare = _COUNTS[key]
        return lambda v: not isinstance(v, kind) or compare(size(v), value)
    if key == "enum":
        choices = [(type(c), c) for c in value]  # typed: True is not 1 for JSON Schema
        return lambda v: any(type(v) is t and v == c for t, c in choices)
    if key == "const":
        if not isinstance(value, str):
            return _never
        return lambda v: isinstance(v, str) and v == value
    if key == "oneOf":
        subs = [compile_check(s) for s in value]
        return lambda v: sum(1 for s in subs if s(v)) == 1
    if key == "anyOf":
        subs = [compile_check(s) for s in value]
        return lambda v: any(s(v) for s in subs)
    if key == "allOf":
        subs = [compile_check(s) for s in value]
        return lambda v: all(s(v) for s in subs)
    if key == "if":
        cond = compile_check(value)
        then = compile_check(schema.get("then", True))
        other = compile_check(schema.get("else", True))
        return lambda v: then(v) if cond(v) else other(v)
    return _never  # a keyword this fast path does not know: let jsonschema decide
