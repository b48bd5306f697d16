"""Issue 22, the server's side that needs no decision to run: who reaches a session's pending
items (its owner, the roles an item waits for, a backend's item token, operators), the
operators' list `GET /pending` with its filters, the refusals and body errors of the decision
endpoints, the WebSocket's Decide/Answer frames and what a Quarkus-dialect or /v1 client
gets for a Pending event. A real app on a real SQLite file; the pending items are written into
the stored snapshot as the engine writes them (engine/pending.py's PendingItem.to_dict)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun import events as ev
from chatrun.engine.pending import PendingItem
from chatrun.server import wire
from chatrun.server.openai_turn import Reply
from chatrun.store.sqlite import SQLiteStore
from server_support import WIRE_SCHEMA, app_for_testclient, write_travel

AUTH = """
tokens:
  ana-token-123: {principal: ana}
  sam-token-123: {principal: sam, roles: [supervisor]}
  olga-token-12: {principal: olga, roles: [operators]}
  eve-token-123: {principal: eve, roles: [staff]}
  max-token-123: {principal: max, roles: [operators]}
"""
ANA, SAM, OLGA, EVE = ({"Authorization": f"Bearer {t}"} for t in
                       ("ana-token-123", "sam-token-123", "olga-token-12", "eve-token-123"))
ITEM_TOKEN = "kyc-secret-token-1"
LONG_AGO = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
NOW = datetime.now(UTC).isoformat()


def approval(pid="p1", created=LONG_AGO, due=None):
    return PendingItem(pid, "approval", created, due, "main_menu", "s1.1", tool="refund", call_id="c1",
                       args={"order": "A7", "amount": 80}, ask="Refund 80 EUR on A7?", by=["supervisor"],
                       edit=["amount"], requested_by={"name": "ana"}).to_dict()


def backend_question(pid="p2"):
    return PendingItem(pid, "question", NOW, None, "main_menu", "s1.1", ask="We are checking your documents.",
                       by=["backend"], schema={"type": "object"}, token=ITEM_TOKEN,
                       data={"secret": "kept"}).to_dict()


@pytest.fixture
def served(fake, tmp_path):
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    db = tmp_path / "s.db"
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path))], f"sqlite:///{db}", auth=str(auth))
    with TestClient(app) as client:
        yield client, db


def seed(db, session_id, *items, taken_over=None):
    """Write pending items into a stored session as the engine's commit would."""
    with SQLiteStore(db) as store:
        record = store.read_session(session_id)
        snapshot = dict(record.snapshot, pending=list(items), pending_next=len(items) + 1)
        if taken_over:
            snapshot["taken_over"] = taken_over
        store.commit_turn(session_id, snapshot, {}, [], record.version)


@pytest.fixture
def waiting(served):
    client, db = served
    assert client.post("/bots/travel/sessions", json={"id": "s1"}, headers=ANA).status_code == 201
    assert client.post("/bots/travel/sessions", json={"id": "s2"}, headers=ANA).status_code == 201
    seed(db, "s1", approval(), backend_question())
    return client, db


def test_the_owner_sees_the_items_without_the_backend_token_and_the_session_resource_lists_them(waiting):
    client, _ = waiting
    body = client.get("/bots/travel/sessions/s1/pending", headers=ANA).json()
    assert [i["id"] for i in body["pending"]] == ["p1", "p2"] and body["taken_over"] is None
    assert all("token" not in i and "data" not in i for i in body["pending"])
    assert body["pending"][0]["choices"] == [{"label": "Approve", "value": "approve"},
                                             {"label": "Reject", "value": "reject"}]
    resource = client.get("/bots/travel/sessions/s1", headers=ANA).json()
    assert [i["id"] for i in resource["pending"]] == ["p1", "p2"]
    assert client.get("/bots/travel/sessions/s2/pending", headers=ANA).json() == {"pending": [], "taken_over": None}


