"""Knowledge (issue 37): sources cut along their headings, an index that re-reads only what
changed and survives a restart, validate naming a missing, empty or unreadable source at its
line, `search_knowledge` offered only where a route reads knowledge and only over its sources,
`retrieve: auto`, citations as Sources events, and `cite: required` enforced by the runtime."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chat_support import call, kinds
from chatrun.cli import main
from chatrun.definition.loader import load_config
from chatrun.errors import BotError
from chatrun.knowledge import Library, index_path
from chatrun.knowledge.chunks import chunk_html, chunk_markdown, chunk_pdf
from chatrun.knowledge.index import fts_query
from chatrun.models.scripted import ScriptedModel

BOT = """
name: docs
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
fallback: I do not know that one.
knowledge:
  guides: {path: guides, url: "https://docs.example/{path}#{anchor}"}
  internal: {path: internal}
routes:
  main:
    default: true
    system: Answer from the guides.
    knowledge: {sources: [guides], cite: required}
    tools: [to_chat]
  chat:
    system: Chat.
tools:
  to_chat: {description: Just chat, action: {route: chat}}
"""

RETURNS = """\
# Returns

Intro text.

## Refund window

Return any item within 30 days for a full refund.

```
# not a heading: inside a fence
```

### Sale items {#sale}

Sale items: 14 days.
"""


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content) if not content.startswith("#") else content)


@pytest.fixture
def docs_bot(tmp_path):
    write(tmp_path, {"bot.yaml": BOT, "guides/returns.md": RETURNS,
                     "guides/account.html": "<title>Account</title><nav>Menu</nav><h2 id='pw'>Password</h2>"
                                            "<p>Reset it from the sign-in page.</p><script>var x = 'password';</script>",
                     "internal/secret.md": "# Salaries\n\nThe refund budget is secret.\n"})
    return tmp_path


# -- cutting files into passages ---------------------------------------------------------------

def test_markdown_is_cut_at_headings_with_title_trails_and_anchors():
    chunks = chunk_markdown(RETURNS, "returns")
    assert [(c.anchor, c.title) for c in chunks] == [
        ("returns", "Returns"),
        ("refund-window", "Returns › Refund window"),
        ("sale", "Returns › Refund window › Sale items"),
    ]
    assert "# not a heading" in chunks[1].text  # a fence's `#` line stays text
    assert chunks[2].heading == "Sale items"  # what the index weighs as its title


def test_a_long_section_is_cut_at_paragraph_ends_keeping_its_title_and_anchor():
    text = "# Guide\n\n## Long\n\n" + "\n\n".join(f"Paragraph {i} " + "word " * 80 for i in range(12))
    chunks = chunk_markdown(text, "guide")
    assert len(chunks) > 2
    assert {c.anchor for c in chunks} == {"long"} and all(len(c.text) <= 1500 for c in chunks)
    assert "Paragraph 0" in chunks[0].text and "Paragraph 11" in chunks[-1].text


def test_html_keeps_heading_ids_and_leaves_scripts_and_navigation_out():
    chunks = chunk_html("<html><head><title>Account help</title></head><body><nav>Home | Help</nav>"
                        "<h1>Account</h1><p>Intro.</p><h2 id='pw'>Password &amp; sign-in</h2><p>Reset it.</p>"
                        "<h2>Two factor</h2><p>Use an app.</p><script>alert(1)</script></body></html>", "a")
    assert [(c.anchor, c.title, c.text) for c in chunks] == [
        ("account", "Account help › Account", "Intro."),
        ("pw", "Account help › Account › Password & sign-in", "Reset it."),
        ("two-factor", "Account help › Account › Two factor", "Use an app."),
    ]


def tiny_pdf(text: str) -> bytes:
    """A one-page PDF showing `text` (Helvetica), written by hand."""
    stream = f"BT /F1 12 Tf 20 100 Td ({text}) Tj ET"
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 400 144] /Contents 4 0 R "
               "/Resources << /Font << /F1 5 0 R >> >> >>",
               f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream",
               "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    return out + f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()


def test_a_pdf_is_a_passage_per_page_anchored_by_page_number():
    pytest.importorskip("pypdf")
    [chunk] = chunk_pdf(Path("price-list.pdf"), tiny_pdf("Express delivery costs 9.90 euros"))
    assert (chunk.anchor, chunk.title) == ("page=1", "Price list › page 1")
    assert "Express delivery costs 9.90 euros" in chunk.text


def test_a_query_is_its_words_quoted_so_no_fts_operator_gets_through():
    assert fts_query('How do I get a "refund" NEAR(x) OR *?') == '"get" OR "refund" OR "near"'
    assert fts_query("the a ?") == ""


# -- the index ---------------------------------------------------------------------------------

def test_the_index_reads_only_changed_files_and_survives_a_restart(docs_bot):
    config, _ = load_config(docs_bot)
    first = Library(docs_bot, config.knowledge).refresh()
    assert (first.files, first.changed, first.removed, first.problems) == (3, 3, 0, [])
    hits = Library(docs_bot, config.knowledge).search("refund days", ["guides"], 5)  # a new process: same file
    assert hits[0].ref == "returns.md#refund-window"
    assert Library(docs_bot, config.knowledge).refresh().changed == 0

    (docs_bot / "guides/returns.md").write_text(RETURNS.replace("30 days", "60 days"))
    (docs_bot / "guides/account.html").unlink()
    again = Library(docs_bot, config.knowledge).refresh()
    assert (again.changed, again.removed) == (1, 1)
    library = Library(docs_bot, config.knowledge)
    assert "60 days" in library.search("refund", ["guides"], 1)[0].text
    assert library.search("password", ["guides"], 5) == []  # the deleted page's passages are gone


def test_a_running_bot_never_answers_from_a_missing_or_stale_index(docs_bot):
    """No `chatrun index` before the bot starts, then an article edited between two starts: the
    first search of each loaded bot refreshes the index, so its answer holds the file's text."""
    def searched() -> str:
        model = ScriptedModel([call("search_knowledge", query="refund window"),
                               {"text": "See [returns.md#refund-window]."}])
        chatrun.load_bot(docs_bot / "bot.yaml").session(model=model).chat("refund?")
        return next(m.content for m in model.requests[1].messages if m.role == "tool")

    assert not index_path(docs_bot).exists()
    assert "within 30 days" in searched()  # missing: built by the first search
    (docs_bot / "guides/returns.md").write_text(RETURNS.replace("30 days", "60 days"))
    assert "within 60 days" in searched()  # stale: refreshed by the next start's first search


