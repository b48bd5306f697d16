"""A budget per user (`limits.max_user_tokens`, `max_user_cost`, `user_window`), not only per
session: a user who opened a new session started again at zero. Real parts: the app
(TestClient) on a real SQLite file (and a real Redis and PostgreSQL, slow), the real `openai`
client against the fake OpenAI server, the server's clock file (`serve --clock-file`) moving
time past the window's end."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from chatrun.definition.loader import load_config
from chatrun.definition.page_texts import BUILTIN
from chatrun.engine.clock import FileClock
from chatrun.errors import BotError
from chatrun.server.auth import Auth
from chatrun.server.sessions import SessionSettings
from chatrun.store.aio import open_async_store, open_existing_store
from chatrun.store.record import Charge, Commit
from chatrun.store.user_budget import aread, user_budget_key, window_start
from chatrun.store.versions import CREATE, StaleVersion
from server_support import app_for_testclient, until_done, wait_until
from store_params import STORES
from store_params import store_url as store_url_of

BOT = """\
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
locales: [en, de]
prices: {gpt-4o-mini: {input: 1.0, output: 1.0}}
limits: {max_user_tokens: 1000, user_window: 1d}
routes:
  main:
    default: true
    system: You sell shoes.
"""
AUTH = Auth.from_mapping({"tokens": {"token-ana-123": {"principal": "ana"}, "token-bob-123": {"principal": "bob"}}})
ANA, BOB = ({"Authorization": f"Bearer token-{who}-123"} for who in ("ana", "bob"))
BIG = {"text": "Here are our shoes.", "usage": {"prompt_tokens": 980, "completion_tokens": 10, "total_tokens": 990}}
SMALL = {"text": "Hello.", "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}


def _bot(tmp_path: Path, text: str = BOT) -> str:
    (tmp_path / "bot.yaml").write_text(text)
    (tmp_path / "locales").mkdir(exist_ok=True)
    (tmp_path / "locales" / "en.yaml").write_text("hello: Hello\n")
    (tmp_path / "locales" / "de.yaml").write_text("hello: Hallo\n")
    return str(tmp_path / "bot.yaml")


def _app(bot: str, url: str, clock: Path):
    return app_for_testclient([bot], url, auth=AUTH, sessions=SessionSettings(clock=FileClock(str(clock))))


def _say(client: TestClient, sid: str, who: dict, text: str = "shoes?", locale: str = "en") -> dict:
    made = client.post(f"/bots/shop/sessions?locale={locale}", json={"id": sid}, headers=who)
    assert made.status_code in (201, 409), made.text
    answer = client.post(f"/bots/shop/sessions/{sid}/messages", json={"userMessage": text}, headers=who)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _error(reply: dict) -> str | None:
    errors = [e["data"] for e in reply["events"] if e["type"] == "Error"]
    return errors[0] if errors else None


@pytest.fixture(params=STORES)
def url(request, tmp_path):
    return store_url_of(request, tmp_path)


def test_two_sessions_of_one_user_share_the_budget_until_the_window_renews(fake, tmp_path, url):
    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T10:00:00+00:00")
    with TestClient(_app(_bot(tmp_path), url, clock)) as client:
        fake.queue(BIG)
        assert _error(_say(client, "a1", ANA)) is None  # 990 of ana's 1000 tokens
        asked = len(fake.requests)
        refused = _say(client, "a2", ANA, locale="de")  # a new session: the same user, the same budget
        assert _error(refused) == BUILTIN["de"]["user_budget_spent"].format(renews="2026-12-08 00:00 UTC")
        assert len(fake.requests) == asked  # refused before the model call
        fake.queue(SMALL)
        assert _error(_say(client, "b1", BOB)) is None  # another user is not affected
        clock.write_text("2026-12-08T00:00:01+00:00")  # the next window: ana's budget is whole again
        fake.queue(SMALL)
        assert _error(_say(client, "a2", ANA)) is None
    record = asyncio.run(_record(url, user_budget_key("shop", "ana")))
    assert record is not None and record["tokens"] == 25 and record["window"] == 1796688000.0


def test_a_failed_turn_is_committed_and_its_usage_counted(fake, tmp_path):
    """A turn that failed after a model call (its tool crashed) is committed (ok false) and its
    call's tokens are counted with it: the charge rides in that commit too."""
    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T10:00:00+00:00")
    (tmp_path / "shop_tools.py").write_text("def crash(ctx):\n    raise RuntimeError('a bug in the handler')\n")
    bot = _bot(tmp_path, BOT.replace("    system: You sell shoes.\n", "    system: You sell shoes.\n    tools: [crash]\n")
               + "tools:\n  crash:\n    handler: shop_tools:crash\n    effect: read\n")
    url = f"sqlite:///{tmp_path / 's.db'}"
    with TestClient(_app(bot, url, clock)) as client:
        fake.queue({"tool_calls": [{"name": "crash", "arguments": {}}],
                    "usage": {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37}})
        assert _error(_say(client, "a1", ANA)) == BUILTIN["en"]["turn_failed"]
        history = client.get("/bots/shop/sessions/a1", headers=ANA).json()["history"]
        assert [(e["turn"], e["ok"]) for e in history] == [(1, False)]
    record = asyncio.run(_record(url, user_budget_key("shop", "ana")))
    assert record is not None and record["tokens"] == 37


