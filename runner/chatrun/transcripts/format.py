"""Golden transcripts: loading and validating the YAML, keeping the line of every turn.

A transcript is a conversation with a bot: per turn the user's input, what the model
answers call by call (`model:`), and what must happen (`expect:`). The key names are
fixed by schemas/transcript.schema.json.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from chatrun.definition.schemas import Violation, inline_refs, load_schema, properties, violation
from chatrun.definition.sources import dotted, file_kind, suggest, wrong_file
from chatrun.definition.yamlpos import YamlDoc, load_yaml
from chatrun.engine.clock import parse_duration
from chatrun.errors import BotError, ChatrunError, Diagnostic

SCHEMA = "transcript.schema.json"


@dataclass
class TurnSpec:
    """One turn of a transcript. `line` is the line of the turn's first key (1-based)."""

    index: int  # 1-based
    line: int
    user: str | None = None
    data: dict[str, Any] | None = None
    model: list[dict[str, Any]] = field(default_factory=list)
    mocks: list[dict[str, Any]] = field(default_factory=list)
    expect: dict[str, Any] | None = None
    expect_line: int = 0
    judged: list[dict[str, Any]] = field(default_factory=list)  # recorded verdicts (chatrun.transcripts.judge)
    clock: str | dict[str, Any] | None = None  # the turn's `clock:`: an instant, or {at?, advance?}
    mock_lines: list[int] = field(default_factory=list)  # the line of each of `mocks` (their messages name it)
    # A third party's step instead of the user's message: {KEY: value} with KEY one of DECISION_KEYS
    decision: dict[str, Any] | None = None
    acting: dict[str, Any] | str | None = None  # `as:`: who sends this turn (a principal, or "backend")
    upgrade: str | None = None  # `upgrade:`: the bot version the session moves to before this turn
    attach: list[AttachSpec] = field(default_factory=list)  # `attach:`: files sent with the message

    @property
    def input(self) -> str | dict[str, Any]:
        return self.data if self.data is not None else (self.user or "")

    @property
    def said(self) -> str | dict[str, Any] | None:
        """What the turn sends in words, for reports: the user's input or the decision step."""
        return self.decision if self.decision is not None else self.input


@dataclass(frozen=True)
class AttachSpec:
    """A file a turn attaches (`attach:`): its path (resolved beside the transcript), media type
    and the name the model is told."""

    path: Path
    media_type: str
    name: str


# The steps a third party takes in a turn (docs/transcripts.md, "Humans in the loop")
DECISION_KEYS = ("approve", "reject", "answer", "operator", "expire")
STEP_SHAPES = {  # what a step key takes, for the message when it is written wrong
    "approve": "an item id (approve: p1) or {item, args, reason}",
    "reject": "an item id (reject: p1) or {item, reason}",
    "answer": "{item: ID, value: ANSWER}",
    "operator": "take, force, release, {take: NOTE}, {force: NOTE}, {say: TEXT} or {release: ROUTE}",
    "expire": "true (let the items due by the turn's clock time out)",
    "as": "backend, or a principal {name: NAME, roles: [...]}",
}


@dataclass
class Transcript:
    file: str  # as given (relative paths stay relative: diagnostics and names use it)
    bot: str  # the `bot:` value as written
    turns: list[TurnSpec]
    route: str | None = None
    state: dict[str, Any] | None = None
    roles: list[str] | None = None
    description: str = ""
    mocks: list[dict[str, Any]] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # line of each top-level key
    judge: dict[str, Any] | None = None  # the judge's settings (model, threshold, conversation)
    refused: Any = None  # the start must be refused: True or a matcher on the error (None: not expected)
    principal: dict[str, Any] | None = None  # who is signed in (name, roles, claims): bound arguments read it
    clock: str | dict[str, Any] | None = None  # `clock:`: the pinned instant, or {at, advance}
    mock_lines: list[int] = field(default_factory=list)  # the line of each of `mocks`
    tokenizer: str | None = None  # `tokenizer:`: the pinned token counter (estimate or an encoding)
    state_lines: dict[str, int] = field(default_factory=dict)  # the line of each key of `state:`
    version: str | None = None  # `version:`: the bot version the conversation starts on
    locale: str | None = None  # `locale:`: what the client asks for (docs/i18n.md); `chatrun test --locale` overrides
    success: dict[str, Any] | None = None  # `success:`: criteria on the whole conversation (a scenario's)
    success_lines: dict[str, int] = field(default_factory=dict)  # the line of each key of `success:`
    user_memory: dict[str, Any] | None = None  # `user_memory:`: what the bot remembered of the principal before

    @property
    def name(self) -> str:
        return self.file

    @property
    def bot_path(self) -> Path:
        return (Path(self.file).parent / self.bot).resolve()

    def where(self, turn: TurnSpec) -> str:
        return f"{self.file}:{turn.line}"


