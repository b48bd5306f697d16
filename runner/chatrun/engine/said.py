"""Whether the user said a value: the check behind a tool's `from_user:` (docs/tools.md).

A model fills a wizard's slots with values no one gave it ("Berlin", "John Doe", 1000, a date);
a parameter the tool lists under `from_user:` must be one the user said. The call path
(engine/call.py, the arguments step) asks `said(value, texts, today, locale)` with the texts the
user wrote in the current scope and refuses a value that is not among them.

What counts as said, after normalising both sides (Unicode NFKC, case, accents, spacing and
punctuation: text is compared as its sequence of words):
- text: the value's words appear, in order and next to each other, in one of the user's texts
  ("berlin" in "To Berlin, please"; "New York" not in "York, new");
- a number (a JSON number, or text that is one): a number the user wrote, in digits with or
  without thousands separators ("1000", "1,000", "1.000", "1 000", "1'000", "12.50", "12,50"),
  with `k` ("2k"), or in English words ("one thousand", "twenty-five", "a hundred");
- a date (text starting YYYY-MM-DD): a date the user wrote as ISO ("2026-03-05"), with slashes or
  dots ("05/03", "5.3.2026": day/month or month/day, both count), with a month name in English or
  the session's locale ("5 March", "March 5th", "the 5th of March", "5 Mar 2026", both ends of
  "3 to 17 July" or "3-17 July"; without a year, any year counts), a day alone ("the 28th": that day of this month or the next, or of a month
  the same text names: "July 1st to the 15th"), "yesterday",
  "today", "tomorrow", "the day after tomorrow", or an English weekday name (any of the next 14
  days that falls on it); relative dates count from the session's today (`today` in templates);
- a list: each item is said; a mapping: each value is said; true, false and null are not checked.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from datetime import date, timedelta
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

_WORD = re.compile(r"\w+")
# A number as written: digit groups joined by one grouping/decimal mark each.
_NUMBER = re.compile(r"(?<![\w.,])\d+(?:[.,'\u00a0\u202f ]\d+)*(?:\s?k\b)?", re.IGNORECASE)
_NUMERIC_TEXT = re.compile(r"^\s*[-+]?\d+(?:[.,]\d+)?\s*$")
_ISO_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})")
_ISO_IN_TEXT = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_NUMERIC_DATE = re.compile(r"(?<![\d.,/])(\d{1,2})[/.](\d{1,2})(?:[/.](\d{4}|\d{2}))?(?![\d/])")
_ORDINAL = re.compile(r"^(\d{1,2})(?:st|nd|rd|th|er|e|o|a|\.)?$")

_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i >= 2}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
_RELATIVE_DAYS = {"yesterday": -1, "today": 0, "tonight": 0, "tomorrow": 1}
_ORDINAL_DAY = re.compile(r"^(\d{1,2})(?:st|nd|rd|th)$")

Day = tuple[int | None, int, int]  # (year, or None when the user gave none; month; day)


def normal(text: str) -> str:
    """Text as compared: NFKC, case folded, accents removed."""
    decomposed = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def words(text: str) -> list[str]:
    return _WORD.findall(normal(text))


def said(value: Any, texts: Iterable[str], today: date, locale: str | None = None) -> bool:
    """Whether `value` is something the user said in one of `texts` (the module's rules)."""
    texts = list(texts)
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, list):
        return all(said(item, texts, today, locale) for item in value)
    if isinstance(value, dict):
        return all(said(item, texts, today, locale) for item in value.values())
    if isinstance(value, int | float):
        return _number_said(Decimal(str(value)), texts)
    text = str(value)
    if _words_said(words(text), texts):
        return True
    iso = _ISO_DATE.match(text.strip())
    if iso:
        return _date_said(iso, texts, today, locale)
    if _NUMERIC_TEXT.match(text):
        number = _decimal(text.strip().replace(",", "."))
        return number is not None and _number_said(number, texts)
    return False


