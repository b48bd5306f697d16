"""Expectations of a transcript turn: matchers, what a turn is observed to do, and diffs.

A matcher is a plain value (equal), `{contains: TEXT}` (substring) or `{regex: PATTERN}`
(re.search). Inside lists and mappings matchers apply item by item, so an Object
event's data can be `{booking: {regex: "FL-[0-9A-F]{6}"}, destination: Dublin}`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from chatrun import events as ev
from chatrun.engine.pending import APPROVAL_CHOICES
from chatrun.messages import (
    AssistantMessage,
    Attachment,
    BlobReader,
    ContextMessage,
    Message,
    SummaryMessage,
    SystemMessage,
    UserMessage,
)
from chatrun.models.base import ModelRequest

MATCHER_KEYS = ("contains", "regex")
DEFAULT_KEYS = ("route", "stack", "events")  # what --update writes for a turn without `expect:`
SENT_KEYS = ("route", "system", "context", "tools", "messages", "messages_count")
# `events` is what the user's clients receive; these keys expect the other audiences' events.
AUDIENCE_KEYS = {"operators_events": ev.OPERATORS, "backend_events": ev.BACKEND}
EVENT_KEYS = ("events", *AUDIENCE_KEYS)
# A pending item as transcripts read it (in `pending:` and in Pending events): the fields an
# author decides on. `created`, `scope_id`, `call_id`, `requested_by` and `token` are the
# runtime's (they differ from run to run, or are secret) and are left out.
ITEM_FIELDS = ("id", "kind", "tool", "args", "ask", "by", "edit", "due", "schema", "choices")
PENDING_SHORT = ("id", "kind", "tool")  # what --update and /save write under `pending:` of a turn without `expect:`


class _Missing:
    def __repr__(self) -> str:
        return "(not set)"

    def __reduce__(self) -> str:
        return "MISSING"  # one instance, also across processes


MISSING = _Missing()


@dataclass
class Observed:
    """What one turn did, in the shapes expectations are written in."""

    route: str
    stack: list[str]
    events: list[dict[str, Any]]  # [{Type: data}] of the user's events, Stream chunks left out
    visible: dict[str, Any]  # session.visible_state()
    error: str | None  # the text of the Error event the turn ended with
    sent: list[dict[str, Any]] = field(default_factory=list)  # per model call: SENT_KEYS
    memory: list[dict[str, str]] = field(default_factory=list)  # [{role: text}]
    operators_events: list[dict[str, Any]] = field(default_factory=list)  # [{Type: data}] for operators
    backend_events: list[dict[str, Any]] = field(default_factory=list)  # [{Type: data}] for the backend
    # The trajectory: the route the turn started on then each route it moved to, and its tool
    # calls in order ({tool, route, args, result or error}: the history entry's `calls`).
    path: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    # The memory's token counts in words, made only when a `memory:` expectation fails (counting
    # may load tiktoken): a window that evicted other messages than expected is explained by them.
    memory_tokens: Callable[[], str] | None = None
    pending: list[dict[str, Any]] = field(default_factory=list)  # the open items, as item_view shows them
    resolved: dict[str, Any] = field(default_factory=dict)  # {item id: outcome} of the turn's Resolved events
    taken_over: dict[str, Any] | None = None  # {by: name, item: id} while an operator has the conversation
    # The same for what each model call was sent, made only when a `sent:` expectation fails.
    sent_tokens: Callable[[], str] | None = None


def observe(session: Any, events: list[Any], requests: list[ModelRequest], started_on: str | None = None,
            calls: list[dict[str, Any]] | None = None) -> Observed:
    """What the turn did; `started_on`: the route it started on, `calls`: its tool calls (the
    history entry's), both left empty when no turn ran."""
    def plain_for(audience: str) -> list[dict[str, Any]]:
        return [{e.type: event_view(e)} for e in events if e.type != ev.STREAM and e.audience == audience]

    memory = session.memory()
    error = None
    if events and events[-1].type == ev.ERROR:  # the author's detail when the turn failed
        error = str(events[-1].meta.get("detail") or events[-1].data)
    return Observed(
        route=session.route,
        stack=list(session.stack),
        events=plain_for(ev.USER),
        visible=_plain(session.visible_state()),
        error=error,
        sent=[sent_call(r) for r in requests],
        memory=role_list(memory),
        operators_events=plain_for(ev.OPERATORS),
        backend_events=plain_for(ev.BACKEND),
        path=trajectory(started_on, events),
        calls=_plain(calls or []),
        memory_tokens=lambda: token_note(session.token_window(), memory),
        pending=[item_view(item.to_dict()) for item in getattr(session, "pending", [])],
        resolved={e.data["id"]: e.data["outcome"] for e in events if e.type == ev.RESOLVED and e.audience == ev.USER},
        taken_over=takeover_view(getattr(session, "taken_over", None)),
        sent_tokens=lambda: sent_token_note(session.token_counter(), requests),
    )


def item_view(item: dict[str, Any]) -> dict[str, Any]:
    """A pending item (its dict or a Pending event's data) with the ITEM_FIELDS that are set;
    an approval's Approve and Reject choices are left out (a user's confirmation keeps its Yes/No)."""
    out = {k: _plain(item[k]) for k in ITEM_FIELDS if item.get(k) not in (None, [], {})}
    if item.get("kind") == "approval" and out.get("choices") == APPROVAL_CHOICES:
        out.pop("choices", None)
    return out


def takeover_view(taken: dict[str, Any] | None) -> dict[str, Any] | None:
    if taken is None:
        return None
    by = taken.get("by")
    return {"by": by.get("name") if isinstance(by, dict) else by, "item": taken.get("item")}


def event_view(event: Any) -> Any:
    """An event's data as an expectation reads it: a Pending event as its item (item_view)."""
    if event.type == ev.PENDING and isinstance(event.data, dict):
        return item_view(event.data)
    return _plain(event.data)


def trajectory(started_on: str | None, events: list[Any]) -> list[str]:
    """The routes of a turn, in order: the one it started on, then each one it moved to."""
    if started_on is None:
        return []
    moved = [e.data["route"] for e in events if e.type == ev.ROUTE_CHANGED and isinstance(e.data, dict)]
    return [started_on, *moved]


def token_note(window: tuple[Any, int] | None, messages: list[Message]) -> str:
    """"tokens in memory, counted with estimate: 34 + 5 + 5 = 44 of max_tokens 60" (each message,
    oldest first, the system message marked), or "" for a memory that does not count tokens."""
    if window is None:
        return ""
    from chatrun.memory.tokens import counter_label

    counter, limit = window
    counts = [f"{counter(m)} (system)" if isinstance(m, SystemMessage) else str(counter(m)) for m in messages]
    total = sum(counter(m) for m in messages)
    return (f"tokens in memory, counted with {counter_label(counter)}: "
            f"{' + '.join(counts) or '0'} = {total} of max_tokens {limit}")


def sent_token_note(counter: Any, requests: list[ModelRequest]) -> str:
    """"tokens sent, counted with estimate:" then, per model call, its messages' counts (the
    system message marked) and their sum: a prompt that grew or a window that evicted other
    messages than expected is explained by them."""
    from chatrun.memory.tokens import counter_label

    lines = [f"tokens sent, counted with {counter_label(counter)}:"]
    for i, request in enumerate(requests, 1):
        counts = [f"{counter(m)} (system)" if isinstance(m, SystemMessage) else str(counter(m))
                  for m in request.messages]
        total = sum(counter(m) for m in request.messages)
        lines.append(f"  call {i} (route {request.route}): {' + '.join(counts) or '0'} = {total}")
    return "\n".join(lines)


def sent_call(request: ModelRequest) -> dict[str, Any]:
    system = next((m.content for m in request.messages if isinstance(m, SystemMessage)), None)
    context = next((m.content for m in request.messages if isinstance(m, ContextMessage)), None)
    messages = role_list(request.messages, request.blobs)
    return {
        "route": request.route,
        "system": system,
        "context": context,
        "tools": [t["function"]["name"] for t in request.tools],
        "messages": messages,
        "messages_count": len(messages),
    }


def role_list(messages: list[Message], read: BlobReader | None = None) -> list[dict[str, str]]:
    """Messages as [{role: text}], system and context messages left out (`system:` and `context:`
    check those). With
    `read` (what a model call was sent), a user message's attachments read as the content
    parts the model received; else (a memory) as the references it keeps."""
    return [{m.role: message_text(m, read)} for m in messages if not isinstance(m, SystemMessage | ContextMessage)]


def message_text(message: Message, read: BlobReader | None = None) -> str:
    if isinstance(message, UserMessage) and message.attachments and read is not None:
        lines = [message.content] if message.content else []  # no text: the model got the files alone
        return "\n".join([*lines, *(part_line(a, a.content_part(read)) for a in message.attachments)])
    if isinstance(message, SummaryMessage):
        return message.content
    if isinstance(message, AssistantMessage):
        parts = [message.content or ""] + [f"{c.name}({c.arguments})" for c in message.tool_calls]
        return "\n".join(p for p in parts if p)
    return message.text()


def part_line(attachment: Attachment, part: dict[str, Any]) -> str:
    """One content part the model received for an attachment, as a line: its type, the file's
    name, media type and size (`[image_url: parcel.png (image/png, 312 bytes)]`); a file sent as
    a text description reads as that text (`[attached: ...]`)."""
    if part["type"] == "text":
        return str(part["text"])
    size = f", {attachment.size} bytes" if attachment.size else ""
    return f"[{part['type']}: {attachment.name or attachment.ref} ({attachment.media_type}{size})]"


def _plain(value: Any) -> Any:
    """JSON-able copy (what a transcript can hold)."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


# -- matching ---------------------------------------------------------------------------------


def is_matcher(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in MATCHER_KEYS


@lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def match(expected: Any, actual: Any) -> bool:
    if actual is MISSING:  # a state path that does not exist: `null` expects exactly that (not set)
        return expected is None
    if is_matcher(expected):
        kind, arg = next(iter(expected.items()))
        if actual is None:
            return False
        if kind == "contains":
            return str(arg) in _as_text(actual)
        return _regex(str(arg)).search(_as_text(actual)) is not None
    if isinstance(expected, dict):
        return (isinstance(actual, dict) and set(expected) == set(actual)
                and all(match(v, actual[k]) for k, v in expected.items()))
    if isinstance(expected, list):
        return (isinstance(actual, list) and len(expected) == len(actual)
                and all(match(e, a) for e, a in zip(expected, actual, strict=True)))
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    return expected == actual


def reconcile(expected: Any, actual: Any) -> Any:
    """`expected` with every part that matches replaced by the actual value, so a diff of
    the two shows only what differs (a {contains: ..} that holds is not reported)."""
    if match(expected, actual):
        return actual
    if isinstance(expected, dict) and not is_matcher(expected) and isinstance(actual, dict):
        return {k: reconcile(v, actual[k]) if k in actual else v for k, v in expected.items()}
    if isinstance(expected, list) and isinstance(actual, list):
        return [reconcile(e, actual[i]) if i < len(actual) else e for i, e in enumerate(expected)]
    return expected


def refresh(expected: Any, actual: Any, aligned: bool = False) -> Any:
    """What --update writes: the expectation as written where it still holds, else the actual value.
    `aligned`: the top list's actual items do not depend on the expected ones (events, memory; not
    `calls:` or `sent:`, each shaped by the expectation at its index), so they are matched in order."""
    if match(expected, actual):
        return expected
    if isinstance(expected, dict) and not is_matcher(expected) and isinstance(actual, dict) and set(expected) == set(actual):
        return {k: refresh(v, actual[k]) for k, v in expected.items()}
    if isinstance(expected, list) and isinstance(actual, list):
        if aligned and len(expected) != len(actual):
            return _refresh_list(expected, actual)
        return [refresh(expected[i], a) if i < len(expected) else a for i, a in enumerate(actual)]
    return None if actual is MISSING else actual


def _refresh_list(expected: list[Any], actual: list[Any]) -> list[Any]:
    """refresh() of a list of another length: the expected items that still hold are found among
    the actual ones in order (the longest such match), so an event more or less keeps the
    matchers around it; between two found items, as many expected as actual items are refreshed
    pairwise."""
    found = [*_held_in_order(expected, actual), (len(expected), len(actual))]
    out: list[Any] = []
    i0 = j0 = 0
    for i1, j1 in found:
        gap_e, gap_a = expected[i0:i1], actual[j0:j1]
        out += [refresh(e, a) for e, a in zip(gap_e, gap_a, strict=True)] if len(gap_e) == len(gap_a) else gap_a
        if j1 < len(actual):
            out.append(expected[i1])
        i0, j0 = i1 + 1, j1 + 1
    return out


def _held_in_order(expected: list[Any], actual: list[Any]) -> list[tuple[int, int]]:
    """The longest in-order pairing of expected items with actual items they match (LCS)."""
    n, m = len(expected), len(actual)
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best[i][j] = best[i + 1][j + 1] + 1 if match(expected[i], actual[j]) else max(best[i + 1][j], best[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if match(expected[i], actual[j]) and best[i][j] == best[i + 1][j + 1] + 1:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


# -- the actual value, shaped like an expectation ----------------------------------------------------


def resolve(visible: dict[str, Any], path: str) -> Any:
    node: Any = visible
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def shaped(key: str, expected: Any, obs: Observed) -> Any:
    """The observed value for expectation `key`, restricted to what `expected` looks at."""
    if key in ("route", "stack", "memory", "resolved", *EVENT_KEYS):
        return getattr(obs, key)
    if key == "pending":
        return picked_fields(expected, obs.pending)
    if key == "taken_over":
        if isinstance(expected, dict) and obs.taken_over is not None:
            return {k: obs.taken_over[k] for k in expected if k in obs.taken_over}
        return obs.taken_over
    if key == "error":
        return obs.error
    if key == "state":
        return {path: resolve(obs.visible, path) for path in (expected or {})}
    if key == "path":
        return obs.path
    if key == "calls":
        entries = expected if isinstance(expected, list) else []
        return [_shaped_call(call, entries[i] if i < len(entries) else None) for i, call in enumerate(obs.calls)]
    if key == "sent":
        entries = expected if isinstance(expected, list) else []
        keys_used = [k for k in SENT_KEYS if any(k in e for e in entries)] or ["route", "tools", "messages_count"]
        out = []
        for i, call in enumerate(obs.sent):
            keys = [k for k in SENT_KEYS if k in entries[i]] if i < len(entries) else keys_used
            out.append({k: call[k] for k in keys})
        return out
    raise KeyError(key)


def picked_fields(expected: Any, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each item restricted to the fields its expectation names (an item the expectation does
    not list keeps all of its fields, so the diff shows it in full)."""
    entries = expected if isinstance(expected, list) else []
    return [{k: item[k] for k in entries[i] if k in item} | {k: MISSING for k in entries[i] if k not in item}
            if i < len(entries) and isinstance(entries[i], dict) else item for i, item in enumerate(items)]


