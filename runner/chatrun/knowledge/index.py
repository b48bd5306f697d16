"""The knowledge index: passages in SQLite, searched with FTS5's BM25. No model needed.

One file per bot (`.chatrun/knowledge.db` in its directory). `refresh` brings it up to date
with the sources' folders, incrementally: a file whose bytes (SHA-256) are unchanged is not
read again; a changed file's passages are replaced; a file or source gone is removed. The
passages live in a plain table (indexed by source, path and anchor, for citations) that an
FTS5 table indexes as external content; both change in one transaction per file, so a
search never sees half a file and a crash leaves the index consistent.

Search: the query's words (lower case, a short stop list left out) OR-ed together, ranked by
BM25 with a passage's own heading weighing more than its text (TITLE_WEIGHT); Porter stemming, so
"refunds" finds "refund".

Embeddings (a source's `embeddings:`, chatrun.knowledge.vectors): a `vectors` table holds each
passage's vector per model, keyed by the digest of its title and text, so a refresh embeds only
passages whose text is new (`embed_missing`) and a version bump that re-reads every file keeps
them; `nearest` ranks a source's passages by cosine over the model's vectors held in memory
(a `VectorTable`: a numpy matrix when numpy is installed), read again only when meta `vectors`
(bumped by every change of the vectors or of the passages' ids) says they changed.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from chatrun.definition.config import KnowledgeSource
from chatrun.definition.knowledge import source_folder, source_listing, too_large, unreadable_bytes
from chatrun.knowledge.chunks import Chunk, chunk_file
from chatrun.knowledge.vectors import (
    Embedder,
    EmbeddingsUnavailable,
    VectorTable,
    embedded_text,
    passage_digest,
    to_blob,
)

log = logging.getLogger("chatrun.knowledge")

# Bumped when the way files are cut or stored changes: every file is then read again.
INDEX_VERSION = "4"
TITLE_WEIGHT = 4.0
COMMON_SHARE = 0.1  # a query word in more than this share of the passages is left out (see `selective`)...
SELECTIVE_FROM = 10_000  # ...in an index of this many passages or more (a smaller one is fast anyway)
MAX_QUERY_WORDS = 64  # a query's distinct words searched at most (a pasted text: see `query_words`)
STOP_WORDS = frozenset(
    "a an and are as at be but by can do does for from how i if in into is it its me my no not of on or our so "
    "that the their then there these this to was we what when where which who why will with you your".split())

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files(source TEXT NOT NULL, path TEXT NOT NULL, hash TEXT NOT NULL,
                                 PRIMARY KEY (source, path));
CREATE TABLE IF NOT EXISTS passages(id INTEGER PRIMARY KEY, source TEXT NOT NULL, path TEXT NOT NULL,
                                    anchor TEXT NOT NULL, title TEXT NOT NULL, tag TEXT NOT NULL, heading TEXT NOT NULL,
                                    body TEXT NOT NULL, digest TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS passages_at ON passages(source, path, anchor);
CREATE INDEX IF NOT EXISTS passages_digest ON passages(digest);
CREATE TABLE IF NOT EXISTS vectors(model TEXT NOT NULL, digest TEXT NOT NULL, vector BLOB NOT NULL,
                                   PRIMARY KEY (model, digest));
CREATE TABLE IF NOT EXISTS web_pages(source TEXT NOT NULL, url TEXT NOT NULL, etag TEXT, last_modified TEXT,
                                     PRIMARY KEY (source, url));
CREATE VIRTUAL TABLE IF NOT EXISTS passages_fts USING fts5(tag, heading, body, content='passages', content_rowid='id',
                                                          tokenize='porter unicode61 remove_diacritics 2');
"""


@dataclass(frozen=True)
class Hit:
    """A passage found: its source, file (relative to the source's folder), anchor, title, text."""

    source: str
    path: str
    anchor: str
    title: str
    text: str
    score: float = 0.0

    @property
    def ref(self) -> str:
        """How a reply cites it: `path#anchor` (`path` for a file's top)."""
        return f"{self.path}#{self.anchor}" if self.anchor else self.path