def _words_said(wanted: list[str], texts: list[str]) -> bool:
    if not wanted:
        return False  # no words at all (blank, only punctuation): nothing the user could have said
    n = len(wanted)
    for text in texts:
        have = words(text)
        if any(have[i:i + n] == wanted for i in range(len(have) - n + 1)):
            return True
    return False


# -- numbers ------------------------------------------------------------------------------


def _decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def _number_said(number: Decimal, texts: list[str]) -> bool:
    return any(number in numbers_in(text) for text in texts)


def numbers_in(text: str) -> set[Decimal]:
    """Every number `text` may mean: digits (each reading of its separators) and English number words."""
    found: set[Decimal] = set()
    for match in _NUMBER.finditer(text):
        written = match.group(0)
        scale = 1000 if written[-1] in "kK" else 1
        digits = written.rstrip("kK").rstrip()
        found |= {reading * scale for reading in _readings(digits)}
        found |= {Decimal(run) for run in re.findall(r"\d+", digits)}  # "100 200": two numbers too
    found |= _number_words(words(text))
    return found


def _readings(written: str) -> set[Decimal]:
    """The values digits with marks can mean: each mark the decimal point (when it is the last
    one) or a thousands separator (between groups of three)."""
    parts = re.split(r"([.,'\u00a0\u202f ])", written)
    groups, marks = parts[0::2], parts[1::2]
    out: set[Decimal] = set()
    if not marks:
        return {Decimal(written)}
    for decimal_mark in (".", ",", None):
        whole, fraction = groups, ""
        if decimal_mark is not None:
            if marks[-1] != decimal_mark or decimal_mark in marks[:-1]:
                continue
            whole, fraction = groups[:-1], groups[-1]
        if len(whole) > 1 and (not 1 <= len(whole[0]) <= 3 or any(len(g) != 3 for g in whole[1:])):
            continue
        grouping = marks[:len(whole) - 1]
        if len(set(grouping)) > 1 or (decimal_mark is not None and decimal_mark in grouping):
            continue
        value = _decimal("".join(whole) + ("." + fraction if fraction else ""))
        if value is not None:
            out.add(value)
    return out


def _number_words(tokens: list[str]) -> set[Decimal]:
    """Numbers written in English words: "one thousand five hundred", "twenty five", "a hundred"."""
    found: set[Decimal] = set()
    total = current = 0
    in_number = False
    for i, token in enumerate([*tokens, ""]):
        if token in _UNITS or token in _TENS:
            current += _UNITS.get(token, 0) + _TENS.get(token, 0)
            in_number = True
        elif token in _SCALES and (in_number or (i > 0 and tokens[i - 1] in ("a", "one"))):
            scale = _SCALES[token]
            if scale == 100:
                current = max(current, 1) * 100
            else:
                total += max(current, 1) * scale
                current = 0
            in_number = True
        elif token == "and" and in_number:
            continue
        else:
            if in_number:
                found.add(Decimal(total + current))
            total = current = 0
            in_number = False
    return found


# -- dates --------------------------------------------------------------------------------


def _date_said(iso: re.Match[str], texts: list[str], today: date, locale: str | None) -> bool:
    year, month, day = (int(g) for g in iso.groups())
    for text in texts:
        for y, m, d in dates_in(text, today, locale):
            if (m, d) == (month, day) and y in (None, year):
                return True
    return False


def dates_in(text: str, today: date, locale: str | None = None) -> set[Day]:
    """The dates `text` may mean (module docstring): (year or None, month, day)."""
    found: set[Day] = set()
    for y, m, d in _ISO_IN_TEXT.findall(text):
        found.add((int(y), int(m), int(d)))
    for a, b, y in _NUMERIC_DATE.findall(text):
        year = None if not y else int(y) + (2000 if len(y) == 2 else 0)
        found |= {(year, int(m), int(d)) for d, m in ((a, b), (b, a)) if 1 <= int(m) <= 12 and 1 <= int(d) <= 31}
    tokens = words(text)
    named = _named_month_dates(tokens, locale)
    found |= named | _relative_dates(tokens, today)
    months = {month for _, month, _ in named}
    for token in tokens:  # "July 1st to the 15th": a day alone, in a month the text names
        match = _ORDINAL_DAY.match(token)
        if match and 1 <= int(match.group(1)) <= 31:
            found |= {(None, month, int(match.group(1))) for month in months}
    return found


