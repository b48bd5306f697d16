"""The stores every store conformance test runs against (issue 38): a real SQLite file (the
inner loop), a real redis-server and a real PostgreSQL (slow: each starts a server once per
test session, tests/redis_support.py and tests/postgres_support.py). No tests here.

    @pytest.fixture(params=SHARED_STORES)
    def url(request, tmp_path):
        return store_url(request, tmp_path)
"""

from __future__ import annotations

import pytest

SERVER = [pytest.mark.slow, pytest.mark.subprocess]
REDIS = pytest.param("redis", marks=SERVER)  # a real redis-server
POSTGRES = pytest.param("postgres", marks=SERVER)  # a real PostgreSQL
STORES = ["sqlite", REDIS, POSTGRES]  # the durable stores: one contract
DISTRIBUTED = [REDIS, POSTGRES]  # the stores replicas share (real leases)


def store_url(request: pytest.FixtureRequest, tmp_path, kind: str | None = None) -> str:
    """The URL of an empty store of the kind `kind` names (default: `request.param`)."""
    kind = kind or request.param
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 's.db'}"
    if kind == "redis":
        return request.getfixturevalue("redis_server").url()
    if kind == "postgres":
        return request.getfixturevalue("postgres_server").url()
    raise ValueError(kind)
