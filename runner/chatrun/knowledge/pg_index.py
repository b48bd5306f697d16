"""The shared knowledge index: a bot's passages in PostgreSQL, read by every replica at once.

The SQLite index (index.py) is one file in a bot's folder: each replica keeps its own. With many
replicas, `chatrun index BOT --store postgresql://…` builds the index once, in the tables of
migration 2 (store/postgres_schema.py), and every `chatrun serve --store postgresql://…` reads
them (`--knowledge-store` names another database, or `local` keeps the bot folder's SQLite).
Same interface as KnowledgeIndex (refresh, embed_missing, search, nearest, find, count), so the
Library, the search tool and the turns do not know which one they read.

Rows are keyed by the bot's name and its sources' digest (knowledge.index_key), so one database
serves many bots, two of one name included; an index kept under the bare name by an earlier
release is taken over by the first refresh (`_adopt`). A refresh is incremental as
the SQLite one is (a file whose SHA-256 is unchanged is not read again) and takes one transaction
per source, under an advisory lock per bot: a reader sees a source's passages all old or all new
(PostgreSQL's MVCC: readers never wait), and two indexers never interleave.

Full-text ranking is PostgreSQL's own: a `tsvector` per passage (its heading weighted A, its
text D; a GIN index), the query's words OR-ed into a `tsquery` to match, and a passage's score
the sum over the words of `ts_rank` (a heading weighing TITLE_WEIGHT times its text, divided by
1 + log(length)) times the word's IDF, BM25's, from `knowledge_terms` (each lexeme's passages,
counted by `ts_stat` at the end of a refresh that changed anything). PostgreSQL's rankings
have no IDF of their own, and without it a common word weighs as much as a rare one
(`score_sql`). From SELECTIVE_FROM passages, a word in most of them is left out while a rarer
one remains, as in the SQLite index. Each passage keeps its text search configuration
(`language`, a `regconfig`): the source's `language:` (the Library sets `languages`), else
SOURCE_LANGUAGE ('english', the nearest to FTS5's Porter stemmer); a search groups the sources
by configuration (each group's words stemmed and weighed in its own), and a source whose
configuration changed has every file and page cut again. The ranking still
differs from FTS5's BM25: the same passages are found, their order may differ (tests compare
sets).

Web sources (`urls:`, `sitemap:`) are fetched by web.py (`chatrun index --store` only) and
written through the PageIndex seam (`stored_pages`, `writing_pages`, `pages_done`): each page's
validators in `knowledge_web_pages` (migration 3), a source's pages in one transaction.

Vectors (a source's `embeddings:`) are `real[]` rows keyed by model and passage digest, as in
the SQLite index. With the pgvector extension installed in the database (`CREATE EXTENSION
vector`), `nearest` ranks them in PostgreSQL (`<#>`, the inner product of unit vectors);
without it (Debian 12 ships no pgvector package), they are read once per change of the index
and ranked by vectors.VectorTable (numpy when installed), as the SQLite index does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from chatrun.errors import ChatrunError
from chatrun.knowledge.chunks import Chunk
from chatrun.knowledge.index import (
    COMMON_SHARE,
    INDEX_VERSION,
    SELECTIVE_FROM,
    TITLE_WEIGHT,
    Hit,
    Refreshed,
    SourceFile,
    StoredPage,
    query_words,
    read_source_file,
)
from chatrun.knowledge.vectors import (
    Embedder,
    EmbeddingsUnavailable,
    VectorTable,
    embedded_text,
    passage_digest,
)

log = logging.getLogger("chatrun.knowledge")

SOURCE_LANGUAGE = "english"  # a source's text search configuration when it declares no `language:`
# ts_rank's weights, in the order {D, C, B, A}: a heading (A) weighs TITLE_WEIGHT times text (D).
RANK_WEIGHTS = "{%s,0.4,0.6,1.0}" % (1.0 / TITLE_WEIGHT)
RANK_NORMALISATION = 1  # divide by 1 + log(length): a long passage does not win by length alone
EMBED_BATCH = 256


def _migrated(conninfo: str, shown: str) -> None:
    """Bring the database's schema up to date (the Postgres store's migrations, which hold the
    knowledge tables), on a connection and event loop of its own."""
    import psycopg

    from chatrun.store.postgres import migrate

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(conninfo, connect_timeout=5) as conn:
            await migrate(conn, shown)

    failed: list[BaseException] = []

    def in_thread() -> None:  # a thread of its own: the caller may be inside an event loop
        try:
            asyncio.run(run())
        except BaseException as exc:  # handed to the caller
            failed.append(exc)

    worker = threading.Thread(target=in_thread, name="chatrun-knowledge-migrate")
    worker.start()
    worker.join()
    if failed:
        exc = failed[0]
        if isinstance(exc, psycopg.Error):
            raise ChatrunError(f"knowledge store {shown}: cannot reach PostgreSQL: {str(exc).strip()}") from None
        raise exc


class PgIndex:
    """A bot's passages in PostgreSQL (see the module's text)."""

    def __init__(self, url: str, bot: str, legacy: str | None = None):
        from chatrun.store.postgres import _import_psycopg, postgres_url_parts
        from chatrun.store.urls import shown_url

        self.url = shown_url(url)
        self.bot = bot  # the rows' key (knowledge.index_key: the bot's name and its sources' digest)
        self.legacy = legacy  # the key of an index kept before (the bare name): found, not built again
        if _import_psycopg() is None:
            raise ChatrunError(f"knowledge store {self.url}: needs psycopg 3; install it with: "
                               "pip install 'chatrun[postgres]'")
        self.conninfo, size = postgres_url_parts(url)
        self.max_connections = min(size, 4)
        self.pgvector = False  # the extension is installed in the database: vectors ranked there
        self._pool: Any = None
        self._opening = threading.Lock()
        self._vectors: dict[str, tuple[int, VectorTable]] = {}
        self.languages: dict[str, str] = {}  # source -> its `language:` (the Library sets it); else SOURCE_LANGUAGE

    def language(self, source: str) -> str:
        """A source's text search configuration."""
        return self.languages.get(source) or SOURCE_LANGUAGE

    @property
    def where(self) -> str:
        """What `chatrun index` names as the index's place."""
        return f"{self.url} (bot {self.bot})"  # the key: which bot and which sources

    # -- plumbing ----------------------------------------------------------------------------

    def pool(self) -> Any:
        """The connection pool, opened (and the schema migrated) on first use."""
        if self._pool is None:
            with self._opening:
                if self._pool is None:
                    from psycopg_pool import ConnectionPool

                    _migrated(self.conninfo, self.url)
                    pool = ConnectionPool(self.conninfo, min_size=1, max_size=self.max_connections, open=False,
                                          check=ConnectionPool.check_connection, timeout=30,
                                          kwargs={"connect_timeout": 5})
                    pool.open(wait=True, timeout=30)
                    with pool.connection() as conn:
                        self.pgvector = _has_pgvector(conn)
                    self._pool = pool
        return self._pool

    def _run(self, what: str, work: Callable[[Any], Any]) -> Any:
        """`work(connection)` in one transaction; a database error is a ChatrunError naming `what`."""
        import psycopg

        try:
            with self.pool().connection() as conn, conn.transaction():
                return work(conn)
        except psycopg.Error as exc:
            raise ChatrunError(f"knowledge store {self.url}: could not {what}: {str(exc).strip()}") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def built(self) -> bool:
        """The bot was indexed here, by this index version (a serving replica then only reads)."""
        row = self._run("read the index's state", lambda c: c.execute(
            "SELECT version FROM knowledge_state WHERE bot = %s", (self.bot,)).fetchone())
        return row is not None and row[0] == INDEX_VERSION

    # -- building ----------------------------------------------------------------------------

    def refresh(self, files: Sequence[SourceFile], sources: Iterable[str],
                step: Callable[[SourceFile], None] | None = None, web: Iterable[str] = ()) -> Refreshed:
        """Bring the bot's passages up to date with `files`: read only the files whose bytes
        changed; one transaction per source (readers see a source all old or all new). The
        sources in `web` are left as they are (web pages: written by web.refresh_web through
        `writing_pages`, at `chatrun index` only)."""
        done = Refreshed(files=len(files))
        wanted = sorted(set(sources))
        by_source: dict[str, list[SourceFile]] = {name: [] for name in wanted}
        for item in files:
            by_source.setdefault(item.source, []).append(item)
        self._run("start the index", self._start)
        indexed = self._run("list the indexed sources", lambda c: [r[0] for r in c.execute(
            "SELECT DISTINCT source FROM knowledge_files WHERE bot = %s", (self.bot,))])
        for source in sorted((set(by_source) | set(indexed)) - set(web)):
            items = by_source.get(source, [])  # a source no longer declared: all its files leave
            self._run(f"index source {source}", functools.partial(self._refresh_source, source=source, items=items,
                                                                   done=done, step=step))
        done.passages = self._run("count the passages", functools.partial(
            self._finish, sources=wanted, counted=bool(done.changed or done.removed)))
        return done

    def _start(self, conn: Any) -> None:
        """The bot's state row; an index cut or stored differently before: every file read again."""
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('knowledge:' || %s, 0))", (self.bot,))
        row = conn.execute("SELECT version FROM knowledge_state WHERE bot = %s", (self.bot,)).fetchone()
        if row is not None and row[0] != INDEX_VERSION:
            conn.execute("DELETE FROM knowledge_files WHERE bot = %s", (self.bot,))
            conn.execute("DELETE FROM knowledge_web_pages WHERE bot = %s", (self.bot,))
        elif row is None and self.legacy is not None:
            self._adopt(conn, self.legacy)

    def _adopt(self, conn: Any, old: str) -> None:
        """An index kept under the bot's bare name (before keys named its sources), of this index
        version, copied under the key: its web pages (which only `chatrun index` fetches) are found
        and its files not read again; the refresh that follows reads what differs from the bot's
        own files and removes what it does not have (another bot of the name may have written
        there). The old rows stay for replicas of an earlier release still reading them."""
        row = conn.execute("SELECT version FROM knowledge_state WHERE bot = %s", (old,)).fetchone()
        if row is None or row[0] != INDEX_VERSION:
            return
        for table, columns in (("knowledge_files", "source, path, hash"),
                               ("knowledge_web_pages", "source, url, etag, last_modified"),
                               ("knowledge_passages", "source, path, anchor, title, body, digest, language, document")):
            conn.execute(f"INSERT INTO {table} (bot, {columns}) SELECT %s, {columns} FROM {table} "  # noqa: S608
                         "WHERE bot = %s", (self.bot, old))
        log.info("knowledge index %s: the index kept for bot %s before found and taken over", self.where, old)

    def _finish(self, conn: Any, sources: list[str], counted: bool) -> int:
        """The bot's state, and (when passages changed) how many passages each lexeme is in."""
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('knowledge:' || %s, 0))", (self.bot,))
        passages = int(conn.execute("SELECT count(*) FROM knowledge_passages WHERE bot = %s", (self.bot,)).fetchone()[0])
        conn.execute("INSERT INTO knowledge_state (bot, version, sources, passages) VALUES (%s, %s, %s, %s) "
                     "ON CONFLICT (bot) DO UPDATE SET version = excluded.version, sources = excluded.sources, "
                     "passages = excluded.passages", (self.bot, INDEX_VERSION, ",".join(sources), passages))
        if counted or not conn.execute("SELECT 1 FROM knowledge_terms WHERE bot = %s LIMIT 1", (self.bot,)).fetchone():
            conn.execute("DELETE FROM knowledge_terms WHERE bot = %s", (self.bot,))
            conn.execute("INSERT INTO knowledge_terms (bot, term, passages) SELECT %s, word, ndoc FROM ts_stat("
                         "format('SELECT document FROM knowledge_passages WHERE bot = %%L', %s::text))",
                         (self.bot, self.bot))
        return passages

    def _refresh_source(self, conn: Any, source: str, items: list[SourceFile], done: Refreshed,
                        step: Callable[[SourceFile], None] | None) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('knowledge:' || %s, 0))", (self.bot,))
        known = dict(conn.execute("SELECT path, hash FROM knowledge_files WHERE bot = %s AND source = %s",
                                  (self.bot, source)).fetchall())
        if self._language_changed(conn, source):  # stemmed otherwise now: every file is read again
            known = dict.fromkeys(known, "")
        changed = False
        for item in items:
            read = read_source_file(item, known.pop(item.relative, None), done)
            if read is not None:
                self._replace(conn, source, item.relative, *read)
                done.changed += read[0] is not None  # else removed: gone since the refresh listed it
                changed = True
            if step is not None:
                step(item)
        for path in known:  # files deleted from the folder
            self._replace(conn, source, path, None, [])
            done.removed += 1
            changed = True
        if changed:
            _bump(conn, self.bot)

    def _by_language(self, sources: Sequence[str]) -> dict[str, list[str]]:
        """Sources grouped by their text search configuration (a query is parsed once per group)."""
        groups: dict[str, list[str]] = {}
        for source in sources:
            groups.setdefault(self.language(source), []).append(source)
        return groups

    def _language_changed(self, conn: Any, source: str) -> bool:
        """Some of the source's passages were indexed with another text search configuration."""
        return conn.execute("SELECT 1 FROM knowledge_passages WHERE bot = %s AND source = %s AND language <> "
                            "%s::regconfig LIMIT 1", (self.bot, source, self.language(source))).fetchone() is not None

    def _replace(self, conn: Any, source: str, path: str, digest: str | None, chunks: list[Chunk]) -> None:
        """A file's passages replaced (digest None: the file is gone)."""
        language = self.language(source)
        conn.execute("DELETE FROM knowledge_passages WHERE bot = %s AND source = %s AND path = %s",
                     (self.bot, source, path))
        if chunks:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO knowledge_passages (bot, source, path, anchor, title, body, digest, language, "
                    "document) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::regconfig, setweight(to_tsvector("
                    "%s::regconfig, %s), 'A') || setweight(to_tsvector(%s::regconfig, %s), 'D'))",
                    [(self.bot, source, path, c.anchor, c.title, c.text, passage_digest(c.title, c.text),
                      language, language, c.heading, language, c.text) for c in chunks])
        if digest is None:
            conn.execute("DELETE FROM knowledge_files WHERE bot = %s AND source = %s AND path = %s",
                         (self.bot, source, path))
            conn.execute("DELETE FROM knowledge_web_pages WHERE bot = %s AND source = %s AND url = %s",
                         (self.bot, source, path))
        else:
            conn.execute("INSERT INTO knowledge_files (bot, source, path, hash) VALUES (%s, %s, %s, %s) "
                         "ON CONFLICT (bot, source, path) DO UPDATE SET hash = excluded.hash",
                         (self.bot, source, path, digest))

    # -- web pages (web.py's PageIndex: the one fetch path writes through these) ----------------

    def stored_pages(self, source: str) -> dict[str, StoredPage]:
        """url -> (hash, ETag, Last-Modified) of a web source's pages in the index."""
        rows = self._run("read the stored pages", lambda c: c.execute(
            "SELECT f.path, f.hash, w.etag, w.last_modified FROM knowledge_files f LEFT JOIN knowledge_web_pages w "
            "ON w.bot = f.bot AND w.source = f.source AND w.url = f.path WHERE f.bot = %s AND f.source = %s",
            (self.bot, source)).fetchall())
        if self._run("read the source's language", functools.partial(self._language_changed, source=source)):
            return {url: ("", None, None) for url, *_ in rows}  # stemmed otherwise now: every page cut again
        return {url: (digest, etag, modified) for url, digest, etag, modified in rows}

    @contextmanager
    def writing_pages(self, source: str) -> Iterator[PgPages]:
        """A web source's pages, held while they are fetched (no transaction stays open across
        requests) and written at the end in one transaction: readers see the source all old or
        all new. An interrupted run writes nothing of the source."""
        pages = PgPages()
        yield pages
        if pages.written or pages.removed:
            self._run(f"index source {source}", functools.partial(self._write_pages, source=source, pages=pages))

    def _write_pages(self, conn: Any, source: str, pages: PgPages) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('knowledge:' || %s, 0))", (self.bot,))
        changed = bool(pages.removed)
        for url in pages.removed:
            self._replace(conn, source, url, None, [])
        for url, digest, chunks, etag, modified in pages.written:
            if chunks is not None:
                self._replace(conn, source, url, digest, chunks)
                changed = True
            conn.execute("INSERT INTO knowledge_web_pages (bot, source, url, etag, last_modified) VALUES (%s, %s, "
                         "%s, %s, %s) ON CONFLICT (bot, source, url) DO UPDATE SET etag = excluded.etag, "
                         "last_modified = excluded.last_modified", (self.bot, source, url, etag, modified))
        if changed:
            _bump(conn, self.bot)

    def pages_done(self, done: Refreshed, changed: bool) -> None:
        """After the web pages: the passages counted, and each lexeme's passages when they changed."""
        state = self._run("read the index's state", lambda c: c.execute(
            "SELECT sources FROM knowledge_state WHERE bot = %s", (self.bot,)).fetchone())
        sources = [name for name in (state[0] if state else "").split(",") if name]
        done.passages = self._run("count the passages", functools.partial(self._finish, sources=sources,
                                                                           counted=changed))

    def held_sources(self) -> set[str]:
        """The sources with at least one file or page in the index."""
        return set(self._run("list the indexed sources", lambda c: [r[0] for r in c.execute(
            "SELECT DISTINCT source FROM knowledge_files WHERE bot = %s", (self.bot,))]))

    def embed_missing(self, embedder: Embedder, models: dict[str, str], done: Refreshed) -> None:
        """Embed the passages of the sources in `models` (source -> model) that have no vector for
        their model yet, a batch per transaction; then drop vectors no passage has any more."""
        for model in sorted(set(models.values())):
            names = [source for source, wanted in models.items() if wanted == model]
            missing = self._run("find passages to embed", functools.partial(self._unembedded, model=model,
                                                                             sources=names))
            try:
                for start in range(0, len(missing), EMBED_BATCH):
                    batch = missing[start:start + EMBED_BATCH]
                    vectors = embedder.embed(model, [embedded_text(title, body) for _, title, body in batch])
                    rows = [(model, row[0], list(v)) for row, v in zip(batch, vectors, strict=True)]
                    self._run("store vectors", functools.partial(self._store_vectors, rows=rows))
                    done.embedded += len(batch)
            except EmbeddingsUnavailable as exc:
                done.embeddings_problem = f"model {model}: {exc}"
        self._run("drop unused vectors", lambda c: c.execute(
            "DELETE FROM knowledge_vectors v WHERE NOT EXISTS (SELECT 1 FROM knowledge_passages p "
            "WHERE p.digest = v.digest)"))

    def _unembedded(self, conn: Any, model: str, sources: list[str]) -> list[tuple[str, str, str]]:
        """(digest, title, text) of the passages of `sources` without a `model` vector."""
        return list(conn.execute(
            "SELECT DISTINCT p.digest, p.title, p.body FROM knowledge_passages p WHERE p.bot = %s AND "
            "p.source = ANY(%s) AND NOT EXISTS (SELECT 1 FROM knowledge_vectors v WHERE v.model = %s AND "
            "v.digest = p.digest)", (self.bot, sources, model)).fetchall())

    def _store_vectors(self, conn: Any, rows: list[tuple[str, str, list[float]]]) -> None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO knowledge_vectors (model, digest, vector) VALUES (%s, %s, %s) "
                            "ON CONFLICT (model, digest) DO UPDATE SET vector = excluded.vector", rows)
        _bump(conn, self.bot)

    # -- reading -----------------------------------------------------------------------------

    def search(self, query: str, sources: Sequence[str], k: int) -> list[Hit]:
        """The `k` passages of `sources` that best match `query`, best first: each word's
        `ts_rank` weighed by its IDF (see `score_sql`)."""
        words = query_words(query)
        if not words or not sources or k < 1:
            return []
        hits: list[Hit] = []
        for language, names in self._by_language(sources).items():  # each word's lexeme and IDF are per language
            weighed = self._run("weigh the query's words", functools.partial(self._weighed, words=words,
                                                                              language=language))
            score, queries, score_params = score_sql(weighed)
            sql = sql_of(score, queries)
            params = (language, " | ".join(w for w, _ in weighed), *score_params(language), self.bot, names, language,
                      k)
            rows = self._run("search the knowledge index", functools.partial(_fetch, sql=sql, params=params))
            hits += [_hit(row) for row in rows]
        return sorted(hits, key=lambda hit: -hit.score)[:k]

    def _weighed(self, conn: Any, words: list[str], language: str) -> list[tuple[str, float]]:
        """Each word with its IDF (BM25's: ln(1 + (N - n + 0.5) / (n + 0.5)), n the passages it is
        in, from the table the last refresh counted; a word it did not count weighs as a rare one).
        From SELECTIVE_FROM passages, a word in more than COMMON_SHARE of them is left out while a
        rarer one remains, as the SQLite index does (index.py `selective`): it weighs little, and
        matching it means ranking a large share of the index."""
        row = conn.execute("SELECT passages FROM knowledge_state WHERE bot = %s", (self.bot,)).fetchone()
        total = max(int(row[0]) if row else 0, 1)
        counts = dict(conn.execute(  # each word's lexeme first: the join then looks terms up by key
            "SELECT x.w, max(t.passages) FROM (SELECT w, unnest(tsvector_to_array(to_tsvector(%s::regconfig, w))) "
            "AS term FROM unnest(%s::text[]) w OFFSET 0) x JOIN knowledge_terms t ON t.bot = %s AND t.term = x.term "
            "GROUP BY x.w", (language, words, self.bot)))
        if len(words) > 1 and total >= SELECTIVE_FROM:
            words = [w for w in words if counts.get(w, 0) <= total * COMMON_SHARE] or words
        return [(w, math.log(1 + (total - min(counts.get(w, 1), total) + 0.5) / (min(counts.get(w, 1), total) + 0.5)))
                for w in words]

    def nearest(self, model: str, query: array, sources: Sequence[str], n: int) -> list[Hit]:
        """The `n` passages of `sources` whose `model` vectors are nearest `query` (a unit
        vector), by cosine, best first: in PostgreSQL with pgvector, else in Python."""
        if not sources or n < 1:
            return []
        if self.pgvector:
            return self._nearest_pgvector(model, query, sources, n)
        scored = self._table(model).nearest(query, sources, n)
        if not scored:
            return []
        rows = {row[0]: row for row in self._run("read passages", functools.partial(
            _fetch, sql="SELECT id, source, path, anchor, title, body, 0 FROM knowledge_passages WHERE id = ANY(%s)",
            params=([pid for _, pid in scored],)))}
        return [replace(_hit(rows[pid][1:]), score=score) for score, pid in scored if pid in rows]

    def _nearest_pgvector(self, model: str, query: array, sources: Sequence[str], n: int) -> list[Hit]:
        literal = "[" + ",".join(repr(float(x)) for x in query) + "]"
        rows = self._run("rank by vectors", lambda c: c.execute(
            "SELECT p.source, p.path, p.anchor, p.title, p.body, -(v.vector::vector <#> %s::vector) AS score "
            "FROM knowledge_passages p JOIN knowledge_vectors v ON v.model = %s AND v.digest = p.digest "
            "WHERE p.bot = %s AND p.source = ANY(%s) ORDER BY v.vector::vector <#> %s::vector, p.id LIMIT %s",
            (literal, model, self.bot, list(sources), literal, n)).fetchall())
        return [_hit(row) for row in rows]

    def _table(self, model: str) -> VectorTable:
        """`model`'s vectors of every passage of the bot (vectors.py's one ranking: numpy when
        installed), from memory while the bot's index is at the same generation (bumped by every
        change of its passages or vectors)."""
        def read(conn: Any) -> tuple[int, VectorTable | None]:
            row = conn.execute("SELECT generation FROM knowledge_state WHERE bot = %s", (self.bot,)).fetchone()
            generation = int(row[0]) if row else 0
            kept = self._vectors.get(model)
            if kept is not None and kept[0] == generation:
                return generation, None
            rows = conn.execute("SELECT p.id, p.source, v.vector FROM knowledge_passages p JOIN knowledge_vectors v "
                                "ON v.model = %s AND v.digest = p.digest WHERE p.bot = %s",
                                (model, self.bot)).fetchall()
            return generation, VectorTable(model, ((pid, source, array("f", vector).tobytes())
                                                   for pid, source, vector in rows), len(rows))

        generation, fresh = self._run("read vectors", read)
        if fresh is not None:
            self._vectors[model] = (generation, fresh)
        return self._vectors[model][1]

    def find(self, refs: Sequence[tuple[str, str]], sources: Sequence[str]) -> list[Hit]:
        """The passages `refs` ((path, anchor) pairs) name in `sources`, in the order named."""
        if not refs or not sources:
            return []

        def read(conn: Any) -> list[Hit]:
            out: list[Hit] = []
            for path, anchor in refs:
                row = conn.execute("SELECT source, path, anchor, title, body FROM knowledge_passages WHERE bot = %s "
                                   "AND source = ANY(%s) AND path = %s AND anchor = %s ORDER BY id LIMIT 1",
                                   (self.bot, list(sources), path, anchor)).fetchone()
                if row is not None:
                    out.append(Hit(*row))
            return out

        return list(self._run("find cited passages", read))

    def count(self) -> int:
        return int(self._run("count the passages", lambda c: c.execute(
            "SELECT count(*) FROM knowledge_passages WHERE bot = %s", (self.bot,)).fetchone()[0]))