def test_two_replicas_sharing_a_store_count_one_budget(fake, tmp_path):
    """Two apps (replicas) on one SQLite file: what ana spent on one is refused on the other."""
    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T10:00:00+00:00")
    url, bot = f"sqlite:///{tmp_path / 's.db'}", _bot(tmp_path)
    with TestClient(_app(bot, url, clock)) as one, TestClient(_app(bot, url, clock)) as two:
        fake.queue(BIG)
        assert _error(_say(one, "a1", ANA)) is None
        assert _error(_say(two, "a2", ANA)) == BUILTIN["en"]["user_budget_spent"].format(renews="2026-12-08 00:00 UTC")


def test_a_cost_budget_is_counted_across_sessions_too(fake, tmp_path):
    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T23:30:00+00:00")
    bot = _bot(tmp_path, BOT.replace("max_user_tokens: 1000, user_window: 1d", "max_user_cost: 0.001, user_window: 1h"))
    with TestClient(_app(bot, f"sqlite:///{tmp_path / 's.db'}", clock)) as client:
        fake.queue(BIG)  # 990 tokens at 1.0 a million: 0.00099
        assert _error(_say(client, "a1", ANA)) is None
        assert _error(_say(client, "a2", ANA)) == BUILTIN["en"]["user_budget_spent"].format(renews="2026-12-08 00:00 UTC")


def test_the_loader_reads_the_keys_and_a_bot_without_them_has_no_user_budget(tmp_path):
    limits = load_config(_bot(tmp_path))[0].limits
    assert (limits.max_user_tokens, limits.max_user_cost, limits.user_window, limits.has_user_budget) == (
        1000, None, 86400.0, True)
    (tmp_path / "plain.yaml").write_text(BOT.replace("limits: {max_user_tokens: 1000, user_window: 1d}\n", ""))
    assert not load_config(tmp_path / "plain.yaml")[0].limits.has_user_budget


def test_validate_names_a_window_that_is_no_duration(tmp_path):
    (tmp_path / "bad.yaml").write_text(BOT.replace("user_window: 1d", "user_window: one day"))
    with pytest.raises(BotError) as raised:
        load_config(tmp_path / "bad.yaml")
    assert "bad.yaml:5" in str(raised.value) and "user_window" in str(raised.value)


async def _record(url: str, key: str) -> dict | None:
    store = await open_existing_store(url)
    try:
        return await store.get_record(key)
    finally:
        await store.close()


def test_every_door_refuses_a_spent_user_in_their_locale(fake, tmp_path):
    """Spent over HTTP, then refused on the WebSocket (its Connect locale), on /v1 (its
    metadata.locale: a 500 `turn_failed` whose message is the text), on the chat page's
    WebSocket and on AG-UI (its RUN_ERROR), before any model call."""
    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T10:00:00+00:00")
    told = BUILTIN["de"]["user_budget_spent"].format(renews="2026-12-08 00:00 UTC")
    with TestClient(_app(_bot(tmp_path), f"sqlite:///{tmp_path / 's.db'}", clock)) as client:
        fake.queue(BIG)
        assert _error(_say(client, "a1", ANA)) is None
        asked = len(fake.requests)
        with client.websocket_connect("/_chat/routes", headers=ANA) as ws:
            ws.send_json({"type": "Connect", "chatId": "ws-1", "extensions": True, "locale": "de"})
            until_done(ws)
            ws.send_json({"type": "ChatRouteMessage", "chatId": "ws-1", "data": {"userMessage": "hallo"}})
            assert [f["data"] for f in until_done(ws) if f["type"] == "Error"] == [told]
        failed = client.post("/v1/chat/completions", headers={**ANA, "X-Chatrun-Session": "v1-1"},
                             json={"model": "shop", "metadata": {"locale": "de"},
                                   "messages": [{"role": "user", "content": "hallo"}]})
        assert failed.status_code == 500, failed.text
        assert failed.json()["error"] == failed.json()["error"] | {"code": "turn_failed", "message": told}
        assert _page_error(client) == told
        assert _agui_error(client) == told
        assert len(fake.requests) == asked