@lru_cache(maxsize=1)
def validator() -> Draft202012Validator:
    schema = load_schema(SCHEMA)
    # $refs inlined: resolving them is most of jsonschema's time (ours never recurse).
    return Draft202012Validator(inline_refs(schema, schema["$defs"]), format_checker=Draft202012Validator.FORMAT_CHECKER)




def is_transcript_text(text: str) -> bool:
    """Cheap test used by discovery: a YAML mapping with a top-level `turns:` (or `refused:`) key."""
    return any(line.startswith(("turns:", "refused:")) for line in text.splitlines())


def check_replaceable(path: Path) -> None:
    """A new file or a transcript is written; any other file is refused: `/save bots/x/bot.yaml`
    (or `chatrun record -o` it), one slip of the hand, would otherwise replace the bot itself with
    a transcript. Every writer of a whole transcript asks it first."""
    if path.is_dir():
        raise ChatrunError(f"{path} is a folder; name a file in it ({path / 'NAME.yaml'})")
    if path.exists() and not is_transcript_text(path.read_bytes().decode("utf-8", errors="replace")):
        raise ChatrunError(f"{path} holds no transcript (no `turns:`); name a new file, or a transcript to replace")


def load_transcript(path: str | Path) -> Transcript:
    """Read and validate one transcript. Raises BotError with every problem, each at its line."""
    file = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise BotError([Diagnostic(file, 0, 0, "error", f"cannot read transcript: {exc.strerror or exc}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BotError([_not_utf8(file, raw, exc)]) from None
    doc = load_yaml(text, file)
    diagnostics = list(doc.diagnostics)
    other = wrong_file(file, doc.data, "transcript") if not diagnostics else None
    if other is not None:  # a bot or scenario given for a transcript: not its schema errors
        raise BotError([other])
    if doc.data is not None and not diagnostics:
        diagnostics += schema_diagnostics(doc)
    if doc.data is not None and not diagnostics:
        diagnostics += (regex_diagnostics(doc) + clock_diagnostics(doc) + tokenizer_diagnostics(doc)
                        + upgrade_diagnostics(doc) + attach_diagnostics(doc) + unruly_diagnostics(doc)
                        + refused_diagnostics(doc))
    elif doc.data is None and not diagnostics:
        diagnostics.append(Diagnostic(file, 1, 1, "error", "the transcript is empty; it needs `bot:` and `turns:`"))
    if diagnostics:
        raise BotError(sorted(diagnostics, key=lambda d: (d.line, d.col, d.message)))
    return _build(doc)


def _not_utf8(file: str, raw: bytes, exc: UnicodeDecodeError) -> Diagnostic:
    before = raw[:exc.start]
    line = before.count(b"\n") + 1
    col = len(before) - (before.rfind(b"\n") + 1) + 1
    return Diagnostic(file, line, col, "error",
                      f"the transcript is not valid UTF-8 (byte 0x{raw[exc.start]:02x}); save it as UTF-8")


def regex_diagnostics(doc: YamlDoc) -> list[Diagnostic]:
    """Every `{regex: PATTERN}` in the turns' `expect:` blocks compiled now, so a bad pattern
    is reported at its line instead of failing with re.error in the middle of a run."""
    out = []
    for i, turn in enumerate(doc.data.get("turns") or []):
        if isinstance(turn, dict) and "expect" in turn:
            for at, pattern in _regexes(turn["expect"], ("turns", i, "expect")):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    pos = doc.pos(at)
                    out.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                          f"invalid regex {pattern!r} in `{dotted(at[:-1])}`: {exc}", dotted(at)))
    return out


def clock_diagnostics(doc: YamlDoc) -> list[Diagnostic]:
    """The instants and durations of `clock:` (top level and turns) read now, at their lines."""
    settings: list[tuple[tuple[Any, ...], Any]] = [(("clock",), doc.data.get("clock"))]
    settings += [(("turns", i, "clock"), turn.get("clock")) for i, turn in enumerate(doc.data.get("turns") or [])
                 if isinstance(turn, dict)]
    out = []
    for at, setting in settings:
        parts = {"at": setting} if isinstance(setting, str) else setting if isinstance(setting, dict) else {}
        for key, value in parts.items():
            where = at if isinstance(setting, str) else (*at, key)
            try:
                parse_duration(value) if key == "advance" else datetime.fromisoformat(str(value))
            except ValueError:
                pos = doc.pos(where)
                wanted = ("a duration such as 30s, 5m, 1h30m or 1d" if key == "advance"
                          else "an ISO date-time such as 2026-11-25T09:00:00+01:00")
                out.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                      f"`{dotted(where)}` is {value!r}, not {wanted}", dotted(where)))
    return out


