"""Knowledge sources that are web pages (issue 37): `urls:` and `sitemap:` fetched by `chatrun
index` only — cut along their headings like local HTML, cited by their URL and #anchor,
re-cut only when changed (ETag/304, or the same bytes), failures named at the source's line
while the page keeps its passages, and `validate` checking the shape without fetching. The
site is a real HTTP server on a loopback port (tests/site_support.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

import chatrun
from chat_support import call, kinds
from chatrun.cli import main
from chatrun.definition.loader import load_config
from chatrun.errors import BotError
from chatrun.knowledge import Library
from chatrun.knowledge.web import path_pattern, wanted
from chatrun.models.scripted import ScriptedModel
from site_support import Site

BOT = """\
name: site
model: {{provider: openai, name: gpt-4o-mini, max_retries: 0}}
knowledge:
  help_site:
    sitemap: {base}/sitemap.xml
    exclude: ["/blog/**"]
  extra:
    urls:
      - {base}/help/account
      - {base}/help/gone
routes:
  main:
    default: true
    system: Answer from the help site.
    knowledge: [help_site, extra]
"""


def write_bot(root: Path, base: str, text: str = BOT) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "bot.yaml").write_text(text.format(base=base))
    return root


def index(root: Path) -> tuple[int, str, str]:
    out = CliRunner().invoke(main, ["index", str(root), "--quiet"])
    return out.exit_code, out.stdout, out.stderr


def line_of(root: Path, text: str) -> int:
    return next(n for n, line in enumerate((root / "bot.yaml").read_text().splitlines(), 1) if text in line)


def passages(root: Path) -> dict[str, tuple[int, str]]:
    """ref -> (passage id, text) of the whole index."""
    library = Library(root, load_config(root)[0].knowledge)
    db = library.index.reader()
    return {f"{p}#{a}" if a else p: (i, b) for i, p, a, b in db.execute("SELECT id, path, anchor, body FROM passages")}


# --- what needs no server ---------------------------------------------------------------------

def test_include_and_exclude_are_globs_of_the_url_path():
    assert path_pattern("/help/**").fullmatch("/help/a/b") and path_pattern("/help/*").fullmatch("/help/a")
    assert not path_pattern("/help/*").fullmatch("/help/a/b")
    assert wanted("https://x.example/help/a", ["/help/**"], []) and not wanted("https://x.example/blog/a", ["/help/**"], [])
    assert not wanted("https://x.example/help/old/a", [], ["/help/old/**"])


def no_fetching(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("nothing may be fetched here")
    monkeypatch.setattr(httpx.Client, "send", refuse)
    monkeypatch.setattr(httpx.AsyncClient, "send", refuse)


def test_a_running_bot_never_fetches_and_logs_a_web_source_the_index_holds_no_page_of(tmp_path, monkeypatch,
                                                                                     caplog):
    no_fetching(monkeypatch)
    root = write_bot(tmp_path, "http://127.0.0.1:9")
    library = Library(root, load_config(root)[0].knowledge)
    with caplog.at_level("WARNING", "chatrun.knowledge"):
        assert library.search("refund", ["help_site", "extra"], 3) == []
    said = [r.getMessage() for r in caplog.records]
    assert any("knowledge source help_site: no page of it is in the index" in m and "run `chatrun index" in m
               for m in said), said
    assert library.health().startswith("not indexed: help_site, extra (web pages): run `chatrun index ")  # /health


def test_validate_checks_the_shape_of_web_sources_at_their_lines_and_never_fetches(tmp_path, monkeypatch):
    no_fetching(monkeypatch)
    write_bot(tmp_path, "http://127.0.0.1:9")
    config, warnings = load_config(tmp_path)
    assert config.knowledge["help_site"].web and config.knowledge["extra"].urls[1] == "http://127.0.0.1:9/help/gone"
    assert not warnings
    bad = textwrap.dedent("""\
        name: bad
        model: {provider: openai, name: gpt-4o-mini}
        knowledge:
          both: {path: help, urls: ["https://a.example/x"]}
          linked: {urls: ["https://a.example/x"], url: "https://a.example/{path}"}
          listed: {urls: ["https://a.example/x"], exclude: ["/x/**"]}
          folder: {path: help, max_pages: 5}
          nothing: {include: ["/x/**"]}
        routes:
          main: {default: true, system: Hi., knowledge: [both, linked, listed, folder, nothing]}
        """)
    (tmp_path / "help").mkdir()
    (tmp_path / "help" / "a.md").write_text("# A\n\nText.\n")
    (tmp_path / "bot.yaml").write_text(bad)
    with pytest.raises(BotError) as caught:
        load_config(tmp_path)
    said = {d.line: d.message for d in caught.value.diagnostics}
    assert "has both `path` and `urls`" in said[4]
    assert "link to the page itself" in said[5]
    assert "`exclude` is for a `sitemap`'s pages" in said[6]
    assert "`max_pages` is for a `sitemap`'s pages" in said[7]
    assert "has no `path` (a folder), `urls` or `sitemap`" in said[8]
    (tmp_path / "bot.yaml").write_text(bad.replace('urls: ["https://a.example/x"], url', 'urls: ["ftp://a/x"], url'))
    with pytest.raises(BotError) as caught:
        load_config(tmp_path)
    assert any("`ftp://a/x` is not valid; write an absolute `http` or `https` URL" in d.message and d.line == 5
               for d in caught.value.diagnostics)


# --- through a real site ----------------------------------------------------------------------

@pytest.mark.slow
def test_index_fetches_the_sitemap_pages_cuts_them_along_headings_and_cites_their_urls(tmp_path):
    with Site() as site:
        root = write_bot(tmp_path / "bot", site.url)
        code, out, err = index(root)
        assert code == 0, err
        base = site.url
        # The sitemap index, its gzipped sitemap and its plain one; /blog/ excluded, /private/ disallowed by
        # robots.txt (never fetched), a page listed twice or with a #fragment fetched once; /help/gone answers 404.
        assert site.served("/private/salaries") == [] and site.served("/blog/news") == []
        assert site.served("/help/returns") == [200] and site.served("/help/shipping") == [200]
        assert f"{base}/private/salaries is disallowed by its host's robots.txt" in err
        assert f"bot.yaml:{line_of(root, '/help/gone')}: knowledge source `extra`: {base}/help/gone answered 404 " \
               "Not Found; it has no passages yet" in err
        assert "7 pages in 2 sources, 5 read, 0 removed" in out
        held = passages(root)
        assert f"{base}/help/returns#refund-window" in held and f"{base}/help/shipping#abroad" in held
        assert f"{base}/help/returns#sale-items" in held  # no id: the heading's slug, as for local HTML
        assert not any("Home · Help" in text or "Acme Inc." in text for _, text in held.values())  # nav, footer
        library = Library(root, load_config(root)[0].knowledge)
        hits = library.search("how many days for a refund", ["help_site"], 3)
        assert hits[0].ref == f"{base}/help/returns#refund-window"
        assert hits[0].title == "Returns and refunds › Refund window"
        assert library.source_entry(hits[0]) == {"title": "Returns and refunds › Refund window",
                                                 "ref": f"{base}/help/returns#refund-window",
                                                 "source": "help_site", "url": f"{base}/help/returns#refund-window"}
        model = ScriptedModel([call("search_knowledge", query="express delivery cost"),
                               {"text": f"Express costs 9.90 euros [{base}/help/shipping#costs]."}])
        events = chatrun.load_bot(root / "bot.yaml").session(model=model).chat("express?")
        assert ("Sources", {"sources": [{"title": "Shipping › Shipping costs", "ref": f"{base}/help/shipping#costs",
                                         "source": "help_site", "url": f"{base}/help/shipping#costs"}]}) in kinds(events)
        assert site.served("/help/shipping") == [200]  # the running bot fetched nothing


@pytest.mark.slow
def test_reindexing_cuts_again_only_the_page_that_changed(tmp_path):
    with Site() as site:
        root = write_bot(tmp_path / "bot", site.url)
        assert index(root)[0] == 0
        before = passages(root)
        site.pages["/help/shipping"] = site.pages["/help/shipping"].replace("9.90 euros", "12 euros")
        code, out, err = index(root)
        assert code == 0, err
        assert "4 read" not in out and ", 1 read, 0 removed" in out
        assert site.served("/help/returns") == [200, 304] and site.served("/help/shipping") == [200, 200]
        assert site.served("/help/account") == [200, 200, 304, 304]  # Last-Modified (two sources list it)
        assert site.served("/help/contact") == [200, 200]  # no validator: fetched, and its bytes compared
        after = passages(root)
        base = site.url
        assert "12 euros" in after[f"{base}/help/shipping#costs"][1]
        unchanged = [ref for ref in before if "/help/shipping" not in ref]
        assert unchanged and all(after[ref] == before[ref] for ref in unchanged)  # same rows: not re-cut
        site.pages.pop("/help/account")  # gone from the site: 404, so its passages are kept
        (root / "bot.yaml").write_text(BOT.format(base=base).replace("    exclude", "    include: [/help/returns]\n"
                                                                      "    exclude"))
        code, out, err = index(root)
        assert ", 3 removed" in out  # help_site's shipping, account and contact, no longer listed, leave
        assert f"{base}/help/account answered 404 Not Found; its passages from the last run are kept" in err
        assert code == 1 and "knowledge source `extra`: no page could be fetched" in err  # it yielded nothing...
        db = Library(root, load_config(root)[0].knowledge).index.reader()
        assert db.execute("SELECT source, path, anchor FROM passages WHERE path LIKE '%/help/account'").fetchall() \
            == [("extra", f"{base}/help/account", "password")]  # ...and lost nothing


@pytest.mark.slow
def test_failures_are_named_at_the_line_and_a_down_site_keeps_every_passage(tmp_path, monkeypatch):
    monkeypatch.setattr("chatrun.knowledge.web.TIMEOUT", 1.0)  # the hanging page never answers at all
    with Site() as site:
        root = write_bot(tmp_path / "bot", site.url)
        assert index(root)[0] == 0
        before = passages(root)
        base = site.url
        site.failing.update({"/help/returns": 500, "/help/shipping": 0})
        code, out, err = index(root)
        sitemap_line = line_of(root, "help_site:")
        assert code == 0, err  # the account page answered: the sources yielded something
        assert f"bot.yaml:{sitemap_line}: knowledge source `help_site`: {base}/help/returns answered 500 Internal " \
               "Server Error; its passages from the last run are kept" in err
        assert f"{base}/help/shipping did not answer within 1 s; its passages from the last run are kept" in err
        assert passages(root) == before
        site.failing = {"/robots.txt": 503}  # robots.txt unreadable: its host's pages are failures (RFC 9309)
        code, out, err = index(root)
        assert code == 1 and f"{base}/help/account cannot be fetched: its host's robots.txt answered 503; its " \
            "passages from the last run are kept" in err
        assert site.served("/help/account").count(200) == 2  # the first run's two sources; none since
        assert passages(root) == before
        site.stop()
        code, out, err = index(root)
        assert code == 1
        assert f"bot.yaml:{sitemap_line}: knowledge source `help_site`: sitemap {base}/sitemap.xml could not be " \
               "reached" in err and "no page is removed from the index" in err
        assert "knowledge source `extra`: no page could be fetched" in err
        assert passages(root) == before  # nothing lost
        library = Library(root, load_config(root)[0].knowledge)
        assert library.search("refund window", ["help_site"], 1)[0].ref == f"{base}/help/returns#refund-window"


@pytest.mark.slow
def test_max_pages_and_include_choose_the_sitemap_pages_and_say_what_was_left_out(tmp_path):
    with Site() as site:
        root = write_bot(tmp_path / "bot", site.url, BOT.replace('exclude: ["/blog/**"]',
                                                                 'include: ["/help/**"]\n    max_pages: 2'))
        code, out, err = index(root)
        assert code == 0, err
        assert "the sitemap lists 4 pages; the first 2 are fetched (`max_pages: 2`), the others left out" in err
        assert site.served("/help/returns") == [200] and site.served("/help/shipping") == [200]
        assert site.served("/help/contact") == [] and site.served("/blog/news") == []


@pytest.mark.slow
def test_a_changed_page_alone_is_embedded_again(fake, tmp_path):
    with Site() as site:
        root = write_bot(tmp_path / "bot", site.url, BOT.replace('exclude: ["/blog/**"]', 'exclude: ["/blog/**"]\n'
                                                                 "    embeddings: text-embedding-3-small"))
        code, out, err = index(root)
        first = sum(len(body["input"]) for body in fake.embedding_requests)
        assert code == 0 and f", {first} embedded;" in out and first > 0
        site.pages["/help/shipping"] = site.pages["/help/shipping"].replace("9.90 euros", "12 euros")
        code, out, err = index(root)
        assert ", 1 read, 0 removed, 1 embedded;" in out
        assert [text for body in fake.embedding_requests for text in body["input"]][first:] == [
            "Shipping › Shipping costs\nStandard delivery is free; express delivery costs 12 euros."]
