"""Knowledge against hostile inputs (hunt, wave 2): refs a real model writes (a file name with a
space, several passages in one pair of brackets), files that link out of the source's folder,
`include:` patterns that reach outside it, a file removed while a refresh runs, and a model
calling `search_knowledge` with garbage arguments. Each through the real parts: the `openai`
client against chatrun.testing.fake_openai, the SQLite index, the CLI."""

from __future__ import annotations

import sqlite3
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chat_support import kinds
from chatrun.cli import main
from chatrun.definition.loader import load_config
from chatrun.errors import BotError
from chatrun.knowledge import Library
from chatrun.testing.fake_openai import FakeOpenAI

BOT = """
name: hostile
format: 3
model: {{provider: openai, name: gpt-4o-mini, base_url: "{base_url}", max_retries: 0}}
fallback: I do not know that one.
knowledge:
  help: {{path: help{include}}}
routes:
  main:
    default: true
    system: Answer from the help, citing each passage.
    knowledge: {{sources: [help], cite: required, retrieve: auto}}  # a citation is of a passage given
"""

REFUNDS = "# Refund policy\n\n## Refund window\n\nReturn any item within 30 days for a full refund.\n"
SHIPPING = "# Shipping\n\n## Costs\n\nExpress delivery costs 9.90 euros.\n"


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeOpenAI() as server:
        yield server


def make_bot(root: Path, fake: FakeOpenAI, files: dict[str, str], include: str = "") -> Path:
    bot = root / "bot"
    (bot / "help").mkdir(parents=True)
    (bot / "bot.yaml").write_text(textwrap.dedent(BOT.format(base_url=fake.base_url, include=include)))
    for rel, text in files.items():
        (bot / "help" / rel).parent.mkdir(parents=True, exist_ok=True)
        (bot / "help" / rel).write_text(text)
    return bot


def sources_of(events) -> list[str]:
    return [s["ref"] for kind, data in kinds(events) if kind == "Sources" for s in data["sources"]]


def messages(events) -> list[str]:
    return [data for kind, data in kinds(events) if kind == "Message"]


# -- citations as a model writes them ------------------------------------------------------------

def test_a_ref_with_a_space_and_refs_sharing_brackets_are_citations(tmp_path, fake):
    """A file named `refund policy.md` has the ref `refund policy.md#refund-window`: a reply citing
    it exactly was refused by `cite: required` (a ref could hold no space). A model citing two
    passages in one pair of brackets (`[a#x, b#y]`, a common way of writing) was refused too."""
    bot = make_bot(tmp_path, fake, {"refund policy.md": REFUNDS, "shipping.md": SHIPPING})
    session = chatrun.load_bot(bot / "bot.yaml").session()
    fake.queue({"text": "Within 30 days [refund policy.md#refund-window]."})
    events = session.chat("How long do I have for a refund?")
    assert messages(events) == ["Within 30 days [refund policy.md#refund-window]."]
    assert sources_of(events) == ["refund policy.md#refund-window"]

    fake.queue({"text": "30 days, and express costs 9.90 [refund policy.md#refund-window, shipping.md#costs; "
                        "made-up.md#x]."})
    events = session.chat("And the refund window with express shipping costs?")
    assert sources_of(events) == ["refund policy.md#refund-window", "shipping.md#costs"]
    assert len(fake.requests) == 2  # neither reply was asked again


def test_brackets_that_name_no_passage_are_still_no_citation(tmp_path, fake):
    bot = make_bot(tmp_path, fake, {"shipping.md": SHIPPING})
    fake.queue({"text": "It costs [some amount, I think]."}, {"text": "Still [no idea]\n[really]."})
    events = chatrun.load_bot(bot / "bot.yaml").session().chat("Cost?")
    assert messages(events) == ["I do not know that one."] and sources_of(events) == []


# -- files outside the source's folder -----------------------------------------------------------

SECRET = "# Payroll\n\nThe chief executive earns 9 million zorkmids.\n"


