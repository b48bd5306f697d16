"""Jinja2 templates: one environment for prompts, messages, replies and setters.

Templates are compiled once when the bot loads (syntax errors are validation
errors with the YAML line) and rendered every turn. The environment is sandboxed:
a bot file must not be able to reach Python internals through a template.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jinja2 import StrictUndefined, Template, Undefined, pass_context
from jinja2.environment import TemplateExpression
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Variables a template may use (README: "Template variables").
TEMPLATE_VARIABLES: tuple[str, ...] = ("state", "scope", "args", "user_message", "data", "route", "stack", "turn", "result",
                                       "error", "output", "now", "today")
# Who is signed in (`principal.name`, `principal.roles`, its claims) and the session's id: what
# bound arguments (`bind:`) are usually made of, usable in every template.
TEMPLATE_VARIABLES += ("principal", "session_id")
# A decision on a pending item (humans in the loop): {outcome, by, reason, args}; none elsewhere.
TEMPLATE_VARIABLES += ("decision",)
# The session's locale (docs/i18n.md): one of the bot's `locales:` (undefined for a bot without them).
TEMPLATE_VARIABLES += ("locale",)
# What the bot keeps of the user across conversations (`user_memory:`): FACT -> value; {} when nothing.
TEMPLATE_VARIABLES += ("user_memory",)
# Where the context keeps the bot's catalogs for `t()` (not a variable a template names).
CATALOGS_KEY = "_catalogs"


class _Undefined(StrictUndefined):
    """Undefined that still allows `x or "default"` and `x is defined`, but fails loudly
    when printed or iterated, so a typo in a template is an error, not empty text."""

    # Why the ignore: StrictUndefined's __bool__ is its always-raising helper (typed to accept
    # anything and return Never); being falsy instead is the point of this class.
    def __bool__(self) -> bool:  # type: ignore[override]
        return False


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_json_default)


def _json_default(value: Any) -> str:
    return value.isoformat() if isinstance(value, (date, datetime)) else str(value)


class EmptySegment(ValueError):
    """`urlsegment` of an empty value: no text is one path segment that is empty (`/orders/`
    or `/orders//items` is another address), so the request is refused instead of sent."""


# The dot segments (RFC 3986, 5.2.4): a client (httpx) or server removes them, walking the path.
_DOT_SEGMENTS = {".": "%2E", "..": "%2E%2E"}


def _urlsegment(value: Any) -> str:
    """Escape a value for one segment of a URL path: `/`, `?`, `#` and the rest included
    (Jinja's `urlencode` keeps `/`, which would let `../` walk the API's paths), and `.` and
    `..` percent-encoded (alone they are dot segments, removed with the segment before them).
    An empty value raises EmptySegment: it cannot be one segment."""
    text = str(value)
    if not text:
        raise EmptySegment("`urlsegment` got an empty value: an empty path segment would send the "
                           "request to another path")
    return _DOT_SEGMENTS.get(text) or quote(text, safe="")


# -- dates (docs/format.md, "The clock") ------------------------------------------------------
# `now` is an aware datetime in the session's zone and `today` its date; these read the dates
# a bot keeps in its state (ISO text) so they can be compared with them and counted.


def _as_date(value: Any) -> date:
    """`"2026-11-25"`, an ISO date-time, a datetime or a date -> the date (of a date-time: its own)."""
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    text = _iso_text(value, "date")
    try:
        return date.fromisoformat(text) if len(text) == 10 else datetime.fromisoformat(text).date()
    except ValueError:
        raise ValueError(f"`date` cannot read {value!r}: write dates as 2026-11-25") from None


@pass_context
def _as_datetime(context: Context, value: Any) -> datetime:
    """An ISO date-time (or date: its midnight) -> an aware datetime; one without an offset is
    read in the session's zone (that of `now`)."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):
        parsed = datetime(value.year, value.month, value.day)
    else:
        try:
            parsed = datetime.fromisoformat(_iso_text(value, "datetime"))
        except ValueError:
            raise ValueError(f"`datetime` cannot read {value!r}: write date-times as 2026-11-25T09:30:00+01:00 "
                             "(the offset may be left out: the session's time zone)") from None
    if parsed.tzinfo is None:
        now = context.get("now")
        parsed = parsed.replace(tzinfo=now.tzinfo if isinstance(now, datetime) else UTC)
    return parsed


def _iso_text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"`{name}` reads ISO text, a date or a date-time, not {value!r}")
    return value.strip()