def tokenizer_diagnostics(doc: YamlDoc) -> list[Diagnostic]:
    """`tokenizer:` names a counter tiktoken defines (or `estimate`): a typo is caught at its
    line, not in the middle of the replay."""
    name = doc.data.get("tokenizer")
    if name is None:
        return []
    from chatrun.memory.tokens import known_tokenizers  # imports tiktoken: only when pinned

    known = known_tokenizers()
    if name in known:
        return []
    pos = doc.pos(("tokenizer",))
    return [Diagnostic(doc.file, pos.line, pos.col, "error",
                       f"unknown tokenizer `{name}`{suggest(name, known)} (`estimate` counts the same on every "
                       f"machine; tiktoken's encodings: {', '.join(known[1:])})", "tokenizer")]


def upgrade_diagnostics(doc: YamlDoc) -> list[Diagnostic]:
    """A turn's `upgrade:` moves the conversation from the version it started on, which the
    transcript must then name (`version:`): the start is what the upgrade is tested against."""
    if "version" in doc.data:
        return []
    out = []
    for i, turn in enumerate(doc.data.get("turns") or []):
        if isinstance(turn, dict) and "upgrade" in turn:
            pos = doc.pos(("turns", i, "upgrade"))
            out.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                  "`upgrade:` needs the transcript's top-level `version:` (the version the "
                                  "conversation starts on)", dotted(("turns", i, "upgrade"))))
    return out


_UNRUN_AFTER_REFUSED = {  # a key beside `refused:` -> what a refused start leaves unchecked
    "turns": "`turns:` never run after a refused start (`refused:`): remove them, or `refused:` to test "
             "a conversation that starts",
    "success": "`success:` is never checked after a refused start (`refused:`): no conversation happens; "
               "remove it, or `refused:` to test a conversation that starts",
}


def refused_diagnostics(doc: YamlDoc) -> list[Diagnostic]:
    """`refused:` expects the start to be refused, so no turn runs: `turns:` beside it would pass
    unrun whatever they expect, and `success:` unchecked whatever it asks."""
    if "refused" not in doc.data:
        return []
    out = []
    for key, message in _UNRUN_AFTER_REFUSED.items():
        if key in doc.data:
            pos = doc.pos((key,))
            out.append(Diagnostic(doc.file, pos.line, pos.col, "error", message, key))
    return out


def attach_spec(file: str, item: str | dict[str, Any]) -> AttachSpec:
    """An `attach:` item: a path relative to the transcript, or {file, media_type?, name?}; the
    media type defaults to the one the file name's extension says (None: unknown)."""
    import mimetypes

    given = {"file": item} if isinstance(item, str) else item
    path = (Path(file).parent / given["file"]).resolve()
    media_type = given.get("media_type") or mimetypes.guess_type(path.name)[0] or ""
    return AttachSpec(path, media_type.lower(), given.get("name", Path(given["file"]).name))


def attach_diagnostics(doc: YamlDoc) -> list[Diagnostic]:
    """`attach:` files exist and have a media type, and go with a message (`user:`/`data:`),
    reported at their lines before anything runs."""
    out = []
    for i, turn in enumerate(doc.data.get("turns") or []):
        if not isinstance(turn, dict) or "attach" not in turn:
            continue
        if not ("user" in turn or "data" in turn):
            pos = doc.pos(("turns", i, "attach"))
            out.append(Diagnostic(doc.file, pos.line, pos.col, "error", "`attach:` goes with a message "
                                  "(`user:` or `data:`), not a third party's step", dotted(("turns", i, "attach"))))
        for j, item in enumerate(turn["attach"]):
            at = ("turns", i, "attach", j)
            spec = attach_spec(doc.file, item)
            written = item if isinstance(item, str) else item["file"]
            problem = (f"{written} is a folder ({spec.path}); attach a file" if spec.path.is_dir()
                       else f"no file {written} beside the transcript ({spec.path})" if not spec.path.is_file()
                       else f"cannot tell the media type of {spec.path.name} from its extension; "
                            "give it: {file: ..., media_type: image/png}" if not spec.media_type else None)
            if problem:
                pos = doc.pos(at)
                out.append(Diagnostic(doc.file, pos.line, pos.col, "error", f"`{dotted(at)}`: {problem}", dotted(at)))
    return out


