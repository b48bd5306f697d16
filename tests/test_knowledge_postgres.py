"""The shared knowledge index in PostgreSQL (issue 37, knowledge/pg_index.py), against a real
PostgreSQL (tests/postgres_support.py): `chatrun index BOT --store postgresql://…` builds it once,
incrementally; two `chatrun serve --store postgresql://…` replicas answer from it and both see a
re-indexed article; a reader never sees half a re-indexed source; the hits match the SQLite
index's (as sets: BM25 and ts_rank_cd order passages differently); hybrid search ranks vectors
stored as float arrays (in Python without pgvector)."""

from __future__ import annotations

import shutil
import textwrap
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
    return Library(root, config.knowledge, config.model, open_index(root, config.name, url))


@pytest.mark.slow
def test_chatrun_index_builds_the_shared_index_once_and_then_reads_only_what_changed(tmp_path, postgres_server):
    root, url = helpcentre(tmp_path), postgres_server.url()
    first = index_into(root, url)
    assert "3 files in 1 source, 3 read, 0 removed;" in first and "(bot helpcentre)" in first
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
    finally:
        stop.set()
        thread.join()
        shared.close()
    assert len(seen) > 1 and set(seen) <= {(6, 0), (0, 6)}, set(seen)


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
def test_with_pgvector_the_database_ranks_vectors_as_python_does(fake, tmp_path, postgres_server):
    root, url = helpcentre(tmp_path), postgres_server.url()
    bot = (root / "bot.yaml").read_text().replace("    path: help\n", "    path: help\n    embeddings: text-embedding-3-small\n")
    (root / "bot.yaml").write_text(bot)
    library = shared_library(root, url)
    try:
        library.refresh()
        index = library.index
        assert isinstance(index, PgIndex)
        if not index.pgvector:
            pytest.skip("the pgvector extension is not installed here (Debian 12 has no package): ranked in Python")
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


def test_web_sources_are_refused_by_the_shared_index_before_anything_is_fetched(tmp_path):
    (tmp_path / "bot.yaml").write_text(textwrap.dedent("""\
        name: site
        model: {provider: openai, name: gpt-4o-mini}
        knowledge:
          pages: {urls: ["https://help.example/a"]}
        routes:
          main: {default: true, system: Answer., knowledge: {sources: [pages]}}
        """))
    result = CliRunner().invoke(main, ["index", str(tmp_path), "--store", "postgresql://u@127.0.0.1:1/db"])
    assert result.exit_code == 1 and "knowledge source pages: web pages (`urls:`, `sitemap:`) are indexed in the bot " \
        "folder's .chatrun/knowledge.db only" in result.output
    from chatrun.knowledge import KnowledgeIndex, library_of, share_index

    share_index("postgresql://u@127.0.0.1:1/db")
    try:  # a server reading the shared index keeps a bot with web sources on its folder's file
        assert isinstance(library_of(load_config(tmp_path)[0]).index, KnowledgeIndex)
        assert isinstance(library_of(load_config(HELPCENTRE)[0]).index, PgIndex)
    finally:
        share_index(None)