@dataclass
class Refreshed:
    """What a refresh did."""

    files: int = 0  # files the sources hold
    changed: int = 0  # files (re)read
    removed: int = 0  # files (or whole sources) gone from the index
    passages: int = 0  # passages in the index afterwards
    embedded: int = 0  # passages embedded (sources with `embeddings:`; unchanged passages are not)
    embeddings_problem: str | None = None  # why none could be (the searches then use BM25 alone)
    problems: list[str] = field(default_factory=list)  # files that could not be read (left out)


@dataclass(frozen=True)
class SourceFile:
    """One file of a source, to index."""

    source: str
    path: Path
    relative: str


def plan(root: str | Path, sources: Iterable[KnowledgeSource]) -> list[SourceFile]:
    """Every file the sources hold, in order."""
    out: list[SourceFile] = []
    for source in sources:
        folder = source_folder(root, source)
        inside, outside = source_listing(root, source)
        out += [SourceFile(source.name, p, p.relative_to(folder).as_posix()) for p in inside]
        for path, target in outside:  # `chatrun validate` warns of it too
            log.warning("knowledge source %s: file %s leads out of its folder (to %s); left out of the index",
                        source.name, path.relative_to(folder).as_posix(), target)
    return out


class KnowledgeIndex:
    """A bot's passages in one SQLite file."""

    def __init__(self, path: Path, fast: bool = True):
        self.path = path
        self.fast = fast  # rank vectors with numpy when it is installed (False: in pure Python, as a bench compares)
        self._readers = threading.local()  # a connection per thread for searches (opening one costs more than a query)
        # Each model's vectors, read once and kept while meta `vectors` (bumped by each change of
        # the vectors table) is the same: reading 100,000 blobs costs ~1 s, much more than a query.
        self._vectors: dict[str, tuple[str | None, VectorTable]] = {}
        self._loading = threading.Lock()  # one thread reads a model's vectors; the others wait and use them

    def connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit: each file's change is one explicit transaction (_replace), taken before its
        # first read, so two processes refreshing at once never interleave within a file.
        connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        return connection

    def reader(self) -> sqlite3.Connection:
        """This thread's connection for reading (each query sees what refreshes committed)."""
        db: sqlite3.Connection | None = getattr(self._readers, "db", None)
        if db is None:
            db = self._readers.db = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                                    check_same_thread=False)
        return db

    def refresh(self, files: Sequence[SourceFile], sources: Iterable[str],
                step: Callable[[SourceFile], None] | None = None, web: Iterable[str] = ()) -> Refreshed:
        """Bring the index up to date with `files` (of the sources named `sources`): read only
        the files whose bytes changed; `step` is called after each file (a progress bar). The
        passages of the sources in `web` (web pages, fetched by `chatrun index` only:
        chatrun.knowledge.web) are kept as they are. A damaged file (not a database, a malformed
        image: a disk full, a copy cut short) is set aside and the index built anew: it is made
        from the folders, and a bot that could not search it would fail every turn."""
        try:
            return self._refresh(files, sources, step, web)
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError or not self.path.exists():
                raise  # a locked file, a constraint...: not damage
            self._set_aside(exc)
            return self._refresh(files, sources, step, web)

    def _set_aside(self, exc: sqlite3.DatabaseError) -> None:
        """The damaged index file moved to `knowledge.broken.db` (its journal files removed)."""
        aside = self.path.with_name(f"{self.path.stem}.broken{self.path.suffix}")  # `*.db` in .gitignore
        self.path.replace(aside)
        for suffix in ("-wal", "-shm"):
            self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
        self._readers = threading.local()  # no reader keeps the damaged file open
        self._vectors.clear()
        log.warning("knowledge index %s is damaged (%s); set aside as %s and built anew from the folders (web "
                    "pages come back with `chatrun index`)", self.path, exc, aside.name)

    def _refresh(self, files: Sequence[SourceFile], sources: Iterable[str],
                 step: Callable[[SourceFile], None] | None, web: Iterable[str]) -> Refreshed:
        done = Refreshed(files=len(files))
        with self.connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            if _meta(db, "version") != INDEX_VERSION:  # cut or stored differently now: start again (the
                # vectors stay: they are keyed by the passages' text, which did not change for most)
                db.executescript("DROP TABLE IF EXISTS passages_fts; DROP TABLE IF EXISTS passages; "
                                 "DROP TABLE IF EXISTS files;")
            db.executescript(_SCHEMA)
            known = {(s, p): h for s, p, h in db.execute("SELECT source, path, hash FROM files")}
            for item in files:
                if self._refresh_file(db, item, known.pop((item.source, item.relative), None), done):
                    done.changed += 1
                if step is not None:
                    step(item)
            wanted, fetched = set(sources), set(web)
            for source, path in known:  # files deleted, and sources the bot no longer declares
                if source in fetched:
                    continue
                _replace(db, source, path, None, [])
                done.removed += 1
            db.execute("INSERT OR REPLACE INTO meta VALUES ('version', ?)", (INDEX_VERSION,))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('sources', ?)", (",".join(sorted(wanted)),))
            done.passages = db.execute("SELECT count(*) FROM passages").fetchone()[0]
            db.execute("INSERT OR REPLACE INTO meta VALUES ('passages', ?)", (str(done.passages),))
        db.close()
        return done

    def _refresh_file(self, db: sqlite3.Connection, item: SourceFile, old_hash: str | None, done: Refreshed) -> bool:
        read = read_source_file(item, old_hash, done)
        if read is None:
            return False
        _replace(db, item.source, item.relative, *read)
        return read[0] is not None  # else removed: gone since the refresh listed it

    # -- web pages (web.py's PageIndex: the one fetch path writes through these) ----------------

    def stored_pages(self, source: str) -> dict[str, StoredPage]:
        """url -> (hash, ETag, Last-Modified) of a web source's pages in the index."""
        with self.connect() as db:
            db.executescript(_SCHEMA)
            rows = db.execute("SELECT f.path, f.hash, w.etag, w.last_modified FROM files f LEFT JOIN web_pages w ON "
                              "w.source = f.source AND w.url = f.path WHERE f.source = ?", (source,)).fetchall()
        db.close()
        return {url: (digest, etag, modified) for url, digest, etag, modified in rows}

    @contextmanager
    def writing_pages(self, source: str) -> Iterator[SqlitePages]:
        """A web source's pages written as they are fetched, one transaction per page (an
        interrupted run keeps the pages it finished, as for files)."""
        with self.connect() as db:
            yield SqlitePages(db, source)
        db.close()

    def pages_done(self, done: Refreshed, changed: bool) -> None:
        """After the web pages: validators of pages gone dropped, the passages counted."""
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM web_pages WHERE NOT EXISTS (SELECT 1 FROM files f WHERE f.source = "
                       "web_pages.source AND f.path = web_pages.url)")
            db.execute("COMMIT")
            done.passages = db.execute("SELECT count(*) FROM passages").fetchone()[0]
            db.execute("INSERT OR REPLACE INTO meta VALUES ('passages', ?)", (str(done.passages),))
        db.close()

    def held_sources(self) -> set[str]:
        """The sources with at least one file or page in the index."""
        if not self.path.exists():
            return set()
        with self.connect() as db:
            try:
                held = {row[0] for row in db.execute("SELECT DISTINCT source FROM files")}
            except sqlite3.OperationalError:  # no table yet
                held = set()
        db.close()
        return held

    def search(self, query: str, sources: Sequence[str], k: int) -> list[Hit]:
        """The `k` passages of `sources` that best match `query` (BM25), best first."""
        words = query_words(query)
        if not words or not sources or not self.path.exists():
            return []
        match = " OR ".join(f'"{w}"' for w in self.selective(words))
        indexed = (_meta(self.reader(), "sources") or "").split(",")
        if not set(indexed) <= set(sources):  # only some sources: a column filter, inside the FTS5 query
            tags = " OR ".join(f'"{source_tag(s)}"' for s in sources)
            match = f"tag : ({tags}) AND {{heading body}} : ({match})"
        # The passages' rows are joined to the top k only: joining before ranking makes SQLite
        # score every match through the join (3x slower at 100,000 passages).
        sql = ("SELECT p.source, p.path, p.anchor, p.title, p.body, f.score FROM (SELECT rowid, "
               f"bm25(passages_fts, 0.0, {TITLE_WEIGHT}, 1.0) AS score FROM passages_fts WHERE passages_fts MATCH ? "
               "ORDER BY score LIMIT ?) f JOIN passages p ON p.id = f.rowid ORDER BY f.score")
        rows = self.reader().execute(sql, (match, k)).fetchall()
        return [Hit(row[0], row[1], row[2], row[3], row[4], -row[5]) for row in rows]

    def selective(self, words: list[str]) -> list[str]:
        """`words` less those in more than COMMON_SHARE of all passages, while a rarer one is left:
        BM25 gives such a word little weight (log 9 against ~log 2000 for a rare one), yet
        matching it means scoring a large share of the index, which is most of a query's time
        at 100,000 passages (bench/bench_knowledge.py). Elasticsearch's `cutoff_frequency` did
        the same. A word whose stem differs from it is not found in the vocabulary, and kept.
        Only from SELECTIVE_FROM passages: in a small index every word is in a large share."""
        db = self.reader()
        total = _meta(db, "passages")
        if len(words) < 2 or total is None or int(total) < SELECTIVE_FROM:
            return words
        db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.passages_terms USING fts5vocab(main, passages_fts, 'row')")
        marks = ",".join("?" * len(words))
        counts = dict(db.execute(f"SELECT term, doc FROM temp.passages_terms WHERE term IN ({marks})", words).fetchall())
        rare = [w for w in words if counts.get(w, 0) <= int(total) * COMMON_SHARE]
        return rare or words

    def embed_missing(self, embedder: Embedder, models: dict[str, str], done: Refreshed) -> None:
        """Embed the passages of the sources in `models` (source -> model) that have no vector for
        their model yet, a batch at a time (each committed: an interrupted run keeps what it did);
        then drop the vectors no passage has any more."""
        with self.connect() as db:
            for model in sorted(set(models.values())):
                names = [source for source, wanted in models.items() if wanted == model]
                marks = ",".join("?" * len(names))
                missing = db.execute(f"SELECT DISTINCT p.digest, p.title, p.body FROM passages p WHERE p.source IN "
                                     f"({marks}) AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.model = ? AND "
                                     "v.digest = p.digest)", (*names, model)).fetchall()
                try:
                    for start in range(0, len(missing), 256):
                        batch = missing[start:start + 256]
                        vectors = embedder.embed(model, [embedded_text(title, body) for _, title, body in batch])
                        db.execute("BEGIN IMMEDIATE")
                        db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)",
                                       [(model, row[0], to_blob(v)) for row, v in zip(batch, vectors, strict=True)])
                        _bump_vectors(db)
                        db.execute("COMMIT")
                        done.embedded += len(batch)
                except EmbeddingsUnavailable as exc:
                    done.embeddings_problem = f"model {model}: {exc}"
            wanted = sorted(set(models.values()))
            db.execute("BEGIN IMMEDIATE")
            gone = db.execute(f"DELETE FROM vectors WHERE model NOT IN ({','.join('?' * len(wanted))}) OR NOT EXISTS "
                              "(SELECT 1 FROM passages p WHERE p.digest = vectors.digest)", wanted)
            if gone.rowcount or done.changed or done.removed:  # passages got new ids: searches read them again
                _bump_vectors(db)
            db.execute("COMMIT")
        db.close()

    def nearest(self, model: str, query: array, sources: Sequence[str], n: int) -> list[Hit]:
        """The `n` passages of `sources` whose `model` vectors are nearest `query` (a unit
        vector), by cosine, best first."""
        scored = self.vectors(model).nearest(query, sources, n)
        if not scored:
            return []
        db = self.reader()
        rows: dict[int, tuple[str, str, str, str, str]] = {row[0]: tuple(row[1:]) for row in db.execute(
            f"SELECT id, source, path, anchor, title, body FROM passages WHERE id IN ({','.join('?' * len(scored))})",
            [pid for _, pid in scored])}
        return [Hit(*rows[pid], score=score) for score, pid in scored if pid in rows]

    def vectors(self, model: str) -> VectorTable:
        """`model`'s vectors of every passage, from memory while unchanged."""
        kept = self._vectors.get(model)
        if kept is not None and kept[0] == _meta(self.reader(), "vectors"):
            return kept[1]
        with self._loading:
            db = self.reader()
            db.execute("BEGIN")  # the generation, the count and the rows of one snapshot
            try:
                generation = _meta(db, "vectors")
                kept = self._vectors.get(model)
                if kept is not None and kept[0] == generation:  # another thread read them meanwhile
                    return kept[1]
                join = "FROM passages p JOIN vectors v ON v.model = ? AND v.digest = p.digest"
                count = db.execute(f"SELECT count(*) {join}", (model,)).fetchone()[0]
                table = VectorTable(model, db.execute(f"SELECT p.id, p.source, v.vector {join}", (model,)), count,
                                    self.fast)
            finally:
                db.execute("COMMIT")
            self._vectors[model] = (generation, table)
            return table

    def find(self, refs: Sequence[tuple[str, str]], sources: Sequence[str]) -> list[Hit]:
        """The passages `refs` ((path, anchor) pairs) name in `sources`, in the order named (one
        per ref: a section cut into pieces is cited once)."""
        if not refs or not sources or not self.path.exists():
            return []
        out: list[Hit] = []
        marks = ",".join("?" * len(sources))
        db = self.reader()
        for path, anchor in refs:
            row = db.execute(f"SELECT source, path, anchor, title, body FROM passages WHERE source IN ({marks}) "
                             "AND path = ? AND anchor = ? ORDER BY id LIMIT 1", (*sources, path, anchor)).fetchone()
            if row is not None:
                out.append(Hit(*row))
        return out

    def count(self) -> int:
        if not self.path.exists():
            return 0
        with self.connect() as db:
            try:
                n = int(db.execute("SELECT count(*) FROM passages").fetchone()[0])
            except sqlite3.OperationalError:  # no table yet
                n = 0
        db.close()
        return n