@pass_context
def _add_days(context: Context, value: Any, days: int | float) -> date | datetime:
    """A date or date-time `days` later (earlier when negative); text is read as by `date`
    (a bare date) or `datetime`."""
    return _moment(context, value) + timedelta(days=days)


@pass_context
def _add_hours(context: Context, value: Any, hours: int | float) -> datetime:
    moment = _moment(context, value)
    if not isinstance(moment, datetime):
        moment = _as_datetime(context, moment)
    return later(moment, timedelta(hours=hours)) if moment.tzinfo is not None else moment + timedelta(hours=hours)


def later(moment: datetime, wait: timedelta) -> datetime:
    """The instant a `wait` after an aware `moment`, in its zone: time that passes, added in UTC
    (the one rule of it: timeouts, follow-ups, a pinned clock's steps, `add_hours`). An aware time of
    a zone adds on its wall clock, so the night its clocks go back, 30 minutes on would be an hour
    and a half on, or half an hour back (the hour 02:00-03:00 comes twice)."""
    return (moment.astimezone(UTC) + wait).astimezone(moment.tzinfo)


def _moment(context: Context, value: Any) -> date | datetime:
    if isinstance(value, str) and len(value.strip()) == 10:
        return _as_date(value)
    if isinstance(value, date) and not isinstance(value, datetime):
        return value
    return _as_datetime(context, value)


def _days_between(start: Any, end: Any) -> int:
    """Whole calendar days from `start` to `end` (negative when `end` is earlier)."""
    return (_as_date(end) - _as_date(start)).days


def zone_named(name: str) -> ZoneInfo | None:
    """The IANA time zone `name` (e.g. Europe/Paris), or None when there is none of that name."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def plain(value: Any) -> Any:
    """A template's typed value as state and events can keep it: dates and date-times become
    their ISO text (a store keeps JSON)."""
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _finalize(value: Any) -> Any:
    """What `{{ ... }}` prints: dates and date-times as ISO text (2026-11-25T09:00:00+01:00), the
    form the bot's state and APIs use, not Python's `str` (a space before the time)."""
    return value.isoformat() if isinstance(value, (date, datetime)) else value


@pass_context
def _t(context: Context, key: str, **args: Any) -> str:
    """`t('key', name=value, count=n)`: the text of `key` in the session's locale (docs/i18n.md)."""
    catalogs = context.get(CATALOGS_KEY)
    if catalogs is None:
        raise ValueError(f"t({key!r}): the bot declares no `locales:`, so it has no catalogs")
    return str(catalogs.translate(context.get("locale") or catalogs.default, key, args))


# -- locale-aware formatting (Babel, CLDR data): numbers, money and dates as the session's locale writes them --


def _babel_locale(context: Context, wanted: str | None) -> Any:
    """The Babel locale of `wanted`, else the session's (`locale`), else English."""
    from babel import Locale, UnknownLocaleError

    tag = wanted or context.get("locale")
    tag = tag if isinstance(tag, str) and tag else "en"
    try:
        return Locale.parse(tag.replace("-", "_"))
    except (ValueError, UnknownLocaleError):
        raise ValueError(f"no locale data for {tag!r}: write a locale tag such as de, de-AT or ar") from None


def _number(value: Any, name: str) -> Any:
    from decimal import Decimal, InvalidOperation

    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        raise ValueError(f"`{name}` formats a number, not {value!r}")
    try:
        return Decimal(value.strip()) if isinstance(value, str) else value
    except InvalidOperation:
        raise ValueError(f"`{name}` formats a number, not {value!r}") from None


@pass_context
def _format_number(context: Context, value: Any, decimals: int | None = None, locale: str | None = None) -> str:
    """`1234.5 | format_number` -> 1,234.5 (en), 1.234,5 (de); `decimals=2` fixes the digits."""
    from babel.numbers import format_decimal

    pattern = None if decimals is None else "#,##0" + ("." + "0" * decimals if decimals > 0 else "")
    return str(format_decimal(_number(value, "format_number"), format=pattern, locale=_babel_locale(context, locale)))


