"""A store's URL as chatrun shows it: the one rule that hides its password.

Every place that names a store — a CLI error, a log line, a recorded transcript's header, a
store's `url` attribute that the server's startup line and errors read — shows `shown_url(url)`,
never the URL as given: `postgresql://app:s3cret@db/chat` is shown `postgresql://app:***@db/chat`.
It hides the password of the URL's user part (`redis://:s3cret@host`, also one written with an
`@` or percent-escapes), a password given as a query parameter (libpq's `?password=`), and the
same in a URL given as a query value (a blob area's `?blobs=redis://:s3cret@host`). A URL that
cannot be read is shown without its user part at all, so a password never leaks through a typo.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit

HIDDEN = "***"
# The query parameters that carry a password (libpq's `password`, `sslpassword`; the common
# spellings a Redis client reads).
PASSWORD_PARAMETERS = frozenset({"password", "sslpassword", "pass", "passwd", "pwd"})


def shown_url(url: str) -> str:
    """`url` with its passwords replaced by `***` (the rest as given)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: drop everything up to the last '@'
        scheme, sep, rest = url.partition("://")
        return f"{scheme}{sep}{HIDDEN}@{rest.rsplit('@', 1)[1]}" if "@" in rest else url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:{HIDDEN}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        hidden = [(k, HIDDEN if k.lower() in PASSWORD_PARAMETERS else shown_url(v) if "://" in v else v)
                  for k, v in pairs]
        if hidden != pairs:
            query = urlencode(hidden, safe="*:/@")
    # Replaced in the text, not rebuilt: urlunsplit would drop the empty netloc of sqlite:///x.db.
    shown = url.replace(f"//{parts.netloc}", f"//{netloc}", 1) if netloc != parts.netloc else url
    return shown.replace(f"?{parts.query}", f"?{query}", 1) if query != parts.query else shown
