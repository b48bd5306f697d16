"""What a bot knows: its `knowledge:` sources, indexed and searched, and the citations of a reply.

    chunks.py   files cut into passages along their headings (titles and anchors kept)
    index.py    the passages in SQLite, searched with FTS5's BM25, refreshed incrementally
    web.py      web pages (`urls:`, a `sitemap:`), fetched by `chatrun index` only
    vectors.py  embeddings (a source's `embeddings:`) through the bot's endpoint, and rank fusion
    pg_index.py the same index in PostgreSQL, shared by replicas (`--store postgresql://…`)

A `Library` is a bot's sources and its index file (`.chatrun/knowledge.db` in the bot's
directory; `chatrun index BOT` builds it ahead). The first search of a running bot refreshes
the index (only changed files are read), and a search after a file of its folders changed,
came or went refreshes it again, so a bot never answers from a stale or missing index. With a shared index (`share_index(url)`, set by `chatrun serve` when its store is
PostgreSQL), a replica only reads what `chatrun index BOT --store URL` built; it builds it
itself only when the bot was never indexed there. The model sees passages as `[ref] title` blocks and cites one by writing its `[ref]`;
`cited` finds the passages a reply cites (engine/grounding.py keeps those the model was given), which become its Sources event.

Layer 2 (tests/test_architecture.py): it reads the definition stage's config; the engine
(auto retrieval, citations) and the `search_knowledge` tool kind (toolkinds/knowledge.py) use it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatrun.definition.config import BotConfig, KnowledgeSource, ModelConfig
from chatrun.definition.knowledge import source_listing
from chatrun.errors import ChatrunError, KnowledgeUnavailable
from chatrun.knowledge.index import Hit, KnowledgeIndex, Refreshed, plan
from chatrun.knowledge.vectors import Embedder, EmbeddingsUnavailable, fuse
from chatrun.knowledge.web import Listing, WebRefreshed, client, list_pages, refresh_web

log = logging.getLogger("chatrun.knowledge")

if TYPE_CHECKING:
    from chatrun.knowledge.pg_index import PgIndex

__all__ = ["Hit", "KnowledgeIndex", "Library", "Refreshed", "index_path", "knowledge_state", "library_of",
           "passages_text", "share_index"]

INDEX_FILE = Path(".chatrun") / "knowledge.db"

# What the model reads with passages: how to cite them (the one place this is said).
CITE_HOW = ("Cite each passage you use by writing its ref in square brackets, e.g. [{example}]. "
            "If the passages do not answer the question, say you do not know.")
# What the model reads when a route with `cite: required` got a reply that cites nothing.
CITE_NUDGE = ("(Your last answer cites no source. Answer again from the knowledge passages, citing each passage "
              "you use by writing its ref in square brackets, e.g. [returns.md#refund-window]; call "
              "search_knowledge first if you have no passage that answers. If none answers, say you do not know "
              "and cite nothing.)")
CANDIDATES = 50  # passages each ranking (BM25, cosine) offers the fusion: a passage far down both can still win
# A citation: what a reply holds in square brackets (on one line, no control character: no ref
# holds one, and PostgreSQL's text holds no NUL). A ref may hold spaces (`[refund policy.md#costs]`),
# and a model may cite several passages in one pair (`[a.md#x, b.md#y]`).
_CITATION = re.compile(r"\[([^\[\]\x00-\x1f\x7f]{1,500})\]")
_CITED_APART = re.compile(r"\s*[,;]\s*")
MAX_CITED = 50  # distinct refs a reply's citations are looked up for; the others are not citations
# Seconds between two looks of a running bot at its folders (each file's size and modification
# time) for a file changed, added or removed since the index was refreshed: then it is refreshed again.
RECHECK = 2.0


def index_path(root: str | Path) -> Path:
    """The bot's knowledge index: `.chatrun/knowledge.db` in its directory."""
    return Path(root) / INDEX_FILE