def test_the_parties_an_item_waits_for_reach_the_session_and_nobody_else_learns_it_exists(waiting):
    client, _ = waiting
    assert client.get("/bots/travel/sessions/s1/pending", headers=SAM).status_code == 200  # supervisor: p1's by
    assert client.get("/bots/travel/sessions/s1/pending", headers=OLGA).status_code == 200  # operators
    backend = client.get("/bots/travel/sessions/s1/pending", headers={"Authorization": f"Bearer {ITEM_TOKEN}"})
    assert backend.status_code == 200  # a backend with the item's token and no principal
    for stranger in (EVE, {"Authorization": "Bearer not-an-item-token"}):
        refused = client.get("/bots/travel/sessions/s1/pending", headers=stranger)
        assert refused.status_code == 404 and "no session 's1'" in refused.json()["message"]
    # The supervisor reaches s1 only for its pending items: s2 waits for nothing, and the
    # session resource and its messages stay the owner's.
    assert client.get("/bots/travel/sessions/s2/pending", headers=SAM).status_code == 404
    assert client.get("/bots/travel/sessions/s1", headers=SAM).status_code == 404
    assert client.post("/bots/travel/sessions/s1/messages", json={"userMessage": "hi"}, headers=SAM).status_code == 404
    assert client.get("/bots/travel/sessions/s1/pending").status_code == 401  # no token at all


def test_operators_list_every_waiting_session_with_filters(waiting):
    client, db = waiting
    assert client.post("/bots/travel/sessions", json={"id": "s3"}, headers=ANA).status_code == 201
    seed(db, "s3", taken_over={"by": "olga", "since": NOW})
    listed = client.get("/pending", headers=OLGA).json()["sessions"]
    assert [(s["session"], [i["id"] for i in s["items"]]) for s in listed] == [("s1", ["p1", "p2"]), ("s3", [])]
    assert listed[0]["bot"] == "travel" and listed[0]["owner"] == "ana"
    assert listed[1]["taken_over"] == {"by": "olga", "since": NOW}
    assert all("token" not in i for s in listed for i in s["items"])

    def ids(query):
        return [(s["session"], [i["id"] for i in s["items"]]) for s in
                client.get(f"/pending?{query}", headers=OLGA).json()["sessions"]]

    assert ids("kind=question") == [("s1", ["p2"])]
    assert ids("kind=takeover") == [("s3", [])]
    assert ids("role=supervisor") == [("s1", ["p1"])]
    assert ids("older_than=3600") == [("s1", ["p1"])]  # only p1 is two hours old
    assert ids("bot=travel&kind=approval") == [("s1", ["p1"])]
    assert client.get("/pending?bot=nope", headers=OLGA).status_code == 404
    bad = client.get("/pending?kind=vote", headers=OLGA)
    assert bad.status_code == 400 and "'approval', 'question' or 'takeover'" in bad.json()["message"]
    refused = client.get("/pending", headers=SAM)
    assert refused.status_code == 403 and "operators" in refused.json()["message"]


def test_decision_bodies_are_checked_before_anything_runs(waiting):
    client, _ = waiting
    for body, problem in (({"decision": "maybe"}, 'decision must be "approve" or "reject"'),
                          ({"decision": "reject", "args": {"amount": 1}}, "a rejection takes no args"),
                          ({"decision": "approve", "args": [1]}, "args must be a JSON object"),
                          ({"decision": "approve", "answer": 1}, "either decision or answer"),
                          ({"decision": "approve", "reason": 7}, "reason must be a string"),
                          ({"decision": "approve", "reasn": "x"}, "unknown field 'reasn'; did you mean 'reason'?"),
                          ({"answer": "yes", "reason": "x"}, 'an answer is {"answer": VALUE} alone: reason go')):
        r = client.post("/bots/travel/sessions/s1/pending/p1", json=body, headers=SAM)
        assert r.status_code == 400 and problem in r.json()["message"], (body, r.json())
    r = client.post("/bots/travel/sessions/s1/pending/p1", json={"decision": "approve"}, headers=EVE)
    assert r.status_code == 404  # a stranger learns nothing


