"""A live session's move to another version of its bot (docs/versions.md, "What a live session
does"): the move is part of the session's next turn, committed with it and only with it.
Real apps on a real SQLite file, the fake OpenAI server, bots/shop."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from fastapi.testclient import TestClient

import chatrun
from server_support import app_for_testclient as create_app
from test_versions import (
    resource,
    say,
    sent_calls,
    shop_copy,
    shop_responder,
    start_v1_sessions,
)
from versions_support import started_on_version_1, write_versions


def test_a_rating_between_turns_does_not_commit_half_a_move(fake, tmp_path):
    """A rating (or any write that is not a turn) after a promotion commits the session as it
    was stored: the move, with its migrated memories and its `moved` entry, waits for the turn."""
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="migrate")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    start_v1_sessions(store, root, 3)  # s2 browses, its memory holds a call of add_item
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version
    with TestClient(create_app(str(root), store)) as both:
        rated = both.post("/bots/shop/sessions/s2/feedback", json={"turn": 1, "rating": "up"})
        assert rated.status_code == 201, rated.text
    with TestClient(create_app(str(root), store)) as later:  # another replica, or after a restart
        fake.requests.clear()
        say(later, "s2", "hello again")
        session = resource(later, "s2")
    assert session["botVersion"] == v2_hash and session["state"]["contact"] == {"email": "a2@example.com"}
    assert sent_calls(fake)[0] == ("add_to_basket", {"product": "T1", "quantity": 1})  # the migrated memory
    moved = [h for h in session["history"] if h.get("moved")]
    assert len(moved) == 1 and moved[0]["ok"] and moved[0]["moved"]["to"] == v2_hash, session["history"]


def stored_memories(db: Path, session_id: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT memory_id FROM memories WHERE memory_id LIKE ?",
                                               (session_id + ".%",))]


def test_deleting_a_session_whose_move_waits_deletes_the_memories_it_has_in_the_store(fake, tmp_path):
    """A session deleted before the turn that would move it: the memories of its stored scopes
    go with it (the move dropped the gift_wrap scope and renamed none in the store yet)."""
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="migrate")
    db = tmp_path / "sessions.db"
    start_v1_sessions(f"sqlite:///{db}", root, 1)  # s0 wraps a gift: a scope version 2 drops
    with TestClient(create_app(str(root / "versions" / "1"), f"sqlite:///{db}")) as v1:
        say(v1, "s0", "a red ribbon")  # the gift_wrap scope's memory is stored
    assert sorted(stored_memories(db, "s0")) == ["s0.1#browse", "s0.2#gift_wrap"]
    with TestClient(create_app(str(root), f"sqlite:///{db}")) as both:
        assert both.delete("/bots/shop/sessions/s0").status_code == 204
    assert stored_memories(db, "s0") == []


REFUNDS_V1 = """\
name: refunds
version: "1"
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {refunded: []}
routes:
  main: {default: true, system: Refund orders., tools: [refund]}
tools:
  refund:
    description: Refund an order
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    action: {set: {state.refunded: "{{ state.refunded + [args.order] }}"}, message: refunded}
    approval: {by: [user]}
"""
REFUNDS_V2 = """\
name: refunds
version: "2"
on_change: migrate
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {refunded: []}
migrations:
  - from: "1"
    tools: {refund: give_refund}
    arguments: {give_refund: {rename: {order: order_id}, default: {reason: none given}}}
routes:
  main: {default: true, system: Refund orders., tools: [give_refund]}
tools:
  give_refund:
    description: Refund an order
    parameters:
      type: object
      properties: {order_id: {type: string}, reason: {type: string}}
      required: [order_id, reason]
    action: {set: {state.refunded: "{{ state.refunded + [args.order_id ~ ': ' ~ args.reason] }}"}, message: refunded}
    approval: {by: [user]}