def test_a_running_bot_answers_from_an_article_edited_or_deleted_after_its_first_search(docs_bot, monkeypatch):
    """One loaded bot (a server that stays up): its first search built the index; an article
    edited and another deleted afterwards were still given to the model, and cited, until a
    restart. A search after the folder changed refreshes the index first."""
    import chatrun.knowledge

    monkeypatch.setattr(chatrun.knowledge, "RECHECK", 0.0)  # look at the folder at every search
    bot = chatrun.load_bot(docs_bot / "bot.yaml")

    def searched(query: str, reply: str) -> tuple[str, list]:
        model = ScriptedModel([call("search_knowledge", query=query), {"text": reply}])
        events = bot.session(model=model).chat(f"{query}?")
        return next(m.content for m in model.requests[1].messages if m.role == "tool"), events

    assert "within 30 days" in searched("refund window", "See [returns.md#refund-window].")[0]
    (docs_bot / "guides/returns.md").write_text(RETURNS.replace("30 days", "sixty days"))
    (docs_bot / "guides/account.html").unlink()
    assert "within sixty days" in searched("refund window", "See [returns.md#refund-window].")[0]
    result, events = searched("password reset", "Reset it from the sign-in page [account.html#pw].")
    assert "Reset it from the sign-in page" not in result and "Sources" not in [kind for kind, _ in kinds(events)]


def test_a_search_reads_only_the_sources_it_is_given(docs_bot):
    config, _ = load_config(docs_bot)
    library = Library(docs_bot, config.knowledge)
    assert [h.source for h in library.search("refund budget", ["guides"], 5)] == ["guides"]
    assert "internal" in {h.source for h in library.search("refund budget", ["guides", "internal"], 5)}


