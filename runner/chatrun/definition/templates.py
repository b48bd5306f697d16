"""Jinja2 templates: one environment for prompts, messages, replies and setters.

Templates are compiled once when the bot loads (syntax errors are validation
errors with the YAML line) and rendered every turn. The environment is sandboxed:
a bot file must not be able to reach Python internals through a template.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from jinja2 import StrictUndefined, Template, Undefined
from jinja2.environment import TemplateExpression
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Variables a template may use (README: "Template variables").
TEMPLATE_VARIABLES: tuple[str, ...] = ("state", "scope", "args", "user_message", "data", "route", "stack", "turn", "result", "error",
                      "output")
# Who is signed in (`principal.name`, `principal.roles`, its claims) and the session's id: what
# bound arguments (`bind:`) are usually made of, usable in every template.
TEMPLATE_VARIABLES += ("principal", "session_id")


class _Undefined(StrictUndefined):
    """Undefined that still allows `x or "default"` and `x is defined`, but fails loudly
    when printed or iterated, so a typo in a template is an error, not empty text."""

    # Why the ignore: StrictUndefined's __bool__ is its always-raising helper (typed to accept
    # anything and return Never); being falsy instead is the point of this class.
    def __bool__(self) -> bool:  # type: ignore[override]
        return False


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _urlsegment(value: Any) -> str:
    """Escape a value for one segment of a URL path: `/`, `?`, `#` and the rest included
    (Jinja's `urlencode` keeps `/`, which would let `../` walk the API's paths)."""
    return quote(str(value), safe="")


ENV = ImmutableSandboxedEnvironment(undefined=_Undefined, autoescape=False, keep_trailing_newline=False)
ENV.filters["tojson"] = _tojson
ENV.filters["urlsegment"] = _urlsegment


@lru_cache(maxsize=4096)
def compile_template(source: str) -> Template:
    """Compile (cached). Raises jinja2.TemplateSyntaxError with `.lineno` within the template."""
    return ENV.from_string(source)


def render(source: str, context: dict[str, Any]) -> str:
    return compile_template(source).render(context)


def render_value(source: Any, context: dict[str, Any]) -> Any:
    """Render a template where a setter or event value expects one.

    A template that is exactly one expression (`"{{ args.n }}"`) keeps the value's
    type (numbers stay numbers, lists stay lists); other strings render to text;
    non-strings are returned as they are.
    """
    if not isinstance(source, str):
        return source
    expr = _single_expression(source)
    if expr is not None:
        return _compile_expression(expr)(**context)
    return render(source, context)


@lru_cache(maxsize=4096)
def _compile_expression(expr: str) -> TemplateExpression:
    return ENV.compile_expression(expr, undefined_to_none=False)


@lru_cache(maxsize=4096)
def _single_expression(source: str) -> str | None:
    text = source.strip()
    if text.startswith("{{") and text.endswith("}}") and text.count("{{") == 1:
        return text[2:-2].strip()
    return None


def is_nothing(value: Any) -> bool:
    """None or undefined: what an `emit` or `set` template may render to in order to send or
    assign nothing (docs/format.md, "Nothing")."""
    return value is None or isinstance(value, Undefined)


@lru_cache(maxsize=16384)
def compile_condition(expression: str) -> TemplateExpression:
    """A case's `if:` condition, compiled on first use and kept (validation has parsed it
    already; compiling to Python costs about a millisecond). Raises jinja2.TemplateSyntaxError."""
    return ENV.compile_expression(expression, undefined_to_none=False)


def holds(expression: str, context: dict[str, Any]) -> bool:
    """Whether a condition holds: its value is truthy (undefined is false)."""
    return bool(compile_condition(expression)(**context))
