"""Issue 36: AG-UI (ag-ui-protocol 1.x). Real parts: the app (TestClient), the real `openai`
client against the fake OpenAI server (streaming), and the protocol's own pydantic types
reading every event of the stream. Tried here: a run streams the reply as text message
events between RUN_STARTED and RUN_FINISHED; the thread keeps the conversation; a run sent
again (same runId) is replayed, not run; the user's confirmation ends the run with an
interrupt and the next run's `resume` decides it; a bad input is a 400 naming the field."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from server_support import app_for_testclient

core = pytest.importorskip("ag_ui.core", reason="ag-ui-protocol is not installed (pip install -e '.[test]')")

BOT = """\
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: true}
state: {booked: 0}
routes:
  main:
    default: true
    system: You sell tickets.
    tools: [book]
tools:
  book:
    description: Book a ticket.
    parameters: {type: object, properties: {show: {type: string}}, required: [show]}
    confirm: "Book {{ args.show }}?"
    action: {set: {state.booked: "{{ state.booked + 1 }}"}, reply: "Booked {{ args.show }}."}
"""


def responder(body):
    messages = body["messages"]
    user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if messages[-1]["role"] == "tool":
        return {"text": "Done: " + str(messages[-1]["content"])}
    if user.startswith("book "):
        return {"tool_calls": [{"name": "book", "arguments": {"show": user[5:]}}]}
    turns = sum(1 for m in messages if m["role"] == "user")
    return {"chunks": ["You ", "said ", f"{user} ", f"(turn {turns})."]}


@pytest.fixture
def client(tmp_path, fake):
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT)
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as c:
        yield c


def run(client, run_id, text=None, resume=None, thread="thread-1"):
    body = {"threadId": thread, "runId": run_id, "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": [{"id": f"u-{run_id}", "role": "user", "content": text}] if text else []}
    if resume is not None:
        body["resume"] = resume
    response = client.post("/agui/shop", json=body, headers={"Accept": "text/event-stream"})
    assert response.status_code == 200, response.text
    events = []
    for block in response.text.split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        if data:  # each event read with the protocol's own types
            raw = json.loads("".join(data))
            events.append(getattr(core, _class(raw["type"])).model_validate(raw))
    return events


def _class(kind: str) -> str:
    return "".join(part.title() for part in kind.split("_")) + "Event"


def text_of(events) -> str:
    return "".join(e.delta for e in events if e.type == core.EventType.TEXT_MESSAGE_CONTENT)


def test_a_run_streams_the_reply_between_run_started_and_run_finished(client, fake):
    events = run(client, "r1", "hello")
    kinds = [e.type.value for e in events]
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
    assert kinds[1] == "TEXT_MESSAGE_START" and kinds[-2] == "TEXT_MESSAGE_END"
    assert text_of(events) == "You said hello (turn 1)."
    assert events[-1].outcome.type == "success"
    assert text_of(run(client, "r2", "again")) == "You said again (turn 2)."  # the thread remembers
    replayed = run(client, "r2", "again")  # the same run sent again: replayed, the model not asked
    assert text_of(replayed) == "You said again (turn 2)." and len(fake.requests) == 2


def test_the_users_confirmation_is_an_interrupt_and_resume_decides_it(client):
    events = run(client, "r1", "book Hamlet")
    outcome = events[-1].outcome
    assert outcome.type == "interrupt"
    [interrupt] = outcome.interrupts
    assert (interrupt.reason, interrupt.message) == ("approval", "Book Hamlet?")
    assert interrupt.response_schema["properties"]["decision"] == {"enum": ["approve", "reject"]}
    decided = run(client, "r2", resume=[{"interruptId": interrupt.id, "status": "resolved",
                                         "payload": {"decision": "approve"}}])
    assert "Booked Hamlet" in text_of(decided) and decided[-1].outcome.type == "success"


def test_a_cancelled_interrupt_rejects_and_bad_input_is_a_400_naming_the_field(client):
    interrupt = run(client, "r1", "book Hamlet")[-1].outcome.interrupts[0]
    rejected = run(client, "r2", resume=[{"interruptId": interrupt.id, "status": "cancelled"}])
    assert rejected[-1].type == core.EventType.RUN_FINISHED and "Booked" not in text_of(rejected)
    bad = client.post("/agui/shop", json={"threadId": "t", "messages": []})
    assert bad.status_code == 400 and "runId" in bad.json()["message"]
    empty = client.post("/agui/shop", json={"threadId": "t", "runId": "r", "messages": [], "state": {},
                                             "tools": [], "context": [], "forwardedProps": {}})
    assert empty.status_code == 400 and "user message" in empty.json()["message"]


def test_a_last_user_message_that_says_nothing_is_a_422_and_no_earlier_one_runs_again(client, fake):
    """The run's input is its last user message: one that says nothing (empty, only whitespace)
    is 422 EmptyMessage, as on the HTTP API; an earlier user message with text (a turn already)
    was taken instead and ran again."""
    assert text_of(run(client, "r1", "hello")) == "You said hello (turn 1)."
    history = [{"id": "u-r1", "role": "user", "content": "hello"},
               {"id": "a-r1", "role": "assistant", "content": "You said hello (turn 1)."}]
    for said in ("", "  \n"):
        body = {"threadId": "thread-1", "runId": f"r-{len(said)}", "state": {}, "tools": [], "context": [],
                "forwardedProps": {}, "messages": [*history, {"id": "u-2", "role": "user", "content": said}]}
        refused = client.post("/agui/shop", json=body, headers={"Accept": "text/event-stream"})
        assert refused.status_code == 422, refused.text
        assert refused.json() == {"error": "EmptyMessage", "message": "the last user message of messages is empty "
                                  "(no text and no attachment): send the user's text; no turn ran"}
    assert len(fake.requests) == 1


def test_an_operators_words_and_notices_reach_the_agui_user_at_the_next_run(client, fake):
    """AG-UI has no push: what others said to the user between two runs (an operator joining,
    their words, their leaving) comes first in the user's next run, as on /v1, once."""
    run(client, "r1", "hello")
    session = "/bots/shop/sessions/thread-1"
    assert client.post(f"{session}/takeover", json={}).status_code == 200
    assert client.post(f"{session}/operator/messages", json={"text": "Hi, I am Olga."}).status_code == 200
    during = run(client, "r2", "are you a person?")
    starts = [e for e in during if e.type == core.EventType.TEXT_MESSAGE_START]
    assert "Hi, I am Olga." in text_of(during), [e.type.value for e in during]
    assert any(e.name == "operator" for e in starts)  # named after the operator (auth off: `operator`)
    assert text_of(during).endswith("Your message was passed on to the operator; their answer will appear here.")
    assert len(fake.requests) == 1  # the bot stayed silent
    assert text_of(run(client, "r2", "are you a person?")) == text_of(during)  # sent again: told again
    assert client.post(f"{session}/release", json={}).status_code == 200
    after = run(client, "r3", "thanks")
    assert "left the conversation" in text_of(after) and "Hi, I am Olga." not in text_of(after)
    assert text_of(after).endswith("You said thanks (turn 3).")