def _shaped_call(call: dict[str, Any], wanted: Any) -> dict[str, Any]:
    """A tool call as its expectation looks at it: the keys it names (`args`: the arguments it
    names; the call may have more), a call nobody expects as {tool, args}."""
    if not isinstance(wanted, dict) or is_matcher(wanted):
        return {"tool": call.get("tool"), "args": call.get("args", {})}
    out = {}
    for key, value in wanted.items():
        actual = call.get(key, MISSING)
        if key == "args" and isinstance(value, dict) and not is_matcher(value) and isinstance(actual, dict):
            actual = {name: actual.get(name, MISSING) for name in value}
        out[key] = actual
    return out


# -- comparing -----------------------------------------------------------------------------------------


@dataclass
class Mismatch:
    key: str
    message: str
    expected: Any = None
    actual: Any = None
    note: str = ""  # said after the diff (the token counts of a `memory:` mismatch)

    def format(self, indent: str = "    ") -> str:
        lines = [self.message]
        if self.expected is not None or self.actual is not None:
            lines += diff_lines(self.expected, self.actual)
        if self.note:
            lines += self.note.splitlines()
        return "\n".join(indent + line if i else line for i, line in enumerate(lines))


def compare(expect: dict[str, Any] | None, obs: Observed) -> list[Mismatch]:
    expect = expect or {}
    out: list[Mismatch] = []
    if obs.error is not None and "error" not in expect:
        out.append(Mismatch("error", f"the turn ended in an Error the transcript does not expect: {obs.error}"))
    for key, expected in expect.items():
        if key == "judge":  # scored by a judge model (chatrun.transcripts.judge)
            continue
        if key == "error":
            out += _error_mismatches(expected, obs.error)
            continue
        actual = shaped(key, expected, obs)
        if not match(expected, actual):
            note = _token_note(key, obs)
            out.append(Mismatch(key, _headline(key, expected, actual),
                                {key: reconcile(expected, actual)}, {key: actual}, note))
    return out


