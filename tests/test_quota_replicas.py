"""`--max-sessions-per-principal` across replicas (docs/deploy.md): the store checks a principal's
count and counts the new session in one atomic step with its write (Commit.quota: a Lua script on
Redis, one locking statement in PostgreSQL's transaction, SQLite's write transaction, memory://'s
lock), so replicas opening one principal's sessions at once never overshoot the limit. Two real
uvicorn replicas, each with its own connection to one real Redis (and again one real PostgreSQL),
and every door that opens a session: a create, a `/v1` conversation, a `/v1` fork.

A check that reads the count, then writes, overshoots by the number of racers: to make that race
happen however fast the machine is, each replica's `count_owned` (what such a check reads) is held
until every racer has read it. The atomic step reads no count outside the write, so it never waits."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

import chatrun
from channel_support import FakeTelegram, telegram_message
from chatrun.definition.page_texts import BUILTIN
from chatrun.errors import SessionQuota
from chatrun.server import create_app
from chatrun.server.sessions import SessionSettings
from chatrun.store import replays
from chatrun.store.aio import open_async_store
from chatrun.store.record import Commit, owner_meta
from chatrun.store.versions import CREATE
from server_support import ThreadServer, write_travel
from store_params import DISTRIBUTED, store_url
from webhook_support import OPENAI_MODEL

LIMIT = 2
RACERS = 6  # three on each replica: at most LIMIT may make a session
ANA = {"Authorization": "Bearer ana-token"}
AUTH = "tokens:\n  ana-token: {principal: ana}\n"
FLAG = "--max-sessions-per-principal"


@pytest.fixture(params=DISTRIBUTED)
def shared_store(request, tmp_path):
    """An empty store the replicas share: a real Redis, a real PostgreSQL."""
    return store_url(request, tmp_path)


class Meeting:
    """Once armed for `parties`, each read of a count waits until that many were read (a read
    that finds the meeting broken goes on: only a read-then-write check ever waits here)."""

    def __init__(self) -> None:
        self.barrier: threading.Barrier | None = None

    def arm(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties)

    def wait(self) -> None:
        if self.barrier is not None:
            try:
                self.barrier.wait(30)
            except threading.BrokenBarrierError:
                pass


def _counts_met(store: Any, met: Meeting) -> Any:
    """`store`, its reads of an owner's count held until every racer has read one."""
    count_owned = store.count_owned

    async def counted(owner: str) -> int:
        owned = await count_owned(owner)
        await asyncio.to_thread(met.wait)
        return owned

    store.count_owned = counted
    return store


def _replicas(url: str, tmp_path, met: Meeting) -> list[ThreadServer]:
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    travel = chatrun.load_bot(write_travel(tmp_path / "bots"))
    return [ThreadServer(create_app([travel], store=_counts_met(open_async_store(url), met), auth=str(auth),
                                    sessions=SessionSettings(max_sessions_per_principal=LIMIT)))
            for _ in range(2)]


def _race(replicas: list[ThreadServer], open_one: Any) -> list[httpx.Response]:
    """RACERS session opens at once, spread over the replicas."""
    with ThreadPoolExecutor(RACERS) as pool:
        return list(pool.map(lambda n: open_one(replicas[n % 2].url, n), range(RACERS)))


def _check(answers: list[httpx.Response], made: int) -> None:
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [made] * LIMIT + [429] * (RACERS - LIMIT), [a.text for a in answers]
    for refused in (a for a in answers if a.status_code == 429):
        assert FLAG in refused.text and "ana already has 2 sessions" in refused.text, refused.text


def _create(url: str, n: int) -> httpx.Response:
    return httpx.post(f"{url}/bots/travel/sessions", json={"id": f"s{n}"}, headers=ANA, timeout=60)


