"""The request bodies and errors of the OpenAI-compatible API (/v1), as JSON Schema: shown in
/openapi.json and checked on every request, so what is documented is what is enforced.

The schemas hold what chatrun reads; every other field an OpenAI SDK sends (temperature,
metadata, store, ...) is allowed and ignored: the bot's own model settings apply.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import Any, NamedTuple

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

# Roles, item and part types are strings here: the handler says which it supports, and why.
_TEXT_PART = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"type": "string", "description": "text, input_text or output_text"},
                   "text": {"type": "string"}},
}
_CONTENT = {"anyOf": [{"type": "string"}, {"type": "null"},
                      {"type": "array", "items": {"anyOf": [{"type": "string"}, _TEXT_PART]}}]}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "description": "user or assistant; system and developer messages are "
                                                  "ignored (the bot has its own prompts)"},
        "content": _CONTENT,
        "type": {"type": "string", "description": "message (the only item type supported)"},
    },
}
_MODEL = {"type": "string", "minLength": 1, "description": "a served bot, or `bot/route` (GET /v1/models)"}
_CHATRUN = {"type": "object", "properties": {"events": {"type": "boolean", "description": (
    "list the turn's other events (RouteChanged, Thinking, ...) in the response's `chatrun` field")}}}
_USER = {"type": "string", "description": "keeps conversations of different end users apart"}

CHAT_COMPLETIONS: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": _MODEL,
        "messages": {"type": "array", "minItems": 1, "items": _MESSAGE,
                     "description": "the conversation; its last message is the user's, the turn to run"},
        "stream": {"type": "boolean"},
        "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {"type": "boolean"}}},
        # One request is one turn, whose tools act once: no second choice can be sampled.
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 1,
              "description": "1 (or left out): a request runs one turn, which has one answer"},
        "response_format": {"type": ["object", "null"], "properties": {
            "type": {"enum": ["text", "json_object", "json_schema"],
                     "description": "json_object/json_schema: the reply is the turn's Object events as JSON"}}},
        "user": _USER,
        "safety_identifier": _USER,
        "chatrun": _CHATRUN,
    },
    "example": {"model": "travel", "messages": [{"role": "user", "content": "I want to fly to Dublin"}]},
}

RESPONSES: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": _MODEL,
        "input": {"anyOf": [{"type": "string", "minLength": 1},
                            {"type": "array", "minItems": 1, "items": {"anyOf": [{"type": "string"}, _MESSAGE]}}]},
        "previous_response_id": {"type": ["string", "null"], "minLength": 1},
        "conversation": {"anyOf": [{"type": "null"}, {"type": "string", "minLength": 1},
                                   {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}]},
        "stream": {"type": "boolean"},
        "user": _USER,
        "safety_identifier": _USER,
        "chatrun": _CHATRUN,
    },
    "example": {"model": "travel", "input": "I want to fly to Dublin"},
}

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": ["string", "null"]},
        "param": {"type": ["string", "null"]}}}},
}
_ERRORS = {
    400: "invalid_request_error: a body that is not JSON or does not match this schema, a conversation "
         "that does not end with the user's message, unsupported content",
    401: "invalid_api_key: no valid token (auth on)",
    403: "permission_error: a route the caller's roles do not allow",
    404: "model_not_found, previous_response_not_found, response_not_found (`param`: id)",
    408: "the body did not arrive in time",
    409: "the session is busy or changed meanwhile; conversation_ended: an `end` action ended the conversation",
    413: "too_large: the body or the user message is over the limit",
    415: "a body that is not application/json",
    422: "idempotency_key_reused: the Idempotency-Key of a committed request, sent with another request",
    429: "rate_limit_error: too many sessions for this caller",
    500: "server_error: the turn failed (the model, a tool), or the store",
    503: "the server is shutting down: send again",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"schema": _ERROR}}}
    for status, text in _ERRORS.items()
}

VALIDATORS = {id(schema): Draft202012Validator(schema) for schema in (CHAT_COMPLETIONS, RESPONSES)}


def request_body(schema: dict[str, Any], streams: bool = True) -> dict[str, Any]:
    """`openapi_extra` for an operation whose body the handler reads itself."""
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    ok = {"description": "the reply (with `stream`: Server-Sent Events)", "content": content}
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {k: v for k, v in schema.items() if k != "example"}, "example": schema["example"]}}},
        "responses": {"200": ok}}


# The arrays that carry the whole conversation, which grow with it: (schema, field, whether
# a bare string is an item of it).
_HISTORIES = ((id(CHAT_COMPLETIONS), "messages", False), (id(RESPONSES), "input", True))


def plain_message(item: Any, strings: bool = False) -> bool:
    """Whether a conversation item is one the schema surely accepts: an object whose role is a
    string, content a string or null, and type (if any) a string; or a string where `strings`."""
    if type(item) is str:
        return strings
    return (type(item) is dict and type(item.get("role")) is str
            and (item.get("content") is None or type(item["content"]) is str)
            and ("type" not in item or type(item["type"]) is str))


def without_plain_history(schema: dict[str, Any], body: Any) -> Any:
    """The body with the plain items of its conversation left out (one kept: minItems).

    Clients send the whole conversation with every request, and checking each of its messages
    against the schema cost more than the rest of a turn at 40 turns, growing with the
    conversation. A plain item is valid whatever the schema's other checks say, so the body
    passes exactly when this smaller body does."""
    for schema_id, name, strings in _HISTORIES:
        items = body.get(name) if schema_id == id(schema) and type(body) is dict else None
        if type(items) is list and len(items) > 1:
            rest = [item for item in items if not plain_message(item, strings)]
            return {**body, name: rest or items[:1]}
    return body


# The fields a usual request sends, by schema: a test of a value the schema surely accepts there
# (the schema's own check of that field is no stricter). A body of only these fields, plus fields
# the schemas do not name (allowed and ignored), needs no validator.
def _string(value: Any) -> bool:
    return type(value) is str


def _non_empty(value: Any) -> bool:
    return type(value) is str and value != ""


def _boolean(value: Any) -> bool:
    return type(value) is bool


def _none_or_non_empty(value: Any) -> bool:
    return value is None or _non_empty(value)


def _plain_messages(value: Any) -> bool:
    return type(value) is list and value != [] and _all_plain(value, False)


def _plain_input(value: Any) -> bool:
    return _non_empty(value) or (type(value) is list and value != [] and _all_plain(value, True))


_GET, _DICTS, _STRS, _STRS_OR_NONE = dict.get, {dict}, {str}, {str, type(None)}


def _all_plain(items: list[Any], strings: bool) -> bool:
    """`all(plain_message(item, strings) for item in items)`; for a list of objects only (the
    usual conversation), in C-level passes over it: a resent conversation's messages checked one
    by one cost ~0.2 M instructions at 40 turns (issue 39)."""
    if set(map(type, items)) != _DICTS:
        return all(plain_message(item, strings) for item in items)
    return (set(map(type, map(_GET, items, repeat("role")))) == _STRS
            and set(map(type, map(_GET, items, repeat("content")))) <= _STRS_OR_NONE
            and set(map(type, map(_GET, items, repeat("type"), repeat("")))) == _STRS)  # absent: ""


def all_plain(messages: list[Any]) -> bool:
    """Whether every message of a Chat Completions list is plain (plain_message)."""
    return _all_plain(messages, False)


_PLAIN_FIELDS: dict[int, tuple[tuple[str, ...], dict[str, Any]]] = {
    id(CHAT_COMPLETIONS): (("model", "messages"), {
        "model": _non_empty, "stream": _boolean, "user": _string, "safety_identifier": _string,
        "messages": _plain_messages}),
    id(RESPONSES): (("model", "input"), {
        "model": _non_empty, "stream": _boolean, "user": _string, "safety_identifier": _string,
        "previous_response_id": _none_or_non_empty, "conversation": _none_or_non_empty,
        "input": _plain_input}),
}


def surely_valid(schema: dict[str, Any], body: Any, judged: str | None = None) -> bool:
    """Whether the schema surely accepts `body`, judged without its validator: a body of the
    usual fields with plain values (False only means: ask the validator). A 40-turn request's
    validation cost ~0.4 M instructions, most of it in jsonschema's walk of the small rest.
    `judged`: a field the caller found plain already (a resent body's new messages, judged
    with their reading: openai_resent.plain_exchange), not tested again."""
    required, tests = _PLAIN_FIELDS[id(schema)]
    if type(body) is not dict or any(name not in body for name in required):
        return False
    named = schema["properties"]
    for name, value in body.items():
        test = tests.get(name)
        if test is None:
            if name in named:
                return False  # a field with more to check (response_format, chatrun, ...)
        elif name != judged and not test(value):
            return False
    return True


class Problem(NamedTuple):
    """What is wrong with a request body: the message (its place first), and `param`, the field
    at fault as OpenAI names one (`messages[2].content`, `n`; None for the body as a whole)."""

    message: str
    param: str | None


def problem(schema: dict[str, Any], body: Any, judged: str | None = None) -> Problem | None:
    """What is wrong with a request body (the first error, with its place), or None.
    `judged`: as surely_valid's."""
    if surely_valid(schema, body, judged):
        return None
    validator = VALIDATORS[id(schema)]
    if validator.is_valid(without_plain_history(schema, body)):
        return None
    # Checked whole again, so the error names its place in the body as sent.
    # best_match looks inside anyOf for the branch the body most likely meant.
    error = best_match(validator.iter_errors(body))
    if error is None:
        return None
    where = place(error.absolute_path)
    return Problem(f"{where or 'the body'}: {error.message}", place([*error.absolute_path, *_missing(error)]) or None)


def place(path: Iterable[str | int]) -> str:
    """A place in a body as OpenAI writes one: `messages[2].content`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _missing(error: ValidationError) -> list[str]:
    """The member a `required` error misses (its place is the object's): the field at fault."""
    required = error.validator_value
    if error.validator != "required" or not isinstance(error.instance, dict) or not isinstance(required, list):
        return []
    return [name for name in required if name not in error.instance][:1]