def unruly_diagnostics(doc: YamlDoc) -> list[Diagnostic]:
    """The rules of an `unruly:` answer the schema cannot say (an option of a misbehaviour the
    answer does not name, contradict without `undo`), each at its key's line."""
    from chatrun.testing.unruly import problems

    out = []
    for i, turn in enumerate(doc.data.get("turns") or []):
        for j, item in enumerate(turn.get("model") or [] if isinstance(turn, dict) else []):
            if not (isinstance(item, dict) and "unruly" in item):
                continue
            for key, message in problems(item):
                at = ("turns", i, "model", j, key)
                pos = doc.pos(at)
                out.append(Diagnostic(doc.file, pos.line, pos.col, "error", f"`{dotted(at[:-1])}`: {message}",
                                      dotted(at)))
    return out


def _regexes(node: Any, at: tuple) -> list[tuple[tuple, str]]:
    # The same test as expect.is_matcher: a one-key mapping {regex: ..} anywhere is a matcher.
    if isinstance(node, dict):
        if len(node) == 1 and "regex" in node:
            return [((*at, "regex"), str(node["regex"]))]
        return [found for k, v in node.items() for found in _regexes(v, (*at, k))]
    if isinstance(node, list):
        return [found for i, v in enumerate(node) for found in _regexes(v, (*at, i))]
    return []


def _build(doc: YamlDoc) -> Transcript:
    data = doc.data
    turns = []
    for i, raw in enumerate(data.get("turns") or []):
        expect = raw.get("expect")
        turns.append(TurnSpec(
            index=i + 1,
            line=doc.pos(("turns", i)).line,
            user=raw.get("user"),
            data=raw.get("data"),
            model=list(raw.get("model") or []),
            mocks=list(raw.get("mocks") or []),
            expect=expect if expect is not None else None,
            expect_line=doc.pos(("turns", i, "expect")).line if "expect" in raw else 0,
            judged=list(raw.get("judged") or []),
            clock=raw.get("clock"),
            mock_lines=_lines(doc, ("turns", i, "mocks"), raw.get("mocks")),
            decision=next(({k: raw[k]} for k in DECISION_KEYS if k in raw), None),
            acting=raw.get("as"),
            upgrade=version_label(raw.get("upgrade")),
            attach=[attach_spec(doc.file, item) for item in raw.get("attach") or []],
        ))
    return Transcript(doc.file, data["bot"], turns, data.get("route"), data.get("state"),
                      data.get("roles"), data.get("description", ""), list(data.get("mocks") or []),
                      {key: doc.pos((key,)).line for key in data}, data.get("judge"), data.get("refused"),
                      data.get("principal"), data.get("clock"), _lines(doc, ("mocks",), data.get("mocks")),
                      data.get("tokenizer"), _key_lines(doc, ("state",), data.get("state")),
                      version_label(data.get("version")), data.get("locale"), data.get("success"),
                      _key_lines(doc, ("success",), data.get("success")), data.get("user_memory"))


def version_label(value: Any) -> str | None:
    """A version as written (`version: 1` reads as an int; folder labels are text)."""
    return None if value is None else str(value)


def _key_lines(doc: YamlDoc, at: tuple[Any, ...], mapping: Any) -> dict[str, int]:
    """The line of each key of the mapping at `at`."""
    return {k: doc.pos((*at, k)).line for k in mapping} if isinstance(mapping, dict) else {}


def _lines(doc: YamlDoc, at: tuple[Any, ...], items: Any) -> list[int]:
    """The line of each item of the list at `at`."""
    return [doc.pos((*at, i)).line for i in range(len(items))] if isinstance(items, list) else []


