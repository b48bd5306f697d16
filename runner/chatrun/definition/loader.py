"""Load a bot's YAML into `BotConfig`, reporting every problem at once.

Steps: read bot.yaml (or the single file) and the files its `include:` globs name,
keeping node positions (chatrun.definition.yamlpos); validate each file against
schemas/bot.schema.json; merge routes and tools (names unique across files);
build the dataclasses; run the checks the schema cannot express (chatrun.definition.checks).
Every problem is a Diagnostic at the line of the YAML node at fault.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatrun.definition.catalogs import Catalogs, load_catalogs
from chatrun.definition.checks import run_checks
from chatrun.definition.collector import collector_paused
from chatrun.definition.config import (
    DEFAULT_TOOL_TIMEOUT,
    DELIVER,
    EFFECTS,
    ERASED_OUTBOX,
    PII_KINDS,
    READ,
    SUMMARY_WHEN,
    ActionConfig,
    ApprovalCaseConfig,
    ApprovalConfig,
    AskConfig,
    AttachmentPolicy,
    BotConfig,
    CaseConfig,
    ChannelConfig,
    EnvVar,
    EventTypeConfig,
    FollowUpConfig,
    GuardrailConfig,
    KeyChanges,
    KnowledgeSource,
    Limits,
    Location,
    MemoryPolicy,
    MigrationConfig,
    ModelConfig,
    ModerationConfig,
    OnErrorConfig,
    OperatorConfig,
    OperatorTimeoutConfig,
    OutcomeConfig,
    OutputConfig,
    Price,
    Retention,
    RetryPolicy,
    RouteConfig,
    RouteKnowledge,
    ScopeConfig,
    SinkConfig,
    ToolConfig,
    UserMemoryConfig,
    UserSummaryConfig,
    WebhookConfig,
    WidgetConfig,
    duration_seconds,
    seconds_or,
)
from chatrun.definition.effects import default_effect
from chatrun.definition.kinds import Load, bot_kinds, kinds, parse_kinds, route_kinds
from chatrun.definition.schemas import (
    Violation,
    compile_check,
    inline_refs,
    load_schema,
    properties,
    violation,
)
from chatrun.definition.sources import Sources, inside, subject, suggest, wrong_file
from chatrun.definition.versions import DEFAULT_POLICY, bot_files, content_version
from chatrun.definition.yamlpos import YamlDoc, read_yaml_file
from chatrun.errors import BotError, Diagnostic

if TYPE_CHECKING:  # jsonschema loads only for a file the fast check finds fault with
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

BOT_FILES = ("bot.yaml", "bot.yml")


BOT_SCHEMA = "bot.schema.json"  # format 3, the current one
FORMAT2_SCHEMA = "bot.format2.schema.json"  # formats 1 and 2, frozen as they were (docs/format.md, "Format version")


def schema_for(data: Any) -> str:
    """The schema a bot's files are checked against: its declared `format:` picks it. Without
    `format:`, the current one, unless only format 2's fits (formats 2 and 3 mean the same,
    they differ in spelling): then format 2's, and a warning says so (`_undeclared_format2`)."""
    return _schema_choice(data)[0]


def _schema_choice(data: Any) -> tuple[str, bool]:
    """`schema_for(data)`, and whether the fast check already found the file valid under it
    (then checking the file again would only repeat that pass over every node)."""
    declared = data.get("format") if isinstance(data, dict) else None
    if declared is None and isinstance(data, dict):
        for schema_file in (BOT_SCHEMA, FORMAT2_SCHEMA):
            if _fits(data, schema_file):
                return schema_file, True
        return BOT_SCHEMA, False
    return FORMAT2_SCHEMA if declared in (1, 2) and not isinstance(declared, bool) else BOT_SCHEMA, False


def _fits(data: Any, schema_file: str) -> bool:
    """Whether a whole bot file is valid (the fast check may say no to a valid one: jsonschema
    decides, part by part as `schema_diagnostics` splits the file)."""
    if _fast_check(None, schema_file)(data):
        return True
    return all(_fast_check(schema, schema_file)(part)
               or next(_validator(schema, schema_file).iter_errors(part), None) is None
               for schema, _prefix, part in _schema_parts(data, None))


def _undeclared_format2(main: YamlDoc) -> Diagnostic:
    return Diagnostic(main.file, 1, 1, "warning", "the bot declares no `format:` and is written in format 2; "
                      "`chatrun upgrade` rewrites it to format 3 (docs/format.md, \"From format 2\")", "format")


@lru_cache(maxsize=8)
def _fast_check(definition: str | None, schema_file: str = BOT_SCHEMA) -> Callable[[Any], bool]:
    return compile_check(_inlined(definition, schema_file))


@lru_cache(maxsize=8)
def _inlined(definition: str | None, schema_file: str = BOT_SCHEMA) -> Any:
    """The whole bot schema, or one of its $defs (e.g. "fragment"), its local `$ref`s inlined:
    resolving references is most of jsonschema's time on a big bot, and ours only point into
    `$defs` (no recursion)."""
    schema = load_schema(schema_file)
    defs = schema["$defs"]
    root = defs[definition] if definition else {k: v for k, v in schema.items() if k != "$defs"}
    return inline_refs(root, defs)


