"""Issue 35: numbers, money and dates in templates as the session's locale writes them (Babel
filters `format_number`, `format_currency`, `format_date`, `format_datetime`; docs/i18n.md)."""

from __future__ import annotations

import pytest

from chatrun.definition.templates import render

NBSP = "\u00a0"  # CLDR puts a no-break space between an amount and its sign


@pytest.mark.parametrize(("locale", "money", "number", "day", "moment"), [
    ("en", "€80.00", "1,234.5", "Nov 25, 2026", "11/25/26, 9:30\u202fAM"),
    ("de", f"80,00{NBSP}€", "1.234,5", "25.11.2026", "25.11.26, 09:30"),
    ("de-AT", f"€{NBSP}80,00", "1.234,5", "25.11.2026", "25.11.26, 09:30"),
])
def test_each_filter_writes_the_sessions_locale(locale, money, number, day, moment):
    context = {"locale": locale}
    assert render("{{ 80 | format_currency('EUR') }}", context) == money
    assert render("{{ 1234.5 | format_number }}", context) == number
    assert render("{{ '2026-11-25' | format_date }}", context) == day
    assert render("{{ '2026-11-25T09:30:00+01:00' | format_datetime('short') }}", context) == moment


def test_arabic_uses_its_own_signs_and_a_bot_without_locales_writes_english():
    assert "80.00" in render("{{ 80 | format_currency('EUR') }}", {"locale": "ar"})
    assert render("{{ 80 | format_currency('EUR') }}", {}) == "€80.00"  # no `locales:`: English
    assert render("{{ 80 | format_currency('USD', locale='de') }}", {"locale": "en"}) == f"80,00{NBSP}$"


def test_decimals_fix_the_digits_and_text_numbers_are_read_exactly():
    assert render("{{ 2 | format_number(decimals=2) }}", {"locale": "de"}) == "2,00"
    assert render("{{ '0.10' | format_currency('EUR') }}", {"locale": "en"}) == "€0.10"
    assert render("{{ 1234567 | format_number(decimals=0) }}", {"locale": "en"}) == "1,234,567"


@pytest.mark.parametrize(("template", "says"), [
    ("{{ 80 | format_currency('euro') }}", "ISO 4217 code such as 'EUR'"),
    ("{{ 80 | format_currency('XYZ') }}", "not an ISO 4217 currency code"),
    ("{{ 'eighty' | format_number }}", "formats a number, not 'eighty'"),
    ("{{ none | format_number }}", "formats a number, not None"),
    ("{{ 8 | format_number(locale='xx-nowhere') }}", "no locale data for 'xx-nowhere'"),
])
def test_a_wrong_value_is_an_error_that_says_what_to_write(template, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        render(template, {"locale": "en"})