class Library:
    """A bot's knowledge sources and their index."""

    def __init__(self, root: str | Path, sources: dict[str, KnowledgeSource], model: ModelConfig | None = None,
                 index: KnowledgeIndex | PgIndex | None = None):
        self.root = Path(root)
        self.sources = sources
        self.index = index if index is not None else KnowledgeIndex(index_path(self.root))
        if not isinstance(self.index, KnowledgeIndex):  # the shared index stems each source as it declares
            self.index.languages = {name: s.language for name, s in sources.items() if s.language}
        self.embedder = Embedder(model)  # the bot's endpoint, for sources with `embeddings:`
        self._fresh = False
        self._lock = threading.Lock()
        self.problem: str | None = None  # why the index could not be built or read at the last try (None: it was)
        self._mark: frozenset[tuple[str, int, int]] = frozenset()  # the folders as the last refresh found them
        self._looked = 0.0  # when the folders were last compared with `_mark` (time.monotonic)
        self.unindexed: list[str] = []  # web sources the index holds no page of (`chatrun index` fetches them)
        self.web = WebRefreshed()  # what the last fetch of web pages did (`refresh(pages=...)`)

    def refresh(self, step: Any = None, pages: Sequence[Listing] | None = None) -> Refreshed:
        """Bring the index up to date with the folders (only changed files are read); with
        `pages` (`chatrun index` only: `list_web`), fetch the web sources' pages too (only
        changed ones are cut again; `self.web` says what fetching did). Without, the web
        sources' passages stay as the last `chatrun index` left them: a running bot never fetches."""
        with self._lock:
            return self._refresh(step, pages)

    def _refresh(self, step: Any, pages: Sequence[Listing] | None) -> Refreshed:
        """`refresh`, under the lock."""
        web = [source.name for source in self.sources.values() if source.web]
        self._mark, self._looked = self._folders(), time.monotonic()  # before reading: a change meanwhile is seen next
        done = self.index.refresh(plan(self.root, self.sources.values()), self.sources, step, web)
        if pages is not None:  # into either index, through web.py's one fetch path (its PageIndex seam)
            with client() as http:
                self.web = refresh_web(self.index, pages, done, http, step)
        else:
            self._say_unindexed(web)
        self.index.embed_missing(self.embedder, self.embedding_models(list(self.sources)), done)
        self._fresh = True
        return done

    def list_web(self) -> list[Listing]:
        """The pages of each web source (a sitemap is fetched: `chatrun index` only)."""
        with client() as http:
            return [list_pages(source, http) for source in self.sources.values() if source.web]

    def _say_unindexed(self, web: Sequence[str]) -> None:
        """A web source with no page in the index is said in the log: nothing fails silently."""
        held = self.index.held_sources() if web else set()
        missing = self.unindexed = [name for name in web if name not in held]
        for name in missing:
            log.warning("knowledge source %s: no page of it is in the index (web pages are fetched by "
                        "`chatrun index`, never while the bot runs); run `chatrun index %s`", name, self.root)

    def ready(self) -> KnowledgeIndex | PgIndex:
        """The index, refreshed at the first search and again when a file of the folders changed,
        came or went (`_moved`; a shared index only when the bot was never indexed there:
        `chatrun index --store` keeps it up to date)."""
        if self._fresh and not self._moved():
            return self.index
        with self._lock:  # the first searches at once: one refreshes, the others wait for it
            if self._fresh:
                return self.index
            if not isinstance(self.index, KnowledgeIndex) and self.index.built():
                self._fresh = True
            else:
                self._refresh(None, None)
        return self.index

    def _moved(self) -> bool:
        """A file of the folders changed, came or went since the last refresh (looked at once in
        RECHECK seconds; a shared index is kept by `chatrun index --store`, never by a replica):
        then the index is no longer fresh."""
        if not isinstance(self.index, KnowledgeIndex) or time.monotonic() < self._looked + RECHECK:
            return False
        self._looked = time.monotonic()
        if self._folders() == self._mark:
            return False
        self._fresh = False
        return True

    def _folders(self) -> frozenset[tuple[str, int, int]]:
        """Each file the folder sources read: its path, size and modification time."""
        out = set()
        for source in self.sources.values():
            for path in source_listing(self.root, source)[0]:
                try:
                    stat = path.stat()
                except OSError:  # gone while listed: the refresh says so
                    continue
                out.add((str(path), stat.st_size, stat.st_mtime_ns))
        return frozenset(out)

    def close(self) -> None:
        """Let go of the index's connections (a shared index's pool; the SQLite file's are per thread)."""
        if not isinstance(self.index, KnowledgeIndex):
            self.index.close()

    @property
    def where(self) -> str:
        """Where the index is, as `chatrun index` says it."""
        return str(self.index.path) if isinstance(self.index, KnowledgeIndex) else self.index.where

    def embedding_models(self, sources: Sequence[str]) -> dict[str, str]:
        """Source -> its `embeddings:` model, for those of `sources` that declare one."""
        known = (self.sources.get(name) for name in sources)
        return {s.name: s.embeddings for s in known if s is not None and s.embeddings}

    def search(self, query: str, sources: Sequence[str], k: int) -> list[Hit]:
        """The `k` passages of `sources` that best match `query`: BM25, fused (reciprocal rank)
        with the cosine ranking of each embedding model the sources declare; BM25 alone when
        they declare none or the endpoint gives no embeddings. KnowledgeUnavailable when the
        index cannot be built or read: never an empty answer that looks like "no match"."""
        return self._answered(self._search, query, sources, k)

    def _answered(self, read: Any, *args: Any) -> list[Hit]:
        """`read(*args)` of the index; a failure is KnowledgeUnavailable naming the index and what
        to do, logged once per distinct cause and kept in `problem` (/health shows it) until a
        read succeeds again (the next search tries the refresh again)."""
        try:
            hits: list[Hit] = read(*args)
        except ChatrunError:
            raise
        except Exception as exc:
            cause = f"{type(exc).__name__}: {exc}"
            if cause != self.problem:
                log.error("knowledge of the bot at %s: its index (%s) could not be built or read: %s; its routes "
                          "with knowledge fail their turns until it can (fix the cause, then run `chatrun index %s`)",
                          self.root, self.where, cause, self.root)
            self.problem = cause
            raise KnowledgeUnavailable(
                f"the knowledge index of the bot at {self.root} ({self.where}) could not be built or read: {cause}; "
                f"the turn was not answered without it. Fix the cause, then run `chatrun index {self.root}`") from None
        self.problem = None
        return hits

    def health(self) -> str:
        """What /health says of this index: "ok", "failed: <cause>", "not indexed: <sources>..."
        (web sources no `chatrun index` fetched), or "embeddings unavailable (<cause>): BM25
        alone" while the endpoint gives none."""
        if self.problem is not None:
            return f"failed: {self.problem}"
        if self.unindexed:
            return f"not indexed: {', '.join(self.unindexed)} (web pages): run `chatrun index {self.root}`"
        if self.embedder.down is not None:
            return f"embeddings unavailable ({self.embedder.down}): BM25 alone"
        return "ok"

    def _search(self, query: str, sources: Sequence[str], k: int) -> list[Hit]:
        """`search`, its failures not yet said."""
        index = self.ready()
        models = self.embedding_models(sources)
        if not models:
            return index.search(query, sources, k)
        rankings = [index.search(query, sources, max(k, CANDIDATES))]
        for model in sorted(set(models.values())):
            try:
                vector = self.embedder.embed(model, [query])[0]
            except EmbeddingsUnavailable:  # said once in the log (vectors.Embedder); BM25 answers
                continue
            names = [source for source, wanted in models.items() if wanted == model]
            rankings.append(index.nearest(model, vector, names, max(k, CANDIDATES)))
        if len(rankings) == 1:
            return rankings[0][:k]
        fused = fuse(rankings, k, key=lambda hit: (hit.source, hit.path, hit.anchor, hit.text))
        return [replace(hit, score=score) for hit, score in fused]

    async def asearch(self, query: str, sources: Sequence[str], k: int) -> list[Hit]:
        """`search` off the event loop (SQLite and the first refresh block)."""
        return await asyncio.to_thread(self.search, query, sources, k)

    def cited(self, text: str, sources: Sequence[str]) -> list[Hit]:
        """The passages of `sources` that `text` cites (`[path#anchor]`), each once, in order; of
        its first MAX_CITED distinct refs (a reply of 10,000 `[x]` is 50 look-ups, not 10,000)."""
        refs: dict[str, None] = {}
        for ref in (ref for m in _CITATION.finditer(text or "") for ref in cited_refs(m.group(1))):
            refs[ref] = None
            if len(refs) == MAX_CITED:
                break
        pairs = [(ref.partition("#")[0], ref.partition("#")[2]) for ref in refs]
        return self._answered(lambda: self.ready().find(pairs, sources)) if pairs else []

    def link(self, hit: Hit) -> str | None:
        """A passage's link, from its source's `url:` (None: the source declares none)."""
        source = self.sources.get(hit.source)
        if source is not None and source.web:  # a web page's passage: the page's URL and #anchor
            return hit.ref
        pattern = source.url if source is not None else None
        if not pattern:
            return None
        stem = hit.path.rsplit(".", 1)[0] if "." in hit.path.rsplit("/", 1)[-1] else hit.path
        return pattern.replace("{path}", stem).replace("{anchor}", hit.anchor)

    def source_entry(self, hit: Hit) -> dict[str, Any]:
        """A cited passage as the Sources event carries it."""
        entry: dict[str, Any] = {"title": hit.title, "ref": hit.ref, "source": hit.source}
        url = self.link(hit)
        if url:
            entry["url"] = url
        return entry


