"""User memory (issue 37): facts a bot keeps of a principal across conversations.

Through real parts: the real `openai` client against the fake OpenAI server, a SQLite store
(and Redis), the real loader and validator. A conversation of ana remembers her seat; a NEW
conversation of ana reads it in the prompt the model receives; bob's does not; erasing ana
(her own DELETE, or the operator's erasure of the principal) leaves nothing of it in the store.
"""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from starlette.testclient import TestClient

import chatrun
from chatrun.server.auth import Auth
from chatrun.store import open_store
from chatrun.store.aio import open_async_store
from chatrun.store.retention import Counts, delete_stored, erase_principal
from chatrun.store.user_memory import facts_of, updated, user_memory_key
from server_support import app_for_testclient
from store_params import STORES
from store_params import store_url as store_url_of

BOT = """
name: concierge
format: 3
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
user_memory: {facts: [seat]}
retention: {user_memory: 365d}
routes:
  desk:
    default: true
    system: You are a concierge.
    context: "{% if user_memory.seat %}The user prefers a {{ user_memory.seat }} seat.{% else %}Nothing is known of the user.{% endif %}"
    tools: [note_seat]
tools:
  note_seat:
    description: Remember the seat the user prefers
    parameters: {type: object, properties: {seat: {type: string}}, required: [seat]}
    action:
      remember: {seat: "{{ args.seat }}"}
      reply: Noted for next time.
"""
ANA = {"name": "ana", "roles": []}
BOB = {"name": "bob", "roles": []}


def contexts(request: dict) -> list[str]:
    """The system messages the model received after the first (the route's `context:`)."""
    systems = [m["content"] for m in request["messages"] if m["role"] == "system"]
    return systems[1:]


def remember_window(fake, bot, store) -> None:
    fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "window"}}]}, {"text": "Noted."})
    session = bot.session(store=store, principal=ANA, meta={"owner": "ana"})  # owned, as the server opens it
    session.chat("I like window seats")
    assert contexts(fake.requests[-1]) == ["The user prefers a window seat."]  # at once, in the same conversation


def test_a_new_conversation_of_the_same_principal_reads_what_was_remembered(fake, write_bot, tmp_path):
    bot = chatrun.load_bot(write_bot(BOT))
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    remember_window(fake, bot, store)
    fake.queue({"text": "Welcome back."}, {"text": "Hello."})
    bot.session(store=store, principal=ANA).chat("Hi again")
    assert contexts(fake.requests[-1]) == ["The user prefers a window seat."]
    bot.session(store=store, principal=BOB).chat("Hi")
    assert contexts(fake.requests[-1]) == ["Nothing is known of the user."]
    assert store.get_record(user_memory_key("concierge", "bob")) is None


def test_erasing_the_principal_removes_the_memory_from_the_sqlite_file(fake, write_bot, tmp_path):
    bot = chatrun.load_bot(write_bot(BOT))
    db = tmp_path / "c.db"
    store = open_store(f"sqlite:///{db}")
    remember_window(fake, bot, store)
    store.close()
    counts = asyncio.run(_erase(f"sqlite:///{db}", "ana"))
    assert counts.user_memory == 1 and counts.sessions == 1
    with sqlite3.connect(db) as raw:  # nothing of it anywhere in the file's tables
        dump = "\n".join(raw.iterdump())
    assert "window" not in dump, [line for line in dump.splitlines() if "window" in line]
    fake.queue({"text": "Hello."})
    store = open_store(f"sqlite:///{db}")
    bot.session(store=store, principal=ANA).chat("Hi")
    assert contexts(fake.requests[-1]) == ["Nothing is known of the user."]


async def _erase(url: str, principal: str) -> Counts:
    from chatrun.store.aio import open_existing_store

    store = await open_existing_store(url)

    async def delete(session_id: str, bot: str | None) -> int:
        return await delete_stored(store, None, session_id)

    try:
        return await erase_principal(store, principal, lambda bot: chatrun.definition.config.Retention(), delete,
                                     None)
    finally:
        await store.close()


def test_a_failed_turn_remembers_nothing(fake, write_bot, tmp_path):
    bot = chatrun.load_bot(write_bot(BOT))
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "aisle"}}]}, {"status": 400})
    session = bot.session(store=store, principal=ANA)
    session.chat("Aisle, please")
    assert session.user_memory == {}
    assert store.get_record(user_memory_key("concierge", "ana")) is None


def test_without_a_principal_nothing_is_kept(fake, write_bot, tmp_path):
    bot = chatrun.load_bot(write_bot(BOT))
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "aisle"}}]}, {"text": "Noted."})
    bot.session(store=store).chat("Aisle, please")
    assert contexts(fake.requests[-1]) == ["Nothing is known of the user."]


