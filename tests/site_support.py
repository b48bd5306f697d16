"""A small web site on a free loopback port (http.server in a thread), for knowledge sources
that are web pages (tests/test_knowledge_web.py, docs/knowledge.md's worked example through
tests/doc_servers.py): pages with ETags (answering 304 to a matching If-None-Match), a
sitemap index, a gzipped sitemap, robots.txt, and pages that fail on demand — 404, 500, or
never answering until the site stops. Every request is logged with the status it got."""

from __future__ import annotations

import gzip
import hashlib
import threading
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PAGES = {
    "/help/returns": """<html><head><title>Returns and refunds</title></head><body>
<nav>Home · Help · Blog</nav>
<h1>Returns and refunds</h1>
<p>We take back anything you bought from us.</p>
<h2 id="refund-window">Refund window</h2>
<p>Return any item within 30 days for a full refund, shipping included.</p>
<h2>Sale items</h2>
<p>Items bought on sale can be returned within 14 days.</p>
<footer>Acme Inc.</footer></body></html>""",
    "/help/shipping": """<html><head><title>Shipping</title></head><body>
<h1>Shipping</h1>
<h2 id="costs">Shipping costs</h2>
<p>Standard delivery is free; express delivery costs 9.90 euros.</p>
<h2 id="abroad">Shipping abroad</h2>
<p>We ship to every country of the European Union within five working days.</p>
</body></html>""",
    "/help/account": """<html><head><title>Your account</title></head><body>
<h2 id="password">Password</h2>
<p>Reset your password from the sign-in page with the link "Forgot password".</p>
</body></html>""",
    "/help/contact": """<html><head><title>Contact</title></head><body>
<h2>Opening hours</h2><p>Our support answers from 9 to 17 on working days.</p></body></html>""",
    "/blog/news": "<html><head><title>News</title></head><body><h1>News</h1><p>Our refund party.</p></body></html>",
    "/private/salaries": "<html><body><h1>Salaries</h1><p>The refund budget is secret.</p></body></html>",
}
ROBOTS = "User-agent: *\nDisallow: /private/\n"


def sitemap(urls: list[str]) -> str:
    entries = "".join(f"<url><loc>{u}</loc></url>" for u in urls)
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</urlset>'


def sitemap_index(urls: list[str]) -> str:
    entries = "".join(f"<sitemap><loc>{u}</loc></sitemap>" for u in urls)
    return ('<?xml version="1.0" encoding="UTF-8"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"{entries}</sitemapindex>")


@dataclass
class Site:
    """The site's pages (path -> HTML, editable while it runs), failures by path, and its log."""

    pages: dict[str, str] = field(default_factory=lambda: dict(PAGES))
    failing: dict[str, int] = field(default_factory=dict)  # path -> status (0: never answers)
    # How a page says it is unchanged: an ETag (the default), a Last-Modified date, or nothing.
    validators: dict[str, str] = field(default_factory=lambda: {"/help/account": "last-modified",
                                                                "/help/contact": "none"})
    log: list[tuple[str, int]] = field(default_factory=list)  # (path, status) of every request
    robots: str | None = ROBOTS
    url: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None

    def files(self) -> dict[str, tuple[str, bytes]]:
        """path -> (content type, body) of everything served besides the pages."""
        base = self.url
        help_pages = [f"{base}/help/returns", f"{base}/help/shipping#abroad", f"{base}/help/account",
                      f"{base}/help/contact"]
        out = {"/sitemap.xml": ("application/xml", sitemap_index([f"{base}/sitemaps/help.xml.gz",
                                                                  f"{base}/sitemaps/more.xml"]).encode()),
               "/sitemaps/help.xml.gz": ("application/gzip", gzip.compress(sitemap(help_pages).encode())),
               "/sitemaps/more.xml": ("application/xml", sitemap([f"{base}/blog/news", f"{base}/private/salaries",
                                                                 f"{base}/help/returns"]).encode())}
        if self.robots is not None:
            out["/robots.txt"] = ("text/plain", self.robots.encode())
        return out

    def validator(self, path: str, body: bytes, asked: Any) -> tuple[tuple[str, str], int]:
        """The page's validator header, and 304 when the request's conditional header matches it."""
        digest = hashlib.sha256(body).hexdigest()
        kind = self.validators.get(path, "etag")
        if kind == "etag":
            etag = f'"{digest[:16]}"'
            return ("ETag", etag), 304 if asked.get("If-None-Match") == etag else 200
        if kind == "last-modified":  # a date per version of the page
            date = formatdate(1_700_000_000 + int(digest[:6], 16), usegmt=True)
            return ("Last-Modified", date), 304 if asked.get("If-Modified-Since") == date else 200
        return ("", ""), 200

    def served(self, path: str) -> list[int]:
        """The statuses the requests of `path` got, in order."""
        return [status for p, status in self.log if p == path]

    def __enter__(self) -> Site:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                status = site.failing.get(path)
                if status == 0:
                    site._stop.wait(60)  # never answers while the site runs
                    return
                body, kind, validator = b"", "text/html; charset=utf-8", ("", "")
                if status is None and path in site.pages:
                    body = site.pages[path].encode()
                    validator, status = site.validator(path, body, self.headers)
                elif status is None and path in site.files():
                    kind, body = site.files()[path]
                    status = 200
                else:
                    status, body = status or 404, b"<h1>Not here</h1>"
                site.log.append((path, status))
                self.send_response(status)
                if validator[0]:
                    self.send_header(*validator)
                if status != 304:
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if status != 304:
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop answering (the port is closed: requests are refused)."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __exit__(self, *exc: object) -> None:
        self.stop()