def cited_refs(inside: str) -> list[str]:
    """The refs a pair of square brackets may cite: what it holds, and each of its parts apart
    (`a.md#x, b.md#y`); only those that name a passage count (`Library.cited`)."""
    whole = inside.strip()
    parts = [part for part in _CITED_APART.split(whole) if part] if _CITED_APART.search(whole) else []
    return [whole, *parts] if whole else parts


def passages_text(hits: Sequence[Hit]) -> str:
    """Passages as the model reads them: each `[ref] title`, then its text; then how to cite."""
    if not hits:
        return "No passage of the knowledge sources matches. Say you do not know; do not make an answer up."
    blocks = [f"[{hit.ref}] {hit.title}\n{hit.text}" for hit in hits]
    return "\n\n".join(blocks) + "\n\n" + CITE_HOW.format(example=hits[0].ref)


# A bot's Library, shared by its search tool and its turns, without keeping the bot alive.
_LIBRARIES: dict[int, Library] = {}
_SHARED: list[str] = []  # the shared index's URL, when this process serves from one (share_index)


def share_index(url: str | None) -> None:
    """Bots whose Library is made from now on read their knowledge from the PostgreSQL index at
    `url` (None: each from its folder's SQLite file). `chatrun serve` sets it for its process."""
    _SHARED[:] = [url] if url else []