def _page_error(client: TestClient) -> str:
    """The chat page's WebSocket as app.js opens it: the bot's path, the token in the query,
    the browser's languages as the Connect's locale."""
    with client.websocket_connect("/bots/shop/_chat/routes?token=token-ana-123") as ws:
        ws.send_json({"type": "Connect", "chatId": "page-1", "extensions": True, "locale": "de-DE, de"})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "page-1", "data": {"userMessage": "hallo"}})
        [error] = [f["data"] for f in until_done(ws) if f["type"] == "Error"]
    return error


def _agui_error(client: TestClient) -> str:
    """An AG-UI run (its forwardedProps.locale): the RUN_ERROR's message."""
    body = {"threadId": "agui-1", "runId": "r1", "state": {}, "tools": [], "context": [],
            "forwardedProps": {"locale": "de"}, "messages": [{"id": "u1", "role": "user", "content": "hallo"}]}
    answer = client.post("/agui/shop", json=body, headers={**ANA, "Accept": "text/event-stream"})
    assert answer.status_code == 200, answer.text
    frames = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    [error] = [f for f in frames if f["type"] == "RUN_ERROR"]
    return error["message"]


def test_a_charge_is_written_by_its_commit_and_only_by_a_commit_that_lands(url):
    """A turn's Charge rides in its Commit: two sessions of one user both count (the store
    adds each in the commit's atomic write), and a commit the store refuses (stale) counts
    nothing, its turn not stored either."""
    usage = {"input_tokens": 100, "output_tokens": 5, "cost": 0.5}
    start = window_start(1796637600.0, 86400.0)

    def commit(sid: str, expected: str) -> Commit:
        made = Commit.encode(sid, {"id": sid}, {}, [{"turn": 1, "ok": True, "usage": usage}], expected)
        made.charges.append(Charge("shop", "ana", start, usage))
        return made

    async def three_commits() -> dict | None:
        store = open_async_store(url)
        try:
            await store.commit_turn(commit("c1", CREATE), None)
            await store.commit_turn(commit("c2", CREATE), None)
            with pytest.raises(StaleVersion):
                await store.commit_turn(commit("c1", CREATE), None)  # c1 exists: refused
            return await aread(store, "shop", "ana")
        finally:
            await store.close()

    assert asyncio.run(three_commits()) == {"bot": "shop", "principal": "ana", "window": 1796601600.0,
                                            "tokens": 210, "cost": 1.0}


def test_charges_of_sessions_committing_at_once_all_count(url):
    """Twelve sessions of one user committing at once from two connections (two replicas): each
    commit's read-modify-write of the user's record is atomic with it (SQLite's transaction,
    Redis's fenced script, PostgreSQL's row lock): every turn's usage counts."""
    usage = {"input_tokens": 10, "output_tokens": 1, "cost": 0.25}
    start = window_start(1796637600.0, 86400.0)

    def commit(sid: str) -> Commit:
        made = Commit.encode(sid, {"id": sid}, {}, [{"turn": 1, "ok": True, "usage": usage}], CREATE)
        made.charges.append(Charge("shop", "ana", start, usage))
        return made

    async def go() -> dict | None:
        stores = [open_async_store(url), open_async_store(url)]
        try:
            await asyncio.gather(*[stores[i % 2].commit_turn(commit(f"s{i}"), None) for i in range(12)])
            return await aread(stores[0], "shop", "ana")
        finally:
            for store in stores:
                await store.close()

    record = asyncio.run(go())
    assert record is not None and (record["tokens"], record["cost"]) == (132, 3.0)


class BothAsked:
    """The fake model: holds each call until two have arrived (two turns are at their model
    call at once), then answers both with BIG."""

    def __init__(self) -> None:
        self.arrived = 0
        self.both: asyncio.Event | None = None

    async def __call__(self, body: dict) -> dict:
        self.both = self.both or asyncio.Event()  # made in the fake's own loop
        self.arrived += 1
        if self.arrived == 2:
            self.both.set()
        await asyncio.wait_for(self.both.wait(), 60)
        return BIG