"""


def refunds_responder(body: dict) -> dict:
    if body["messages"][-1]["role"] == "tool":
        return {"text": "Done."}
    return {"tool_calls": [{"name": "refund", "arguments": {"order": "A7"}}]}


def test_an_approval_whose_tools_arguments_a_migration_maps_runs_with_the_mapped_arguments(fake, tmp_path):
    """A call waiting for approval when version 2 arrives: its tool is renamed with the bot's
    (tests/test_versions_pending.py), and its arguments are mapped as the calls in memories are,
    so the approved call is one of version 2's tool."""
    fake.responder = refunds_responder
    root = write_versions(tmp_path / "refunds", {"1": REFUNDS_V1, "2": REFUNDS_V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    asked = started_on_version_1(root, "refunds", store, "refund A7")
    assert [e["data"]["id"] for e in asked["events"] if e["type"] == "Pending"] == ["p1"], asked
    with TestClient(create_app(str(root), store)) as both:
        pending = both.get("/bots/refunds/sessions/s/pending").json()["pending"]
        assert [(p["tool"], p["args"]) for p in pending] == [("give_refund", {"order_id": "A7", "reason": "none given"})]
        decided = both.post("/bots/refunds/sessions/s/pending/p1", json={"decision": "approve"})
        assert decided.status_code == 200 and decided.json()["ok"] is True, decided.text
        state = both.get("/bots/refunds/sessions/s").json()["state"]
    assert state["refunded"] == ["A7: none given"]


def test_a_tester_cannot_start_a_session_on_a_version_its_sessions_move_away_from(fake, tmp_path):
    """docs/versions.md, "Canaries": the header picks the version a new session starts on. A
    version of weight 0 older than the primary, whose sessions the primary moves (not `pin`), is
    refused (400, naming the versions that keep their sessions); the session was created on it
    and moved to the primary at once, the header silently ignored. Under `pin` it is started."""
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="migrate")  # no versions.yaml: version 2 takes all
    with TestClient(create_app(str(root), f"sqlite:///{tmp_path / 'sessions.db'}")) as server:
        for door in ({"url": "/bots/shop/sessions", "json": {"id": "t"}},
                     {"url": "/v1/chat/completions", "json": {"model": "shop", "messages": [
                         {"role": "user", "content": "wrap it please"}]}}):
            refused = server.post(**door, headers={"Chatrun-Bot-Version": "1"})
            assert refused.status_code == 400, refused.text
            assert "version 1 of bot shop takes no new sessions" in refused.text and "pick 2," in refused.text
        assert server.get("/bots/shop/sessions/t").status_code == 404  # nothing was created
    root = shop_copy(tmp_path / "pinned", on_change="pin")
    v1_hash = chatrun.load_bot(root / "versions" / "1").config.content_version
    with TestClient(create_app(str(root), f"sqlite:///{tmp_path / 'pinned.db'}")) as server:
        created = server.post("/bots/shop/sessions", json={"id": "t"}, headers={"Chatrun-Bot-Version": "1"})
        assert created.status_code == 201 and created.json()["botVersion"] == v1_hash, created.text
        say(server, "t", "wrap it please")  # version 1's route
        assert resource(server, "t")["route"] == "gift_wrap"


def test_an_approved_call_whose_arguments_the_new_version_refuses_is_refused_not_failed_at_every_try(
        fake, tmp_path):
    """Version 2 changed the tool's parameters and its migration maps no `arguments:`: the call
    that waited for approval is checked against the parameters it would run with now. Before, the
    decision's turn failed at every try (the action read arguments that were not there), and the
    item waited forever; now the model reads why the call was not run, as for any invalid call."""
    fake.responder = refunds_responder
    root = write_versions(tmp_path / "refunds", {"1": REFUNDS_V1, "2": REFUNDS_V2.replace(
        "    arguments: {give_refund: {rename: {order: order_id}, default: {reason: none given}}}\n", "")})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    assert started_on_version_1(root, "refunds", store, "refund A7")["ok"]
    with TestClient(create_app(str(root), store)) as both:
        decided = both.post("/bots/refunds/sessions/s/pending/p1", json={"decision": "approve"})
        assert decided.status_code == 200 and decided.json()["ok"] is True, decided.text
        assert not [e for e in decided.json()["events"] if e["type"] == "Error"], decided.text
        session = both.get("/bots/refunds/sessions/s").json()
        assert both.get("/bots/refunds/sessions/s/pending").json()["pending"] == []
    assert session["state"]["refunded"] == []  # not run
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told and "order_id" in told[-1], told  # the model reads what the tool wants now


def test_a_failed_first_turn_of_a_session_of_a_lost_version_leaves_it_as_stored_so_the_retry_moves_it(
        fake, tmp_path):
    """docs/versions.md: the move is rolled back with a failed turn and made again on the next
    try. For a session of a version no one has (or one stored before versions), the failed turn's
    record wrote the new version's hash as the session's: the retry found it "on" the new version
    and did not move it (no migration, no note, no `moved` entry)."""
    from test_versions_lost import rewrite_versions

    failing = [True]

    def responder(body: dict) -> dict:
        return {"status": 500, "text": "down"} if failing[0] else shop_responder(body)

    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="migrate")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    start_v1_sessions(store, root, 3)  # s2 browses, with `email` (which version 2 renames)
    rewrite_versions(tmp_path / "sessions.db", "0123456789ab")  # a version stored nowhere
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version
    fake.responder = responder
    with TestClient(create_app(str(root), store)) as server:
        failed = server.post("/bots/shop/sessions/s2/messages", json={"userMessage": "hello again"}).json()
        assert failed["ok"] is False, failed
    failing[0] = False
    with TestClient(create_app(str(root), store)) as server:  # the retry, on another replica
        fake.requests.clear()
        say(server, "s2", "hello again")
        session = resource(server, "s2")
    assert session["state"]["contact"] == {"email": "a2@example.com"}, session["state"]  # migrated
    assert "version 0123456789ab this conversation ran on is no longer available" in str(fake.requests[-1])
    moved = [h["moved"] for h in session["history"] if h.get("moved")]
    assert [(m["from"], m["to"]) for m in moved] == [("0123456789ab", v2_hash)], session["history"]


