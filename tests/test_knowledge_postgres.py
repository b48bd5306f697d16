"""The shared knowledge index in PostgreSQL (issue 37, knowledge/pg_index.py), against a real
PostgreSQL (tests/postgres_support.py): `chatrun index BOT --store postgresql://…` builds it once,
incrementally; two `chatrun serve --store postgresql://…` replicas answer from it and both see a
re-indexed article; a reader never sees half a re-indexed source nor waits for a refresh, while a
second indexer does; the hits match the SQLite index's (as sets: BM25 and ts_rank_cd order
passages differently); hybrid search ranks vectors stored as float arrays (in Python without pgvector, in the database with it: the
`pgserver` wheel's PostgreSQL); web sources (a sitemap, from
tests/site_support.py's local site) go there with `chatrun index --store` as incrementally as
into SQLite (validators kept in PostgreSQL, a down site losing nothing)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from chatrun.cli import main
from chatrun.definition.loader import load_config
from chatrun.knowledge import Library, open_index
from chatrun.knowledge.index import INDEX_VERSION, plan
from chatrun.knowledge.pg_index import PgIndex
from redis_support import Replica
from server_support import wait_until
from site_support import Site

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'chatrun[postgres]')")

HELPCENTRE = Path(__file__).resolve().parent.parent / "bots" / "helpcentre"
QUESTIONS = ["How long do I have to return an item?", "what does express shipping cost",
             "I forgot my password", "damaged parcel replacement", "refund to my card"]


def helpcentre(tmp_path: Path) -> Path:
    """A copy of bots/helpcentre to change articles in."""
    root = tmp_path / "helpcentre"
    shutil.copytree(HELPCENTRE, root, ignore=shutil.ignore_patterns(".chatrun"))
    return root


def index_into(root: Path, url: str) -> str:
    result = CliRunner().invoke(main, ["index", str(root), "--store", url, "--quiet"])
    assert result.exit_code == 0, result.output
    return result.output


def shared_library(root: Path, url: str) -> Library:
    config, _ = load_config(root)
    return Library(root, config.knowledge, config.model, open_index(config, url))


@pytest.mark.slow
def test_chatrun_index_builds_the_shared_index_once_and_then_reads_only_what_changed(tmp_path, postgres_server):
    root, url = helpcentre(tmp_path), postgres_server.url()
    first = index_into(root, url)
    assert "3 files in 1 source, 3 read, 0 removed;" in first and "(bot helpcentre#" in first
    assert not (root / ".chatrun").exists()  # nothing in the bot's folder
    assert "3 read" not in index_into(root, url) and ", 0 read, 0 removed" in index_into(root, url)
    (root / "help" / "returns.md").write_text("# Returns\n\n## Refund window\n\nReturn it within 60 days.\n")
    (root / "help" / "shipping.md").unlink()
    again = index_into(root, url)
    assert "2 files in 1 source, 1 read, 1 removed;" in again
    library = shared_library(root, url)
    try:
        assert [h.ref for h in library.search("shipping costs", ["help_centre"], 5)] == []
        hits = library.search("refund window", ["help_centre"], 5)
        assert hits[0].ref == "returns.md#refund-window" and "60 days" in hits[0].text
        assert library.cited("See [returns.md#refund-window].", ["help_centre"])[0].title == "Returns › Refund window"
    finally:
        library.close()


@pytest.mark.slow
def test_two_bots_of_one_name_sharing_a_database_each_search_their_own_passages(tmp_path, postgres_server):
    """Rows were keyed by the bot's name alone: a second bot named `helpcentre` (a staging copy
    with other articles) indexed into the same database replaced the first one's passages, and
    the first one's search returned the second one's. The key names the bot's sources too."""
    url, first = postgres_server.url(), helpcentre(tmp_path)
    second = tmp_path / "staging"
    (second / "faq").mkdir(parents=True)
    (second / "bot.yaml").write_text((first / "bot.yaml").read_text().replace("path: help", "path: faq"))
    (second / "faq" / "gifts.md").write_text("# Gift cards\n\n## Balance\n\nA gift card's balance never expires.\n")
    index_into(first, url)
    index_into(second, url)
    libraries = [shared_library(root, url) for root in (first, second)]
    try:
        found = [{h.ref.split("#")[0] for question in ("gift card balance", "refund window")
                  for h in library.search(question, ["help_centre"], 5)} for library in libraries]
        assert "returns.md" in found[0] and "gifts.md" not in found[0]
        assert found[1] == {"gifts.md"}
    finally:
        for library in libraries:
            library.close()