def test_two_turns_of_one_user_at_once_pass_the_budget_by_at_most_one_turn(fake, tmp_path):
    """docs/observability.md, "Turns of one user at once": both turns began at 0 of 1000 and
    each stayed within the budget as it saw it; together they passed it by what the other
    one used (990), both counted; the next turn is refused before any model call."""
    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T10:00:00+00:00")
    url = f"sqlite:///{tmp_path / 's.db'}"
    fake.responder = BothAsked()
    with TestClient(_app(_bot(tmp_path), url, clock)) as client:
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda sid: _say(client, sid, ANA), ["a1", "a2"]))
        assert [_error(r) for r in replies] == [None, None]
        asked = len(fake.requests)
        refused = _error(_say(client, "a3", ANA))
        assert refused == BUILTIN["en"]["user_budget_spent"].format(renews="2026-12-08 00:00 UTC")
        assert len(fake.requests) == asked
    record = asyncio.run(_record(url, user_budget_key("shop", "ana")))
    assert record is not None and record["tokens"] == 1980  # 1000 + 980: over by less than one turn (990)


def test_validate_warns_of_a_cost_budget_without_prices(tmp_path):
    free = _bot(tmp_path, BOT.replace("prices: {gpt-4o-mini: {input: 1.0, output: 1.0}}\n", "").replace(
        "max_user_tokens: 1000", "max_user_cost: 0.5"))
    _, warnings = load_config(free)
    assert [(w.line, w.message.split(",")[0]) for w in warnings if w.path.startswith("limits")] == [
        (4, "`limits.max_user_cost` counts the cost `prices:` gives each model")]
    priced = BOT.replace("max_user_tokens: 1000", "max_user_cost: 0.5")
    assert [w for w in load_config(_bot(tmp_path, priced))[1] if w.path.startswith("limits")] == []


def test_validate_warns_of_a_window_without_a_user_budget(tmp_path):
    """`user_window` alone counts nothing: a warning on its line, naming the keys to add."""
    alone = _bot(tmp_path, BOT.replace("max_user_tokens: 1000, user_window: 1d", "max_session_tokens: 5000, user_window: 1d"))
    _, warnings = load_config(alone)
    [warning] = [w for w in warnings if w.path.startswith("limits")]
    assert (warning.file, warning.line, warning.severity) == (alone, 5, "warning")
    assert "`limits.user_window`" in warning.message and "`max_user_tokens`" in warning.message
    assert "`max_user_cost`" in warning.message
    assert [w for w in load_config(_bot(tmp_path))[1] if w.path.startswith("limits")] == []  # with a budget: none


def test_erasing_the_principal_deletes_what_they_spent(fake, tmp_path):
    """The record names the user: `DELETE /principals/ana` deletes it with the rest (and her count
    starts again at zero); bob's stays."""
    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T10:00:00+00:00")
    url = f"sqlite:///{tmp_path / 's.db'}"
    auth = Auth.from_mapping({"tokens": {"token-ana-123": {"principal": "ana"}, "token-bob-123": {"principal": "bob"},
                                         "token-dpo-123": {"principal": "dpo", "roles": ["privacy"]}}})
    app = app_for_testclient([_bot(tmp_path)], url, auth=auth, sessions=SessionSettings(clock=FileClock(str(clock))))
    with TestClient(app) as client:
        fake.queue(SMALL, SMALL)
        _say(client, "a1", ANA)
        _say(client, "b1", BOB)
        erased = client.delete("/principals/ana", headers={"Authorization": "Bearer token-dpo-123"})
        assert erased.status_code == 200, erased.text
    assert asyncio.run(_record(url, user_budget_key("shop", "ana"))) is None
    assert asyncio.run(_record(url, user_budget_key("shop", "bob"))) is not None


TG_TOKEN, TG_SECRET = "123456:test-token", "tg-secret-0123456789"
CHANNEL_BOT = BOT.replace("max_user_tokens: 1000", "max_user_tokens: 1500").replace(
    "locales: [en, de]\n", """locales: [en, de]
env:
  TG_TOKEN: {secret: true}
  TG_SECRET: {secret: true}
  TG_API: {}
channels:
  telegram: {token: TG_TOKEN, secret: TG_SECRET, api: "{{ env.TG_API }}"}
""").replace("    system: You sell shoes.\n", """    system: You sell shoes.
    tools: [bye]
tools:
  bye:
    description: End the conversation
    action: {message: Goodbye., end: true}
""")