def _error_mismatches(expected: Any, error: str | None) -> list[Mismatch]:
    """`error:` is true (the turn ends in an Error), false (it does not) or a matcher on the
    Error's text."""
    if expected is False:
        return [] if error is None else [Mismatch("error", f"expected the turn not to end in an Error, but it did: "
                                                  f"{error}", {"error": False}, {"error": error})]
    if error is None:
        return [Mismatch("error", "expected the turn to end in an Error, but it succeeded",
                         {"error": expected}, {"error": None})]
    if expected is not True and not match(expected, error):
        return [Mismatch("error", "the Error text differs", {"error": expected}, {"error": error})]
    return []


def _token_note(key: str, obs: Observed) -> str:
    """The token counts said after a failing `memory:` or `sent:` diff."""
    made = {"memory": obs.memory_tokens, "sent": obs.sent_tokens}.get(key)
    return made() if made is not None else ""


# Live runs (`chatrun test --live`): what a real model says differs from run to run; what the
# bot does with it should not. Compared: route, stack, state, error or not, the trajectory, the
# humans in the loop (what waits, what was decided, who has the conversation), and the events'
# types in order, with the data of the events the bot makes itself (not the model's text).
LIVE_KEYS = ("route", "stack", "state", "error", "path", "calls", "pending", "resolved", "taken_over", *EVENT_KEYS)
MODEL_TEXT_EVENTS = (ev.MESSAGE, ev.THINKING, ev.CONSOLE, ev.ERROR)


