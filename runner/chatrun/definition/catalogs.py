"""Locales and text catalogs (docs/i18n.md): what a bot's `t('key', **args)` says in each locale.

A bot declares `locales: [en, de]` (the first is the default); each locale's texts are one
YAML file beside the bot, `locales/<locale>.yaml`: keys (nested mappings read as dotted
keys) to texts with `{name}` placeholders, or to a mapping of CLDR plural categories
(`one`, `other`, ...) chosen by the argument `count` with the locale's plural rule (Babel).
Everything here is plain data read once at load; every entry keeps the file and line it
came from, so the checks (`catalog_checks`) can name them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from chatrun.definition.page_texts import BUILTIN as PAGE_BUILTIN
from chatrun.definition.page_texts import KEYS as PAGE_KEYS
from chatrun.definition.page_texts import PREFIX as PAGE_PREFIX
from chatrun.definition.page_texts import said
from chatrun.errors import Diagnostic

PLURAL_CATEGORIES = frozenset({"zero", "one", "two", "few", "many", "other"})
PLACEHOLDER = re.compile(r"\{(\w+)\}")
# A `t('key')` call with a literal key: what the checks count as a use of the key.
T_CALL = re.compile(r"""\bt\(\s*(['"])([^'"]+)\1(?!\s*[~+])""")
# A `t()` call whose key is computed: `t('day.' ~ n)` (group 2: the literal prefix) or `t(key)`
# (no prefix). Every key starting with the prefix may be the one it reads.
T_COMPUTED = re.compile(r"""\bt\(\s*(?:(['"])([^'"]*)\1\s*[~+]|(?=[^\s'")]))""")
CATALOG_DIR = "locales"


@dataclass(frozen=True)
class Entry:
    """One key's text in one locale: a text, or texts by plural category; where it is written."""

    text: str | dict[str, str]
    file: str
    line: int
    col: int

    def placeholders(self) -> set[str]:
        texts = self.text.values() if isinstance(self.text, dict) else [self.text]
        return {name for text in texts for name in PLACEHOLDER.findall(text)}


@dataclass
class Catalogs:
    """The declared locales (the first is the default) and each one's entries by key."""

    locales: tuple[str, ...]
    entries: dict[str, dict[str, Entry]] = field(default_factory=dict)  # locale -> key -> entry

    @property
    def default(self) -> str:
        return self.locales[0]

    def negotiate(self, wanted: str | None) -> str:
        """The declared locale that best matches `wanted` (a tag like `de-AT`, or an
        Accept-Language value `fr;q=0.9, de;q=0.8`): exact, then by language; else the default."""
        for tag in preferred_tags(wanted):
            found = self.matching(tag)
            if found is not None:
                return found
        return self.default

    def matching(self, tag: str) -> str | None:
        """The declared locale that matches one tag (`de-AT`): exact, then by language; else None."""
        for locale in self.locales:
            if locale.lower() == tag.lower():
                return locale
        language = tag.split("-")[0].lower()
        for locale in self.locales:
            if locale.split("-")[0].lower() == language:
                return locale
        return None

    def translate(self, locale: str, key: str, args: dict[str, Any]) -> str:
        """The text of `key` in `locale` (the default's when that locale lacks it), its plural
        form chosen by `count`, its placeholders filled from `args`."""
        entry = self.entries.get(locale, {}).get(key) or self.entries.get(self.default, {}).get(key)
        if entry is None:
            raise ValueError(f"t({key!r}): no text with this key in locales/{locale}.yaml")
        text = entry.text
        if isinstance(text, dict):
            if "count" not in args:
                raise ValueError(f"t({key!r}) has plural forms: give it `count=`")
            category = plural_category(locale, args["count"])
            text = text.get(category, text["other"])

        def fill(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in args:
                raise ValueError(f"t({key!r}) in {locale}: the text needs `{name}=` ({entry.file}:{entry.line})")
            return str(args[name])

        return PLACEHOLDER.sub(fill, text)


def preferred_tags(wanted: str | None) -> list[str]:
    """The language tags of a locale or an Accept-Language value, most wanted first."""
    if not wanted:
        return []
    weighted: list[tuple[float, int, str]] = []
    for i, part in enumerate(wanted.split(",")):
        tag, _, params = part.strip().partition(";")
        quality = 1.0
        if params.strip().startswith("q="):
            try:
                quality = float(params.strip()[2:])
            except ValueError:
                quality = 0.0
        if tag and tag != "*" and quality > 0:
            weighted.append((-quality, i, tag.replace("_", "-")))
    return [tag for _, _, tag in sorted(weighted)]


@lru_cache(maxsize=256)
def _plural_rule(locale: str) -> Any:
    from babel import Locale  # only a bot with plural texts needs Babel's CLDR data

    try:
        return Locale.parse(locale.replace("-", "_")).plural_form
    except (ValueError, LookupError):
        return Locale.parse("en").plural_form


def plural_category(locale: str, count: Any) -> str:
    """The CLDR plural category of `count` in `locale` (`one`, `few`, `other`, ...)."""
    try:
        number = float(count) if not isinstance(count, int) else count
    except (TypeError, ValueError):
        return "other"
    return str(_plural_rule(locale)(number))


def said_count(texts: dict[str, str], key: str, locale: str | None, count: int, **args: object) -> str:
    """The page text `<key>_one` or `<key>_other` ("1 character", "8000 characters") by the plural
    rule of `locale` (CLDR's `one`, else `other`: as the operator page picks `op_turns_*`), filled
    as `said` (definition/page_texts.py) fills it."""
    form = "one" if plural_category(locale or "en", count) == "one" else "other"
    return said(texts, f"{key}_{form}", **args)


def load_catalogs(root: str, locales: list[str], declared_at: tuple[str, int, int]) -> tuple[Catalogs, list[Diagnostic]]:
    """Read `locales/<locale>.yaml` beside the bot for every declared locale."""
    from chatrun.definition.yamlpos import read_yaml_file

    catalogs, problems = Catalogs(tuple(locales)), []
    for locale in locales:
        path = Path(root) / CATALOG_DIR / f"{locale}.yaml"
        if not path.is_file():
            problems.append(Diagnostic(declared_at[0], declared_at[1], declared_at[2], "error",
                                       f"locale `{locale}` is declared, but its catalog {path} does not exist", "locales"))
            continue
        doc = read_yaml_file(path)
        problems.extend(doc.diagnostics)
        if doc.data is not None and not isinstance(doc.data, dict):
            problems.append(Diagnostic(str(path), 1, 1, "error", "a catalog is a mapping of keys to texts, "
                                       f"not {_value_words(doc.data)}"))
        if any(d.severity == "error" for d in doc.diagnostics) or not isinstance(doc.data, (dict, type(None))):
            continue  # a catalog not read is reported once, not again as every key it lacks
        entries: dict[str, Entry] = {}
        _collect(doc, doc.data or {}, (), entries, problems)
        catalogs.entries[locale] = entries
    return catalogs, problems


def _collect(doc: Any, data: dict[str, Any], at: tuple[str, ...], entries: dict[str, Entry],
             problems: list[Diagnostic]) -> None:
    for key, value in data.items():
        path = (*at, str(key))
        pos = doc.pos(path)
        if isinstance(value, dict) and value and set(value) <= PLURAL_CATEGORIES:
            if "other" not in value or not all(isinstance(v, str) for v in value.values()):
                problems.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                           f"`{'.'.join(path)}`: plural forms are texts and need `other`"))
                continue
            entries[".".join(path)] = Entry(dict(value), doc.file, pos.line, pos.col)
        elif isinstance(value, dict):
            _collect(doc, value, path, entries, problems)
        elif isinstance(value, str):
            entries[".".join(path)] = Entry(value, doc.file, pos.line, pos.col)
        else:
            problems.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                       f"`{'.'.join(path)}` is {_value_words(value)}: a catalog's values are texts "
                                       "(quote a number, write empty text as `''`)"))