def user_question(pid="p3"):
    return PendingItem(pid, "question", NOW, None, "main_menu", "s1.1", ask="Your address?", by=["user"],
                       schema={"type": "string"}).to_dict()


def test_an_answer_a_reason_and_an_operators_line_are_held_to_the_message_limit(fake, tmp_path):
    """The model reads a question's answer, a decision's reason and an operator's line as it reads
    a user's message, which every door holds to --max-message-chars; these were taken up to the
    body's 64 KiB (an answer on the page, over HTTP or AG-UI's resume). Now each is 413 TooLarge
    naming its field and the limit, and nothing is decided or said: the item still waits."""
    from server_support import until_done

    (tmp_path / "auth.yaml").write_text(AUTH)
    db = tmp_path / "s.db"
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path))], f"sqlite:///{db}",
                             auth=str(tmp_path / "auth.yaml"), limits=wire.ServerLimits(max_message_chars=40))
    long = "x" * 41
    with TestClient(app) as client:
        assert client.post("/bots/travel/sessions", json={"id": "s1"}, headers=ANA).status_code == 201
        seed(db, "s1", approval(), user_question())
        for path, body, headers, field in (
                ("pending/p3", {"answer": long}, ANA, "answer"),
                ("pending/p3", {"answer": {"street": long}}, ANA, "answer"),
                ("pending/p1", {"decision": "reject", "reason": long}, SAM, "reason"),
                ("operator/messages", {"text": long}, OLGA, "text")):
            r = client.post(f"/bots/travel/sessions/s1/{path}", json=body, headers=headers)
            assert r.status_code == 413 and r.json()["error"] == "TooLarge", (path, r.json())
            assert r.json()["message"].startswith(f"{field} of ") and r.json()["message"].endswith("over the limit of 40 (--max-message-chars): send a shorter one (nothing was decided or said)")
        with client.websocket_connect("/_chat/routes", headers=ANA) as ws:
            ws.send_json({"type": "Connect", "chatId": "s1", "extensions": True, "resume": True})
            until_done(ws)
            ws.send_json({"type": "Answer", "chatId": "s1", "item": "p3", "answer": long})
            frames = until_done(ws)
            assert frames[-1] == {"chatId": "s1", "type": "Failed", "data": "TooLarge"}, frames
        items = client.get("/bots/travel/sessions/s1", headers=ANA).json()["pending"]
        assert [i["id"] for i in items] == ["p1", "p3"]
    assert fake.requests == []


def test_only_operators_or_a_takeover_items_role_take_over_speak_and_release(waiting):
    client, _ = waiting
    for path, body in (("takeover", {}), ("operator/messages", {"text": "hello"}), ("release", {})):
        r = client.post(f"/bots/travel/sessions/s1/{path}", json=body, headers=SAM)
        assert r.status_code == 403 and "operators" in r.json()["message"], path
    r = client.post("/bots/travel/sessions/s1/takeover", json={}, headers=ANA)  # the owner is no operator
    assert r.status_code == 403
    r = client.post("/bots/travel/sessions/s1/operator/messages", json={"text": ""}, headers=OLGA)
    assert r.status_code == 400 and "text must be a non-empty string" in r.json()["message"]