def test_cited_finds_only_real_passages_and_links_them(docs_bot):
    config, _ = load_config(docs_bot)
    library = Library(docs_bot, config.knowledge)
    hits = library.cited("Yes [returns.md#sale] and [account.html#pw], not [made-up.md#x] [returns.md#sale]", ["guides"])
    assert [library.source_entry(h) for h in hits] == [
        {"title": "Returns › Refund window › Sale items", "ref": "returns.md#sale", "source": "guides",
         "url": "https://docs.example/returns#sale"},
        {"title": "Account › Password", "ref": "account.html#pw", "source": "guides",
         "url": "https://docs.example/account#pw"},
    ]
    assert library.cited("the secret [secret.md#salaries]", ["guides"]) == []  # not a source the route reads


def test_chatrun_index_shows_progress_and_reads_again_only_what_changed(docs_bot):
    runner = CliRunner()
    first = runner.invoke(main, ["index", str(docs_bot)])
    assert first.exit_code == 0, first.output
    assert "Indexing" in first.output and "3 files in 2 sources, 3 read, 0 removed" in first.output
    assert index_path(docs_bot).exists()
    os.utime(docs_bot / "guides/returns.md")  # touched, not changed: its hash decides
    second = runner.invoke(main, ["index", str(docs_bot), "--quiet"])
    assert "3 files in 2 sources, 0 read, 0 removed" in second.output and "Indexing" not in second.output


# -- validate ----------------------------------------------------------------------------------

def problems(root: Path) -> list[str]:
    """The bot's diagnostics as `bot.yaml:LINE:COL: severity: message`."""
    try:
        _, found = load_config(root)
    except BotError as e:
        found = e.diagnostics
    return [f"{Path(d.file).name}:{d.line}:{d.col}: {d.severity}: {d.message}" for d in found]


def test_validate_names_a_missing_empty_or_unreadable_source_at_its_line(tmp_path):
    bot = BOT.replace("  internal: {path: internal}", "  internal: {path: internal}\n  empty: {path: empty}\n"
                      "  nowhere: {path: nowhere, url: 'https://x/{slug}'}")
    write(tmp_path, {"bot.yaml": bot, "guides/ok.md": "# Fine\n\ntext\n", "guides/bad.md": b"caf\xe9\n",
                     "guides/blank.txt": "", "guides/fake.pdf": "not a pdf", "internal/x.md": "# X\n\ny\n",
                     "empty/notes.docx": "?"})
    found = problems(tmp_path)
    line = {name: i for i, text in enumerate(bot.splitlines()) for name in ("guides", "empty", "nowhere")
            if text.strip().startswith(f"{name}:")}
    expected = [
        f"bot.yaml:{line['guides'] + 1}:12: error: knowledge source `guides`: file `bad.md` is not UTF-8 text (byte 3); save it as UTF-8",
        f"bot.yaml:{line['guides'] + 1}:12: warning: knowledge source `guides`: file `blank.txt` is empty",
        f"bot.yaml:{line['guides'] + 1}:12: error: knowledge source `guides`: file `fake.pdf` is not a PDF file (it does not start with %PDF-)",
        f"bot.yaml:{line['empty'] + 1}:11: error: knowledge source `empty` is empty: its folder `empty` holds no file matching .md, .markdown, .html, .htm, .txt, .pdf",
    ]
    for text in expected:
        assert text in found, "\n".join(found)
    assert any(f"bot.yaml:{line['nowhere'] + 1}" in p and "its folder `nowhere`" in p and "does not exist" in p
               for p in found)
    assert any("`url` fills in `{slug}`, which is not known" in p for p in found)


def test_validate_names_an_unknown_source_of_a_route_with_a_suggestion(tmp_path):
    write(tmp_path, {"bot.yaml": BOT.replace("sources: [guides]", "sources: [guide]"), "guides/a.md": "# A\n\nb\n",
                     "internal/x.md": "# X\n\ny\n"})
    assert any("route `main` reads knowledge source `guide`, which the bot does not declare; did you mean `guides`?"
               in p for p in problems(tmp_path))


# -- in a conversation -------------------------------------------------------------------------

