"""A model that misbehaves on purpose, the way real (small) models do, for tests.

Each misbehaviour is named; an *unruly answer* names one or several and what the model
meant to say (a `call`, `tool_calls`, `text`), and is made into a model answer from what the
model was offered — the tool specs and the messages of the request — so a misbehaviour can
invent a tool the route does not offer, a value the user never said, or repeat the call the
model made before. The same item and the same request always give the same answer (`seed`).

    Unruly("repeat_call", call={"name": "refund", "arguments": {"order": "A1001", "amount": 30}}, times=6)
    Unruly(["invent_values", "self_confirm"], tool="send_money")

Misbehaviours apply in the order named, each to the answer the one before made:

    repeat_call    the calls `times` times (default 2) in one answer; without a call, the
                   calls of the model's previous answer (again after each result)
    invent_tool    adds a call to a plausible tool the request does not offer (get_weather,
                   send_email, ...), with `args` (default none)
    extra_args     adds arguments the tool does not take (`args`, else note/priority)
    missing_args   drops arguments: `drop`, else the tool's required ones
    wrong_types    every argument a type its schema does not allow ("30" for 30, "yes" for true)
    contradict     the calls, then `undo`, then the calls again (send, cancel, send)
    empty          no text and no call at all
    as_text        the calls written into the text (`format`: tag <tool_call>, fenced, bare JSON)
    self_confirm   consent-like parameters (confirm*, approved, consent, yes, agree*) set to
                   yes, by the model itself; `confirmed: true` where the tool has none
    invent_values  every parameter the call lacks filled with a value the user never said
                   ("Berlin", "John Doe", 1000, a date); without a call, a call of `tool`
    placeholder    string arguments (and missing string parameters) set to placeholder
                   prose: `value`, else such prose found in the system prompt ("not given yet")

Used by golden transcripts (a `model:` item with `unruly:`), by ScriptedModel (an Unruly
object is an entry: it is called with the request), and by the fake OpenAI server
(`FakeOpenAI.queue({"unruly": ...})`).
"""

from __future__ import annotations

import difflib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chatrun.errors import ChatrunError, ModelError
from chatrun.models.base import ModelRequest

Call = dict[str, Any]  # {"name": str, "arguments": dict | str}
Answer = dict[str, Any]  # {"text": str | None, "tool_calls": [Call]}: a scripted model response


@dataclass
class Offered:
    """What the model was offered: its tools' parameter schemas by name, and the
    conversation in OpenAI form (role, content, tool_calls)."""

    tools: dict[str, dict[str, Any]]
    messages: list[dict[str, Any]]

    @classmethod
    def from_specs(cls, specs: list[dict[str, Any]], messages: list[dict[str, Any]]) -> Offered:
        tools = {}
        for spec in specs or []:
            function = spec.get("function") or spec
            if function.get("name"):
                tools[function["name"]] = function.get("parameters") or {}
        return cls(tools, list(messages or []))

    @classmethod
    def from_request(cls, request: ModelRequest) -> Offered:
        return cls.from_specs(request.tools, [m.to_openai() for m in request.messages])

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Offered:
        """From a chat completion request's JSON body (the fake server's)."""
        return cls.from_specs(body.get("tools") or [], body.get("messages") or [])

    def said(self, role: str) -> str:
        """Everything `role` said, one text (content parts joined)."""
        texts = []
        for message in self.messages:
            if message.get("role") == role:
                content = message.get("content")
                if isinstance(content, list):
                    content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
                texts.append(str(content or ""))
        return "\n".join(texts)

    def last_calls(self) -> list[Call]:
        """The tool calls of the model's latest answer that made any."""
        for message in reversed(self.messages):
            calls = message.get("tool_calls") if message.get("role") == "assistant" else None
            if calls:
                return [{"name": c["function"]["name"], "arguments": _parsed(c["function"].get("arguments"))}
                        for c in calls]
        return []

    def parameters(self, tool: str) -> dict[str, Any]:
        return (self.tools.get(tool) or {}).get("properties") or {}

    def required(self, tool: str) -> list[str]:
        return list((self.tools.get(tool) or {}).get("required") or [])


@dataclass(frozen=True)
class Misbehaviour:
    name: str
    does: str  # one line: what the answer then holds
    options: tuple[str, ...]  # the item keys it reads, beyond the base answer
    apply: Callable[[Answer, Offered, dict[str, Any], random.Random], Answer]