def live_events(events: Any) -> Any:
    if not isinstance(events, list):
        return events
    out = []
    for e in events:
        if isinstance(e, dict) and len(e) == 1:
            kind = next(iter(e))
            out.append({kind: "..."} if kind in MODEL_TEXT_EVENTS else e)
        else:
            out.append(e)
    return out


def compare_live(expect: dict[str, Any] | None, obs: Observed) -> list[Mismatch]:
    """compare() for a live run: the keys of LIVE_KEYS, the model's text left out."""
    expect = {k: v for k, v in (expect or {}).items() if k in LIVE_KEYS}
    if expect.get("error", False) is not False:  # an Error's text is the model's: only whether there is one
        expect["error"] = True
    for key in EVENT_KEYS:
        if key in expect:
            expect[key] = live_events(expect[key])
            obs = dataclasses.replace(obs, **{key: live_events(getattr(obs, key))})
    return compare(expect, obs)


def _headline(key: str, expected: Any, actual: Any) -> str:
    if key in ("sent", "memory", "calls", "path", *EVENT_KEYS) and isinstance(actual, list) \
            and isinstance(expected, list) and len(expected) != len(actual):
        what = {"sent": "model calls", "memory": "messages in memory", "operators_events": "operators events",
                "backend_events": "backend events", "calls": "tool calls", "path": "routes"}.get(key, "events")
        return f"{key}: expected {len(expected)} {what}, got {len(actual)}"
    return f"{key} differs"