def messages(events):
    return [data for kind, data in kinds(events) if kind == "Message"]


def test_search_knowledge_is_offered_where_a_route_reads_knowledge_and_sees_only_its_sources(docs_bot):
    model = ScriptedModel([call("search_knowledge", query="refund budget"),
                           {"text": "Thirty days [returns.md#refund-window]."}, call("to_chat"), {"text": "Sure."},
                           {"text": "Hi"}])
    s = chatrun.load_bot(docs_bot / "bot.yaml").session(model=model)
    events = s.chat("refund?")
    assert messages(events) == ["Thirty days [returns.md#refund-window]."]
    assert ("Sources", {"sources": [{"title": "Returns › Refund window", "ref": "returns.md#refund-window",
                                     "source": "guides", "url": "https://docs.example/returns#refund-window"}]}) \
        in kinds(events)
    result = s.history[-1]["calls"][0]["result"]
    assert result.startswith("[returns.md#refund-window] Returns › Refund window\n") and "secret" not in result
    assert [t["function"]["name"] for t in model.requests[0].tools] == ["to_chat", "search_knowledge"]
    s.chat("let us chat")
    s.chat("hello")
    assert model.requests[-1].route == "chat" and model.requests[-1].tools == []  # it reads no knowledge


def test_cite_required_asks_once_then_sends_the_fallback_and_never_the_uncited_reply(docs_bot):
    model = ScriptedModel([{"text": "Probably 30 days."}, {"text": "30 days, I think [nope.md#x]."}])
    s = chatrun.load_bot(docs_bot / "bot.yaml").session(model=model)
    events = s.chat("refund window?")
    assert messages(events) == ["I do not know that one."]
    assert not any(e.type in ("Stream", "Sources") for e in events)
    asked = model.requests[1].messages
    assert [m.role for m in asked[-2:]] == ["assistant", "user"] and "cites no source" in asked[-1].content
    assert [(m.role, m.content) for m in s.memory()[1:]] == [("user", "refund window?"),
                                                              ("assistant", "I do not know that one.")]


def test_retrieve_auto_sends_the_best_passages_with_each_request_without_keeping_them(docs_bot):
    (docs_bot / "bot.yaml").write_text(BOT.replace("cite: required", "retrieve: auto, top_k: 1"))
    model = ScriptedModel([{"text": "30 days [returns.md#refund-window]."}])
    s = chatrun.load_bot(docs_bot / "bot.yaml").session(model=model)
    events = s.chat("How many days is the refund window?")
    assert ("Console", "route main: retrieved returns.md#refund-window") in kinds(events)
    sent = model.requests[0].messages
    assert sent[-1].role == "system" and sent[-1].content.startswith("Knowledge passages that may answer")
    assert "[returns.md#refund-window] Returns › Refund window" in sent[-1].content
    assert all("Knowledge passages" not in (m.content or "") for m in s.memory())


def test_a_large_index_leaves_out_query_words_most_passages_hold_while_a_rarer_one_is_left(docs_bot, monkeypatch):
    from chatrun.knowledge import index as knowledge_index

    config, _ = load_config(docs_bot)
    library = Library(docs_bot, config.knowledge)
    library.refresh()  # 5 passages: `refund` is in 2 (40%), `password` in 1 (20%)
    assert library.index.selective(["refund", "password"]) == ["refund", "password"]  # a small index: all kept
    monkeypatch.setattr(knowledge_index, "SELECTIVE_FROM", 1)
    monkeypatch.setattr(knowledge_index, "COMMON_SHARE", 0.3)
    assert library.index.selective(["refund", "password"]) == ["password"]
    assert library.index.selective(["refund"]) == ["refund"]  # never all of them
    assert [h.ref for h in library.search("refund password", ["guides"], 5)] == ["account.html#pw"]


