"""Web pages as knowledge: a source's `urls:`, or the pages a `sitemap:` lists, fetched with
httpx by `chatrun index` only — never while the bot runs (a running bot's refresh keeps the
pages' passages as the last `chatrun index` left them).

    list_pages   a source's pages: its `urls:`, or its sitemap's (a sitemap index followed,
                 gzip or not), filtered by `include`/`exclude` (globs of the URL's path) and
                 capped at `max_pages`
    refresh_web  each page fetched, conditionally (If-None-Match / If-Modified-Since from the
                 last run), and cut again only when its bytes changed (SHA-256): a page that
                 answers 304 or the same bytes is neither re-cut nor re-embedded

A page is cut as a local file of its kind is (HTML along its headings, chunks.py), and stored
in the index — either one, through the PageIndex seam: the bot folder's SQLite file
(KnowledgeIndex, a transaction per page) or the shared PostgreSQL index (PgIndex, a
transaction per source) — with its URL as its path, so a passage's ref and link are the page's URL and its
heading's #anchor. Failures lose nothing: a page that answers an error, times out or cannot be
cut keeps its passages from the last run, and a sitemap that cannot be read removes no page.
robots.txt is honoured for pages (user agent USER_AGENT): a page it disallows is left out
(its passages removed, as the site asks); a robots.txt that answers 4xx allows everything, one
that cannot be fetched (5xx, no answer) makes its host's pages fail (kept), per RFC 9309.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol
from urllib.parse import urljoin, urlsplit, urlunsplit
from urllib.robotparser import RobotFileParser

import httpx

from chatrun.definition.config import KnowledgeSource, Location
from chatrun.definition.knowledge import too_large
from chatrun.knowledge.chunks import Chunk, chunk_file, chunk_html, chunk_markdown, chunk_pdf
from chatrun.knowledge.index import Refreshed, StoredPage

log = logging.getLogger("chatrun.knowledge")

USER_AGENT = "chatrun-knowledge/1 (+https://chatrun.dev/docs/knowledge)"
TIMEOUT = 20.0  # seconds a request may take (to connect, and between bytes read)
MAX_PAGES = 1000  # a sitemap's pages at most, unless the source's `max_pages` says otherwise
SITEMAP_DEPTH = 3  # sitemap indexes nested at most this deep (the protocol has one level)

class FetchError(Exception):
    """A URL that could not be read: why, in words for the bot's author."""


@dataclass
class Listing:
    """A web source's pages as listed at index time."""

    source: KnowledgeSource
    urls: list[str] = field(default_factory=list)
    where: dict[str, Location] = field(default_factory=dict)  # each page's line in the bot (errors name it)
    problems: list[str] = field(default_factory=list)  # the listing's own (a sitemap that failed, a cap)
    complete: bool = True  # False: the sitemap could not be read in full, so no page is removed


@dataclass
class WebRefreshed:
    """What fetching did: pages listed, read again (changed), unchanged, removed, and each problem."""

    pages: int = 0
    read: int = 0
    unchanged: int = 0
    removed: int = 0
    problems: list[str] = field(default_factory=list)  # `file:line: knowledge source ...: URL ...`
    silent: list[str] = field(default_factory=list)  # sources no page of which answered


def client() -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(TIMEOUT), follow_redirects=True,
                        headers={"User-Agent": USER_AGENT})


def page_key(url: str) -> str:
    """A page's URL as the index keys it: its fragment dropped (a page is fetched once)."""
    parts = urlsplit(url.strip())
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, ""))