def updated(expect: dict[str, Any] | None, obs: Observed) -> dict[str, Any]:
    """The `expect:` block --update writes: the keys the author used, refreshed (matchers that
    still hold are kept), and `error:` added or removed to agree with the turn."""
    if not expect:
        out = {k: shaped(k, None, obs) for k in DEFAULT_KEYS}
        out |= {k: shaped(k, None, obs) for k in AUDIENCE_KEYS if shaped(k, None, obs)}  # only when sent
        if obs.pending:  # something waits: which items (the Pending events say the rest)
            out["pending"] = [{k: item[k] for k in PENDING_SHORT if k in item} for item in obs.pending]
        if obs.error is not None:
            out["error"] = obs.error
        return out
    out = {}
    for key, expected in expect.items():
        if key == "judge":  # the author's criteria, scored by a judge: nothing a run observes rewrites them
            out[key] = expected
            continue
        if key == "error":
            if obs.error is not None:
                out[key] = expected if expected is True or match(expected, obs.error) else obs.error
            elif expected is False:  # it still holds
                out[key] = False
            continue
        out[key] = refresh(expected, shaped(key, expected, obs), aligned=key in (*EVENT_KEYS, "memory"))
    if obs.error is not None and "error" not in out:
        out["error"] = obs.error
    if not out:  # only `error:` was expected and the turn now succeeds: expect what it did instead
        return updated(None, obs)
    return out