def test_one_operator_holds_a_taken_conversation_another_is_refused_409_naming_the_holder(waiting):
    client, _ = waiting
    MAX = {"Authorization": "Bearer max-token-123"}
    assert client.post("/bots/travel/sessions/s1/takeover", json={}, headers=OLGA).status_code == 200
    for path, body in (("takeover", {}), ("operator/messages", {"text": "max here"}), ("release", {})):
        r = client.post(f"/bots/travel/sessions/s1/{path}", json=body, headers=MAX)
        assert r.status_code == 409, (path, r.json())
        assert r.json()["error"] == "HeldByAnother" and "the operator olga holds" in r.json()["message"], path
    # the console reads who holds it, so that it offers max no action the server refuses
    assert client.get("/bots/travel/sessions/s1", headers=MAX).json()["heldByAnother"] == "olga"
    assert client.get("/bots/travel/sessions/s1", headers=OLGA).json()["heldByAnother"] is None
    again = client.post("/bots/travel/sessions/s1/takeover", json={}, headers=OLGA)  # the holder: idempotent
    assert again.status_code == 200 and again.json()["events"] == []
    assert client.get("/bots/travel/sessions/s1/pending", headers=OLGA).json()["taken_over"]["by"]["name"] == "olga"
    left = client.post("/bots/travel/sessions/s1/release", json={}, headers=OLGA).json()["events"]
    assert [e["meta"]["name"] for e in left if e.get("meta", {}).get("from") == "notice"] == ["olga"]
    joined = client.post("/bots/travel/sessions/s1/takeover", json={}, headers=MAX)  # free again: max takes it
    assert joined.status_code == 200 and "max joined the conversation" in [e["data"] for e in joined.json()["events"]]


def test_a_forced_takeover_moves_the_hold_and_the_first_operator_is_then_refused_409(waiting):
    client, _ = waiting
    MAX = {"Authorization": "Bearer max-token-123"}
    assert client.post("/bots/travel/sessions/s1/takeover", json={}, headers=OLGA).status_code == 200
    said = client.post("/bots/travel/sessions/s1/operator/messages", json={"text": "olga here"}, headers=OLGA)
    assert said.status_code == 200
    bad = client.post("/bots/travel/sessions/s1/takeover", json={"force": "yes"}, headers=MAX)
    assert bad.status_code == 400 and "force must be true or false" in bad.json()["message"]
    assert client.post("/bots/travel/sessions/s1/takeover", json={"force": True}, headers=SAM).status_code == 403
    r = client.post("/bots/travel/sessions/s1/takeover", json={"force": True}, headers=MAX)
    assert r.status_code == 200, r.json()
    notices = [e["data"] for e in r.json()["events"] if e.get("meta", {}).get("from") == "notice"]
    assert notices == ["olga left the conversation", "max joined the conversation"]
    held = client.get("/bots/travel/sessions/s1/pending", headers=MAX).json()
    assert held["taken_over"]["by"]["name"] == "max"
    takeover = [i for i in held["pending"] if i["kind"] == "takeover"]
    assert len(takeover) == 1 and takeover[0]["id"] == held["taken_over"]["item"]  # the same talk goes on
    for path, body in (("operator/messages", {"text": "still olga"}), ("release", {})):
        r = client.post(f"/bots/travel/sessions/s1/{path}", json=body, headers=OLGA)
        assert r.status_code == 409 and "the operator max holds" in r.json()["message"], path
    released = client.post("/bots/travel/sessions/s1/release", json={}, headers=MAX).json()["events"]
    assert [e["data"] for e in released if e.get("meta", {}).get("from") == "notice"] == ["max left the conversation"]