@lru_cache(maxsize=8)
def _validator(definition: str | None, schema_file: str = BOT_SCHEMA) -> Draft202012Validator:
    """A jsonschema validator of `_inlined(definition)`, for the files the fast check fails."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(_inlined(definition, schema_file))


# -- loading ------------------------------------------------------------------------


def load_config(path: str | Path) -> tuple[BotConfig, list[Diagnostic]]:
    """Load and validate a bot (a directory holding bot.yaml, or a single YAML file).

    Returns the config and the warnings; raises BotError carrying every diagnostic
    (errors and warnings) when there is any error.
    """
    config, diagnostics = check_bot(path)
    if config is None or any(d.severity == "error" for d in diagnostics):
        raise BotError(diagnostics)
    return config, diagnostics


def check_bot(path: str | Path) -> tuple[BotConfig | None, list[Diagnostic]]:
    """Everything `load_config` does, without raising: (config or None, sorted diagnostics).
    The cyclic collector is paused meanwhile (chatrun.definition.collector: 3-4x the CPU otherwise)."""
    with collector_paused():
        return _check_bot(Path(path))


def _check_bot(path: Path) -> tuple[BotConfig | None, list[Diagnostic]]:
    main_file, problem = _find_main(path)
    if problem:
        return None, [problem]
    diagnostics: list[Diagnostic] = []
    main = _read(main_file, diagnostics)
    if main is None:
        return None, _sorted(diagnostics)
    other = wrong_file(main.file, main.data, "bot")
    if other is not None:  # a transcript or scenario given for a bot: not its schema errors
        return None, [other]
    sources = Sources(main, [main])
    if main.data is not None:
        schema_file, known_valid = _schema_choice(main.data)
        if not known_valid:
            diagnostics.extend(schema_diagnostics(main, None, schema_file))
        if schema_file == FORMAT2_SCHEMA and "format" not in main.data:
            diagnostics.append(_undeclared_format2(main))
        for file in _included(main, diagnostics):
            doc = _read(file, diagnostics, included=True)
            if doc is None or doc.data is None:
                continue
            sources.docs.append(doc)
            diagnostics.extend(schema_diagnostics(doc, "fragment", schema_file))
    config = _build(sources, diagnostics, main_file)
    if config is not None:
        diagnostics.extend(run_checks(config, sources))
    return config, _sorted(_without_echoes(diagnostics, sources.docs))


def _without_echoes(diagnostics: list[Diagnostic], docs: list[YamlDoc]) -> list[Diagnostic]:
    """A value YAML could not give as JSON (`.nan`, `!!binary`) is reported once, by the
    YAML reader; the schema and checks would only say again that its stand-in is wrong."""
    own = {id(d) for doc in docs for d in doc.diagnostics}
    bad = {(doc.file, path) for doc in docs for path in doc.replaced}
    if not bad:
        return diagnostics
    return [d for d in diagnostics if id(d) in own or (d.file, d.path) not in bad]


def _find_main(path: Path) -> tuple[Path, Diagnostic | None]:
    if path.is_dir():
        for name in BOT_FILES:
            if (path / name).is_file():
                return path / name, None
        return path, Diagnostic(str(path), 0, 0, "error",
                                f"no bot.yaml in directory {path}: a bot is a directory holding bot.yaml, or one YAML file")
    if not path.exists():
        return path, Diagnostic(str(path), 0, 0, "error", f"no such file or directory: {path}")
    return path, None


def _read(file: Path, diagnostics: list[Diagnostic], included: bool = False) -> YamlDoc | None:
    doc = read_yaml_file(file)
    if doc.data is None and doc.diagnostics and not doc.text:  # unreadable, or not UTF-8
        diagnostics.extend(doc.diagnostics)
        return None
    diagnostics.extend(doc.diagnostics)
    if doc.data is None and not doc.diagnostics:
        what = ("the included file is empty: an included file holds `routes:` and/or `tools:`" if included
                else "the file is empty: a bot needs at least `name:` and `routes:`")
        diagnostics.append(Diagnostic(str(file), 1, 1, "error", what))
    elif doc.data is not None and not isinstance(doc.data, dict):
        diagnostics.append(Diagnostic(str(file), 1, 1, "error",
                                      f"the file must hold a mapping (name:, routes:, tools:, ...), not {_type_name(doc.data)}"))
        doc.data = None
    return doc


def _included(main: YamlDoc, diagnostics: list[Diagnostic]) -> list[Path]:
    patterns = main.data.get("include") or []
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, list):
        return []  # the schema reported it
    root = Path(main.file).parent
    files: list[Path] = []
    for i, pattern in enumerate(patterns):
        if not isinstance(pattern, str):
            continue
        pos = main.pos(("include", i) if isinstance(main.data.get("include"), list) else ("include",))
        try:
            matches = sorted(p for p in root.glob(pattern) if p.is_file())
        except (ValueError, NotImplementedError) as exc:
            diagnostics.append(Diagnostic(main.file, pos.value_line, pos.value_col, "error",
                                          f"include pattern `{pattern}` is not a valid glob: {exc}", "include"))
            continue
        outside = [p for p in matches if not p.resolve().is_relative_to(root.resolve())]
        if outside:  # like handlers, included files live in the bot directory
            diagnostics.append(Diagnostic(main.file, pos.value_line, pos.value_col, "error",
                                          f"include `{pattern}` reaches outside the bot directory {root} "
                                          f"({outside[0]}); included files must be inside it", "include"))
            continue
        matches = [p for p in matches if p.resolve() != Path(main.file).resolve() and p not in files]
        if not matches:
            folder = pattern.rstrip("/")
            message = (f"include `{pattern}`: `{folder}` is a directory; use `{folder}/*.yaml`"
                       if (root / pattern).is_dir() else f"include pattern `{pattern}` matches no file (relative to {root})")
            diagnostics.append(Diagnostic(main.file, pos.value_line, pos.value_col, "warning", message, "include"))
        files.extend(matches)
    return files


def _sorted(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    unique = dict.fromkeys(diagnostics)  # the same problem found twice is reported once
    return sorted(unique, key=lambda d: (d.file, d.line, d.col, d.severity, d.message))


# -- schema validation ----------------------------------------------------------------


def schema_diagnostics(doc: YamlDoc, definition: str | None, schema_file: str = BOT_SCHEMA) -> list[Diagnostic]:
    """Every schema violation of one file, each at the line of the node at fault.

    jsonschema runs only where the fast check says no: on the file with its routes and
    tools emptied, then on each route and tool that fails, so one typo in a big bot
    costs one small validation, not a whole-file one.
    """
    data = doc.data
    if _fast_check(definition, schema_file)(data):
        return []
    out: list[Diagnostic] = []
    for schema, prefix, part in _schema_parts(data, definition):
        if schema == definition or not _fast_check(schema, schema_file)(part):
            out.extend(_validate(doc, part, schema, prefix, definition, schema_file))
    return out


def _schema_parts(data: Any, definition: str | None) -> list[tuple[str | None, tuple, Any]]:
    """A file as (schema definition, path, value) parts, each checked on its own: the file
    with its routes and tools emptied (under `definition`), then each route and tool."""
    if not isinstance(data, dict):
        return [(definition, (), data)]
    shell = dict(data)
    parts: list[tuple[str | None, tuple, Any]] = [(definition, (), shell)]
    for kind, item in (("routes", "route"), ("tools", "tool")):
        section = data.get(kind)
        if isinstance(section, dict):
            shell[kind] = dict.fromkeys(section, {})  # names still checked; {} is a valid route and tool
            parts += [(item, (kind, name), value) for name, value in section.items()]
    return parts


def _validate(doc: YamlDoc, data: Any, schema: str | None, prefix: tuple, definition: str | None,
              schema_file: str = BOT_SCHEMA) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for error in _validator(schema, schema_file).iter_errors(data):
        out.extend(_translate(_specific(violation(error)), doc, definition, prefix))
    return out


def _specific(error: Violation) -> Violation:
    """For oneOf/anyOf, the error of the alternative that came closest (unless the
    alternatives are a list of constants: then "must be one of" says it best)."""
    while error.validator in ("oneOf", "anyOf") and error.context and not _const_choices(error.validator_value):
        if _type_alternatives(error):
            break  # "must be a string or a list" says it better than either branch
        same_type = _errors_of_matching_type(error)
        error = violation(_best_match(same_type or error.context))
    return error


def _best_match(errors: list[ValidationError]) -> ValidationError:
    from jsonschema.exceptions import best_match  # loaded already: the errors came from jsonschema

    return best_match(errors)


_JSON_TYPES = {"object": dict, "array": list, "string": str}


def _errors_of_matching_type(error: Violation) -> list[ValidationError]:
    """The errors of the alternative whose `type` the value has (a mapping given where a number
    or a mapping may go is wrong inside the mapping, not for not being a number)."""
    for index, sub in enumerate(error.validator_value):
        kind = _JSON_TYPES.get(of) if isinstance(sub, dict) and isinstance(of := sub.get("type"), str) else None
        if kind is not None and isinstance(error.instance, kind):
            return [e for e in error.context if e.schema_path and e.schema_path[0] == index]
    return []


def _type_alternatives(error: Violation) -> list[str]:
    """The types a oneOf/anyOf accepts, when the value has none of them."""
    types: list[str] = []
    for sub in error.validator_value:
        if not isinstance(sub, dict) or "type" not in sub:
            return []
        types += sub["type"] if isinstance(sub["type"], list) else [sub["type"]]
    if any(e.validator != "type" or e.relative_path for e in error.context):
        return []
    return types


def _const_choices(subschemas: Any) -> list[Any]:
    if isinstance(subschemas, list) and subschemas and all(isinstance(s, dict) and "const" in s for s in subschemas):
        return [s["const"] for s in subschemas]
    return []


_MEMORY_KEYS = {"message_window": {"max_messages"}, "token_window": {"max_tokens", "encoding"},
                "summary": {"max_tokens", "encoding", "keep_messages", "summary_model", "summary_prompt"},
                "none": set()}
_MEMORY_OPTIONS = set().union(*_MEMORY_KEYS.values())


# How to write a value that missed a schema `pattern`, by the pattern (one per kind of value:
# naming a name's rule for a duration or a media type would send the author the wrong way).
_IDENTIFIER_HINT = "use letters, digits, `_` and `-`, starting with a letter or `_`"
_PATTERN_HINTS = {
    "^[A-Za-z_][A-Za-z0-9_-]*$": _IDENTIFIER_HINT,
    "^[A-Za-z_][A-Za-z0-9_]*$": "use letters, digits and `_`, starting with a letter or `_` (e.g. `API_KEY`)",
    "^[A-Za-z_][A-Za-z0-9_-]*(/[A-Za-z0-9_.-]+)?$": "write `SERVER` (all its tools) or `SERVER/TOOL`",
    "^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$": "write a language tag: `en`, `de`, `pt-BR`",
    "^(?!(Message|Choices)$)[A-Za-z_][A-Za-z0-9_-]*$": "a message is said with `message:` and choices with "
    "`choices:` (format 3); other event types use letters, digits, `_` and `-`, starting with a letter or `_`",
    "^https?://\\S+$": "write an absolute `http` or `https` URL, e.g. `https://help.example.com/returns`",
    "^[1-9][0-9]*[smhd]$": "write a duration: a whole number and `s`, `m`, `h` or `d` (e.g. `30m`)",
    "^([a-z0-9.+-]+|\\*)/([a-z0-9.+-]+|\\*)$":
        "write a media type in lower case: `image/png`, or `image/*` for every image",
}
_STATE_PATH_HINT = "a state path starts with `state.`, `scope.` or `turn.` (e.g. `scope.reservation.destination`)"


def _hint(error: Violation) -> str:
    pattern = error.validator_value if error.validator == "pattern" else ""
    if isinstance(error.schema, dict) and "pattern" in error.schema:
        pattern = error.schema["pattern"]
    if pattern.startswith("^(state|scope|turn)"):
        return _STATE_PATH_HINT
    if pattern in _PATTERN_HINTS:
        return _PATTERN_HINTS[pattern]
    for kind in kinds():  # a pattern of a tool kind's section (`handler: module:function`)
        hint = kind.pattern_hint(pattern)
        if hint is not None:
            return hint
    return f"it must match `{pattern}`" if pattern else _IDENTIFIER_HINT


def _not_text(doc: YamlDoc, at: tuple, numbers: bool = False) -> str:
    """Why a key YAML reads as true, false or null is no name (it looks like one); else ''. With
    `numbers`, a number too (`1:`), where any text is a name: quoting it then is the whole fix
    (where a name has a pattern, `'1'` would fail it, so the pattern's hint says more)."""
    key = at[-1]
    if key is not None and not isinstance(key, bool) and not (numbers and isinstance(key, (int, float))):
        return ""
    spelled = doc.written(at)
    return f"YAML reads `{spelled}` as {json.dumps(key)}, not as text: quote it, `'{spelled}':`"


def _translate(error: Violation, doc: YamlDoc, definition: str | None = None,
               prefix: tuple = ()) -> list[Diagnostic]:
    path = (*prefix, *error.absolute_path)
    where = inside(path)

    def diag(message: str, at: tuple = path) -> Diagnostic:
        pos = doc.pos(at)
        return Diagnostic(doc.file, pos.line, pos.col, "error", message, ".".join(map(str, at)))

    kind = error.validator
    if kind == "additionalProperties":
        allowed = sorted(properties(error.schema))
        extras = [k for k in error.instance if k not in allowed]
        if definition == "fragment" and not path:
            return [diag(f"unknown key `{k}` at the top level of an included file: included files hold only "
                         "`routes:` and `tools:`", (k,)) for k in extras]
        return [diag(f"unknown key `{doc.written((*path, k))}` {where}"
                     + (f" ({_not_text(doc, (*path, k))})" if _not_text(doc, (*path, k)) else suggest(str(k), allowed)),
                     (*path, k)) for k in extras]
    if "propertyNames" in error.schema_path:
        what = {"routes": "route name", "tools": "tool name", "set": "`set` path", "emit": "event type"}.get(
            str(path[-1]) if path else "", "key")
        at = (*path, error.instance)
        free = not (isinstance(error.schema, dict) and "pattern" in error.schema)  # `{type: string}`: any text
        return [diag(f"invalid {what} `{doc.written(at)}` {where}: {_not_text(doc, at, free) or _hint(error)}", at)]
    if kind == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return [diag(f"missing required key `{k}` {where}") for k in missing]
    if kind == "type" or (kind in ("oneOf", "anyOf") and _type_alternatives(error)):
        expected = _type_alternatives(error) if kind != "type" else (
            error.validator_value if isinstance(error.validator_value, list) else [error.validator_value])
        names = " or ".join(_TYPE_WORDS.get(t, t) for t in expected)
        return [diag(f"{subject(path)} must be {names}, not {_type_name(error.instance)}")]
    if kind in ("oneOf", "anyOf") and _const_choices(error.validator_value):
        choices = [str(c) for c in _const_choices(error.validator_value)]
        return [diag(f"{subject(path)} must be one of {', '.join(choices)} (got `{error.instance}`)"
                     f"{suggest(str(error.instance), choices)}")]
    if kind == "enum":
        return _enum_error(error, path, diag)
    if kind == "pattern":
        return [diag(f"{subject(path)}: `{error.instance}` is not valid; {_hint(error)}")]
    if kind == "dependentRequired":
        needs = [k for k, deps in error.validator_value.items() if k in error.instance
                 for d in deps if d not in error.instance]
        return [diag(f"`{k}` {where} is only used with `pop: true` (it is handed to the parent route when the scope ends)"
                     if k == "result" else f"`{k}` {where} needs {error.validator_value[k]}", (*path, k)) for k in needs]
    if error.schema is False and _is_memory(doc.data, path):
        parent = _get(doc.data, path)
        mtype = parent.get("type")
        uses = _MEMORY_KEYS.get(mtype, set())
        bad = [k for k in parent if k in _MEMORY_OPTIONS and k not in uses]
        return [diag(f"`{k}` does not apply to `type: {mtype}` memory {where} "
                     f"(that type uses: {', '.join(sorted(uses)) or 'nothing'})", (*path, k)) for k in bad]
    if kind == "uniqueItems":
        seen: set[str] = set()
        out = []
        for i, item in enumerate(error.instance):
            key = json.dumps(item, sort_keys=True)
            if key in seen:
                out.append(diag(f"{subject(path)} lists `{item}` twice", (*path, i)))
            seen.add(key)
        return out
    return [diag(f"{subject(path)}: {error.message}")]


def _enum_error(error: Violation, path: tuple, diag: Callable[[str], Diagnostic]) -> list[Diagnostic]:
    """A value that is none of the choices: named with them. One of the wrong type is already
    reported by its `type` (`must be an integer, not a string`), not twice."""
    declared = error.schema.get("type") if isinstance(error.schema, dict) else None
    if isinstance(declared, str) and _type_name(error.instance) not in _WORDS_OF_TYPE.get(declared, ()):
        return []
    choices = [str(c) for c in error.validator_value]
    return [diag(f"{subject(path)} must be one of {', '.join(choices)} (got `{error.instance}`)"
                 f"{suggest(str(error.instance), choices)}")]


def _is_memory(data: Any, path: tuple) -> bool:
    node = _get(data, path)
    return isinstance(node, dict) and "type" in node


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


_TYPE_WORDS = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "null"}