@dataclass
class PgPages:
    """A web source's pages as fetched, written by PgIndex.writing_pages at the source's end."""

    written: list[tuple[str, str, list[Chunk] | None, str | None, str | None]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def page(self, url: str, digest: str, chunks: list[Chunk] | None, etag: str | None,
             last_modified: str | None) -> None:
        self.written.append((url, digest, chunks, etag, last_modified))

    def remove(self, url: str) -> None:
        self.removed.append(url)


def score_sql(weighed: list[tuple[str, float]]) -> tuple[str, str, Callable[[str], tuple[Any, ...]]]:
    """A passage's score: the sum over the query's words of IDF x `ts_rank` (a heading weighs
    TITLE_WEIGHT times text; divided by 1 + log(length)). `ts_rank` alone has no IDF: a common
    word weighs as much as a rare one (bench/bench_knowledge.py, recall@5 at 10,000 passages:
    0.873 alone, 0.910 with IDF; at 1,000: 0.993, 1.000); `ts_rank_cd` (cover density) ranks an
    OR of words worse still (0.847 at 1,000). The IDFs are literals (floats chatrun computed)."""
    terms = [f"{idf!r} * ts_rank('{RANK_WEIGHTS}'::float4[], p.document, qs.q{i}, {RANK_NORMALISATION})"
             for i, (_, idf) in enumerate(weighed)]
    queries = "".join(f", to_tsquery(%s::regconfig, %s) AS q{i}" for i in range(len(weighed)))

    def params(language: str) -> tuple[Any, ...]:
        return tuple(value for word, _ in weighed for value in (language, word))

    return "(" + " + ".join(terms) + ")", queries, params


def sql_of(score: str, queries: str) -> str:
    """A search's SQL. Words are \\w+ only, so no tsquery operator can be injected; OR-ed as
    FTS5's query is. The queries are parsed once (OFFSET 0 keeps the planner from inlining them
    into each row)."""
    return (f"SELECT p.source, p.path, p.anchor, p.title, p.body, {score} AS score FROM knowledge_passages p, "
            f"(SELECT to_tsquery(%s::regconfig, %s) AS q{queries} OFFSET 0) qs "
            "WHERE p.bot = %s AND p.source = ANY(%s) AND p.language = %s::regconfig AND "
            "p.document @@ qs.q ORDER BY score DESC, p.id LIMIT %s")


def _fetch(conn: Any, sql: str, params: tuple[Any, ...]) -> list[Any]:
    return list(conn.execute(sql, params).fetchall())


def _hit(row: Sequence[Any]) -> Hit:
    """A row (source, path, anchor, title, body, score) as a Hit."""
    return Hit(row[0], row[1], row[2], row[3], row[4], score=float(row[5]))


def _bump(conn: Any, bot: str) -> None:
    """The bot's passages or vectors changed: readers holding vectors in memory read them again."""
    conn.execute("INSERT INTO knowledge_state (bot, version, generation) VALUES (%s, '', 1) ON CONFLICT (bot) "
                 "DO UPDATE SET generation = knowledge_state.generation + 1", (bot,))


def _has_pgvector(conn: Any) -> bool:
    """pgvector is installed in the database; or available, and this user may install it."""
    import psycopg

    if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
        return True
    if not conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
        return False
    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        return True
    except psycopg.Error as exc:  # not allowed: ranked in Python, and said once
        log.warning("knowledge: pgvector is available but could not be installed (%s); vectors are ranked in "
                    "Python", str(exc).strip())
        return False
