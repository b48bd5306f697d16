"""`RedisBlobs`: the blob area of a Redis store, shared by every replica on it.

Keys, for session S (prefix "chatrun:"):

    chatrun:b:S     hash   reference (SHA-256 of the bytes) -> the bytes
    chatrun:bn:S    string the bytes the session's files take, together

Once per content per session, not shared between sessions with reference counts: a blob
goes with its session in the script that deletes the session (store/redis.py's `_DELETE`
drops both keys), no count can leak or be decremented twice by a retried deletion, and no
session can learn whether another holds a file (a shared area would answer "already
there"). The same photo sent to two sessions is kept twice; the cap bounds each.

The caps (`max_blob_bytes` in the store URL, default 32 MiB, and `max_blob_files`, default
100: store/blobs.py `BlobQuota`) are the most one session's files may take in Redis: Redis
keeps everything in memory, so a client must not fill it. A put over either is refused
(AttachmentRefused: a 400 naming the cap), atomically on the server, so two replicas adding
files at once cannot pass it together.

The area talks to Redis with a synchronous client (the engine reads blobs while it builds
a model request, a synchronous step): a read of a file blocks its replica's event loop for
the transfer, about a millisecond per megabyte on a local network.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from chatrun.messages import Attachment
from chatrun.store.blobs import (
    DEFAULT_MAX_MEMORY_BLOB_BYTES,
    MAX_BLOB_BYTES_PARAMETER,
    BlobQuota,
    blob_quota,
    blob_ref,
)
from chatrun.store.redis_pool import blocking_pool
from chatrun.store.urls import shown_url

DEFAULT_MAX_BLOB_BYTES = DEFAULT_MAX_MEMORY_BLOB_BYTES

# KEYS: the session's blob hash, its byte count. ARGV: reference, bytes, byte cap, file cap.
# Returns {1, total} after a put (or for bytes already there), else {0, files, total}: what the
# session would have held, over a cap (BlobQuota.check words it).
_PUT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {1, tonumber(redis.call('GET', KEYS[2]) or '0')} end
local files = redis.call('HLEN', KEYS[1]) + 1
local total = tonumber(redis.call('GET', KEYS[2]) or '0') + string.len(ARGV[2])
if total > tonumber(ARGV[3]) or files > tonumber(ARGV[4]) then return {0, files, total} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], total)
return {1, total}
"""


class RedisBlobs:
    """See the module's text. `client_url` is the URL redis-py takes (without chatrun's own
    parameters), `prefix` the store's key prefix."""

    def __init__(self, client_url: str, prefix: str, quota: BlobQuota = BlobQuota(DEFAULT_MAX_BLOB_BYTES)):  # noqa: B008
        import redis

        from chatrun.store.redis_errors import RedactingSyncRedis

        password = None if urlsplit(client_url).password else os.environ.get("CHATRUN_REDIS_PASSWORD")
        # A blocking pool, as the store's (redis_pool.py): more uploads at once than it has
        # connections wait for one.
        self.client: Any = RedactingSyncRedis.for_store(blocking_pool(
            redis.BlockingConnectionPool, client_url, password=password, socket_connect_timeout=5,
            socket_keepalive=True, health_check_interval=30), shown_url(client_url))
        self.prefix = prefix
        self.quota = quota
        self._put = self.client.register_script(_PUT)

    def keys(self, session_id: str) -> list[str]:
        """The session's keys (the store's deletion script drops them with the session)."""
        return [f"{self.prefix}b:{session_id}", f"{self.prefix}bn:{session_id}"]

    def put(self, session_id: str, data: bytes, media_type: str, name: str = "") -> Attachment:
        ref = blob_ref(data)
        done, *held = self._put(keys=self.keys(session_id), args=[ref, data, self.quota.max_bytes, self.quota.max_files])
        if not int(done):
            self.quota.check(session_id, int(held[0]), int(held[1]))
        return Attachment(ref, media_type, name, len(data))

    @property
    def max_bytes(self) -> int:
        return self.quota.max_bytes

    def read(self, session_id: str, ref: str) -> bytes | None:
        data = self.client.hget(self.keys(session_id)[0], ref)
        return bytes(data) if data is not None else None

    def refs(self, session_id: str) -> list[str]:
        return sorted(k.decode() for k in self.client.hkeys(self.keys(session_id)[0]))

    def delete_session(self, session_id: str) -> None:
        self.client.delete(*self.keys(session_id))

    def close(self) -> None:
        self.client.close()


def redis_blob_quota(url: str, shown: str) -> BlobQuota:
    """The blob quota of a Redis store URL (`max_blob_bytes`, `max_blob_files`); `shown`: the
    URL as errors name it (without its password)."""
    return blob_quota(url, DEFAULT_MAX_BLOB_BYTES, shown)


__all__ = ["MAX_BLOB_BYTES_PARAMETER", "RedisBlobs", "redis_blob_quota"]
