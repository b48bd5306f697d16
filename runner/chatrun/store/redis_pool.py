"""The Redis store's connection pools (docs/deploy.md, "Sizing the Redis pool").

A blocking pool: when all its connections are busy, a command waits for one, up to `timeout`
seconds, instead of failing with "Too many connections" as redis-py's default pool does.
Redis runs commands one at a time and each takes well under a millisecond on a local network,
so a replica seldom has many in flight: a hundred connections serve a thousand concurrent
conversations, and N replicas open at most N times `max_connections` (Redis allows 10,000
clients by default). The store URL's `max_connections` and `timeout` (redis-py's own URL
parameters) override the defaults here.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

POOL_MAX_CONNECTIONS = 100  # connections per pool (per replica, and its blob area apart)
POOL_TIMEOUT = 20.0  # seconds a command waits for a free connection before it fails
POOL_PARAMETERS = ("max_connections", "timeout")  # the URL parameters of the pool itself


def blocking_pool(pool_class: Any, client_url: str, **connection: Any) -> Any:
    """`pool_class` (redis-py's BlockingConnectionPool, asyncio's or the threaded one) for the
    URL, with chatrun's defaults for what the URL does not say (its parameters win)."""
    return pool_class.from_url(client_url, max_connections=POOL_MAX_CONNECTIONS, timeout=POOL_TIMEOUT, **connection)


def check_pool_parameters(client_url: str, shown: str) -> None:
    """ChatrunError for `max_connections=0`, which redis-py would take as "no limit"."""
    from chatrun.errors import ChatrunError

    for name, value in parse_qsl(urlsplit(client_url).query):
        if name == "max_connections" and value.strip() == "0":
            raise ChatrunError(f"store {shown}: max_connections=0: the pool needs at least 1 connection "
                               f"(default {POOL_MAX_CONNECTIONS}; docs/deploy.md, \"Sizing the Redis pool\")")


def without_pool_parameters(client_url: str) -> str:
    """The URL without the pool's parameters, for a client whose pool is sized apart."""
    parts = urlsplit(client_url)
    rest = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k not in POOL_PARAMETERS])
    return urlunsplit(parts._replace(query=rest))