@pytest.mark.slow
def test_a_channel_user_who_ends_and_writes_again_keeps_the_budget(tmp_path, fake, monkeypatch):
    """A Telegram user's `end` starts a new session at their next message: the budget goes on."""
    from channel_support import FakeTelegram, telegram_message

    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T10:00:00+00:00")
    with FakeTelegram(TG_TOKEN) as telegram:
        for name, value in (("TG_TOKEN", TG_TOKEN), ("TG_SECRET", TG_SECRET), ("TG_API", telegram.url)):
            monkeypatch.setenv(name, value)
        app = app_for_testclient([_bot(tmp_path, CHANNEL_BOT)], f"sqlite:///{tmp_path / 's.db'}",
                                 sessions=SessionSettings(clock=FileClock(str(clock))))
        with TestClient(app) as client:
            fake.queue(BIG, {**BIG, "text": None, "tool_calls": [{"name": "bye", "arguments": {}}]})
            for n, text in enumerate(("shoes?", "bye", "hello again"), 1):
                sent = client.post("/channels/shop/telegram", json=telegram_message(n, text),
                                   headers={"X-Telegram-Bot-Api-Secret-Token": TG_SECRET})
                assert sent.status_code == 200, sent.text
                wait_until(lambda n=n: len(telegram.calls("sendMessage")) >= n, what=f"reply {n}")
            told = [c["text"] for c in telegram.calls("sendMessage")]
    assert told == ["Here are our shoes.", "Goodbye.",
                    BUILTIN["en"]["user_budget_spent"].format(renews="2026-12-08 00:00 UTC")]
    assert len(fake.requests) == 2


def test_a_killed_attempts_calls_count_for_its_user_with_the_turn_that_counts_them(fake, tmp_path):
    """A server killed after a model call answered leaves the call's usage in the session's record
    (store/billing.py; tests/test_billing_killed.py kills real servers): the next turn's commit
    counts it in the session and charges it to the user too, once, not only the turn's own calls."""
    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T10:00:00+00:00")
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    bot = _bot(tmp_path)
    with TestClient(_app(bot, url, clock)) as client:
        assert client.post("/bots/shop/sessions", json={"id": "a1"}, headers=ANA).status_code == 201
    asyncio.run(_a_dead_attempt(url, "a1", {"input_tokens": 100, "output_tokens": 10, "calls": 1, "cost": 0.00011}))
    with TestClient(_app(bot, url, clock)) as client:
        fake.queue(SMALL)
        assert _error(_say(client, "a1", ANA)) is None
        fake.queue(SMALL)
        assert _error(_say(client, "a1", ANA)) is None  # the next turn counts nothing again
        usage = client.get("/bots/shop/sessions/a1", headers=ANA).json()["usage"]
    record = asyncio.run(_record(url, user_budget_key("shop", "ana")))
    assert usage["input_tokens"] + usage["output_tokens"] == 110 + 25 + 25
    assert record is not None and record["tokens"] == 110 + 25 + 25


def test_a_killed_attempts_calls_fill_the_users_budget_before_the_next_model_call(fake, tmp_path):
    """The user's budget is checked with a killed attempt's paid calls counted, as the session's
    budgets are: 995 of ana's 1000 tokens went to a dead attempt, so the next call is refused."""
    clock = tmp_path / "clock"
    clock.write_text("2026-12-07T10:00:00+00:00")
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    bot = _bot(tmp_path)
    with TestClient(_app(bot, url, clock)) as client:
        assert client.post("/bots/shop/sessions", json={"id": "a1"}, headers=ANA).status_code == 201
    asyncio.run(_a_dead_attempt(url, "a1", {"input_tokens": 985, "output_tokens": 10, "calls": 1}))
    with TestClient(_app(bot, url, clock)) as client:
        asked = len(fake.requests)
        refused = _say(client, "a1", ANA)
        assert _error(refused) == BUILTIN["en"]["user_budget_spent"].format(renews="2026-12-08 00:00 UTC")
        assert len(fake.requests) == asked  # refused before the model call


async def _a_dead_attempt(url: str, session: str, usage: dict) -> None:
    """The session's usage record as a server killed after a model call answered left it
    (store/billing.py): an attempt no commit counted, with its call's `usage`."""
    store = await open_existing_store(url)
    try:
        await store.put_record(f"usage:{session}", {"attempt": "dead0001", "turn": 1, "at": 1796637600.0,
                                                    "usage": usage}, session)
    finally:
        await store.close()