# The words of `_type_name` each JSON Schema type takes (an integer is a number).
_WORDS_OF_TYPE = {"integer": ("an integer",), "number": ("an integer", "a number"), "string": ("a string",),
                  "boolean": ("a boolean",), "object": ("a mapping",), "array": ("a list",), "null": ("null",)}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)


# -- building the dataclasses ---------------------------------------------------------
# The schema has already reported wrong types; building stays defensive so that one
# bad value does not hide the cross-reference problems of the rest of the bot.


def _build(sources: Sources, diagnostics: list[Diagnostic], main_file: Path) -> BotConfig | None:
    main = sources.main
    top = main.data if isinstance(main.data, dict) else None
    if top is None:
        return None
    routes: dict[str, RouteConfig] = {}
    tools: dict[str, ToolConfig] = {}
    for doc in sources.docs:
        data = doc.data if isinstance(doc.data, dict) else {}
        for kind, target, build in (("routes", routes, _route), ("tools", tools, _tool)):
            section = data.get(kind)
            if not isinstance(section, dict):
                continue
            for key, raw in section.items():
                # `2:` or `on:` is a (reported) bad name, but still a name: the one written
                name = key if isinstance(key, str) else doc.written((kind, key))
                if name in target:
                    first_file, first = sources.at(kind, name)
                    pos = doc.pos((kind, name))
                    noun = "route" if kind == "routes" else "tool"
                    diagnostics.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                                  f"{noun} `{name}` is defined twice: here and at {first_file}:{first.line}; "
                                                  f"{noun} names must be unique across the bot's files", f"{kind}.{name}"))
                    continue
                sources.origin[(kind, name)] = doc
                # Why the ignore: each section's builder makes its own kind (mypy sees the pairs' union)
                target[name] = build(name, raw if isinstance(raw, dict) else {}, doc)  # type: ignore[assignment]
    if not routes and not any(d.severity == "error" for d in diagnostics):
        diagnostics.append(Diagnostic(main.file, 1, 1, "error",
                                      "the bot has no routes: add `routes:` with at least one route marked `default: true`",
                                      "routes"))
    load = Load(main_file.parent, sources, diagnostics)
    for tool_kind in kinds():  # a kind's load-time step: an `openapi:` operation becomes an `http:` call
        tool_kind.resolve(list(tools.values()), load)
    for tool in tools.values():  # once the kinds are final (an `openapi:` operation's method is known)
        if not tool.effect_declared:
            tool.effect = default_effect(tool)
    bot_name = top.get("name")
    return BotConfig(
        name=bot_name if isinstance(bot_name, str) else main_file.stem,
        routes=routes,
        tools=tools,
        description=_str(top.get("description")) or "",
        model=_model(top.get("model"), main, ("model",)),
        memory=_memory(top.get("memory"), main, ("memory",)) or MemoryPolicy(where=_loc(main, ("memory",))),
        state=dict(top["state"]) if isinstance(top.get("state"), dict) else {},
        limits=_limits(top.get("limits")),
        env=_env(top.get("env")),
        prices=_prices(top.get("prices")),
        timezone=_str(top.get("timezone")),
        kind_config=bot_kinds(top, main),
        events=_event_types(top.get("events"), main),
        sinks=_sinks(top.get("sinks"), main),
        channels=_channels(top.get("channels"), main),
        format=top["format"] if isinstance(top.get("format"), int) and not isinstance(top["format"], bool) else None,
        version=_version(top.get("version")),
        migrations=_migrations(top.get("migrations"), main),
        path=str(main_file),
        root=str(main_file.parent),
        where=Location(main.file, 1, 1),
        content_version=content_version(_version_files(main_file)),
        on_change=_str(top.get("on_change")) or DEFAULT_POLICY,
        catalogs=_catalogs(top.get("locales"), main, main_file, diagnostics),
        fallback=_str(top.get("fallback")),
        context=_str(top.get("context")),
        retention=_retention(top.get("retention")),
        user_memory=_user_memory(top.get("user_memory"), main),
        widget=_widget(top.get("widget"), main),
        canned=_canned(top.get("canned")),
        guardrails=_guardrails(top.get("guardrails"), main, ("guardrails",)),
        knowledge=_knowledge(top.get("knowledge"), main),
        outcomes=_outcomes(top.get("outcomes"), main),
    )