COLOURS_V1 = """\
name: colours
version: "1"
format: 3
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {colour: null}
routes:
  main: {default: true, system: Pick a colour., tools: [pick_colour]}
tools:
  pick_colour:
    description: Ask the user for a colour
    action:
      ask: {from: user, text: Which colour?, schema: {enum: [red, blue]}}
      set: {state.colour: "{{ result }}"}
"""
COLOURS_V2 = """\
name: colours
version: "2"
format: 3
on_change: migrate
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {colour: null}
routes:
  main: {default: true, system: Pick a colour., tools: [pick_colour]}
tools:
  pick_colour:
    description: Every order is red now
    action: {set: {state.colour: red}, reply: Red it is.}
"""


def test_a_question_whose_tool_no_longer_asks_is_withdrawn_by_the_move(fake, tmp_path):
    """Version 2 keeps the tool but it no longer asks: the open question is withdrawn with the
    move, as one whose tool is gone; before, its answer failed at every try (an internal
    AssertionError) and the question waited forever."""
    fake.responder = lambda body: ({"text": "Done."} if body["messages"][-1]["role"] == "tool"
                                   else {"tool_calls": [{"name": "pick_colour", "arguments": {}}]})
    root = write_versions(tmp_path / "colours", {"1": COLOURS_V1, "2": COLOURS_V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    asked = started_on_version_1(root, "colours", store, "a colour")
    assert [e["data"]["id"] for e in asked["events"] if e["type"] == "Pending"] == ["p1"], asked
    with TestClient(create_app(str(root), store)) as both:
        answered = both.post("/bots/colours/sessions/s/pending/p1", json={"answer": "blue"})
        assert answered.status_code == 409, answered.text
        assert answered.json()["error"] == "NotPending" and "withdrawn" in answered.json()["message"]
        said = both.post("/bots/colours/sessions/s/messages", json={"userMessage": "hello"}).json()
        assert said["ok"] is True, said
        session = both.get("/bots/colours/sessions/s").json()
    (moved,) = [h["moved"] for h in session["history"] if h.get("moved")]
    assert any("p1" in note and "withdrawn" in note for note in moved["notes"]), moved
