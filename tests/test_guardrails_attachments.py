"""The input guardrails judge what a model reads of an attached file: its name (a file the model
is not sent is described to it, `[attached: NAME (type, size)]`; a PDF goes with its filename),
with the message's own outcomes: a `block` or `operator` guard stops the message before any
model reads it, a `redact` guard changes the name the model reads (and the `storage` guard the
name the store keeps). A file's bytes (an image, a PDF) reach no text guard: docs/guardrails.md.
Through the real `openai` client against the fake OpenAI server; the doors through a real server."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import openai
import pytest

import chatrun
from chatrun.messages import AssistantMessage, UserMessage
from chatrun.server import create_app
from chatrun.store.blobs import MemoryBlobs
from server_support import ThreadServer

CARD = "4111 1111 1111 1111"  # passes Luhn
PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"

BOT = """
name: filed
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
guardrails:
  - {name: cards, pii: [card], stages: [input], outcome: block, message: "No card numbers, please."}
  - {name: emails, pii: [email], stages: [input, storage], outcome: redact}
  - {name: human, patterns: ['(?i)lawyer'], stages: [input], outcome: operator}
routes:
  main:
    default: true
    system: You read files.
    attachments: {kinds: [text/plain, application/pdf]}
"""


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT))


def sent_with(session, data: bytes, media_type: str, name: str, text: str = "Read this.") -> list:
    """One message carrying one file: the events of its turn."""
    attachment = session.attach(data, media_type, name)

    async def run() -> list:
        return [e async for e in session.stream({"userMessage": text, "attachments": [attachment.to_dict()]})]
    return asyncio.run(run())


def said(events) -> list[str]:
    return [e.data for e in events if e.type == "Message" and e.audience == "user"]


def test_a_file_named_with_a_card_number_is_blocked_before_any_model_reads_it(bot, fake):
    session = bot.session(blobs=MemoryBlobs())
    events = sent_with(session, b"just text", "text/plain", f"card {CARD}.txt")
    assert said(events) == ["No card numbers, please."] and fake.requests == []
    found = [e.data for e in events if e.type == "Guardrail"]
    assert [(g["name"], g["stage"], g["outcome"]) for g in found] == [("cards", "input", "block")]
    fake.queue({"text": "Hello."})
    session.chat("hi")  # the stopped message, its file too, is in no later request
    assert "4111" not in json.dumps(fake.requests)


def test_a_file_named_for_an_operator_hands_the_conversation_over_unread(bot, fake):
    session = bot.session(blobs=MemoryBlobs())
    sent_with(session, PDF, "application/pdf", "for my lawyer.pdf")
    assert fake.requests == [] and [p.kind for p in session.pending] == ["takeover"]


@pytest.mark.parametrize("media_type, data", [("text/plain", b"plain words"), ("application/pdf", PDF)])
def test_a_redacted_name_is_the_one_the_model_reads_and_the_store_keeps(bot, fake, tmp_path, media_type, data):
    """A text file is described to the model by its name; a PDF goes with it as its filename."""
    fake.queue({"text": "Read."})
    session = bot.session(store=chatrun.SQLiteStore(tmp_path / "s.db"), blobs=MemoryBlobs())
    sent_with(session, data, media_type, "from ann@example.com")
    sent = json.dumps(fake.requests[0]["messages"])
    assert "ann@example.com" not in sent and "from [email]" in sent
    kept = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert b"ann@example.com" not in kept


def test_a_storage_guard_keeps_a_files_name_out_of_the_store(write_bot, fake, tmp_path):
    """A `storage` guard alone: the model reads the name as sent, the store keeps it redacted
    (the memory's message and the turn's history alike)."""
    guarded = chatrun.load_bot(write_bot(BOT.replace("stages: [input, storage]", "stages: [storage]")))
    fake.queue({"text": "Read."})
    session = guarded.session(store=chatrun.SQLiteStore(tmp_path / "s.db"), blobs=MemoryBlobs())
    sent_with(session, b"plain words", "text/plain", "from ann@example.com")
    assert "from ann@example.com (text/plain" in json.dumps(fake.requests[0]["messages"])
    kept = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert b"ann@example.com" not in kept and b"from [email]" in kept


@pytest.mark.parametrize("media_type, outcome", [("text/4111-1111-1111-1111", "block"),
                                                 ("text/x.ask-my-lawyer", "operator")])
def test_a_declared_media_type_the_model_would_read_is_judged_like_the_name(write_bot, fake, media_type, outcome):
    """The client declares a file's media type, and a route taking `text/*` takes any subtype: it
    reached the model in `[attached: NAME (TYPE, size)]` unjudged, so a card number or a word a
    guard hands over got through in it. It is judged with the name, with the same outcomes."""
    typed = chatrun.load_bot(write_bot(BOT.replace("kinds: [text/plain, application/pdf]", "kinds: [text/*]")))
    session = typed.session(blobs=MemoryBlobs())
    events = sent_with(session, b"plain words", media_type, "notes.txt")
    assert fake.requests == []
    found = [e.data for e in events if e.type == "Guardrail"]
    assert [g["outcome"] for g in found] == [outcome]


def test_a_file_with_a_harmless_name_passes_as_it_was_sent(bot, fake):
    fake.queue({"text": "Read."})
    sent_with(bot.session(blobs=MemoryBlobs()), b"plain words", "text/plain", "notes.txt")
    assert "[attached: notes.txt (text/plain, 11 bytes)]" in json.dumps(fake.requests[0]["messages"])


def test_a_seeded_message_whose_file_a_guard_stops_is_left_out_with_its_answer(bot, fake):
    """A conversation begun elsewhere (`Session.seed_memory`, what `/v1` seeds a session with):
    a user message is judged by its files' names too, as a turn's own message is."""
    fake.queue({"text": "Fine."})
    session = bot.session(blobs=MemoryBlobs())
    card = session.attach(b"words", "text/plain", f"card {CARD}.txt")
    mail = session.attach(b"more words", "text/plain", "from ann@example.com")
    session.seed_memory([UserMessage("Mine.", (card,)), AssistantMessage("Zorblax."),
                         UserMessage("And this.", (mail,)), AssistantMessage("Noted."), UserMessage("thanks")])
    session.chat("so?")
    sent = json.dumps(fake.requests)
    assert "4111" not in sent and "Zorblax" not in sent and "Mine." not in sent
    assert "ann@example.com" not in sent and "from [email] (text/plain" in sent and "Noted." in sent


# -- the doors --------------------------------------------------------------------------------


@pytest.fixture
def server(bot, fake, tmp_path):
    with ThreadServer(create_app([bot], f"sqlite:///{tmp_path / 'c.db'}")) as srv:
        yield srv


def file_part(name: str) -> dict:
    return {"type": "file", "file": {"filename": name, "file_data": "data:application/pdf;base64,"
                                     + base64.b64encode(PDF).decode()}}


@pytest.mark.slow
def test_v1_a_file_part_named_with_a_card_is_blocked_and_a_resent_one_never_sent(server, fake):
    """`/v1`: the request's own file part is judged as the turn's message; an earlier message's
    file part the client resends is not sent to the model at all (the resent history is text)."""
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        own = [{"role": "user", "content": [{"type": "text", "text": "Read this."}, file_part(f"{CARD}.pdf")]}]
        reply = client.chat.completions.create(model="filed", messages=own)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "No card numbers, please." and fake.requests == []
        fake.queue({"text": "Fine."})
        earlier = [{"role": "user", "content": [{"type": "text", "text": "Mine."}, file_part(f"{CARD}.pdf")]},
                   {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "thanks"}]
        client.chat.completions.create(model="filed", messages=earlier)  # type: ignore[arg-type]
    sent = json.dumps(fake.requests)
    assert len(fake.requests) == 1 and "4111" not in sent and "Mine." in sent and "thanks" in sent


@pytest.mark.slow
def test_http_an_uploaded_file_named_with_a_card_is_blocked(server, fake):
    """The page's door: a file uploaded to the session, then sent by its reference."""
    base = f"{server.url}/bots/filed/sessions"
    session = httpx.post(base, json={}).json()["id"]
    uploaded = httpx.post(f"{base}/{session}/attachments", json={
        "media_type": "text/plain", "name": f"card {CARD}.txt", "data": base64.b64encode(b"words").decode()})
    assert uploaded.status_code == 201, uploaded.text
    reply = httpx.post(f"{base}/{session}/messages", json={"userMessage": "Read it.", "attachments": [uploaded.json()]})
    assert reply.status_code == 200, reply.text
    assert "No card numbers, please." in reply.text and fake.requests == []