def problems(root: Path) -> list[str]:
    try:
        _, found = load_config(root)
    except BotError as e:
        found = e.diagnostics
    return [f"{d.severity}: {d.message}" for d in found]


def test_a_link_out_of_the_folder_is_left_out_of_the_index_and_said(tmp_path, fake):
    """A symbolic link in the folder (to a file, or to a folder) that leads elsewhere on the
    machine: its file was indexed and given to the model (the user could read `/etc/...` or a
    sibling's payroll). It is left out, `validate` warns at the source, and `chatrun index` too."""
    (tmp_path / "private").mkdir()
    (tmp_path / "private/payroll.md").write_text(SECRET)
    bot = make_bot(tmp_path, fake, {"shipping.md": SHIPPING})
    (bot / "help/payroll.md").symlink_to(tmp_path / "private/payroll.md")
    (bot / "help/more").symlink_to(tmp_path / "private", target_is_directory=True)
    (bot / "help/inside.md").symlink_to(bot / "help/shipping.md")  # a link within the folder is read

    run = CliRunner().invoke(main, ["index", str(bot), "--quiet"])
    assert run.exit_code == 0 and "2 files in 1 source, 2 read" in run.output, run.output
    assert "file `payroll.md` leads out of its folder" in run.output and "more/payroll.md" not in run.output
    config, _ = load_config(bot)
    library = Library(bot, config.knowledge)
    assert library.search("chief executive zorkmids payroll", ["help"], 5) == []
    assert {hit.ref for hit in library.search("express delivery", ["help"], 5)} == {"shipping.md#costs",
                                                                                      "inside.md#costs"}

    found = problems(bot)
    assert f"warning: knowledge source `help`: file `payroll.md` leads out of its folder (to " \
           f"{(tmp_path / 'private/payroll.md').resolve()}) and is left out; copy the file into the folder, or point " \
           "`path` at the folder that holds it" in found, found

    bot.joinpath("bot.yaml").write_text(bot.joinpath("bot.yaml").read_text().replace(
        "path: help}", "path: help, include: ['**/*.md', 'more/*.md']}"))
    assert any("file `more/payroll.md` leads out of its folder" in p for p in problems(bot))
    assert Library(bot, load_config(bot)[0].knowledge).search("zorkmids", ["help"], 5) == []


@pytest.mark.parametrize("pattern", ["/etc/*.conf", "../*.yaml", "docs/../../*.md"])
def test_an_include_pattern_out_of_the_folder_is_an_error_at_its_line_not_a_crash(tmp_path, fake, pattern):
    """An absolute `include:` pattern crashed validate and `chatrun index` (NotImplementedError,
    "this is a chatrun bug"); one with `..` was dropped without a word."""
    bot = make_bot(tmp_path, fake, {"shipping.md": SHIPPING}, include=f", include: ['*.md', '{pattern}']")
    found = problems(bot)
    assert f"error: knowledge source `help`: `include` pattern `{pattern}` reaches out of its folder `help`; a pattern " \
           "is relative to the folder (move the files into it, or point `path` at the folder that holds them)" \
           in found, found
    run = CliRunner().invoke(main, ["index", str(bot), "--quiet"])
    assert run.exit_code == 1 and f"`include` pattern `{pattern}` reaches out" in run.output, run.output
    assert "unexpected" not in run.output


# -- a refresh while the folder changes -------------------------------------------------------------

def test_a_file_deleted_while_a_refresh_runs_leaves_the_index_and_is_no_failure(tmp_path, fake):
    """A file listed by the refresh, then deleted before it was read (an editor saving by
    rename, a deploy replacing the folder): its passages stayed in the index, and the refresh
    called it unreadable (`chatrun index` exit 1). It is removed, as a file gone before."""
    bot = make_bot(tmp_path, fake, {"a.md": REFUNDS, "b.md": SHIPPING})
    config, _ = load_config(bot)
    assert Library(bot, config.knowledge).refresh().changed == 2
    (bot / "help/a.md").write_text(REFUNDS.replace("30 days", "60 days"))

    def delete_b(item) -> None:
        if item.relative == "a.md":
            (bot / "help/b.md").unlink()

    library = Library(bot, config.knowledge)
    done = library.refresh(delete_b)
    assert (done.files, done.changed, done.removed, done.problems) == (2, 1, 1, [])
    assert library.search("express delivery costs", ["help"], 5) == []
    assert "60 days" in library.search("refund window", ["help"], 1)[0].text
    again = Library(bot, config.knowledge).refresh()
    assert (again.files, again.changed, again.removed, again.problems) == (1, 0, 0, [])