def schema_diagnostics(doc: YamlDoc, check: Draft202012Validator | None = None) -> list[Diagnostic]:
    """What the schema (the transcript's, else `check`: a scenario's) says of `doc`, in the
    words of a bot author, each at its line, in the order of the file."""
    out = []
    for raw_error in (check or validator()).iter_errors(doc.data):
        error = _specific(violation(raw_error))
        path = tuple(error.absolute_path)
        at = path
        message = _message(error, path)
        if "propertyNames" in error.schema_path:
            at = (*path, error.instance)
        if error.validator == "additionalProperties":
            extras = [k for k in error.instance if k not in properties(error.schema)]
            if extras:
                at = (*path, extras[0])
        if error.validator == "dependentRequired":
            at = (*path, next(k for k in error.validator_value if k in error.instance))
        pos = doc.pos(at)
        out.append(Diagnostic(doc.file, pos.line, pos.col, "error", message, dotted(at)))
    return sorted(dict.fromkeys(out), key=lambda d: (d.line, d.col))


def _step(path: tuple) -> str | None:
    """The step key (STEP_SHAPES) a path is in: `turns[0].approve...` -> approve."""
    return path[2] if len(path) >= 3 and path[0] == "turns" and path[2] in STEP_SHAPES else None


def _specific(error: Violation) -> Violation:
    while error.validator in ("oneOf", "anyOf") and error.context:
        if _step(tuple(error.path)) and len(error.path) == 3:
            break
        if error.path and error.path[-1] == "error" or _turn_input(error) or _response(error) or _unruly(error):
            break
        error = violation(best_match(_of_the_instances_type(error.context)))
    return error


def _of_the_instances_type(context: list) -> list:
    """The errors of the alternatives a value's type fits (`{file: x, media_type: 5}` is told
    about `media_type`, not that it is not a string); all of them when it fits none."""
    fitting = [e for e in context if not (e.validator == "type" and not e.relative_path)]
    return fitting or context


def _response(error: Violation) -> bool:
    return error.validator == "anyOf" and "model" in error.path and isinstance(error.instance, dict)


def _unruly(error: Violation) -> bool:
    """An error in a response's `unruly:` value (turns[i].model[j].unruly[k])."""
    path = tuple(error.path)
    return len(path) >= 5 and path[2] == "model" and path[4] == "unruly"


def _unruly_message(error: Violation, path: tuple) -> str:
    from chatrun.testing.unruly import MISBEHAVIOURS, problems

    value = error.instance
    given = value if isinstance(value, list) else [value]
    wrong = [v for v in given if not isinstance(v, str) or v not in MISBEHAVIOURS]
    if len(path) == 5 and wrong and all(isinstance(v, str) for v in wrong):
        return f"`{dotted(path)}`: {problems({'unruly': given})[0][1]}"
    return (f"`{dotted(path)}` must name a misbehaviour or a list of them ({', '.join(MISBEHAVIOURS)}), "
            f"not {value!r}")


def _turn_input(error: Violation) -> bool:
    return error.validator == "oneOf" and isinstance(error.instance, dict) and "expect" in properties(error.schema)


_TYPE_WORDS = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "empty"}


def _type_words(types: Any) -> str:
    return " or ".join(_TYPE_WORDS.get(t, str(t)) for t in (types if isinstance(types, list) else [types]))


