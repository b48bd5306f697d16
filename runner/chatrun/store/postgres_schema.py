"""The Postgres store's schema and its migrations (store/postgres.py).

The database keeps its own record of what was applied: table `chatrun_migrations` (version,
applied_at). MIGRATIONS are applied in order, each in its own transaction, under an advisory
lock, so replicas starting at once apply each migration once; a database at a version newer
than this chatrun knows is refused (a ChatrunError naming both). A new migration is a new
entry at the end: never edit one that shipped.

JSON values are kept as text, written and read as the other stores do (record.py encodes them
once per commit); what the store queries is in columns of its own, computed by chatrun when it
writes (a session's bot and owner, an outbox entry's route).
"""

from __future__ import annotations

# (version, what it does, SQL)
MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "sessions, memories, history, outcomes, records, outbox, operators' index, tallies, leases, files", """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    seq        BIGSERIAL,                   -- creation order (list_sessions: oldest first)
    snapshot   TEXT NOT NULL,
    version    TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,   -- the last commit (epoch s): retention's index
    bot        TEXT NOT NULL DEFAULT '',
    owner      TEXT,
    due        DOUBLE PRECISION,            -- the earliest due time of its pending items, or NULL
    pending    INTEGER NOT NULL DEFAULT 0,  -- how many pending items it holds
    tallies    TEXT NOT NULL DEFAULT '[]'   -- what it counts for (record.tallies_of, JSON)
);
CREATE INDEX sessions_idle ON sessions (bot, updated_at);
CREATE INDEX sessions_owner ON sessions (owner) WHERE owner IS NOT NULL;
CREATE INDEX sessions_due ON sessions (due) WHERE due IS NOT NULL;
CREATE INDEX sessions_pending ON sessions (seq) WHERE pending > 0;
CREATE TABLE memories (
    memory_id TEXT PRIMARY KEY,
    messages  TEXT NOT NULL
);
CREATE TABLE history (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    entry      TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE requests (
    session_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    outcome    TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    PRIMARY KEY (session_id, request_id)
);
CREATE TABLE records (
    key     TEXT COLLATE "C" PRIMARY KEY,   -- byte order: record_keys(prefix) is a range of it
    record  TEXT NOT NULL,
    session TEXT                            -- set: the record is deleted with that session
);
CREATE INDEX records_by_session ON records (session) WHERE session IS NOT NULL;
CREATE TABLE outbox (
    id    TEXT PRIMARY KEY,                 -- the idempotency key
    seq   BIGSERIAL,                        -- oldest first
    route TEXT NOT NULL,                    -- "<bot>/<sink>": a worker claims the routes it serves
    state TEXT NOT NULL,                    -- pending | dead
    due   DOUBLE PRECISION NOT NULL,        -- when a worker may claim it (its next try, or its claim's end)
    claim TEXT,                             -- the token of the worker that claimed it last
    entry TEXT NOT NULL                     -- OutboxEntry JSON
);
CREATE INDEX outbox_due ON outbox (route, state, due);
CREATE TABLE waiting (
    session_id TEXT PRIMARY KEY,
    entry      TEXT NOT NULL                -- WaitingEntry JSON
);
CREATE TABLE waiting_index (
    key        TEXT NOT NULL,               -- record.waiting_key / age_key
    position   DOUBLE PRECISION NOT NULL,
    session_id TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (key, position, session_id)
);
CREATE INDEX waiting_index_session ON waiting_index (session_id);
CREATE TABLE tallies (
    family TEXT NOT NULL,                   -- owner | version | pending
    name   TEXT NOT NULL,
    n      BIGINT NOT NULL,
    PRIMARY KEY (family, name)
);
CREATE TABLE leases (
    session_id TEXT PRIMARY KEY,
    token      TEXT NOT NULL,
    expires    DOUBLE PRECISION NOT NULL    -- epoch ms by the database's clock
);
CREATE TABLE lease_queue (
    session_id TEXT NOT NULL,
    token      TEXT NOT NULL,
    arrival    BIGSERIAL,
    alive      DOUBLE PRECISION NOT NULL,   -- epoch ms the waiter must poll again by, or be dropped
    PRIMARY KEY (session_id, token)
);
CREATE INDEX lease_queue_order ON lease_queue (session_id, arrival);
CREATE TABLE blobs (
    session_id TEXT NOT NULL,
    ref        TEXT NOT NULL,               -- SHA-256 of the bytes
    data       BYTEA NOT NULL,
    PRIMARY KEY (session_id, ref)
);
-- One look at a session's lease and queue, in one round trip (the steps of Redis's _ACQUIRE):
-- {'1', version} granted; {'0', n} n waiters ahead; {'0', '-1'} busy and `reject`.
CREATE FUNCTION chatrun_acquire(sid TEXT, tok TEXT, ttl_ms DOUBLE PRECISION, waiter_ms DOUBLE PRECISION,
                                reject BOOLEAN) RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    now_ms DOUBLE PRECISION := extract(epoch FROM clock_timestamp()) * 1000;
    holder TEXT;
    queued BOOLEAN;
    ahead BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('lease:' || sid, 0));
    SELECT l.token INTO holder FROM leases l WHERE l.session_id = sid AND l.expires > now_ms;
    IF holder = tok THEN
        RETURN ARRAY['1', COALESCE((SELECT s.version FROM sessions s WHERE s.session_id = sid), '')];
    END IF;
    DELETE FROM lease_queue q WHERE q.session_id = sid AND q.alive < now_ms AND q.token <> tok;
    queued := EXISTS (SELECT 1 FROM lease_queue q WHERE q.session_id = sid AND q.token = tok);
    IF reject AND NOT queued AND (holder IS NOT NULL OR EXISTS (SELECT 1 FROM lease_queue q WHERE q.session_id = sid)) THEN
        RETURN ARRAY['0', '-1'];
    END IF;
    INSERT INTO lease_queue (session_id, token, alive) VALUES (sid, tok, now_ms + waiter_ms)
        ON CONFLICT (session_id, token) DO UPDATE SET alive = excluded.alive;
    SELECT count(*) INTO ahead FROM lease_queue q WHERE q.session_id = sid AND q.arrival <
        (SELECT m.arrival FROM lease_queue m WHERE m.session_id = sid AND m.token = tok);
    IF holder IS NULL AND ahead = 0 THEN
        INSERT INTO leases (session_id, token, expires) VALUES (sid, tok, now_ms + ttl_ms)
            ON CONFLICT (session_id) DO UPDATE SET token = excluded.token, expires = excluded.expires;
        DELETE FROM lease_queue q WHERE q.session_id = sid AND q.token = tok;
        RETURN ARRAY['1', COALESCE((SELECT s.version FROM sessions s WHERE s.session_id = sid), '')];
    END IF;
    RETURN ARRAY['0', ahead::TEXT];
END
$$;
"""),
    (2, "the shared knowledge index: files, passages (tsvector, GIN), vectors, state, terms (knowledge/pg_index.py)", """
CREATE TABLE knowledge_files (
    bot    TEXT NOT NULL,
    source TEXT NOT NULL,
    path   TEXT NOT NULL,                   -- relative to the source's folder
    hash   TEXT NOT NULL,                   -- SHA-256 of its bytes: unchanged, it is not read again
    PRIMARY KEY (bot, source, path)
);
CREATE TABLE knowledge_passages (
    id       BIGSERIAL PRIMARY KEY,
    bot      TEXT NOT NULL,
    source   TEXT NOT NULL,
    path     TEXT NOT NULL,
    anchor   TEXT NOT NULL,
    title    TEXT NOT NULL,
    body     TEXT NOT NULL,
    digest   TEXT NOT NULL,                 -- vectors.passage_digest: what its vectors are keyed by
    language REGCONFIG NOT NULL,            -- its text search configuration
    document TSVECTOR NOT NULL              -- heading weighted A, text D
);
CREATE INDEX knowledge_passages_document ON knowledge_passages USING GIN (document);
CREATE INDEX knowledge_passages_at ON knowledge_passages (bot, source, path, anchor);
CREATE INDEX knowledge_passages_digest ON knowledge_passages (digest);
CREATE TABLE knowledge_vectors (
    model  TEXT NOT NULL,
    digest TEXT NOT NULL,
    vector REAL[] NOT NULL,                 -- a unit vector (pgvector, when installed, casts it)
    PRIMARY KEY (model, digest)
);
CREATE TABLE knowledge_state (
    bot        TEXT PRIMARY KEY,
    version    TEXT NOT NULL,               -- knowledge/index.py INDEX_VERSION of its last refresh
    generation BIGINT NOT NULL DEFAULT 0,   -- bumped by each change: replicas re-read vectors they hold
    sources    TEXT NOT NULL DEFAULT '',
    passages   INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE knowledge_terms (              -- in how many passages each lexeme is (a search leaves
    bot      TEXT NOT NULL,                 -- out a word in most of them while a rarer one remains)
    term     TEXT NOT NULL,
    passages INTEGER NOT NULL,
    PRIMARY KEY (bot, term)
);
"""),
    (3, "web pages in the shared knowledge index: each page's validators (knowledge/pg_index.py)", """
CREATE TABLE knowledge_web_pages (          -- a web source's page (its passages are knowledge_files/passages
    bot           TEXT NOT NULL,            -- rows whose path is its URL): what a conditional request sends
    source        TEXT NOT NULL,
    url           TEXT NOT NULL,
    etag          TEXT,
    last_modified TEXT,
    PRIMARY KEY (bot, source, url)
);
"""),
]

SCHEMA_VERSION = MIGRATIONS[-1][0]

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS chatrun_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""

MIGRATION_LOCK = 0x63686174  # the advisory lock the migrating replica holds ("chat")