def test_a_fact_older_than_keep_is_forgotten_and_an_empty_value_forgets():
    record = updated(None, "b", "ana", {"seat": "window", "name": "Ana"}, None, now=1000.0)
    assert facts_of(record, keep=100.0, now=1050.0) == {"seat": "window", "name": "Ana"}
    assert facts_of(record, keep=100.0, now=1101.0) == {}
    assert facts_of(updated(record, "b", "ana", {"seat": None}, None, 1001.0), None, 1002.0) == {"name": "Ana"}
    assert updated(record, "b", "ana", {"seat": None, "name": None}, None, 1001.0) is None


@pytest.mark.parametrize(("remember", "message"), [
    ("{seats: x}", "remembers `seats`, which is not one of `user_memory.facts` (seat); did you mean `seat`?"),
])
def test_the_validator_names_an_undeclared_fact_at_its_line(write_bot, remember, message):
    path = write_bot(BOT.replace('remember: {seat: "{{ args.seat }}"}', f"remember: {remember}"))
    with pytest.raises(chatrun.errors.BotError) as caught:
        chatrun.load_bot(path)
    assert "bot.yaml:18:" in str(caught.value) and message in str(caught.value)


def test_the_validator_asks_for_user_memory_when_a_tool_remembers(write_bot):
    path = write_bot(BOT.replace("user_memory: {facts: [seat]}\n", ""))
    with pytest.raises(chatrun.errors.BotError) as caught:
        chatrun.load_bot(path)
    assert "remembers `seat`, but the bot declares no `user_memory:`" in str(caught.value)


@pytest.fixture(params=STORES)
def url(request, tmp_path):
    return store_url_of(request, tmp_path)


def test_over_http_a_returning_user_is_greeted_and_can_list_and_erase_it(fake, write_bot, tmp_path, url):
    auth = Auth.from_mapping({"tokens": {"token-ana-123": {"principal": "ana"}, "token-bob-123": {"principal": "bob"},
                                         "token-dpo-123": {"principal": "dpo", "roles": ["privacy"]}}})
    app = app_for_testclient([str(write_bot(BOT))], url, auth=auth)
    ana, bob, dpo = ({"Authorization": f"Bearer token-{who}-123"} for who in ("ana", "bob", "dpo"))

    def chat(sid: str, who: dict, text: str) -> list[str]:
        assert client.post("/bots/concierge/sessions", json={"id": sid}, headers=who).status_code == 201
        answer = client.post(f"/bots/concierge/sessions/{sid}/messages", json={"userMessage": text}, headers=who)
        assert answer.status_code == 200, answer.text
        return contexts(fake.requests[-1])

    with TestClient(app) as client:
        fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "window"}}]}, {"text": "Noted."})
        assert chat("a1", ana, "Window seats, always") == ["The user prefers a window seat."]
        fake.queue({"text": "Welcome back."}, {"text": "Hello."})
        assert chat("a2", ana, "Hi again") == ["The user prefers a window seat."]  # a new conversation
        assert chat("b1", bob, "Hi") == ["Nothing is known of the user."]
        listed = client.get("/bots/concierge/user-memory", headers=ana).json()
        assert [(f["fact"], f["value"]) for f in listed["facts"]] == [("seat", "window")] and listed["principal"] == "ana"
        assert client.get("/bots/concierge/user-memory", headers=bob).json()["facts"] == []
        assert client.delete("/bots/concierge/user-memory", headers=ana).json()["erased"] == 1
        assert client.get("/bots/concierge/user-memory", headers=ana).json()["facts"] == []
        fake.queue({"text": "Hello."})
        assert chat("a3", ana, "Hi") == ["Nothing is known of the user."]
        # Remembered again, then erased with everything else of ana by the privacy officer.
        fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "aisle"}}]}, {"text": "Noted."})
        chat("a4", ana, "Aisle now")
        erased = client.delete("/principals/ana", headers=dpo).json()["erased"]
        assert erased["user_memory"] == 1 and erased["sessions"] == 4
        assert client.get("/bots/nobody/user-memory", headers=ana).status_code == 404
    assert asyncio.run(_record(url, user_memory_key("concierge", "ana"))) is None


def test_without_sign_in_the_endpoints_say_there_is_no_one(write_bot, tmp_path):
    app = app_for_testclient([str(write_bot(BOT))], f"sqlite:///{tmp_path / 's.db'}")
    with TestClient(app) as client:
        refused = client.get("/bots/concierge/user-memory")
        assert refused.status_code == 403 and "signed-in principal" in refused.text


async def _record(url: str, key: str) -> dict | None:
    store = open_async_store(url)
    try:
        return await store.get_record(key)
    finally:
        await store.close()


