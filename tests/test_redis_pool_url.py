"""The Redis store's pools from its URL (no Redis needed: nothing connects until a command):
blocking pools with chatrun's defaults, the URL's `max_connections` and `timeout` taking over,
/health's probe on a pool of its own, and a pool of 0 connections refused."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from chatrun.errors import ChatrunError
from chatrun.store.redis import RedisStore
from chatrun.store.redis_pool import POOL_MAX_CONNECTIONS, POOL_TIMEOUT


def _pools(url: str) -> tuple:
    store = RedisStore(url)
    try:
        return store.client.connection_pool, store.blob_area.client.connection_pool, store.probe.connection_pool
    finally:
        asyncio.run(store.close())


def test_the_pools_wait_with_chatruns_defaults():
    pool, blobs, probe = _pools("redis://127.0.0.1:1/0")
    assert isinstance(pool, aioredis.BlockingConnectionPool) and isinstance(blobs, redis.BlockingConnectionPool)
    assert (pool.max_connections, pool.timeout) == (blobs.max_connections, blobs.timeout) == \
        (POOL_MAX_CONNECTIONS, POOL_TIMEOUT)
    assert probe.max_connections == 1


def test_the_urls_pool_parameters_size_the_pools_not_the_probe():
    pool, blobs, probe = _pools("redis://127.0.0.1:1/0?prefix=x:&max_connections=5&timeout=2.5")
    assert (pool.max_connections, pool.timeout) == (blobs.max_connections, blobs.timeout) == (5, 2.5)
    assert probe.max_connections == 1


def test_a_pool_of_no_connections_is_refused():
    with pytest.raises(ChatrunError, match=r"max_connections=0: the pool needs at least 1 connection"):
        RedisStore("redis://127.0.0.1:1/0?max_connections=0")