def _value_words(value: Any) -> str:
    if value is None:
        return "empty"
    return {list: "a list", bool: "true or false", int: "a number", float: "a number"}.get(type(value), "not a text")


def catalog_checks(catalogs: Catalogs, used: dict[str, tuple[str, int, int]],
                   computed: dict[str, tuple[str, int, int]] | None = None) -> list[Diagnostic]:
    """A key used but missing in a declared locale, a key no template uses, and placeholders
    that differ between locales (each at the catalog line at fault). `computed`: the literal
    prefixes of keys templates compute (`t('day.' ~ n)`), where first used: each key with
    such a prefix may be used (it is checked in every locale like the others)."""
    out: list[Diagnostic] = []
    default = catalogs.entries.get(catalogs.default, {})
    prefixes = tuple(computed or {})
    out += _computed_key_checks(catalogs, computed or {})
    for key, (file, line, col) in sorted(used.items()):
        for locale in catalogs.locales:
            if locale in catalogs.entries and key not in catalogs.entries[locale]:
                out.append(Diagnostic(file, line, col, "error",
                                      f"t('{key}'): locale `{locale}` has no text with this key "
                                      f"(add it to {CATALOG_DIR}/{locale}.yaml)"))
    for locale in catalogs.locales[1:]:
        if locale in catalogs.entries:
            for key in default.keys() - catalogs.entries[locale].keys() - used.keys():
                entry = default[key]
                out.append(Diagnostic(entry.file, entry.line, entry.col, "error",
                                      f"`{key}` has no text in locale `{locale}` (add it to {CATALOG_DIR}/{locale}.yaml)"))
    for locale in catalogs.locales:
        for key, entry in catalogs.entries.get(locale, {}).items():
            if key.startswith(PAGE_PREFIX):
                out.extend(_page_text_check(key, entry))
            elif key not in used and not key.startswith(prefixes):
                out.append(Diagnostic(entry.file, entry.line, entry.col, "warning",
                                      f"`{key}` is not used by any template of the bot (t('{key}'))"))
            reference = default.get(key)
            if (locale != catalogs.default and reference is not None and not key.startswith(PAGE_PREFIX)
                    and entry.placeholders() != reference.placeholders()):
                theirs = ", ".join(sorted(reference.placeholders())) or "none"
                ours = ", ".join(sorted(entry.placeholders())) or "none"
                out.append(Diagnostic(entry.file, entry.line, entry.col, "error",
                                      f"`{key}` in {locale} has the placeholders {{{ours}}}, but in {catalogs.default} "
                                      f"{{{theirs}}} ({reference.file}:{reference.line})"))
    return out