def _knowledge(raw: Any, doc: YamlDoc) -> dict[str, KnowledgeSource]:
    """`knowledge:` name -> source (the schema has checked the shapes)."""
    out: dict[str, KnowledgeSource] = {}
    for name, spec in (raw.items() if isinstance(raw, dict) else ()):
        if not isinstance(spec, dict) or not spec:  # (the schema wants `path`, `urls` or `sitemap`)
            continue
        urls, max_pages = _str_list(spec.get("urls")), spec.get("max_pages")
        out[str(name)] = KnowledgeSource(
            str(name), _str(spec.get("path")) or "", _str_list(spec.get("include")), _str(spec.get("url")),
            _loc(doc, ("knowledge", name)), _str(spec.get("embeddings")), urls,
            [_loc(doc, ("knowledge", name, "urls", i)) for i in range(len(urls))], _str(spec.get("sitemap")),
            _str_list(spec.get("exclude")), max_pages if isinstance(max_pages, int) else None,
            _str(spec.get("language")))
    return out


def _route_knowledge(raw: Any, doc: YamlDoc, path: tuple) -> RouteKnowledge | None:
    """A route's `knowledge:`: a list of source names, or a mapping with `sources`."""
    if isinstance(raw, list):
        raw = {"sources": raw}
    if not isinstance(raw, dict) or not _str_list(raw.get("sources")):
        return None
    top_k = raw.get("top_k")
    return RouteKnowledge(_str_list(raw.get("sources")), _str(raw.get("retrieve")) or "tool",
                          _str(raw.get("cite")) or "optional",
                          top_k if isinstance(top_k, int) and not isinstance(top_k, bool) else 5, _loc(doc, path))


