"""`RedisStore`: sessions, memories, history and leases in Redis, shared by every replica.

    --store redis://[:PASSWORD@]HOST:PORT/DB[?prefix=chatrun:&max_blob_bytes=33554432&max_connections=100&timeout=20]
            (rediss:// for TLS; the pool: store/redis_pool.py)

The password comes from the URL, else from $CHATRUN_REDIS_PASSWORD. Keys, for session S
(prefix "chatrun:"):

    chatrun:s:S     hash   v (version), snap (snapshot JSON), owner, m:<memory id> (messages JSON),
                           tl (what S counts for in the tallies, JSON),
                           ik (the key of the idle index it is in)
    chatrun:h:S     list   history entries (JSON), oldest first
    chatrun:r:S     hash   request id -> the history entry of the committed request
    chatrun:ro:S    list   request ids, oldest first (the last KEEP_OUTCOMES are kept)
    chatrun:l:S     string the lease: its holder's token, with a TTL
    chatrun:q:S     zset   the queue of requests waiting for the lease (score: arrival number)
    chatrun:qn:S    string the queue's arrival counter
    chatrun:qa:S    hash   waiter token -> the time (ms) it must poll again by, or be dropped
    chatrun:sessions zset  session ids by creation time
    chatrun:o:OWNER set    the session ids a principal owns
    chatrun:rec:KEY string a record (RecordStore: JSON), e.g. the OpenAI API's index of turns
    chatrun:recs    zset   every record's KEY (score 0): record_keys(prefix) is a range of it, not a SCAN
    chatrun:rk:S    set    the keys of the records saved for session S (deleted with it)
    chatrun:rs      hash   record key -> the session it was last saved for
    chatrun:ob      hash   outbox entry id -> the entry (JSON; its claim is kept apart)
    chatrun:obq:R   zset   pending outbox entry ids of route R ("<bot>/<sink>") by when a worker may claim them
    chatrun:obr     set    the routes R that have a queue (`GET /outbox` lists them all)
    chatrun:obq     zset   (written by chatrun before issue 33: every route's ids; the next claim moves them)
    chatrun:obc     hash   outbox entry id -> the token of the worker that claimed it last
    chatrun:obd     zset   dead-letter outbox entry ids by when they died
    chatrun:due     zset   session ids by the due time of their earliest pending item (epoch s)
    chatrun:pending set    the session ids with open pending items (the operators' list)
    chatrun:w:S     string S's entry in the operators' index (record.WaitingEntry JSON), while it waits
    chatrun:wi:K    zset   the waiting sessions of index K (record.waiting_key/age_key) by position
    chatrun:t:F     hash   tally family F (owner, version, pending) -> name -> count (record.tallies_of)
    chatrun:flat    string "1" once the index and tallies hold every session (filled at first read)
    chatrun:idle:B  zset   session ids of bot B by their last commit (epoch s): retention's index
    chatrun:idle-indexed   string set once every session written before the idle index is in it
    chatrun:b:S     hash   the session's attached files, by reference (store/redis_blobs.py)
    chatrun:bn:S    string the bytes those files take (the blob area's cap: `max_blob_bytes`)

Every write of a turn is one Lua script (atomic on the server): it checks that the caller
still holds the lease and that the session is at the version the turn started from, then
writes snapshot, memories, history and the request's outcome, or nothing. The lease is a
token with a TTL, renewed every ttl/3 by a task while the request runs; a replica that dies
stops renewing and its lease expires. Waiters queue in FIFO order and poll (every 2..20 ms);
a waiter that stops polling (its replica died) is dropped from the head of the queue.

Retention (docs/deploy.md, "What is kept, and for how long") deletes idle sessions through
the same `_DELETE` as any deletion, found by the idle index, not by key TTLs: a session's
keys expiring on their own would leave the indexes (owner sets, sessions, due, pending) naming
sessions that are gone, and a session's data is spread over keys with no common TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from chatrun.errors import ChatrunError
from chatrun.messages import message_from_dict
from chatrun.store import user_records
from chatrun.store.billing import key_of as usage_key
from chatrun.store.blobs import BLOB_PARAMETERS
from chatrun.store.lease import Lease, LeaseSettings
from chatrun.store.record import (
    DEAD,
    PENDING,
    Commit,
    JSONObject,
    OutboxEntry,
    PendingSession,
    SessionRecord,
    WaitingEntry,
    from_json,
    pending_session,
    requeued,
    swapped_texts,
    tallies_json,
    tallies_of,
    to_json,
    unclaimed,
    waiting_entry,
)
from chatrun.store.redis_blobs import RedisBlobs, redis_blob_quota
from chatrun.store.redis_pool import blocking_pool, check_pool_parameters, without_pool_parameters
from chatrun.store.urls import shown_url
from chatrun.store.versions import CREATE, KEEP_OUTCOMES, LeaseLost, SessionBusy, StaleVersion

log = logging.getLogger("chatrun.store")

WAITER_TTL_MS = 3000  # a waiter that has not polled for this long is dropped from the queue
QUEUE_KEYS_TTL_MS = 3_600_000  # the queue's keys vanish an hour after the last waiter polled
REMEMBER_ATTEMPTS = 20  # a commit whose user-memory record another commit changed meanwhile is sent again
RECONNECT_RETRIES = 1  # a command that meets a dead connection is sent once more, on a new one

_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = ARGV[1]
local holder = redis.call('GET', KEYS[1])
if holder == token then return {1, redis.call('HGET', KEYS[5], 'v') or '', redis.call('GET', KEYS[6])} end
while true do
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not head or head == token then break end
  if tonumber(redis.call('HGET', KEYS[4], head) or '0') >= now then break end
  redis.call('ZREM', KEYS[2], head)
  redis.call('HDEL', KEYS[4], head)
end
local queued = redis.call('ZSCORE', KEYS[2], token)
if ARGV[4] == '1' and not queued and (holder or redis.call('ZCARD', KEYS[2]) > 0) then
  return {0, -1}
end
if not queued then redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), token) end
redis.call('HSET', KEYS[4], token, now + tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
redis.call('PEXPIRE', KEYS[4], ARGV[5])
if not holder and redis.call('ZRANGE', KEYS[2], 0, 0)[1] == token then
  redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[4], token)
  return {1, redis.call('HGET', KEYS[5], 'v') or '', redis.call('GET', KEYS[6])}
end
return {0, redis.call('ZRANK', KEYS[2], token)}
"""

_LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A record's compare-and-swap (swap_record): KEYS the record, the records' index, their sessions;
# ARGV the text it must still hold, its key, the text to save instead (none: delete it).
_SWAP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('HDEL', KEYS[3], ARGV[2])
end
return 1
"""

# Lua kept by the commit, the delete and the first read (_REINDEX): the operators' index and
# the tallies of one session (chatrun.store.record: WaitingEntry, tallies_of). `prefix`, the
# session id, its hash key; a new entry ('' none) with its positions (key, position)...
_FLAT_LUA = """
local function unwait(prefix, sid)
  local old = redis.call('GET', prefix .. 'w:' .. sid)
  if not old then return end
  for key, _ in pairs(cjson.decode(old).positions) do redis.call('ZREM', prefix .. 'wi:' .. key, sid) end
  redis.call('DEL', prefix .. 'w:' .. sid)
end
local function wait(prefix, sid, entry, args, first)
  unwait(prefix, sid)
  if entry == '' then return end
  redis.call('SET', prefix .. 'w:' .. sid, entry)
  local count = tonumber(args[first])
  for j = first + 1, first + 2 * count, 2 do redis.call('ZADD', prefix .. 'wi:' .. args[j], args[j + 1], sid) end
end
local function retally(prefix, hash, new)
  local old = redis.call('HGET', hash, 'tl') or '[]'
  if old == new then return end
  for _, t in ipairs(cjson.decode(old)) do
    if redis.call('HINCRBY', prefix .. 't:' .. t[1], t[2], -t[3]) <= 0 then redis.call('HDEL', prefix .. 't:' .. t[1], t[2]) end
  end
  for _, t in ipairs(cjson.decode(new)) do redis.call('HINCRBY', prefix .. 't:' .. t[1], t[2], t[3]) end
  if new == '[]' then redis.call('HDEL', hash, 'tl') else redis.call('HSET', hash, 'tl', new) end
end
"""

# KEYS: session hash; ARGV: prefix, session id, version, tallies, entry ('' none), position
# count, (key, position)...: index one stored session (unless a commit changed it meanwhile).
_REINDEX = _FLAT_LUA + """
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[3] then return 0 end
retally(ARGV[1], KEYS[1], ARGV[4])
wait(ARGV[1], ARGV[2], ARGV[5], ARGV, 6)
return 1
"""

# KEYS: session hash, history, lease, outcomes, outcome order, sessions index, owner set,
#       outbox entries, outbox queue, due index, pending set, the bot's idle index, the records'
#       index, the records' sessions
# A resend of the same commit (redis-py sends a command again when its reply did not come: a
# read timeout, a connection dropped after Redis ran it) finds the version it wrote itself,
# `<expected + 1>.<random>`, and answers ok again: without this it would meet the version
# check and report a committed turn as stale (a user told to send again runs the turn twice).
# ARGV: token, expected, random, snapshot, session id, request id, outcome, keep, now, owner,
#       user-memory count, (record key, its name, the text read before or '', the new text or '')...,
#       memory count, (memory id, messages or '' to delete)..., entry count, entries...,
#       outbox count, (id, due, entry, route queue, route)..., due ('' none), pending count,
#       prefix, tallies, waiting entry ('' none), position count, (index key, position)... (_FLAT_LUA),
#       and last the quota ('0' none; Commit.quota): a new session is refused ('quota', the count)
#       when its owner's set (KEYS[7], what count_owned counts) has that many, checked with the write
# (KEYS[9] is the outbox's set of routes: each entry goes to its route's queue, see _CLAIM)
# The user's records (memory, budget: store/user_records.py) are a compare-and-set: each is written only if
# it is still the text the caller read; if one changed ('memory'), nothing is written and the
# caller reads again and sends the commit again.
_COMMIT = _FLAT_LUA + """
local cur = redis.call('HGET', KEYS[1], 'v')
local mine = ((tonumber(string.match(ARGV[2], '^(%d+)')) or 0) + 1) .. '.' .. ARGV[3]
if cur == mine then return {'ok', cur} end
if ARGV[1] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[1] then return {'lease', ''} end
if ARGV[2] == '' then
  if cur then return {'stale', cur} end
elseif cur ~= ARGV[2] then
  return {'stale', cur or ''}