def _computed_key_checks(catalogs: Catalogs, computed: dict[str, tuple[str, int, int]]) -> list[Diagnostic]:
    """A computed key whose prefix no key of the default locale has is an error at its call
    (no value of the expression can name a text); otherwise one note for the whole bot that
    these keys are taken as used, since which one a call reads is known only when it runs."""
    out: list[Diagnostic] = []
    default = catalogs.entries.get(catalogs.default, {})
    counted = []
    for prefix, (file, line, col) in sorted(computed.items(), key=lambda item: item[1]):
        keys = [key for key in default if key.startswith(prefix)]
        shown = f"t('{prefix}' ~ …)" if prefix else "t(…)"
        if not keys:
            out.append(Diagnostic(file, line, col, "error", f"{shown} computes its key, but no key of locale "
                                  f"`{catalogs.default}` starts with `{prefix}` (add them to {CATALOG_DIR}/"
                                  f"{catalogs.default}.yaml)"))
        else:
            counted.append(f"the {len(keys)} keys starting with `{prefix}`" if prefix else "all the keys")
    if counted:
        file, line, col = min(computed.values())
        out.append(Diagnostic(file, line, col, "warning",
                              f"note: a `t()` call computes its key, so {' and '.join(counted)} count as used "
                              "(each is still checked in every locale); which one it reads is known only when it runs"))
    return out


def _page_text_check(key: str, entry: Entry) -> list[Diagnostic]:
    """A `page.<key>` text overrides one of the page's own texts (definition/page_texts.py):
    it names one, and uses no placeholder the page does not fill."""
    from chatrun.definition.sources import suggest

    name = key[len(PAGE_PREFIX):]
    if name not in PAGE_KEYS:
        return [Diagnostic(entry.file, entry.line, entry.col, "warning",
                           f"`{key}` is not a text of the page{suggest(name, PAGE_KEYS)} "
                           f"(the page's texts: docs/i18n.md, \"The page\")")]
    if isinstance(entry.text, dict):
        return [Diagnostic(entry.file, entry.line, entry.col, "error",
                           f"`{key}` has plural forms, but the page's texts are single texts")]
    theirs = set(PLACEHOLDER.findall(PAGE_BUILTIN["en"][name]))
    unknown = entry.placeholders() - theirs  # a text may leave out what the page fills, not add to it
    if unknown:
        wanted = ", ".join(sorted(theirs)) or "none"
        return [Diagnostic(entry.file, entry.line, entry.col, "error",
                           f"`{key}` has the placeholders {{{', '.join(sorted(unknown))}}}, but the page fills "
                           f"only {{{wanted}}}")]
    return []