BASE_KEYS = ("unruly", "call", "tool_calls", "text", "seed")
FORMATS = ("tag", "fenced", "bare")
CONSENT = re.compile(r"^(confirm\w*|approved?|consent\w*|yes|agree\w*|\w+_confirmed|user_ok)$", re.IGNORECASE)
PLACEHOLDERS = ("not given yet", "not given", "not set yet", "not set", "unknown", "to be asked", "TBD")
INVENTED_TOOLS = ("get_weather", "send_email", "lookup_customer", "cancel_everything", "transfer_to_human")


def _parsed(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments if arguments is not None else {}


def _calls(answer: Answer) -> list[Call]:
    return [dict(c) for c in answer.get("tool_calls") or []]


def _args(call: Call) -> dict[str, Any] | None:
    """The call's arguments as a mapping; None for raw text that is not a JSON object."""
    arguments = _parsed(call.get("arguments"))
    return dict(arguments) if isinstance(arguments, dict) else None


def _with_args(answer: Answer, change: Callable[[str, dict[str, Any]], dict[str, Any]]) -> Answer:
    """The answer with each call's arguments changed (calls with raw, non-object text kept)."""
    calls = []
    for call in _calls(answer):
        arguments = _args(call)
        calls.append(call if arguments is None else {**call, "arguments": change(call["name"], arguments)})
    return {**answer, "tool_calls": calls}


# -- the misbehaviours ----------------------------------------------------------------------------


def repeat_call(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    calls = _calls(answer) or offered.last_calls()
    if not calls:
        raise ModelError("unruly repeat_call has no call to repeat: give it `call:`, or let it follow a model "
                         "answer that called a tool")
    return {**answer, "tool_calls": calls * int(options.get("times", 2))}


def invent_tool(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    candidates = [n for n in INVENTED_TOOLS if n not in offered.tools]
    name = rng.choice(candidates) if candidates else "tool_" + "_".join(sorted(offered.tools))
    return {**answer, "tool_calls": [*_calls(answer), {"name": name, "arguments": dict(options.get("args") or {})}]}


def extra_args(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    def change(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if "args" in options:
            return {**arguments, **options["args"]}
        taken = offered.parameters(tool)
        extra = {"note": "as discussed", "priority": "high", "notify_user": True}
        return {**arguments, **{k: v for k, v in extra.items() if k not in taken}}
    return _with_args(answer, change)


def missing_args(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    def change(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        dropped = options.get("drop") or offered.required(tool) or list(arguments)
        return {k: v for k, v in arguments.items() if k not in dropped}
    return _with_args(answer, change)


def wrong_type(value: Any, schema: dict[str, Any]) -> Any:
    """A value of a type `schema` does not allow, as models send them."""
    kind = schema.get("type") or _json_type(value)  # no schema (e.g. an MCP tool offline): the value's own type
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind in ("integer", "number"):
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "a lot"
    if kind == "boolean":
        return "yes" if value in (True, None) else "no"
    if kind == "string":
        return 12345
    if kind in ("array", "object"):
        return json.dumps(value) if value is not None else "none"
    return value


def _json_type(value: Any) -> str | None:
    kinds = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), None)


def wrong_types(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    def change(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        parameters = offered.parameters(tool)
        names = list(arguments) or offered.required(tool) or list(parameters)
        return {**arguments, **{n: wrong_type(arguments.get(n), parameters.get(n) or {}) for n in names}}
    return _with_args(answer, change)


def contradict(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    calls = _calls(answer)
    return {**answer, "tool_calls": [*calls, dict(options["undo"]), *calls]}


def empty(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    return {"text": None, "tool_calls": []}


def call_text(call: Call, form: str) -> str:
    written = json.dumps({"name": call["name"], "arguments": _parsed(call.get("arguments"))}, ensure_ascii=False)
    if form == "tag":
        return f"<tool_call>\n{written}\n</tool_call>"
    if form == "fenced":
        return f"```json\n{written}\n```"
    return written


def as_text(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    form = options.get("format", "tag")
    parts = [answer["text"]] if answer.get("text") else []
    parts += [call_text(call, form) for call in _calls(answer)]
    return {"text": "\n".join(parts), "tool_calls": []}


def self_confirm(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    def change(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        consent = {n: s for n, s in offered.parameters(tool).items() if CONSENT.match(n)}
        if not consent:
            return {**arguments, "confirmed": True}
        return {**arguments, **{n: "yes" if (s or {}).get("type") == "string" else True for n, s in consent.items()}}
    return _with_args(answer, change)


# Invented values by the words of a parameter's name: what small models fill in when unsure.
INVENTED_BY_WORD: tuple[tuple[frozenset[str], tuple[Any, ...]], ...] = (
    (frozenset({"email", "mail"}), ("john.doe@example.com",)),
    (frozenset({"city", "destination", "place", "location", "origin", "country", "address"}),
     ("Berlin", "Paris", "New York")),
    (frozenset({"date", "day", "when", "checkin", "checkout", "departure", "arrival", "time", "start", "end"}),
     ("2024-01-01", "2025-12-24", "tomorrow")),
    (frozenset({"name", "recipient", "to", "person", "passenger", "customer", "payee", "who", "user"}),
     ("John Doe", "Jane Smith", "Maria")),
    (frozenset({"phone", "mobile"}), ("+1 555 0100",)),
    (frozenset({"order", "id", "reference", "code", "number", "account", "iban", "document", "passport"}),
     ("A0000", "12345")),
)


def invented_value(name: str, schema: dict[str, Any], said: str, rng: random.Random) -> Any:
    """A plausible value for parameter `name` that does not appear in what the user `said`."""
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if schema.get("enum"):
        candidates: tuple[Any, ...] = tuple(schema["enum"])
    elif kind in ("integer", "number"):
        candidates = (1000, 500, 42)
    elif kind == "boolean":
        return True
    elif kind == "array":
        return []
    elif kind == "object":
        return {}
    else:
        words = set(re.split(r"[_\W]+", name.lower()))
        candidates = next((values for keys, values in INVENTED_BY_WORD if keys & words), ("John Doe", "Berlin"))
    unsaid = [v for v in candidates if str(v).lower() not in said.lower()]
    return rng.choice(unsaid or list(candidates))


def invent_values(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    if not _calls(answer):
        tool = options.get("tool") or next((n for n in offered.tools if offered.parameters(n)), None)
        if tool is None:
            raise ModelError("unruly invent_values has no tool to call: give it `call:` or `tool:`, on a route "
                             "that offers a tool with parameters")
        answer = {**answer, "tool_calls": [{"name": tool, "arguments": {}}]}
    said = offered.said("user")

    def change(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        missing = {n: s for n, s in offered.parameters(tool).items() if n not in arguments}
        return {**arguments, **{n: invented_value(n, s or {}, said, rng) for n, s in missing.items()}}
    return _with_args(answer, change)


def placeholder(answer: Answer, offered: Offered, options: dict[str, Any], rng: random.Random) -> Answer:
    value = options.get("value")
    if value is None:
        prompt = offered.said("system").lower()
        value = next((p for p in PLACEHOLDERS if p.lower() in prompt), PLACEHOLDERS[0])

    def change(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        strings = [n for n, s in offered.parameters(tool).items() if (s or {}).get("type") == "string"]
        strings += [n for n, v in arguments.items() if isinstance(v, str) and n not in strings]
        return {**arguments, **dict.fromkeys(strings, value)}
    return _with_args(answer, change)


MISBEHAVIOURS: dict[str, Misbehaviour] = {m.name: m for m in (
    Misbehaviour("repeat_call", "the same call `times` times in one answer (default 2); without a call, "
                 "the calls of the model's previous answer", ("times",), repeat_call),
    Misbehaviour("invent_tool", "a call to a tool the request does not offer", ("args",), invent_tool),
    Misbehaviour("extra_args", "arguments the tool does not take", ("args",), extra_args),
    Misbehaviour("missing_args", "the call without `drop` (default: the tool's required arguments)",
                 ("drop",), missing_args),
    Misbehaviour("wrong_types", "every argument of a type its schema does not allow", (), wrong_types),
    Misbehaviour("contradict", "the calls, then `undo`, then the calls again", ("undo",), contradict),
    Misbehaviour("empty", "no text and no call", (), empty),
    Misbehaviour("as_text", "the calls written as text (`format`: tag, fenced or bare)", ("format",), as_text),
    Misbehaviour("self_confirm", "consent-like arguments set to yes by the model itself", (), self_confirm),
    Misbehaviour("invent_values", "parameters the call lacks filled with values the user never said",
                 ("tool",), invent_values),
    Misbehaviour("placeholder", "string arguments set to placeholder prose (`value`, else the prompt's)",
                 ("value",), placeholder),
)}
KEYS = (*BASE_KEYS, *sorted({o for m in MISBEHAVIOURS.values() for o in m.options}))


# -- an unruly answer -----------------------------------------------------------------------------


def names_of(item: dict[str, Any]) -> list[str]:
    given = item.get("unruly")
    return [given] if isinstance(given, str) else list(given or [])


def problems(item: dict[str, Any]) -> list[tuple[str, str]]:
    """What is wrong with an unruly item, as (key, message) pairs: a transcript reports each at
    its key's line, the fake server and Unruly() raise the first."""
    out = []
    names = names_of(item)
    if not names:
        out.append(("unruly", "`unruly:` names a misbehaviour or a list of them"))
    for name in names:
        if name not in MISBEHAVIOURS:
            close = difflib.get_close_matches(str(name), MISBEHAVIOURS, 1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            out.append(("unruly", f"unknown misbehaviour `{name}`{hint}; known: {', '.join(MISBEHAVIOURS)}"))
    known = [MISBEHAVIOURS[n] for n in names if n in MISBEHAVIOURS]
    for key in item:
        if key not in KEYS:
            out.append((key, f"unknown key `{key}` in an unruly answer; allowed: {', '.join(KEYS)}"))
        elif key not in BASE_KEYS and known and not any(key in m.options for m in known):
            owners = [m.name for m in MISBEHAVIOURS.values() if key in m.options]
            out.append((key, f"`{key}` is an option of {' and '.join(owners)}, which this answer does not name "
                             f"(it names {', '.join(names)})"))
    if "call" in item and "tool_calls" in item:
        out.append(("call", "give `call:` (one call) or `tool_calls:` (several), not both"))
    if "contradict" in names and not isinstance(item.get("undo"), dict):
        out.append(("unruly", "contradict needs `undo:`, the call that takes the first one back"))
    if "format" in item and item["format"] not in FORMATS:
        out.append(("format", f"`format` is {item['format']!r}; use {', '.join(FORMATS)}"))
    if "times" in item and not (isinstance(item["times"], int) and item["times"] >= 1):
        out.append(("times", f"`times` is {item['times']!r}; use a whole number from 1"))
    return out


class Unruly:
    """An unruly model answer: misbehaviours applied, in order, to what the model meant to say.
    Called with a ModelRequest (a ScriptedModel entry), it gives a scripted response."""

    def __init__(self, unruly: str | list[str], *, call: Call | None = None, tool_calls: list[Call] | None = None,
                 text: str | None = None, seed: int = 0, id_prefix: str = "", **options: Any):
        item = {"unruly": unruly, **({"call": call} if call is not None else {}),
                **({"tool_calls": tool_calls} if tool_calls is not None else {}),
                **({"text": text} if text is not None else {}), "seed": seed, **options}
        found = problems(item)
        if found:
            raise ChatrunError(f"unruly answer {item!r}: {found[0][1]}")
        self.item = item
        self.id_prefix = id_prefix  # ids for the calls it makes ("" leaves them to the model)

    @classmethod
    def from_item(cls, item: dict[str, Any], id_prefix: str = "") -> Unruly:
        return cls(**item, id_prefix=id_prefix)

    def answer(self, offered: Offered) -> Answer:
        item = self.item
        calls = [item["call"]] if "call" in item else list(item.get("tool_calls") or [])
        answer: Answer = {"text": item.get("text"), "tool_calls": [dict(c) for c in calls]}
        options = {k: v for k, v in item.items() if k not in BASE_KEYS}
        for index, name in enumerate(names_of(item)):
            rng = random.Random(f"{item.get('seed', 0)}/{index}/{name}")
            answer = MISBEHAVIOURS[name].apply(answer, offered, options, rng)
        if self.id_prefix:
            answer["tool_calls"] = [{**c, "id": f"{self.id_prefix}{i}"} for i, c in enumerate(answer["tool_calls"], 1)]
        return answer

    def __call__(self, request: ModelRequest) -> Answer:
        return self.answer(Offered.from_request(request))

    def __repr__(self) -> str:
        return f"Unruly({self.item!r})"