@pass_context
def _format_currency(context: Context, value: Any, currency: str, locale: str | None = None) -> str:
    """`80 | format_currency('EUR')` -> €80.00 (en), 80,00 € (de): the currency's digits and sign."""
    from babel.numbers import format_currency, is_currency

    if not isinstance(currency, str) or len(currency) != 3:
        raise ValueError(f"`format_currency` needs an ISO 4217 code such as 'EUR', not {currency!r}")
    if not is_currency(currency.upper()):  # Babel would print an unknown code as a sign
        raise ValueError(f"`format_currency`: {currency!r} is not an ISO 4217 currency code")
    return str(format_currency(_number(value, "format_currency"), currency.upper(), locale=_babel_locale(context, locale)))


@pass_context
def _format_date(context: Context, value: Any, format: str = "medium", locale: str | None = None) -> str:
    """`'2026-11-25' | format_date` -> Nov 25, 2026 (en), 25.11.2026 (de); format: short, medium,
    long, full or a CLDR pattern."""
    from babel.dates import format_date

    day = _moment(context, value)
    return str(format_date(day.date() if isinstance(day, datetime) else day, format=format,
                           locale=_babel_locale(context, locale)))


@pass_context
def _format_datetime(context: Context, value: Any, format: str = "medium", locale: str | None = None) -> str:
    """A date-time in its own zone (that of `now` when it has none), written as the locale writes it."""
    from babel.dates import format_datetime

    moment = _as_datetime(context, value)
    return str(format_datetime(moment, format=format, tzinfo=moment.tzinfo, locale=_babel_locale(context, locale)))


ENV = ImmutableSandboxedEnvironment(undefined=_Undefined, autoescape=False, keep_trailing_newline=False,
                                    finalize=_finalize)
ENV.filters["tojson"] = _tojson
ENV.filters["urlsegment"] = _urlsegment
ENV.filters["date"] = _as_date
ENV.filters["datetime"] = _as_datetime
ENV.filters["add_days"] = _add_days
ENV.filters["add_hours"] = _add_hours
ENV.filters["format_number"] = _format_number
ENV.filters["format_currency"] = _format_currency
ENV.filters["format_date"] = _format_date
ENV.filters["format_datetime"] = _format_datetime
ENV.globals["days_between"] = _days_between
ENV.globals["t"] = _t


def display_text(source: str, catalogs: Any, locale: str | None) -> str:
    """A text the page shows apart from any conversation (a route's `title:`, the bot's
    `description:`) in `locale`: its template sees `t()` and `locale` only (docs/i18n.md)."""
    if catalogs is None or "{" not in source:
        return source
    return render(source, {"locale": locale or catalogs.default, CATALOGS_KEY: catalogs})


DISPLAY_VARIABLES: tuple[str, ...] = ("locale",)


@lru_cache(maxsize=4096)
def compile_template(source: str) -> Template:
    """Compile (cached). Raises jinja2.TemplateSyntaxError with `.lineno` within the template."""
    return ENV.from_string(source)


def plain_text(source: str) -> str | None:
    """What a template without Jinja syntax (most system prompts) renders to, whatever its context:
    itself, less one trailing newline (keep_trailing_newline=False drops it); None when it has some."""
    if "{" in source or "\r" in source:
        return None
    return source[:-1] if source.endswith("\n") else source


def render(source: str, context: dict[str, Any]) -> str:
    text = plain_text(source)
    return compile_template(source).render(context) if text is None else text


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
        return plain(_compile_expression(expr)(**context))
    return render(source, context)


def render_nested(source: Any, render_one: Callable[[str], Any]) -> Any:
    """An `emit:` value that is data: each text in it (at any depth of mappings and lists)
    rendered by `render_one`, the rest kept as it is. `{Handoff: {score: "{{ args.score }}"}}`
    sends the score, not the template's text. A text inside that renders to nothing is None
    (the data keeps its key)."""
    if isinstance(source, str):
        return render_one(source)
    if isinstance(source, dict):
        return {key: _none_for_nothing(render_nested(value, render_one)) for key, value in source.items()}
    if isinstance(source, list):
        return [_none_for_nothing(render_nested(value, render_one)) for value in source]
    return source


def _none_for_nothing(value: Any) -> Any:
    return None if is_nothing(value) else value


def nested_templates(source: Any, at: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str]]:
    """(path below `source`, text) of each text inside data that `render_nested` renders."""
    if isinstance(source, str):
        return [(at, source)]
    if isinstance(source, dict):
        return [found for key, value in source.items() for found in nested_templates(value, (*at, key))]
    if isinstance(source, list):
        return [found for i, value in enumerate(source) for found in nested_templates(value, (*at, i))]
    return []


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