def test_a_reply_full_of_brackets_is_looked_up_for_its_first_50_refs_only(docs_bot):
    """Every distinct `[x]` of a reply was one query of the index: a reply of 10,000 made 10,000
    (a model looping, or a user having it repeat a pasted list). The first 50 are looked up, the
    others are not citations."""
    config, _ = load_config(docs_bot)
    library = Library(docs_bot, config.knowledge)
    index = library.ready()
    queries: list[str] = []
    index.reader().set_trace_callback(queries.append)
    made_up = " ".join(f"[made-up-{i}.md#x]" for i in range(10_000))
    hits = library.cited(f"Yes [returns.md#sale] {made_up} and [account.html#pw]", ["guides"])
    assert [hit.ref for hit in hits] == ["returns.md#sale"]
    assert sum("FROM passages" in q for q in queries) == 50
    refs = " ".join(f"[made-up-{i}.md#x]" for i in range(48))
    assert [h.ref for h in library.cited(f"[returns.md#sale] {refs} [account.html#pw]", ["guides"])] == \
        ["returns.md#sale", "account.html#pw"]


def test_a_search_knowledge_call_on_an_index_that_cannot_be_built_fails_the_turn_not_the_search(docs_bot):
    """Through the tool as through `retrieve: auto` (below): the model never reads an empty
    result it would take for "nothing matches" and answer from its own head."""
    (docs_bot / ".chatrun").write_text("not a folder")
    model = ScriptedModel([call("search_knowledge", query="refund window"), {"text": "30 days [returns.md#refund-window]."}])
    events = chatrun.load_bot(docs_bot / "bot.yaml").session(model=model).chat("refund?")
    assert [kind for kind, _ in kinds(events) if kind in ("Message", "Sources", "Error")] == ["Error"]
    assert len(model.requests) == 1  # the call that asked for the search; no answer was asked for after it
    assert next(e for e in events if e.type == "Error").meta["detail"].startswith("the knowledge index of the bot at ")


@pytest.mark.slow
def test_an_index_that_cannot_be_built_fails_the_turn_and_health_says_why_never_an_answer_without_it(docs_bot):
    """A file where `.chatrun/` goes: the index cannot be built. The turn fails (the user is told the
    documents cannot be searched, the model is never asked to answer without them), /health names
    the cause; once it is fixed, the next turn builds the index and answers with its citation."""
    import asyncio

    import httpx

    from chatrun.server import create_app
    from chatrun.testing.fake_openai import FakeOpenAI

    (docs_bot / "bot.yaml").write_text(BOT.replace("cite: required", "retrieve: auto"))
    (docs_bot / ".chatrun").write_text("not a folder")

    async def turn_and_health(http: httpx.AsyncClient, session: str) -> tuple[list[dict], dict]:
        answer = await http.post(f"/bots/docs/sessions/{session}/messages", json={"userMessage": "refund window?"})
        return answer.json()["events"], (await http.get("/health")).json()

    async def run(app) -> list[tuple[list[dict], dict]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            session = (await http.post("/bots/docs/sessions", json={})).json()["id"]
            assert (await http.get("/health")).json()["knowledge"] == {"docs": "not searched yet"}
            broken = await turn_and_health(http, session)
            (docs_bot / ".chatrun").unlink()
            return [broken, await turn_and_health(http, session)]

    with FakeOpenAI() as fake, pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_BASE_URL", fake.base_url)
        env.setenv("OPENAI_API_KEY", "test-key")
        fake.queue({"text": "Thirty days [returns.md#refund-window]."})
        (events, health), (fixed, healed) = asyncio.run(run(create_app([chatrun.load_bot(docs_bot / "bot.yaml")],
                                                                           "memory://")))
        asked = len(fake.requests)
    assert [e["type"] for e in events if e["type"] in ("Message", "Sources", "Error")] == ["Error"]
    error = next(e for e in events if e["type"] == "Error")
    assert error["data"].startswith("Sorry, I cannot search my documents right now")
    assert "chatrun index" in error["meta"]["detail"] and "knowledge.db" in error["meta"]["detail"]
    assert health["status"] == "ok" and health["knowledge"]["docs"].startswith("failed: FileExistsError")
    assert asked == 1  # only the turn after the fix reached the model
    assert [e["data"] for e in fixed if e["type"] == "Message"] == ["Thirty days [returns.md#refund-window]."]
    assert any(e["type"] == "Sources" for e in fixed) and healed["knowledge"] == {"docs": "ok"}