end
local quota = tonumber(ARGV[#ARGV])
if not cur and quota > 0 and ARGV[10] ~= '' then
  local owned = redis.call('SCARD', KEYS[7])
  if owned >= quota then return {'quota', tostring(owned)} end
end
local remembered = tonumber(ARGV[11])
for j = 12, 11 + 4 * remembered, 4 do
  if (redis.call('GET', ARGV[j]) or '') ~= ARGV[j + 2] then return {'memory', ARGV[j + 1]} end
end
for j = 12, 11 + 4 * remembered, 4 do
  redis.call('HDEL', KEYS[14], ARGV[j + 1])
  if ARGV[j + 3] == '' then
    redis.call('DEL', ARGV[j])
    redis.call('ZREM', KEYS[13], ARGV[j + 1])
  else
    redis.call('SET', ARGV[j], ARGV[j + 3])
    redis.call('ZADD', KEYS[13], 0, ARGV[j + 1])
  end
end
local n = 0
if cur then n = tonumber(string.match(cur, '^(%d+)')) or 0 end
local v = (n + 1) .. '.' .. ARGV[3]
redis.call('HSET', KEYS[1], 'v', v, 'snap', ARGV[4])
if not cur then
  redis.call('ZADD', KEYS[6], ARGV[9], ARGV[5])
  if ARGV[10] ~= '' then
    redis.call('HSET', KEYS[1], 'owner', ARGV[10])
    redis.call('SADD', KEYS[7], ARGV[5])
  end
end
local i = 12 + 4 * remembered
local count = tonumber(ARGV[i]); i = i + 1
for _ = 1, count do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], 'm:' .. ARGV[i])
  else
    redis.call('HSET', KEYS[1], 'm:' .. ARGV[i], ARGV[i + 1])
  end
  i = i + 2
end
count = tonumber(ARGV[i]); i = i + 1
for _ = 1, count do
  redis.call('RPUSH', KEYS[2], ARGV[i])
  i = i + 1
end
count = tonumber(ARGV[i]); i = i + 1
for _ = 1, count do
  redis.call('HSET', KEYS[8], ARGV[i], ARGV[i + 2])
  redis.call('ZADD', ARGV[i + 3], ARGV[i + 1], ARGV[i])
  redis.call('SADD', KEYS[9], ARGV[i + 4])
  i = i + 5
end
if ARGV[i] == '' then redis.call('ZREM', KEYS[10], ARGV[5]) else redis.call('ZADD', KEYS[10], ARGV[i], ARGV[5]) end
if ARGV[i + 1] == '0' then redis.call('SREM', KEYS[11], ARGV[5]) else redis.call('SADD', KEYS[11], ARGV[5]) end
retally(ARGV[i + 2], KEYS[1], ARGV[i + 3])
if cur or ARGV[i + 4] ~= '' then wait(ARGV[i + 2], ARGV[5], ARGV[i + 4], ARGV, i + 5) end
redis.call('ZADD', KEYS[12], ARGV[9], ARGV[5])
redis.call('HSET', KEYS[1], 'ik', KEYS[12])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[4], ARGV[6], ARGV[7])
  redis.call('RPUSH', KEYS[5], ARGV[6])
  while redis.call('LLEN', KEYS[5]) > tonumber(ARGV[8]) do
    redis.call('HDEL', KEYS[4], redis.call('LPOP', KEYS[5]))
  end
end
return {'ok', v}
"""

# KEYS: outbox entries, claims, the old one queue, routes; ARGV: now, lease, limit, token
# prefix, key prefix, the routes this worker serves... Every route ("<bot>/<sink>") has its own
# queue, so a worker claims only what it can deliver and never scans the others' entries. The
# entries an older chatrun queued in its one queue are moved to their routes' queues first
# (their scores kept: a claim on them still holds).
_CLAIM = """
local old = redis.call('ZRANGE', KEYS[3], 0, 99, 'WITHSCORES')
for i = 1, #old, 2 do
  local text = redis.call('HGET', KEYS[1], old[i])
  if text then
    local entry = cjson.decode(text)
    local route = tostring(entry.body.bot) .. '/' .. tostring(entry.sink)
    redis.call('ZADD', ARGV[5] .. 'obq:' .. route, old[i + 1], old[i])
    redis.call('SADD', KEYS[4], route)
  end
  redis.call('ZREM', KEYS[3], old[i])
end
local out = {}
local left = tonumber(ARGV[3])
for r = 6, #ARGV do
  if left <= 0 then break end
  local queue = ARGV[5] .. 'obq:' .. ARGV[r]
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', queue, '-inf', ARGV[1], 'LIMIT', 0, left)) do
    local text = redis.call('HGET', KEYS[1], id)
    if text then
      local token = ARGV[4] .. (#out / 3 + 1)
      redis.call('HSET', KEYS[2], id, token)
      redis.call('ZADD', queue, tonumber(ARGV[1]) + tonumber(ARGV[2]), id)
      table.insert(out, id); table.insert(out, text); table.insert(out, token)
      left = left - 1
    else
      redis.call('ZREM', queue, id)
    end
  end
end
return out
"""

# KEYS: outbox entries, the entry's route queue, claims, dead letters; ARGV: id, token, delivered, entry, state, due
_SETTLE = """
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[3] == '1' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
if ARGV[5] == 'dead' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[4], ARGV[6], ARGV[1])
else
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[1])
end
return 1
"""

# KEYS: outbox entries, the entry's route queue, dead letters, routes; ARGV: id, entry, due, route
_REQUEUE = """
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 0 end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[4])
return 1
"""

# KEYS: session hash, history, outcomes, outcome order, lease, sessions index, the session's
# record keys, due index, pending set, blob hash, blob byte count, the lease's queue, its
# counter, its waiters (no key named after a deleted session stays); ARGV: token, id, prefix
_DELETE = _FLAT_LUA + """
if ARGV[1] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[1] then return 0 end
retally(ARGV[3], KEYS[1], '[]')
unwait(ARGV[3], ARGV[2])
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner then redis.call('SREM', ARGV[3] .. 'o:' .. owner, ARGV[2]) end
local idle = redis.call('HGET', KEYS[1], 'ik')
if idle then redis.call('ZREM', idle, ARGV[2]) end
for _, key in ipairs(redis.call('SMEMBERS', KEYS[7])) do
  if redis.call('HGET', ARGV[3] .. 'rs', key) == ARGV[2] then
    redis.call('DEL', ARGV[3] .. 'rec:' .. key)
    redis.call('ZREM', ARGV[3] .. 'recs', key)
    redis.call('HDEL', ARGV[3] .. 'rs', key)
  end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[7], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14])