StoredPage = tuple[str, str | None, str | None]  # a web page's (hash, ETag, Last-Modified) in an index


class SqlitePages:
    """A web source's pages written into the SQLite index, each page in its own transaction."""

    def __init__(self, db: sqlite3.Connection, source: str):
        self.db, self.source = db, source

    def page(self, url: str, digest: str, chunks: list[Chunk] | None, etag: str | None,
             last_modified: str | None) -> None:
        """A page that answered: its passages replaced by `chunks` (None: unchanged), its validators kept."""
        if chunks is not None:
            _replace(self.db, self.source, url, digest, chunks)
        self.db.execute("INSERT OR REPLACE INTO web_pages VALUES (?, ?, ?, ?)", (self.source, url, etag, last_modified))

    def remove(self, url: str) -> None:
        _replace(self.db, self.source, url, None, [])
        self.db.execute("DELETE FROM web_pages WHERE source = ? AND url = ?", (self.source, url))


def _meta(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def _bump_vectors(db: sqlite3.Connection) -> None:
    """The vectors changed: searches read them again (KnowledgeIndex._stored)."""
    db.execute("INSERT OR REPLACE INTO meta VALUES ('vectors', ?)", (str(int(_meta(db, "vectors") or 0) + 1),))


def _replace(db: sqlite3.Connection, source: str, path: str, digest: str | None, chunks: list[Chunk]) -> None:
    """A file's passages replaced (digest None: the file is gone), in one transaction."""
    db.execute("BEGIN IMMEDIATE")
    old = db.execute("SELECT id, tag, heading, body FROM passages WHERE source = ? AND path = ?", (source, path)).fetchall()
    db.executemany("INSERT INTO passages_fts(passages_fts, rowid, tag, heading, body) VALUES ('delete', ?, ?, ?, ?)", old)
    db.execute("DELETE FROM passages WHERE source = ? AND path = ?", (source, path))
    for chunk in chunks:
        cursor = db.execute("INSERT INTO passages(source, path, anchor, title, tag, heading, body, digest) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            (source, path, chunk.anchor, chunk.title, source_tag(source), chunk.heading, chunk.text,
                             passage_digest(chunk.title, chunk.text)))
        db.execute("INSERT INTO passages_fts(rowid, tag, heading, body) VALUES (?, ?, ?, ?)",
                   (cursor.lastrowid, source_tag(source), chunk.heading, chunk.text))
    if digest is None:
        db.execute("DELETE FROM files WHERE source = ? AND path = ?", (source, path))
    else:
        db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?)", (source, path, digest))
    db.execute("COMMIT")  # one file at a time: an interrupted refresh keeps what it finished