def test_a_file_that_cannot_be_read_any_more_leaves_the_index_and_is_said(tmp_path, fake, monkeypatch):
    """A file indexed once, then unreadable (its permissions changed; root reads any file, so the
    refusal is raised where the refresh reads it): its old passages stayed and were given to the
    model, where docs/knowledge.md says such a file is left out. Now they go, and it is said."""
    bot = make_bot(tmp_path, fake, {"a.md": REFUNDS, "b.md": SHIPPING})
    config, _ = load_config(bot)
    assert Library(bot, config.knowledge).refresh().changed == 2
    (bot / "help/b.md").write_text(SHIPPING + "\nChanged.\n")
    read_bytes = Path.read_bytes

    def refused(path: Path) -> bytes:
        if path.name == "b.md":
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", refused)
    library = Library(bot, config.knowledge)
    done = library.refresh()
    assert [p.split(":")[0] for p in done.problems] == ["help/b.md"] and "Permission denied" in done.problems[0]
    assert library.search("express delivery costs", ["help"], 5) == []
    assert library.search("refund window", ["help"], 1)


# -- files as editors and sites write them ----------------------------------------------------------

def test_a_byte_order_mark_and_a_misclosed_html_heading_lose_no_title_nor_text(tmp_path, fake):
    """A Markdown file saved with a UTF-8 byte order mark (Windows editors) lost its title (`A`
    instead of `Returns`) and made a passage of `\\ufeff# Returns`; an HTML heading closed by
    another heading's end tag (`<h2>..</h3>`), left open before a paragraph, or never closed
    swallowed its section: heading and text were not in the index at all."""
    bot = make_bot(tmp_path, fake, {"shipping.md": SHIPPING})
    (bot / "help/returns.md").write_bytes(b"\xef\xbb\xbf" + REFUNDS.encode())
    (bot / "help/faq.html").write_text(
        "<title>FAQ</title><h2 id='damaged'>Damaged parcels</h3><p>We replace damaged parcels.</p>"
        "<h2>Gift cards<p>Gift cards never expire.</p><h2>Vouchers</h2><p>Vouchers last a year.</p>"
        "<h2 id='hours'>Opening<br>hours</h2><p>Nine to five.</p><h3>Unfinished heading")
    run = CliRunner().invoke(main, ["index", str(bot), "--quiet"])
    assert run.exit_code == 0, run.output
    library = Library(bot, load_config(bot)[0].knowledge)
    hits = library.search("refund window days", ["help"], 5)
    assert [(h.ref, h.title) for h in hits] == [("returns.md#refund-window", "Refund policy › Refund window")]
    assert [(h.ref, h.title, h.text) for h in library.search("damaged parcels", ["help"], 1)] == [
        ("faq.html#damaged", "FAQ › Damaged parcels", "We replace damaged parcels.")]
    assert [(h.ref, h.text) for h in library.search("gift cards expire", ["help"], 1)] == [
        ("faq.html#gift-cards", "Gift cards never expire.")]
    assert [(h.title, h.text) for h in library.search("opening hours", ["help"], 1)] == [
        ("FAQ › Opening hours", "Nine to five.")]  # a line break in a heading is no end of it

    fake.queue({"text": "They never expire [faq.html#gift-cards]."})
    events = chatrun.load_bot(bot / "bot.yaml").session().chat("Do gift cards expire?")
    assert sources_of(events) == ["faq.html#gift-cards"]