# -- diffs -----------------------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block style, except short lists of scalars on one line ([main_menu, flight])."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flat = all(isinstance(v, (str, int, float, bool)) or v is None for v in data) \
        and sum(len(str(v)) + 2 for v in data) < 70
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


def unseen(char: str) -> bool:
    """A character a terminal shows as a space or not at all: a no-break space (U+00A0, which Babel
    puts before the euro sign in German; U+202F, its French thousands separator), a zero-width
    space, a soft hyphen."""
    return char != " " and unicodedata.category(char) in ("Zs", "Zl", "Zp", "Cf")


def _escaped(char: str) -> str:
    return f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}"


def escape_unseen(text: str) -> str:
    """`text` with each character a terminal does not show written as its escape (backslash
    u00a0), which reads back as the character inside a double-quoted YAML scalar."""
    return "".join(_escaped(c) if unseen(c) else c for c in text) if any(unseen(c) for c in text) else text


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    if any(unseen(c) for c in data):  # double-quoted, so dump() can write them as escapes
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    # Multi-line text (system prompts) as a literal block: one diff line per line of text.
    style = "|" if "\n" in data.strip("\n") and not any(line != line.rstrip() for line in data.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)


def dump(value: Any) -> str:
    """`value` as YAML, what a terminal would not show written as escapes (backslash u00a0, as a
    transcript can say it): else a diff shows two lines that look the same. The strings holding
    them are double-quoted (_represent_str), where an escape reads back as the character."""
    text = yaml.dump(_printable(value), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return escape_unseen(text)


def _printable(value: Any) -> Any:
    if value is MISSING:
        return "(not set)"
    if isinstance(value, dict):
        return {k: _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def diff_lines(expected: Any, actual: Any) -> list[str]:
    """A unified diff, expected against actual, of the two values as YAML."""
    a = dump(expected).splitlines()
    b = dump(actual).splitlines()
    return list(difflib.unified_diff(a, b, "expected", "actual", lineterm="", n=3))