@pytest.mark.slow
def test_an_index_kept_under_the_bots_bare_name_is_found_not_read_again(tmp_path, postgres_server):
    """An index written by an earlier release (its rows keyed by the bot's name alone) is taken
    over by the first refresh under the new key: no file is read again, and it answers."""
    from chatrun.knowledge.pg_index import PgIndex

    root, url = helpcentre(tmp_path), postgres_server.url()
    config, _ = load_config(root)
    old = Library(root, config.knowledge, config.model, PgIndex(url, config.name))
    try:
        assert old.refresh().changed == 3
    finally:
        old.close()
    assert ", 0 read, 0 removed" in index_into(root, url)
    library = shared_library(root, url)
    try:
        assert library.search("refund window", ["help_centre"], 5)
    finally:
        library.close()


@pytest.mark.slow
def test_its_hits_are_the_sqlite_index_hits_as_sets(tmp_path, postgres_server):
    root, url = helpcentre(tmp_path), postgres_server.url()
    config, _ = load_config(root)
    local = Library(root, config.knowledge)
    shared = shared_library(root, url)
    try:
        shared.refresh()
        for question in QUESTIONS:  # the ranking functions differ (BM25, cover density): same passages found
            want = {h.ref for h in local.search(question, ["help_centre"], 50)}
            got = {h.ref for h in shared.search(question, ["help_centre"], 50)}
            assert got == want and got, question
            top = local.search(question, ["help_centre"], 1)[0].ref
            assert top in {h.ref for h in shared.search(question, ["help_centre"], 3)}, question
    finally:
        shared.close()


@pytest.mark.slow
def test_a_reader_never_sees_half_a_reindexed_source(tmp_path, postgres_server):
    root, url = helpcentre(tmp_path), postgres_server.url()
    (root / "help").mkdir(exist_ok=True)
    articles = [root / "help" / f"a{i}.md" for i in range(6)]

    def write(word: str) -> None:
        for path in articles:
            path.write_text(f"# Notice {path.stem}\n\nThe {word} edition of this notice.\n")

    write("alpha")
    shared = shared_library(root, url)
    shared.refresh()
    seen: list[tuple[int, int]] = []
    stop = threading.Event()

    def read() -> None:
        reader = shared_library(root, url)
        try:
            while not stop.is_set():
                hits = reader.index.search("alpha beta edition", ["help_centre"], 50)
                words = [h.text.split()[1] for h in hits if h.path.startswith("a") and h.path.endswith(".md")]
                seen.append((words.count("alpha"), words.count("beta")))
        finally:
            reader.close()

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for round_ in range(6):
            write("beta" if round_ % 2 == 0 else "alpha")
            assert shared.refresh().changed == len(articles)
            # Two searches end before the next refresh, however slow the machine (a busy one ran all
            # six within the reader's first search): the second began after this one, so each
            # edition is seen whole as well as any search that overlapped a refresh.
            read_after = len(seen)
            wait_until(lambda n=read_after: len(seen) >= n + 2, what="two searches after a refresh")
    finally:
        stop.set()
        thread.join()
        shared.close()
    assert set(seen) == {(6, 0), (0, 6)}, set(seen)