def _outcomes(raw: Any, doc: YamlDoc) -> list[OutcomeConfig]:
    """`outcomes:` in the order written (the schema checked the shape; a bad duration is left out)."""
    out: list[OutcomeConfig] = []
    for name, spec in _dict(raw).items():
        spec = _dict(spec)
        try:
            silent = duration_seconds(str(spec["silent_for"])) if "silent_for" in spec else None
        except ValueError:
            silent = None
        ended, taken = spec.get("ended"), spec.get("taken_over")
        out.append(OutcomeConfig(str(name), _one_or_many(spec.get("event")), _one_or_many(spec.get("route")),
                                 _str(spec.get("if")), ended if isinstance(ended, bool) else None, silent,
                                 taken if isinstance(taken, bool) else None, _loc(doc, ("outcomes", name))))
    return out


def _one_or_many(raw: Any) -> tuple[str, ...]:
    """A name or a list of names (`event:`, `route:` of an outcome)."""
    return (raw,) if isinstance(raw, str) else tuple(str(x) for x in raw) if isinstance(raw, list) else ()


def _canned(raw: Any) -> dict[str, str]:
    """`canned:` name -> text (the schema has checked the names and texts)."""
    return {str(k): v for k, v in raw.items() if isinstance(v, str)} if isinstance(raw, dict) else {}


def _catalogs(locales: Any, main: YamlDoc, main_file: Path, diagnostics: list[Diagnostic]) -> Catalogs | None:
    """`locales: [en, de]`: the catalogs beside the bot (definition/catalogs.py); the schema
    has checked the list."""
    if not isinstance(locales, list) or not locales or not all(isinstance(x, str) for x in locales):
        return None
    pos = main.pos(("locales",))
    catalogs, problems = load_catalogs(str(main_file.parent), locales, (main.file, pos.line, pos.col))
    diagnostics.extend(problems)
    return catalogs


def _version_files(main_file: Path) -> dict[str, str]:
    """What the content version covers: a bot.yaml's whole directory, a single-file bot's file."""
    if main_file.name in ("bot.yaml", "bot.yml"):
        return bot_files(main_file.parent)
    return {main_file.name: main_file.read_text(encoding="utf-8", errors="replace")}


def _loc(doc: YamlDoc, path: tuple) -> Location:
    line, col = doc.key_place(path)
    return Location(doc.file, line, col)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _bool(value: Any) -> bool:
    return value is True