def test_retention_forgets_old_facts_in_the_store_and_keeps_fresh_ones(tmp_path):
    from chatrun.definition.config import Retention
    from chatrun.store.retention import purge

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    store.put_record(user_memory_key("concierge", "ana"), updated(None, "concierge", "ana", {"seat": "window"}, None, 1000.0))
    old_and_new = updated(None, "concierge", "bob", {"seat": "aisle"}, None, 1000.0)
    store.put_record(user_memory_key("concierge", "bob"), updated(old_and_new, "concierge", "bob", {"name": "Bob"}, None,
                                                                 5000.0))
    store.close()

    async def run(dry_run: bool) -> Counts:
        aio = open_async_store(url)
        try:
            return await purge(aio, {"concierge": Retention(user_memory=3600.0)}, 5000.0 + 60, _no_delete, None, dry_run)
        finally:
            await aio.close()

    assert asyncio.run(run(True)).user_memory == 2
    assert asyncio.run(_record(url, user_memory_key("concierge", "ana"))) is not None  # a dry run deletes nothing
    assert asyncio.run(run(False)).user_memory == 2
    assert asyncio.run(_record(url, user_memory_key("concierge", "ana"))) is None
    assert facts_of(asyncio.run(_record(url, user_memory_key("concierge", "bob"))), None, 0) == {"name": "Bob"}


async def _no_delete(session_id: str, bot: str | None) -> int:
    raise AssertionError("no session is idle here")


def test_the_validator_warns_about_a_fact_nothing_writes_and_a_retention_with_nothing_to_forget(write_bot):
    from chatrun.definition.loader import check_bot

    _, unwritten = check_bot(write_bot(BOT.replace("facts: [seat]", "facts: [seat, name]")))
    assert [(d.line, d.message) for d in unwritten if d.severity == "warning"] == [
        (5, "`user_memory` declares `name`, which no tool's action remembers: add `remember: {FACT: TEMPLATE}` to an "
            "action, or leave the fact out")]
    bare = BOT.replace("user_memory: {facts: [seat]}\n", "").replace('      remember: {seat: "{{ args.seat }}"}\n', "")
    _, nothing = check_bot(write_bot(bare, "bare.yaml"))
    assert [(d.line, d.message) for d in nothing if d.severity == "warning"] == [
        (5, "`retention.user_memory` forgets remembered facts, but the bot declares no `user_memory:`: declare one, "
            "or leave the retention out")]


def test_the_memory_is_the_conversation_owners_whoever_sends_the_request(fake, write_bot, tmp_path):
    bot = chatrun.load_bot(write_bot(BOT))
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    session = bot.session(store=store, principal=ANA, meta={"owner": "ana"})
    session.principal = {"name": "olga", "roles": ["operators"]}  # e.g. an operator's decision runs this turn
    fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "aisle"}}]}, {"text": "Noted."})
    session.chat("Aisle")
    assert facts_of(store.get_record(user_memory_key("concierge", "ana")), None, 0) == {"seat": "aisle"}
    assert store.get_record(user_memory_key("concierge", "olga")) is None


GUARDED = BOT.replace("retention: {user_memory: 365d}", """retention: {user_memory: 365d}
guardrails:
  - {name: payment_data, pii: [card], stages: [storage], outcome: redact}""")
CARD = "4111 1111 1111 1111"


@pytest.fixture(params=STORES)
def guarded_url(request, tmp_path):
    return store_url_of(request, tmp_path)


def test_a_storage_guardrail_redacts_what_is_remembered_before_any_store_holds_it(fake, write_bot, tmp_path,
                                                                                   guarded_url):
    """A `storage` guardrail applies to user memory as to the history: the fact the store keeps
    (committed with the turn, on every store; through the server) holds no card number, nor does
    the SQLite file."""
    auth = Auth.from_mapping({"tokens": {"token-ana-123": {"principal": "ana"}}})
    ana = {"Authorization": "Bearer token-ana-123"}
    with TestClient(app_for_testclient([str(write_bot(GUARDED))], guarded_url, auth=auth)) as client:
        fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": f"window, card {CARD}"}}]},
                   {"text": "Noted."})
        assert client.post("/bots/concierge/sessions", json={"id": "g1"}, headers=ana).status_code == 201
        answer = client.post("/bots/concierge/sessions/g1/messages", json={"userMessage": "Window"}, headers=ana)
        assert answer.status_code == 200, answer.text
    record = asyncio.run(_record(guarded_url, user_memory_key("concierge", "ana")))
    seat = facts_of(record, None, 0)["seat"]
    assert seat.startswith("window, card ") and "1111" not in seat
    if guarded_url.startswith("sqlite"):
        raw = (tmp_path / "s.db").read_bytes()
        assert CARD.encode() not in raw and CARD.replace(" ", "").encode() not in raw