@pytest.mark.slow
def test_a_search_never_waits_for_a_refresh_in_progress_and_a_second_indexer_does(tmp_path, postgres_server):
    """A refresh caught in the middle: its lock per bot taken, the bot's passages deleted, nothing
    committed yet. A search (a replica's, its index built) answers at once from the old passages;
    a second indexer waits for that lock (PostgreSQL's pg_locks shows it waiting), then runs."""
    import psycopg

    root, url = helpcentre(tmp_path), postgres_server.url()
    shared = shared_library(root, url)
    shared.refresh()
    before = [h.ref for h in shared.search("refund window", ["help_centre"], 5)]
    assert before
    reader, found, refreshed = shared_library(root, url), [], []
    try:
        with psycopg.connect(url) as refreshing:
            refreshing.execute("SELECT pg_advisory_xact_lock(hashtextextended('knowledge:' || %s, 0))",
                               (shared.index.bot,))
            refreshing.execute("DELETE FROM knowledge_passages WHERE bot = %s", (shared.index.bot,))
            search = threading.Thread(target=lambda: found.append(
                [h.ref for h in reader.search("refund window", ["help_centre"], 5)]), daemon=True)
            search.start()
            search.join(timeout=60)  # a bound for a search that waits, not a measure of speed
            assert found == [before], "the search waited for the refresh or saw half of it"
            (root / "help" / "returns.md").write_text("# Returns\n\nNothing can be returned.\n")
            second = threading.Thread(target=lambda: refreshed.append(reader.refresh()), daemon=True)
            second.start()
            wait_until(lambda: refreshing.execute(
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone(),
                timeout=60, what="the second indexer waiting for the lock per bot")
            assert not refreshed
            refreshing.rollback()
        second.join(timeout=120)
        assert [r.changed for r in refreshed] == [1]
    finally:
        reader.close()
        shared.close()


@pytest.mark.slow
def test_hybrid_search_ranks_vectors_kept_in_postgres(fake, tmp_path, postgres_server):
    root, url = helpcentre(tmp_path), postgres_server.url()
    bot = (root / "bot.yaml").read_text().replace("    path: help\n", "    path: help\n    embeddings: text-embedding-3-small\n")
    (root / "bot.yaml").write_text(bot)
    fake.synonym("reimbursement", "refund")
    library = shared_library(root, url)
    try:
        done = library.refresh()
        assert done.embedded == done.passages > 0 and done.embeddings_problem is None
        assert library.index.search("reimbursement", ["help_centre"], 5) == []  # no word of it is indexed
        hits = library.search("reimbursement", ["help_centre"], 3)
        config, _ = load_config(root)
        local = Library(root, config.knowledge, config.model)  # the SQLite index, with the same vectors
        assert len(hits) == 3 and hits == local.search("reimbursement", ["help_centre"], 3)  # by cosine alone
        assert "returns.md#refund-window" in {h.ref for h in hits}
        before = len(fake.embedding_requests)
        assert library.refresh().embedded == 0 and len(fake.embedding_requests) == before  # nothing new to embed
    finally:
        library.close()
    assert isinstance(library.index, PgIndex)


@pytest.mark.slow
def test_with_pgvector_the_database_ranks_vectors_as_python_does(fake, tmp_path, pgvector_server):
    root, url = helpcentre(tmp_path), pgvector_server.url()
    bot = (root / "bot.yaml").read_text().replace("    path: help\n", "    path: help\n    embeddings: text-embedding-3-small\n")
    (root / "bot.yaml").write_text(bot)
    library = shared_library(root, url)
    try:
        library.refresh()
        index = library.index
        assert isinstance(index, PgIndex) and index.pgvector  # the extension installed by the index itself
        query = library.embedder.embed("text-embedding-3-small", ["refund to my card"])[0]
        in_database = index.nearest("text-embedding-3-small", query, ["help_centre"], 5)
        index.pgvector = False
        in_python = index.nearest("text-embedding-3-small", query, ["help_centre"], 5)
        assert [h.ref for h in in_database] == [h.ref for h in in_python] and len(in_python) == 5
    finally:
        library.close()


def cite_first(body: dict[str, Any]) -> dict[str, Any]:
    """The fake model: answers with the first passage it was given, citing it."""
    given = "\n".join(str(m.get("content") or "") for m in body["messages"] if m["role"] == "system")
    start = given.index("\n[", given.index("Knowledge passages")) + 2
    ref = given[start:given.index("]", start)]
    text = given[given.index("\n", start) + 1:].split("\n", 1)[0]
    return {"text": f"{text} [{ref}]"}


def ask(replica: Replica, session: str, question: str) -> dict[str, Any]:
    with httpx.Client(timeout=60) as http:
        assert http.post(f"{replica.url}/bots/helpcentre/sessions", json={"id": session}).status_code == 201
        said = http.post(f"{replica.url}/bots/helpcentre/sessions/{session}/messages", json={"userMessage": question})
        assert said.status_code == 200, said.text
        return said.json()


def answer_and_sources(reply: dict[str, Any]) -> tuple[str, list[str]]:
    text = "".join(e["data"] if isinstance(e["data"], str) else "" for e in reply["events"]
                   if e["type"] in ("Message", "Stream"))
    sources = [s["url"] for e in reply["events"] if e["type"] == "Sources" for s in e["data"]["sources"]]
    return text, sources


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_replicas_answer_from_one_shared_index_and_both_see_a_reindexed_article(fake, tmp_path, postgres_server):
    root, url = helpcentre(tmp_path), postgres_server.url()
    index_into(root, url)
    fake.responder = cite_first
    replicas = [Replica(str(root), url, fake.base_url).start() for _ in range(2)]
    try:
        for n, replica in enumerate(replicas):
            text, sources = answer_and_sources(ask(replica, f"before-{n}", "What is the refund window?"))
            assert "within 30 days" in text, text
            assert sources == ["https://help.acme.example/returns#refund-window"]
        assert not (root / ".chatrun").exists()  # the replicas read PostgreSQL, never built a file of their own
        returns = root / "help" / "returns.md"
        returns.write_text(returns.read_text().replace("within 30 days of delivery", "within 45 days of delivery"))
        assert ", 1 read, 0 removed;" in index_into(root, url)  # from one machine, once
        for n, replica in enumerate(replicas):
            text, _ = answer_and_sources(ask(replica, f"after-{n}", "What is the refund window?"))
            assert "within 45 days" in text, text
    finally:
        for replica in replicas:
            replica.kill()


@pytest.mark.slow
def test_a_replica_builds_the_shared_index_when_the_bot_was_never_indexed_there(tmp_path, postgres_server):
    root, url = helpcentre(tmp_path), postgres_server.url()
    library = shared_library(root, url)
    try:
        assert library.search("refund window", ["help_centre"], 1)[0].ref == "returns.md#refund-window"
        assert isinstance(library.index, PgIndex) and library.index.built()
        files = plan(root, library.sources.values())
        assert library.index.count() > len(files) and INDEX_VERSION
    finally:
        library.close()


def test_a_shared_index_lives_in_postgresql_only(tmp_path):
    result = CliRunner().invoke(main, ["index", str(HELPCENTRE), "--store", "redis://127.0.0.1:6379/0"])
    assert result.exit_code == 2 and "a shared knowledge index lives in PostgreSQL" in result.output
    served = CliRunner().invoke(main, ["serve", str(HELPCENTRE), "--knowledge-store", "sqlite:///k.db"])
    assert served.exit_code == 2 and "give postgresql://USER@HOST:PORT/DB" in served.output


def test_a_shared_index_nobody_answers_for_is_named_without_its_password():
    from redis_support import free_port

    port = free_port()  # nothing listens there
    result = CliRunner().invoke(main, ["index", str(HELPCENTRE), "--store", f"postgresql://u:s3cret@127.0.0.1:{port}/db"])
    assert result.exit_code == 1
    assert f"knowledge store postgresql://u:***@127.0.0.1:{port}/db: cannot reach PostgreSQL" in result.output
    assert "s3cret" not in result.output


WEB_BOT = """\
name: site
model: {{provider: openai, name: gpt-4o-mini, max_retries: 0}}
knowledge:
  help_site:
    sitemap: {base}/sitemap.xml
    exclude: ["/blog/**"]
routes:
  main: {{default: true, system: Answer from the help site., knowledge: [help_site]}}
"""


def web_bot(tmp_path: Path, base: str) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    (root / "bot.yaml").write_text(WEB_BOT.format(base=base))
    return root


def index_web(root: Path, url: str) -> tuple[int, str, str]:
    out = CliRunner().invoke(main, ["index", str(root), "--store", url, "--quiet"])
    return out.exit_code, out.stdout, out.stderr


def shared_passages(url: str, bot: str = "site") -> dict[str, tuple[int, str]]:
    """ref -> (passage id, text) of a bot's passages in the shared index."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, path, anchor, body FROM knowledge_passages WHERE split_part(bot, '#', 1) = %s",
                            (bot,)).fetchall()
    return {f"{p}#{a}" if a else p: (i, b) for i, p, a, b in rows}


def test_a_server_reading_the_shared_index_reads_a_bot_with_web_sources_from_it(tmp_path):
    (tmp_path / "bot.yaml").write_text(WEB_BOT.format(base="https://help.example"))
    from chatrun.knowledge import library_of, share_index

    share_index("postgresql://u@127.0.0.1:1/db")
    try:  # nothing is opened until the first search: the index is chosen, not reached
        assert isinstance(library_of(load_config(tmp_path)[0]).index, PgIndex)
        assert isinstance(library_of(load_config(HELPCENTRE)[0]).index, PgIndex)
    finally:
        share_index(None)


@pytest.mark.slow
def test_chatrun_index_puts_a_sitemap_into_the_shared_index_and_two_readers_cite_its_urls(tmp_path, postgres_server):
    url = postgres_server.url()
    with Site() as site:
        root, base = web_bot(tmp_path, site.url), site.url
        code, out, err = index_web(root, url)
        assert code == 0, err
        assert "5 pages in 1 source, 4 read, 0 removed;" in out and "(bot site#" in out, out
        assert f"{base}/private/salaries is disallowed by its host's robots.txt" in err
        assert not (root / ".chatrun").exists()  # nothing in the bot's folder
        readers = [shared_library(root, url) for _ in range(2)]
        try:
            for library in readers:
                hits = library.search("refund window", ["help_site"], 3)
                assert hits[0].ref == f"{base}/help/returns#refund-window", hits
                assert library.source_entry(hits[0])["url"] == f"{base}/help/returns#refund-window"
                cited = library.cited(f"Express costs 9.90 euros [{base}/help/shipping#costs].", ["help_site"])
                assert [library.source_entry(h)["url"] for h in cited] == [f"{base}/help/shipping#costs"]
        finally:
            for library in readers:
                library.close()
        assert site.served("/help/returns") == [200]  # the readers fetched nothing


@pytest.mark.slow
def test_a_changed_page_alone_is_cut_again_in_the_shared_index(tmp_path, postgres_server):
    url = postgres_server.url()
    with Site() as site:
        root, base = web_bot(tmp_path, site.url), site.url
        assert index_web(root, url)[0] == 0
        before = shared_passages(url)
        site.pages["/help/shipping"] = site.pages["/help/shipping"].replace("9.90 euros", "12 euros")
        code, out, err = index_web(root, url)
        assert code == 0, err
        assert ", 1 read, 0 removed;" in out, out
        # The conditional requests carried the validators kept in PostgreSQL: ETag, then Last-Modified.
        assert site.served("/help/returns") == [200, 304] and site.served("/help/account") == [200, 304]
        assert site.served("/help/shipping") == [200, 200]
        after = shared_passages(url)
        assert "12 euros" in after[f"{base}/help/shipping#costs"][1]
        unchanged = [ref for ref in before if "/help/shipping" not in ref]
        assert unchanged and all(after[ref] == before[ref] for ref in unchanged)  # same rows: not re-cut
        library = shared_library(root, url)
        try:
            assert "12 euros" in library.search("express delivery cost", ["help_site"], 1)[0].text
        finally:
            library.close()
        (root / "bot.yaml").write_text(WEB_BOT.format(base=base).replace("    exclude", "    include: [/help/returns]\n"
                                                                          "    exclude"))
        code, out, err = index_web(root, url)
        assert code == 0 and ", 0 read, 3 removed;" in out, out  # no longer listed by a sitemap read in full
        assert {ref.split("#")[0] for ref in shared_passages(url)} == {f"{base}/help/returns"}


@pytest.mark.slow
def test_a_down_site_keeps_its_passages_in_the_shared_index(tmp_path, postgres_server):
    url = postgres_server.url()
    with Site() as site:
        root, base = web_bot(tmp_path, site.url), site.url
        assert index_web(root, url)[0] == 0
        before = shared_passages(url)
        site.failing["/help/shipping"] = 500
        code, out, err = index_web(root, url)
        assert code == 0 and ", 0 read, 0 removed;" in out, err
        assert f"{base}/help/shipping answered 500 Internal Server Error; its passages from the last run are kept" \
            in err
        site.stop()
        code, out, err = index_web(root, url)
        assert code == 1 and "knowledge source `help_site`: no page could be fetched" in err
        assert "no page is removed from the index" in err  # the sitemap could not be read: nothing leaves
        assert shared_passages(url) == before
        library = shared_library(root, url)
        try:
            assert library.search("refund window", ["help_site"], 1)[0].ref == f"{base}/help/returns#refund-window"
        finally:
            library.close()


GERMAN = "# Erstattung\n\n## Rückerstattungen\n\nDie Rückerstattungen werden innerhalb von 14 Tagen überwiesen.\n"


def test_a_language_postgresql_does_not_know_is_an_error_at_its_line(tmp_path):
    root = helpcentre(tmp_path)
    bot = (root / "bot.yaml").read_text()
    (root / "bot.yaml").write_text(bot.replace("    path: help\n", "    path: help\n    language: germna\n"))
    result = CliRunner().invoke(main, ["validate", str(root)])
    line = next(n for n, text in enumerate((root / "bot.yaml").read_text().splitlines(), 1) if "germna" in text)
    assert result.exit_code == 1 and f"bot.yaml:{line}:" in result.output, result.output
    assert "knowledge source `help_centre`: `language: germna` is not one of PostgreSQL's text search " \
        "configurations; did you mean `german`?" in result.output
    (root / "bot.yaml").write_text(bot.replace("    path: help\n", "    path: help\n    language: german\n"))
    assert load_config(root)[0].knowledge["help_centre"].language == "german"


@pytest.mark.slow
def test_a_source_language_stems_its_passages_and_changing_it_cuts_them_again(tmp_path, postgres_server):
    import psycopg

    from chatrun.definition.knowledge import TEXT_SEARCH_CONFIGS

    root, url = helpcentre(tmp_path), postgres_server.url()
    with psycopg.connect(url) as conn:  # the validator's list is PostgreSQL's own
        assert tuple(r[0] for r in conn.execute("SELECT cfgname FROM pg_ts_config ORDER BY 1")) == TEXT_SEARCH_CONFIGS
    (root / "help" / "erstattung.md").write_text(GERMAN)
    index_into(root, url)
    library = shared_library(root, url)
    try:  # english stems nothing of "Rückerstattung": the plural is not found
        assert [h.path for h in library.search("Rückerstattung", ["help_centre"], 3)] == []
    finally:
        library.close()
    bot = (root / "bot.yaml").read_text()
    (root / "bot.yaml").write_text(bot.replace("    path: help\n", "    path: help\n    language: german\n"))
    assert "4 files in 1 source, 4 read, 0 removed;" in index_into(root, url)  # stemmed otherwise: all read again
    assert ", 0 read, 0 removed;" in index_into(root, url)
    library = shared_library(root, url)
    try:
        hits = library.search("Rückerstattung", ["help_centre"], 3)
        assert hits and {h.path for h in hits} == {"erstattung.md"} and "14 Tagen" in hits[0].text, hits
    finally:
        library.close()


@pytest.mark.slow
def test_a_reader_never_sees_half_a_refetched_web_source(tmp_path, postgres_server):
    url = postgres_server.url()
    with Site() as site:
        root = tmp_path / "notices"
        root.mkdir()
        paths = [f"/notice/{i}" for i in range(6)]
        urls = "".join(f"\n      - {site.url}{p}" for p in paths)
        (root / "bot.yaml").write_text(WEB_BOT.replace("    sitemap: {base}/sitemap.xml\n    exclude: [\"/blog/**\"]",
                                                       f"    urls:{urls}").format(base=site.url))

        def write(word: str) -> None:
            for path in paths:
                site.pages[path] = f"<html><body><h1>Notice</h1><p>The {word} edition of this notice.</p></body></html>"

        write("alpha")
        shared = shared_library(root, url)
        shared.refresh(pages=shared.list_web())
        seen: list[tuple[int, int]] = []
        stop = threading.Event()

        def read() -> None:
            reader = shared_library(root, url)
            try:
                while not stop.is_set():
                    words = [h.text.split()[1] for h in reader.index.search("alpha beta edition", ["help_site"], 50)]
                    seen.append((words.count("alpha"), words.count("beta")))
            finally:
                reader.close()

        thread = threading.Thread(target=read)
        thread.start()
        try:
            for round_ in range(4):
                write("beta" if round_ % 2 == 0 else "alpha")
                assert shared.refresh(pages=shared.list_web()).changed == len(paths)
        finally:
            stop.set()
            thread.join()
            shared.close()
        assert len(seen) > 1 and set(seen) <= {(6, 0), (0, 6)}, set(seen)


@pytest.mark.slow
def test_a_file_deleted_while_chatrun_index_runs_leaves_the_shared_index(tmp_path, postgres_server):
    """As for SQLite (tests/test_knowledge_hostile.py): a file listed, then deleted before it was
    read, leaves the shared index, and is no failure."""
    root, url = helpcentre(tmp_path), postgres_server.url()
    index_into(root, url)
    (root / "help" / "returns.md").write_text("# Returns\n\n## Refund window\n\nReturn it within 60 days.\n")

    def delete_shipping(item: Any) -> None:
        if item.relative == "returns.md":
            (root / "help" / "shipping.md").unlink(missing_ok=True)

    library = shared_library(root, url)
    try:
        files = sorted(p.relative for p in plan(root, library.sources.values()))
        assert files.index("returns.md") < files.index("shipping.md")  # deleted before it is read
        done = library.refresh(delete_shipping)
        assert (done.changed, done.removed, done.problems) == (1, 1, [])
        assert library.search("shipping costs", ["help_centre"], 5) == []
        assert "60 days" in library.search("refund window", ["help_centre"], 1)[0].text
    finally:
        library.close()


@pytest.mark.slow
def test_a_search_of_a_pasted_document_answers_as_on_sqlite(tmp_path, postgres_server):
    """A user who pastes a long text (`retrieve: auto` searches the whole message; a model may
    call search_knowledge with one): thousands of distinct words. The SQLite index answered;
    the shared index failed (one `to_tsquery` column per word: PostgreSQL allows 1,664)."""
    root, url = helpcentre(tmp_path), postgres_server.url()
    index_into(root, url)
    pasted = "How long is the refund window? " + "x" * 5000 + " " + " ".join(f"word{n}" for n in range(3000))
    config, _ = load_config(root)
    local = Library(root, config.knowledge)
    library = shared_library(root, url)
    try:
        shared = library.search(pasted, ["help_centre"], 5)
        assert "returns.md#refund-window" in {h.ref for h in shared}
        assert {h.ref for h in shared} == {h.ref for h in local.search(pasted, ["help_centre"], 5)}
    finally:
        library.close()


@pytest.mark.slow
def test_a_reply_with_a_control_character_in_brackets_cites_as_on_sqlite(tmp_path, postgres_server):
    """A model's reply holding a NUL or another control character in square brackets: the SQLite
    index found no passage in it; the shared index failed the turn (PostgreSQL text holds no NUL)."""
    root, url = helpcentre(tmp_path), postgres_server.url()
    index_into(root, url)
    reply = "See [returns.md#refund-window] and [\x00] [returns.md#refund\x00-window] [shipping.md#costs\x07]."
    config, _ = load_config(root)
    library = shared_library(root, url)
    try:
        cited = [h.ref for h in library.cited(reply, ["help_centre"])]
        assert cited == ["returns.md#refund-window"]
        assert cited == [h.ref for h in Library(root, config.knowledge).cited(reply, ["help_centre"])]
    finally:
        library.close()