def open_index(config: BotConfig, url: str | None) -> KnowledgeIndex | PgIndex:
    """A bot's index: in PostgreSQL at `url` (keyed by `index_key`), else its folder's file."""
    if url:
        from chatrun.knowledge.pg_index import PgIndex

        return PgIndex(url, index_key(config.name, config.knowledge.values()), legacy=config.name)
    return KnowledgeIndex(index_path(config.root or "."))


def index_key(name: str, sources: Iterable[KnowledgeSource]) -> str:
    """What a bot's rows in a shared index are keyed by: its name and a digest of where its
    sources read (each source's name and folder, its pages or sitemap), so two bots of one name
    with other knowledge never read each other's passages; the same on every machine (the
    replicas and `chatrun index` agree without sharing a folder's path). A source's `include:`,
    `exclude:` and `language:` are left out: changing them refreshes the same index."""
    read = sorted((s.name, s.path, s.urls, s.sitemap) for s in sources)
    return f"{name}#{hashlib.sha256(json.dumps(read).encode()).hexdigest()[:16]}"


def library_of(config: BotConfig) -> Library:
    """The Library of a loaded bot (made on first use, dropped with the config)."""
    library = _LIBRARIES.get(id(config))
    if library is None:
        index = open_index(config, _SHARED[0] if _SHARED else None)
        library = _LIBRARIES[id(config)] = Library(config.root or ".", config.knowledge, config.model, index)
        weakref.finalize(config, _drop, id(config))
    return library


def knowledge_state(config: BotConfig) -> str | None:
    """What /health says of a loaded bot's knowledge (None: it declares none): its Library's
    `health()`, or "not searched yet" before its first search (nothing is opened for asking)."""
    if not config.knowledge:
        return None
    library = _LIBRARIES.get(id(config))
    return library.health() if library is not None else "not searched yet"


def _drop(key: int) -> None:
    """A bot's config is gone (a reload, a version retired): its Library and connections too."""
    library = _LIBRARIES.pop(key, None)
    if library is not None:
        library.close()