def test_the_openapi_text_shows_the_bodies_and_the_refusals(served):
    client, _ = served
    spec = client.get("/openapi.json").json()
    decide = spec["paths"]["/bots/{bot}/sessions/{session_id}/pending/{item}"]["post"]
    shapes = decide["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    assert [s["properties"].get("decision", {}).get("const") for s in shapes] == ["approve", "reject", None]
    assert "args" in shapes[0]["properties"] and "answer" in shapes[2]["properties"]
    assert {"403", "409", "422"} <= set(decide["responses"])
    assert "DecisionRefused" in decide["responses"]["403"]["description"]
    assert "/pending" in spec["paths"] and "/bots/{bot}/sessions/{session_id}/takeover" in spec["paths"]


def test_the_websocket_reads_decide_and_answer_frames():
    import jsonschema

    limits = wire.ServerLimits()
    frame = wire.parse_frame('{"type": "Decide", "chatId": "c", "item": "p1", "decision": "approve", '
                             '"args": {"amount": 40}, "requestId": "k1"}', limits)
    assert (frame.type, frame.item, frame.data, frame.request_id) == (
        "Decide", "p1", {"decision": "approve", "args": {"amount": 40}}, "k1")
    frame = wire.parse_frame('{"type": "Answer", "chatId": "c", "item": "p2", "answer": {"verdict": "ok"}}', limits)
    assert (frame.item, frame.data) == ("p2", {"answer": {"verdict": "ok"}})
    with pytest.raises(wire.FrameError, match="Answer needs an answer"):
        wire.parse_frame('{"type": "Answer", "chatId": "c", "item": "p2"}', limits)
    with pytest.raises(wire.FrameError, match="Decide has no field 'reasn'; it takes item, decision, args, reason"):
        wire.parse_frame('{"type": "Decide", "chatId": "c", "item": "p1", "decision": "reject", "reasn": "x"}', limits)
    with pytest.raises(wire.FrameError, match="Answer has no field 'decision'"):
        wire.parse_frame('{"type": "Answer", "chatId": "c", "item": "p1", "answer": 1, "decision": "reject"}', limits)
    with pytest.raises(wire.FrameError, match="Decide needs an item"):
        wire.parse_frame('{"type": "Decide", "chatId": "c", "decision": "approve"}', limits)
    validator = jsonschema.Draft202012Validator(WIRE_SCHEMA)
    assert validator.is_valid({"type": "Decide", "chatId": "c", "item": "p1", "decision": "reject", "reason": "no"})
    assert not validator.is_valid({"type": "Decide", "chatId": "c", "item": "p1", "decision": "perhaps"})
    assert validator.is_valid({"type": "Answer", "chatId": "c", "item": "p2", "answer": None})
    assert validator.is_valid({"chatId": "c", "type": "Failed", "data": "NotPending"})


def user_approval():
    item = PendingItem("p1", "approval", NOW, None, "main_menu", "s.1", tool="refund", ask="Refund 20 EUR?",
                       by=["user"])
    return ev.Event(ev.PENDING, item.public())


def test_a_quarkus_client_gets_a_pending_item_as_the_message_asking_it():
    quarkus, extended = wire.QUARKUS_DIALECT.turn(), wire.EXTENDED_DIALECT.turn()
    pending = user_approval()
    assert quarkus.out(pending) == ("Message", "Refund 20 EUR?\n\nReply approve or reject.")
    assert extended.out(pending) == ("Pending", pending.data)
    resolved = ev.Event(ev.RESOLVED, {"id": "p1", "kind": "approval", "outcome": "approved", "by": None})
    assert quarkus.out(resolved) is None and extended.out(resolved) == ("Resolved", resolved.data)
    question = {"id": "p2", "kind": "question", "ask": "Which document?", "by": ["user"],
                "choices": [{"label": "Passport", "value": "passport"}, {"label": "ID card", "value": "id"}]}
    assert wire.written_out(question) == "Which document?\n\nReply with one of: Passport, ID card."
    # Waiting on someone else: the user is told what happens, not asked to reply.
    assert wire.written_out({"kind": "approval", "ask": "A supervisor checks the refund.", "by": ["supervisor"]}) == (
        "A supervisor checks the refund.")


def test_an_openai_client_gets_the_pending_item_as_reply_text():
    reply = Reply()
    reply.feed(ev.Event(ev.MESSAGE, "Let me check."))
    reply.feed(user_approval())
    assert reply.text == "Let me check.\n\nRefund 20 EUR?\n\nReply approve or reject."