def source_tag(source: str) -> str:
    """A source's name as one token of the FTS5 table's `tag` column (a name like `help_centre`
    would be two words, and `help` one of them): how a search keeps to a route's sources."""
    return "src" + hashlib.sha256(source.encode()).hexdigest()[:16]


def query_words(text: str) -> list[str]:
    """The words of free text a search looks for: lower case, once each, stop words left out;
    of more than MAX_QUERY_WORDS, the first and the last half (a question before or after a
    pasted text): both indexes search the same words, and PostgreSQL's (a term per word) can."""
    words = list(dict.fromkeys(w for w in re.findall(r"\w+", text.lower()) if w not in STOP_WORDS and len(w) > 1))
    if len(words) <= MAX_QUERY_WORDS:
        return words
    return words[:MAX_QUERY_WORDS // 2] + words[-(MAX_QUERY_WORDS // 2):]


def fts_query(text: str) -> str:
    """An FTS5 query for free text: its words, each quoted (no operator can be injected), OR-ed."""
    return " OR ".join(f'"{w}"' for w in query_words(text))


def read_source_file(item: SourceFile, old_hash: str | None,
                     done: Refreshed) -> tuple[str, list[Chunk]] | tuple[None, list[Chunk]] | None:
    """(the file's hash, its passages) for an index to store, or None when unchanged since
    `old_hash`. A file that cannot be read (its permissions...) is (None, []): left out, its
    passages from an earlier refresh too, and said in `done.problems`; so is a file larger than
    MAX_BYTES (`too_large`: not read at all, as a web page of that size). A file read but not understood
    (an unreadable PDF...) is said too and stored with no passages: its hash keeps it from being
    read again until it changes. A file gone since the refresh listed it (deleted meanwhile) is
    (None, []): removed, as a file gone before it (counted in `done.removed`). The file is read
    once: its hash, its check and its passages are of the same bytes. Both indexes (this one,
    pg_index.py) read files through here."""
    try:
        big = too_large(item.path.stat().st_size)
        data = b"" if big else item.path.read_bytes()
    except FileNotFoundError:
        done.removed += old_hash is not None
        return None, []
    except OSError as e:  # there but not readable (its permissions, a disk error): left out, and said
        done.problems.append(f"{item.source}/{item.relative}: {e}")
        log.warning("knowledge source %s: file %s cannot be read (%s); left out of the index", item.source,
                    item.relative, e)
        return None, []
    if big:
        done.problems.append(f"{item.source}/{item.relative} {big}; split it into smaller files")
        log.warning("knowledge source %s: file %s %s; left out of the index", item.source, item.relative, big)
        return None, []
    digest = hashlib.sha256(data).hexdigest()
    if digest == old_hash:
        return None
    problem = unreadable_bytes(item.path, data)
    try:
        chunks = [] if problem else chunk_file(item.path, data)
    except Exception as e:  # a PDF pypdf cannot parse, ...: left out, and said
        problem, chunks = f"could not be read: {e}", []
    if problem:
        done.problems.append(f"{item.source}/{item.relative} {problem}")
        log.warning("knowledge source %s: file %s %s; left out of the index", item.source, item.relative, problem)
    return digest, chunks
