"""`chatrun report` and `/metrics` agree on a `/v1` conversation whose answer was regenerated
(docs/report.md, "Forks"): the fork made by the regenerate (docs/openai-api.md, "Sessions")
is a branch of the same conversation, not a second one. Its outcome recorded before the fork
point is counted once, and the turns before the fork point are billed once. Through the real
openai SDK, a real server on a loopback port, its SQLite store and the report's command."""

from __future__ import annotations

import contextlib
import re

import httpx
import openai
import pytest
from click.testing import CliRunner

import chatrun
from chat_support import call
from chatrun.cli.report import report
from chatrun.server import create_app
from server_support import ThreadServer
from test_outcomes import Cells

pytestmark = pytest.mark.slow  # a server on a loopback port

BOT = """
name: desk
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
prices: {gpt-4o-mini: {input: 1.0, output: 2.0}}
events:
  TicketClosed: {audience: backend}
outcomes:
  resolved: {event: TicketClosed}
routes:
  main:
    default: true
    system: You help.
    tools: [close_ticket, escalate]
  human:
    system: A person will answer.
tools:
  escalate:
    description: Hand over to a person
    action: {route: human}
  close_ticket:
    description: Close the ticket
    action: {emit: {TicketClosed: {why: done}}}
"""


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the series of `name` whose labels include `labels`."""
    total = 0.0
    for found, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if all(f'{k}="{v}"' in found for k, v in labels.items()):
            total += float(value)
    return total


def report_cells(tmp_path, store: str) -> dict:
    out = tmp_path / "report.html"
    result = CliRunner().invoke(report, ["--store", store, "--out", str(out)])
    assert result.exit_code == 0, result.output
    cells = Cells()
    cells.feed(out.read_text())
    return cells.values


def test_a_regenerated_answer_is_one_conversation_resolved_once_and_billed_once(fake, write_bot, tmp_path):
    bot = chatrun.load_bot(write_bot(BOT))
    store = f"sqlite:///{tmp_path}/desk.db"
    with ThreadServer(create_app([bot], store)) as server, \
            openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        fake.queue(call("close_ticket"), {"text": "Closed."})
        messages = [{"role": "user", "content": "close my ticket"}]
        first = client.chat.completions.create(model="desk", messages=messages)
        messages += [{"role": "assistant", "content": "Closed."}, {"role": "user", "content": "thanks"}]
        for answer in ("Bye.", "Goodbye!"):  # the second is the user's regenerate: a fork from turn 1
            fake.queue({"text": answer})
            reply = client.chat.completions.create(model="desk", messages=messages)
        assert reply.model_extra["chatrun"]["how"] == "forked"
        assert reply.model_extra["chatrun"]["forked_from"] == first.model_extra["chatrun"]["session"]
        original, fork = first.model_extra["chatrun"]["session"], reply.model_extra["chatrun"]["session"]
        # Turn 1's reply is the original's in both branches: rated down there, then up in the fork
        # (the newer rating of the same reply counts); each branch's turn 2 is a reply of its own.
        for session, turn, rating in ((original, 1, "down"), (fork, 1, "up"), (original, 2, "down"), (fork, 2, "up")):
            rated = httpx.post(f"{server.url}/bots/desk/sessions/{session}/feedback",
                               json={"turn": turn, "rating": rating}, timeout=30)
            assert rated.status_code == 201, rated.text
        text = httpx.get(server.url + "/metrics", timeout=30).text
    billed = metric(text, "chatrun_cost_total", bot="desk")
    assert billed > 0 and len(fake.requests) == 4  # four model calls, each billed once
    assert metric(text, "chatrun_outcomes_total", bot="desk", outcome="resolved") == 1
    v = report_cells(tmp_path, store)
    assert v[("all", "conversations")] == 1  # the user had one conversation, in two branches
    assert v[("all", "resolution")] == 1.0
    assert v[("all", "cost_per_resolved")] == pytest.approx(billed)  # the metric's cost: nothing twice
    assert v[("all", "turns")] == 3  # each branch's own turns
    assert metric(text, "chatrun_feedback_total", bot="desk") == 4  # every rating given (docs/observability.md)
    assert v[("all", "ratings")] == 3 and v[("all", "csat")] == pytest.approx(2 / 3)  # each reply's newest
    assert same_through_the_protocol(tmp_path / "desk.db")


def same_through_the_protocol(path) -> bool:
    """Other stores (Redis's) are read through the store protocol: the same conversations."""
    import asyncio

    from chatrun.report.read import _branch, _protocol_rows, joined, read_conversations
    from chatrun.store.local import LocalAsyncStore
    from chatrun.store.sqlite import SQLiteStore

    async def both():
        store = LocalAsyncStore(SQLiteStore(str(path)), "sqlite")
        return await read_conversations(store), [row async for row in _protocol_rows(store)]

    fast, rows = asyncio.run(both())
    generic = joined(b for b in (_branch(*row) for row in rows) if b is not None)
    return len(fast) == 1 and repr(fast) == repr(generic)


def test_a_rating_in_a_fork_of_a_turn_before_its_fork_point_counts_under_the_route_that_turn_ran_on(
        fake, write_bot, tmp_path):
    """chatrun_feedback_total's `route` is the route the rated turn ran on (docs/observability.md):
    in a fork, a turn from before the fork point ran in its original, whose history holds it."""
    bot = chatrun.load_bot(write_bot(BOT))
    with ThreadServer(create_app([bot], f"sqlite:///{tmp_path}/desk.db")) as server, \
            openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        messages: list = []
        for said, answers in (("hi", [{"text": "Hello."}]),  # turn 1, on main
                              ("a person please", [call("escalate"), {"text": "A person will answer."}]),
                              ("thanks", [{"text": "Bye."}]), ("thanks", [{"text": "Goodbye!"}])):
            fake.queue(*answers)
            if not messages or messages[-1]["role"] == "assistant":
                messages.append({"role": "user", "content": said})
            reply = client.chat.completions.create(model="desk", messages=messages)
            if said != "thanks":
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        assert reply.model_extra["chatrun"]["how"] == "forked" and reply.model_extra["chatrun"]["route"] == "human"
        fork = reply.model_extra["chatrun"]["session"]
        rated = httpx.post(f"{server.url}/bots/desk/sessions/{fork}/feedback", json={"turn": 1, "rating": "down"},
                           timeout=30)
        assert rated.status_code == 201 and rated.json()["route"] == "main", rated.text
        text = httpx.get(server.url + "/metrics", timeout=30).text
    assert metric(text, "chatrun_feedback_total", bot="desk", route="main", rating="down") == 1
    assert metric(text, "chatrun_feedback_total", bot="desk", route="human") == 0


def stored(store_url: str, session: str) -> dict:
    """A session's snapshot as its store keeps it (read as `chatrun report` reads other stores)."""
    import asyncio

    from chatrun.store.aio import open_async_store

    async def read() -> dict:
        store = open_async_store(store_url)
        try:
            record = await store.load_session(session)
            return record.snapshot if record is not None else {}
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.mark.subprocess
@pytest.mark.parametrize(("kind", "first_answer"), [("sqlite", False), ("redis", False), ("sqlite", True)])
def test_the_branch_a_regenerate_left_is_not_recorded_abandoned_beside_the_fork(kind, first_answer, request, fake,
                                                                                tmp_path):
    """The user regenerated the second answer and went on in the fork: the original branch falls
    silent, but the conversation did not. Its armed silence is dropped when the fork is made, so
    the sweepers record `abandoned` once, for the fork (the branch the user left is left alone):
    one in chatrun_outcomes_total over every replica, one abandoned conversation in the report.
    On SQLite, and on Redis with the regenerate sent to the other replica; and the first answer
    of a front end's chat regenerated (a fork of the chat's start)."""
    from datetime import UTC, datetime, timedelta

    from redis_support import Replica
    from server_support import wait_until

    bot, clock = tmp_path / "desk.yaml", tmp_path / "clock"
    bot.write_text(BOT.replace("  resolved: {event: TicketClosed}\n",
                               "  resolved: {event: TicketClosed}\n  abandoned: {silent_for: 30m}\n"))
    start = datetime.now(UTC)
    clock.write_text(start.isoformat())
    store = f"sqlite:///{tmp_path / 'desk.db'}" if kind == "sqlite" else request.getfixturevalue("redis_server").url()
    replicas = [Replica(str(bot), store, fake.base_url, "--clock-file", str(clock), "--sweep-interval", "0.3",
                        "--session-header", "X-Chat-Id") for _ in range(1 if kind == "sqlite" else 2)]
    chat = {"X-Chat-Id": "c1"}
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(r.served()) for r in replicas]
        fake.queue({"text": "Hello."})
        messages = [{"role": "user", "content": "hi"}]
        first = sdk(servers[0]).chat.completions.create(model="desk", messages=messages, extra_headers=chat)
        sent = [(servers[-1], "Of course.")]  # the user's regenerate of the first answer
        if not first_answer:  # a second message answered, then its answer regenerated
            messages += [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "help"}]
            sent.insert(0, (servers[0], "Sure."))
        for server, answer in sent:
            fake.queue({"text": answer})
            reply = sdk(server).chat.completions.create(model="desk", messages=messages, extra_headers=chat)
        original, fork = first.model_extra["chatrun"]["session"], reply.model_extra["chatrun"]["session"]
        assert reply.model_extra["chatrun"]["how"] == "forked" and fork != original
        clock.write_text((start + timedelta(minutes=31)).isoformat())
        wait_until(lambda: (stored(store, fork).get("outcome") or {}).get("name") == "abandoned",
                   what="the fork recorded abandoned by a sweeper")
        assert "outcome" not in stored(store, original)  # not armed: nothing for a sweeper
        texts = [httpx.get(server.url + "/metrics", timeout=30).text for server in servers]
    assert sum(metric(t, "chatrun_outcomes_total", bot="desk", outcome="abandoned") for t in texts) == 1
    v = report_cells(tmp_path, store)
    assert v[("all", "conversations")] == 1 and v[("all", "abandonment")] == 1.0


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
