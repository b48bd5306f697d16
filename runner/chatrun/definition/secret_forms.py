"""The forms a secret's value takes where chatrun may meet it again (docs/format.md, `env:`): the
one rule the `http:` kind (results, recorded requests, error texts) and what chatrun keeps
(engine/guardrails.py, the storage rule) redact a `secret: true` variable's value by.

A value is found as written; as a URL carries it (escaped as a path segment or a query value, and
as httpx leaves it written into a query); and base64-encoded inside a longer encoded text (an
`Authorization: Basic` header of `user:secret`, echoed in an error). Base64 encodes three bytes
as four characters, so a secret inside an encoded text shows as one of three cores, by its offset
modulo three: the characters that depend on its bytes alone. A core is searched in both alphabets
(standard and URL-safe), and the whole encoded run around it is redacted (the few characters at
its edges carry bits of the secret too). A core shorter than MIN_CORE characters (a secret of
less than about six bytes) is not searched: it would match unrelated text by chance.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from urllib.parse import quote, quote_plus

from chatrun.definition.config import EnvVar

MIN_CORE = 8
_RUN = "[A-Za-z0-9+/_-]*"  # base64's characters, in both alphabets
_URLSAFE = str.maketrans("+/", "-_")


def secret_values(env: Mapping[str, EnvVar]) -> tuple[str, ...]:
    """The current values of the `secret: true` variables of `env` (read now: a rotated secret is
    redacted from its next use), the empty ones left out."""
    found = (os.environ.get(name, var.default) for name, var in env.items() if var.secret)
    return tuple(value for value in found if value)


def url_forms(value: str) -> set[str]:
    """A secret as written, and as a request's URL carries it: escaped as a path segment or a
    query value (`urlsegment`, `query:`), and as httpx leaves it written into the URL's query."""
    inline = quote(value, safe="!$&'()*+,;=:@/?%")  # RFC 3986's query characters stay, as httpx leaves them
    return {value, quote(value, safe=""), quote_plus(value), inline}


def base64_cores(value: str) -> set[str]:
    """The characters of any base64 text holding `value` that depend on its bytes alone, at each
    of the three offsets, in both alphabets (none shorter than MIN_CORE)."""
    data = value.encode()
    cores = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + data).decode()
        core = encoded[-(-4 * shift // 3):4 * (shift + len(data)) // 3]
        if len(core) >= MIN_CORE:
            cores |= {core, core.translate(_URLSAFE)}
    return cores


@lru_cache(maxsize=64)
def secrets_pattern(values: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern matching every form of `values` (None: no values): longest first, so no
    shorter form is found inside a longer one; an encoded core with the encoded run around it."""
    plain = sorted({form for value in values for form in url_forms(value)}, key=len, reverse=True)
    cores = sorted({core for value in values for core in base64_cores(value)}, key=len, reverse=True)
    alternatives = [re.escape(form) for form in plain] + [f"{_RUN}{re.escape(core)}{_RUN}={{0,2}}" for core in cores]
    return re.compile("|".join(alternatives)) if alternatives else None


def redact_secrets(text: str, values: tuple[str, ...], replacement: str) -> str:
    """`text` with every form of `values` replaced."""
    pattern = secrets_pattern(values) if values else None
    return pattern.sub(replacement, text) if pattern is not None else text