def _named_month_dates(tokens: list[str], locale: str | None) -> set[Day]:
    """Days next to a month name ("5 March", "March 5th", "5th of March 2027"), and the other end
    of a range around one ("3 to 17 July", "3-17 July", "March 1 until the 8th")."""
    months = _month_names(locale)
    found: set[Day] = set()
    for i, token in enumerate(tokens):
        month = months.get(token)
        if month is None:
            continue
        before_at = i - 2 if i >= 2 and tokens[i - 1] in ("of", "de", "di") else i - 1
        for at, year_at, step in ((before_at, i + 1, -1), (i + 1, i + 2, 1)):
            day = _day_number(tokens[at]) if 0 <= at < len(tokens) else None
            if day is None:
                continue
            year_text = tokens[year_at] if year_at < len(tokens) else ""
            year = int(year_text) if re.fullmatch(r"\d{4}", year_text) else None
            found.add((year, month, day))
            partner = _range_partner(tokens, at + step if step < 0 or year is None else year_at + 1, step)
            if partner is not None:
                found.add((year, month, partner))
    return found


_RANGE_WORDS = ("to", "until", "till", "through", "and", "bis", "au", "al")


def _range_partner(tokens: list[str], at: int, step: int) -> int | None:
    """The day at the other end of a range that starts at `at` going `step` ("3 to" before
    "17 July"; "to the 8th" after "March 1"), else None."""
    if not 0 <= at < len(tokens):
        return None
    if tokens[at] in _RANGE_WORDS:
        at += step
        if 0 <= at < len(tokens) and tokens[at] == "the" and step > 0:
            at += step
    return _day_number(tokens[at]) if 0 <= at < len(tokens) else None


def _day_number(token: str) -> int | None:
    match = _ORDINAL.match(token)
    if match and 1 <= int(match.group(1)) <= 31:
        return int(match.group(1))
    return None


@lru_cache(maxsize=32)
def _month_names(locale: str | None) -> dict[str, int]:
    """Month names (wide and abbreviated, normalised) in English and `locale` (CLDR, through Babel)."""
    from babel.core import UnknownLocaleError
    from babel.dates import get_month_names

    names: dict[str, int] = {"sept": 9}
    for where in dict.fromkeys(("en", locale or "en")):
        for width in ("wide", "abbreviated"):
            try:
                for number, name in get_month_names(width, locale=where).items():
                    for word in words(name):
                        names.setdefault(word, number)
            except (UnknownLocaleError, ValueError):
                continue
    return names


def _relative_dates(tokens: list[str], today: date) -> set[Day]:
    found: set[Day] = set()
    joined = " ".join(tokens)
    for word, offset in _RELATIVE_DAYS.items():
        if word in tokens:
            found.add(_day(today + timedelta(days=offset)))
    if "day after tomorrow" in joined:
        found.add(_day(today + timedelta(days=2)))
    for token in tokens:  # "the 28th": that day of this month or the next
        match = _ORDINAL_DAY.match(token)
        if match:
            found |= _days_numbered(int(match.group(1)), today)
    for number, name in enumerate(_WEEKDAYS):
        if name in tokens:
            found |= {_day(today + timedelta(days=k)) for k in range(1, 15)
                      if (today + timedelta(days=k)).weekday() == number}
    return found


def _days_numbered(number: int, today: date) -> set[Day]:
    found: set[Day] = set()
    for ahead in (0, 1):
        year, month = today.year + (today.month + ahead - 1) // 12, (today.month + ahead - 1) % 12 + 1
        try:
            found.add(_day(date(year, month, number)))
        except ValueError:  # the 31st of a month of 30 days
            continue
    return found


def _day(d: date) -> Day:
    return (d.year, d.month, d.day)