def _converse(url: str, n: int) -> httpx.Response:
    body = {"model": "travel", "messages": [{"role": "user", "content": f"hi {n}"}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=ANA, timeout=60)


@pytest.mark.slow  # servers on loopback, a redis-server / PostgreSQL
@pytest.mark.parametrize("open_one", [_create, _converse], ids=["create", "v1"])
def test_sessions_opened_at_once_on_two_replicas_stop_exactly_at_the_limit(fake, shared_store, tmp_path, open_one):
    fake.responder = lambda body: {"text": "Hello."}
    met = Meeting()
    replicas = _replicas(shared_store, tmp_path, met)
    with replicas[0], replicas[1]:
        met.arm(RACERS)
        answers = _race(replicas, open_one)
        _check(answers, 201 if open_one is _create else 200)
    assert asyncio.run(_owned(shared_store, "ana")) == LIMIT


async def _owned(url: str, owner: str) -> int:
    store = open_async_store(url)
    try:
        return await store.count_owned(owner)
    finally:
        await store.close()


@pytest.mark.slow
def test_forks_made_at_once_on_two_replicas_stop_exactly_at_the_limit(fake, shared_store, tmp_path):
    """A `/v1` fork is a new session of its principal: of RACERS edits of one conversation sent at
    once to two replicas, one continues it and only the forks under the limit are made; the rest are 429."""
    fake.responder = lambda body: {"text": "Hello."}
    met = Meeting()
    replicas = _replicas(shared_store, tmp_path, met)
    said = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "Hello."}]
    with replicas[0], replicas[1]:
        first = httpx.post(f"{replicas[0].url}/v1/chat/completions", headers=ANA, timeout=60,
                           json={"model": "travel", "messages": said[:1]})
        assert first.status_code == 200, first.text  # ana's first session: one fork more fits under the limit
        met.arm(RACERS)  # the first read its count alone; the forks read theirs together
        answers = _race(replicas, lambda url, n: httpx.post(
            f"{url}/v1/chat/completions", headers=ANA, timeout=60,
            json={"model": "travel", "messages": [*said, {"role": "user", "content": f"two, edit {n}"}]}))
    # One edit continues the conversation in ana's session; the others are forks: new sessions.
    hows = sorted(a.json()["chatrun"]["how"] if a.status_code == 200 else str(a.status_code) for a in answers)
    assert hows == ["429"] * (RACERS - LIMIT) + ["continued"] + ["forked"] * (LIMIT - 1), [a.text for a in answers]
    assert all(FLAG in a.text for a in answers if a.status_code == 429)
    assert asyncio.run(_owned(shared_store, "ana")) == LIMIT


@pytest.fixture(params=["memory", "sqlite", *DISTRIBUTED])
def any_store(request, tmp_path):
    return store_url(request, tmp_path)


async def _commit_at_once(url: str) -> tuple[list[object], int, list[str]]:
    """RACERS new sessions of ana committed at once, each with the limit (Commit.quota), on one
    store of `url` each (a replica's connection): what each answered, ana's count, the sessions."""
    first = open_async_store(url)
    stores = [first, first if url == "memory://" else open_async_store(url)]  # memory://: one process's own
    try:
        commits = [Commit.encode(f"s{n}", {"bot": "travel", "meta": owner_meta("ana")}, {}, [], expected=CREATE)
                   for n in range(RACERS)]
        for commit in commits:
            commit.quota = LIMIT
        answers = await asyncio.gather(*(stores[n % 2].commit_turn(c, None) for n, c in enumerate(commits)),
                                       return_exceptions=True)
        made = [c.session_id for c in commits if await stores[0].load_session(c.session_id) is not None]
        return list(answers), await stores[0].count_owned("ana"), made
    finally:
        for store in {id(s): s for s in stores}.values():
            await store.close()


def test_each_store_checks_and_counts_a_new_session_against_its_owner_limit_in_one_step(any_store):
    answers, owned, made = asyncio.run(_commit_at_once(any_store))
    refused = [a for a in answers if isinstance(a, SessionQuota)]
    assert len(refused) == RACERS - LIMIT and owned == LIMIT and len(made) == LIMIT, answers
    assert all(isinstance(a, str) for a in answers if not isinstance(a, SessionQuota)), answers  # a version
    assert all(FLAG in str(a) and a.owner == "ana" and a.limit == LIMIT for a in refused)


TG_TOKEN, TG_SECRET = "123456:quota-token", "tg-secret-quota-0123"
TG_BOT = """\
name: shop
model: {OPENAI_MODEL}
env:
  TG_TOKEN: {secret: true}
  TG_SECRET: {secret: true}
  TG_API: {}
channels:
  telegram: {token: TG_TOKEN, secret: TG_SECRET, api: "{{ env.TG_API }}"}
routes:
  main: {default: true, system: You sell tickets.}
"""


