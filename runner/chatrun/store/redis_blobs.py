"""`RedisBlobs`: the blob area of a Redis store, shared by every replica on it.

Keys, for session S (prefix "chatrun:"):

    chatrun:b:S     hash   reference (SHA-256 of the bytes) -> the bytes
    chatrun:bn:S    string the bytes the session's files take, together

Once per content per session, not shared between sessions with reference counts: a blob
goes with its session in the script that deletes the session (store/redis.py's `_DELETE`
drops both keys), no count can leak or be decremented twice by a retried deletion, and no
session can learn whether another holds a file (a shared area would answer "already
there"). The same photo sent to two sessions is kept twice; the cap bounds each.

The cap (`max_blob_bytes` in the store URL, default 32 MiB) is the most one session's files
may take in Redis: Redis keeps everything in memory, so a client must not fill it. A put
over the cap is refused (AttachmentRefused: a 400 naming the cap), atomically on the
server, so two replicas adding files at once cannot pass it together.

The area talks to Redis with a synchronous client (the engine reads blobs while it builds
a model request, a synchronous step): a read of a file blocks its replica's event loop for
the transfer, about a millisecond per megabyte on a local network.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from chatrun.errors import AttachmentRefused
from chatrun.messages import Attachment
from chatrun.store.blobs import blob_ref
from chatrun.store.redis_pool import blocking_pool

DEFAULT_MAX_BLOB_BYTES = 32 * 2**20
MAX_BLOB_BYTES_PARAMETER = "max_blob_bytes"

# KEYS: the session's blob hash, its byte count. ARGV: reference, bytes, cap.
# Returns the session's byte count after the put, or -(the count it would have been) when over the cap.
_PUT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return tonumber(redis.call('GET', KEYS[2]) or '0') end
local total = tonumber(redis.call('GET', KEYS[2]) or '0') + string.len(ARGV[2])
if total > tonumber(ARGV[3]) then return -total end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], total)
return total
"""


class RedisBlobs:
    """See the module's text. `client_url` is the URL redis-py takes (without chatrun's own
    parameters), `prefix` the store's key prefix."""

    def __init__(self, client_url: str, prefix: str, max_bytes: int = DEFAULT_MAX_BLOB_BYTES):
        import redis

        password = None if urlsplit(client_url).password else os.environ.get("CHATRUN_REDIS_PASSWORD")
        # A blocking pool, as the store's (redis_pool.py): more uploads at once than it has
        # connections wait for one.
        self.client: Any = redis.Redis.from_pool(blocking_pool(
            redis.BlockingConnectionPool, client_url, password=password, socket_connect_timeout=5,
            socket_keepalive=True, health_check_interval=30))
        self.prefix = prefix
        self.max_bytes = max_bytes
        self._put = self.client.register_script(_PUT)

    def keys(self, session_id: str) -> list[str]:
        """The session's keys (the store's deletion script drops them with the session)."""
        return [f"{self.prefix}b:{session_id}", f"{self.prefix}bn:{session_id}"]

    def put(self, session_id: str, data: bytes, media_type: str, name: str = "") -> Attachment:
        ref = blob_ref(data)
        total = int(self._put(keys=self.keys(session_id), args=[ref, data, self.max_bytes]))
        if total < 0:
            raise AttachmentRefused(
                f"session {session_id}: its files would take {-total} bytes, over the Redis store's limit of "
                f"{self.max_bytes} bytes per session ({MAX_BLOB_BYTES_PARAMETER} in the store URL)")
        return Attachment(ref, media_type, name, len(data))

    def read(self, session_id: str, ref: str) -> bytes | None:
        data = self.client.hget(self.keys(session_id)[0], ref)
        return bytes(data) if data is not None else None

    def refs(self, session_id: str) -> list[str]:
        return sorted(k.decode() for k in self.client.hkeys(self.keys(session_id)[0]))

    def delete_session(self, session_id: str) -> None:
        self.client.delete(*self.keys(session_id))

    def close(self) -> None:
        self.client.close()


def max_blob_bytes(value: str | None, url: str) -> int:
    """The `max_blob_bytes` parameter of a store URL (bytes; absent: the default)."""
    from chatrun.errors import ChatrunError

    if value is None:
        return DEFAULT_MAX_BLOB_BYTES
    if not value.isdigit() or int(value) <= 0:
        raise ChatrunError(f"store {url}: {MAX_BLOB_BYTES_PARAMETER} must be a positive number of bytes, not {value!r}")
    return int(value)