def _positive_int(value: Any, default: int) -> int:
    """An integer of at least 1, else `default`: a wrong value is the schema's to report, never a crash here."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _dict(value: Any) -> dict:
    return dict(value) if isinstance(value, dict) else {}


def _str_list(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _model(raw: Any, doc: YamlDoc, path: tuple) -> ModelConfig:
    fields = ModelConfig.__dataclass_fields__
    values = {k: v for k, v in _dict(raw).items() if k in fields and k not in ("where", "fallback", "breaker")}
    if "accepts" in values:  # a list in YAML, a tuple in the config (frozen, hashable)
        values["accepts"] = tuple(_str_list(values["accepts"])) if isinstance(values["accepts"], list) else None
    defaults = ModelConfig()
    for key, value in list(values.items()):  # drop values of the wrong type (reported by the schema)
        default = getattr(defaults, key)
        if default is not None and value is not None and not isinstance(value, type(default)) \
                and not (isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)):
            del values[key]
    extra = ModelConfig().merged({k: v for k, v in _dict(raw).items() if k in ("fallback", "breaker")})
    return ModelConfig(**values, fallback=extra.fallback, breaker=extra.breaker, where=_loc(doc, path))


def _memory(raw: Any, doc: YamlDoc, path: tuple) -> MemoryPolicy | None:
    if not isinstance(raw, dict):
        return None
    policy = MemoryPolicy(where=_loc(doc, path))
    if raw.get("type") in _MEMORY_KEYS:
        policy.type = raw["type"]
    for key in ("max_messages", "max_tokens", "keep_messages"):
        if isinstance(raw.get(key), int) and not isinstance(raw.get(key), bool) and raw[key] > 0:
            setattr(policy, key, raw[key])
    clear = raw.get("clear_tool_results")
    if isinstance(clear, int) and not isinstance(clear, bool) and clear >= 0:
        policy.clear_tool_results = clear
    policy.summary_model = dict(raw["summary_model"]) if isinstance(raw.get("summary_model"), dict) else None
    policy.summary_prompt = _str(raw.get("summary_prompt"))
    policy.encoding = _str(raw.get("encoding"))
    window = raw.get("max_tokens")
    if isinstance(window, dict):  # {context_size, reply_reserve}: the schema checked the types
        for key in ("context_size", "reply_reserve"):
            value = window.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                setattr(policy, key, value)
    return policy


def _retention(raw: Any) -> Retention:
    """`retention:` (the schema has checked its durations; a bad one is left out: for ever)."""
    seconds: dict[str, float] = {}
    for key in ("idle_sessions", "dead_letters", "user_memory"):
        value = _dict(raw).get(key)
        try:
            if isinstance(value, str):
                seconds[key] = duration_seconds(value)
        except ValueError:
            pass
    erased = _dict(raw).get("erased_outbox")
    return Retention(**seconds, erased_outbox=erased if erased in ERASED_OUTBOX else DELIVER)


def _user_memory(raw: Any, main: YamlDoc) -> UserMemoryConfig | None:
    """`user_memory:` (the schema has checked its shape)."""
    if not isinstance(raw, dict):
        return None
    return UserMemoryConfig(facts=_str_list(raw.get("facts")), summary=_user_summary(raw.get("summary"), main),
                            where=_loc(main, ("user_memory",)))


def _user_summary(raw: Any, main: YamlDoc) -> UserSummaryConfig | None:
    """`user_memory.summary:` (`when:` one name or a list of them; the schema has checked them)."""
    if not isinstance(raw, dict):
        return None
    when = raw.get("when", "end")
    names = [when] if isinstance(when, str) else _str_list(when)
    return UserSummaryConfig(when=tuple(n for n in SUMMARY_WHEN if n in names) or ("end",),
                             prompt=_str(raw.get("prompt")), where=_loc(main, ("user_memory", "summary")))


def _widget(raw: Any, main: YamlDoc) -> WidgetConfig | None:
    """`widget:` (the schema has checked its shape; checks.py its origins and logo)."""
    if not isinstance(raw, dict):
        return None
    origins = raw.get("origins")
    given = {key: raw[key] for key in ("title", "greeting", "color", "logo", "position", "identity", "secret_env")
             if isinstance(raw.get(key), str)}
    return WidgetConfig(
        origins=tuple(o.lower().rstrip("/") for o in origins if isinstance(o, str)) if isinstance(origins, list) else (),
        where=_loc(main, ("widget",)), **given)


def _limits(raw: Any) -> Limits:
    limits = Limits()
    for key in ("max_hops", "max_model_calls", "max_turn_tokens", "max_session_tokens", "max_calls_per_tool",
                "max_user_tokens"):
        value = _dict(raw).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            setattr(limits, key, value)
    for key in ("max_turn_cost", "max_session_cost", "max_user_cost"):
        value = _dict(raw).get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            setattr(limits, key, float(value))
    limits.user_window = seconds_or(_dict(raw).get("user_window"), limits.user_window)
    return limits


def _prices(raw: Any) -> dict[str, Price]:
    out: dict[str, Price] = {}
    for model, spec in _dict(raw).items():
        spec = _dict(spec)
        numbers = {k: float(v) for k, v in spec.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        out[str(model)] = Price(numbers.get("input", 0.0), numbers.get("output", 0.0), numbers.get("cached_input"))
    return out


def _route(name: str, raw: dict, doc: YamlDoc) -> RouteConfig:
    base = ("routes", name)
    scope = _dict(raw.get("scope"))
    model = raw.get("model")
    return RouteConfig(
        name=name,
        system=_str(raw.get("system")) or "",
        context=_str(raw.get("context")),
        description=_str(raw.get("description")) or "",
        title=_str(raw.get("title")) or "",
        default=_bool(raw.get("default")),
        entry=_bool(raw.get("entry")),
        user=_str(raw.get("user")),
        memory=_memory(raw.get("memory"), doc, (*base, "memory")),
        model=dict(model) if isinstance(model, dict) and model else None,
        tools=_str_list(raw.get("tools")),
        kind_config=route_kinds(raw, doc, base),
        scope=ScopeConfig(local=_dict(scope.get("local")), shared=_dict(scope.get("shared"))),
        roles=_str_list(raw.get("roles")),
        returns=raw.get("returns") if raw.get("returns") == "answer" else None,
        output=_output(raw.get("output"), doc, (*base, "output")),
        choices=_choices(raw.get("choices")),
        stream_to_quarkus=None if raw.get("stream_to_quarkus") is None else _bool(raw.get("stream_to_quarkus")),
        attachments=_attachments(raw.get("attachments")),
        one_change_per_answer=_bool(raw.get("one_change_per_answer")),
        tool_choice=_str(raw.get("tool_choice")),
        fallback=_str(raw.get("fallback")),
        follow_up=_follow_up(raw.get("follow_up"), doc, (*base, "follow_up")),
        guardrails=_guardrails(raw.get("guardrails"), doc, (*base, "guardrails")),
        knowledge=_route_knowledge(raw.get("knowledge"), doc, (*base, "knowledge")),
        where=_loc(doc, base),
    )


def _guardrails(raw: Any, doc: YamlDoc, path: tuple) -> tuple[GuardrailConfig, ...]:
    """`guardrails:` (the bot's or a route's; the schema checked the shape: an entry it refused is
    left out). Each entry's kind is the detector key it has (DETECTOR_KINDS)."""
    out = []
    for i, item in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(item, dict):
            continue
        # One detector key each (the schema's oneOf); without one it matches nothing (`patterns: []`).
        detectors = tuple(k for k in DETECTOR_KINDS if k in item)
        kind = DETECTOR_KINDS[detectors[0]] if detectors else "pattern"
        stages = tuple(_str_list(item.get("stages")))
        at = (*path, i)
        patterns = tuple(_str_list(item.get("patterns")))
        limit = item.get("max_chars")
        out.append(GuardrailConfig(
            name=_str(item.get("name")) or f"{'.'.join(map(str, path))}[{i}]",
            kind=kind,
            stages=stages, outcome=_str(item.get("outcome")) or "flag", patterns=patterns,
            pii=tuple(_str_list(item["pii"])) or PII_KINDS if "pii" in item else PII_KINDS,
            max_chars=limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None,
            message=_str(item.get("message")), replacement=_str(item.get("replacement")),
            release=_str(item.get("release")) or "reply", where=_loc(doc, at),
            moderation=_moderation(item.get("moderation"), doc, (*at, "moderation")),
            languages=tuple(code.lower() for code in _str_list(item.get("languages"))),
            pattern_where=tuple(_loc(doc, (*at, "patterns", j)) for j in range(len(patterns))),
            detectors=detectors))
    return tuple(out)


# A guardrail's detector key -> its kind (the event's `kind`).
DETECTOR_KINDS = {"patterns": "pattern", "pii": "pii", "max_chars": "length", "moderation": "moderation",
                  "languages": "language"}


def _moderation(raw: Any, doc: YamlDoc, path: tuple) -> ModerationConfig | None:
    """A guardrail's `moderation:` (the schema checked its shape; `{}` takes every default)."""
    if not isinstance(raw, dict):
        return None
    defaults = ModerationConfig()
    categories = tuple(_str_list(raw.get("categories")))
    threshold, timeout = _number(raw.get("threshold")), _number(raw.get("timeout"))
    return ModerationConfig(
        categories=categories,
        threshold=threshold,
        model=_str(raw.get("model")) or defaults.model,
        timeout=timeout if timeout is not None and timeout > 0 else defaults.timeout,
        on_error=_str(raw.get("on_error")) or defaults.on_error,
        window=_positive_int(raw.get("window"), defaults.window),
        category_where=tuple(_loc(doc, (*path, "categories", j)) for j in range(len(categories))))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _follow_up(raw: Any, doc: YamlDoc, path: tuple) -> FollowUpConfig | None:
    """A route's `follow_up:` (the schema checked its shape; a bad duration is left out)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("message"), str):
        return None
    try:
        after = duration_seconds(str(raw.get("after")))
    except ValueError:
        return None
    template = _dict(raw.get("whatsapp_template"))
    name = _str(template.get("name"))
    # (language "": the session's locale, engine/follow_up.py)
    return FollowUpConfig(after, raw["message"], (name, _str(template.get("language")) or "") if name else None,
                          _loc(doc, path))


def _attachments(raw: Any) -> AttachmentPolicy | None:
    """A route's `attachments:` (the schema checked its shape)."""
    if not isinstance(raw, dict):
        return None
    defaults = AttachmentPolicy(())
    return AttachmentPolicy(tuple(_str_list(raw.get("kinds"))),
                            _positive_int(raw.get("max_bytes"), defaults.max_bytes),
                            _positive_int(raw.get("max_count"), defaults.max_count))