@pytest.mark.slow
def test_a_channel_users_new_conversations_at_once_on_two_replicas_stop_exactly_at_the_limit(
        fake, shared_store, tmp_path, monkeypatch):
    """A channel's user is a principal too (`telegram:<user id>`): one user writing in RACERS chats
    at once, the deliveries spread over two replicas, opens LIMIT conversations; the rest of the
    deliveries are answered 200 and their user is told why, once for each (server/channels/door.py
    `_told_at_limit`: a 429 had Telegram send them again for ever while the user read nothing)."""
    with FakeTelegram(TG_TOKEN) as api:
        for name, value in {"TG_TOKEN": TG_TOKEN, "TG_SECRET": TG_SECRET, "TG_API": api.url}.items():
            monkeypatch.setenv(name, value)
        fake.responder = lambda body: {"text": "Hello."}
        (tmp_path / "bot.yaml").write_text(TG_BOT.replace("{OPENAI_MODEL}", "{" + OPENAI_MODEL + "}"))
        met = Meeting()
        replicas = [ThreadServer(create_app([str(tmp_path / "bot.yaml")], store=_counts_met(open_async_store(
            shared_store), met), sessions=SessionSettings(max_sessions_per_principal=LIMIT))) for _ in range(2)]
        with replicas[0], replicas[1]:
            met.arm(RACERS)
            answers = _race(replicas, lambda url, n: httpx.post(
                f"{url}/channels/shop/telegram", json=telegram_message(100 + n, "hi", user=7, chat=1000 + n),
                headers={"X-Telegram-Bot-Api-Secret-Token": TG_SECRET}, timeout=60))
        told = [call["text"] for call in api.calls("sendMessage")]  # the notices (the replies wait in the outbox)
    assert [a.status_code for a in answers] == [200] * RACERS, [a.text for a in answers]
    assert told == [too_many(LIMIT)] * (RACERS - LIMIT), told
    assert asyncio.run(_owned(shared_store, "telegram:7")) == LIMIT


def too_many(limit: int) -> str:
    return BUILTIN["en"]["channel_too_many_sessions"].replace("{limit}", str(limit))


def _claims_met(monkeypatch, met: Meeting) -> None:
    """Each replica's claim of a delivery's replay mark held until every try has come to claim it
    (a check that reads the mark, then writes it, would let each try tell the user)."""
    claim = replays.claim

    async def claimed(store: Any, request_id: str, until: float) -> bool:
        await asyncio.to_thread(met.wait)
        return await claim(store, request_id, until)

    monkeypatch.setattr(replays, "claim", claimed)


@pytest.mark.slow
def test_a_delivery_at_the_limit_that_reaches_two_replicas_at_once_tells_its_user_once(
        fake, shared_store, tmp_path, monkeypatch):
    """A user at --max-sessions-per-principal writes in a new chat, and Telegram's delivery of it
    reaches both replicas at once (its retry after a timeout landing on the other): both answer
    200 and no model is asked; the user is told why once, not once a replica. Both tries are held
    at the claim of the delivery's replay mark until each has come to it: the claim is one atomic
    step in the shared store, so one of them tells."""
    with FakeTelegram(TG_TOKEN) as api:
        for name, value in {"TG_TOKEN": TG_TOKEN, "TG_SECRET": TG_SECRET, "TG_API": api.url}.items():
            monkeypatch.setenv(name, value)
        fake.responder = lambda body: {"text": "Hello."}
        (tmp_path / "bot.yaml").write_text(TG_BOT.replace("{OPENAI_MODEL}", "{" + OPENAI_MODEL + "}"))
        met = Meeting()
        _claims_met(monkeypatch, met)
        replicas = [ThreadServer(create_app([str(tmp_path / "bot.yaml")], store=open_async_store(shared_store),
                                            sessions=SessionSettings(max_sessions_per_principal=1)))
                    for _ in range(2)]

        def deliver(url: str, update: int, chat: int) -> httpx.Response:
            return httpx.post(f"{url}/channels/shop/telegram", json=telegram_message(update, "hi", user=7, chat=chat),
                              headers={"X-Telegram-Bot-Api-Secret-Token": TG_SECRET}, timeout=60)

        with replicas[0], replicas[1]:
            assert deliver(replicas[0].url, 100, 1000).status_code == 200  # the user's one conversation
            met.arm(2)
            with ThreadPoolExecutor(2) as pool:
                answers = list(pool.map(lambda replica: deliver(replica.url, 200, 2000), replicas))
        told = [call["text"] for call in api.calls("sendMessage")]  # (the reply waits in the outbox: no worker here)
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert told == [too_many(1)], told
    assert len(fake.requests) == 1