redis.call('ZREM', KEYS[6], ARGV[2])
redis.call('ZREM', KEYS[8], ARGV[2])
redis.call('SREM', KEYS[9], ARGV[2])
return 1
"""

# Sessions a chatrun before the idle index wrote enter it once, as written now. KEYS: session
# hash, the bot's idle index; ARGV: now, id. Only a session still there and not yet indexed.
_INDEX_IDLE = """
if redis.call('HEXISTS', KEYS[1], 'snap') == 0 or redis.call('HEXISTS', KEYS[1], 'ik') == 1 then return 0 end
redis.call('ZADD', KEYS[2], 'NX', ARGV[1], ARGV[2])
redis.call('HSET', KEYS[1], 'ik', KEYS[2])
return 1
"""

# KEYS: outbox entries, claims, dead letters, the old one queue; ARGV: id, the entry's route
# queue. Deletes one entry, pending or dead, from everywhere it is listed.
_DROP_ENTRY = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', ARGV[2], ARGV[1])
return 1
"""


CHATRUN_PARAMETERS = ("prefix", *BLOB_PARAMETERS)  # query parameters of the URL that are chatrun's, not redis-py's


def redis_url_parts(url: str) -> tuple[str, str]:
    """(the URL for redis-py, the key prefix): `prefix` is chatrun's own query parameter."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    prefix = next((v for k, v in query if k == "prefix"), "chatrun:")
    rest = urlencode([(k, v) for k, v in query if k not in CHATRUN_PARAMETERS])
    return urlunsplit(parts._replace(query=rest)), prefix


def url_parameter(url: str, name: str) -> str | None:
    return next((v for k, v in parse_qsl(urlsplit(url).query) if k == name), None)


def _check_parameters(client_url: str, shown: str) -> None:
    """ChatrunError for a query parameter of the URL that neither chatrun nor redis-py's
    connections take: redis-py hands it to each connection, which fails only at the first
    command, with a TypeError that reads like Redis being down."""
    import difflib
    import inspect

    import redis.asyncio.connection as connection

    known = set(CHATRUN_PARAMETERS) | set(connection.URL_QUERY_ARGUMENT_PARSERS)
    for kind in (connection.AbstractConnection, connection.Connection, connection.SSLConnection,
                 connection.UnixDomainSocketConnection):
        known |= {name for name in inspect.signature(kind.__init__).parameters if name not in ("self", "kwargs")}
    for name, _ in parse_qsl(urlsplit(client_url).query, keep_blank_values=True):
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            raise ChatrunError(f"store {shown}: unknown URL parameter `{name}`{hint} (chatrun's: "
                               f"{', '.join(CHATRUN_PARAMETERS)}; the others are redis-py's, e.g. socket_timeout)")


class RedisStore:
    """See the module's text. One asyncio connection pool; every method is a coroutine."""

    records_as_text = True  # put_record keeps the record's JSON text, not the object (TurnIndex relies on it)

    distributed = True
    has_outbox = True

    def __init__(self, url: str, settings: LeaseSettings = LeaseSettings()):  # noqa: B008 - frozen
        try:
            import redis.asyncio as aioredis
            from redis.asyncio.retry import Retry
            from redis.backoff import ExponentialBackoff
            from redis.exceptions import ConnectionError as RedisConnectionError
            from redis.exceptions import TimeoutError as RedisTimeoutError

            from chatrun.store.redis_errors import RedactingRedis
        except ModuleNotFoundError:
            raise ChatrunError(
                f"store {shown_url(url)}: the Redis store needs the redis package; "
                "install it with: pip install 'chatrun[redis]'"
            ) from None
        client_url, self.prefix = redis_url_parts(url)
        self.url = shown_url(url)
        _check_parameters(client_url, self.url)
        check_pool_parameters(client_url, self.url)
        self.settings = settings
        password = None if urlsplit(client_url).password else os.environ.get("CHATRUN_REDIS_PASSWORD")
        # Any: the stubs type replies as bytes | str; decode_responses=True makes them str.
        # A command that meets a dead connection (Redis restarted: every pooled connection is
        # stale) or a timeout reconnects and is sent once more. Redis may have run it already,
        # so every script is safe to resend: the commit recognises its own version (_COMMIT),
        # a lease's scripts check its token, a delete keeps the lease and deletes nothing more;
        # a resent outbox claim leaves its entries claimed until the claim's lease ends (they
        # are delivered late, not twice); a resent settle or requeue finds nothing left to do
        # and says so (False), its first send having done it.
        # Without `retry`, a pool's connections never retry.
        # A blocking pool: a command waits for a free connection instead of failing (redis_pool.py).
        connection = dict(decode_responses=True, password=password, socket_connect_timeout=5,
                          socket_keepalive=True)
        try:
            # RedactingRedis: an error reply names its command and kind, never a value (redis_errors.py).
            self.client: Any = RedactingRedis.for_store(blocking_pool(
                aioredis.BlockingConnectionPool, client_url, health_check_interval=30,
                retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), RECONNECT_RETRIES),
                retry_on_error=[RedisConnectionError, RedisTimeoutError], **connection,
            ), self.url)
            # /health's probe: a connection of its own, so a busy pool never reads as a stalled
            # Redis, and no retry, so a refused connection answers at once (ping()).
            self.probe: Any = aioredis.Redis.from_pool(aioredis.BlockingConnectionPool.from_url(
                without_pool_parameters(client_url), max_connections=1, timeout=None, **connection))
        except ValueError as exc:  # `socket_timeout=abc`: redis-py's "Invalid value for ..."
            raise ChatrunError(f"store {self.url}: {exc}") from None
        self._acquire = self.client.register_script(_ACQUIRE)
        self._leave = self.client.register_script(_LEAVE)
        self._renew = self.client.register_script(_RENEW)
        self._release = self.client.register_script(_RELEASE)
        self._commit = self.client.register_script(_COMMIT)
        self._delete = self.client.register_script(_DELETE)
        self._claim = self.client.register_script(_CLAIM)
        self._swap = self.client.register_script(_SWAP)
        self._settle = self.client.register_script(_SETTLE)
        self._requeue = self.client.register_script(_REQUEUE)
        self._reindex = self.client.register_script(_REINDEX)
        self._indexed = False  # the index and tallies hold every session (checked once: _ensure_indexed)
        self._index_idle = self.client.register_script(_INDEX_IDLE)
        self._drop_entry = self.client.register_script(_DROP_ENTRY)
        self.clock: Callable[[], float] = time.time  # what a commit's time is (tests pin it)
        self._outbox_keys = [f"{self.prefix}{k}" for k in ("ob", "obc", "obq", "obr", "obd")]
        # The attached files, in the same Redis (deleted by _DELETE with their session).
        self.blob_area = RedisBlobs(client_url, self.prefix, redis_blob_quota(url, self.url))
        self._pending_keys = [f"{self.prefix}due", f"{self.prefix}pending"]

    def _key(self, kind: str, session_id: str) -> str:
        return f"{self.prefix}{kind}:{session_id}"

    # -- leases ---------------------------------------------------------------------------

    async def acquire(self, session_id: str, wait: float, reject: bool = False,
                      stop: Callable[[], bool] | None = None) -> Lease:
        token = secrets.token_hex(12)
        # The session's usage record (store/billing.py) comes back with the lease: its turn needs no read of it.
        keys = [*(self._key(k, session_id) for k in ("l", "q", "qn", "qa", "s")), f"{self.prefix}rec:{usage_key(session_id)}"]
        ttl_ms = int(self.settings.ttl * 1000)
        args: list[str | int] = [token, ttl_ms, WAITER_TTL_MS, "1" if reject else "0", QUEUE_KEYS_TTL_MS]
        deadline = time.monotonic() + wait
        pause = 0.002
        try:
            while True:
                granted, detail, *usage = await self._acquire(keys=keys, args=args)
                if granted == 1:
                    lease = Lease(session_id, token, detail or None, usage_read=True, usage_record=usage[0] if usage else None)
                    lease.renewer = asyncio.ensure_future(self._keep(lease))
                    return lease
                if detail == -1:
                    raise SessionBusy(f"session {session_id} is running a turn (if busy: reject)")
                if stop is not None and stop():
                    raise SessionBusy(f"session {session_id}: the server is shutting down")
                if time.monotonic() >= deadline:
                    raise SessionBusy(
                        f"session {session_id} stayed busy for {wait:g} s (queue position {int(detail) + 1}); "
                        "try again later"
                    )
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.settings.poll)
        except BaseException:
            with contextlib.suppress(Exception):  # stop waiting: leave the queue at once
                await asyncio.shield(self._leave(keys=[keys[1], keys[3]], args=[token]))
            raise

    async def _keep(self, lease: Lease) -> None:
        """Renew the lease every ttl/3 until released; mark it lost if it slipped away."""
        key = self._key("l", lease.session_id)
        ttl_ms = int(self.settings.ttl * 1000)
        while True:
            await asyncio.sleep(self.settings.ttl / 3)
            try:
                renewed = await self._renew(keys=[key], args=[lease.token or "", ttl_ms])
            except Exception as exc:  # Redis unreachable: try again; the commit's check decides
                log.warning("could not renew the lease on session %s: %s", lease.session_id, exc)
                continue
            if not renewed:
                lease.lost = True
                log.warning("lost the lease on session %s", lease.session_id)
                return

    async def sweep_leases(self) -> int:
        """Nothing to do: a lease's key, and its queue's, carry their TTL (PX, PEXPIRE), so what
        a process that died left goes by itself (PostgresStore.sweep_leases deletes its rows)."""
        return 0

    async def release(self, lease: Lease) -> None:
        if lease.renewer is not None:
            lease.renewer.cancel()
        if lease.token is not None:
            await self._release(keys=[self._key("l", lease.session_id)], args=[lease.token])

    # -- sessions -------------------------------------------------------------------------

    async def version(self, session_id: str) -> str | None:
        version: str | None = await self.client.hget(self._key("s", session_id), "v")
        return version

    async def load_session(self, session_id: str) -> SessionRecord | None:
        fields: dict[str, str] = await self.client.hgetall(self._key("s", session_id))
        if not fields or "snap" not in fields:
            return None
        try:
            record = SessionRecord.decode(session_id, fields["snap"], fields["v"])
            for name, text in fields.items():
                if name.startswith("m:"):
                    record.memories[name[2:]] = [message_from_dict(d) for d in json.loads(text)]
                    record.sizes[name[2:]] = len(text)
        except (ValueError, KeyError, TypeError) as exc:
            raise ChatrunError(f"store {self.url}: session {session_id} is corrupt ({exc})") from None
        return record

    async def commit_turn(self, commit: Commit, lease: Lease | None) -> str:
        session_id, expected = commit.session_id, commit.expected
        if expected is None:  # the Lua script fences every write; an unchecked one has no meaning here
            raise ChatrunError(f"store {self.url}: session {session_id}: a commit names the version it expects")
        if lease is not None and lease.lost:
            raise LeaseLost(session_id)
        owner = commit.owner if expected == CREATE else None
        head: list[str | int | float] = [
            lease.token if lease is not None and lease.token else "",
            # The random part also tells this commit's own resend apart (_COMMIT): 64 bits.
            expected, secrets.token_hex(8), commit.snapshot_json, session_id,
            commit.outcome[0] if commit.outcome else "", commit.outcome[1] if commit.outcome else "",
            KEEP_OUTCOMES, self.clock(), owner or "",
        ]
        args: list[str | int | float] = [len(commit.memories_json)]
        for mid, text in commit.memories_json.items():
            args += [mid, text if text is not None else ""]
        args.append(len(commit.history_json))
        args += commit.history_json
        args.append(len(commit.outbox))
        for entry in commit.outbox:
            args += [entry.id, entry.due, entry.to_json(), self._queue(entry.route), entry.route]
        args += ["" if commit.due is None else commit.due, commit.pending_count]
        args += [self.prefix, tallies_json(commit.tallies), *_waiting_args(commit.waiting)]
        args.append(commit.quota if commit.quota_owner is not None else 0)
        keys = [self._key(k, session_id) for k in ("s", "h", "l", "r", "ro")]
        keys += [f"{self.prefix}sessions", f"{self.prefix}o:{owner or ''}", self._outbox_keys[0], self._outbox_keys[3],
                 *self._pending_keys, self._idle_key(commit.bot or ""), f"{self.prefix}recs", f"{self.prefix}rs"]
        for _ in range(REMEMBER_ATTEMPTS):
            remembered = await self._remembered_args(commit, float(head[8]))
            status, detail = await self._commit(keys=keys, args=[*head, *remembered, *args])
            if status != "memory":
                break
        else:
            raise ChatrunError(f"store {self.url}: session {session_id}: the user's record {detail} kept changing "
                               f"while the turn was saved ({REMEMBER_ATTEMPTS} tries); the turn was not saved")
        if status == "lease":
            raise LeaseLost(session_id)
        if status == "stale":
            raise StaleVersion(session_id, expected, detail or None)
        if status == "quota":
            commit.check_quota(int(detail))
        return str(detail)

    async def _remembered_args(self, commit: Commit, now: float) -> list[str | int | float]:
        """The user-record part of _COMMIT's arguments: each record the commit's turns change
        (memory, budget), read now, with the text it must still hold and the one it gets
        (store/user_records.py)."""
        read: dict[str, str] = {}  # record key -> its text as read
        after: dict[str, str] = {}  # record key -> its text once every write of the commit is applied
        for item in commit.user_writes():
            key = user_records.key_of(item)
            if key not in read:
                read[key] = after[key] = await self.client.get(f"{self.prefix}rec:{key}") or ""
            record = user_records.written(from_json(after[key]) if after[key] else None, item, now)
            after[key] = "" if record is None else to_json(f"record {key}", record)
        out: list[str | int | float] = [len(read)]
        for key, text in read.items():
            out += [f"{self.prefix}rec:{key}", key, text, after[key]]
        return out

    async def load_history(self, session_id: str) -> list[JSONObject]:
        return [from_json(e) for e in await self.client.lrange(self._key("h", session_id), 0, -1)]

    async def get_outcome(self, session_id: str, request_id: str) -> JSONObject | None:
        text = await self.client.hget(self._key("r", session_id), request_id)
        return None if text is None else from_json(text)

    async def request_ids(self, session_id: str) -> list[str]:
        """The ids of the requests whose outcomes the session keeps (store/replays.py)."""
        return list(await self.client.hkeys(self._key("r", session_id)))

    async def delete_session(self, session_id: str, memory_ids: list[str], lease: Lease | None) -> None:
        keys = [self._key(k, session_id) for k in ("s", "h", "r", "ro", "l")]
        keys += [f"{self.prefix}sessions", self._key("rk", session_id), *self._pending_keys]
        keys += self.blob_area.keys(session_id)
        keys += [self._key(k, session_id) for k in ("q", "qn", "qa")]
        token = lease.token if lease is not None and lease.token else ""
        if not await self._delete(keys=keys, args=[token, session_id, self.prefix]):
            raise LeaseLost(session_id)

    async def count_owned(self, owner: str) -> int:
        return int(await self.client.scard(f"{self.prefix}o:{owner}"))

    # -- retention -------------------------------------------------------------------------

    def _idle_key(self, bot: str) -> str:
        return f"{self.prefix}idle:{bot}"

    async def list_idle(self, bot: str, before: float, limit: int) -> list[str]:
        """The sessions of `bot` last committed before `before`, longest idle first (one ZRANGEBYSCORE)."""
        await self._index_old_sessions()
        return list(await self.client.zrangebyscore(self._idle_key(bot), "-inf", f"({before}", start=0, num=limit))

    async def _index_old_sessions(self) -> None:
        """Once per store: the sessions an older chatrun wrote enter the idle index as written
        now (their last write is unknown: retention counts from the upgrade, never earlier)."""
        marker = f"{self.prefix}idle-indexed"
        if await self.client.exists(marker):
            return
        now = self.clock()
        async for sid in self.client.zscan_iter(f"{self.prefix}sessions", count=500):
            session_id = sid[0] if isinstance(sid, tuple | list) else sid
            snap = await self.client.hget(self._key("s", session_id), "snap")
            if snap is None:
                continue
            bot = SessionRecord.decode(session_id, snap, "").bot or ""
            await self._index_idle(keys=[self._key("s", session_id), self._idle_key(bot)], args=[now, session_id])
        await self.client.set(marker, str(now))

    async def sessions_of(self, owner: str) -> list[str]:
        return sorted(await self.client.smembers(f"{self.prefix}o:{owner}"))

    # -- RecordStore (asynchronously) ------------------------------------------------------

    async def get_record(self, key: str) -> JSONObject | None:
        text = await self.client.get(f"{self.prefix}rec:{key}")
        return None if text is None else from_json(text)

    async def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None:
        await self.put_record_text(key, to_json(f"record {key}", record), session)

    async def put_record_text(self, key: str, text: str, session: str | None = None) -> bool:
        """put_record of a record given as its JSON text (an object's: the caller's word for it);
        True: saved (the /v1 index's list of kept turns, written every turn, has its text)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(f"{self.prefix}rec:{key}", text)
            pipe.zadd(f"{self.prefix}recs", {key: 0})
            if session is not None:
                pipe.sadd(self._key("rk", session), key)
                pipe.hset(f"{self.prefix}rs", key, session)
            else:
                pipe.hdel(f"{self.prefix}rs", key)
            await pipe.execute()
        return True

    async def claim_record(self, key: str, record: JSONObject) -> bool:
        """put-if-absent: SET NX, atomic across every replica sharing the Redis."""
        text = to_json(f"record {key}", record)
        if not await self.client.set(f"{self.prefix}rec:{key}", text, nx=True):
            return False
        await self.client.zadd(f"{self.prefix}recs", {key: 0})  # listed (the claim itself is the SET)
        return True

    async def swap_record(self, key: str, expected: JSONObject, record: JSONObject | None) -> bool:
        """Compare-and-swap (chatrun.store.RecordSwaps): one Lua script, atomic across every replica."""
        old, text = swapped_texts(key, expected, record)
        args = [old, key] if text is None else [old, key, text]
        keys = [f"{self.prefix}rec:{key}", f"{self.prefix}recs", f"{self.prefix}rs"]
        return bool(await self._swap(keys=keys, args=args))

    async def delete_record(self, key: str) -> None:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(f"{self.prefix}rec:{key}")
            pipe.zrem(f"{self.prefix}recs", key)
            pipe.hdel(f"{self.prefix}rs", key)
            await pipe.execute()

    async def list_sessions(self) -> list[str]:
        return list(await self.client.zrange(f"{self.prefix}sessions", 0, -1))

    async def record_keys(self, prefix: str) -> list[str]:
        """The keys of the records whose key starts with `prefix`: a range of the records' index
        (its cost grows with the keys listed, not with the sessions)."""
        await self._ensure_indexed()
        top = prefix + "\U0010ffff"
        return list(await self.client.zrangebylex(f"{self.prefix}recs", f"[{prefix}", f"({top}"))

    async def _index_records(self) -> None:
        """The records an older chatrun saved, into the records' index (one SCAN, once)."""
        start = f"{self.prefix}rec:"
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in start) + "*"
        keys = [str(k)[len(start):] async for k in self.client.scan_iter(match=pattern, count=1000)]
        for first in range(0, len(keys), 1000):
            await self.client.zadd(f"{self.prefix}recs", dict.fromkeys(keys[first:first + 1000], 0))

    # -- sessions waiting for a party (PendingIndex, asynchronously) -----------------------------

    async def list_due(self, now: float) -> list[str]:
        """Sessions with a pending item due by `now` (epoch seconds), earliest first: one ZRANGEBYSCORE."""
        return list(await self.client.zrangebyscore(self._pending_keys[0], "-inf", now))

    async def list_pending(self, bot: str | None = None, kind: str | None = None) -> list[PendingSession]:
        """Sessions with open pending items: the set's members, then one HGET of each snapshot
        (one pipelined round trip): the cost grows with the sessions that wait, not with all."""
        ids = sorted(await self.client.smembers(self._pending_keys[1]))
        if not ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.hmget(self._key("s", sid), "snap", "v")
            rows = await pipe.execute()
        found = (pending_session(SessionRecord.decode(sid, snap, version), bot, kind)
                 for sid, (snap, version) in zip(ids, rows, strict=True) if snap is not None)
        return [entry for entry in found if entry is not None]

    # -- flat reads (chatrun.store.FlatIndex, asynchronously) ------------------------------------

    async def waiting_page(self, key: str, after: tuple[float, str] | None, until: float | None,
                           limit: int) -> list[WaitingEntry]:
        """One ZRANGEBYSCORE from `after` (sessions at the same position: skipped by id) and one
        MGET of their entries."""
        await self._ensure_indexed()
        index, top = f"{self.prefix}wi:{key}", "+inf" if until is None else repr(until)
        low, skip, ids = "-inf" if after is None else repr(after[0]), 0, list[str]()
        while len(ids) < limit:
            found = await self.client.zrangebyscore(index, low, top, start=skip, num=limit + 50, withscores=True)
            ids += [sid for sid, at in found if after is None or (at, sid) > after][: limit - len(ids)]
            if len(found) < limit + 50:
                break
            skip += len(found)
        texts = await self.client.mget([f"{self.prefix}w:{sid}" for sid in ids]) if ids else []
        return [WaitingEntry.from_json(t) for t in texts if t is not None]

    async def read_tallies(self, family: str, names: list[str] | None = None) -> dict[str, int]:
        await self._ensure_indexed()
        hash_key = f"{self.prefix}t:{family}"
        if names is None:
            return {k: int(v) for k, v in (await self.client.hgetall(hash_key)).items()}
        values = await self.client.hmget(hash_key, names) if names else []
        return {name: int(v) for name, v in zip(names, values, strict=True) if v is not None}

    async def _ensure_indexed(self) -> None:
        """Sessions an older chatrun stored are indexed once, by the first replica that reads
        the index (each by a script that checks its version: replicas doing it at once, or a
        commit meanwhile, leave it true), then the store is marked."""
        if self._indexed:
            return
        marker = f"{self.prefix}flat"
        if not await self.client.get(marker):
            await self._index_records()
            for start in range(0, await self.client.zcard(f"{self.prefix}sessions"), 500):
                await self._reindex_sessions(await self.client.zrange(f"{self.prefix}sessions", start, start + 499))
            await self.client.set(marker, "1")
        self._indexed = True

    async def _reindex_sessions(self, ids: list[str]) -> None:
        for sid in ids:
            snap, version = await self.client.hmget(self._key("s", sid), "snap", "v")
            if snap is None:
                continue
            snapshot = from_json(snap)
            await self._reindex(keys=[self._key("s", sid)], args=[
                self.prefix, sid, version, tallies_json(tallies_of(snapshot)),
                *_waiting_args(waiting_entry(sid, snapshot))])

    # -- the outbox (OutboxStore, asynchronously) ---------------------------------------------

    def _queue(self, route: str) -> str:
        """The key of one route's queue of pending outbox entries."""
        return f"{self.prefix}obq:{route}"

    async def claim_outbox(self, now: float, lease: float, limit: int, routes: Collection[str]) -> list[OutboxEntry]:
        entries, claims, old, known, _ = self._outbox_keys
        found = await self._claim(keys=[entries, claims, old, known],
                                  args=[now, lease, limit, secrets.token_hex(6) + "-", self.prefix, *routes])
        claimed = []
        for i in range(0, len(found), 3):
            entry = OutboxEntry.from_json(found[i + 1])
            entry.claim, entry.claimed_until = found[i + 2], now + lease
            claimed.append(entry)
        return claimed

    async def settle_outbox(self, entry: OutboxEntry, delivered: bool) -> bool:
        saved = unclaimed(entry)
        args = [entry.id, entry.claim or "", "1" if delivered else "0", saved.to_json(), saved.state,
                saved.due if saved.state != DEAD else time.time()]
        entries, claims, _, _, dead = self._outbox_keys
        return bool(await self._settle(keys=[entries, self._queue(entry.route), claims, dead], args=args))

    async def list_outbox(self, state: str | None = None, limit: int = 100) -> list[OutboxEntry]:
        entries, _, old, known, dead = self._outbox_keys
        ids: list[str] = []
        if state in (None, PENDING):  # every route's queue, merged by due time
            queues = [old, *(self._queue(route) for route in sorted(await self.client.smembers(known)))]
            scored = [pair for queue in queues for pair in await self.client.zrange(queue, 0, limit - 1,
                                                                                    withscores=True)]
            ids += [entry_id for entry_id, _ in sorted(scored, key=lambda pair: pair[1])]
        if state in (None, DEAD):
            ids += await self.client.zrange(dead, 0, limit - 1)
        texts = await self.client.hmget(entries, ids[:limit]) if ids else []
        return [OutboxEntry.from_json(t) for t in texts if t is not None]

    async def delete_outbox(self, entry_ids: Collection[str]) -> int:
        entries, claims, old, _, dead = self._outbox_keys
        deleted = 0
        for entry_id in entry_ids:
            text = await self.client.hget(entries, entry_id)
            if text is None:
                continue
            queue = self._queue(OutboxEntry.from_json(text).route)
            deleted += int(await self._drop_entry(keys=[entries, claims, dead, old], args=[entry_id, queue]))
        return deleted

    async def requeue_outbox(self, entry_id: str, now: float) -> bool:
        entries, _, _, known, dead = self._outbox_keys
        text = await self.client.hget(entries, entry_id)
        if text is None:
            return False
        entry = requeued(OutboxEntry.from_json(text), now)
        keys = [entries, self._queue(entry.route), dead, known]
        return bool(await self._requeue(keys=keys, args=[entry_id, entry.to_json(), entry.due, entry.route]))

    async def ping(self) -> None:
        """Raises ChatrunError unless Redis answers, on the probe's own connection (the caller
        bounds the wait: SessionRegistry.store_state)."""
        try:
            await self.probe.ping()
        except Exception as exc:
            raise ChatrunError(f"store {self.url}: cannot reach Redis: {exc}") from None

    def pool_use(self) -> tuple[int, int]:
        """(connections in use, the pool's max_connections): /health shows them, for sizing."""
        pool = self.client.connection_pool
        return len(pool._in_use_connections), pool.max_connections

    async def close(self) -> None:
        await self.client.aclose()
        await self.probe.aclose()
        self.blob_area.close()


def _waiting_args(waiting: WaitingEntry | None) -> list[str | int | float]:
    """A waiting entry as _FLAT_LUA's `wait` takes it: its JSON, then its positions."""
    if waiting is None:
        return ["", 0]
    args: list[str | int | float] = [waiting.to_json(), len(waiting.positions)]
    for key, at in waiting.positions.items():
        args += [key, at]
    return args


def check_reachable(url: str) -> None:
    """Ping Redis with a client of its own (made and closed here, on a loop of its own), so a
    command line can say "cannot reach Redis" before it starts serving. Raises ChatrunError."""
    import asyncio

    async def ping() -> None:
        store = RedisStore(url)
        try:
            await store.ping()
        finally:
            await store.close()

    asyncio.run(ping())