def _env(raw: Any) -> dict[str, EnvVar]:
    out: dict[str, EnvVar] = {}
    for name, spec in _dict(raw).items():
        spec = _dict(spec)
        default = spec.get("default")
        out[str(name)] = EnvVar(str(name), _bool(spec.get("secret")), None if default is None else str(default),
                                _str(spec.get("description")) or "")
    return out


def _event_types(raw: Any, doc: YamlDoc) -> dict[str, EventTypeConfig]:
    out: dict[str, EventTypeConfig] = {}
    for name, spec in _dict(raw).items():
        spec = _dict(spec)
        audience = spec.get("audience")
        out[str(name)] = EventTypeConfig(str(name), audience if isinstance(audience, str) else "user",
                                         _str(spec.get("description")) or "", _loc(doc, ("events", name)))
    return out


def _sinks(raw: Any, doc: YamlDoc) -> dict[str, SinkConfig]:
    out: dict[str, SinkConfig] = {}
    for name, spec in _dict(raw).items():
        spec = _dict(spec)
        hook = _dict(spec.get("webhook"))
        webhook = None if not hook else WebhookConfig(
            url=_str(hook.get("url")) or "", secret=_str(hook.get("secret")),
            headers={str(k): str(v) for k, v in _dict(hook.get("headers")).items()},
            timeout=float(hook.get("timeout", 10.0)))
        retry = {k: v for k, v in _dict(spec.get("retry")).items() if k in RetryPolicy.__dataclass_fields__}
        events = spec.get("events")
        out[str(name)] = SinkConfig(str(name), webhook, _str_list(events) if events is not None else None,
                                    RetryPolicy(**retry), _loc(doc, ("sinks", name)))
    return out


def _channels(raw: Any, doc: YamlDoc) -> dict[str, ChannelConfig]:
    out: dict[str, ChannelConfig] = {}
    for kind, spec in _dict(raw).items():
        spec = dict(_dict(spec))
        retry = {k: v for k, v in _dict(spec.pop("retry", None)).items() if k in RetryPolicy.__dataclass_fields__}
        out[str(kind)] = ChannelConfig(str(kind), spec, RetryPolicy(**retry), _loc(doc, ("channels", kind)))
    return out


def _version(raw: Any) -> str | None:
    """A version as text (`version: 2` and `version: "2"` are the same version)."""
    return None if raw is None or isinstance(raw, (bool, dict, list)) else str(raw)


def _migrations(raw: Any, doc: YamlDoc) -> list[MigrationConfig]:
    out: list[MigrationConfig] = []
    for i, spec in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(spec, dict):
            continue
        out.append(MigrationConfig(
            from_version=_version(spec.get("from")) or "*",
            routes={str(k): str(v) for k, v in _dict(spec.get("routes")).items()},
            state=_key_changes(spec.get("state")),
            scopes={str(k): str(v) for k, v in _dict(spec.get("scopes")).items()},
            tools={str(k): str(v) for k, v in _dict(spec.get("tools")).items()},
            arguments={str(k): _key_changes(v) for k, v in _dict(spec.get("arguments")).items()},
            index=i, where=_loc(doc, ("migrations", i)), places=_places(spec, doc, ("migrations", i))))
    return out


def _key_changes(raw: Any) -> KeyChanges:
    spec = _dict(raw)
    drop = spec.get("drop")
    return KeyChanges({str(k): str(v) for k, v in _dict(spec.get("rename")).items()},
                      [str(p) for p in drop if p is not None] if isinstance(drop, list) else [],
                      {str(k): v for k, v in _dict(spec.get("default")).items()})


def _places(spec: dict, doc: YamlDoc, at: tuple) -> dict[str, Location]:
    """The location of every entry of a migration, by its dotted key ("routes.cart", "state.drop.0")."""
    places: dict[str, Location] = {}
    for section in ("routes", "scopes", "tools", "arguments"):
        for key in _dict(spec.get(section)):
            places[f"{section}.{key}"] = _loc(doc, (*at, section, key))
    state = _dict(spec.get("state"))
    for part in ("rename", "default"):
        for key in _dict(state.get(part)):
            places[f"state.{part}.{key}"] = _loc(doc, (*at, "state", part, key))
    drop = state.get("drop")
    for i, _ in enumerate(drop if isinstance(drop, list) else []):
        places[f"state.drop.{i}"] = _loc(doc, (*at, "state", "drop", i))
    return places


def _choices(raw: Any) -> list[Any] | str | None:
    return raw if isinstance(raw, (list, str)) else None


def _output(raw: Any, doc: YamlDoc, path: tuple) -> OutputConfig | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("schema"), dict):
        return None
    request = raw.get("request")
    return OutputConfig(
        schema=dict(raw["schema"]),
        request=request if request in ("json_schema", "json_object", "none") else "json_schema",
        set={k: v for k, v in _dict(raw.get("set")).items() if isinstance(k, str)},
        where=_loc(doc, path),
    )


def _tool(name: str, raw: dict, doc: YamlDoc) -> ToolConfig:
    base = ("tools", name)
    params = raw.get("parameters")
    on_error = raw.get("on_error")
    return ToolConfig(
        name=name,
        description=_str(raw.get("description")) or "",
        parameters=dict(params) if isinstance(params, dict) else {"type": "object", "properties": {}},
        requires=_str_list(raw.get("requires")),
        kinds=parse_kinds(raw, doc, base),  # `handler:`, `http:`, ...: each kind parses its own key
        timeout=float(raw["timeout"]) if isinstance(raw.get("timeout"), int | float) else DEFAULT_TOOL_TIMEOUT,
        action=_action(_dict(raw.get("action")), doc, (*base, "action") if "action" in raw else base),
        on_error=OnErrorConfig(_str(on_error.get("message")), _str(on_error.get("reply")),
                               _loc(doc, (*base, "on_error"))) if isinstance(on_error, dict) else None,
        where=_loc(doc, base),
        bind={k: v for k, v in _dict(raw.get("bind")).items() if isinstance(k, str)},
        from_user=_str_list(raw.get("from_user")),
        approval=_approval(raw.get("approval"), doc, (*base, "approval")) or _confirm(raw.get("confirm"), doc, base),
        effect=raw["effect"] if raw.get("effect") in EFFECTS else READ,  # else its default (_build)
        effect_declared=raw.get("effect") in EFFECTS,
        max_calls_per_turn=_positive_int(raw.get("max_calls_per_turn"), 0) or None,
        one_change_per_answer=_bool(raw.get("one_change_per_answer")),
    )


def _confirm(raw: Any, doc: YamlDoc, base: tuple) -> ApprovalConfig | None:
    """`confirm: TEXT`, the short form of `approval: {by: [user], ask: TEXT}`: the user's own
    yes runs the call (with `approval:` too, `approval:` is used and the checks report both)."""
    text = _str(raw)
    if text is None:
        return None
    return ApprovalConfig(by=["user"], ask=text, where=_loc(doc, (*base, "confirm")), key="confirm")