def test_a_code_fence_closes_only_at_its_own_marker():
    """CommonMark: a ``` fence is closed by ``` (as long or longer), not by ~~~ nor a shorter
    run; a `#` line inside it is code, not a heading (it was cut as one)."""
    from chatrun.knowledge.chunks import chunk_markdown

    for text in ("# Doc\n\n```sh\n~~~\n# rm -rf not a heading\n~~~\n```\n\n## After\n\nText.\n",
                 "# Doc\n\n````\n```\n# rm -rf not a heading\n```\n````\n\n## After\n\nText.\n",
                 "# Doc\n\n~~~~\n~~~\n# rm -rf not a heading\n~~~~\n\n## After\n\nText.\n"):
        chunks = chunk_markdown(text, "doc")
        assert [c.anchor for c in chunks] == ["doc", "after"], text
        assert "# rm -rf not a heading" in chunks[0].text


# -- a damaged index file ---------------------------------------------------------------------------

def damage(index: Path, how: str) -> None:
    if how == "not a database":
        index.write_bytes(b"This is not SQLite, whatever its name says.\n" * 100)
    else:  # a copy cut short: the header is sound, later pages are missing
        data = index.read_bytes()
        index.write_bytes(data[:len(data) // 3])
    for suffix in ("-wal", "-shm"):
        index.with_name(index.name + suffix).unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["not a database", "cut short"])
def test_a_damaged_index_file_is_set_aside_and_built_anew(tmp_path, fake, how, caplog):
    """The index file is made from the folders; a damaged one (a disk full, a copy cut short)
    made `chatrun index` fail with "unexpected DatabaseError ... this is a chatrun bug" and every
    turn of a running bot that searched fail. It is set aside (`knowledge.broken.db`), said, and
    built anew."""
    files = {f"topic{n}.md": f"# Topic {n}\n\n## Part\n\n" + f"Sentence {n} about refunds. " * 60 for n in range(30)}
    bot = make_bot(tmp_path, fake, {**files, "shipping.md": SHIPPING})
    assert CliRunner().invoke(main, ["index", str(bot), "--quiet"]).exit_code == 0
    index = bot / ".chatrun/knowledge.db"
    with sqlite3.connect(index) as db:  # everything in the main file, none in the write-ahead log
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    damage(index, how)

    run = CliRunner().invoke(main, ["index", str(bot), "--quiet"])
    assert run.exit_code == 0, run.output
    assert "31 files in 1 source, 31 read" in run.output
    said = [r.getMessage() for r in caplog.records if r.name == "chatrun.knowledge"]
    assert any("is damaged" in m and "set aside as knowledge.broken.db and built anew" in m for m in said), said
    assert (bot / ".chatrun/knowledge.broken.db").exists()

    damage(index, how)  # and a running bot: its first search builds it anew, the turn goes on
    fake.queue({"tool_calls": [{"name": "search_knowledge", "arguments": {"query": "express delivery"}}]},
               {"text": "9.90 euros [shipping.md#costs]."})
    events = chatrun.load_bot(bot / "bot.yaml").session().chat("Express?")
    assert messages(events) == ["9.90 euros [shipping.md#costs]."] and sources_of(events) == ["shipping.md#costs"]


def test_a_long_query_is_searched_with_its_first_and_last_words():
    """Both indexes search the same words of a pasted text (tests/test_knowledge_postgres.py:
    the shared index failed beyond 1,664): its first 32 and last 32 distinct ones."""
    from chatrun.knowledge.index import MAX_QUERY_WORDS, query_words

    words = query_words("Refund? " + " ".join(f"w{n}" for n in range(1000)) + " Can I return it")
    assert len(words) == MAX_QUERY_WORDS == 64
    assert words[0] == "refund" and words[-2:] == ["w999", "return"] and "w500" not in words


# -- a running bot's first searches ---------------------------------------------------------------------

def test_the_first_searches_at_once_refresh_the_index_once(tmp_path, fake, monkeypatch):
    """A server's first users search at the same moment: each waited for the lock, then refreshed
    again (every file read and hashed once per waiting search: minutes for a large folder). One
    refreshes; the others wait for it and search."""
    from chatrun.knowledge.index import KnowledgeIndex

    bot = make_bot(tmp_path, fake, {f"topic{n}.md": f"# Topic {n}\n\nAbout refunds {n}.\n" for n in range(20)})
    library = Library(bot, load_config(bot)[0].knowledge)
    refreshes: list[int] = []
    real = KnowledgeIndex.refresh

    def counted(self, *args, **kwargs):
        refreshes.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(KnowledgeIndex, "refresh", counted)
    start = threading.Barrier(6)

    def search() -> int:
        start.wait()
        return len(library.search("refunds", ["help"], 3))

    with ThreadPoolExecutor(6) as pool:
        found = list(pool.map(lambda _: search(), range(6)))
    assert found == [3] * 6 and len(refreshes) == 1


def test_a_file_larger_than_a_web_page_may_be_is_left_out_and_said(tmp_path, fake):
    """Web pages were capped at 10 MB, local files at nothing: a 2 GB log dropped into the folder
    was read whole into memory by validate and by every refresh. A file over the same cap is left
    out (its old passages too), `validate` warns at the source, and `chatrun index` says it."""
    bot = make_bot(tmp_path, fake, {"a.md": REFUNDS, "b.md": SHIPPING})
    config, _ = load_config(bot)
    assert Library(bot, config.knowledge).refresh().changed == 2
    big = "# Shipping\n\n## Costs\n\nExpress delivery costs 9.90 euros.\n" + "word " * 2_000_000
    (bot / "help/b.md").write_text(big)
    assert len(big) > 10_000_000

    found = problems(bot)
    assert "warning: knowledge source `help`: file `b.md` is larger than 10 MB and is left out; split it into " \
           "smaller files" in found, found
    assert not any(p.startswith("error") for p in found), found
    library = Library(bot, config.knowledge)
    done = library.refresh()
    assert done.problems == ["help/b.md is larger than 10 MB; split it into smaller files"]
    assert library.search("express delivery costs", ["help"], 5) == []
    assert library.search("refund window", ["help"], 1)
    run = CliRunner().invoke(main, ["index", str(bot), "--quiet"])
    assert run.exit_code == 1 and "b.md is larger than 10 MB" in run.output and "Traceback" not in run.output, \
        run.output


def test_a_real_ref_the_model_was_never_given_is_no_citation_and_cite_required_asks_again(tmp_path, fake):
    """A model that guesses a ref that exists (`shipping.md#costs`) without having searched, or
    that cites beside the passage it was given one it was not, showed it as a source: a reply of
    `cite: required` answered without retrieval passed as cited. Only a passage given in the
    request it answered (a search_knowledge result, `retrieve: auto`'s passages) is a citation."""
    bot = make_bot(tmp_path, fake, {"refund policy.md": REFUNDS, "shipping.md": SHIPPING})
    (bot / "bot.yaml").write_text((bot / "bot.yaml").read_text().replace(", retrieve: auto", ""))
    fake.queue({"text": "Express costs 9.90 [shipping.md#costs]."},  # guessed: nothing was searched
               {"text": "Express costs 9.90 [shipping.md#costs]."},  # asked again: guessed again
               {"tool_calls": [{"name": "search_knowledge", "arguments": {"query": "refund window"}}]},
               {"text": "30 days [refund policy.md#refund-window], 9.90 express [shipping.md#costs]."})
    session = chatrun.load_bot(bot / "bot.yaml").session()
    guessed = session.chat("What does express cost?")
    assert messages(guessed) == ["I do not know that one."] and sources_of(guessed) == []
    assert "cites no source" in fake.requests[1]["messages"][-1]["content"]
    searched = session.chat("And the refund window?")
    assert messages(searched) == ["30 days [refund policy.md#refund-window], 9.90 express [shipping.md#costs]."]
    assert sources_of(searched) == ["refund policy.md#refund-window"]  # the one it read, not the one it guessed