def test_a_message_over_max_message_chars_is_a_413_and_runs_no_turn(client, fake):
    """--max-message-chars (8000 by default) held on the HTTP API, the WebSocket, /v1 and every
    channel, but an AG-UI run's user message of any length (up to the body's 64 KiB) ran a turn."""
    body = {"threadId": "thread-1", "runId": "r-long", "state": {}, "tools": [], "context": [],
            "forwardedProps": {}, "messages": [{"id": "u-1", "role": "user", "content": "x" * 8001}]}
    refused = client.post("/agui/shop", json=body, headers={"Accept": "text/event-stream"})
    assert refused.status_code == 413, refused.text
    assert refused.json() == {"error": "TooLarge",
                              "message": "messages[0].content of 8001 characters is over the limit of 8000"
                              " (--max-message-chars): send a shorter one"}
    assert fake.requests == []
    assert text_of(run(client, "r-fits", "x" * 7990)).startswith("You said x")


ORDERS = """\
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: true}
routes:
  main: {default: true, system: You place orders., tools: [place_order]}
tools:
  place_order:
    description: Place the order (charges the customer)
    parameters: {type: object, properties: {item: {type: string}}, required: [item]}
    http: {url: "RECEIVER/orders", method: POST, json: {item: "{{ args.item }}"}}
"""


def ordering(body):
    if body["messages"][-1]["role"] == "tool":
        return {"text": "Ordered."}
    return {"tool_calls": [{"name": "place_order", "arguments": {"item": "tea"}}]}


def posted(client, run_id, messages):
    body = {"threadId": "thread-1", "runId": run_id, "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": messages}
    response = client.post("/agui/shop", json=body, headers={"Accept": "text/event-stream"})
    assert response.status_code == 200, response.text
    return response.text


def test_a_resume_payload_over_max_message_chars_is_a_413_and_decides_nothing(client):
    """A resume's answer or reason is words the model reads, as a user message is: held to
    --max-message-chars as on the HTTP API and the WebSocket (it was taken up to 64 KiB)."""
    interrupt = run(client, "r1", "book Hamlet")[-1].outcome.interrupts[0]
    for payload, field in (({"decision": "reject", "reason": "x" * 8001}, "reason"),
                           ("x" * 8001, "resume[0].payload")):
        body = {"threadId": "thread-1", "runId": f"r-{field}", "state": {}, "tools": [], "context": [],
                "forwardedProps": {}, "messages": [],
                "resume": [{"interruptId": interrupt.id, "status": "resolved", "payload": payload}]}
        refused = client.post("/agui/shop", json=body, headers={"Accept": "text/event-stream"})
        assert refused.status_code == 413, refused.text
        assert refused.json()["message"] == (f"{field} of 8001 characters is over the limit of 8000 "
                                              "(--max-message-chars): send a shorter one (nothing was decided or said)")
    decided = run(client, "r2", resume=[{"interruptId": interrupt.id, "status": "resolved",
                                         "payload": {"decision": "approve"}}])
    assert "Booked Hamlet" in text_of(decided)


def test_a_user_message_runs_once_however_many_runs_carry_it(tmp_path, fake):
    """docs/agui.md, "A message runs once": a front end's regenerate (a new run, the answer dropped)
    and a history resent after the answer (no new user message) carry the same last user message:
    each is answered from the committed turn, not run as another turn the user never sent; the
    same message id with other text (an edit) is refused."""
    from webhook_support import Receiver

    fake.responder = ordering
    with Receiver() as receiver:
        (tmp_path / "bot.yaml").write_text(ORDERS.replace("RECEIVER", receiver.url))
        with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as c:
            tea = {"id": "m-1", "role": "user", "content": "tea please"}
            first = posted(c, "r-1", [tea])
            regenerated = posted(c, "r-2", [tea])
            resent = posted(c, "r-3", [tea, {"id": "a-1", "role": "assistant", "content": "Ordered."}])
            edited = posted(c, "r-4", [dict(tea, content="coffee please")])
            history = c.get("/bots/shop/sessions/thread-1").json()["history"]
    assert [entry["turn"] for entry in history] == [1]  # one turn: the message was not run again
    assert len(receiver.seen()) == 1  # one order
    assert all("Ordered." in text for text in (first, regenerated, resent))
    assert "RUN_ERROR" in edited and "an edited message is not run again" in edited