def _approval(raw: Any, doc: YamlDoc, path: tuple) -> ApprovalConfig | None:
    if not isinstance(raw, dict):
        return None
    edit = raw.get("edit")
    by = _str_list(raw.get("by"))
    self_decide = raw.get("self")
    question = raw.get("ask")
    return ApprovalConfig(
        condition=_str(raw.get("if")),
        by=by or ["user"],
        self_decide=self_decide if isinstance(self_decide, bool) else None,
        edit=edit if isinstance(edit, bool) else _str_list(edit),
        # Format 3 asks in a question's shape, `ask: {text, tell}`; format 2 wrote `ask: TEXT` and `tell: TEXT`.
        ask=_str(question.get("text")) if isinstance(question, dict) else _str(question),
        tell=_str(question.get("tell")) if isinstance(question, dict) else _str(raw.get("tell")),
        timeout=_str(raw.get("timeout")),
        on_timeout=_str(raw.get("on_timeout")) or "reject",
        rejected=_str(raw.get("rejected")),
        cases={str(name): _approval_cases(entries, doc, (*path, "cases", name))
               for name, entries in _dict(raw.get("cases")).items()},
        where=_loc(doc, path),
    )


def _approval_cases(raw: Any, doc: YamlDoc, path: tuple) -> list[ApprovalCaseConfig]:
    """A named case of an approval: `{if, then}` / `{else}` entries like an action's `cases`,
    each a decision (those the schema rejected are left out; it reported them)."""
    out: list[ApprovalCaseConfig] = []
    for i, entry in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("if"), str) and isinstance(entry.get("then"), dict):
            condition, body, key = entry["if"], entry["then"], "if"
        elif "if" not in entry and isinstance(entry.get("else"), dict):
            condition, body, key = None, entry["else"], "else"
        else:
            continue
        approve, reject = body.get("approve"), body.get("reject")
        out.append(ApprovalCaseConfig(
            condition=condition,
            approve=dict(approve) if isinstance(approve, dict) else {} if approve is True else None,
            reject=reject if isinstance(reject, str) else "" if reject is True else None,
            message=_str(body.get("message")),
            route=_str(body.get("route")),
            where=_loc(doc, (*path, i, key)),
            index=i,
        ))
    return out


def _ask(raw: Any, doc: YamlDoc, path: tuple) -> AskConfig | None:
    if not isinstance(raw, dict) or raw.get("from") not in ("user", "operator", "backend"):
        return None
    schema = raw.get("schema")
    return AskConfig(
        source=raw["from"],
        text=_str(raw.get("text")),
        tell=_str(raw.get("tell")),
        schema=dict(schema) if isinstance(schema, dict) else {"type": "string"},
        choices=_choices(raw.get("choices")),
        into=_str(raw.get("into")),
        timeout=_str(raw.get("timeout")),
        on_timeout=raw.get("on_timeout"),
        has_on_timeout="on_timeout" in raw,
        where=_loc(doc, path),
    )


def _operator(raw: Any, doc: YamlDoc, path: tuple) -> OperatorConfig | None:
    if not isinstance(raw, dict):
        return None
    return OperatorConfig(
        role=_str(raw.get("role")) or "operators",
        text=_str(raw.get("text")),
        release_to=_str(raw.get("release_to")),
        remember="summary" if raw.get("remember") == "summary" else "messages",
        timeout=_str(raw.get("timeout")),
        on_timeout=_operator_timeout(raw.get("on_timeout"), doc, (*path, "on_timeout")),
        where=_loc(doc, path),
    )


def _operator_timeout(raw: Any, doc: YamlDoc, path: tuple) -> OperatorTimeoutConfig | None:
    if not isinstance(raw, dict):
        return None
    return OperatorTimeoutConfig(
        tool=_str(raw.get("tool")),
        args={k: v for k, v in _dict(raw.get("args")).items() if isinstance(k, str)},
        message=_str(raw.get("message")),
        route=_str(raw.get("route")),
        where=_loc(doc, path),
    )


# An action's keys by how each is read (a key of the wrong type, reported by the schema, is
# left at its default). One pass over the keys an action has, not a look-up of all 19: a big
# bot has tens of thousands of actions, most with two or three keys.
_ACTION_TEXTS = frozenset({"push", "route", "call", "message", "reply", "result"})
_ACTION_FLAGS = frozenset({"pop", "end", "execute", "immediate", "clear_memory"})
_ACTION_MAPS = frozenset({"set", "emit", "remember"})


def _action(action: dict, doc: YamlDoc, path: tuple, where: Location | None = None) -> ActionConfig:
    values: dict[str, Any] = {}
    for key, raw in action.items():
        if key in _ACTION_TEXTS:
            if isinstance(raw, str):
                values[key] = raw
        elif key in _ACTION_FLAGS:
            values[key] = raw is True
        elif key in _ACTION_MAPS:
            values[key] = {k: v for k, v in raw.items() if isinstance(k, str)} if isinstance(raw, dict) else {}
        elif key == "wipe":
            values[key] = raw if raw in ("schedule", "abort") else None
        elif key == "choices":
            values[key] = _choices(raw)
        elif key == "cases":
            values[key] = _cases(raw, doc, path)
        elif key == "operator":
            values[key] = _operator(raw, doc, (*path, "operator"))
    if "ask" in action:
        ask = values["ask"] = _ask(action["ask"], doc, (*path, "ask"))
        if ask is not None and ask.into is None:
            ask.into = _answer_target(values.setdefault("set", {}))
    return ActionConfig(**values, where=where or _loc(doc, path))


_WHOLE_RESULT = re.compile(r"\{\{-?\s*result\s*-?\}\}")


def _answer_target(assignments: dict[str, Any]) -> str | None:
    """Format 3 keeps a question's answer with the one vocabulary for writing state,
    `set: {state.X: '{{ result }}'}` (the answer is the action's `result`); format 2 wrote
    `ask: {into: state.X}`. The first such entry becomes the question's `into` (taken out of
    `set`), so the answer lands before the cases are chosen, as `into` always did."""
    for target, value in assignments.items():
        if isinstance(value, str) and _WHOLE_RESULT.fullmatch(value.strip()):
            del assignments[target]
            return target
    return None


def _cases(raw: Any, doc: YamlDoc, path: tuple) -> list[CaseConfig]:
    """The cases of an action (those the schema rejected are left out; it reported them)."""
    cases: list[CaseConfig] = []
    for i, item in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(item, dict):
            continue
        at = (*path, "cases", i)
        # A case's place (its condition's line, or `else:`) is its action's place too.
        if isinstance(item.get("if"), str) and isinstance(item.get("then"), dict):
            where = _loc(doc, (*at, "if"))
            cases.append(CaseConfig(item["if"], _action(item["then"], doc, (*at, "then"), where), where, i))
        elif "if" not in item and isinstance(item.get("else"), dict):
            where = _loc(doc, (*at, "else"))
            cases.append(CaseConfig(None, _action(item["else"], doc, (*at, "else"), where), where, i))
    return cases