def path_pattern(glob: str) -> re.Pattern[str]:
    """A glob of URL paths: `**` crosses `/`, `*` and `?` stay within a segment."""
    out = ""
    for token in re.split(r"(\*\*|\*|\?)", glob):
        out += {"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return re.compile(out)


def wanted(url: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether a sitemap's page is fetched: its path matches an `include` (or there is none) and no `exclude`."""
    path = urlsplit(url).path or "/"
    if include and not any(path_pattern(g).fullmatch(path) for g in include):
        return False
    return not any(path_pattern(g).fullmatch(path) for g in exclude)


def list_pages(source: KnowledgeSource, http: httpx.Client) -> Listing:
    """The pages of a web source: its `urls:`, or its sitemap's, filtered and capped."""
    listing = Listing(source)
    if source.urls:
        for n, url in enumerate(source.urls):
            key = page_key(url)
            if key not in listing.where:
                listing.urls.append(key)
                listing.where[key] = source.urls_where[n] if n < len(source.urls_where) else source.where
        return listing
    assert source.sitemap is not None
    found: list[str] = []
    _read_sitemap(source.sitemap, http, found, listing, 0)
    keys = [page_key(u) for u in dict.fromkeys(found) if wanted(u, source.include, source.exclude)]
    keys = list(dict.fromkeys(keys))
    cap = source.max_pages or MAX_PAGES
    if len(keys) > cap:
        listing.problems.append(f"{source.where}: knowledge source `{source.name}`: the sitemap lists {len(keys)} "
                                f"pages; the first {cap} are fetched (`max_pages: {cap}`), the others left out")
        keys = keys[:cap]
    listing.urls = keys
    listing.where = {key: source.where for key in keys}
    return listing


def _read_sitemap(url: str, http: httpx.Client, found: list[str], listing: Listing, depth: int) -> None:
    """The page URLs of a sitemap (`<urlset>`) into `found`; a sitemap index's sitemaps followed."""
    source = listing.source
    try:
        data = fetch_bytes(http, url).content
        if data[:2] == b"\x1f\x8b":  # gzipped (sitemap.xml.gz), whatever the server's headers say
            data = gzip.decompress(data)
        root = ElementTree.fromstring(data)
    except (FetchError, OSError, EOFError, ElementTree.ParseError) as exc:
        listing.complete = False
        listing.problems.append(f"{source.where}: knowledge source `{source.name}`: sitemap {url} {_why(exc)}; "
                                "no page is removed from the index")
        return
    kind = root.tag.rsplit("}", 1)[-1]
    locs = [(el.text or "").strip() for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "loc"]
    if kind == "sitemapindex":
        if depth >= SITEMAP_DEPTH:
            listing.complete = False
            listing.problems.append(f"{source.where}: knowledge source `{source.name}`: sitemap {url} nests "
                                    f"sitemap indexes more than {SITEMAP_DEPTH} deep; the deeper ones are not read")
            return
        for loc in locs:
            if loc:
                _read_sitemap(urljoin(url, loc), http, found, listing, depth + 1)
    elif kind == "urlset":
        found += [urljoin(url, loc) for loc in locs if loc]
    else:
        listing.complete = False
        listing.problems.append(f"{source.where}: knowledge source `{source.name}`: {url} is not a sitemap (its "
                                f"root element is <{kind}>, not <urlset> or <sitemapindex>)")


def _why(exc: BaseException) -> str:
    if isinstance(exc, FetchError):
        return str(exc)
    if isinstance(exc, ElementTree.ParseError):
        return f"is not XML ({exc})"
    return f"could not be read ({exc})"


@dataclass
class Answer:
    """A URL's answer: its status, bytes (empty for 304), content type and validators."""

    status: int
    content: bytes = b""
    content_type: str = ""
    encoding: str | None = None
    etag: str | None = None
    last_modified: str | None = None


def fetch_bytes(http: httpx.Client, url: str, headers: dict[str, str] | None = None) -> Answer:
    """GET `url` (at most MAX_BYTES of definition/knowledge.py); 200 and 304 answer, anything else is a FetchError."""
    try:
        with http.stream("GET", url, headers=headers or {}) as response:
            if response.status_code not in (200, 304):
                raise FetchError(f"answered {response.status_code} {response.reason_phrase}".rstrip())
            content = bytearray()
            for piece in response.iter_bytes():
                content += piece
                if big := too_large(len(content)):  # not read: a failure (the page keeps its passages)
                    raise FetchError(big)
            return Answer(response.status_code, bytes(content), response.headers.get("content-type", ""),
                          response.charset_encoding, response.headers.get("etag"),
                          response.headers.get("last-modified"))
    except httpx.TimeoutException:
        raise FetchError(f"did not answer within {TIMEOUT:g} s") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"could not be reached ({type(exc).__name__}: {exc})") from None


def cut_page(url: str, answer: Answer) -> list[Chunk]:
    """A page's passages, cut as a local file of its kind is; FetchError for another kind."""
    kind = answer.content_type.split(";")[0].strip().lower()
    name = PurePosixPath(urlsplit(url).path).name or urlsplit(url).netloc
    stem = name.rsplit(".", 1)[0] if "." in name else name
    text = answer.content.decode(answer.encoding or "utf-8", errors="replace") if kind != "application/pdf" else ""
    if kind in ("text/html", "application/xhtml+xml") or (not kind and text.lstrip()[:1] == "<"):
        return chunk_html(text, stem)
    if kind in ("text/markdown", "text/x-markdown"):
        return chunk_markdown(text, stem)
    if kind == "text/plain":
        return chunk_markdown(text, stem) if name.endswith((".md", ".markdown")) else _plain(text, stem)
    if kind == "application/pdf":
        try:
            return chunk_pdf(Path(f"{stem}.pdf"), answer.content)
        except ImportError:
            raise FetchError("is a PDF, and reading PDFs needs the `pdf` extra: pip install 'chatrun[pdf]'") from None
    raise FetchError(f"is not HTML, Markdown, text or PDF (Content-Type: {kind or 'none'})")


def _plain(text: str, stem: str) -> list[Chunk]:
    return chunk_file(Path(f"{stem}.txt"), text.encode())


class Robots:
    """robots.txt per host, read once per run."""

    def __init__(self, http: httpx.Client):
        self.http = http
        self.hosts: dict[str, RobotFileParser | str] = {}  # a parser, or why robots.txt could not be read

    def allows(self, url: str) -> bool:
        """Whether robots.txt lets USER_AGENT fetch `url`; FetchError when it cannot be read (5xx, no answer)."""
        parts = urlsplit(url)
        host = f"{parts.scheme}://{parts.netloc}"
        if host not in self.hosts:
            self.hosts[host] = self._read(host)
        rules = self.hosts[host]
        if isinstance(rules, str):
            raise FetchError(rules)
        return rules.can_fetch(USER_AGENT.split("/", 1)[0], url)

    def _read(self, host: str) -> RobotFileParser | str:
        parser = RobotFileParser(f"{host}/robots.txt")
        try:
            with self.http.stream("GET", f"{host}/robots.txt") as response:
                if 400 <= response.status_code < 500:
                    parser.parse([])  # none: everything is allowed
                    return parser
                if response.status_code != 200:
                    return f"cannot be fetched: its host's robots.txt answered {response.status_code}"
                parser.parse(response.read().decode("utf-8", errors="replace").splitlines())
                return parser
        except httpx.HTTPError as exc:
            return f"cannot be fetched: its host's robots.txt could not be read ({type(exc).__name__})"


class PageWriter(Protocol):
    """Where one source's fetched pages go (an index's `writing_pages`)."""

    def page(self, url: str, digest: str, chunks: list[Chunk] | None, etag: str | None,
             last_modified: str | None) -> None:
        """A page that answered: its passages replaced by `chunks` (None: unchanged), its validators kept."""

    def remove(self, url: str) -> None:
        """A page no longer listed, or disallowed: its passages leave."""


class PageIndex(Protocol):
    """The seam between fetching (here, the one fetch path) and an index: the SQLite file
    (index.py KnowledgeIndex: a transaction per page) and PostgreSQL (pg_index.py PgIndex: a
    transaction per source, so readers see a source all old or all new) both implement it."""

    def stored_pages(self, source: str) -> dict[str, StoredPage]:
        """url -> (hash, ETag, Last-Modified) of the source's pages in the index."""

    def writing_pages(self, source: str) -> AbstractContextManager[PageWriter]:
        """A writer for one source's pages; what it wrote is visible to readers by its end."""

    def pages_done(self, done: Refreshed, changed: bool) -> None:
        """After every source: `done.passages` counted (and what the index derives, when `changed`)."""


def refresh_web(index: PageIndex, listings: Sequence[Listing], done: Refreshed, http: httpx.Client,
                step: Callable[[str], None] | None = None) -> WebRefreshed:
    """Fetch each listed page and bring its passages up to date (only changed pages are cut
    again); remove a source's pages no longer listed (when its listing is complete)."""
    web = WebRefreshed()
    robots = Robots(http)
    for listing in listings:
        web.problems += listing.problems
        stored = index.stored_pages(listing.source.name)
        with index.writing_pages(listing.source.name) as writer:
            answered = _refresh_source(writer, stored, listing, robots, http, web, step)
        if not answered:
            web.silent.append(listing.source.name)
    index.pages_done(done, bool(web.read or web.removed))
    done.changed += web.read
    done.removed += web.removed
    return web


def _refresh_source(writer: PageWriter, stored: dict[str, StoredPage], listing: Listing, robots: Robots,
                    http: httpx.Client, web: WebRefreshed, step: Callable[[str], None] | None) -> int:
    """One source's pages; how many answered (fetched, or confirmed unchanged)."""
    name = listing.source.name
    answered = 0
    gone = [url for url in stored if url not in listing.where] if listing.complete else []
    for url in listing.urls:
        web.pages += 1
        try:
            if not robots.allows(url):
                web.problems.append(f"{listing.where[url]}: knowledge source `{name}`: {url} is disallowed by its "
                                    "host's robots.txt; left out of the index")
                gone += [url] if url in stored else []
                continue
            if _refresh_page(writer, url, stored.get(url), http):
                web.read += 1
            else:
                web.unchanged += 1
            answered += 1
        except FetchError as exc:
            kept = "its passages from the last run are kept" if url in stored else "it has no passages yet"
            web.problems.append(f"{listing.where[url]}: knowledge source `{name}`: {url} {exc}; {kept}")
            log.warning("knowledge source %s: %s %s; %s", name, url, exc, kept)
        finally:
            if step is not None:
                step(url)
    for url in gone:  # no longer listed (by a listing read in full), or disallowed
        writer.remove(url)
        web.removed += 1
    return answered


def _refresh_page(writer: PageWriter, url: str, stored: StoredPage | None, http: httpx.Client) -> bool:
    """Fetch one page (conditionally, when the index holds it) and replace its passages if its
    bytes changed. True: it was cut again."""
    headers: dict[str, str] = {}
    if stored is not None:
        if stored[1]:
            headers["If-None-Match"] = stored[1]
        if stored[2]:
            headers["If-Modified-Since"] = stored[2]
    answer = fetch_bytes(http, url, headers)
    if answer.status == 304:
        if stored is None:  # a 304 to an unconditional request: nothing to keep
            raise FetchError("answered 304 Not Modified to a request that asked for the page")
        return False
    digest = hashlib.sha256(answer.content).hexdigest()
    if stored is not None and stored[0] == digest:
        writer.page(url, digest, None, answer.etag, answer.last_modified)
        return False
    try:
        chunks = cut_page(url, answer)  # a FetchError here keeps the old passages
    except FetchError:
        raise
    except Exception as exc:  # a PDF pypdf cannot parse, ...
        raise FetchError(f"could not be cut into passages ({exc})") from None
    writer.page(url, digest, chunks, answer.etag, answer.last_modified)
    return True