def _json_type(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _key_name_message(error: Violation, where: str) -> str:
    """A mapping's key the schema's `propertyNames` refuses: a role of `memory:` or `sent.messages`
    (an enum), a state path (`state:`), or a name (`user_memory:`)."""
    if error.validator == "enum":
        roles = [str(r) for r in error.validator_value]
        return f"`{error.instance}` {where} is not a role: {', '.join(roles[:-1])} or {roles[-1]}"
    if str(error.validator_value).startswith("^(state|scope)"):
        return f"`{error.instance}` {where} is not a state path: start it with `state.` or `scope.`"
    return f"`{error.instance}` {where} is not a name: letters, digits and `_`, not starting with a digit"


def _message(error: Violation, path: tuple) -> str:
    where = f"in `{dotted(path)}`" if path else "at the top level"
    kind = error.validator
    step = _step(path)
    if step and kind != "additionalProperties" or step and len(path) == 3:
        return f"`{dotted(path[:3])}` must be {STEP_SHAPES[step]}"
    if kind == "additionalProperties":
        allowed = sorted(properties(error.schema))
        extras = [k for k in error.instance if k not in allowed]
        return f"unknown key `{', '.join(map(str, extras))}` {where}; allowed: {', '.join(allowed)}"
    if kind == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return f"missing required key `{', '.join(missing)}` {where}"
    if _turn_input(error):
        given = [k for k in ("user", "data", *DECISION_KEYS) if k in error.instance]
        return (f"turn {where} has {'both ' if len(given) == 2 else ''}{' and '.join(f'`{k}:`' for k in given)}; "
                "give one" if len(given) > 1
                else f"turn {where} needs `user:` (a message), `data:` (structured input) or a third party's step "
                f"({', '.join(f'`{k}:`' for k in DECISION_KEYS)})")
    if kind == "anyOf" and path and path[-1] == "error":
        return (f"`{dotted(path)}` must be true, false or a matcher on the Error text (a string, {{contains: ..}}, "
                "{regex: ..}); empty (`error:` alone) says neither")
    if _unruly(error):
        return _unruly_message(error, path)
    if _response(error):
        return f"a model response {where} needs `text`, `tool_calls`, `chunks`, `error` or `unruly`"
    if kind == "dependentRequired":  # one error per key: each names them all, and the same words are said once
        keys = [k for k in error.validator_value if k in error.instance]
        one = len(keys) == 1
        return (f"{', '.join(f'`{k}`' for k in keys)} {where} {'goes' if one else 'go'} with `unruly:` "
                f"({'it says' if one else 'they say'} how the model misbehaves; "
                "docs/transcripts.md, \"A model that misbehaves\")")
    if "propertyNames" in error.schema_path:
        return _key_name_message(error, where)
    if kind == "type" and error.validator_value == "string" and isinstance(error.instance, (bool, int, float)):
        return (f"`{dotted(path)}` must be text, but YAML read {error.instance!r}; quote it "
                f"(e.g. \"yes\", \"no\", \"1.0\")")
    if kind == "type":
        return (f"`{dotted(path) or 'the transcript'}` must be {_type_words(error.validator_value)}, "
                f"not {_type_words(_json_type(error.instance))}")
    return f"`{dotted(path) or 'the transcript'}`: {error.message}"



# -- discovery -----------------------------------------------------------------------------

# A bot's transcripts folders (a bot in several versions has one per version, docs/versions.md)
DEFAULT_FOLDERS = ("bots/*/transcripts", "bots/*/versions/*/transcripts")


def discover(paths: list[str] | tuple[str, ...], root: Path | None = None) -> list[str]:
    """Transcript files: the given files, the transcripts under given directories
    (looks_like_transcript), or (no paths) those under the DEFAULT_FOLDERS of `root` (the current
    directory), found the same way: `.yml` and subfolders too."""
    root = root or Path.cwd()
    if not paths:
        folders = [p for pattern in DEFAULT_FOLDERS for p in root.glob(pattern) if p.is_dir()]
        return [_rel(p, root) for p in sorted(p for folder in folders for p in transcripts_under(folder))]
    found: list[str] = []
    for given in paths:
        p = Path(given)
        found += [str(c) for c in transcripts_under(p)] if p.is_dir() else [given]
    return list(dict.fromkeys(found))


def transcripts_under(folder: Path, check: Callable[[Path], object] | None = None) -> list[Path]:
    """The YAML files under `folder` (`.yaml`, `.yml`, in subfolders too) discovery runs. `check`
    is called with each file before it is read (`chatrun mcp`: it raises for one outside its folders)."""
    found = []
    for candidate in sorted([*folder.rglob("*.yaml"), *folder.rglob("*.yml")]):
        if check is not None:
            check(candidate)
        if looks_like_transcript(candidate):
            found.append(candidate)
    return found


def looks_like_transcript(path: Path) -> bool:
    """Whether discovery (`chatrun test DIR`, the pytest plugin) runs a YAML file as a transcript:
    a top-level `turns:` (or `refused:`) however it is written (quoted, flow style), and, in a
    folder named `transcripts`, also a file with `bot:` or one that does not parse: a misspelled
    `turns:` or a syntax error fails there at its line instead of being skipped unrun."""
    import yaml

    # errors="replace": a transcript that is not UTF-8 is still found, and load_transcript says why it fails.
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return False
    if is_transcript_text(text):
        return True
    in_folder = "transcripts" in path.parent.parts
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return in_folder
    return file_kind(data) == "transcript" or in_folder and isinstance(data, dict) and "bot" in data


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
